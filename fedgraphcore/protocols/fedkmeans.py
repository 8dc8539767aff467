"""Federated Lloyd k-means over clients holding disjoint rows.

Each round the server broadcasts the centres ``M`` (k x f); client ``c``
answers with its per-cluster sums ``S_c[j] = sum_{i in c, a(i)=j} x_i`` and
counts ``n_c[j]``, where a cluster of fewer than the client's ``min-rows`` rows is withheld
(sent as 0, its rows counted apart); the server sets ``M[j] = sum_c S_c[j] / sum_c n_c[j]``
(an empty cluster keeps its centre). With one client this is exactly Lloyd's
algorithm on the pooled rows (``min-rows`` 1, or no cluster that small).

Initialisation (one extra round, as in k-FED): every client runs k-means++ on
its own rows and uploads its local centres with their sizes, each centre the
mean of at least ``min-rows`` rows; the server runs weighted k-means on the
union of local centres.

Restarts (``restarts`` = R, scikit-learn's ``n_init``): R starts advance side by side, each a
leading-axis block of the same messages (R x k x f down, R statistics vectors up, in one secure
sum); a start whose centres no longer move drops out of the messages. Start 0 is the weighted
k-means of the local centres, starts 1..R-1 weighted k-means++ seedings of them
(:func:`starting_centres`); the start whose summed statistics give the least inertia per row
sent wins (:func:`best_start`). With one client and ``min-rows`` 1 this is exactly scikit-learn's
best of R Lloyd runs from those starts. A client's row audit covers every start's sums in one basis
(:class:`StartAudits`): R starts give the server no set it could not have asked for in R rounds.

Filter over the whole graph (a node split with boundary edges, several clients): the AGC
filter ``G = (I + D~^-1/2 (A+I) D~^-1/2) / 2`` (``D~`` = whole-graph degree + 1) applied
``filter-order`` times needs, per hop, each node's sum over all its neighbours of
``U = D~^-1/2 F``; a padded sum (:mod:`fedgraphcore.protocols.boundary`) hands each party exactly its
nodes' sums, and :func:`filter_hop` gives its rows of ``G F``. The local k-means++ seeds are
then computed on those rows (``kmeans_init``) instead of with hello.

Shared projection (``dims``, with a filter, features wider than it): every party first multiplies
its rows by one f x ``dims`` Gaussian matrix ``R`` drawn from the run's seed (:func:`shared_projection`),
so that the filter runs on ``X R`` and a hop moves ``dims`` columns, not f. The filter is linear in
the columns (``G^t (X R) = (G^t X) R``), ``R`` is public and data-free, and every sum sent of ``X R``
is a sum of ``X`` times ``R``: the projection releases nothing the unprojected rows' sums would not.
The centralised reference projects with the same ``R``.

Wire protocol (what leaves each client, step by step):

1. with ``hello`` (down: k, seed) -> up: ``centres`` (at most k x f local
   k-means++ centres, each the mean of at least the node's ``min-rows`` rows:
   a smaller local cluster joins its nearest one; a node holding fewer rows
   refuses) and their sizes ``counts``, which add up to the rows the client
   announced in hello. Coarse data summaries, sent in clear.
2. ``kmeans_step`` x num-rounds (down: ``starts``, the starts it advances, and
   their ``centres``, starts x k x f) -> up: ``stats``, per start the
   per-cluster sums (k x f), counts (k), the rows withheld and the inertia in
   one vector (starts x (k f + k + 2)). ``fedkmeans.restarts`` starts (10, as
   scikit-learn's ``n_init``) begin from the merged local centres (start 0:
   their weighted k-means; the others: weighted k-means++ seeds of them); a
   start whose centres move no more than ``fedkmeans.tol`` drops out of the
   messages, so R starts cost R times one start's bytes per round at most.
   Under a node's ``min-rows`` above 1 a new assignment goes out
   only when every cluster's rows pass the node's audit of every sum it has
   sent: at least ``min-rows`` rows, and no row of the node determined by any
   combination of those sums (differencing across rounds included); else the
   node sends its last statistics again (in a start's first round: the
   clusters that pass, the others withheld with sum and count 0, their rows
   counted apart, the inertia over the rows sent). One audit covers every
   start: whatever centres the server sends, with however many starts, it
   reads no row this way (:func:`fedgraphcore.protocols.fedkmeans.release`). Stops
   early when no centre of any start moves more than ``fedkmeans.tol``. With
   ``fedkmeans.secure`` the vectors are
   pairwise-masked (secure aggregation, set up once with two extra rounds) and
   the server learns only the sum over clients. The sizes and withheld rows
   must add up to the client's rows (secure: all rows) and the inertia be
   >= 0, else the run stops naming the client. Rows held by
   two clients (``partition.overlap`` > 0) would count twice: refused.
   A resumed run's first live step also carries ``replayed_centres`` and
   ``replayed_starts``, the blocks of every step replayed from the journal
   (which no client saw) and their starts, so that each client's audit takes
   in the sums it sent in them first.
3. ``kmeans_assign`` (down: the ``start`` of least inertia per row sent, read
   from the (secure) sums, its last step's ``centres`` and summed statistics
   ``stats``) -> up: ``node_ids`` and ``labels`` of the client's rows under the
   final centres, which the client derives itself (that start's last centres
   moved by ``stats``); for evaluation only, labels stay on the client as
   well. A client refuses centres that are not those of the last step of that
   start it answered and a total whose counts do not hold its own (rule
   ``server-input``), and answers once per run.

Every step's centres are exactly ``num-clusters`` finite rows of the clients' width per start, its
starts at most ``fedkmeans.restarts`` distinct indices below it (rule ``server-input``), hello comes
first and once, ``kmeans_step`` at most ``num-rounds`` times (rules ``protocol-order``,
``protocol-count``; :mod:`clients.steps`).

On a node split with boundary edges (``partition.boundary``), several clients and
``filter-order`` > 0, the filter runs over the whole graph, so that every client's rows are
its nodes' rows of the centralised filtered features. Hello then carries the clients' public
keys, whether each holds an edge (``has_edges``) and no centres. Where none does, the filter
is the identity: ``kmeans_init`` (hops 0) asks for the seeds of the features as they are, then
steps 2 and 3. Else the boundary links are set up (three rounds, :mod:`strategies.links`);
then ``kmeans_filter`` x filter-order (down: ``hop`` and, from hop 2 on, the client's rows of
the last hop's padded sum -> up: ``neighbours``, its padded ``B_c D~^-1/2 F_c``, N x w masked
ring elements whose sum the server cannot read) and ``kmeans_init`` (down: hops, the last sum's rows,
k, seed -> up: step 1's centres and counts, of the filtered rows); then steps 2 and 3. Where the
filter runs, every row above is projected as said (w = ``dims``, else w = f; :func:`projected`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

import numpy as np

from fedgraphcore.config import ConfigError, ConfigView, setting
from fedgraphcore.graph_filters import filtered_features
from fedgraphcore.wire import ArraySpec, ReplySpec

# -- wire: the protocol's steps and what a valid reply holds ------------------------------
KMEANS_STEP = "kmeans_step"
KMEANS_ASSIGN = "kmeans_assign"
#: one hop of the filter over the whole graph: (rows of the last sum down,) a padded upload up
KMEANS_FILTER = "kmeans_filter"
#: after the last hop: its sum's rows down, the local seeds of the filtered rows up (INIT_REPLY)
KMEANS_INIT = "kmeans_init"
#: the hello value saying that the filter may run over the whole graph in this many hops (the seeds
#: then come with ``kmeans_init``, not with hello; its ``hops`` value says how many ran: these, or 0
#: where no party holds an edge)
FILTER_HOPS = "filter_hops"
#: with ``filter_hops``, the hello figure saying whether the party holds an edge (1) or not (0): one of
#: its own or one to a node another party holds
HAS_EDGES = "has_edges"
#: the padded upload of a hop: ``B_c U_c`` (N x f, masked and padded)
NEIGHBOURS = "neighbours"
#: with a resumed run's first live ``kmeans_step``: the centres of every Lloyd step replayed from the
#: journal (p x k x f: each step's blocks, one per start it advanced, in step order; :func:`replay_audit`); the ``replayed_`` prefix keeps it out of
#: the step's journal digest (:data:`fedgraphcore.journal.REPLAYED`)
REPLAYED_CENTRES = "replayed_centres"
#: beside it: the start of each replayed block (p)
REPLAYED_STARTS = "replayed_starts"

#: the arrays a client adds to its hello reply (or its ``kmeans_init`` reply, after the filter over the
#: whole graph): its local k-means++ centres and their sizes
INIT_REPLY = ReplySpec(arrays={"centres": ArraySpec((None, None)), "counts": ArraySpec((None,), low=0)},
                       same_length=("centres", "counts"))


def step_reply(starts: int, size: int, secure: bool) -> ReplySpec:
    """``stats``: per start, sums, counts and inertia in one vector of ``size`` (starts x size);
    masked integers when ``secure``."""
    return ReplySpec(arrays={"stats": ArraySpec((starts, size), kind="u" if secure else "f", masked=secure)})


def assign_reply(k: int) -> ReplySpec:
    """The client's row ids and their labels in ``0..k-1``."""
    return ReplySpec(arrays={"node_ids": ArraySpec((None,), kind="iu", low=0, unique=True),
                             "labels": ArraySpec((None,), kind="iu", low=0, high=k)},
                     same_length=("node_ids", "labels"))


@dataclass(frozen=True)
class FedKMeansConfig(ConfigView):
    """The ``fedkmeans.*`` keys of :class:`strategies.fedkmeans.FedKMeans` and its client, declared here."""

    prefix: ClassVar[str] = "fedkmeans"
    filter_order: int = setting(4, "AGC low-pass filter order applied first where the data has edges (over the "
                                "whole graph with partition.boundary; 0: features only)", low=0, high=1000, primary=True)
    dims: int = setting(96, "with filter-order > 0, features wider than this are first multiplied by a Gaussian "
                        "projection all parties draw from the run's seed, so a filter hop moves dims columns, not the "
                        "features' f; 0: no projection", low=0, high=100000)
    restarts: int = setting(10, "k-means starts advanced side by side in the same messages (scikit-learn's n_init; "
                            "the centralised reference's restarts); the least inertia wins", low=1, high=1000)
    tol: float = setting(1e-6, "stop when no centre moves more than this", low=0.0)
    secure: bool = setting(False, "secure aggregation of the per-round statistics")


def shared_projection(width: int, dims: int, seed: int) -> np.ndarray:
    """``R`` (width x dims): i.i.d. N(0, 1/dims) entries from ``seed`` alone, so that every party and
    the centralised reference draw the same matrix (Johnson-Lindenstrauss: squared distances kept
    within 1 +- O(sqrt(1/dims)))."""
    rng = np.random.default_rng([int(seed), int(width), int(dims)])
    return rng.standard_normal((width, dims)) / np.sqrt(dims)


def projected(x, cfg: "FedKMeansConfig", seed: int, order: int | None = None) -> np.ndarray:
    """Dense float64 rows ``x``, times :func:`shared_projection` when a filter runs (``order``, by
    default ``filter-order``, > 0) and they are wider than ``dims`` > 0; else as they are."""
    x = filtered_features(x, None, 0)
    if (cfg.filter_order if order is None else order) > 0 and 0 < cfg.dims < x.shape[1]:
        return x @ shared_projection(x.shape[1], cfg.dims, seed)
    return x


def local_features(x, adj, cfg: "FedKMeansConfig", seed: int, order: int | None = None) -> np.ndarray:
    """A client's rows: its features (:func:`projected`), AGC-filtered ``order`` (by default
    ``filter-order``) times over its own subgraph (unfiltered where it has no edges)."""
    order = cfg.filter_order if order is None else order
    return filtered_features(projected(x, cfg, seed, order), adj, order)


def scaled_rows(f: np.ndarray, degrees: np.ndarray) -> np.ndarray:
    """``U = D~^-1/2 F``: a party's rows divided by the square root of their whole-graph degree + 1
    (what its column block multiplies in a hop)."""
    return f / np.sqrt(np.asarray(degrees, dtype=np.float64) + 1.0)[:, None]


def filter_hop(f: np.ndarray, neighbour_sums: np.ndarray, degrees: np.ndarray) -> np.ndarray:
    """A party's rows of ``G F`` from its rows ``F`` and their neighbour sums ``(A U)_own``:
    ``G F = (F + D~^-1/2 A D~^-1/2 F + D~^-1 F) / 2`` (``G`` of
    :func:`fedgraphcore.graph_filters.agc_filter_matrix`, ``A_hat = D~^-1/2 (A + I) D~^-1/2`` split into
    its edges and its self-loop)."""
    tilde = np.asarray(degrees, dtype=np.float64)[:, None] + 1.0
    return 0.5 * (f + np.asarray(neighbour_sums, dtype=np.float64) / np.sqrt(tilde) + f / tilde)


def hop_bound(total: int, value_bound: float) -> float:
    """The largest |entry| of a party's hop upload ``B_c U_c`` on ``total`` nodes whose features
    lie within ``value_bound``. ``U`` obeys a maximum principle: ``U' = D~^-1/2 G D~^1/2 U =
    (U + D~^-1 (A+I) U) / 2`` averages with nonnegative weights summing to 1, so
    ``max|U_t| <= max|U_0| <= max|X| <= value_bound`` at every hop; an entry of ``B_c U_c`` sums
    at most ``total - 1`` edges of a node (unit weights: its degree), each times one ``U``. With
    edge weights, exact while every node's weighted degree stays within ``total - 1``; a party
    clips what exceeds the bound (:meth:`clients.base.ClusteringClient.masked`)."""
    return max(int(total) - 1, 1) * float(value_bound)


def centres_problem(centres: np.ndarray, k: int, width: int, starts: int | None = None) -> str | None:
    """Why server-sent ``centres`` are not centres of this run (None: they are): exactly ``k``
    (its num-clusters) finite centres of the client's feature ``width``; with ``starts``, that many
    such blocks on a leading axis (one per start of a Lloyd step), each checked so. Checked before
    any statistic or label is computed from them: k-means of the run's k, never a grid of probes."""
    centres = np.asarray(centres)
    shape = (k, width) if starts is None else (starts, k, width)
    if centres.dtype.kind != "f" or centres.shape != shape:
        return f"centres of {centres.dtype} {centres.shape}; valid: float {shape}, the run's num-clusters"
    if not np.isfinite(centres).all():
        return "centres that are not finite"
    return None


def starts_problem(starts: np.ndarray, restarts: int) -> str | None:
    """Why the server's ``starts`` (the starts a Lloyd step advances) are not starts of this run
    (None: they are): 1..``restarts`` distinct indices in ``0..restarts-1``, increasing."""
    starts = np.asarray(starts)
    if starts.dtype.kind not in "iu" or starts.ndim != 1 or not 1 <= len(starts) <= restarts:
        return f"starts of {starts.dtype} {starts.shape}; valid: 1..{restarts} integers (fedkmeans.restarts)"
    if starts.min() < 0 or starts.max() >= restarts or (np.diff(starts) <= 0).any():
        return f"starts {starts.tolist()}; valid: increasing indices in 0..{restarts - 1} (fedkmeans.restarts)"
    return None


def final_centres(last: np.ndarray, own_counts: np.ndarray, total: np.ndarray) -> np.ndarray | str:
    """The centres of the final labels, derived by the client from what the federation computed:
    the centres ``last`` of the last Lloyd step it answered, moved by the summed statistics
    ``total`` the server returns (:func:`update_centres`, the server's own step). Refused (a
    reason) when ``total`` is not a sum that holds this client's counts ``own_counts`` of that
    step (whole numbers, each at least its own): such a total is no sum over the federation."""
    k, width = last.shape
    total = np.asarray(total, dtype=np.float64)
    if total.shape != (k * width + k + 2,) or not np.isfinite(total).all():
        return f"a total of shape {total.shape}; valid: ({k * width + k + 2},), the last step's statistics summed"
    sums, counts, withheld, _ = split_statistics(total, k)
    if (counts < np.asarray(own_counts) - 0.5).any() or np.abs(counts - np.rint(counts)).max(initial=0) > 0.5 \
            or withheld < -0.5:
        return "a total whose cluster counts are not whole numbers holding this client's own counts"
    return update_centres(last, sums, counts)


def assign(x: np.ndarray, centres: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Nearest centre of each row and the squared distance to it."""
    d2 = (
        (x * x).sum(1)[:, None]
        - 2.0 * x @ centres.T
        + (centres * centres).sum(1)[None, :]
    )
    labels = d2.argmin(1)
    return labels, np.maximum(d2[np.arange(len(x)), labels], 0.0)


@dataclass(frozen=True)
class Audit:
    """What a client has sent of its rows, for :func:`release`: ``basis``, an orthonormal basis
    (rows x r) of the row sets whose sums it sent (each as its 0/1 vector over the client's rows);
    ``labels`` and ``sent``, the assignment and the clusters of its last Lloyd statistics (None
    before the first)."""

    basis: np.ndarray
    labels: np.ndarray | None = None
    sent: np.ndarray | None = None

    @classmethod
    def empty(cls, rows: int) -> Audit:
        return cls(np.zeros((rows, 0)))

    @classmethod
    def of_seeds(cls, labels: np.ndarray, k: int, min_rows: int) -> Audit:
        """The audit after the hello centres: the sums of the local clusters ``labels`` (disjoint sets
        of at least ``min_rows`` rows each, so every one is admitted)."""
        return cls(_admitted(np.zeros((len(labels), 0)), labels, k, min_rows)[0])


@dataclass(frozen=True)
class StartAudits:
    """What a client has sent of its rows over every start of a run: one ``basis`` for them all (a
    row set the server read with any start is known to it whichever start it comes with, so the
    sets of R starts are audited as if sent in R rounds), and per start its last assignment
    ``labels`` (restarts x rows; -1 before the start's first statistics) and clusters ``sent``
    (restarts x k)."""

    basis: np.ndarray
    labels: np.ndarray
    sent: np.ndarray

    @classmethod
    def starting(cls, basis: np.ndarray, restarts: int, k: int) -> StartAudits:
        """Before the first Lloyd statistics: the row sets ``basis`` spans (the seeds, earlier runs)."""
        return cls(basis, np.full((restarts, len(basis)), -1, dtype=np.int64), np.zeros((restarts, k), dtype=bool))

    def of(self, start: int) -> Audit:
        """Start ``start``'s view: the shared basis, its last assignment and clusters sent."""
        if (self.labels[start] < 0).all():
            return Audit(self.basis)
        return Audit(self.basis, self.labels[start], self.sent[start])

    def started(self) -> bool:
        """Whether any start has sent Lloyd statistics."""
        return bool((self.labels >= 0).any())


def start_statistics(x: np.ndarray, centres: np.ndarray, starts: np.ndarray, min_rows: int = 1,
                     audits: StartAudits | None = None) -> tuple[np.ndarray, np.ndarray, StartAudits | None]:
    """Client step for the ``starts`` a Lloyd step advances (``centres``: one k x f block each):
    each start's :func:`lloyd_statistics`, joined (:func:`join_statistics`; starts x (k f + k + 2)),
    its counts (starts x k) and the audit after them all. The starts go through one audit in turn
    (above ``min-rows`` 1): each start's sets join the basis the starts before it left."""
    audits = None if audits is None else StartAudits(audits.basis, audits.labels.copy(), audits.sent.copy())
    stats, counts = [], []
    for start, block in zip(np.asarray(starts, dtype=np.int64), centres):
        sums, n, withheld, inertia, audit = lloyd_statistics(x, block, min_rows, None if audits is None else
                                                             audits.of(start))
        if audit is not None:
            audits.labels[start], audits.sent[start] = audit.labels, audit.sent
            audits = replace(audits, basis=audit.basis)
        stats.append(join_statistics(sums, n, withheld, inertia))
        counts.append(n)
    return np.stack(stats), np.stack(counts), audits


def lloyd_statistics(x: np.ndarray, centres: np.ndarray, min_rows: int = 1,
                     audit: Audit | None = None) -> tuple[np.ndarray, np.ndarray, float, float, Audit | None]:
    """Client step: per-cluster sums (k x f), counts (k,), the rows withheld, the inertia of the
    rows sent, and the audit after this release (None when ``min_rows`` is 1: Lloyd's step on
    every row). Above 1 the rows' clusters are the ones :func:`release` lets go out; a cluster not
    sent goes as sum and count 0 with its rows counted in ``withheld``, and the inertia counts the
    rows sent only (a withheld row's distance would tell its projection)."""
    k = len(centres)
    labels = assign(x, centres)[0]
    sent = np.ones(k, dtype=bool)
    if min_rows > 1:
        labels, sent, audit = release(labels, k, min_rows, audit)
    counts = np.bincount(labels, minlength=k).astype(np.float64)
    sums = np.zeros_like(centres, dtype=np.float64)
    np.add.at(sums, labels, x)
    rows_sent = sent[labels]
    withheld = float(counts[~sent].sum())
    sums[~sent], counts[~sent] = 0.0, 0.0
    d2 = ((x[rows_sent] - centres[labels[rows_sent]]) ** 2).sum()
    return sums, counts, withheld, float(d2), audit


def check_replayed(replayed: np.ndarray, starts: np.ndarray, centres_shape: tuple, restarts: int, most: int) -> None:
    """A resumed run's replayed Lloyd steps as the server sends them, or a ValueError: ``replayed``
    (p x k x f), the blocks of every replayed step in step order (each step's starts in increasing
    order), at most ``most``, finite; ``starts`` (p), the start of each block, in ``0..restarts-1``."""
    starts = np.asarray(starts)
    if replayed.ndim != 3 or replayed.shape[1:] != tuple(centres_shape) or not 0 < len(replayed) <= most:
        raise ValueError(f"{REPLAYED_CENTRES} of shape {replayed.shape}; valid: 1..{most} blocks of centres "
                         f"{tuple(centres_shape)}")
    if not np.isfinite(replayed).all():
        raise ValueError(f"{REPLAYED_CENTRES} holds values that are not finite")
    if starts.dtype.kind not in "iu" or starts.shape != (len(replayed),) or starts.min() < 0 \
            or starts.max() >= restarts:
        raise ValueError(f"{REPLAYED_STARTS} of {starts.dtype} {starts.shape}; valid: {len(replayed)} starts in "
                         f"0..{restarts - 1}")


def replay_audit(x: np.ndarray, replayed: np.ndarray, starts: np.ndarray, min_rows: int,
                 audits: StartAudits | None) -> StartAudits | None:
    """The audit of a resumed run's fresh client after the Lloyd steps it never saw: the journal
    replayed them (their replies recorded in the interrupted run), so it answers its first live
    step only after recomputing, from its own rows ``x``, the statistics of every replayed block
    (``replayed`` and ``starts`` as :func:`check_replayed` admits them) and recording them.

    Safe whatever centres a server sends: each replayed assignment only adds row sets to what the
    audit believes was released (its basis grows; a set goes in only if :func:`admit` lets it), so
    the audit is never looser than the fresh one the client starts with (the audit a new run's
    client has), and every statistic :func:`release` sends after it lies in the span of a basis
    that holds all this client has sent in this run. With the honest server's centres (its own
    requests, deterministic) these are the sums the interrupted client sent, computed as it did,
    start after start: the uninterrupted run's audit exactly, so the same clusters are withheld.
    Only before this client's first Lloyd statistics (a ValueError otherwise)."""
    if audits is not None and audits.started():
        raise ValueError(f"{REPLAYED_CENTRES} after this client's first Lloyd statistics; valid: with the first "
                         "live step of a resumed run only")
    return None if audits is None else start_statistics(x, replayed, starts, min_rows, audits)[2]


def released_seeds(labels: np.ndarray, k: int, min_rows: int, basis: np.ndarray,
                   kept: np.ndarray | None) -> tuple[np.ndarray, np.ndarray] | None:
    """The local clusters whose centres a client sends with hello after the row sets ``basis``
    spans (its sums of earlier runs on the same rows), and the basis then: its new local clusters
    ``labels`` when every one is admitted (:func:`admit`); else the local clusters ``kept`` it sent
    in an earlier run (sets already in the span, so admitted) when they are at most ``k``; else
    None (every choice would determine a row with what it sent before)."""
    grown, failing = _admitted(basis, labels, int(labels.max()) + 1, min_rows)
    if not failing:
        return labels, grown
    if kept is not None and int(kept.max()) + 1 <= k:
        grown, failing = _admitted(basis, kept, int(kept.max()) + 1, min_rows)
        if not failing:
            return kept, grown
    return None


def seed_centres(x: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The centres and sizes of the local clusters ``labels`` (0..m-1) of the rows ``x``."""
    clusters = np.arange(int(labels.max()) + 1)
    return _means(x, labels, clusters), np.bincount(labels, minlength=len(clusters)).astype(np.float64)


def release(labels: np.ndarray, k: int, min_rows: int, audit: Audit) -> tuple[np.ndarray, np.ndarray, Audit]:
    """Which clusters of the assignment ``labels`` a client sends, under ``min_rows`` > 1: the row
    sets it sends, with every set it sent before, must determine none of its rows (:func:`admit`;
    the server picks the centres, hence the sets, and can add and subtract what it reads).

    The first statistics send each cluster that is admitted and withhold the others. Later ones
    send a whole assignment: the new one when every cluster is admitted, else, one failing cluster
    at a time, the rows that moved into or out of it go back to their last cluster (a straggler
    that alone leaves a cluster stays), until every cluster is; at worst the last statistics again
    (nothing new for the server). Returns the assignment and clusters sent, and the audit after them."""
    if audit.labels is None:
        basis, failing = _admitted(audit.basis, labels, k, min_rows)
        sent = np.isin(np.arange(k), failing, invert=True)
        return labels, sent, Audit(basis, labels, sent)
    current = labels.copy()
    for _ in range(k + 1):
        basis, failing = _admitted(audit.basis, current, k, min_rows)
        if not failing:
            return current, np.ones(k, dtype=bool), Audit(basis, current, np.ones(k, dtype=bool))
        # the first cluster that fails gets its last rows back: then it is a set already sent
        back = (current != audit.labels) & ((current == failing[0]) | (audit.labels == failing[0]))
        if not back.any():
            break
        current[back] = audit.labels[back]
    return audit.labels, audit.sent, audit


def _admitted(basis: np.ndarray, labels: np.ndarray, k: int, min_rows: int) -> tuple[np.ndarray, list[int]]:
    """The basis after every cluster of ``labels`` that :func:`admit` lets go out, largest first,
    and the non-empty clusters it does not."""
    failing = []
    for j in np.argsort(-np.bincount(labels, minlength=k), kind="stable"):
        member = labels == j
        if member.any():
            basis, ok = admit(basis, member, min_rows)
            if not ok:
                failing.append(int(j))
    return basis, failing


def admit(basis: np.ndarray, member: np.ndarray, min_rows: int) -> tuple[np.ndarray, bool]:
    """Whether the sum over the rows ``member`` (a boolean vector) may go out after the sums
    ``basis`` spans, and the basis then.

    The sum of every row set in the span of the sent sums is known to the server (it can add and
    subtract what it read), so row i is determined once the unit vector e_i lies in that span,
    i.e. once its leverage ``||basis[i]||^2`` reaches 1. Admitted: a set of at least ``min_rows``
    rows that leaves every leverage below 1 and the span's dimension at most
    ``rows - min_rows + 1`` (at least ``min_rows - 1`` directions of the rows stay unknown; the sum
    of all rows is one). A set already in the span adds nothing and is admitted as it is."""
    q = member.astype(np.float64)
    if q.sum() < min_rows:
        return basis, False
    residual = q - basis @ (basis.T @ q)
    residual -= basis @ (basis.T @ residual)  # twice: Gram-Schmidt keeps the basis orthonormal
    norm = np.linalg.norm(residual)
    if norm <= 1e-9 * np.sqrt(q.sum()):
        return basis, True
    grown = np.column_stack([basis, residual / norm])
    leverage = np.einsum("ij,ij->i", grown, grown)
    if leverage.max() >= 1.0 - 1e-9 or grown.shape[1] > len(q) - min_rows + 1:
        return basis, False
    return grown, True


def statistics_bound(rows: int, value_bound: float) -> float:
    """The largest |entry| of the statistics of a client with ``rows`` rows: each entry is a sum
    over its rows of one row's value (a feature, 1 for the count, a squared distance), each at most
    ``value_bound`` (and the count's 1), so the bound grows with the rows and holds at every size."""
    return max(int(rows), 1) * max(float(value_bound), 1.0)


def join_statistics(sums: np.ndarray, counts: np.ndarray, withheld: float, inertia: float) -> np.ndarray:
    """One vector ``[sums.ravel(), counts, withheld, inertia]``: summing these over
    clients sums each part, so it can go through one (secure) sum."""
    return np.concatenate([sums.ravel(), counts, [withheld, inertia]])


def split_statistics(stats: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, float, float]:
    """Inverse of :func:`join_statistics`."""
    f = (len(stats) - k - 2) // k
    return stats[: k * f].reshape(k, f), stats[k * f : k * f + k], float(stats[-2]), float(stats[-1])


def update_centres(centres: np.ndarray, sums: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Server step: new centres from summed statistics; empty clusters stay put."""
    new = centres.copy()
    nonempty = counts > 0
    new[nonempty] = sums[nonempty] / counts[nonempty, None]
    return new


def local_seeds(x: np.ndarray, k: int, seed: int, min_rows: int = 1,
                restarts: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Client init: centres of the local rows, their sizes and each row's centre, each centre the
    mean of at least ``min_rows`` rows. k-means (k-means++, the best of ``restarts`` runs: the
    centralised reference's ``n_init``) finds ``min(k, rows // min_rows)`` clusters; then, smallest
    first, a cluster of fewer than ``min_rows`` rows gives its rows to the nearest remaining centre,
    whose mean follows. With ``min_rows`` 1 these are the local k-means centres (a one-row cluster's
    centre is the row): with one client, the centralised reference's own clusters."""
    # imported here: a deployed ClientApp process, started for every message, imports this module
    from sklearn.cluster import KMeans

    k_local = min(k, len(x) // max(min_rows, 1))
    if k_local < 1:
        raise ValueError(f"{len(x)} rows cannot give a centre of at least {min_rows} rows")
    labels = KMeans(k_local, init="k-means++", n_init=restarts, random_state=seed).fit(x).labels_
    kept = np.arange(k_local)
    while True:
        sizes = np.bincount(labels, minlength=k_local)[kept]
        if sizes.min() >= min_rows:
            break
        # dissolve the smallest cluster: its rows join the nearest centre of those that remain
        gone, kept = kept[sizes.argmin()], np.delete(kept, sizes.argmin())
        centres = _means(x, labels, kept)
        moving = labels == gone
        labels[moving] = kept[assign(x[moving], centres)[0]]
    return (_means(x, labels, kept), np.bincount(labels, minlength=k_local)[kept].astype(np.float64),
            np.searchsorted(kept, labels))


def _means(x: np.ndarray, labels: np.ndarray, clusters: np.ndarray) -> np.ndarray:
    return np.stack([x[labels == j].mean(0) for j in clusters])


def merge_seeds(centres: np.ndarray, weights: np.ndarray, k: int, seed: int) -> np.ndarray:
    """Server init: weighted k-means++ / Lloyd on the union of local centres. Fewer local centres
    than k (each is the mean of at least a node's ``min-rows`` rows, so small nodes send few): the
    heaviest are split, each copy moved by a small random offset (1e-3 of the centres' spread), so
    that Lloyd's first round divides its rows between the copies."""
    if len(centres) == 0:
        raise ConfigError(f"num-clusters={k} needs at least one local centre; the clients sent none")
    if len(centres) < k:
        return _split_heaviest(centres, weights, k, seed)
    from sklearn.cluster import KMeans

    km = KMeans(k, init="k-means++", n_init=10, random_state=seed)
    return km.fit(centres, sample_weight=weights).cluster_centers_


def starting_centres(centres: np.ndarray, weights: np.ndarray, k: int, seed: int, restarts: int) -> np.ndarray:
    """Server init of ``restarts`` starts (restarts x k x f) from the union of local centres: start 0
    :func:`merge_seeds`, start r >= 1 weighted k-means++ seeds of the local centres drawn at
    ``(seed, r)`` (:func:`sklearn.cluster.kmeans_plusplus`), as scikit-learn seeds each of its
    ``n_init`` runs on the rows, here on their k-FED summary. Fewer local centres than k: each
    start splits the heaviest with its own random offsets."""
    from sklearn.cluster import kmeans_plusplus

    first = merge_seeds(centres, weights, k, seed)
    starts = [first]
    for r in range(1, restarts):
        state = int(np.random.SeedSequence([int(seed), r]).generate_state(1)[0])
        if len(centres) < k:
            starts.append(_split_heaviest(centres, weights, k, state))
        else:
            starts.append(kmeans_plusplus(centres, k, sample_weight=weights, random_state=state)[0])
    return np.stack(starts).astype(np.float64)


def best_start(totals: np.ndarray, k: int) -> int:
    """The start whose summed statistics (``totals``, one row a start) give the least inertia per row
    sent (the inertia counts the rows sent only, so a start whose clients withheld more rows would
    look better by its plain sum; with every row sent, the least inertia); the first of equals."""
    def per_row(total: np.ndarray) -> float:
        _, counts, _, inertia = split_statistics(total, k)
        return inertia / max(float(counts.sum()), 1.0)

    return int(np.argmin([per_row(t) for t in totals]))


def _split_heaviest(centres: np.ndarray, weights: np.ndarray, k: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    order = np.argsort(-weights, kind="stable")
    copies = centres[order[np.arange(k - len(centres)) % len(centres)]]
    spread = centres.std(0) if len(centres) > 1 else np.abs(centres[0])
    scale = 1e-3 * np.maximum(spread, 1e-12 + 1e-3 * np.abs(centres).max())
    return np.vstack([centres, copies + rng.normal(size=copies.shape) * scale])
