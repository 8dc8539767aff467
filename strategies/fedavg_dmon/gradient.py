"""Server side of ``fedavg-dmon.aggregate=gradient`` on the whole graph: the server keeps the model
and one Adam optimiser and takes ``num-rounds x local-epochs`` full-batch steps on the summed
exact gradient (math: :mod:`fedgraphcore.protocols.fedavg_dmon.gradient`).

Wire protocol: :mod:`fedgraphcore.protocols.fedavg_dmon.gradient`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from fedgraphcore.protocols import boundary
from fedgraphcore.protocols.fedavg_dmon import boundary as fedavg_dmon_boundary
from fedgraphcore.protocols.fedavg_dmon import gradient as fedavg_dmon_gradient
from fedgraphcore.transport import pack, unpack
from strategies.fedavg_dmon.boundary import BoundaryRounds
from strategies.links import relayed

if TYPE_CHECKING:
    from fedgraphcore.session import ServerSession


class GradientRounds:
    """One gradient-mode run's server steps (``run``) for :class:`strategies.fedavg_dmon.FedAvgDMoN`."""

    def __init__(self, strategy, session: ServerSession, shapes: dict, counts: dict[int, int]):
        self.strategy, self.session, self.shapes = strategy, session, shapes
        self.cfg, self.k = strategy.cfg, strategy.shared.num_clusters
        self.scored = self.cfg.select == "val-modularity"
        self.many = len(session.clients) > 1
        self.whole = BoundaryRounds(strategy, session, shapes, counts) if self.many else None
        self.n = sum(counts.values())

    def _masked_step(self, weights: dict, carried, scored: bool) -> tuple[np.ndarray, float, float | None]:
        """Steps 1-2 for ``W_t`` with several parties: the summed gradient, the whole loss and
        (``scored``) the validation modularity of ``W_t``."""
        rows, values, totals = self.whole.spread(weights, carried, train=True)
        gvalues = self.session.secagg_values(fedavg_dmon_gradient.GRADIENT, self.whole.bound, finest=True)
        down = {"k": self.k, **relayed(values), **gvalues, **({"score": 1} if scored else {})}
        contents = {node: pack({boundary.PADDED_ROWS: rows[node], "totals": totals}, down)
                    for node in self.session.node_ids}
        replies = self.session.exchange(fedavg_dmon_gradient.DMON_GRADIENT, contents,
                                        fedavg_dmon_gradient.gradient_reply(self.shapes, True, scored), category="train")
        summed = self.session.secure_sum(replies, fedavg_dmon_gradient.GRADIENT, gvalues)
        loss = fedavg_dmon_gradient.whole_loss(float(summed[-2]), totals, self.k, self.n, self.cfg.collapse)
        score = fedavg_dmon_boundary.validation_modularity([float(summed[-1])], totals, self.k) if scored else None
        return summed[:-2], loss, score

    def _local_step(self, weights: dict, scored: bool) -> tuple[np.ndarray, float, float | None]:
        """Step 2 with one party: its gradient and loss at ``W_t`` (``scored``: its validation score)."""
        down = {"k": self.k, **({"score": 1} if scored else {})}
        replies = self.session.exchange(fedavg_dmon_gradient.DMON_GRADIENT,
                                        {node: pack(weights, down) for node in self.session.node_ids},
                                        fedavg_dmon_gradient.gradient_reply(self.shapes, False, scored), category="train")
        arrays, values = unpack(next(iter(replies.values())))
        return np.asarray(arrays[fedavg_dmon_gradient.GRADIENT], np.float64), float(values["loss"]), values.get("val_modularity")

    def _round(self, r: int, adam: fedavg_dmon_gradient.ServerAdam, weights: dict, carried, best) -> tuple[dict, dict]:
        """``local-epochs`` server steps from ``W_t``; the round's first ``W_t`` is offered to ``best``."""
        losses, score, largest = [], None, 0.0
        for e in range(self.cfg.local_epochs):
            scored = self.scored and e == 0
            if self.many:
                grad, loss, got = self._masked_step(weights, carried if r == 1 and e == 0 else None, scored)
            else:
                grad, loss, got = self._local_step(weights, scored)
            if scored:
                score = got
                best.offer(weights, score, r)
            weights = adam.step(grad)
            losses.append(loss)
            largest = max(largest, float(np.abs(grad).max(initial=0.0)))
        return weights, {"round": r, "val_modularity": score, "loss": losses[-1], "losses": losses,
                         "grad_max": largest, "excluded": []}

    def run(self, weights: dict, width: int, best) -> tuple[dict, list[dict]]:
        """All ``num-rounds x local-epochs`` steps from the initial ``weights``, then the final weights'
        selection; returns the final weights and the per-round history."""
        rounds, history = self.strategy.shared.num_rounds, []
        adam = fedavg_dmon_gradient.ServerAdam(weights, self.cfg.lr)
        carried = self.whole.features(width) if self.many else None
        for r in range(1, rounds + 1):
            weights, record = self._round(r, adam, weights, carried, best)
            history.append(record)
            self.session.round_done(r, rounds, val_modularity=record["val_modularity"])
        if not self.scored:
            best.take(weights, rounds + 1)
        elif self.many:
            best.offer(weights, self.whole.evaluate(weights), rounds + 1)
        else:
            self.strategy._select(self.session, weights, best)
        return weights, history
