"""One (fused) Gromov-Wasserstein discrepancy by POT's conditional gradient, without its per-call cost.

``ot.gromov.gromov_wasserstein2`` and ``fused_gromov_wasserstein2`` (square loss, symmetric
structure matrices) run the Frank-Wolfe iteration of Titouan et al. (2019): from the product
coupling ``G = p q^T``, each step linearises the objective, solves the linear program
``Gc = argmin <M_i, T>`` over the couplings (POT's network simplex, ``emd_c``), and moves to
``G + t (Gc - G)`` with the exact line search of the quadratic objective; it stops when the
objective changes by less than ``tol_rel`` (relative) or ``tol_abs``. On the small graphs of
graph collections (20 to 40 nodes), a pair costs POT about 2 to 9 ms, most of it around the
linear programs rather than in them: array-backend dispatch, input checks, the dual potentials'
post-processing, and the gradients with respect to the inputs that ``*2`` computes for automatic
differentiation after the solve. :func:`cg_discrepancy` is that iteration with the same arithmetic
in the same order (the same products, sums and linear programs), so it returns POT's value to the
last bit (tests/test_gw_solver.py checks pairs of graphs against POT) in 1.4 to 3 times less CPU
time (``benchmarks/gw_solver.py``); what remains is mostly the linear programs, which both share.
:func:`cg_discrepancies` runs the same iteration on a stack of pairs of equal shapes, one array
operation per step for the whole stack and one linear program per pair, and returns the same values
bit for bit: on a graph collection's many small spaces the per-call cost of the array operations,
not the arithmetic, is most of a pair's time.

A GW matrix stops each pair's iteration after :data:`MATRIX_CG_ITERATIONS` linear programs by
default: the first steps move the coupling most, and on PROTEINS and IMDB-BINARY the SVC on the
matrix classifies as well as on the converged one in a fraction of POT's CPU time
(``docs/results/gw-solver.md``). The value is the objective at the iteration's last coupling: an upper bound of the
discrepancy, never below the converged iteration's value (each exact line search can only lower
the objective), and still a function of the pair alone.
"""

from __future__ import annotations

import numpy as np

#: POT's default cap on the network simplex's iterations per linear program
EMD_MAX_ITER = 100_000
#: a GW matrix's conditional-gradient iterations (linear programs) per pair by default
MATRIX_CG_ITERATIONS = 2
#: how a GW matrix solves its pairs: ``cg`` (:func:`cg_discrepancy`) or ``pot`` (``ot.gromov.*2`` itself)
GW_SOLVERS = ("cg", "pot")


def _line_search(a: float, b: float) -> float:
    """The step in [0, 1] minimising ``a t^2 + b t`` (POT's ``solve_1d_linesearch_quad``)."""
    if a > 0:
        return min(1.0, max(0.0, -b / (2.0 * a)))
    return 1.0 if a + b < 0 else 0.0


def constant_terms(c: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The rank-one terms of ``constC`` a space ``(c, w)`` gives as the first space of a pair (column
    ``c^2 w``) and as the second (row ``w^T (c^2)^T``): POT's products of ones, per space once."""
    sq = c * c
    return np.dot(sq, w.reshape(-1, 1)), np.dot(w.reshape(1, -1), sq.T)


def cg_discrepancy(c1: np.ndarray, c2: np.ndarray, p: np.ndarray, q: np.ndarray, m: np.ndarray | None = None,
                   alpha: float = 1.0, max_iter: int = 10_000, tol_rel: float = 1e-9, tol_abs: float = 1e-9) -> float:
    """GW discrepancy of ``(c1, p)`` and ``(c2, q)`` (square loss, symmetric ``c1``, ``c2``; float64,
    C-contiguous), or with a feature cost ``m`` and ``alpha < 1`` the fused one,
    ``(1 - alpha) <m, T> + alpha sum L(c1, c2) T T``: POT's conditional gradient, its value.

    With ``f(a) = a^2``, ``h2(b) = 2b``: ``constC = c1^2 p 1^T + 1 q^T (c2^2)^T``, the tensor product
    ``L x T = constC - c1 T (2 c2)^T``, the objective ``<lin, T> + reg <L x T, T>`` and its gradient
    ``lin + 2 reg L x T`` (``lin = (1 - alpha) m``, ``reg = alpha``; plain GW: 0 and 1)."""
    const = constant_terms(c1, p)[0] + constant_terms(c2, q)[1]  # POT's products of ones, the same values
    return float(cg_discrepancies(c1[None], c2[None], p[None], q[None], const[None], None if m is None else m[None],
                                  alpha, max_iter, tol_rel, tol_abs)[0])


def _sums(a: np.ndarray) -> np.ndarray:
    """Per pair of a stack, ``np.sum`` of its matrix (the same pairwise summation over its entries)."""
    return a.reshape(a.shape[0], -1).sum(axis=1)


def _tensors(const: np.ndarray, h1: np.ndarray, g: np.ndarray, h2t: np.ndarray) -> np.ndarray:
    """``L x T = constC - c1 T (2 c2)^T`` of every pair of a stack."""
    return const + (-np.matmul(np.matmul(h1, g), h2t))


def cg_discrepancies(c1: np.ndarray, c2: np.ndarray, p: np.ndarray, q: np.ndarray, const: np.ndarray,
                     m: np.ndarray | None = None, alpha: float = 1.0, max_iter: int = 10_000,
                     tol_rel: float = 1e-9, tol_abs: float = 1e-9) -> np.ndarray:
    """:func:`cg_discrepancy` of each pair of a stack, ``c1`` ``(B, n, n)``, ``c2`` ``(B, k, k)``, ``p``
    ``(B, n)``, ``q`` ``(B, k)``, ``m`` ``(B, n, k)`` or None, with ``const`` ``(B, n, k)`` the pairs'
    ``constC`` (:func:`constant_terms` added): the same operations per pair, so the same values bit for
    bit. A pair whose objective has stopped changing leaves the stack; the others go on."""
    from ot.lp.emd_wrap import emd_c  # POT's network simplex, as ot.emd calls it

    h2t = (2 * c2).transpose(0, 2, 1)
    fused = m is not None
    lin, reg = ((1 - alpha) * m, alpha) if fused else (0.0, 1.0)
    g = p[:, :, None] * q[:, None, :]
    tensor = _tensors(const, c1, g, h2t)
    cost = _sums(lin * g) + reg * _sums(tensor * g) if fused else _sums(tensor * g)
    b = q * p.sum(1)[:, None] / q.sum(1)[:, None]  # ot.emd's mass balance
    live = np.arange(len(c1))
    for it in range(max_iter):
        if it:
            tensor = _tensors(const[live], c1[live], g[live], h2t[live])
        target = lin[live] + reg * (2 * tensor) if fused else 2 * tensor
        vertex = np.stack([emd_c(p[k], b[k], target[t], EMD_MAX_ITER, 1, None, None)[0] for t, k in enumerate(live)])
        at, old = g[live], cost[live]
        delta = vertex - at
        dot = np.matmul(np.matmul(c1[live], delta), h2t[live])
        a_ = -reg * _sums(dot * delta)
        b_ = (_sums(lin[live] * delta) if fused else 0.0) - 2 * reg * _sums(dot * at)
        step = np.array([_line_search(a, b) for a, b in zip(a_.tolist(), b_.tolist())])
        cost[live] = new = old + a_ * (step ** 2) + b_ * step
        g[live] = at + step[:, None, None] * delta
        change = np.abs(new - old)
        with np.errstate(divide="ignore", invalid="ignore"):
            live = live[~((change < tol_abs) | ((new != 0.0) & (change / np.abs(new) < tol_rel)))]
        if not live.size:
            break
    return cost
