"""Client side of ``fedavg-dmon`` (wire protocol: :mod:`fedgraphcore.protocols.fedavg_dmon`).

Kept in ``context.state`` between rounds: the local model, the Adam moments
(``fedavg-dmon.optimizer-state=keep``), the torch generator state that drives
dropout, and in isolated/centralised mode the best local weights so far.
"""

from __future__ import annotations

from functools import cached_property

import numpy as np

from fedgraphcore.privacy.policy import PrivacyRefusal
from fedgraphcore.protocols import fedavg_dmon
from fedgraphcore.protocols.fedavg_dmon import boundary as fedavg_dmon_boundary
from fedgraphcore.protocols.fedavg_dmon import gradient as fedavg_dmon_gradient
from fedgraphcore.wire import ProtocolError
from clients.base import ClusteringClient, Reply, answers, request_digest
from clients.fedavg_dmon.boundary import DMoNBoundaryClient

_GRAPHS: dict = {}  # per process: (key) -> (shard, Graph, val adj, test adj, train adj)


class FedAvgDMoNClient(DMoNBoundaryClient, ClusteringClient[fedavg_dmon.FedAvgDMoNConfig]):
    """Local DMoN training; on a linked node split the whole graph's layer and loss
    (:class:`clients.fedavg_dmon.boundary.DMoNBoundaryClient`)."""

    settings = fedavg_dmon.FedAvgDMoNConfig
    label_steps = (fedavg_dmon.DMON_ASSIGN,)

    def step_limits(self) -> dict[str, int]:
        """Training rounds ``num-rounds`` (gradient mode: ``local-epochs`` server steps each, plus the
        final evaluation's spread), the features, the evaluation and the labels once."""
        rounds, steps = self.shared.num_rounds, self.shared.num_rounds * self.cfg.local_epochs
        return {**super().step_limits(), fedavg_dmon.DMON_TRAIN: rounds, fedavg_dmon.DMON_EVAL: 1, fedavg_dmon.DMON_ASSIGN: 1,
                fedavg_dmon_boundary.DMON_FEATURES: 1, fedavg_dmon_boundary.DMON_SPREAD: steps + 1, fedavg_dmon_gradient.DMON_GRADIENT: steps}

    # -- helpers ---------------------------------------------------------------
    def handle(self, action, content):
        import torch

        torch.set_num_threads(1)  # one thread per client (shared CPU; also makes runs bit-reproducible)
        return super().handle(action, content)

    def graph(self):
        """This client's tensors and edge split, built once per process."""
        s = self.shard
        val, test = self.cfg.val_fraction, self.cfg.test_fraction
        seed = self.shared.seed
        sparse = self.cfg.sparse_features
        key = (id(s), s.dataset, s.partitioner, s.client_id, s.num_clients, seed, val, test, sparse)
        hit = _GRAPHS.get(key)
        if hit is None or hit[0] is not s:
            train, vadj, tadj = fedavg_dmon.split_adjacency(s.adj, np.asarray(s.node_ids), seed, val, test)
            hit = (s, fedavg_dmon.make_graph(s.x, train, sparse), vadj, tadj, train)
            if len(_GRAPHS) > 64:
                _GRAPHS.clear()
            _GRAPHS[key] = hit
        return hit[1], hit[2], hit[3]

    def _model_kw(self):
        return {"hidden": self.cfg.hidden, "dropout": self.cfg.dropout}

    def _state(self, k, weights):
        if "dmon_state" in self.context.state.array_records:
            return fedavg_dmon.LocalState.from_arrays(self.load("dmon_state"))
        if weights is None:
            raise ProtocolError("first training round without initial weights")
        kw = self._model_kw()
        return fedavg_dmon.start_state(weights, self.shared.seed, self.shard.client_id, k, kw["hidden"], kw["dropout"])

    def _dp(self) -> bool:
        """Client-level DP-FedAvg on (federated mode only, checked by the strategy)."""
        return self.cfg.dp_clip > 0

    def _local_select(self) -> bool:
        return self.cfg.mode != "federated" and self.cfg.select == "val-modularity"

    def _score(self, weights, k):
        graph, vadj, _ = self.graph()
        return fedavg_dmon.validation_score(fedavg_dmon.assign(weights, graph, k, self.cfg.hidden), vadj)

    def _keep_if_best(self, weights, score):
        best = self.load("dmon_best") if "dmon_best" in self.context.state.array_records else None
        if best is None or score > float(best["score"][0]):
            self.save("dmon_best", score=np.array([score]), **{f"w/{n}": weights[n] for n in fedavg_dmon.PARAM_NAMES})

    # -- steps -------------------------------------------------------------------
    def hello_figures(self, values) -> dict:
        """The feature dimension, with hello (in clear, also under DP); in boundary mode also the
        power of two bounding the party's masked uploads."""
        figures = {"num_features": int(self.graph()[0].x.shape[1])}
        if self.boundary_mode():
            figures["magnitude"] = self.magnitude()
        return figures

    @answers(fedavg_dmon.DMON_TRAIN, train=True)
    def on_dmon_train(self, arrays, values) -> Reply:
        """Train from the received weights; reply the weights (federated; noised under DP) and,
        without DP, the validation score of the received weights and the per-epoch losses.
        One release in this node's ledger; a noised reply re-sent gets the same draw (no
        retraining, no second draw; :meth:`release`)."""
        federated = self.cfg.mode == "federated"
        mech = self._mechanism if self._dp() and federated else None
        self.policy.check_noise(fedavg_dmon.DMON_TRAIN, mech and mech.noise_multiplier)
        if federated:
            self.require_masking(fedavg_dmon.DMON_TRAIN, values, needed_by_run=self.cfg.secure)
        if mech:
            return self.release(fedavg_dmon.DMON_TRAIN, arrays, values, lambda: self._train(arrays, values)[0],
                                multiplier=mech.effective_noise_multiplier)
        with self.spending(fedavg_dmon.DMON_TRAIN, request_digest(arrays, values), None):
            return self._train(arrays, values)

    def _train(self, arrays, values):
        if self.linked:
            return self.boundary_round(arrays, values)
        k = int(values["k"])
        received = {n: arrays[n] for n in fedavg_dmon.PARAM_NAMES} if fedavg_dmon.PARAM_NAMES[0] in arrays else None
        state = self._state(k, received)
        start = received if received is not None else state.weights
        dp = self._dp()
        if not dp:
            score, edges = self._score(start, k)
            if self._local_select():
                self._keep_if_best(start, score)
        kw = self._model_kw()
        state, losses = fedavg_dmon.local_train(
            state, self.graph()[0], k, self.cfg.local_epochs, lr=self.cfg.lr, collapse=self.cfg.collapse,
            weights=received, keep_optimizer=self.cfg.optimizer_state == "keep", **kw,
        )
        self.save("dmon_state", **state.to_arrays())
        # under DP only the noised weights leave: the score and losses are functions of the
        # local subgraph that the noise does not cover
        reply_values = {} if dp else {"val_modularity": score, "val_edges": edges, "losses": losses}
        if self.cfg.mode != "federated":
            return {}, reply_values  # isolated / centralised: the weights never leave
        upload = fedavg_dmon.dp_update(received, state.weights, self._mechanism, self.noise("dmon_train")) if dp \
            else state.weights
        if "secagg_tag" in values:
            vector = float(values["factor"]) * fedavg_dmon.flatten(upload)
            return {"weights": self.masked(vector, values)}, reply_values
        return dict(upload), reply_values

    @cached_property
    def _mechanism(self):
        """The DP-FedAvg mechanism of this client's run config (calibrated once per message)."""
        return fedavg_dmon.dp_mechanism(self.cfg, self.shared.num_rounds)

    @answers(fedavg_dmon.DMON_EVAL)
    def on_dmon_eval(self, arrays, values) -> Reply:
        """Validation score of the received weights; refused under DP (not covered by the noise)."""
        if self._dp():
            raise PrivacyRefusal("fedavg-dmon.dp-clip", "dmon_eval refused: with fedavg-dmon.dp-clip > 0 the "
                                                        "validation score is not sent (it is not covered by the DP noise)")
        self.policy.check_noise(fedavg_dmon.DMON_EVAL, None)
        if self.linked:
            with self.spending(fedavg_dmon.DMON_EVAL, request_digest(arrays, values), None):
                return self.boundary_eval(arrays, values)
        with self.spending(fedavg_dmon.DMON_EVAL, request_digest(arrays, values), None):
            score, edges = self._score({n: arrays[n] for n in fedavg_dmon.PARAM_NAMES}, int(values["k"]))
        return {}, {"val_modularity": score, "val_edges": edges}

    def _assign_k(self, values) -> int:
        """The labels' classes: the run's num-clusters (the server's ``k`` when that is 0, the number
        of classes it resolves), after this run's training (federated: a round answered), else
        refused (rules ``server-input``, ``protocol-order``)."""
        k, own = int(values["k"]), self.shared.num_clusters
        if own and k != own:
            raise PrivacyRefusal("server-input", f"'{fedavg_dmon.DMON_ASSIGN}' asked for k={k} classes; valid: "
                                                 f"num-clusters={own}")
        trained = {fedavg_dmon.DMON_TRAIN, fedavg_dmon_gradient.DMON_GRADIENT, fedavg_dmon_boundary.DMON_SPREAD} & set(self.steps_answered.counts())
        if self.cfg.mode == "federated" and not trained:
            raise PrivacyRefusal("protocol-order", f"'{fedavg_dmon.DMON_ASSIGN}' before any training step of this run")
        return k

    def _check_model(self, weights: dict, features: int, k: int) -> None:
        """Weights of the model this client's run config defines (``hidden``, k classes, its features),
        finite; else refused (rule ``server-input``)."""
        shapes = fedavg_dmon.param_shapes(features, k, self.cfg.hidden)
        for name, shape in shapes.items():
            w = np.asarray(weights.get(name, np.zeros(0)))
            if w.shape != tuple(shape) or w.dtype.kind != "f" or not np.isfinite(w).all():
                raise PrivacyRefusal("server-input", f"'{fedavg_dmon.DMON_ASSIGN}' weight '{name}' of {w.dtype} {w.shape}; "
                                                     f"valid: finite {tuple(shape)} (hidden={self.cfg.hidden}, k={k})")

    @answers(fedavg_dmon.DMON_ASSIGN)
    def on_dmon_assign(self, arrays, values) -> Reply:
        """Labels of this client's nodes and its own metrics: evaluation outputs, sent in clear and
        outside the DP guarantee (with ``dp-clip > 0`` too). The validation modularity of the
        weights used goes up only without DP, like every validation score."""
        k = self._assign_k(values)
        graph, vadj, tadj = self.graph()
        if self.linked:  # the whole graph's layer; the validation score is the server's
            graph, score, weights = self.party_graph().layer, None, {n: arrays[n] for n in fedavg_dmon.PARAM_NAMES}
        elif fedavg_dmon.PARAM_NAMES[0] in arrays:
            weights = {n: arrays[n] for n in fedavg_dmon.PARAM_NAMES}
            score = None if self._dp() else self._score(weights, k)[0]
        else:  # isolated / centralised: this client's own model
            weights = fedavg_dmon.LocalState.from_arrays(self.load("dmon_state")).weights
            score, _ = self._score(weights, k)
            if self._local_select():
                self._keep_if_best(weights, score)
                best = self.load("dmon_best")
                weights = {n: best[f"w/{n}"] for n in fedavg_dmon.PARAM_NAMES}
                score = float(best["score"][0])
        self._check_model(weights, int(self.graph()[0].x.shape[1]), k)
        labels = fedavg_dmon.assign(weights, graph, k, self.cfg.hidden)
        self.save("labels", labels=labels)
        metrics = fedavg_dmon.client_metrics(labels, self.shard.y, tadj, self.shard.adj)
        owned = self.shard.owned if self.shard.owned is not None else np.ones(len(labels), bool)
        return (
            {"node_ids": np.asarray(self.shard.node_ids, dtype=np.int64), "labels": labels,
             "owned": np.asarray(owned, dtype=np.int8)},
            {**metrics, **({} if score is None else {"val_modularity": float(score)})},
        )
