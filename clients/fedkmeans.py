"""Client side of ``fedkmeans`` (wire protocol: :mod:`fedgraphcore.protocols.fedkmeans`).

On a node split with boundary edges and several clients the filter runs over the whole graph
(:class:`clients.boundary.BoundaryClient`'s padded sums); the filtered rows then live in
``context.state`` (they cannot be computed again from this party's data alone)."""

from __future__ import annotations

from collections import OrderedDict
from logging import WARNING

import numpy as np
from flwr.common.logger import log

from fedgraphcore.data.shards import remember
from fedgraphcore.protocols import fedkmeans
from fedgraphcore.protocols.boundary import PADDED_ROWS
from fedgraphcore.privacy.policy import PrivacyRefusal
from fedgraphcore.wire import ProtocolError
from clients.base import ClusteringClient, Reply, answers, request_digest
from clients.boundary import BoundaryClient

#: (shard, filtered rows) per (shard, filter order), computed once per process and not kept in
#: ``context.state``: a deployed SuperNode sends the state to, and takes it back from, the ClientApp
#: process of every message, and filtering a shard's rows again costs less than moving them twice
_FEATURES: OrderedDict = OrderedDict()
_KEPT_FEATURES = 64  # an in-process run keeps every client in one process
#: ``context.state`` record of this node's :class:`fedgraphcore.protocols.fedkmeans.Audit` (what it has sent of its rows)
AUDIT = "fedkmeans-audit"
#: ``context.state`` record of the rows filtered over the whole graph so far (``rows`` after ``hops`` hops)
FILTERED = "fedkmeans-filtered"
#: ``context.state`` record that the filter did not run: no party holds an edge (``kmeans_init`` with hops 0)
UNFILTERED = "fedkmeans-unfiltered"
#: ``context.state`` record, per start, of the last Lloyd step that advanced it: its centres' digest, the counts sent
LAST_STEP = "fedkmeans-last-step"


class FedKMeansClient(BoundaryClient, ClusteringClient[fedkmeans.FedKMeansConfig]):
    settings = fedkmeans.FedKMeansConfig
    label_steps = (fedkmeans.KMEANS_ASSIGN,)

    def step_limits(self) -> dict[str, int]:
        """Lloyd steps at most ``num-rounds``, the filter's hops ``filter-order``, the seeds after it
        and the final labels once."""
        return {**super().step_limits(), fedkmeans.KMEANS_STEP: self.shared.num_rounds, fedkmeans.KMEANS_ASSIGN: 1,
                fedkmeans.KMEANS_INIT: 1, fedkmeans.KMEANS_FILTER: self.cfg.filter_order}

    def _k(self, asked: int | None = None) -> int:
        """The run's number of clusters: its num-clusters, or where that is 0 (the number of classes,
        which the server resolves) the ``k`` of the run's first seeds request, kept for the run
        (``asked``: a seeds request's k, refused when it is another)."""
        k = self.shared.num_clusters
        if not k and "fedkmeans-k" in self.context.state.array_records:
            k = int(self.load("fedkmeans-k")["k"][0])
        if asked is not None and k and asked != k:
            raise PrivacyRefusal("server-input", f"a request for k={asked} local centres; valid: num-clusters={k}")
        if asked is not None and not k:
            self.save("fedkmeans-k", k=np.array([asked]))
            k = asked
        if not k:
            raise PrivacyRefusal("protocol-order", "centres before the seeds that fix the run's number of clusters")
        return k

    def _centres(self, centres: np.ndarray, step: str, starts: int | None = None) -> np.ndarray:
        """The server's ``centres`` when they are centres of this run (with ``starts``, that many blocks:
        :func:`fedgraphcore.protocols.fedkmeans.centres_problem`), else refused (rule ``server-input``)."""
        problem = fedkmeans.centres_problem(centres, self._k(), self.features().shape[1], starts)
        if problem:
            raise PrivacyRefusal("server-input", f"'{step}' sent {problem}")
        return centres

    def _starts(self, starts: np.ndarray | None) -> np.ndarray:
        """The starts a Lloyd step advances when they are starts of this run (at most its
        ``fedkmeans.restarts``), else refused (rule ``server-input``)."""
        problem = "no starts" if starts is None else fedkmeans.starts_problem(starts, self.cfg.restarts)
        if problem:
            raise PrivacyRefusal("server-input", f"'{fedkmeans.KMEANS_STEP}' sent {problem}")
        return np.asarray(starts, dtype=np.int64)

    def _order(self) -> int:
        """The filter order of this client's rows: ``filter-order``, or 0 where the filter over the whole
        graph did not run (no party holds an edge: ``kmeans_init`` with hops 0)."""
        return 0 if UNFILTERED in self.context.state.array_records else self.cfg.filter_order

    def features(self) -> np.ndarray:
        """This client's (filtered) feature rows: filtered over the whole graph (kept in state), or
        over its own subgraph (computed once per process)."""
        order = self._order()
        if order and FILTERED in self.context.state.array_records:
            kept = self.load(FILTERED)
            if int(kept["hops"][0]) != order:
                raise ProtocolError(f"the filter over the whole graph has run {int(kept['hops'][0])} of its {order} hops")
            return kept["rows"]
        # the entry holds the shard, so its id cannot be reused while cached
        key = (id(self.shard), order, self.cfg.dims, self.shared.seed)
        return remember(_FEATURES, key,
                        lambda: (self.shard, fedkmeans.local_features(self.shard.x, self.shard.adj, self.cfg,
                                                                  self.shared.seed, order)),
                        _KEPT_FEATURES)[1]

    def _holds_edges(self) -> bool:
        """Whether this party holds an edge: one of its own, or one to a node another party holds."""
        boundary = self.shard.boundary
        return bool(self.shard.num_edges) or (boundary is not None and len(boundary) > 0)

    def hello_figures(self, values) -> dict:
        """Where the filter may run over the whole graph (``filter_hops``): whether this party holds an
        edge, so that the server runs the filter only where the graph has one."""
        return {fedkmeans.HAS_EDGES: int(self._holds_edges())} if fedkmeans.FILTER_HOPS in values else {}

    def hello_arrays(self, values) -> dict[str, np.ndarray]:
        """With hello: this client's local k-means++ centres and their sizes (:meth:`seeds`), unless the
        filter runs over the whole graph first (``filter_hops``): then nothing, the seeds follow it."""
        hops = int(values.get(fedkmeans.FILTER_HOPS, 0))
        if not hops:
            return self.seeds(values)
        if hops != self.cfg.filter_order or self.shard.num_clients < 2:
            raise ProtocolError(f"{fedkmeans.FILTER_HOPS}={hops} for filter-order {self.cfg.filter_order} and "
                                f"{self.shard.num_clients} client(s)")
        self._check_rows()
        self.save(FILTERED, hops=np.array([0]))
        return {}

    def _check_rows(self) -> None:
        min_rows = int(self.policy["min-rows"])
        if self.shard.num_nodes < min_rows:
            raise PrivacyRefusal("min-rows", f"this node holds fewer rows than its min-rows={min_rows}: "
                                             "any centre of them would be a statistic of fewer")

    def seeds(self, values) -> dict[str, np.ndarray]:
        """This client's local k-means centres (best of ``fedkmeans.restarts`` k-means++ runs; ``values``: ``k``, the run's num-clusters, and ``seed``)
        and their sizes, each centre the mean of at least this node's ``min-rows`` rows. Their sums join
        the audit of every sum sent of these rows in earlier runs (:func:`fedgraphcore.protocols.fedkmeans.released_seeds`:
        local clusters that would determine a row with those go out as the ones sent before)."""
        self._check_rows()
        x, min_rows, k = self.features(), int(self.policy["min-rows"]), self._k(int(values["k"]))
        centres, counts, labels = fedkmeans.local_seeds(x, k, int(values["seed"]), min_rows, self.cfg.restarts)
        if min_rows > 1:
            with self.release_record.locked():
                earlier = self._earlier_audit(len(x))
                chosen = fedkmeans.released_seeds(labels, k, min_rows, earlier["basis"], earlier.get("seed_labels"))
                if chosen is None:
                    raise PrivacyRefusal("min-rows", "every choice of local clusters would determine a row with the "
                                                     "sums this node sent of its rows in earlier runs")
                labels, basis = chosen
                self._keep(fedkmeans.Audit(basis), seed_labels=labels)
            centres, counts = fedkmeans.seed_centres(x, labels)
        return {"centres": centres, "counts": counts}

    def _audit_name(self) -> str:
        return f"fedkmeans-audit-filter{self._order()}"

    def _earlier_audit(self, rows: int) -> dict[str, np.ndarray]:
        """The audit basis (and the local clusters last sent) of every run before on these rows, from
        this node's release record (an empty basis without one)."""
        kept = self.release_record.load_arrays(self._audit_name()) or {}
        if "basis" not in kept or kept["basis"].shape[0] != rows:
            kept["basis"] = fedkmeans.Audit.empty(rows).basis
        return kept

    def _audit(self) -> fedkmeans.StartAudits:
        """This run's audit over every start; its basis the one the release record keeps when the node
        has one (the row sets sent in every run, this one included)."""
        audit = self.load(AUDIT)
        if self.release_record.directory is not None:
            audit["basis"] = self._earlier_audit(len(audit["basis"]))["basis"]
        if "labels" not in audit:  # before the first Lloyd statistics: the seeds' basis
            return fedkmeans.StartAudits.starting(audit["basis"], self.cfg.restarts, self._k())
        return fedkmeans.StartAudits(**audit)

    # -- the filter over the whole graph ------------------------------------------------------
    @answers(fedkmeans.KMEANS_FILTER)
    def on_kmeans_filter(self, arrays, values) -> Reply:
        """Hop ``hop`` (down: from hop 2 on, this party's rows of the last hop's padded sum). Up: the
        padded ``B_c U`` of this party's rows ``F`` filtered ``hop - 1`` times (``U = D~^-1/2 F``)."""
        hop = int(values["hop"])
        if not 1 <= hop <= self.cfg.filter_order:
            raise ProtocolError(f"filter hop {hop}; valid: 1..{self.cfg.filter_order} (filter-order)")
        floor = fedkmeans.hop_bound(self.links.total, self.secagg.bound)
        if not float(values["secagg_bound"]) >= floor * (1 - 1e-12):
            raise PrivacyRefusal("secagg-bound", f"secagg_bound={float(values['secagg_bound']):.6g} for "
                                                 f"'{values['secagg_tag']}', below {floor:.6g}, the bound this step "
                                                 "declares honestly")
        rows = self._filtered(arrays, values, hop - 1)
        return {fedkmeans.NEIGHBOURS: self.padded(fedkmeans.scaled_rows(rows, self.whole_degrees), values)}, {}

    @answers(fedkmeans.KMEANS_INIT)
    def on_kmeans_init(self, arrays, values) -> Reply:
        """Down: ``hops``, this party's rows of the last hop's padded sum, ``k`` and ``seed``. Up: the
        local seeds of its rows filtered over the whole graph, as hello's (:meth:`seeds`). With hops 0
        (no party holds an edge: the filter is the identity) the seeds of its unfiltered features."""
        hops = int(values.get("hops", -1))
        if FILTERED not in self.context.state.array_records:
            raise ProtocolError(f"'{fedkmeans.KMEANS_INIT}' in a run whose hello carried the seeds")
        if hops not in (0, self.cfg.filter_order):
            raise ProtocolError(f"'{fedkmeans.KMEANS_INIT}' after {hops} filter hop(s); valid: 0 or "
                                f"{self.cfg.filter_order} (filter-order)")
        if hops:
            self._filtered(arrays, values, hops)
        elif PADDED_ROWS in arrays or int(self.load(FILTERED)["hops"][0]) or self._holds_edges():
            raise ProtocolError(f"'{fedkmeans.KMEANS_INIT}' without the filter, after a hop or for a party that "
                                "holds an edge; valid: the filter's hops first where the graph has edges")
        else:
            self.save(UNFILTERED, hops=np.array([0]))
        return self.seeds(values), {}

    def _filtered(self, arrays, values, hops: int) -> np.ndarray:
        """This party's rows filtered ``hops`` times over the whole graph: its features (0), or the
        kept rows of ``hops - 1`` hops taken one hop on with the neighbour sums in ``arrays`` (kept)."""
        kept = self.load(FILTERED)
        done = int(kept["hops"][0])
        if done != max(hops - 1, 0) or (PADDED_ROWS in arrays) != (hops > 0):
            raise ProtocolError(f"a request that takes the filter to {hops} hop(s) after {done}, "
                                + ("with" if PADDED_ROWS in arrays else "without") + " a padded sum's rows")
        if not hops:
            features = fedkmeans.projected(self.shard.x, self.cfg, self.shared.seed)
            self._check_bound(features, float(values["secagg_bound"]))
            return features
        before = kept["rows"] if done else fedkmeans.projected(self.shard.x, self.cfg, self.shared.seed)
        rows = fedkmeans.filter_hop(before, self.unpadded(arrays[PADDED_ROWS], values), self.whole_degrees)
        self.save(FILTERED, hops=np.array([hops]), rows=rows)
        return rows

    def _check_bound(self, features: np.ndarray, bound: float) -> None:
        """Log (here only: the server hears nothing) when this party's uploads may exceed the hop
        bound and be clipped: a feature beyond ``secagg.bound`` or a node whose edges into this
        party weigh more than the bound allows (:func:`fedgraphcore.protocols.fedkmeans.hop_bound`)."""
        heaviest = float(np.asarray(self.column_block.sum(axis=1)).max(initial=0.0))
        largest = float(np.abs(features).max(initial=0.0))
        if largest > self.secagg.bound or heaviest * self.secagg.bound > bound:
            log(WARNING, "fedkmeans: a feature beyond secagg.bound=%g or edge weights summing above %g at a node: "
                "this party's filter uploads may be clipped (the filter then differs from the centralised one); "
                "valid: a larger secagg.bound", self.secagg.bound, bound / self.secagg.bound)

    @answers(fedkmeans.KMEANS_STEP)
    def on_kmeans_step(self, arrays, values) -> Reply:
        """Per start it advances (``starts``, one block of ``centres`` each): per-cluster sums, counts,
        rows withheld and inertia; above ``min-rows`` 1 only the clusters this node's audit of every
        sum it has sent, with any start, lets go out (:func:`fedgraphcore.protocols.fedkmeans.start_statistics`).
        A resumed run's first live step also carries the blocks of the steps replayed from its
        journal: the audit first takes in the sums they give (:func:`fedgraphcore.protocols.fedkmeans.replay_audit`,
        which can only make it stricter)."""
        min_rows = int(self.policy["min-rows"])
        starts = self._starts(arrays.get("starts"))
        centres = self._centres(arrays["centres"], fedkmeans.KMEANS_STEP, len(starts))
        self.require_masking(fedkmeans.KMEANS_STEP, values, needed_by_run=self.cfg.secure)
        replayed = self._replayed(arrays, centres.shape[1:])
        with self.release_record.locked():
            audits = self._audit() if min_rows > 1 else None
            if replayed is not None:
                audits = fedkmeans.replay_audit(self.features(), *replayed, min_rows, audits)
            stats, counts, audits = fedkmeans.start_statistics(self.features(), centres, starts, min_rows, audits)
            if audits is not None:
                self._keep(audits)
        self._record_step(starts, centres, counts, replayed)
        if "secagg_tag" in values:  # an honest server declares at least this client's rows x secagg.bound
            floor = fedkmeans.statistics_bound(len(self.shard.node_ids), self.secagg.bound)
            stats = self.masked(stats, values, floor=floor)
        return {"stats": stats}, {}

    def _replayed(self, arrays, shape: tuple) -> tuple[np.ndarray, np.ndarray] | None:
        """The blocks and starts of a resumed run's replayed Lloyd steps in ``arrays``, checked
        (:func:`fedgraphcore.protocols.fedkmeans.check_replayed`); only before this client's first live Lloyd step."""
        if fedkmeans.REPLAYED_CENTRES not in arrays:
            return None
        if LAST_STEP in self.context.state.array_records:
            raise ProtocolError(f"{fedkmeans.REPLAYED_CENTRES} after this client's first Lloyd statistics; valid: with the "
                                "first live step of a resumed run only")
        restarts = self.cfg.restarts
        replayed, starts = arrays[fedkmeans.REPLAYED_CENTRES], arrays.get(fedkmeans.REPLAYED_STARTS, np.zeros(0))
        fedkmeans.check_replayed(replayed, starts, shape, restarts, (self.shared.num_rounds - 1) * restarts)
        return replayed, np.asarray(starts, dtype=np.int64)

    def _record_step(self, starts: np.ndarray, centres: np.ndarray, counts: np.ndarray,
                     replayed: tuple[np.ndarray, np.ndarray] | None) -> None:
        """Keep, per start, the digest of the centres of the last Lloyd step that advanced it (a live one,
        or one a resumed run replayed before this client's first live step: with no counts of its own)
        and the counts this client sent then."""
        last = self._last_steps(replayed, centres.shape[1])
        for start, block, sent in zip(starts, centres, counts):
            last["digests"][start], last["counts"][start], last["answered"][start] = _digest(block), sent, True
        self.save(LAST_STEP, **last)

    def _last_steps(self, replayed: tuple[np.ndarray, np.ndarray] | None, k: int) -> dict[str, np.ndarray]:
        """Per start (``fedkmeans.restarts``): the digest of the centres of the last Lloyd step that
        advanced it, the counts this client sent then and whether one did (kept in state; before the
        first live step, the ``replayed`` blocks, with no counts of its own)."""
        if LAST_STEP in self.context.state.array_records:
            return self.load(LAST_STEP)
        restarts = self.cfg.restarts
        last = {"digests": np.zeros((restarts, 32), dtype=np.uint8), "counts": np.zeros((restarts, k)),
                "answered": np.zeros(restarts, dtype=bool)}
        for block, start in zip(*replayed) if replayed is not None else ():  # in step order: a start's last wins
            last["digests"][start], last["answered"][start] = _digest(block), True
        return last

    def _keep(self, audit: fedkmeans.Audit | fedkmeans.StartAudits, seed_labels: np.ndarray | None = None) -> None:
        """Keep ``audit`` for this run, and its basis in the node's release record for every later run
        on these rows (with the local clusters sent, ``seed_labels``); under the record's lock."""
        self.save(AUDIT, **{name: value for name, value in vars(audit).items() if value is not None})
        record = self.release_record
        if record.directory is not None:
            kept = record.load_arrays(self._audit_name()) or {}
            if seed_labels is not None:
                kept["seed_labels"] = seed_labels
            record.save_arrays(self._audit_name(), **{**kept, "basis": audit.basis})

    @answers(fedkmeans.KMEANS_ASSIGN)
    def on_kmeans_assign(self, arrays, values) -> Reply:
        """The labels of this client's rows under the final centres of the chosen ``start``, which it
        derives from the last Lloyd step that advanced that start and the summed statistics the
        server returns (:func:`fedgraphcore.protocols.fedkmeans.final_centres`); anything else refused (rule
        ``server-input``)."""
        last, own = self._last_step(arrays, values)
        centres = fedkmeans.final_centres(last, own, arrays.get("stats", np.zeros(0)))
        if isinstance(centres, str):
            raise PrivacyRefusal("server-input", f"'{fedkmeans.KMEANS_ASSIGN}' sent {centres}")
        labels, _ = fedkmeans.assign(self.features(), centres)
        self.save("labels", labels=labels)
        return {"node_ids": np.asarray(self.shard.node_ids, dtype=np.int64), "labels": labels.astype(np.int64)}, {}

    def _last_step(self, arrays, values) -> tuple[np.ndarray, np.ndarray]:
        """The centres of the last Lloyd step that advanced the request's ``start``, which the request's
        ``centres`` must be, and the counts this client sent then. A resumed run whose Lloyd steps the
        journal replayed (none reached this client) carries their blocks instead: the last of that start,
        with no counts of its own."""
        sent = self._centres(arrays["centres"], fedkmeans.KMEANS_ASSIGN)
        start = int(values.get("start", -1))
        if not 0 <= start < self.cfg.restarts:
            raise PrivacyRefusal("server-input", f"'{fedkmeans.KMEANS_ASSIGN}' sent start {start}; valid: 0.."
                                                 f"{self.cfg.restarts - 1} (fedkmeans.restarts)")
        last = self._last_steps(self._replayed(arrays, sent.shape), len(sent))
        if not last["answered"][start] or not np.array_equal(last["digests"][start], _digest(sent)):
            raise PrivacyRefusal("server-input", f"'{fedkmeans.KMEANS_ASSIGN}' sent centres that are not those of the "
                                                 f"last Lloyd step of start {start} this client answered")
        return sent, last["counts"][start]


def _digest(centres: np.ndarray) -> np.ndarray:
    """SHA-256 of one start's centres (a client keeps this, not the centres, between steps)."""
    return request_digest({"centres": np.asarray(centres, dtype=np.float64)}, {})
