"""Strategies ``kcagc`` (Protocol 3) and ``kcagc-basic`` (Protocol 2) of kCAGC.

Setting (partitioner ``vertical``): every client holds all n nodes, the shared
graph and its own block of feature columns. The math is in
``fedgraphcore.protocols.kcagc``; this module only moves data. ``kcagc.mode = exact`` (the default:
centralised AGC's labels from secure sums of the clients' Gram products) is
``strategies.kcagc.exact`` with ``fedgraphcore.protocols.kcagc.exact``. Wire protocol of ``kcagc.mode = paper`` and of ``kcagc-basic``: :mod:`fedgraphcore.protocols.kcagc`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from fedgraphcore.config import ConfigError, RunConfig
from fedgraphcore.data.types import GraphData
from fedgraphcore.protocols import kcagc
from fedgraphcore.protocols.kcagc import exact
from fedgraphcore.wire import LABELS, ProtocolError
from fedgraphcore.transport import pack, unpack
from strategies.base import ClusteringStrategy, StrategyOutput, common_node_count
from strategies.kcagc.exact import ExactAGC

if TYPE_CHECKING:
    from fedgraphcore.session import ServerSession

#: ``metrics["filter_order"]`` when each client picks psi by AGC's adaptive rule (never uploaded).
ADAPTIVE_ORDER = "adaptive (per client, not disclosed)"


def _check_nonnegative(total: np.ndarray, step: str, what: str) -> None:
    """Reject a negative unmasked sum: every client's part is a squared norm (>= 0), so
    one below 0 means a client uploaded something else. (A sum above the clients'
    declared bounds is refused by :meth:`fedgraphcore.session.ServerSession.secure_sum`.)"""
    if total.size and total.min() < 0:
        raise ProtocolError(f"step '{step}': a {what} summed over the clients is {total.min():.6g} < 0; "
                            "every client's part is >= 0, so an upload is malformed")


class KCAGC(ClusteringStrategy[kcagc.KCAGCConfig]):
    """kCAGC, attributed graph clustering over vertically split features: every client holds all
    nodes and the graph but only its own block of feature columns.

    ``kcagc.mode = exact`` (default) gives centralised AGC's labels: each client filters its columns,
    ``F_l = G^psi X^l``; the server finds the top-k eigenvectors of ``F F^T = sum_l F_l F_l^T`` by
    block Krylov, each round one secure sum of the clients' ``F_l (F_l^T Y)`` for a block Y it
    chooses (n x 2k; no n x n matrix moves), and runs k-means on them as AGC does. With AGC's
    adaptive filter order (datasets without a paper order, or ``kcagc.filter-order = -1``) it runs
    AGC's search on the pooled columns: per order one eigensolve and one secure sum of the clients'
    parts of the intra-cluster distance, whose labels every client sees. The server learns these
    sums (F F^T on the span of its blocks, hence the embedding), never one client's block. It reads
    ``kcagc.filter`` and ``kcagc.filter-order``; the other keys are the paper mode's.

    ``kcagc.mode = paper`` is the paper's Protocol 3: each client embeds its filtered block,
    clusters it locally and sends the node-ID sets of its local clusters; the server intersects
    them into weighted virtual nodes and runs k-means++ and Lloyd on them, learning only the
    clients' summed squared distances (secure aggregation).
    Centralised reference: AGC (the same filter and embedding, k-means) on all feature columns."""

    name = "kcagc"
    summary = ("kCAGC: centralised AGC's labels by secure sums of Gram products (default), or the paper's "
               "virtual nodes and secure weighted k-means (vertical split)")
    split = "feature columns (vertical): every client holds all nodes and the graph, and its own feature columns"
    ignores = ("num-rounds",)
    partitioners = ("vertical",)
    needs_features = True

    settings = kcagc.KCAGCConfig

    @classmethod
    def masks_uploads(cls, config: RunConfig, clients: int) -> bool:
        """Every summed distance is masked, whenever there is more than one party."""
        return clients > 1

    def embed_values(self, k: int) -> dict:
        """The filter and embedding settings every request carries (a client embeds on its first request)."""
        return {"k": k, "filter": self.cfg.filter, "order": self.cfg.filter_order, "embedding": self.cfg.embedding,
                "dim": self.cfg.embed_dim or k, "mix": self.cfg.mix_exponent, "seed": self.shared.seed}

    def exact(self) -> bool:
        """Whether this run computes centralised AGC's labels (``kcagc.mode = exact``)."""
        return self.cfg.mode == "exact"

    def run(self, session: ServerSession) -> StrategyOutput:
        k = self.shared.num_clusters
        n = common_node_count(session, self.name, "vertical")
        if k > n:
            raise ConfigError(f"num-clusters={k} exceeds the {n} nodes")
        if self.exact():
            return ExactAGC(session, n, k, self.shared.seed, self.cfg.filter, self._filter_order(),
                            self.secagg.bound).run()
        embed = self.embed_values(k)
        if len(session.clients) > 1:  # one client: its own sum, nothing to hide from anyone
            session.setup_secure_aggregation()
        order = kcagc.filter_order(self.shared.dataset, embed["order"], embed["filter"])
        metrics = {"aggregated_values": 0, "virtual_nodes": [], "lloyd_iterations": [],
                   "filter_order": ADAPTIVE_ORDER if order is None else order}
        history: list[dict] = []
        if embed["embedding"] in kcagc.JOINT_EMBEDDINGS:
            self.joint_norms(session, embed, n, metrics)
        kmeans = SecureKMeans(session, self.cfg, embed, self.secagg.bound, metrics, history,
                              np.random.default_rng([self.shared.seed, 10]))
        labels = self.cluster(session, n, k, kmeans)
        session.broadcast(LABELS, pack({"labels": labels}), kcagc.RECEIVED_REPLY)
        metrics["secure_aggregations"] = int(session.stats.secure_aggregations)
        return StrategyOutput(labels=labels, ids=np.arange(n), history=history, metrics=metrics)

    def cluster(self, session: ServerSession, n: int, k: int, kmeans: SecureKMeans) -> np.ndarray:
        """Steps 1-3: the clients' local clusters, intersected into virtual nodes, clustered by the
        secure weighted k-means (with ``kcagc.tree``, level by level up a binary tree)."""
        k_hat = min(self.cfg.local_factor * k, n)
        local = self.local_clusters(session, n, k_hat, kmeans.embed)
        kmeans.metrics["k_hat"] = k_hat
        num = len(session.clients)
        tree = self.cfg.tree and num > 2
        levels = kcagc.tree_groups(num) if tree else [[[p] for p in range(num)], [list(range(num))]]
        current = {tuple(g): local[g[0]] for g in levels[0]}  # group -> node labels
        summed_groups = []  # per level, the groups whose distances the server unmasks
        for depth, level in enumerate(levels[1:], start=1):
            top = depth == len(levels) - 1
            jobs, passthrough = level_jobs(level, current, top)
            summed_groups.append({"level": depth, "groups": [j.parties for j in jobs]})
            results = kmeans.run(jobs, k if top else k_hat, level=depth)
            current = {tuple(j.parties): lab for j, lab in zip(jobs, results)}
            current.update(passthrough)
        if tree:
            self.record_group_sums(session, summed_groups)
        return current[tuple(range(num))]

    def local_clusters(self, session: ServerSession, n: int, k_hat: int, embed: dict) -> list[np.ndarray]:
        """Step 1, ``kcagc_local``: down k_hat and the embedding settings -> up every client's local
        cluster of each node (in reply order), each checked to lie in ``0..k_hat-1``."""
        replies = session.broadcast(kcagc.KCAGC_LOCAL, pack(values={**embed, "k_hat": k_hat}), kcagc.local_reply(n))
        local = []
        for node, content in replies.items():
            client_labels = unpack(content)[0]["labels"].astype(np.int64)
            if client_labels.min() < 0 or client_labels.max() >= k_hat:
                raise ProtocolError(
                    f"client {session.partition_of(node)} (node {node}) sent local cluster labels "
                    f"{client_labels.min()}..{client_labels.max()}, outside 0..{k_hat - 1} (k_hat={k_hat})")
            local.append(client_labels)
        return local

    @staticmethod
    def record_group_sums(session: ServerSession, summed_groups: list[dict]) -> None:
        """Ledger: with ``kcagc.tree`` the server unmasks the distances summed over each tree group."""
        session.ledger.add_mechanism(
            "kcagc:tree-group-sums",
            protects="each client's part of the squared distances at every internal node of the tree "
                     "(masked among the clients of that node's group)",
            params={"revealed": "per internal node, the sum over its group's clients (at least two) of "
                                "the squared distances of its virtual nodes to its centres, to the server",
                    "groups_per_level": summed_groups},
            guarantee="secure aggregation per group: the server sees each group's sums, "
                      "not a single client's part",
        )

    def joint_norms(self, session: ServerSession, embed: dict, n: int, metrics: dict) -> None:
        """``projection-joint-unit`` / ``projection-mixed-unit``: ``kcagc_joint`` stage ``sum`` (up: ``s``,
        the client's n squared row norms, masked) -> the server unmasks their sum over the clients and
        sends it back (stage ``scale``, down ``sq_norms``) so that each client scales its rows with it."""
        secure = len(session.clients) > 1
        values = session.secagg_values("joint", self.secagg.bound, finest=True) if secure else {}
        replies = session.broadcast(kcagc.KCAGC_JOINT, pack(values={**values, **embed, "stage": "sum"}),
                                    kcagc.masked_reply("s", n, secure))
        total = (session.secure_sum(replies, "s", values) if secure
                 else unpack(next(iter(replies.values())))[0]["s"])
        _check_nonnegative(total, kcagc.KCAGC_JOINT, "summed squared row norm")
        metrics["aggregated_values"] += n
        session.ledger.add_mechanism(
            "kcagc:joint-row-norms",
            protects="each client's squared row norms of its projection (masked when there are several clients)",
            params={"revealed": "per node, the sum over all clients of the squared row norms (n values), to the "
                                "server and to every client"},
            guarantee="none: the aggregate is revealed; a client learns the others' summed norms per node",
        )
        session.broadcast(kcagc.KCAGC_JOINT, pack({"sq_norms": total}, {**embed, "stage": "scale"}),
                          kcagc.RECEIVED_REPLY)

    def _filter_order(self) -> int | None:
        return kcagc.filter_order(self.shared.dataset, self.cfg.filter_order, self.cfg.filter)

    def reference(self, data: GraphData) -> np.ndarray:
        """Centralised AGC on the pooled features (same filter and order, top-k singular vectors, k-means)."""
        from fedgraphcore.graph_filters import agc

        labels, _ = agc(data.x, data.adj, self.shared.num_clusters, self.shared.seed, order=self._filter_order(),
                        kind=self.cfg.filter)
        return labels

    def reference_method(self) -> str:
        order = self._filter_order()
        psi = f"order {order}" if order is not None else "AGC's adaptive order"
        return (f"centralised AGC on the pooled features: graph filter '{self.cfg.filter}' of {psi}, top-k left "
                f"singular vectors, k-means; {self._k_and_seed()}")


class KCAGCBasic(KCAGC):
    """Basic kCAGC (Protocol 2): the same filter, embedding and secure k-means++ and Lloyd as
    ``kcagc``, but on every node instead of virtual nodes, so the server learns the summed
    squared distances of all n nodes to every centre in each iteration. It reads the ``kcagc.*``
    keys except ``kcagc.local-factor``, ``kcagc.local-restarts`` and ``kcagc.tree``. Centralised
    reference: AGC on all feature columns."""

    name = "kcagc-basic"
    summary = "basic kCAGC: Lloyd over all nodes, n x k distances per iteration by secure aggregation"
    borrowed = tuple(p for p in KCAGC.params
                     if p.key not in ("kcagc.mode", "kcagc.local-factor", "kcagc.local-restarts", "kcagc.tree"))

    def exact(self) -> bool:
        """Always the paper's Protocol 2."""
        return False

    def cluster(self, session: ServerSession, n: int, k: int, kmeans: SecureKMeans) -> np.ndarray:
        """Step 3 only, every node its own virtual node of weight 1, all clients in one sum."""
        job = Job(list(range(len(session.clients))), np.arange(n, dtype=np.int64), np.ones(n))
        return kmeans.run([job], k, level=1)[0]


class Job:
    """One weighted k-means: its clients, the virtual node of every node, the virtual nodes' weights."""

    def __init__(self, parties: list[int], members: np.ndarray, weights: np.ndarray) -> None:
        self.parties = parties
        self.members = np.asarray(members, dtype=np.int64)
        self.weights = np.asarray(weights, dtype=np.float64)


def level_jobs(level: list[list[int]], current: dict[tuple, np.ndarray], top: bool) -> tuple[list[Job], dict]:
    """The weighted k-means jobs of one tree level: each group of ``level`` intersects the node labels
    of its children (``current``: group -> labels) into virtual nodes; a group with one child below
    the root moves up unchanged (returned apart: group -> its child's labels)."""
    jobs, passthrough = [], {}
    prev_groups = list(current)
    for group in level:
        children = [c for c in prev_groups if set(c) <= set(group)]
        if len(children) == 1 and not top:
            passthrough[tuple(group)] = current[children[0]]
            continue
        members, weights = kcagc.intersect([current[c] for c in children])
        jobs.append(Job(list(group), members, weights))
    return jobs, passthrough


class SecureKMeans:
    """Step 3: weighted k-means++ seeding and Lloyd on the virtual nodes of several jobs side by side
    (``kcagc.restarts`` restarts each), the server learning only each job's summed distances."""

    def __init__(self, session: ServerSession, cfg: kcagc.KCAGCConfig, embed: dict, secagg_bound: float,
                 metrics: dict, history: list[dict], rng: np.random.Generator) -> None:
        self.session, self.embed, self.metrics, self.history, self.rng = session, embed, metrics, history, rng
        self.restarts, self.iterations, self.prune = cfg.restarts, cfg.iterations, cfg.prune
        self.secure = len(session.clients) > 1
        self.bound = kcagc.distance_bound(embed["embedding"], secagg_bound)

    def run(self, jobs: list[Job], kk: int, level: int) -> list[np.ndarray]:
        """Every job clustered into ``kk`` clusters (one tree level: k_hat below the root, k at the
        root); returns the cluster of every node, per job (its restart of least weighted inertia)."""
        for job in jobs:
            if len(job.weights) < kk:
                raise ConfigError(f"only {len(job.weights)} virtual nodes for {kk} clusters; "
                                  "increase kcagc.local-factor or use fewer clusters")
            self.metrics["virtual_nodes"].append(int(len(job.weights)))
        self.jobs, self.kk, self.level = jobs, kk, level
        self.first = True  # the first round also carries each job's node -> virtual node map
        dist, seeds = self._seeding()
        assign, inertia = self._lloyd(dist, seeds)
        return [assign[j][int(np.argmin(inertia[j]))][job.members].astype(np.int64) for j, job in enumerate(jobs)]

    def _seeding(self) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """k-means++ seeding: the first seed by weight, then one ``kcagc_step`` (stage ``seed``) per further
        seed: down ``index`` (R, the newest seed of each restart) -> up ``d``, the client's part of every
        virtual node's squared distance to it (R x m, masked). Returns the summed distances to each
        seed (R x kk x m per job; the seeds are the first Lloyd centres) and the seeds (R x kk)."""
        R, kk = self.restarts, self.kk
        dist = [np.zeros((R, kk, len(job.weights))) for job in self.jobs]  # summed, centre-major
        seeds = [np.zeros((R, kk), dtype=np.int64) for _ in self.jobs]
        for j, job in enumerate(self.jobs):
            seeds[j][:, 0] = kcagc.first_seeds(job.weights, R, self.rng)
        for c in range(1, kk):
            parts = self._round("seed", lambda j, c=c: {"index": seeds[j][:, c - 1]},
                                [R * len(job.weights) for job in self.jobs])
            for j, job in enumerate(self.jobs):
                dist[j][:, c - 1] = parts[j].reshape(R, len(job.weights))
                seeds[j][:, c] = kcagc.seeding_step(dist[j][:, :c].min(axis=1), job.weights, self.rng)
        for j in range(len(self.jobs)):
            self.history.append({"level": self.level, "job": j, "stage": "seeds", "seeds": seeds[j].tolist()})
        return dist, seeds

    def _lloyd(self, dist: list[np.ndarray], seeds: list[np.ndarray]) -> tuple[list, list]:
        """Lloyd, one ``kcagc_step`` (stage ``lloyd``) per iteration: down ``moved`` (the centres whose
        distances the server lacks) with ``seeds`` (first iteration) or ``assign`` (the clusters of the
        restarts those centres belong to) -> up ``d``, the client's part of every virtual node's squared
        distance to each moved centre (masked). A centre whose members did not change keeps its
        distances, so the server keeps their sums; a restart without a moved centre drops out. The
        first iteration measures only the last seed of each restart (the seeding summed the others).
        At most ``kcagc.iterations`` updates. Returns every job's assignments and inertias per restart."""
        R, kk, jobs = self.restarts, self.kk, self.jobs
        update = [None] * len(jobs)  # the memberships the clients' centres are the means of
        moved = [np.arange(R) * kk + kk - 1 for _ in jobs]
        assign, inertia = [None] * len(jobs), [None] * len(jobs)
        it = 0
        while True:
            def lloyd_arrays(j, it=it):
                # an assignment (-1..kk-1) goes in the smallest integer type holding -kk: int8 up to 128 clusters
                centres = ({"seeds": seeds[j]} if it == 0 else
                           {"assign": update[j][kcagc.moved_restarts(moved[j], kk)].astype(np.min_scalar_type(-kk))})
                return {**centres, "moved": moved[j]}

            sizes = [len(moved[j]) * len(job.weights) for j, job in enumerate(jobs)]
            parts = self._round("lloyd", lloyd_arrays, sizes)
            for j, job in enumerate(jobs):
                if sizes[j]:
                    assign[j], inertia[j], moved[j], update[j] = self._lloyd_step(dist[j], parts[j], job,
                                                                                  moved[j], update[j], it)
            self.history.append({"level": self.level, "stage": "lloyd", "iteration": it,
                                 "inertia": [float(i.min()) for i in inertia],
                                 "moved": [int(len(mv)) for mv in moved]})
            self.session.round_done(it + 1, self.iterations + 1, capped=True, inertia=sum(self.history[-1]["inertia"]))
            if not any(len(mv) for mv in moved) or it >= self.iterations:
                break
            it += 1
        self.metrics["lloyd_iterations"].append(it)
        return assign, inertia

    def _lloyd_step(self, dist: np.ndarray, part: np.ndarray, job: Job, moved: np.ndarray, update, it: int):
        """One job's server step: the moved centres' summed distances into ``dist`` (R x kk x m), the
        nearest centre and weighted inertia per restart, the membership the clients' centres become
        the means of (Protocol 2 line 17 with ``kcagc.prune``: the first one from the seeds' confident
        points only) and the centres it moves."""
        R, kk = self.restarts, self.kk
        dist.reshape(R * kk, -1)[moved] = part.reshape(len(moved), -1)
        by_node = dist.transpose(0, 2, 1)  # R x m x kk
        assign, inertia = kcagc.assign(by_node, job.weights)
        new = kcagc.prune(by_node) if self.prune and it == 0 else assign
        moved = np.arange(R * kk) if it == 0 else kcagc.moved_centres(update, new, kk)
        return assign, inertia, moved, new

    def _round(self, stage: str, arrays_of, sizes: list[int]) -> list[np.ndarray]:
        """One ``kcagc_step`` message round; returns each job's summed part (empty for a converged job).

        One secure sum per job, among the job's clients only: a client uploads just its job's part,
        masked with the other members of its group. The server learns each group's sum, as it would
        from one sum over all clients with zeros outside each group, but a client sends 1/len(jobs)
        of the bytes and masks with len(group) - 1 peers instead of L - 1. Finest scale: with a high
        filter order (AGC's adaptive rule picks psi near 60 on the SBM) the rows are nearly parallel
        and squared distances fall to 1e-7 - 1e-6, below the default resolution 2^-20, where
        rounding alone would decide the assignments."""
        values = [self.session.secagg_values(f"d{j}", self.bound, finest=True) if self.secure else {}
                  for j in range(len(self.jobs))]
        if self.secure:
            self.metrics["secagg_scale"] = values[0]["secagg_scale"]
        contents, expect = self._requests(stage, arrays_of, sizes, values)
        replies = self.session.exchange(kcagc.KCAGC_STEP, contents, expect)
        self.first = False
        return [self._job_sum(j, replies, sizes[j], values[j], stage) for j in range(len(self.jobs))]

    def _requests(self, stage: str, arrays_of, sizes: list[int], values: list[dict]) -> tuple[dict, dict]:
        """Every client's request (its job's ``arrays_of(j)``, ``group``, on the first round ``members``)
        and the reply it must send: ``d`` of its job's size (0 for a client in no job this level)."""
        job_of = {p: j for j, job in enumerate(self.jobs) for p in job.parties}
        contents, expect = {}, {}
        for node in self.session.node_ids:
            j = job_of.get(self.session.partition_of(node), -1)
            size = int(sizes[j]) if j >= 0 else 0
            arrays = {}
            if j >= 0:
                arrays = {**arrays_of(j), "group": np.asarray(self.jobs[j].parties, dtype=np.int64)}
                if self.first:
                    arrays["members"] = self.jobs[j].members
            v = {**(values[j] if j >= 0 else {}), **self.embed, "stage": stage, "level": self.level,
                 "restarts": self.restarts, "size": size}
            contents[node] = pack(arrays, v)
            expect[node] = kcagc.masked_reply("d", size, self.secure)
        return contents, expect

    def _job_sum(self, j: int, replies: dict, size: int, values: dict, stage: str) -> np.ndarray:
        """Job ``j``'s summed part: the secure sum over its clients (one client: its reply itself)."""
        if not size:  # this job has converged (tree variant: others still run)
            return np.zeros(0)
        job = self.jobs[j]
        mine = {n: c for n, c in replies.items() if self.session.partition_of(n) in job.parties}
        if self.secure:
            total = self.session.secure_sum(mine, "d", values, parties=job.parties)
        else:
            total = unpack(next(iter(mine.values())))[0]["d"]
        _check_nonnegative(total, f"kcagc_step ({stage}, level {self.level})", "summed squared distance")
        self.metrics["aggregated_values"] += size
        return total
