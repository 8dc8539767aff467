"""The Gromov-Wasserstein matrix between graphs, in a process pool.

Per graph the Euclidean intra-distance matrix of the (encoded) embeddings, over their
distinct rows weighted by multiplicity (:func:`intra_distance`, :func:`embedding_space`;
rows rounded to ``decimals`` first, :func:`merge_duplicates`) or all-pairs shortest paths
(:func:`shortest_path_matrix`, topology-only baseline GW_A), uniform node
weights, POT's conditional gradient (square loss) for every pair
(:func:`gw_matrix`): :func:`fedgraphcore.protocols.gw_ldp.solver.cg_discrepancy`, the value
``ot.gromov.gromov_wasserstein2`` gives with the same ``max_iter``, bit for bit, in a
fraction of its time (``solver="pot"`` calls POT itself). The matrix solves pairs of spaces
of equal sizes together, as stacks (:func:`~fedgraphcore.protocols.gw_ldp.solver.cg_discrepancies`,
the same values), with each space's own terms computed once. Every process runs its linear
algebra on one thread, so a pair's value does not depend on the number of workers.
"""

from __future__ import annotations

import os
from typing import NamedTuple, Sequence

import numpy as np
import scipy.sparse as sp

from .solver import GW_SOLVERS, cg_discrepancies, cg_discrepancy, constant_terms

#: entries (pairs x points x points) of one stack of equal-shape pairs the matrix solves together
STACK_ENTRIES = 1 << 16


def intra_distance(h: np.ndarray) -> np.ndarray:
    """Euclidean distances between the rows of one graph's (encoded) embedding."""
    h = np.asarray(h, dtype=np.float64)
    sq = (h * h).sum(1)
    d2 = np.maximum(sq[:, None] + sq[None, :] - 2.0 * h @ h.T, 0.0)
    np.fill_diagonal(d2, 0.0)
    return np.sqrt(d2)


def shortest_path_matrix(adj) -> np.ndarray:
    """All-pairs shortest path lengths (hops); unreachable pairs get max + 1."""
    from scipy.sparse.csgraph import shortest_path

    c = shortest_path(sp.csr_matrix(adj), unweighted=True, directed=False)
    finite = np.isfinite(c)
    c[~finite] = (c[finite].max() if finite.any() else 0.0) + 1.0
    return c


#: decimals at which :func:`merge_duplicates` merges only rows equal up to float noise (exact merging)
EXACT_MERGE_DECIMALS = 9
#: a GW matrix's class-score rows are merged at these decimals by default (``gw-ldp.merge-decimals``)
MATRIX_MERGE_DECIMALS = 2
#: ``gw-ldp.merge-decimals`` that picks the decimals by the embedding (:func:`merge_decimals`)
AUTO_MERGE_DECIMALS = -1


def merge_decimals(setting: int, embedding: str) -> int:
    """The decimals embedding rows are merged at: ``setting``, or for :data:`AUTO_MERGE_DECIMALS`
    :data:`MATRIX_MERGE_DECIMALS` on class-score rows (``embedding`` "classes", whose coarse matrix
    keeps the converged one's accuracy: docs/results/gw-solver.md) and :data:`EXACT_MERGE_DECIMALS`
    on any other rows, whose coarse merge is not measured."""
    if setting != AUTO_MERGE_DECIMALS:
        return setting
    return MATRIX_MERGE_DECIMALS if embedding == "classes" else EXACT_MERGE_DECIMALS


def merge_duplicates(h: np.ndarray, decimals: int = EXACT_MERGE_DECIMALS) -> tuple[np.ndarray, np.ndarray]:
    """Distinct rows of ``h`` after rounding to ``decimals``, and their weights (multiplicity / n).

    Nodes with identical embeddings are at distance 0 from each other and
    equidistant from every other node, so the uniform metric-measure space of
    ``h`` and the space of its distinct rows weighted by multiplicity are
    weakly isomorphic: their GW discrepancy to any third space is the same
    (GW is 0 between them). LDP codes with ``m`` non-zeros in ``{-1,0,1}^d``
    have at most ``C(d,m) 2^m`` distinct rows, so this shrinks the GW problem
    from ``n`` to a handful of points.

    Float embeddings are compared after rounding to ``decimals``: at 9 (the
    default) that only merges rows of nodes with the same GNN colour, which can
    differ in the last float32 bits from the summation order. Fewer decimals
    put the rows on a grid of step ``10^-decimals``: each row moves by at most
    half a step per coordinate, and the nodes of a cell merge into one point
    whose weight is their total, a coarser approximation of the same measure
    with fewer points (a 2-class softmax row has at most ``10^decimals + 1``)."""
    h = np.round(np.asarray(h, dtype=np.float64), decimals)
    rows, counts = np.unique(h, axis=0, return_counts=True)
    return rows, counts / counts.sum()


def embedding_space(h: np.ndarray, merge: bool = True, features: bool = False,
                    decimals: int = EXACT_MERGE_DECIMALS) -> tuple:
    """(intra-distance matrix, node weights) of one graph's embedding: uniform
    weights over nodes, or over distinct rows (at ``decimals``, see
    :func:`merge_duplicates`) weighted by multiplicity.
    ``features=True`` appends the (distinct) rows themselves as node features
    for fused GW (:func:`gw_pair` with ``alpha < 1``); merging stays exact
    there because merged nodes also have equal features."""
    if merge:
        rows, w = merge_duplicates(h, decimals)
    else:
        rows = np.asarray(h, dtype=np.float64)
        w = np.full(len(rows), 1.0 / len(rows))
    return (intra_distance(rows), w, rows) if features else (intra_distance(rows), w)


def feature_cost(x1: np.ndarray, x2: np.ndarray) -> np.ndarray:
    """Squared Euclidean distances between the rows of ``x1`` and ``x2``: ``ot.dist``'s arithmetic
    (the same values, bit for bit) without its backend dispatch, which costs more than the
    arithmetic on a small graph's features."""
    c = -2 * np.dot(x1, x2.T)
    c += np.einsum("ij,ij->i", x1, x1)[:, None]
    c += np.einsum("ij,ij->i", x2, x2)[None, :]
    return np.maximum(c, 0)


def feature_costs(x1: np.ndarray, x2: np.ndarray, norms1: np.ndarray, norms2: np.ndarray) -> np.ndarray:
    """:func:`feature_cost` of each pair of a stack, ``x1`` ``(B, n, d)``, ``x2`` ``(B, k, d)``, with
    their rows' squared norms ``norms1``, ``norms2`` (each space's own ``einsum``): the same values."""
    c = -2 * np.matmul(x1, x2.transpose(0, 2, 1))
    c += norms1[:, :, None]
    c += norms2[:, None, :]
    return np.maximum(c, 0)


def gw_pair(c1: np.ndarray, c2: np.ndarray, p=None, q=None, max_iter: int = 10_000,
            x1=None, x2=None, alpha: float = 1.0, solver: str = "cg") -> float:
    """GW discrepancy (square loss; uniform node weights unless ``p``/``q``
    given) by POT's conditional gradient, ``ot.gromov.gromov_wasserstein2``
    (``solver="pot"``) or the same iteration without its per-call cost (``"cg"``).

    ``alpha < 1``: fused GW (Titouan et al.; the paper's base metric for graphs
    with node features), ``ot.gromov.fused_gromov_wasserstein2`` with feature
    cost ``M_ij = ||x1_i - x2_j||^2`` weighted ``1 - alpha`` and the structure
    term weighted ``alpha``. Plain GW only sees each graph's intra-distances and
    is blind to where the nodes sit (any isometry of the embedding space, e.g.
    swapping the two softmax classes, costs nothing); the feature term is not.
    """
    if solver not in GW_SOLVERS:
        raise ValueError(f"unknown GW solver {solver!r}; valid choices: " + ", ".join(GW_SOLVERS))
    p = np.full(c1.shape[0], 1.0 / c1.shape[0]) if p is None else np.asarray(p, dtype=np.float64)
    q = np.full(c2.shape[0], 1.0 / c2.shape[0]) if q is None else np.asarray(q, dtype=np.float64)
    m = None
    if alpha < 1.0:
        if x1 is None or x2 is None:
            raise ValueError(f"fused GW (alpha={alpha} < 1) needs node features of both graphs")
        m = feature_cost(np.asarray(x1, dtype=np.float64), np.asarray(x2, dtype=np.float64))
    if solver == "cg":
        return cg_discrepancy(c1, c2, p, q, m, float(alpha), max_iter)
    import ot

    if m is None:
        return float(ot.gromov.gromov_wasserstein2(c1, c2, p, q, "square_loss", symmetric=True,
                                                   max_iter=max_iter))
    return float(ot.gromov.fused_gromov_wasserstein2(m, c1, c2, p, q, "square_loss", symmetric=True,
                                                     alpha=float(alpha), max_iter=max_iter))


class _Space(NamedTuple):
    """A distinct space of a matrix and what it contributes to every pair it is in, computed once."""

    c: np.ndarray
    w: np.ndarray
    x: np.ndarray | None
    column: np.ndarray  # constC's term as a pair's first space (:func:`constant_terms`)
    row: np.ndarray  # ... and as its second
    norms: np.ndarray | None  # its features' squared norms (:func:`feature_cost`)


def _space(c: np.ndarray, w: np.ndarray, x: np.ndarray | None) -> _Space:
    return _Space(c, w, x, *constant_terms(c, w), None if x is None else np.einsum("ij,ij->i", x, x))


_POOL_SPACES: list = []


def _stack_values(stack: list, max_iter: int, alpha: float, solver: str) -> list[tuple[int, int, float]]:
    """``(i, j, GW)`` of a stack of pairs whose spaces have equal sizes: POT per pair (``solver="pot"``)
    or :func:`cg_discrepancies` on the whole stack."""
    sp_ = _POOL_SPACES
    if solver != "cg":
        return [(i, j, gw_pair(sp_[i].c, sp_[j].c, sp_[i].w, sp_[j].w, max_iter, sp_[i].x, sp_[j].x, alpha, solver))
                for i, j in stack]
    first, second = [sp_[i] for i, _ in stack], [sp_[j] for _, j in stack]

    def stacked(spaces: list, field: str) -> np.ndarray:
        return np.stack([getattr(s, field) for s in spaces])

    m = None if alpha >= 1.0 else feature_costs(stacked(first, "x"), stacked(second, "x"),
                                                 stacked(first, "norms"), stacked(second, "norms"))
    const = stacked(first, "column") + stacked(second, "row")
    values = cg_discrepancies(stacked(first, "c"), stacked(second, "c"), stacked(first, "w"), stacked(second, "w"),
                              const, m, alpha, max_iter)
    return [(i, j, v) for (i, j), v in zip(stack, values.tolist())]


def _gw_chunk(args) -> list[tuple[int, int, float]]:
    """The values of a chunk of stacks, on one BLAS thread (the same arithmetic in every process)."""
    from threadpoolctl import threadpool_limits

    stacks, max_iter, alpha, solver = args
    with threadpool_limits(limits=1):
        return [r for stack in stacks for r in _stack_values(stack, max_iter, alpha, solver)]


def _pool_init(spaces) -> None:
    """Worker start: receive the spaces; leave Ctrl-C to the parent (which
    terminates the pool) and die with the parent even if it is SIGKILLed."""
    import ctypes
    import signal

    global _POOL_SPACES
    _POOL_SPACES = spaces
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not the parent's handler: terminate() must just end us
    try:
        ctypes.CDLL("libc.so.6").prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:  # not Linux/glibc: the pool's terminate() on exit still applies
        pass


class _TermAsInterrupt:
    """While active (main thread only), SIGTERM raises KeyboardInterrupt so the
    ``with Pool`` block exits through ``terminate()`` instead of orphaning
    its workers."""

    def __enter__(self):
        import signal
        import threading

        self.old = None
        if threading.current_thread() is threading.main_thread():
            self.old = signal.signal(signal.SIGTERM, self._raise)
        return self

    @staticmethod
    def _raise(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    def __exit__(self, *exc):
        import signal

        if self.old is not None:
            signal.signal(signal.SIGTERM, self.old)
        return False


def gw_matrix(spaces: Sequence, workers: int = 2, max_iter: int = 10_000,
              stats: dict | None = None, alpha: float = 1.0, solver: str = "cg") -> np.ndarray:
    """Symmetric matrix of GW discrepancies between all pairs (zero diagonal).

    ``spaces``: per item a distance matrix (uniform weights), a pair
    ``(distance matrix, weights)`` or a triple ``(distance, weights, node
    features)`` (needed for fused GW, ``alpha < 1``, see :func:`gw_pair`).
    Items with identical spaces get 0 (the exact value) and each distinct pair
    of spaces is solved once with :func:`gw_pair` (``solver``), in ``workers``
    processes (0 = all cores); pairs of spaces of equal sizes are solved in
    stacks (:func:`_stacks`), dealt to the workers in cost-balanced chunks,
    and the matrix is the same for every ``workers``. The pool is terminated on any exception,
    Ctrl-C or SIGTERM, and its workers die with the parent. ``stats``
    (optional dict) receives ``pairs``, ``distinct_spaces`` and
    ``solved_pairs``.
    """
    items = [_as_item(s, alpha) for s in spaces]
    uniq, which = _distinct(items)
    uniq = [_space(*item) for item in uniq]
    u = len(uniq)
    small = np.zeros((u, u))
    iu, ju = np.triu_indices(u, k=1)
    if stats is not None:
        stats.update({"pairs": len(items) * (len(items) - 1) // 2, "distinct_spaces": u, "solved_pairs": int(iu.size)})
    if iu.size:
        sizes = np.array([s.c.shape[0] for s in uniq], dtype=np.int64)
        order = np.argsort(-(sizes[iu] * sizes[ju]), kind="stable")
        stacks = _stacks(sizes, zip(iu[order].tolist(), ju[order].tolist()))
        for i, j, v in _solve(uniq, stacks, workers, max_iter, alpha, solver):
            small[i, j] = small[j, i] = v
    return small[np.ix_(which, which)]


def _as_item(space, alpha: float) -> tuple:
    """``(distance, weights, features or None)`` of one item of :func:`gw_matrix` (float64,
    contiguous; uniform weights when none are given; features only for fused GW)."""
    space = space if isinstance(space, tuple) else (space, None)
    c, w = space[0], space[1]
    x = space[2] if len(space) > 2 else None
    c = np.ascontiguousarray(c, dtype=np.float64)
    w = np.full(c.shape[0], 1.0 / c.shape[0]) if w is None else np.ascontiguousarray(w, dtype=np.float64)
    if alpha >= 1.0:
        return c, w, None
    if x is None:
        raise ValueError(f"fused GW (alpha={alpha} < 1) needs (distance, weights, features) per item")
    return c, w, np.ascontiguousarray(x, dtype=np.float64)


def _distinct(items: list) -> tuple[list, np.ndarray]:
    """The distinct items (by their bytes) and, per item, the index of its distinct one."""
    index: dict[bytes, int] = {}
    uniq, which = [], np.empty(len(items), dtype=np.int64)
    for t, (c, w, x) in enumerate(items):
        key = c.shape[0].to_bytes(4, "little") + c.tobytes() + w.tobytes() + (b"" if x is None else x.tobytes())
        if key not in index:
            index[key] = len(uniq)
            uniq.append((c, w, x))
        which[t] = index[key]
    return uniq, which


def _stacks(sizes: np.ndarray, pairs) -> list[list[tuple[int, int]]]:
    """``pairs`` (largest first) grouped by the sizes of their two spaces into stacks of at most
    :data:`STACK_ENTRIES` entries (one pair at least), the most costly stacks first."""
    groups: dict[tuple[int, int], list] = {}
    for i, j in pairs:
        groups.setdefault((int(sizes[i]), int(sizes[j])), []).append((i, j))
    stacks = []
    for (n, k), group in groups.items():
        step = max(1, STACK_ENTRIES // (n * k))
        stacks += [(len(group[s:s + step]) * n * k, group[s:s + step]) for s in range(0, len(group), step)]
    return [stack for _, stack in sorted(stacks, key=lambda cs: -cs[0])]


def _solve(uniq: list, stacks: list, workers: int, max_iter: int, alpha: float,
           solver: str) -> list[tuple[int, int, float]]:
    """``(i, j, GW)`` of every pair of ``stacks``, in this process for few pairs or one worker, else
    in a pool of ``workers`` processes (0 = all cores) fed cost-balanced chunks of stacks."""
    global _POOL_SPACES
    workers = int(workers) or (os.cpu_count() or 1)
    if workers <= 1 or sum(map(len, stacks)) < 256:
        _POOL_SPACES = uniq
        return _gw_chunk((stacks, max_iter, alpha, solver))
    import multiprocessing as mp

    chunks = workers * 16
    parts = [(stacks[c::chunks], max_iter, alpha, solver) for c in range(chunks)]
    with _TermAsInterrupt(), mp.get_context("fork").Pool(workers, _pool_init, (uniq,)) as pool:
        return [r for part in pool.imap_unordered(_gw_chunk, parts) for r in part]
