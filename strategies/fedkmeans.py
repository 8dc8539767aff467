"""Strategy ``fedkmeans``: federated Lloyd k-means on horizontally split rows.

A plain baseline every other method can be compared with. Wire protocol: :mod:`fedgraphcore.protocols.fedkmeans`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from fedgraphcore.clustering import kmeans
from fedgraphcore.config import ConfigError, RunConfig
from fedgraphcore.data.types import GraphData
from fedgraphcore.journal import last_step_replayed
from fedgraphcore.privacy.ledger import GUARANTEE_SECAGG
from fedgraphcore.progress import Convergence
from fedgraphcore.protocols import fedkmeans
from fedgraphcore.protocols.boundary import PADDED_ROWS
from fedgraphcore.transport import pack, unpack
from fedgraphcore.wire import HELLO, ProtocolError, ReplySpec, ValueSpec
from strategies.base import ClusteringStrategy, StrategyOutput, announced_rows, check_item_ids, concat_int64
from strategies.links import ServerLinks, link_boundaries, padded_spec, padded_sum, relayed, uses_boundary

if TYPE_CHECKING:
    from fedgraphcore.session import HelloAsk, ServerSession


class FedKMeans(ClusteringStrategy[fedkmeans.FedKMeansConfig]):
    """Federated Lloyd k-means, the baseline the other methods can be compared with. Each client
    holds some rows (the nodes of a graph, optionally smoothed first by an AGC low-pass filter over
    its own subgraph, or samples). The server merges the clients' local k-means++ centres into k
    starting centres of each of ``fedkmeans.restarts`` starts; then every round each client sends, per
    start, its per-cluster sums, counts and inertia (optionally under secure aggregation, so the server
    sees only their sum over the clients) and the server moves the centres; the start of least inertia
    wins. Finally the clients send their rows' labels for evaluation.
    On a node split with boundary edges the filter runs over the whole graph (padded secure sums
    over each node's neighbours, one round per order), and the local centres come after it.
    Centralised reference: k-means on the pooled (filtered) features, with as many restarts."""

    name = "fedkmeans"
    summary = "federated Lloyd k-means on rows split over clients (baseline)"
    split = "rows: each client holds some nodes (with their induced subgraph) or samples"
    partitioners = ("node-random", "node-community", "node-dirichlet", "sample", "sample-dirichlet")
    needs_features = True
    tolerates_dropouts = True  # Lloyd's sums over the clients that answered: their rows' centres

    settings = fedkmeans.FedKMeansConfig
    #: the filter order of the run's rows, set by :meth:`run`: ``filter-order``, or 0 where the filter may
    #: run over the whole graph and no party holds an edge (the reference filters as the run did)
    order: int | None = None

    @classmethod
    def hello_values(cls, config: RunConfig) -> dict:
        """Step 1 rides on hello: k and the seed of every client's local k-means++."""
        return {"k": config["num-clusters"], "seed": config["seed"]}

    @classmethod
    def hello_reply(cls, config: RunConfig) -> ReplySpec:
        return fedkmeans.INIT_REPLY

    @classmethod
    def may_filter_whole_graph(cls, config: RunConfig, clients: int) -> bool:
        """Whether the filter may run over the whole graph across the clients (it does where a party
        holds an edge, as hello tells): a node split with boundary edges, ``filter-order`` > 0 and more
        than one client (one holds the whole graph)."""
        return clients > 1 and fedkmeans.FedKMeansConfig.of(config).filter_order > 0 and uses_boundary(config)

    @classmethod
    def hello_ask(cls, config: RunConfig, clients: int) -> HelloAsk:
        """Hello carries the local centres, or, where the filter may run over the whole graph first, the
        public keys and whether each party holds an edge (the centres follow, with ``kmeans_init``)."""
        ask = super().hello_ask(config, clients)
        if not cls.may_filter_whole_graph(config, clients):
            return ask
        return replace(ask, values={fedkmeans.FILTER_HOPS: fedkmeans.FedKMeansConfig.of(config).filter_order},
                       reply=ReplySpec(numbers={fedkmeans.HAS_EDGES: ValueSpec(whole=True, low=0, high=1)}))

    @classmethod
    def masks_uploads(cls, config: RunConfig, clients: int) -> bool:
        return super().masks_uploads(config, clients) or cls.may_filter_whole_graph(config, clients)

    @classmethod
    def check(cls, config: RunConfig) -> None:
        super().check(config)
        if config["partition.overlap"] > 0:
            raise ConfigError(f"invalid value {config['partition.overlap']} for 'partition.overlap' with strategy "
                              "'fedkmeans': Lloyd's sums would count a row held by two clients twice; valid: 0")

    def run(self, session: ServerSession) -> StrategyOutput:
        rows = announced_rows(session)
        may = self.may_filter_whole_graph(session.config, len(session.clients))
        edges = may and any(int(c.summary[fedkmeans.HAS_EDGES]) for c in session.clients)
        self.order = self.cfg.filter_order if edges or not may else 0
        if edges:
            session.setup_secure_aggregation()
            seeds = self._filter_whole_graph(session, link_boundaries(session))
        elif may:  # no party holds an edge: the filter is the identity, the features go unfiltered
            seeds = self._seeds(session, {c.node_id: {} for c in session.clients}, {}, 0)
        else:
            seeds = {c.node_id: c.arrays for c in session.clients}
        centres = self._initial_centres(session, rows, seeds, fedkmeans.KMEANS_INIT if may else HELLO)
        if self.cfg.secure:
            session.setup_secure_aggregation()
        last, history = self._lloyd_rounds(session, rows, centres)
        ids, labels = self._final_labels(session, rows, last)
        return StrategyOutput(labels=labels, ids=ids, history=history)

    def _filter_whole_graph(self, session: ServerSession, links: ServerLinks) -> dict[int, dict]:
        """The filter hops over the whole graph, each a padded sum whose rows ride down with the next
        request, then ``kmeans_init``: every client's local centres and sizes of its filtered rows."""
        order = self.cfg.filter_order
        bound = fedkmeans.hop_bound(links.total, self.secagg.bound)
        spec = padded_spec(fedkmeans.NEIGHBOURS, links, None)
        back: dict[int, dict] = {c.node_id: {} for c in session.clients}
        last: dict = {}
        for hop in range(1, order + 1):
            values = session.secagg_values(f"{fedkmeans.NEIGHBOURS}-{hop}", bound, finest=True)
            contents = {node: pack(arrays, {**relayed(last), **values, "hop": hop}) for node, arrays in back.items()}
            replies = session.exchange(fedkmeans.KMEANS_FILTER, contents, spec)
            self._check_widths(session, replies)
            back = {node: {PADDED_ROWS: rows} for node, rows in
                    padded_sum(session, replies, fedkmeans.NEIGHBOURS, values, links).items()}
            last = values
            session.round_done(hop, order + 1)
        seeds = self._seeds(session, back, relayed(last), order)
        session.round_done(order + 1, order + 1)
        self._record_filter(session, links, order, bound)
        return seeds

    def _seeds(self, session: ServerSession, arrays: dict[int, dict], values: dict, hops: int) -> dict[int, dict]:
        """``kmeans_init`` (down: each client's ``arrays`` and ``values``, ``hops``, k and seed): every client's
        local centres and sizes of its rows filtered ``hops`` times over the whole graph."""
        init = {**values, "hops": hops, "k": self.shared.num_clusters, "seed": self.shared.seed}
        replies = session.exchange(fedkmeans.KMEANS_INIT, {node: pack(a, init) for node, a in arrays.items()},
                                   fedkmeans.INIT_REPLY)
        return {node: unpack(content)[0] for node, content in replies.items()}

    @staticmethod
    def _check_widths(session: ServerSession, replies: dict) -> None:
        """Every client's hop upload has the same width (its feature dimension), or the ring sum has no meaning."""
        widths = {session.partition_of(node): unpack(c)[0][fedkmeans.NEIGHBOURS].shape[1] for node, c in replies.items()}
        if len(set(widths.values())) != 1:
            raise ProtocolError(f"step '{fedkmeans.KMEANS_FILTER}': clients disagree on the feature dimension "
                                f"(client: width): {widths}")

    @staticmethod
    def _record_filter(session: ServerSession, links: ServerLinks, order: int, bound: float) -> None:
        session.ledger.add_mechanism(
            "fedkmeans:whole-graph-filter",
            protects="each client's feature rows while the AGC filter runs over the whole graph",
            params={"hops": order, "positions": links.total, "hop_bound": bound,
                    "revealed": "to the server: nothing from the padded sums (uniform ring elements); to each "
                                "client, per hop, its nodes' sums over all their neighbours of D~^-1/2 F (F: the "
                                "rows filtered so far), hence its nodes' rows of the centralised filtered features "
                                "(a node with one neighbour elsewhere: that neighbour's scaled row); the Lloyd "
                                "statistics of these rows mix the neighbours' features (unmasked unless "
                                "fedkmeans.secure)",
                    "scale": "the finest power of two the 64-bit ring holds at the hop bound"},
            guarantee=GUARANTEE_SECAGG + "; each padded sum is hidden from the server by every owner's one-time pad")

    def _initial_centres(self, session: ServerSession, rows: dict[int, int], local: dict[int, dict],
                         step: str) -> np.ndarray:
        """Step 1: every client's local k-means++ centres and sizes (with ``step``, hello or
        ``kmeans_init``), merged into the k centres of every start (restarts x k x f)."""
        k, seed = self.shared.num_clusters, self.shared.seed
        for node, a in local.items():
            self._check_counts(session, node, step, a["counts"], rows[node], at_most=k)
            with np.errstate(over="ignore"):
                overflow = not np.isfinite(np.square(a["centres"]).sum(1)).all()
            if a["centres"].shape[1] < 1 or overflow:  # every client squares distances to these centres
                raise ProtocolError(f"step '{step}': client {session.partition_of(node)} (node {node}) "
                                    f"sent centres of width {a['centres'].shape[1]} "
                                    + ("whose squared norms overflow" if overflow else "(no features)"))
        widths = {session.partition_of(node): a["centres"].shape[1] for node, a in local.items()}
        if len(set(widths.values())) != 1:
            raise ProtocolError(f"clients disagree on the feature dimension (client: width): {widths}")
        return fedkmeans.starting_centres(np.vstack([a["centres"] for a in local.values()]),
                                      np.concatenate([a["counts"] for a in local.values()]), k, seed, self.cfg.restarts)

    def _lloyd_rounds(self, session: ServerSession, rows: dict[int, int],
                      centres: np.ndarray) -> tuple[dict, list[dict]]:
        """Step 2: Lloyd rounds of every start (``centres``: restarts x k x f) on the (secure) sums of the
        clients' statistics, each round advancing the starts whose centres still move more than
        ``fedkmeans.tol``, until none does or ``num-rounds``. Returns the best start, its last centres
        and summed statistics, from which each client derives the final centres (with the blocks of
        steps a resumed run replayed, which reached no client), and the history."""
        k = self.shared.num_clusters
        running, shifts, history, replayed = np.arange(len(centres)), Convergence(self.cfg.tol), [], []
        last_centres, last_stats = centres.copy(), np.zeros((len(centres), centres[0].size + k + 2))
        for round_ in range(1, self.shared.num_rounds + 1):
            totals = self._lloyd_step(session, rows, running, centres[running], replayed)
            # a step replayed from a resumed run's journal reached no client: the next live one tells them
            replayed = [*replayed, (running, centres[running])] if last_step_replayed(session) else []
            last_centres[running], last_stats[running] = centres[running], totals
            new = np.stack([fedkmeans.update_centres(centres[start], *fedkmeans.split_statistics(total, k)[:2])
                            for start, total in zip(running, totals)])
            moved = np.abs(new - centres[running]).max(axis=(1, 2))
            centres[running] = new
            history.append(self._round_done(session, round_, last_stats, moved, shifts))
            running = running[moved > self.cfg.tol]
            if not len(running):
                break
        best = history[-1]["best"]
        step = {"centres": last_centres[best], "stats": last_stats[best], "start": best}
        return {**step, **(self._replayed_arrays(replayed) if replayed else {})}, history

    def _round_done(self, session: ServerSession, round_: int, last_stats: np.ndarray, moved: np.ndarray,
                    shifts: Convergence) -> dict:
        """A Lloyd round's history entry (the best start so far, its inertia and withheld rows, how many
        starts the round advanced and the largest shift among them), reported as the round's progress."""
        best = fedkmeans.best_start(last_stats, self.shared.num_clusters)
        _, _, withheld, inertia = fedkmeans.split_statistics(last_stats[best], self.shared.num_clusters)
        shifts.measures.append(float(moved.max()))
        session.round_done(round_, self.shared.num_rounds, converging=shifts, inertia=inertia,
                           withheld=round(withheld))
        return {"round": round_, "inertia": inertia, "shift": float(moved.max()), "withheld": round(withheld),
                "starts": int(len(moved)), "best": best}

    def _lloyd_step(self, session: ServerSession, rows: dict[int, int], starts: np.ndarray, centres: np.ndarray,
                    replayed: list) -> np.ndarray:
        """One ``kmeans_step``: down ``starts`` and their ``centres`` (starts x k x f; a resumed run's first
        live step also the blocks of the steps it replayed) -> up each client's ``stats`` (starts x size);
        returns their sum per start (starts x size), checked."""
        size = centres[0].size + self.shared.num_clusters + 2
        secure = self.cfg.secure
        bound = fedkmeans.statistics_bound(max(rows.values()), self.secagg.bound)
        values = session.secagg_values("stats", bound, recover=self.tolerates_dropouts) if secure else {}
        request = {"starts": starts, "centres": centres, **(self._replayed_arrays(replayed) if replayed else {})}
        replies = session.broadcast(fedkmeans.KMEANS_STEP, pack(request, values),
                                    session.secure_reply(fedkmeans.step_reply(len(starts), size, secure), values),
                                    require_all=not session.recovers(values))
        return self._statistics_total(session, rows, replies, values)

    @staticmethod
    def _replayed_arrays(replayed: list[tuple[np.ndarray, np.ndarray]]) -> dict[str, np.ndarray]:
        """The blocks of the replayed steps, in step order, and the start of each."""
        return {fedkmeans.REPLAYED_CENTRES: np.concatenate([centres for _, centres in replayed]),
                fedkmeans.REPLAYED_STARTS: np.concatenate([starts for starts, _ in replayed])}

    def _statistics_total(self, session: ServerSession, rows: dict[int, int], replies: dict,
                          values: dict) -> np.ndarray:
        """The sum of the clients' statistics, per start (each client's vector, or, secure, the sum,
        checked first)."""
        k = self.shared.num_clusters
        if self.cfg.secure:
            total = session.secure_sum(replies, "stats", values)
            for start_total in total:
                _, counts, withheld, inertia = fedkmeans.split_statistics(start_total, k)
                self._check_counts(session, None, fedkmeans.KMEANS_STEP, counts, sum(rows[n] for n in replies), inertia,
                                   withheld)
            return total
        stats = {node: unpack(content)[0]["stats"] for node, content in replies.items()}
        for node, s in stats.items():
            for start_stats in s:
                _, counts, withheld, inertia = fedkmeans.split_statistics(start_stats, k)
                self._check_counts(session, node, fedkmeans.KMEANS_STEP, counts, rows[node], inertia, withheld)
        return sum(stats.values())

    def _final_labels(self, session: ServerSession, rows: dict[int, int],
                      last: dict) -> tuple[np.ndarray, np.ndarray]:
        """Step 3: every client's row ids and labels under the final centres of the best start, which
        each client derives from that start's last centres and summed statistics (``last``)."""
        arrays = {name: value for name, value in last.items() if name != "start"}
        final = session.broadcast(fedkmeans.KMEANS_ASSIGN, pack(arrays, {"start": int(last["start"])}),
                                  fedkmeans.assign_reply(self.shared.num_clusters))
        replies = {node: unpack(content)[0] for node, content in final.items()}
        ids_of = {node: session.positions(fedkmeans.KMEANS_ASSIGN, node, r["node_ids"]) for node, r in replies.items()}
        check_item_ids(session, fedkmeans.KMEANS_ASSIGN, ids_of,
                       exclusive=True, expected=rows)  # partition.overlap > 0 is refused: each row on one client
        return concat_int64(ids_of.values()), concat_int64(r["labels"] for r in replies.values())

    @staticmethod
    def _check_counts(session: ServerSession, node: int | None, step: str, sizes: np.ndarray, rows: int,
                      inertia: float = 0.0, withheld: float = 0.0, at_most: int | None = None) -> None:
        """Cluster sizes must be whole, >= 0 and add up, with the ``withheld`` rows, to the rows
        announced in hello (``node`` None: the secure sum over every client), at most ``at_most`` of
        them, and the inertia >= 0; else a client sent statistics of data it does not hold, which
        would steer the centres."""
        who = "the secure sum" if node is None else f"client {session.partition_of(node)} (node {node})"
        tol = 1e-6 * max(rows, 1) + (0 if node is not None else 1e-3)  # fixed-point rounding of a secure sum
        problem = None
        if at_most is not None and sizes.size > at_most:
            problem = f"{sizes.size} local centres for k={at_most}"
        elif (sizes < -tol).any() or np.abs(sizes - np.rint(sizes)).max(initial=0) > tol \
                or withheld < -tol or abs(withheld - round(withheld)) > tol:
            problem = "cluster sizes that are not whole numbers >= 0"
        elif abs(float(sizes.sum()) + withheld - rows) > tol:
            parts = "cluster sizes and withheld rows" if withheld else "cluster sizes"
            problem = f"{parts} summing to {float(sizes.sum()) + withheld:g}, not its {rows} rows"
        elif inertia < -tol:
            problem = f"a negative inertia {inertia:g}"
        if problem:
            # a client clips what exceeds the declared bound (refusing would tell the server it did)
            hint = " (each client clips its values to rows x secagg.bound; is it above every client's?)" if node is None else ""
            raise ProtocolError(f"step '{step}': {who} sent {problem}{hint}")

    def reference(self, data: GraphData) -> np.ndarray:
        """Centralised k-means (k-means++, ``fedkmeans.restarts`` restarts) on the pooled features, projected
        and filtered as the clients do (:func:`fedgraphcore.protocols.fedkmeans.local_features`)."""
        x = fedkmeans.local_features(data.x, data.adj, self.cfg, self.shared.seed, self._order())
        return kmeans(x, self.shared.num_clusters, seed=self.shared.seed, n_init=self.cfg.restarts)

    def _order(self) -> int:
        return self.cfg.filter_order if self.order is None else self.order

    def reference_method(self) -> str:
        order, dims = self._order(), self.cfg.dims
        unfiltered = "filter-order 0" if not self.cfg.filter_order else "no party holds an edge"
        features = f"features AGC-filtered {order} times" if order else f"features (unfiltered: {unfiltered})"
        if order and dims:
            features += f" (first projected onto {dims} seeded Gaussian directions where wider)"
        return (f"centralised k-means (k-means++, {self.cfg.restarts} restarts) on the pooled {features}, "
                f"{self._k_and_seed()}")

