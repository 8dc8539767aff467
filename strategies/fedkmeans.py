"""Strategy ``fedkmeans``: federated Lloyd k-means on horizontally split rows.

A plain baseline every other method can be compared with. Wire protocol
(``app.protocols.fedkmeans`` holds the math):

1. ``kmeans_init`` (down: k, seed) -> up: ``centres`` (k x f local k-means++
   centres) and ``counts`` (k). A local centre of a one-member cluster is that
   member's feature row, so this step reveals coarse data summaries. At most
   k centres, whose sizes add up to the rows the client announced in hello.
2. ``kmeans_step`` x num-rounds (down: ``centres``) -> up: ``stats``, the
   per-cluster sums (k x f), counts (k) and the inertia in one vector; stops
   early when no centre moves more than ``fedkmeans.tol``. With
   ``fedkmeans.secure`` the vector is pairwise-masked (secure aggregation,
   set up once with two extra rounds) and the server learns only the sum over
   clients. The sizes must add up to the client's rows (secure: all rows) and
   the inertia be >= 0, else the run stops naming the client. Rows held by
   two clients (``partition.overlap`` > 0) would count twice: refused.
3. ``kmeans_assign`` (down: final ``centres``) -> up: ``node_ids`` and
   ``labels`` of the client's rows, for evaluation only; labels stay on the
   client as well.
"""

from __future__ import annotations

import numpy as np

from app.config import ConfigError, Param
from app.protocols import fedkmeans as proto
from app.wire import ArraySpec, ProtocolError, ReplySpec
from app.transport import pack, unpack
from strategies.base import ClusteringStrategy, StrategyOutput, announced_rows, check_item_ids, concat_int64


class FedKMeans(ClusteringStrategy):
    """Federated Lloyd k-means, the baseline the other methods can be compared with. Each client
    holds some rows (the nodes of a graph, optionally smoothed first by an AGC low-pass filter over
    its own subgraph, or samples). The server merges the clients' local k-means++ centres into k
    starting centres; then every round each client sends its per-cluster sums, counts and inertia
    (optionally under secure aggregation, so the server sees only their sum over the clients) and
    the server moves the centres. Finally the clients send their rows' labels for evaluation.
    Centralised reference: k-means on the pooled (filtered) features."""

    name = "fedkmeans"
    summary = "federated Lloyd k-means on rows split over clients (baseline)"
    split = "rows: each client holds some nodes (with their induced subgraph) or samples"
    partitioners = ("node-random", "node-community", "node-dirichlet", "sample", "sample-dirichlet")
    needs_features = True
    params = (
        Param("fedkmeans.filter-order", int, 0,
              "AGC low-pass filter order applied to each client's local subgraph first", low=0, high=1000,
              primary=True),
        Param("fedkmeans.tol", float, 1e-6, "stop when no centre moves more than this", low=0.0),
        Param("fedkmeans.secure", bool, False, "secure aggregation of the per-round statistics"),
    )

    @classmethod
    def check(cls, config) -> None:
        super().check(config)
        if float(config["partition.overlap"]) > 0:
            raise ConfigError(f"invalid value {config['partition.overlap']} for 'partition.overlap' with strategy "
                              "'fedkmeans': Lloyd's sums would count a row held by two clients twice; valid: 0")

    def run(self, session) -> StrategyOutput:
        k = int(self.config["num-clusters"])
        seed = int(self.config["seed"])
        rows = announced_rows(session)
        init = session.broadcast(
            "kmeans_init",
            pack(values={"k": k, "seed": seed}),
            ReplySpec(arrays={"centres": ArraySpec((None, None)), "counts": ArraySpec((None,), low=0)},
                      same_length=("centres", "counts")),
        )
        local = {node: unpack(content)[0] for node, content in init.items()}
        for node, a in local.items():
            self._check_counts(session, node, "kmeans_init", a["counts"], rows[node], at_most=k)
            with np.errstate(over="ignore"):
                overflow = not np.isfinite(np.square(a["centres"]).sum(1)).all()
            if a["centres"].shape[1] < 1 or overflow:  # every client squares distances to these centres
                raise ProtocolError(f"step 'kmeans_init': client {session.partition_of(node)} (node {node}) sent "
                                    f"centres of width {a['centres'].shape[1]} "
                                    + ("whose squared norms overflow" if overflow else "(no features)"))
        widths = {session.partition_of(node): a["centres"].shape[1] for node, a in local.items()}
        if len(set(widths.values())) != 1:
            raise ProtocolError(f"clients disagree on the feature dimension (client: width): {widths}")
        centres = proto.merge_seeds(
            np.vstack([a["centres"] for a in local.values()]), np.concatenate([a["counts"] for a in local.values()]),
            k, seed,
        )
        secure = bool(self.config["fedkmeans.secure"])
        if secure:
            session.setup_secure_aggregation()
        size = centres.size + k + 1
        step_spec = ReplySpec(arrays={"stats": ArraySpec((size,), kind="u" if secure else "f", masked=secure)})
        bound = proto.statistics_bound(max(rows.values()), float(self.config["secagg.bound"]))
        history = []
        for round_ in range(1, int(self.config["num-rounds"]) + 1):
            values = session.secagg_values("stats", bound) if secure else {}
            replies = session.broadcast("kmeans_step", pack({"centres": centres}, values), step_spec)
            if secure:
                total = session.secure_sum(replies, "stats", values)
                _, counts, inertia = proto.split_statistics(total, k)
                self._check_counts(session, None, "kmeans_step", counts, sum(rows.values()), inertia)
            else:
                stats = {node: unpack(content)[0]["stats"] for node, content in replies.items()}
                for node, s in stats.items():
                    _, counts, inertia = proto.split_statistics(s, k)
                    self._check_counts(session, node, "kmeans_step", counts, rows[node], inertia)
                total = sum(stats.values())
            sums, counts, inertia = proto.split_statistics(total, k)
            new = proto.update_centres(centres, sums, counts)
            shift = float(np.abs(new - centres).max())
            centres = new
            history.append({"round": round_, "inertia": inertia, "shift": shift})
            session.round_done(round_, int(self.config["num-rounds"]), inertia=inertia)
            if shift <= float(self.config["fedkmeans.tol"]):
                break
        final = session.broadcast(
            "kmeans_assign", pack({"centres": centres}),
            ReplySpec(arrays={"node_ids": ArraySpec((None,), kind="iu", low=0, unique=True),
                              "labels": ArraySpec((None,), kind="iu", low=0, high=k)},
                      same_length=("node_ids", "labels")),
        )
        replies = {node: unpack(content)[0] for node, content in final.items()}
        ids_of = {node: session.positions("kmeans_assign", node, r["node_ids"]) for node, r in replies.items()}
        check_item_ids(session, "kmeans_assign", ids_of,
                       exclusive=True, expected=rows)  # partition.overlap > 0 is refused: each row on one client
        ids = concat_int64(ids_of.values())
        labels = concat_int64(r["labels"] for r in replies.values())
        return StrategyOutput(labels=labels, ids=ids, history=history)

    @staticmethod
    def _check_counts(session, node, step: str, sizes: np.ndarray, rows: int, inertia: float = 0.0,
                      at_most: int | None = None) -> None:
        """Cluster sizes must be whole, >= 0 and add up to the rows announced in hello (``node`` None:
        the secure sum over every client), at most ``at_most`` of them, and the inertia >= 0; else a
        client sent statistics of data it does not hold, which would steer the centres."""
        who = "the secure sum" if node is None else f"client {session.partition_of(node)} (node {node})"
        tol = 1e-6 * max(rows, 1) + (0 if node is not None else 1e-3)  # fixed-point rounding of a secure sum
        problem = None
        if at_most is not None and sizes.size > at_most:
            problem = f"{sizes.size} local centres for k={at_most}"
        elif (sizes < -tol).any() or np.abs(sizes - np.rint(sizes)).max(initial=0) > tol:
            problem = "cluster sizes that are not whole numbers >= 0"
        elif abs(float(sizes.sum()) - rows) > tol:
            problem = f"cluster sizes summing to {float(sizes.sum()):g}, not its {rows} rows"
        elif inertia < -tol:
            problem = f"a negative inertia {inertia:g}"
        if problem:
            # a client clips what exceeds the declared bound (refusing would tell the server it did)
            hint = " (each client clips its values to rows x secagg.bound; is it above every client's?)" if node is None else ""
            raise ProtocolError(f"step '{step}': {who} sent {problem}{hint}")

    def reference(self, data) -> np.ndarray:
        """Centralised k-means (k-means++, 10 restarts) on the pooled, filtered features."""
        from app.clustering import kmeans
        from app.graph_filters import filtered_features

        x = filtered_features(data.x, data.adj, int(self.config["fedkmeans.filter-order"]))
        return kmeans(x, int(self.config["num-clusters"]), seed=int(self.config["seed"]))

    def reference_method(self) -> str:
        order = int(self.config["fedkmeans.filter-order"])
        features = f"features AGC-filtered {order} times" if order else "features (unfiltered: filter-order 0)"
        return f"centralised k-means (k-means++, 10 restarts) on the pooled {features}, {self._k_and_seed()}"

