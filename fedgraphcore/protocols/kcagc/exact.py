"""kCAGC exact mode (``kcagc.mode = exact``): centralised AGC over vertically split features.

Setting as in :mod:`fedgraphcore.protocols.kcagc`: L parties hold the feature columns ``X^l``
of the same n nodes and the whole graph. Centralised AGC (:func:`fedgraphcore.graph_filters.agc`)
clusters the top-``dim`` left singular vectors of ``F = G^psi X = [F_1 ... F_L]``
with ``F_l = G^psi X^l`` (``dim = min(k, columns)``), i.e. the top eigenvectors of

    ``F F^T = sum_l F_l F_l^T``,

an n x n operator nobody forms: the server applies it to an n x b block ``Y`` it
chooses by one secure sum of the parties' ``F_l (F_l^T Y)`` (:func:`gram_product`),
and runs block Krylov (:func:`fedgraphcore.protocols.fedspectral.block_iteration.block_krylov_iteration`)
on ``M = F F^T / c`` with ``c = ||F||_F^2 >= ||F||_2^2`` (so ``||M||_2 <= 1``, the
solver's scale for its residual tolerance). k-means on the embedding rows follows,
as in the reference (no row normalisation, k-means++ with ``N_INIT`` restarts, the run's seed).

Filter order: a fixed psi (``kcagc.filter-order`` > 0, or the paper's value for its
datasets) is used as it is. AGC's adaptive rule (``order=None``: other datasets, or
``kcagc.filter-order = -1``) is run exactly as the reference runs it, on the pooled
columns: for psi = 1, 2, ... the embedding of ``G^psi X``, its k-means labels, and
the intra-cluster distance of ``G^psi X`` under them (:func:`intra_part`, additive over
column blocks, so one secure sum of one scalar per party); the first psi whose
distance exceeds the previous one's ends the search with the previous labels
(:class:`AdaptiveOrder`). Each psi costs one eigensolve and one more round.

Secure-sum bounds (honest from what a party holds):

* squared norm ``||F_l||_F^2`` of the first order used: ``||G||_2 <= 1`` for both filters, so
  it is at most ``||X^l||_F^2 <= n * secagg.bound`` when no row of ``X^l`` has a squared norm
  above ``secagg.bound`` (:func:`norm_bound`); a party over it stops the run;
* product ``F_l (F_l^T Y)``: ``|e_i^T F_l F_l^T y| <= ||F_l||_2^2 ||y||_2 <= ||F_l||_F^2 ||y||_2``,
  so ``c * max_j ||y_j||`` bounds every party's entries (:func:`product_bound`; the filter
  only shrinks the norm as psi grows). The server scales ``Y`` by a power of two so that
  this bound lies in ``(2^31, 2^32]`` (:func:`wire_scale`): the secure sum then uses the
  64-bit ring at its finest scale, an absolute error of at most ``L 2^-32`` on entries up to
  ``2^32`` (``L 2^-64`` relative), far below the solver's tolerance;
* intra-cluster distance part: at most ``2 ||F_l||_F^2 <= 2 c`` (:func:`intra_bound`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from fedgraphcore.protocols.fedspectral.block_iteration import IterationResult, block_krylov_iteration
from fedgraphcore.wire import ArraySpec, ReplySpec, ValueSpec

#: The wire step of exact mode; its ``stage`` value says which part: ``norm``, ``product`` or ``intra``.
KCAGC_EXACT = "kcagc_exact"
STAGES = ("norm", "product", "intra")

#: ``kcagc.mode`` values: ``exact`` (centralised AGC by secure Gram products) and ``paper`` (Protocol 3).
MODES = ("exact", "paper")

#: Stop when every top-dim Ritz pair of ``M = F F^T / c`` has residual at most this
#: (ARPACK's tolerance in the reference is 1e-10 on the singular triplets).
TOL = 1e-9
#: Products per eigensolve at most (block Krylov with thick restarts).
MAX_ROUNDS = 1000
#: k-means++ restarts on the embedding rows: the reference's (``fedgraphcore.graph_filters.agc``).
N_INIT = 10
#: The declared product bound is scaled into ``(2^(WIRE_BITS - 1), 2^WIRE_BITS]``.
WIRE_BITS = 32


def norm_reply(secure: bool) -> ReplySpec:
    """``norm``: ``s`` (1 value, masked integers when ``secure``), the party's ``||F_l||_F^2``, and
    ``cols``, its number of feature columns (in clear)."""
    return ReplySpec(arrays={"s": ArraySpec((1,), kind="u" if secure else "f", masked=secure)},
                     numbers={"cols": ValueSpec(whole=True, low=1)})


def product_reply(n: int, b: int, secure: bool) -> ReplySpec:
    """``product``: ``p`` (n x b), the party's ``F_l (F_l^T Y)``, masked integers when ``secure``."""
    return ReplySpec(arrays={"p": ArraySpec((n, b), kind="u" if secure else "f", masked=secure)})


def intra_reply(secure: bool) -> ReplySpec:
    """``intra``: ``d`` (1 value), the party's part of the intra-cluster distance, masked when ``secure``."""
    return ReplySpec(arrays={"d": ArraySpec((1,), kind="u" if secure else "f", masked=secure)})


# -- party side ---------------------------------------------------------------------------------
def filtered_block(x, adj, order: int, kind: str = "agc", start: tuple[int, np.ndarray] | None = None) -> np.ndarray:
    """``F_l = G^order X^l`` (dense n x f_l), by sparse products; ``start = (psi, G^psi X^l)`` with
    ``psi <= order`` continues from a block already filtered ``psi`` times."""
    from fedgraphcore.graph_filters import agc_filter_matrix, low_pass_filter

    if start is None or start[0] > order:
        return low_pass_filter(x, adj, order, kind)
    psi, f = start
    g = agc_filter_matrix(adj, kind)
    for _ in range(order - psi):
        f = g @ f
    return np.asarray(f)


def gram_product(f: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``F_l (F_l^T Y)``: this party's term of ``F F^T Y`` (two thin products, never n x n)."""
    return f @ (f.T @ np.asarray(y, dtype=np.float64))


def squared_norm(f: np.ndarray) -> float:
    """``||F_l||_F^2``: this party's term of ``c = ||F||_F^2``."""
    return float(np.einsum("ij,ij->", f, f))


def intra_part(f: np.ndarray, labels: np.ndarray) -> float:
    """This party's term of AGC's intra-cluster distance of ``F`` under ``labels``
    (:func:`fedgraphcore.graph_filters.agc_intra_distance` on its own columns: that distance sums
    squared norms over columns, so the parties' terms add up to the pooled one)."""
    from fedgraphcore.graph_filters import agc_intra_distance

    return agc_intra_distance(f, np.asarray(labels, dtype=np.int64))


def norm_bound(n: int, row_bound: float) -> float:
    """The largest ``||F_l||_F^2`` a party may contribute: ``n`` rows of squared norm at most ``row_bound``."""
    return float(n) * float(row_bound)


def product_bound(total_sq_norm: float, y: np.ndarray) -> float:
    """Largest |entry| of any party's ``F_l (F_l^T Y)`` when ``||F_l||_F^2 <= total_sq_norm``: ``c max_j ||y_j||``."""
    norms = np.linalg.norm(np.asarray(y, dtype=np.float64), axis=0)
    return float(total_sq_norm) * float(norms.max(initial=0.0))


def intra_bound(total_sq_norm: float) -> float:
    """Largest intra-distance part of a party with ``||F_l||_F^2 <= total_sq_norm``:
    ``(2/k) sum_c mean_{i in c} ||f_i||^2 <= 2 ||F_l||_F^2``."""
    return 2.0 * float(total_sq_norm)


def wire_scale(bound: float) -> float:
    """Power of two ``t`` with ``t * bound`` in ``(2^(WIRE_BITS-1), 2^WIRE_BITS]``: the server sends ``t Y``
    (exact in floating point) so that the declared bound always picks the 64-bit ring."""
    if not (math.isfinite(bound) and bound > 0):
        raise ValueError(f"product bound must be finite and > 0, got {bound}")
    return 2.0 ** (WIRE_BITS - math.ceil(math.log2(bound)))


# -- server side --------------------------------------------------------------------------------
def embedding_labels(u: np.ndarray, k: int, seed: int) -> np.ndarray:
    """k-means on the embedding rows, as the reference does (k-means++, ``N_INIT`` restarts, no row scaling)."""
    from fedgraphcore.clustering import kmeans

    return kmeans(u, k, seed, n_init=N_INIT)


def block_width(n: int, dim: int) -> int:
    """Krylov block b: 2 dim columns, capped at n (at least dim)."""
    return max(dim, min(2 * dim, n))


def top_embedding(apply: Callable[[np.ndarray], np.ndarray], n: int, dim: int, seed: int,
                  tol: float = TOL, max_rounds: int = MAX_ROUNDS) -> IterationResult:
    """Top-``dim`` eigenvectors of ``M`` (``||M||_2 <= 1``) from products ``apply(Y) = M Y``."""
    return block_krylov_iteration(apply, n, dim, block_width(n, dim), tol, max_rounds, seed)


@dataclass
class AdaptiveOrder:
    """AGC's adaptive filter order (as :func:`fedgraphcore.graph_filters.agc` runs it): fed the labels and
    intra-cluster distance of psi = 1, 2, ..., it stops at the first psi whose distance exceeds
    the previous one's, keeping the previous psi and its labels, or after ``max_order``."""

    max_order: int
    order: int = 0
    labels: np.ndarray | None = None
    intra: float = math.inf
    history: list[float] = field(default_factory=list)

    def feed(self, psi: int, labels: np.ndarray, intra: float) -> bool:
        """Record psi's result; True when the search is over (``order``, ``labels`` hold the answer)."""
        self.history.append(float(intra))
        if intra > self.intra:
            return True
        self.order, self.labels, self.intra = psi, labels, float(intra)
        return psi >= self.max_order


@dataclass
class ExactOutcome:
    """What :func:`exact_agc` found: labels, the filter order used, one solver result per order tried."""

    labels: np.ndarray
    order: int
    solves: list[IterationResult]
    intra: list[float]


def exact_agc(product: Callable[[int, np.ndarray], np.ndarray], intra: Callable[[int, np.ndarray], float],
              n: int, k: int, dim: int, seed: int, order: int | None, max_order: int,
              tol: float = TOL, max_rounds: int = MAX_ROUNDS) -> ExactOutcome:
    """Centralised AGC driven through the two sums the parties supply: ``product(psi, Y)`` is
    ``M Y`` for the order-``psi`` operator ``M = F F^T / c``, ``intra(psi, labels)`` the pooled
    intra-cluster distance of ``G^psi X`` (adaptive order only). ``order=None``: AGC's adaptive rule."""
    def labels_at(psi: int) -> tuple[np.ndarray, IterationResult]:
        solve = top_embedding(lambda y: product(psi, y), n, dim, seed, tol, max_rounds)
        return embedding_labels(solve.vectors, k, seed), solve

    if order is not None:
        labels, solve = labels_at(order)
        return ExactOutcome(labels, order, [solve], [])
    search, solves = AdaptiveOrder(max_order), []
    for psi in range(1, max_order + 1):
        labels, solve = labels_at(psi)
        solves.append(solve)
        if search.feed(psi, labels, intra(psi, labels)):
            break
    return ExactOutcome(search.labels, search.order, solves, search.history)
