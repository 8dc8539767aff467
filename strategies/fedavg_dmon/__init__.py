"""Strategy ``fedavg-dmon``: federated community detection, FedAvg of DMoN GNN weights.

Leeney & McConville, "A Framework for Exploring Federated Community
Detection" (2023). Clients hold node-partitioned subgraphs of one graph
(cross-client edges lost; ``partition.overlap`` lets clients share nodes),
all with the same features. The paper's shared-node setting (Figure 2; its
code gives every client 1.5 N/C nodes) is ``partition.overlap=0.5``. Math and the edge split / model selection rules:
``fedgraphcore.protocols.fedavg_dmon``.

Modes (``fedavg-dmon.mode``), so the paper's comparison is one command each:

* ``federated``: FedAvg weighted by node counts every round. On a node split
  with boundary edges (``partition.boundary=true``, the default of the
  ``node-*`` partitioners) the parties train on the whole graph: its GCN
  layer and its DMoN loss, cut edges included, with padded secure sums
  (strategies/fedavg_dmon/boundary.py, :mod:`fedgraphcore.protocols.fedavg_dmon.boundary`).
  There ``aggregate=gradient`` (the default) is centralised full-batch training:
  the server keeps the model and Adam and takes num-rounds x local-epochs steps
  on the parties' summed exact gradients (strategies/fedavg_dmon/gradient.py,
  :mod:`fedgraphcore.protocols.fedavg_dmon.gradient`); ``aggregate=weights`` trains
  local Adam epochs and averages the weights (steps 2-3 below).
  The paper's federated mode, each client on its own subgraph, is
  ``partition.boundary=false``;
* ``isolated``: same rounds and epochs, but clients never aggregate (each
  trains, selects and labels with its own model; no weights leave a client);
* ``centralised``: as isolated with exactly one client holding the whole
  graph (``--num-clients 1``; any node partitioner with one client gives it
  every node and edge).

Wire protocol: :mod:`fedgraphcore.protocols.fedavg_dmon` (what leaves each client, step by step).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from fedgraphcore.config import ConfigError, RunConfig, SharedConfig
from fedgraphcore.data.types import GraphData
from fedgraphcore.privacy.gaussian import CLIENT_LEVEL, GaussianMechanism
from fedgraphcore.protocols import fedavg_dmon
from fedgraphcore.protocols.fedavg_dmon import boundary as fedavg_dmon_boundary
from fedgraphcore.protocols.fedavg_dmon import gradient as fedavg_dmon_gradient
from fedgraphcore.transport import pack, unpack
from fedgraphcore.wire import ProtocolError, ReplySpec
from strategies.base import (ClusteringStrategy, StrategyOutput, announced_rows, check_item_ids,
                             common_feature_dimension, concat_int64)
from strategies.fedavg_dmon.boundary import BoundaryRounds
from strategies.fedavg_dmon.gradient import GradientRounds

if TYPE_CHECKING:
    from fedgraphcore.session import ServerSession

DP_PROTECTS = ("each client's whole local subgraph (client-level DP) in its training-round uploads: one release "
               "of its noised model update per round, no validation score or loss sent; not covered: its feature "
               "dimension and node count, sent once in clear for the FedAvg weights, and its final labels and own "
               "metrics (evaluation outputs)")


@dataclass
class _Best:
    """The global weights selected so far: the best combined validation score (federated,
    ``select=val-modularity``) or the last weights (``select=last``), and their round."""

    weights: dict
    score: float = -np.inf
    round: int = 0

    def offer(self, weights: dict, score: float, rnd: int) -> None:
        """Keep ``weights`` (scored ``score``, sent in round ``rnd``) if they beat the best so far."""
        if score > self.score:
            self.weights, self.score, self.round = weights, score, rnd

    def take(self, weights: dict, rnd: int) -> None:
        """Select ``weights`` of round ``rnd`` whatever their score."""
        self.weights, self.round = weights, rnd


class FedAvgDMoN(ClusteringStrategy[fedavg_dmon.FedAvgDMoNConfig]):
    """Federated community detection (Leeney & McConville, 2023). Each client holds a subgraph of
    one graph and, on a node split with boundary edges (``partition.boundary=true``, the default),
    its nodes' edges to other clients' nodes: the clients then train on the whole graph's GCN layer
    and DMoN loss (padded secure sums over neighbours held elsewhere). With
    ``partition.boundary=false`` (the paper's setting; ``partition.overlap`` lets clients share
    nodes) cross-client edges are lost. On the whole graph, ``aggregate=gradient`` (the default) makes
    the server keep the model and Adam and step on the clients' summed exact gradients (centralised
    full-batch training, step for step). Otherwise each client trains a DMoN graph neural network
    (a GCN encoder with a modularity loss and collapse regularisation) for a few local epochs per
    round; the server averages the weights by node count (FedAvg; optionally under secure
    aggregation and/or client-level DP-FedAvg). Either way the server keeps the weights of the
    round with the best validation-edge modularity. Modes ``isolated`` and
    ``centralised`` give the paper's comparison. Centralised reference: DMoN trained on the whole
    graph for as many epochs."""

    name = "fedavg-dmon"
    summary = "FedAvg of a DMoN GNN (modularity loss) over node-partitioned subgraphs"
    split = "nodes: each client holds a subgraph of one graph (optionally with shared nodes)"
    partitioners = ("node-random", "node-community", "node-dirichlet")
    needs_edges = True
    local_graphs = True
    needs_features = True
    tolerates_dropouts = True  # FedAvg of the weights of the clients that answered (not the whole-graph modes)

    settings = fedavg_dmon.FedAvgDMoNConfig

    @classmethod
    def hello_reply(cls, config: RunConfig) -> ReplySpec:
        """Each client's feature width (boundary mode: and the bound of its masked uploads)."""
        extra = fedavg_dmon_boundary.HELLO_MAGNITUDE if fedavg_dmon_boundary.boundary_run(config) else {}
        return ReplySpec(numbers={**fedavg_dmon.HELLO_NUMBERS, **extra})

    @classmethod
    def check_shards(cls, clients) -> list[str]:
        """Boundary mode (every client announced its ``magnitude``) trains on the whole graph, not on
        each shard's own edges: only an empty shard stops it."""
        if len(clients) > 1 and all("magnitude" in c.summary for c in clients):
            empty = [c.partition_id for c in clients if not int(c.summary["num_rows"])]
            if empty:
                raise ProtocolError(f"client(s) {empty} hold no rows: an empty shard; valid: fewer clients")
            return []
        return super().check_shards(clients)

    @staticmethod
    def boundary_mode(config: RunConfig) -> bool:
        """Federated on a node split with boundary edges: the parties train on the whole graph."""
        return fedavg_dmon_boundary.boundary_run(config)

    @classmethod
    def masks_uploads(cls, config: RunConfig, clients: int) -> bool:
        return super().masks_uploads(config, clients) or (clients > 1 and cls.boundary_mode(config))

    @classmethod
    def check(cls, config: RunConfig) -> None:
        super().check(config)
        cfg = fedavg_dmon.FedAvgDMoNConfig.of(config)
        clients = SharedConfig.of(config).num_clients
        if cfg.mode == "centralised" and clients > 1:
            raise ConfigError(f"fedavg-dmon.mode=centralised needs num-clients=1 (one client holding the whole "
                              f"graph); got num-clients={clients}")
        if cfg.mode != "federated" and (cfg.dp_clip > 0 or cfg.secure):
            raise ConfigError(f"fedavg-dmon.dp-clip and fedavg-dmon.secure apply to mode=federated only; "
                              f"got mode={cfg.mode}")
        if cfg.dp_epsilon > 0 and cfg.dp_clip == 0:
            raise ConfigError(f"fedavg-dmon.dp-epsilon={cfg.dp_epsilon} needs fedavg-dmon.dp-clip > 0 "
                              "(the clip switches DP-FedAvg on; without it nothing would be noised); valid choices: "
                              "set dp-clip > 0, or dp-epsilon=0")
        if cfg.dp_clip > 0 and cfg.select != "last":
            raise ConfigError(f"fedavg-dmon.select={cfg.select} is not available with fedavg-dmon.dp-clip"
                              f"={cfg.dp_clip} (clients send no un-noised validation score under DP); "
                              f"valid choices: select=last, or dp-clip=0")
        if cls.boundary_mode(config):
            cls._check_boundary(config, cfg)
        total = cfg.val_fraction + cfg.test_fraction
        if total >= 1.0:
            raise ConfigError(f"fedavg-dmon.val-fraction + fedavg-dmon.test-fraction = {total:g}; must be < 1")
        if cfg.select == "val-modularity" and cfg.val_fraction == 0:
            raise ConfigError("fedavg-dmon.select=val-modularity needs fedavg-dmon.val-fraction > 0; "
                              "valid choices: set val-fraction > 0 or select=last")

    @staticmethod
    def _check_boundary(config: RunConfig, cfg: fedavg_dmon.FedAvgDMoNConfig) -> None:
        """What boundary mode cannot take: copied nodes and client-level DP."""
        if float(config["partition.overlap"]) > 0:
            raise ConfigError(f"partition.overlap={config['partition.overlap']} with fedavg-dmon on a node split with "
                              "boundary edges: a node copied to two clients would count twice in the whole graph; "
                              "valid: partition.overlap=0, or partition.boundary=false (the paper's setting)")
        if cfg.dp_clip > 0:
            raise ConfigError(f"fedavg-dmon.dp-clip={cfg.dp_clip} with partition.boundary=true: client-level DP does "
                              "not cover the sums over neighbours held elsewhere; valid: partition.boundary=false "
                              "(the paper's setting), or dp-clip=0")

    # ------------------------------------------------------------------ protocol
    @property
    def federated(self) -> bool:
        return self.cfg.mode == "federated"

    def run(self, session: ServerSession) -> StrategyOutput:
        if self.cfg.mode == "centralised" and len(session.clients) != 1:
            raise ConfigError(f"fedavg-dmon.mode=centralised needs exactly one client; {len(session.clients)} "
                              "connected")
        k = self.shared.num_clusters
        features, counts = self._sizes(session)
        shapes = fedavg_dmon.param_shapes(features, k, self.cfg.hidden)
        weights = fedavg_dmon.init_weights(features, k, self.shared.seed, self.cfg.hidden, self.cfg.dropout)
        mech = None
        if self.federated and self.cfg.dp_clip > 0:
            mech = fedavg_dmon.dp_mechanism(self.cfg, self.shared.num_rounds)
            mech.record(session.ledger, "dp-fedavg", DP_PROTECTS, CLIENT_LEVEL)
        if self.federated and self.cfg.secure:
            session.setup_secure_aggregation()
        if fedavg_dmon_gradient.gradient_mode(session.config):
            best = _Best(weights)
            weights, history = GradientRounds(self, session, shapes, counts).run(weights, features, best)
        elif self.boundary_mode(session.config) and len(session.clients) > 1:
            best = _Best(weights)
            rounds = BoundaryRounds(self, session, shapes, counts)
            weights, history = rounds.run(weights, features, best)
        else:  # one client in boundary mode holds the whole graph: the centralised training, step for step
            weights, best, history = self._training_rounds(session, weights, shapes, counts, mech)
            if self.federated:
                self._select(session, weights, best)
        if mech is not None:
            mech.record(session.ledger, "dp-fedavg", DP_PROTECTS, CLIENT_LEVEL)
        ids, labels, metrics = self._assign(session, best)
        metrics["whole_graph"] = self.boundary_mode(session.config) and len(session.clients) > 1
        if self.boundary_mode(session.config):
            metrics["aggregate"] = self.cfg.aggregate
        if mech is not None:
            metrics["dp_epsilon"] = mech.epsilon()
            metrics["dp_noise_multiplier"] = mech.noise_multiplier
        return StrategyOutput(labels=labels, ids=ids, history=history, metrics=metrics)

    def _sizes(self, session: ServerSession) -> tuple[int, dict[int, int]]:
        """Step 1, with hello: every client's ``num_features`` (the common feature dimension) and its
        ``num_rows``, the nodes it holds (its FedAvg weight)."""
        features = common_feature_dimension(c.summary["num_features"] for c in session.clients)
        return features, announced_rows(session)

    def _training_rounds(self, session: ServerSession, weights: dict, shapes: dict, counts: dict[int, int],
                         mech: GaussianMechanism | None) -> tuple[dict, _Best, list[dict]]:
        """Step 2, ``dmon_train`` x ``num-rounds``: each round's replies (:meth:`_train_round`), their
        combined validation score (without DP) and the new global weights (federated). Returns the
        last weights, the best-scored weights sent (federated) and the per-round history."""
        rounds, secure = self.shared.num_rounds, self.federated and self.cfg.secure
        spec = fedavg_dmon.train_reply(shapes, self.cfg.local_epochs, self.federated, secure, mech is not None)
        best = _Best(weights)
        history = []
        for r in range(1, rounds + 1):
            sent = sum(counts[n] for n in session.node_ids)  # the rows of the clients asked (their factors' sum)
            replies, values, excluded = self._train_round(session, r, weights, counts, spec)
            score, losses = (None, None) if mech is not None else self._round_scores(replies)
            if self.federated and score is not None:
                best.offer(weights, score, r)  # score of W_r, the weights sent this round
            if secure:  # each weighed by N_c / N over the clients asked: the average over those that answered
                answered = sum(counts[n] for n in replies)
                weights = fedavg_dmon.unflatten(session.secure_sum(replies, "weights", values) * (sent / answered), shapes)
            elif self.federated:
                weights = fedavg_dmon.fedavg([unpack(replies[n])[0] for n in replies], [counts[n] for n in replies])
            if mech is not None:
                mech.step()
            history.append({"round": r, "val_modularity": score, "loss": None if losses is None else losses[-1],
                            "losses": losses, "excluded": excluded})
            session.round_done(r, rounds, val_modularity=score)
        return weights, best, history

    def _train_round(self, session: ServerSession, r: int, weights: dict, counts: dict[int, int],
                     spec: ReplySpec) -> tuple[dict, dict, list[int]]:
        """One ``dmon_train`` exchange. Down: the global weights ``W_r`` (isolated/centralised: round 1
        only, the common initialisation), ``k`` and the round; with ``secure`` the secure-aggregation
        values and each client's FedAvg ``factor`` N_c / N. Up: per ``spec``. Returns the valid replies,
        the values sent and the clients left out (no valid reply)."""
        secure = self.federated and self.cfg.secure
        if self.federated and not secure:
            session.take_back()  # a client that left and came back answers W_r like any other
        send_weights = self.federated or r == 1
        values = {"k": self.shared.num_clusters, "round": r}
        if secure:
            values.update(session.secagg_values("weights", self.secagg.bound, recover=self.tolerates_dropouts))
        total = float(sum(counts[node] for node in session.node_ids))
        contents = {node: pack(weights if send_weights else None,
                               {**values, "factor": counts[node] / total} if secure else values)
                    for node in session.node_ids}
        replies = session.exchange(fedavg_dmon.DMON_TRAIN, contents, session.secure_reply(spec, values), category="train",
                                   require_all=secure and not session.recovers(values))
        if not replies:
            raise ProtocolError(f"round {r}: no valid client reply")
        return replies, values, [session.partition_of(n) for n in contents if n not in replies]

    @staticmethod
    def _round_scores(replies: dict) -> tuple[float, list[float]]:
        """The validation-edge-weighted mean validation modularity of the replies and their mean
        per-epoch losses."""
        vals = {n: unpack(v)[1] for n, v in replies.items()}
        score = fedavg_dmon.combine_scores([vals[n]["val_modularity"] for n in replies],
                                     [vals[n]["val_edges"] for n in replies])
        mean = np.mean([np.asarray(vals[n]["losses"], dtype=np.float64) for n in replies], axis=0)
        return score, [float(v) for v in mean]

    def _select(self, session: ServerSession, weights: dict, best: _Best) -> None:
        """Step 3 (federated): with ``select=val-modularity``, ``dmon_eval`` (down: the final global
        weights) -> up: their validation modularity and validation-edge count, so the final weights
        compete too (round num-rounds + 1); with ``select=last`` the final weights are taken."""
        final_round = self.shared.num_rounds + 1
        if self.cfg.select != "val-modularity":
            best.take(weights, final_round)
            return
        ev = session.broadcast(fedavg_dmon.DMON_EVAL, pack(weights, {"k": self.shared.num_clusters}), fedavg_dmon.EVAL_REPLY,
                               require_all=False)
        if ev:
            vals = [unpack(v)[1] for v in ev.values()]
            best.offer(weights, fedavg_dmon.combine_scores([v["val_modularity"] for v in vals],
                                                     [v["val_edges"] for v in vals]), final_round)

    def _assign(self, session: ServerSession, best: _Best) -> tuple[np.ndarray, np.ndarray, dict]:
        """Step 4, ``dmon_assign`` (down: the selected global weights; isolated: none) -> up: node ids,
        labels, owned flags and the client's own metrics. Returns the owned nodes' ids and labels and
        the run's metrics."""
        k = self.shared.num_clusters
        out = session.broadcast(fedavg_dmon.DMON_ASSIGN, pack(best.weights if self.federated else None, {"k": k}),
                                fedavg_dmon.assign_reply(k))
        replies = {node: unpack(content) for node, content in out.items()}
        ids_of = {node: session.positions(fedavg_dmon.DMON_ASSIGN, node, a["node_ids"]) for node, (a, _) in replies.items()}
        check_item_ids(session, fedavg_dmon.DMON_ASSIGN, ids_of, exclusive=False, expected=announced_rows(session))
        # every node is owned by one client (copies made by partition.overlap are not owned)
        owned = {node: a["owned"].astype(bool) for node, (a, _) in replies.items()}
        check_item_ids(session, fedavg_dmon.DMON_ASSIGN, {node: ids_of[node][owned[node]] for node in replies},
                       exclusive=True)
        per_client = [{"client": session.partition_of(node), "num_nodes": int(arrays["node_ids"].size),
                       **{key: float(v) for key, v in vals.items()}} for node, (arrays, vals) in replies.items()]
        metrics = {"mode": self.cfg.mode, "select": self.cfg.select,
                   "selected_round": int(best.round) if self.federated else None,
                   "clients": per_client, "dropped_clients": sorted(session.partition_of(n) for n in session.dropped)}
        for key in ("f1", "nmi", "acc", "modularity_test", "conductance_test", "modularity_local"):
            got = [p[key] for p in per_client if key in p]
            if got:
                metrics[f"client_mean_{key}"] = float(np.mean(got))
        return (concat_int64(ids_of[node][owned[node]] for node in replies),
                concat_int64(arrays["labels"][owned[node]] for node, (arrays, _) in replies.items()), metrics)

    def reference(self, data: GraphData) -> np.ndarray:
        """Centralised DMoN (``fedgraphcore.models.train_dmon``) on the pooled graph's training
        edges (same global edge split and seed), num-rounds x local-epochs epochs,
        last weights (no model selection)."""
        from fedgraphcore.models import train_dmon

        c, seed = self.cfg, self.shared.seed
        train, _, _ = fedavg_dmon.split_adjacency(data.adj, np.arange(data.num_nodes), seed, c.val_fraction,
                                            c.test_fraction)
        labels, _ = train_dmon(data.x, train, self.shared.num_clusters, seed,
                               epochs=self.shared.num_rounds * c.local_epochs, lr=c.lr, dropout=c.dropout,
                               hidden=c.hidden, collapse_regularization=c.collapse, sparse_features=c.sparse_features)
        return labels

    def reference_method(self) -> str:
        c = self.cfg
        epochs = self.shared.num_rounds * c.local_epochs
        return (f"centralised DMoN (hidden {c.hidden}, lr {c.lr:g}, dropout {c.dropout:g}, "
                f"collapse {c.collapse:g}) trained on the pooled graph's training edges for {epochs} epochs, "
                f"last weights, {self._k_and_seed()}")
