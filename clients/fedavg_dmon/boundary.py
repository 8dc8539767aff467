"""Client side of ``fedavg-dmon`` on a node split with boundary edges (math and wire protocol, what
leaves the party step by step: :mod:`fedgraphcore.protocols.fedavg_dmon.boundary` and
:mod:`fedgraphcore.protocols.fedavg_dmon.gradient`).

Kept in ``context.state``: its propagated features ``P_c`` (``dmon_propagated``; they need the
other parties' features, so they cannot be recomputed locally) and the round's global weights
(``dmon_global``, between ``dmon_spread`` and ``dmon_train`` / ``dmon_gradient``); in gradient mode
the centralised dropout stream's state (``dmon_stream``).
"""

from __future__ import annotations

import numpy as np

from fedgraphcore.data.types import no_boundary
from fedgraphcore.protocols import boundary as boundary_protocol
from fedgraphcore.protocols import fedavg_dmon
from fedgraphcore.protocols.fedavg_dmon import boundary as fedavg_dmon_boundary
from fedgraphcore.protocols.fedavg_dmon import gradient as fedavg_dmon_gradient
from clients.base import answers, request_digest
from clients.boundary import BoundaryClient

_CUTS: dict = {}  # per process: key -> (shard, Cut, local train adjacency)


def _sub(values, prefix: str) -> dict:
    """The values under ``prefix`` (a second secure sum's ``secagg_values`` in one message)."""
    return {k[len(prefix):]: v for k, v in values.items() if k.startswith(prefix)}


class DMoNBoundaryClient(BoundaryClient):
    """Mixin of :class:`clients.fedavg_dmon.FedAvgDMoNClient`: the boundary-mode steps."""

    @property
    def linked(self) -> bool:
        """Whether this run linked the party's boundary edges (boundary mode, several parties)."""
        return super().linked and self.shard.num_clients > 1

    def boundary_mode(self) -> bool:
        """Whether the run trains on the whole graph (:func:`fedgraphcore.protocols.fedavg_dmon.boundary.boundary_run`)."""
        return fedavg_dmon_boundary.boundary_run(self.config)

    def _split(self):
        """``(train, val)`` local adjacencies and the boundary edges' codes (the global split)."""
        s, seed, val, test = self.shard, self.shared.seed, self.cfg.val_fraction, self.cfg.test_fraction
        ids = fedavg_dmon_boundary.split_ids(s.item_keys)
        train, vadj, _ = fedavg_dmon.split_adjacency(s.adj, ids, seed, val, test)
        boundary = s.boundary if s.boundary is not None else no_boundary(s.item_keys.dtype)
        return train, vadj, boundary, fedavg_dmon_boundary.boundary_codes(boundary, s.item_keys, seed, val, test)

    def whole_cut(self):
        """``(Cut, local train adjacency)``, built once per process."""
        s = self.shard
        key = (id(s), s.client_id, self.shared.seed, self.cfg.val_fraction, self.cfg.test_fraction,
               self.links.offset, self.links.total)
        hit = _CUTS.get(key)
        if hit is None or hit[0] is not s:
            train, vadj, boundary, codes = self._split()
            hit = (s, fedavg_dmon_boundary.cut(train, vadj, boundary, codes, self.links), train)
            if len(_CUTS) > 16:
                _CUTS.clear()
            _CUTS[key] = hit
        return hit[1], hit[2]

    def magnitude(self) -> float:
        train, _, boundary, codes = self._split()
        keep = codes == fedavg_dmon.TRAIN
        part = type(boundary)(boundary.rows[keep], boundary.keys[keep], boundary.weight[keep])
        return fedavg_dmon_boundary.magnitude(self.shard.x, boundary_protocol.degrees(train, part), self.shard.num_nodes)

    def party_graph(self) -> fedavg_dmon_boundary.PartyGraph:
        cut, train = self.whole_cut()
        return fedavg_dmon_boundary.party_graph(self.load("dmon_propagated")["p"], train, cut.degrees)

    def padded_product(self, product: np.ndarray, values) -> np.ndarray:
        """Up: ``product`` (N x f, this party's term of a sum over neighbours) masked and padded on its
        own rows (:meth:`BoundaryClient.padded` with another of its column blocks)."""
        masked = self.masked(product, values)
        pad = self._load_party().pad(str(values["secagg_tag"]), masked[: self.shard.num_nodes].size, masked.dtype)
        return boundary_protocol.pad_rows(masked, pad, self.links)

    def _check_release(self, action: str, values) -> None:
        self.policy.check_noise(action, None)
        self.require_masking(action, values, needed_by_run=True)

    @answers(fedavg_dmon_boundary.DMON_FEATURES)
    def on_dmon_features(self, arrays, values):
        """Up: the padded ``B_c D~_c^-1/2 X_c`` (once)."""
        self._check_release(fedavg_dmon_boundary.DMON_FEATURES, values)
        cut, _ = self.whole_cut()
        with self.spending(fedavg_dmon_boundary.DMON_FEATURES, request_digest(arrays, values), None):
            share = fedavg_dmon_boundary.feature_share(self.shard.x, cut.degrees)
            return {fedavg_dmon_boundary.FEATURES: self.padded_product(cut.train @ share, values)}, {}

    @answers(fedavg_dmon_boundary.DMON_SPREAD)
    def on_dmon_spread(self, arrays, values):
        """Down: the global weights ``W_r`` (round 1: with the features' padded rows). Up: the padded
        ``B_c [S_c | Y_c]`` and the masked sums under ``W_r`` (with ``train``, gradient mode: ``S_c`` under the
        step's dropout mask, drawn again by ``dmon_gradient``)."""
        self._check_release(fedavg_dmon_boundary.DMON_SPREAD, values)
        cut, _ = self.whole_cut()
        if boundary_protocol.PADDED_ROWS in arrays:
            sums = self.unpadded(arrays[boundary_protocol.PADDED_ROWS], values)
            self.save("dmon_propagated", p=fedavg_dmon_boundary.propagated(sums, self.shard.x, cut.degrees).astype(np.float32))
        weights = {n: arrays[n] for n in fedavg_dmon.PARAM_NAMES}
        self.save("dmon_global", **weights)
        k, g = int(values["k"]), self.party_graph()
        s = fedavg_dmon_boundary.soft_assign(weights, g, k, self.cfg.hidden)
        labels = s.argmax(axis=1)
        if fedavg_dmon_gradient.TRAIN_FLAG in values:  # gradient mode: S_c under this step's dropout mask
            s = fedavg_dmon_gradient.dropped_assign(weights, g, k, self.cfg.hidden, self._step_noise(k, weights)[0])
        with self.spending(fedavg_dmon_boundary.DMON_SPREAD, request_digest(arrays, values), None):
            return {fedavg_dmon_boundary.SPREAD: self.padded_product(fedavg_dmon_boundary.spread_product(cut, s, labels), values),
                    fedavg_dmon_boundary.SUMS: self.masked(fedavg_dmon_boundary.party_sums(s, labels, cut), _sub(values, fedavg_dmon_boundary.SUMS_VALUES))}, {}

    def boundary_round(self, arrays, values):
        """``dmon_train`` in boundary mode. Down: the padded ``[(A S)_c | (A^v Y)_c]`` rows and the
        summed vector ``totals``. Train from the kept ``W_r`` on :func:`party_loss`; up: the weights
        (masked with ``secure``), the local losses and the validation count of ``W_r``."""
        k, cut = int(values["k"]), self.whole_cut()
        weights = self.load("dmon_global")
        g = self.party_graph()
        s = fedavg_dmon_boundary.soft_assign(weights, g, k, self.cfg.hidden)
        rows = self.unpadded(arrays[boundary_protocol.PADDED_ROWS], values)
        frozen = fedavg_dmon_boundary.frozen_terms(rows[:, :k], s, cut[1], cut[0].degrees, np.asarray(arrays["totals"]),
                                     self.links.total)
        state = self._state(k, weights)
        state, losses = fedavg_dmon_boundary.party_train(state, g, frozen, k, self.cfg.local_epochs, self.cfg.lr, self.cfg.hidden,
                                           self.cfg.dropout, self.cfg.collapse, weights,
                                           self.cfg.optimizer_state == "keep")
        self.save("dmon_state", **state.to_arrays())
        scored = {"val_intra": fedavg_dmon_boundary.val_intra(s.argmax(axis=1), rows[:, k:])} if "score" in values else {}
        if "secagg_tag" in values:
            vector = float(values["factor"]) * fedavg_dmon.flatten(state.weights)
            return {"weights": self.masked(vector, values)}, {"losses": losses, **scored}
        return dict(state.weights), {"losses": losses, **scored}

    def boundary_eval(self, arrays, values):
        """``dmon_eval`` in boundary mode: the validation count of the kept weights from the padded rows."""
        k = int(values["k"])
        s = fedavg_dmon_boundary.soft_assign(self.load("dmon_global"), self.party_graph(), k, self.cfg.hidden)
        rows = self.unpadded(arrays[boundary_protocol.PADDED_ROWS], values)
        return {}, {"val_intra": fedavg_dmon_boundary.val_intra(s.argmax(axis=1), rows[:, k:])}

    @answers(fedavg_dmon_gradient.DMON_GRADIENT, train=True)
    def on_dmon_gradient(self, arrays, values):
        """Gradient mode, one server step. Several parties: down the padded rows of the ``dmon_spread`` of
        the kept ``W_t`` and the summed vector; up the masked ``[grad L_c, <S_c, (A S)_c>, val_intra_c]``.
        One party: down ``W_t``; up its gradient of the DMoN loss on its graph, the loss and (``score``) the
        validation score of ``W_t``. The dropout stream advances by one mask (kept in ``dmon_stream``)."""
        self.policy.check_noise(fedavg_dmon_gradient.DMON_GRADIENT, None)
        self.require_masking(fedavg_dmon_gradient.DMON_GRADIENT, values, needed_by_run=self.linked)
        with self.spending(fedavg_dmon_gradient.DMON_GRADIENT, request_digest(arrays, values), None):
            return self._linked_gradient(arrays, values) if self.linked else self._local_gradient(arrays, values)

    def _stream(self, k: int, weights) -> np.ndarray:
        """The centralised dropout stream's state (client 0's, whichever party this is): kept in
        ``dmon_stream``, at the first step as centralised training leaves it after initialising."""
        if "dmon_stream" in self.context.state.array_records:
            return self.load("dmon_stream")["rng"]
        return fedavg_dmon.start_state(weights, self.shared.seed, 0, k, self.cfg.hidden, self.cfg.dropout).rng

    def _step_noise(self, k: int, weights):
        """``(noise rows, stream after)``: this step's dropout multipliers of the party's nodes
        (:func:`fedgraphcore.protocols.fedavg_dmon.gradient.step_noise`), the mask rows being the nodes' global
        row numbers (``dataset=parties``: their positions)."""
        s = self.shard
        rows = s.node_ids if s.keys is None else self.links.offset + np.arange(s.num_nodes)
        return fedavg_dmon_gradient.step_noise(self._stream(k, weights), self.links.total, k, self.cfg.dropout, rows)

    def _linked_gradient(self, arrays, values):
        k, (_, train) = int(values["k"]), self.whole_cut()
        weights, g, c = self.load("dmon_global"), self.party_graph(), self.cfg
        rows = self.unpadded(arrays[boundary_protocol.PADDED_ROWS], values)
        noise, rng = self._step_noise(k, weights)
        grad, intra = fedavg_dmon_gradient.party_gradient(weights, g, rows[:, :k], train, np.asarray(arrays["totals"]),
                                            self.links.total, k, c.hidden, noise, c.collapse)
        self.save("dmon_stream", rng=rng)
        scored = 0.0
        if "score" in values:
            scored = fedavg_dmon_boundary.val_intra(fedavg_dmon_boundary.soft_assign(weights, g, k, c.hidden).argmax(axis=1), rows[:, k:])
        return {fedavg_dmon_gradient.GRADIENT: self.masked(np.concatenate([grad, [intra, scored]]), values)}, {}

    def _local_gradient(self, arrays, values):
        k, c = int(values["k"]), self.cfg
        weights = {n: arrays[n] for n in fedavg_dmon.PARAM_NAMES}
        graph, vadj, _ = self.graph()
        grad, loss, rng = fedavg_dmon_gradient.local_gradient(weights, graph, k, c.hidden, c.dropout, c.collapse,
                                                self._stream(k, weights))
        self.save("dmon_stream", rng=rng)
        scored = {}
        if "score" in values:
            score, edges = fedavg_dmon.validation_score(fedavg_dmon.assign(weights, graph, k, c.hidden), vadj)
            scored = {"val_modularity": score, "val_edges": edges}
        return {fedavg_dmon_gradient.GRADIENT: grad}, {"loss": loss, **scored}
