"""Server side of ``fedavg-dmon`` on a node split with boundary edges (``partition.boundary=true``,
``mode=federated``, several clients): the parties train on the whole graph's GCN layer and
DMoN loss; ``aggregate=gradient``: strategies/fedavg_dmon/gradient.py. Math and wire protocol:
:mod:`fedgraphcore.protocols.fedavg_dmon.boundary`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from fedgraphcore.protocols import boundary
from fedgraphcore.protocols import fedavg_dmon
from fedgraphcore.protocols.fedavg_dmon import boundary as fedavg_dmon_boundary
from fedgraphcore.protocols.fedavg_dmon.gradient import TRAIN_FLAG
from fedgraphcore.transport import pack, unpack
from strategies.links import ServerLinks, link_boundaries, padded_spec, padded_sum, relayed

if TYPE_CHECKING:
    from fedgraphcore.session import ServerSession


class BoundaryRounds:
    """One boundary-mode run's training rounds (``run``) for :class:`strategies.fedavg_dmon.FedAvgDMoN`."""

    def __init__(self, strategy, session: ServerSession, shapes: dict, counts: dict[int, int]):
        self.strategy, self.session, self.shapes, self.counts = strategy, session, shapes, counts
        self.k = strategy.shared.num_clusters
        self.cfg = strategy.cfg
        self.scored = self.cfg.select == "val-modularity"
        session.setup_secure_aggregation()
        self.links: ServerLinks = link_boundaries(session)
        self.bound = max([float(strategy.secagg.bound)] + [float(c.summary["magnitude"]) for c in session.clients])

    def _values(self, name: str) -> dict:
        return self.session.secagg_values(name, self.bound, finest=True)

    def features(self, width: int) -> tuple[dict, dict]:
        """Step 1: each party's rows of the padded ``A D~^-1/2 X`` (by node id) and the values to relay."""
        values = self._values(fedavg_dmon_boundary.FEATURES)
        replies = self.session.broadcast(fedavg_dmon_boundary.DMON_FEATURES, pack(None, values),
                                         padded_spec(fedavg_dmon_boundary.FEATURES, self.links, width))
        return padded_sum(self.session, replies, fedavg_dmon_boundary.FEATURES, values, self.links), values

    def spread(self, weights: dict, carried: tuple[dict, dict] | None, train: bool = False
               ) -> tuple[dict, dict, np.ndarray]:
        """Step 2 for ``weights`` (``carried``: step 1's rows and values, round 1; ``train``: ``S`` under
        the step's dropout mask, gradient mode). Returns each party's rows of the padded ``A [S | Y]``,
        their values and the summed vector."""
        values, sums = self._values(fedavg_dmon_boundary.SPREAD), self._values(fedavg_dmon_boundary.SUMS)
        down = {"k": self.k, **values, **{fedavg_dmon_boundary.SUMS_VALUES + key: v for key, v in sums.items()},
                **({TRAIN_FLAG: 1} if train else {})}
        contents = {}
        for node in self.session.node_ids:
            arrays = dict(weights)
            if carried is not None:
                arrays[boundary.PADDED_ROWS] = carried[0][node]
            contents[node] = pack(arrays, {**down, **(relayed(carried[1]) if carried else {})})
        replies = self.session.exchange(fedavg_dmon_boundary.DMON_SPREAD, contents, fedavg_dmon_boundary.spread_reply(self.links.total, self.k))
        rows = padded_sum(self.session, replies, fedavg_dmon_boundary.SPREAD, values, self.links)
        return rows, values, self.session.secure_sum(replies, fedavg_dmon_boundary.SUMS, sums)

    def train(self, r: int, rows: dict, values: dict, totals: np.ndarray) -> tuple[dict, float | None, list]:
        """Step 3: the new global weights, the validation modularity of ``W_r`` and the mean losses."""
        secure = self.cfg.secure
        down = {"k": self.k, "round": r, **relayed(values), **({"score": 1} if self.scored else {})}
        if secure:
            wvalues = self.session.secagg_values("weights", self.strategy.secagg.bound)
            down.update(wvalues)
        total = float(sum(self.counts.values()))
        contents = {node: pack({boundary.PADDED_ROWS: rows[node], "totals": totals},
                               {**down, **({"factor": self.counts[node] / total} if secure else {})})
                    for node in self.session.node_ids}
        spec = fedavg_dmon_boundary.train_reply(self.shapes, self.cfg.local_epochs, secure, self.scored)
        replies = self.session.exchange(fedavg_dmon.DMON_TRAIN, contents, spec, category="train")
        vals = [unpack(c)[1] for c in replies.values()]
        score = fedavg_dmon_boundary.validation_modularity([v["val_intra"] for v in vals], totals, self.k) if self.scored else None
        losses = [float(x) for x in np.mean([np.asarray(v["losses"], dtype=np.float64) for v in vals], axis=0)]
        if secure:
            return fedavg_dmon.unflatten(self.session.secure_sum(replies, "weights", wvalues), self.shapes), score, losses
        return fedavg_dmon.fedavg([unpack(replies[n])[0] for n in replies], [self.counts[n] for n in replies]), score, losses

    def evaluate(self, weights: dict) -> float:
        """Step 4: the validation modularity of the final weights."""
        rows, values, totals = self.spread(weights, None)
        contents = {node: pack({boundary.PADDED_ROWS: rows[node]}, {"k": self.k, **relayed(values)})
                    for node in self.session.node_ids}
        replies = self.session.exchange(fedavg_dmon.DMON_EVAL, contents, fedavg_dmon_boundary.EVAL_REPLY)
        return fedavg_dmon_boundary.validation_modularity([unpack(c)[1]["val_intra"] for c in replies.values()], totals, self.k)

    def run(self, weights: dict, width: int, best) -> tuple[dict, list[dict]]:
        """Steps 1-4 from the initial ``weights``; offers each round's weights to ``best``
        (:class:`strategies.fedavg_dmon._Best`). Returns the final weights and the history."""
        rounds, history = self.strategy.shared.num_rounds, []
        carried = self.features(width)
        for r in range(1, rounds + 1):
            rows, values, totals = self.spread(weights, carried)
            carried = None
            new, score, losses = self.train(r, rows, values, totals)
            if score is not None:
                best.offer(weights, score, r)
            weights = new
            history.append({"round": r, "val_modularity": score, "loss": losses[-1], "losses": losses,
                            "excluded": []})
            self.session.round_done(r, rounds, val_modularity=score)
        if self.scored:
            best.offer(weights, self.evaluate(weights), rounds + 1)
        else:
            best.take(weights, rounds + 1)
        return weights, history
