"""Strategy ``fedavg-dmon``: federated community detection, FedAvg of DMoN GNN weights.

Leeney & McConville, "A Framework for Exploring Federated Community
Detection" (2023). Clients hold node-partitioned subgraphs of one graph
(cross-client edges lost; ``partition.overlap`` lets clients share nodes),
all with the same features. The paper's shared-node setting (Figure 2; its
code gives every client 1.5 N/C nodes) is ``partition.overlap=0.5``. Math and the edge split / model selection rules:
``app.protocols.fedavg_dmon``.

Modes (``fedavg-dmon.mode``), so the paper's comparison is one command each:

* ``federated``: FedAvg weighted by node counts every round;
* ``isolated``: same rounds and epochs, but clients never aggregate (each
  trains, selects and labels with its own model; no weights leave a client);
* ``centralised``: as isolated with exactly one client holding the whole
  graph (``--num-clients 1``; any node partitioner with one client gives it
  every node and edge).

Wire protocol (what leaves each client in **bold**):

1. ``query.dmon_init`` (down: k) -> up: **sizes only**: feature dimension
   and number of nodes held (the FedAvg weight ``N_c``).
2. ``train.dmon_train`` x num-rounds. Down: the global weights ``W_r`` (4
   float32 arrays, ``DMoNModel.state_dict()`` names; isolated/centralised:
   round 1 only, the common initialisation) and ``k``. The client trains
   ``local-epochs`` Adam epochs and replies, except with ``dp-clip > 0``
   (see below), **the validation modularity of W_r (in [-1/2, 1]) and its
   validation-edge count (a whole number), the per-epoch losses (one finite
   number per local epoch)**, and in federated mode **its trained
   weights W_c** (exact shapes, finite; a bad upload is rejected and that
   client left out of the average and, as ``ServerSession`` does for every
   rejected reply, dropped for the rest of the run). With ``dp-clip > 0`` the weights are
   ``W_r + clip(W_c - W_r) + N(0, (z C)^2)`` (client-level DP-FedAvg); with
   ``secure`` the upload is instead one ring vector, the pairwise-masked
   fixed-point ``(N_c/N) * W_c`` (the server learns only the weighted sum,
   i.e. the new global model; every client must answer).
3. ``query.dmon_eval`` (federated, ``select=val-modularity``, so never with
   DP; down: the final global weights) -> up: **validation modularity and
   validation-edge count**.
4. ``query.dmon_assign`` (down: the selected global weights; isolated:
   nothing) -> up: **node ids, cluster labels, owned flags and the client's
   own metrics** (ACC/NMI/ARI/macro-F1 on its nodes, modularity/conductance
   on its test edges and on its whole local graph; without DP also the
   validation modularity of those weights): evaluation outputs, like every
   strategy's, outside the DP guarantee.

Client-level DP (``dp-clip > 0``, federated only): in the training rounds a
client sends nothing but its noised weights, so the epsilon reported
(``metrics["dp_epsilon"]``, Opacus RDP accountant, one release per round)
covers its whole local subgraph there. The validation scores and losses are
functions of that subgraph the noise does not cover, so they are not sent
(and ``dmon_eval`` is refused); the server cannot select a round by
validation modularity and requires ``select=last`` (anything else is a
ConfigError before any message is sent). The round history then records
``val_modularity``, ``loss`` and ``losses`` as None. Not covered, sent in
clear: the feature dimension and node count (step 1, needed for the FedAvg
weights) and the evaluation outputs of step 4.

Server: ``W_{r+1} = sum_c (N_c/N) W_c`` over the valid uploads; model
selection (``select=val-modularity``) keeps the global weights with the
best validation-edge-weighted mean validation modularity (federated), or
each client keeps its own best (isolated/centralised).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from app.config import ConfigError, Param
from app.privacy.gaussian import CLIENT_LEVEL
from app.protocols import fedavg_dmon as proto
from app.wire import ArraySpec, ProtocolError, ReplySpec, ValueSpec
from app.transport import pack, unpack
from strategies.base import (ClusteringStrategy, StrategyOutput, announced_rows, check_item_ids,
                             common_feature_dimension, concat_int64)

MODES = ("federated", "isolated", "centralised")
SELECT = ("val-modularity", "last")
OPT_STATE = ("keep", "reset")
P = "fedavg-dmon."
#: A client's validation score: the modularity of its labels on its validation edges (in [-1/2, 1]) and
#: the number of those edges (its weight in the combined score).
SCORE_SPEC = {"val_modularity": ValueSpec(low=-0.5, high=1.0), "val_edges": ValueSpec(whole=True, low=0)}
DP_PROTECTS = ("each client's whole local subgraph (client-level DP) in its training-round uploads: one release "
               "of its noised model update per round, no validation score or loss sent; not covered: its feature "
               "dimension and node count, sent once in clear for the FedAvg weights, and its final labels and own "
               "metrics (evaluation outputs)")


@lru_cache(maxsize=32)
def _calibrated(epsilon: float, delta: float, rounds: int) -> float:
    from app.privacy.gaussian import calibrate_noise_multiplier

    return calibrate_noise_multiplier(epsilon, delta, rounds, adjacency="replace")


def dp_noise_multiplier(config) -> float:
    """``dp-noise``, or the multiplier reaching ``dp-epsilon`` after num-rounds releases."""
    eps = float(config[P + "dp-epsilon"])
    if eps > 0:
        return _calibrated(eps, float(config[P + "dp-delta"]), int(config["num-rounds"]))
    return float(config[P + "dp-noise"])


def dp_mechanism(config):
    """The client-level Gaussian mechanism (one release per client per round)."""
    from app.privacy.gaussian import GaussianMechanism

    return GaussianMechanism(float(config[P + "dp-clip"]), dp_noise_multiplier(config),
                             delta=float(config[P + "dp-delta"]), adjacency="replace")


class FedAvgDMoN(ClusteringStrategy):
    """Federated community detection (Leeney & McConville, 2023). Each client holds a subgraph of
    one graph (cross-client edges are lost; ``partition.overlap`` lets clients share nodes) and
    trains a DMoN graph neural network (a GCN encoder with a modularity loss and collapse
    regularisation) for a few local epochs per round; the server averages the weights by node
    count (FedAvg; optionally under secure aggregation and/or client-level DP-FedAvg) and keeps the
    weights of the round with the best validation-edge modularity. Modes ``isolated`` and
    ``centralised`` give the paper's comparison. Centralised reference: DMoN trained on the whole
    graph for as many epochs."""

    name = "fedavg-dmon"
    summary = "FedAvg of a DMoN GNN (modularity loss) over node-partitioned subgraphs"
    split = "nodes: each client holds a subgraph of one graph (optionally with shared nodes)"
    partitioners = ("node-random", "node-community", "node-dirichlet")
    needs_edges = True
    local_graphs = True
    needs_features = True
    params = (
        Param(P + "mode", str, "federated", "federated (FedAvg), isolated (no aggregation) or "
              "centralised (one client with the whole graph)", choices=MODES, primary=True),
        Param(P + "local-epochs", int, 5, "local Adam epochs per round", low=1, high=100_000, primary=True),
        Param(P + "lr", float, 1e-3, "Adam learning rate", low=1e-12, high=10.0, primary=True),
        Param(P + "hidden", int, 64, "GCN output dimension", low=1, high=100_000),
        Param(P + "dropout", float, 0.5, "dropout after the GCN layer", low=0.0, high=0.99),
        Param(P + "collapse", float, 1.0, "collapse regularisation lambda of the DMoN loss", low=0.0),
        Param(P + "sparse-features", bool, True,
              "feed the features to the GCN as a sparse tensor (same model; fast on bag-of-words)"),
        Param(P + "optimizer-state", str, "keep",
              "keep: each client's Adam moments persist between rounds; reset: fresh Adam every round",
              choices=OPT_STATE),
        Param(P + "val-fraction", float, 0.1, "fraction of edges held out for model selection", low=0.0, high=0.9),
        Param(P + "test-fraction", float, 0.2, "fraction of edges held out for testing", low=0.0, high=0.9),
        Param(P + "select", str, "val-modularity",
              "model selection: best validation-edge modularity, or the last weights (dp-clip > 0 needs last: "
              "clients then send no validation score)", choices=SELECT),
        Param(P + "dp-clip", float, 0.0, "client-level DP-FedAvg: L2 clip of each update (0 = off; needs "
              "select=last)", low=0.0),
        Param(P + "dp-noise", float, 1.0, "DP-FedAvg noise multiplier z (sigma = z * clip)", low=1e-6),
        Param(P + "dp-epsilon", float, 0.0,
              "DP-FedAvg: if > 0, calibrate z to reach this epsilon after num-rounds rounds (at most 1e4: Opacus' "
              "search for z does not end for a huge epsilon, which protects nothing anyway)", low=0.0, high=1e4),
        Param(P + "dp-delta", float, 1e-5, "DP-FedAvg delta", low=1e-12, high=0.5),
        Param(P + "secure", bool, False, "secure aggregation of the weighted weights"),
    )

    @classmethod
    def check(cls, config) -> None:
        super().check(config)
        mode = config[P + "mode"]
        if mode == "centralised" and int(config["num-clients"]) > 1:
            raise ConfigError(f"fedavg-dmon.mode=centralised needs num-clients=1 (one client holding the whole "
                              f"graph); got num-clients={config['num-clients']}")
        if mode != "federated" and (float(config[P + "dp-clip"]) > 0 or bool(config[P + "secure"])):
            raise ConfigError(f"fedavg-dmon.dp-clip and fedavg-dmon.secure apply to mode=federated only; "
                              f"got mode={mode}")
        if float(config[P + "dp-epsilon"]) > 0 and float(config[P + "dp-clip"]) == 0:
            raise ConfigError(f"fedavg-dmon.dp-epsilon={config[P + 'dp-epsilon']} needs fedavg-dmon.dp-clip > 0 "
                              "(the clip switches DP-FedAvg on; without it nothing would be noised); valid choices: "
                              "set dp-clip > 0, or dp-epsilon=0")
        if float(config[P + "dp-clip"]) > 0 and config[P + "select"] != "last":
            raise ConfigError(f"fedavg-dmon.select={config[P + 'select']} is not available with fedavg-dmon.dp-clip"
                              f"={config[P + 'dp-clip']} (clients send no un-noised validation score under DP); "
                              f"valid choices: select=last, or dp-clip=0")
        total = float(config[P + "val-fraction"]) + float(config[P + "test-fraction"])
        if total >= 1.0:
            raise ConfigError(f"fedavg-dmon.val-fraction + fedavg-dmon.test-fraction = {total:g}; must be < 1")
        if config[P + "select"] == "val-modularity" and float(config[P + "val-fraction"]) == 0:
            raise ConfigError("fedavg-dmon.select=val-modularity needs fedavg-dmon.val-fraction > 0; "
                              "valid choices: set val-fraction > 0 or select=last")

    # ------------------------------------------------------------------ protocol
    def run(self, session) -> StrategyOutput:
        c = self.config
        k, seed, rounds = int(c["num-clusters"]), int(c["seed"]), int(c["num-rounds"])
        mode, select = str(c[P + "mode"]), str(c[P + "select"])
        federated = mode == "federated"
        if mode == "centralised" and len(session.clients) != 1:
            raise ConfigError(f"fedavg-dmon.mode=centralised needs exactly one client; {len(session.clients)} connected")
        init = session.broadcast(proto.DMON_INIT, pack(values={"k": k}),
                                 ReplySpec(numbers={"num_features": ValueSpec(whole=True, low=1),
                                                    "num_nodes": ValueSpec(whole=True, low=1)}))
        sizes = {n: unpack(v)[1] for n, v in init.items()}
        f = common_feature_dimension(s["num_features"] for s in sizes.values())
        counts = {n: int(s["num_nodes"]) for n, s in sizes.items()}
        rows = announced_rows(session)
        wrong = {session.partition_of(n): (count, rows[n]) for n, count in counts.items() if count != rows[n]}
        if wrong:  # the FedAvg weight of a client is its node count: an inflated one would outvote the others
            raise ProtocolError("step 'dmon_init': node counts other than announced in hello: " + ", ".join(
                f"client {c} reports {got} for its {announced} nodes" for c, (got, announced) in sorted(wrong.items())))
        hidden, dropout = int(c[P + "hidden"]), float(c[P + "dropout"])
        shapes = proto.param_shapes(f, k, hidden)
        weights = proto.init_weights(f, k, seed, hidden, dropout)

        dp = federated and float(c[P + "dp-clip"]) > 0
        secure = federated and bool(c[P + "secure"])
        mech = None
        if dp:
            mech = dp_mechanism(c)
            mech.record(session.ledger, "dp-fedavg", DP_PROTECTS, CLIENT_LEVEL)
        if secure:
            session.setup_secure_aggregation()
        size = sum(int(np.prod(s)) for s in shapes.values())
        # under DP: the noised weights only
        scored = {} if dp else {**SCORE_SPEC, "losses": ValueSpec(length=int(c[P + "local-epochs"]))}
        if secure:
            train_spec = ReplySpec(arrays={"weights": ArraySpec((size,), kind="u", masked=True, noised=dp)},
                                   numbers=scored)
        elif federated:
            train_spec = ReplySpec(arrays={n: ArraySpec(shapes[n], kind="f", noised=dp) for n in proto.PARAM_NAMES},
                                   numbers=scored)
        else:
            train_spec = ReplySpec(numbers=scored)

        total_nodes = float(sum(counts.values()))
        best, best_score, best_round = weights, -np.inf, 0
        history = []
        for r in range(1, rounds + 1):
            send_weights = federated or r == 1
            values = {"k": k, "round": r}
            if secure:
                values.update(session.secagg_values("weights", float(c["secagg.bound"])))
            contents = {
                node: pack(weights if send_weights else None,
                           {**values, "factor": counts[node] / total_nodes} if secure else values)
                for node in session.node_ids
            }
            replies = session.exchange(proto.DMON_TRAIN, contents, train_spec, category="train",
                                       require_all=secure)
            if not replies:
                raise ProtocolError(f"round {r}: no valid client reply")
            excluded = [session.partition_of(n) for n in contents if n not in replies]
            score = losses = None  # under DP: no score or loss was sent
            if not dp:
                vals = {n: unpack(v)[1] for n, v in replies.items()}
                score = proto.combine_scores([vals[n]["val_modularity"] for n in replies],
                                             [vals[n]["val_edges"] for n in replies])
                if federated and score > best_score:  # score of W_r, the weights sent this round
                    best, best_score, best_round = weights, score, r
                mean = np.mean([np.asarray(vals[n]["losses"], dtype=np.float64) for n in replies], axis=0)
                losses = [float(v) for v in mean]
            if secure:
                weights = proto.unflatten(session.secure_sum(replies, "weights", values), shapes)
            elif federated:
                uploads = [unpack(replies[n])[0] for n in replies]
                weights = proto.fedavg(uploads, [counts[n] for n in replies])
            if mech is not None:
                mech.step()
            history.append({"round": r, "val_modularity": score, "loss": None if losses is None else losses[-1],
                            "losses": losses, "excluded": excluded})
            session.round_done(r, rounds, val_modularity=score)

        if federated:
            if select == "val-modularity":
                ev = session.broadcast(proto.DMON_EVAL, pack(weights, {"k": k}),
                                       ReplySpec(numbers=SCORE_SPEC), require_all=False)
                if ev:
                    vals = [unpack(v)[1] for v in ev.values()]
                    score = proto.combine_scores([v["val_modularity"] for v in vals], [v["val_edges"] for v in vals])
                    if score > best_score:
                        best, best_score, best_round = weights, score, rounds + 1
                final = best
            else:
                final, best_round = weights, rounds + 1
        if mech is not None:
            mech.record(session.ledger, "dp-fedavg", DP_PROTECTS, CLIENT_LEVEL)

        assign_spec = ReplySpec(arrays={"node_ids": ArraySpec((None,), kind="iu", low=0, unique=True),
                                        "labels": ArraySpec((None,), kind="iu", low=0, high=k),
                                        "owned": ArraySpec((None,), kind="iu", low=0, high=2)},
                                same_length=("node_ids", "labels", "owned"),
                                optional={name: ValueSpec(low=-1.0, high=1.0) for name in proto.CLIENT_METRICS})
        out = session.broadcast(proto.DMON_ASSIGN, pack(final if federated else None, {"k": k}), assign_spec)
        replies = {node: unpack(content) for node, content in out.items()}
        ids_of = {node: session.positions(proto.DMON_ASSIGN, node, a["node_ids"]) for node, (a, _) in replies.items()}
        check_item_ids(session, proto.DMON_ASSIGN, ids_of, exclusive=False, expected=rows)
        # every node is owned by one client (copies made by partition.overlap are not owned)
        check_item_ids(session, proto.DMON_ASSIGN, {node: ids_of[node][a["owned"].astype(bool)]
                                                for node, (a, _) in replies.items()}, exclusive=True)
        ids, labels, per_client = [], [], []
        for node, (arrays, vals) in replies.items():
            n = arrays["node_ids"].size
            own = arrays["owned"].astype(bool)
            ids.append(ids_of[node][own])
            labels.append(arrays["labels"][own])
            per_client.append({"client": session.partition_of(node), "num_nodes": int(n),
                               **{k_: float(v) for k_, v in vals.items()}})
        dropped = sorted(session.partition_of(n) for n in session.dropped)
        metrics = {"mode": mode, "select": select, "selected_round": int(best_round) if federated else None,
                   "clients": per_client, "dropped_clients": dropped}
        for key in ("f1", "nmi", "acc", "modularity_test", "conductance_test", "modularity_local"):
            got = [p[key] for p in per_client if key in p]
            if got:
                metrics[f"client_mean_{key}"] = float(np.mean(got))
        if mech is not None:
            metrics["dp_epsilon"] = mech.epsilon()
            metrics["dp_noise_multiplier"] = mech.noise_multiplier
        return StrategyOutput(labels=concat_int64(labels), ids=concat_int64(ids), history=history,
                              metrics=metrics)

    def reference(self, data) -> np.ndarray:
        """Centralised DMoN (``app.models.train_dmon``) on the pooled graph's training
        edges (same global edge split and seed), num-rounds x local-epochs epochs,
        last weights (no model selection)."""
        from app.models import train_dmon

        c = self.config
        train, _, _ = proto.split_adjacency(data.adj, np.arange(data.num_nodes), int(c["seed"]),
                                            float(c[P + "val-fraction"]), float(c[P + "test-fraction"]))
        labels, _ = train_dmon(data.x, train, int(c["num-clusters"]), int(c["seed"]),
                               epochs=int(c["num-rounds"]) * int(c[P + "local-epochs"]), lr=float(c[P + "lr"]),
                               dropout=float(c[P + "dropout"]), hidden=int(c[P + "hidden"]),
                               collapse_regularization=float(c[P + "collapse"]),
                               sparse_features=bool(c[P + "sparse-features"]))
        return labels

    def reference_method(self) -> str:
        c = self.config
        epochs = int(c["num-rounds"]) * int(c[P + "local-epochs"])
        return (f"centralised DMoN (hidden {c[P + 'hidden']}, lr {c[P + 'lr']:g}, dropout {c[P + 'dropout']:g}, "
                f"collapse {c[P + 'collapse']:g}) trained on the pooled graph's training edges for {epochs} epochs, "
                f"last weights, {self._k_and_seed()}")
