"""Strategy ``gw-ldp``: FedAvg-trained GNN, LDP-encoded node embeddings, and a
server-side Gromov-Wasserstein matrix for graph classification and clustering.

Clients hold whole graphs: a Dirichlet share of a graph collection (MUTAG,
PROTEINS, IMDB-BINARY; partitioner ``graph-dirichlet``) or k-hop subgraphs
around centre nodes of one big graph (``khop``; the centre label is the
subgraph's pseudo-label). Every client splits its graphs 7:2:1 into
train/validation/test (seeded). Wire protocol: :mod:`fedgraphcore.protocols.gw_ldp`.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from fedgraphcore.config import ConfigError, RunConfig, SharedConfig
from fedgraphcore.data.types import GraphCollection, GraphData
from fedgraphcore.privacy.gaussian import CLIENT_LEVEL, GaussianMechanism
from fedgraphcore.privacy.ldp import LDPAccountant, default_m
from fedgraphcore.protocols import gw_ldp
from fedgraphcore.transport import pack, unpack
from fedgraphcore.wire import ProtocolError, ReplySpec, whole_number
from strategies.base import ClusteringStrategy, StrategyOutput

if TYPE_CHECKING:
    from fedgraphcore.session import ServerSession

#: Ledger entry (mechanism name, what it protects) per training-DP mode.
DP_LEDGER = {  # name, what it protects, the unit of one neighbouring change
    "client": ("dp-fedavg:weights", "each client's whole local dataset (client-level DP of every weight upload; "
                                    "its count of training graphs, sent in clear beside them, is not covered)",
               CLIENT_LEVEL),
    "sgd": ("dp-sgd:local-graphs",
            "each training graph of a client (add/remove one graph) in all of its weight uploads (the count of "
            "training graphs, sent in clear beside them, is not covered)",
            "training graph (one DP-SGD sample)"),
}



@dataclass
class _Embeddings:
    """The embedding releases of a run: the embedding ``width``, every client's described counts
    (client -> ``in_dim``, ``graphs``, ``train``), its newest release (client -> (round, upload))
    and how many releases were requested."""

    width: int
    described: dict[int, dict[str, int]]
    latest: dict[int, tuple[int, dict]] = field(default_factory=dict)
    releases: int = 0


class GWLDP(ClusteringStrategy[gw_ldp.GWLDPConfig]):
    """Graph classification and clustering with local differential privacy. Clients hold whole
    graphs (a share of a graph collection such as MUTAG, or k-hop subgraphs around nodes of one
    graph) and train a shared GNN by FedAvg (optionally with client-level DP-FedAvg or local
    DP-SGD). Then each client sends LDP-encoded node embeddings of its graphs (epsilon per graph)
    and the server computes the Gromov-Wasserstein distance between every pair of graphs, clusters
    the GW matrix and fits an SVC on it for classification. Centralised reference:
    Gromov-Wasserstein on the graphs' shortest-path distances (topology only), clustered the same
    way."""

    name = "gw-ldp"
    summary = "FedAvg GNN + LDP node embeddings + server-side Gromov-Wasserstein (graph classification/clustering)"
    split = "graphs: each client holds whole graphs of a collection (graph-dirichlet) or k-hop subgraphs (khop)"
    ignores = ("secagg.scale", "secagg.bound")
    partitioners = ("graph-dirichlet", "khop")
    refuses_weights = "takes integer node degrees and hop distances (it counts every edge as 1)"

    settings = gw_ldp.GWLDPConfig

    @classmethod
    def hello_values(cls, config: RunConfig) -> dict:
        """The GNN's outputs, one per class: a client whose graph labels need more refuses at hello."""
        return {"num_classes": config["num-clusters"]}

    @classmethod
    def hello_reply(cls, config: RunConfig) -> ReplySpec:
        """Each client's feature width and graph counts."""
        return ReplySpec(numbers=gw_ldp.HELLO_NUMBERS)

    @classmethod
    def check(cls, config: RunConfig) -> None:
        super().check(config)
        cfg = gw_ldp.GWLDPConfig.of(config)
        if cfg.norm_statistics == "pooled" and cfg.dp != "none":
            raise ConfigError(f"invalid value 'pooled' for 'gw-ldp.norm-statistics' with gw-ldp.dp="
                              f"'{cfg.dp}': the activation moments it uploads are not covered by "
                              "the DP noise; valid with DP: auto, averaged")

    # ------------------------------------------------------------------ protocol
    def run(self, session: ServerSession) -> StrategyOutput:
        from fedgraphcore.models import build_model

        k, seed = self.shared.num_clusters, self.shared.seed
        described = self._describe(session)
        in_dim = self._feature_width(described)
        model = build_model(self.cfg.model, in_dim, k, seed)
        pooled = self.cfg.norm_statistics != "averaged" and self.cfg.dp == "none"
        layers = gw_ldp.norm_layers(model, in_dim) if pooled else []
        emb = _Embeddings(gw_ldp.embedding_width(model, k, self.cfg.embedding), described)
        dp = gw_ldp.training_mechanism(self.cfg)
        timing: dict[str, float] = {}
        t0 = time.perf_counter()
        weights, history = self._training_rounds(session, model, emb, layers, dp)
        timing["train_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        weights = self._pool_norm_statistics(session, weights, layers)
        timing["norm_s"] = time.perf_counter() - t0
        final_round = self.shared.num_rounds + 1
        self._embed(session, weights, emb, final_round)
        uploads = self._combine(emb.latest)
        self._record_privacy(session, uploads, emb.releases, bool(layers), dp)
        t0 = time.perf_counter()
        dist, metrics = self._gw_matrix(uploads)
        timing["gw_s"] = time.perf_counter() - t0
        metrics = {"norm_statistics": "pooled" if layers else "averaged", "norm_rounds": len(layers),
                   **metrics, **timing, **self._classify(dist, uploads),
                   **self._coverage(session, emb, final_round)}
        return self._output(dist, uploads, metrics, history)

    def _describe(self, session: ServerSession) -> dict[int, dict[str, int]]:
        """Step 1, with hello (down: ``num_classes``) -> up: ``in_dim``, ``graphs`` and ``train`` of
        every client, by client (``train <= graphs`` and both counts >= 1, else the run stops)."""
        described = {}
        for c in session.clients:
            problem = gw_ldp.describe_problem(c.summary)
            if problem:
                raise ProtocolError(f"client {c.partition_id}: malformed hello figures: {problem}")
            described[c.partition_id] = {name: int(c.summary[name]) for name in ("in_dim", "graphs", "train")}
        return described

    @staticmethod
    def _feature_width(described: dict[int, dict[str, int]]) -> int:
        """The feature width every client described; clients that disagree stop the run."""
        dims = {v["in_dim"] for v in described.values()}
        if len(dims) != 1:
            raise ProtocolError(f"clients report different feature widths {sorted(dims)}")
        return dims.pop()

    def _training_rounds(self, session: ServerSession, model, emb: _Embeddings, layers: list[str],
                         dp: GaussianMechanism | None) -> tuple[dict[str, np.ndarray], list[dict]]:
        """Step 2, ``fit`` x ``num-rounds`` (down: the global weights ``w.<name>``, epochs, learning
        rate, round, seed) -> up: the trained weights, ``num_examples`` and, without DP, ``loss``;
        FedAvg of the replies. Every ``embed-every`` rounds before the last, an embedding release
        (steps 2b and 3). Returns the trained weights and the per-round history."""
        rounds, every = self.shared.num_rounds, self.cfg.embed_every
        weights = gw_ldp.get_weights(model)
        spec = gw_ldp.fit_reply({n: a.shape for n, a in weights.items()}, gw_ldp.trainable_names(model), self.cfg.dp)
        limits = {n: (session.partition_of(n), emb.described[session.partition_of(n)]["train"])
                  for n in session.node_ids}
        history = []
        for rnd in range(1, rounds + 1):
            content = pack(gw_ldp.weights_message(weights), {"epochs": self.cfg.local_epochs, "lr": self.cfg.lr,
                                                            "round": rnd, "seed": self.shared.seed})
            session.take_back()  # a client that left and came back trains W_r like any other
            replies = session.broadcast(gw_ldp.FIT, content, spec, category="train", require_all=False)
            weights, loss = self._aggregate(replies, weights, limits)
            if dp is not None:  # DP-FedAvg: one release per round; DP-SGD: local-epochs steps per round
                dp.step(self.cfg.local_epochs if self.cfg.dp == "sgd" else 1)
            history.append({"round": rnd, "loss": loss})
            session.round_done(rnd, rounds, loss=loss)
            if every and rnd % every == 0 and rnd < rounds:
                self._embed(session, self._pool_norm_statistics(session, weights, layers), emb, rnd)
        return weights, history

    def _aggregate(self, replies: dict, weights: dict[str, np.ndarray],
                   limits: dict[int, tuple[int, int]]) -> tuple[dict[str, np.ndarray], float | None]:
        """FedAvg of the replies' weights by ``num_examples``, which must be a whole
        number between 0 and the training graphs the client described (``limits``: node id ->
        (client, training graphs)); and the mean loss (None under DP, where no loss is sent;
        NaN when no client trained)."""
        from flwr.app import Array, ArrayRecord, MetricRecord, RecordDict
        from flwr.serverapp.strategy.strategy_utils import aggregate_arrayrecords

        records, losses, counts = [], [], []
        for node, content in replies.items():
            arrays, values = unpack(content)
            n, loss = self._fit_values(*limits[node], values)
            counts.append(n)
            losses.append(loss)
            if n > 0:
                records.append(RecordDict({"arrays": ArrayRecord({k: Array(v) for k, v in arrays.items()}),
                                           "m": MetricRecord({"num_examples": n})}))
        if not records:
            return weights, float("nan")
        agg = aggregate_arrayrecords(records, "num_examples")
        new = {k[2:]: v.numpy().astype(np.float32) for k, v in agg.items()}
        known = sum(counts) and not np.isnan(losses).any()
        return new, float(np.average(losses, weights=counts)) if known else None

    @staticmethod
    def _fit_values(client: int, train: int, values: dict) -> tuple[int, float]:
        """A ``fit`` reply's ``num_examples`` (a whole number from 0 to the client's ``train``
        graphs) and ``loss`` (a finite number; NaN when not sent, under DP); else the run stops."""
        raw = values["num_examples"]
        n = whole_number(raw)
        if n is None or not 0 <= n <= train:
            raise ProtocolError(f"client {client}: num_examples={raw!r}; valid: a whole number from 0 to its "
                                f"{train} training graphs")
        loss = values.get("loss", math.nan)  # not sent under DP
        if "loss" in values and (isinstance(loss, bool) or not isinstance(loss, (int, float))
                                 or not math.isfinite(loss)):
            raise ProtocolError(f"client {client}: loss={loss!r}; valid: a finite number")
        return n, float(loss)

    def _pool_norm_statistics(self, session: ServerSession, weights: dict[str, np.ndarray],
                              layers: list[str]) -> dict[str, np.ndarray]:
        """Step 2b: ``weights`` with every BatchNorm layer's statistics recomputed over the
        union of the clients' training graphs, one round per layer in forward order
        (a layer's input depends on the statistics of the layers before it).

        Down: the weights (earlier layers already pooled) and the layer name.
        Up: ``moments`` = ``[N_c, sum a_v, sum a_v^2]`` of that layer's input over
        the client's training-graph nodes (:func:`fedgraphcore.protocols.gw_ldp.norm_input_moments`).
        A malformed reply stops the run; a client that does not answer is dropped
        and the statistics are those of the clients that did."""
        for layer in layers:
            width = weights[f"{layer}.running_mean"].shape[0]
            replies = session.broadcast(gw_ldp.GW_NORM, pack(gw_ldp.weights_message(weights), {"layer": layer}),
                                        gw_ldp.norm_reply(width), require_all=False)
            moments = []
            for node, content in replies.items():
                up = unpack(content)[0]["moments"]
                problem = gw_ldp.moments_problem(up, width)
                if problem:
                    raise ProtocolError(f"client {session.partition_of(node)}: malformed BatchNorm moments for "
                                        f"'{layer}': {problem}")
                moments.append(up)
            if not moments:
                raise ProtocolError(f"no client answered the BatchNorm round for '{layer}'")
            weights = gw_ldp.with_norm_statistics(weights, layer, *gw_ldp.pooled_norm_statistics(moments))
        return weights

    def _embed(self, session: ServerSession, weights: dict[str, np.ndarray], emb: _Embeddings, rnd: int) -> None:
        """Step 3, one embedding release, ``gw_embed`` (down: the weights, epsilon, layer and ``rnd``,
        its round, which tells a re-sent request from the next release) -> up: every answering
        client's checked embeddings with their graphs' sizes, ids, splits and labels, kept as its
        newest release in ``emb`` (a client that does not answer is dropped; its older release,
        if any, stays in use)."""
        eps = self.cfg.epsilon
        replies = session.broadcast(
            gw_ldp.GW_EMBED,
            pack(gw_ldp.weights_message(weights), {"epsilon": eps, "layer": self.cfg.embedding, "round": rnd}),
            gw_ldp.embed_reply(emb.width, not math.isinf(eps)), require_all=False,
        )
        out = {}
        for node, content in replies.items():
            client = session.partition_of(node)
            arrays, _ = unpack(content)
            problem = gw_ldp.embedding_upload_problem(arrays, emb.described[client]["graphs"],
                                                     self.shared.num_clusters, eps)
            if problem:
                raise ProtocolError(f"client {client}: malformed embedding upload: {problem}")
            bounds = np.concatenate([[0], np.cumsum(arrays["sizes"].astype(np.int64))])
            up = {n: arrays[n].astype(np.int64) for n in ("sizes", "split", "labels", "eval_labels")}
            up["graph_ids"] = session.positions(gw_ldp.GW_EMBED, node, arrays["graph_ids"])
            up["embeddings"] = [arrays["embeddings"][a:b].astype(np.float64) for a, b in zip(bounds[:-1], bounds[1:])]
            out[client] = up
        self._keep(emb.latest, rnd, out)
        emb.releases += 1

    @staticmethod
    def _keep(latest: dict, rnd: int, ups: dict) -> None:
        """Make ``ups`` (round ``rnd``) each client's newest release. Only the codes may change between
        releases: the graphs, their sizes, splits and labels are the client's data, so a release that
        names other ones is refused."""
        for client, up in ups.items():
            if client in latest:
                before = latest[client][1]
                for name in ("graph_ids", "sizes", "split", "labels", "eval_labels"):
                    if not np.array_equal(up[name], before[name]):
                        raise ProtocolError(f"client {client}: its embedding release of round {rnd} changes "
                                            f"'{name}' from its release of round {latest[client][0]}")
            latest[client] = (rnd, up)

    @staticmethod
    def _combine(latest: dict) -> dict:
        """Every client's newest release, items in graph-id order (ids must not repeat across clients)."""
        ups = [up for _, up in latest.values()]
        out = {n: np.concatenate([up[n] for up in ups]) for n in ("sizes", "graph_ids", "split", "labels",
                                                                    "eval_labels")}
        owner = np.concatenate([np.full(len(up["graph_ids"]), c) for c, (_, up) in latest.items()])
        embs = [h for up in ups for h in up["embeddings"]]
        order = np.argsort(out["graph_ids"], kind="stable")
        out, owner = {n: v[order] for n, v in out.items()}, owner[order]
        same = np.flatnonzero(np.diff(out["graph_ids"]) == 0)
        if same.size:
            i = same[0]
            a, b = sorted((int(owner[i]), int(owner[i + 1])))
            raise ProtocolError(f"clients {a} and {b} both uploaded graph id {out['graph_ids'][i]}")
        out["embeddings"] = [embs[i] for i in order]
        return out

    def _gw_matrix(self, uploads: dict) -> tuple[np.ndarray, dict]:
        """The GW matrix between the uploaded graphs' embedding spaces and its figures."""
        alpha = self.cfg.alpha
        decimals = gw_ldp.merge_decimals(self.cfg.merge_decimals, self.cfg.embedding)
        spaces = [gw_ldp.embedding_space(h, self.cfg.merge_duplicates, features=alpha < 1, decimals=decimals)
                  for h in uploads["embeddings"]]
        stats: dict = {}
        dist = gw_ldp.gw_matrix(spaces, self.cfg.workers, self.cfg.gw_max_iter, stats, alpha=alpha,
                               solver=self.cfg.gw_solver)
        n = len(spaces)
        return dist, {"gw_pairs": stats["pairs"], "gw_solved_pairs": stats["solved_pairs"],
                      "gw_distinct_spaces": stats["distinct_spaces"],
                      "gw_mean": float(dist[np.triu_indices(n, 1)].mean()) if n > 1 else 0.0}

    def _coverage(self, session: ServerSession, emb: _Embeddings, final_round: int) -> dict:
        """Which clients dropped, which gave an older release only, how many graphs no release covers."""
        return {"dropped_clients": sorted(session.partition_of(n) for n in session.dropped),
                "stale_clients": [{"client": c, "round": r} for c, (r, _) in sorted(emb.latest.items())
                                  if r < final_round],
                "graphs_missing": sum(v["graphs"] for c, v in emb.described.items() if c not in emb.latest)}

    def _output(self, dist: np.ndarray, uploads: dict, metrics: dict, history: list[dict]) -> StrategyOutput:
        """The graphs clustered on the GW matrix; with k-hop subgraphs the centres' labels are the truth
        and the ids the centres, for delivery."""
        labels = gw_ldp.cluster_gw(dist, self.shared.num_clusters, self.cfg.clustering, self.shared.seed)
        truth = uploads["eval_labels"] if self.shared.partitioner == "khop" else None
        return StrategyOutput(labels=labels, ids=uploads["graph_ids"], truth=truth, metrics=metrics, history=history,
                              distances=dist)

    def _record_privacy(self, session: ServerSession, uploads: dict, releases: int, pooled: bool,
                        dp: GaussianMechanism | None) -> None:
        """The ledger: the LDP of the embeddings, what went up in clear, and the training DP if any."""
        self._record_ldp(session, uploads, releases)
        self._record_clear_uploads(session, pooled=pooled)
        if dp is not None:
            name, protects, unit = DP_LEDGER[self.cfg.dp]
            dp.record(session.ledger, name, protects + (self._khop_unit() if self.cfg.dp == "sgd" else ""), unit)

    def _khop_unit(self) -> str:
        """What a 'graph' is as the privacy unit when the graphs are k-hop subgraphs of one graph."""
        if self.shared.partitioner != "khop":
            return ""
        return ("; the graphs are overlapping k-hop subgraphs of one graph, so a node or edge in s of them "
                "is protected only at s times the per-graph epsilon (group privacy)")

    def _record_ldp(self, session: ServerSession, uploads: dict, releases: int) -> None:
        """The LDP of the embedding releases: the worst-off graph's epsilon, composed over every release."""
        eps = self.cfg.epsilon
        sizes = uploads["sizes"]
        d = uploads["embeddings"][0].shape[1] if uploads["embeddings"] else 0
        if math.isinf(eps):
            session.ledger.add_mechanism("ldp:multibit-embeddings", "node embeddings of each graph",
                                         {"epsilon_per_graph": "inf", "d": d},
                                         "none: no noise (epsilon = inf), embeddings uploaded in clear", None)
            return
        per_graph = np.array([gw_ldp.graph_epsilon(int(n), eps) for n in sizes])
        accountant = LDPAccountant(float(per_graph.max()))  # the worst-off graph, every release composed
        accountant.step(releases)
        session.ledger.add_mechanism(
            "ldp:multibit-embeddings",
            "each graph's n x d node-embedding matrix (epsilon per graph, composed over its n rows "
            "at epsilon/n each; releases compose)" + self._khop_unit(),
            {"epsilon_per_graph": "1/|V|" if eps == 0 else eps, "epsilon_max_per_graph": float(per_graph.max()),
             "epsilon_min_per_graph": float(per_graph.min()), "releases": releases, "d": d,
             "m": default_m(float(per_graph.max()), d) if d else 0, "alpha": 0.0, "beta": 1.0},
            "epsilon-LDP per graph embedding (multi-bit encoder, GW-LDP Alg. 1)",
            accountant,
        )

    def _record_clear_uploads(self, session: ServerSession, pooled: bool) -> None:
        """Register what the clients upload without any noise, so the privacy section's overall
        note names it beside the LDP (and training-DP) epsilon, which covers none of it."""
        clear = ["feature width and graph counts (hello)",
                 "number of training graphs every round (fit)"]
        if self.cfg.dp == "none":
            clear.append("locally trained GNN weights, BatchNorm running statistics (GIN) and mean training loss "
                         "every round (fit)")
        if pooled:
            clear.append("per-channel node count, sum and sum of squares of every BatchNorm layer's input over "
                         "the training graphs' nodes, before every embedding release (gw_norm)")
        clear.append("graph sizes, graph ids, split codes, train/validation labels and every graph's evaluation "
                     "label (gw_embed)")
        session.ledger.add_mechanism(
            "gw-ldp:clear-uploads", "nothing: these uploads carry no noise", {"revealed": clear},
            "none: uploaded in clear, not covered by the reported epsilon",
        )

    def _classify(self, dist: np.ndarray, uploads: dict) -> dict:
        """SVC test accuracy on the GW kernel and the chosen (C, gamma), or why it was skipped."""
        if not self.cfg.svc:
            return {}
        split = uploads["split"]
        y = np.where(split == gw_ldp.SPLIT_TEST, uploads["eval_labels"], uploads["labels"])
        problem = gw_ldp.svc_problem(y, split, self.cfg.svc_selection)
        if problem or not ((split == gw_ldp.SPLIT_TEST) & (y >= 0)).any():
            return {"svc_skipped": problem or "no labelled test graphs"}
        res = gw_ldp.svc_select(dist, y, split, self.cfg.svc_selection)
        return {"svc_selection": res["selection"], "svc_test_acc": res["test_acc"], "svc_val_acc": res["val_acc"],
                "svc_C": res["C"], "svc_gamma": res["gamma"], "svc_test_acc_grid_max": res["test_acc_grid_max"],
                "test_graphs": int(((split == gw_ldp.SPLIT_TEST) & (y >= 0)).sum())}

    # ------------------------------------------------------------------ reference
    def reference(self, data: GraphData | GraphCollection) -> np.ndarray:
        """Centralised topology-only baseline (GW_A): shortest-path GW between the
        pooled graphs (same items and order as the federated run), clustered the
        same way."""
        graphs, _ = pooled_graphs(data, self.config)
        mats = [gw_ldp.shortest_path_matrix(g.adj) for g in graphs]
        dist = gw_ldp.gw_matrix(mats, self.cfg.workers, self.cfg.gw_max_iter, solver=self.cfg.gw_solver)
        return gw_ldp.cluster_gw(dist, self.shared.num_clusters, self.cfg.clustering, self.shared.seed)

    def reference_method(self) -> str:
        return ("centralised topology-only GW_A: Gromov-Wasserstein distances between the pooled graphs' "
                f"shortest-path matrices, clustered by {self.cfg.clustering}, {self._k_and_seed()}")


def pooled_graphs(data: GraphData | GraphCollection, config: RunConfig) -> tuple[list, np.ndarray]:
    """All graphs of the run in graph-id order, with their (pseudo-)labels."""
    if isinstance(data, GraphCollection):
        return list(data.graphs), np.asarray(data.y)
    from fedgraphcore.data.params import partition_kwargs
    from fedgraphcore.data.partition import partition

    shared = SharedConfig.of(config)
    shards = partition(data, "khop", shared.num_clients, seed=shared.seed,
                       **partition_kwargs("khop", config.as_dict()))
    items = sorted((int(i), g, int(y)) for s in shards for i, g, y in zip(s.graph_ids, s.graphs, s.graph_y))
    return [g for _, g, _ in items], np.array([y for _, _, y in items])
