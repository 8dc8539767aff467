"""Top-k eigenvectors of a symmetric operator ``M`` known only through products ``apply(X) = M X``
(for FedSpectral+ exact mode, one federated round each): block Krylov (block Lanczos with
Rayleigh-Ritz over the whole Krylov basis, stopping on the Ritz residuals,
:func:`block_krylov_iteration`) and Chebyshev-filtered orthogonal iteration on one block (stopping
when the top-k Ritz subspace stops moving, :func:`chebyshev_subspace_iteration`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np


def init_block(n: int, b: int, seed: int) -> np.ndarray:
    """Seeded random orthonormal N x b block (QR of a Gaussian matrix)."""
    if b > n:
        raise ValueError(f"block of {b} columns does not fit {n} nodes")
    rng = np.random.default_rng([int(seed), 0x5EC7])
    return orthonormalise(rng.standard_normal((n, b)))


def orthonormalise(x: np.ndarray) -> np.ndarray:
    """Q of the thin QR decomposition (``numpy.linalg.qr``, as in the paper)."""
    q, _ = np.linalg.qr(np.asarray(x, dtype=np.float64))
    return q


def ritz(v: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rayleigh-Ritz on span(v) (v orthonormal, w = M v): Ritz values in
    decreasing order and the k x k rotation ``S`` (Ritz vectors ``v @ S``)."""
    h = v.T @ w
    theta, s = np.linalg.eigh((h + h.T) * 0.5)
    return theta[::-1], s[:, ::-1]


def subspace_distance(u: np.ndarray, u_prev: np.ndarray) -> float:
    """Sine of the largest principal angle between span(u) and span(u_prev)
    (both orthonormal, same width): ``||(I - P P^T) U||_2``."""
    e = u - u_prev @ (u_prev.T @ u)
    g = e.T @ e
    return float(math.sqrt(max(0.0, float(np.linalg.eigvalsh((g + g.T) * 0.5)[-1]))))


@dataclass
class IterationResult:
    """Outcome of :func:`block_krylov_iteration` / :func:`chebyshev_subspace_iteration`."""

    vectors: np.ndarray  # N x k top Ritz vectors (orthonormal)
    values: np.ndarray  # their Ritz values (decreasing)
    rounds: int  # products M X used (= federated rounds)
    converged: bool
    stop: str  # "converged" | "stagnated" | "max-rounds"
    history: list[dict] = field(default_factory=list)
    norms: np.ndarray | None = None  # the final Ritz residual norms (block Krylov), one per vector


@dataclass
class StopRule:
    """When an iteration stops, from one error measure a round: "converged" at or
    below ``tol``; "stagnated" when the measure has not halved for ``patience``
    rounds, because the products carry noise (fixed-point rounding of secure
    aggregation, DP noise). ``None``: go on."""

    tol: float
    patience: int
    best: float = math.inf
    since_best: int = 0

    def __call__(self, value: float) -> str | None:
        if value <= self.tol:
            return "converged"
        if math.isfinite(value):
            if value < 0.5 * self.best:
                self.best, self.since_best = value, 0
            else:
                self.since_best += 1
                if self.since_best >= self.patience:
                    return "stagnated"
        return None


def chebyshev_subspace_iteration(apply: Callable[[np.ndarray], np.ndarray], n: int, k: int, block: int, degree: int,
                                 tol: float, max_rounds: int, seed: int, lower: float = -1.0,
                                 patience: int = 8,
                                 settled: Callable[[np.ndarray, np.ndarray | None], bool] = lambda theta, norms: False
                                 ) -> IterationResult:
    """Top-k eigenvectors of a symmetric ``M`` with spectrum in ``[lower, 1]``,
    given only ``apply(X) = M X`` (one call = one federated round).

    Orthogonal iteration on a block of ``block >= k`` columns with a Chebyshev
    filter: each cycle starts from an orthonormal ``V``, gets ``W = M V``
    (Rayleigh-Ritz: Ritz values ``theta``), then applies the degree-``degree``
    Chebyshev polynomial that is bounded by 1 on the unwanted interval
    ``[lower, theta_block]`` and grows fast above it (``degree - 1`` more
    products), and re-orthonormalises (QR). ``degree=1`` is plain shifted
    orthogonal iteration. Stops when the top-k Ritz subspace moves less than
    ``tol`` (sine of the largest principal angle) between cycles
    ("converged"), when that distance has not halved for ``patience`` cycles
    because the products carry noise (fixed-point rounding of secure
    aggregation, DP noise: "stagnated"), before a cycle would exceed
    ``max_rounds`` products ("max-rounds"), or once ``settled(theta, None)`` says the
    caller has what it needs from the Ritz values ("settled"; each is at most its eigenvalue).
    """
    _check_block(k, block, n)
    if degree < 1:
        raise ValueError(f"Chebyshev degree must be >= 1, got {degree}")
    v = init_block(n, block, seed)
    rounds, history, prev_u, stop_rule = 0, [], None, StopRule(tol, patience)
    stop = "max-rounds"
    while True:
        w = apply(v)
        rounds += 1
        theta, s = ritz(v, w)
        u = v @ s[:, :k]
        dist = math.inf if prev_u is None else subspace_distance(u, prev_u)
        history.append({"round": rounds, "subspace_change": None if prev_u is None else dist,
                        "ritz_k": float(theta[k - 1]), "ritz_cut": float(theta[-1])})
        prev_u = u
        verdict = "settled" if settled(theta, None) else stop_rule(dist)
        if verdict:
            stop = verdict
            break
        if rounds + degree > max_rounds:
            break
        v = orthonormalise(chebyshev_filter(apply, v, w, float(theta[-1]), lower, degree))
        rounds += degree - 1
    theta_k = theta[:k]
    return IterationResult(u, theta_k, rounds, stop == "converged", stop, history)


def chebyshev_filter(apply: Callable[[np.ndarray], np.ndarray], v: np.ndarray, w: np.ndarray, hi: float,
                     lower: float, degree: int) -> np.ndarray:
    """``T(M) V`` for the degree-``degree`` Chebyshev polynomial ``T`` bounded by 1 on ``[lower, hi]``
    (the unwanted part of the spectrum) and growing fast above it, from ``W = M V``: ``degree - 1``
    more products ``apply``."""
    if hi <= lower:  # degenerate block; fall back to the shifted power step
        hi = lower + 1e-3
    c, e = (hi + lower) * 0.5, (hi - lower) * 0.5
    y_prev, y = v, (w - c * v) / e
    for _ in range(degree - 1):
        y_prev, y = y, 2.0 * (apply(y) - c * y) / e - y_prev
    return y


def _check_block(k: int, block: int, n: int) -> None:
    if not 1 <= k <= block <= n:
        raise ValueError(f"need 1 <= k <= block <= n, got k={k}, block={block}, n={n}")


def top_eigenpairs(h: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``count`` largest eigenpairs of the symmetric ``h``, in decreasing order
    (LAPACK computes only those eigenvectors)."""
    from scipy.linalg import eigh  # server side only: the client's import stays light

    m = h.shape[0]
    theta, s = eigh(h, subset_by_index=[m - min(count, m), m - 1])
    return theta[::-1], s[:, ::-1]


class KrylovBasis:
    """Orthonormal N x m basis kept as a list of column blocks (appending a block
    copies nothing; at a million nodes every column is 8 MB)."""

    def __init__(self, n: int):
        self.n, self.blocks = n, []

    @property
    def width(self) -> int:
        return sum(q.shape[1] for q in self.blocks)

    def combine(self, s: np.ndarray) -> np.ndarray:
        """``Q s`` (N x s.shape[1])."""
        out, row = np.zeros((self.n, s.shape[1])), 0
        for q in self.blocks:
            out += q @ s[row:row + q.shape[1]]
            row += q.shape[1]
        return out

    def project_out(self, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(C, F)`` with ``w = Q C + F`` and ``F`` orthogonal to the basis
        (classical Gram-Schmidt twice, which keeps ``F`` orthogonal to working
        precision)."""
        f, c = np.array(w, dtype=np.float64), np.zeros((self.width, w.shape[1]))
        for _ in range(2):
            row = 0
            for q in self.blocks:
                part = q.T @ f
                f -= q @ part
                c[row:row + q.shape[1]] += part
                row += q.shape[1]
        return c, f

    def restart(self, h: np.ndarray, keep: int) -> np.ndarray:
        """Thick restart (Krylov-Schur): the top ``keep`` Ritz vectors of ``h = Q^T M Q`` become the
        basis; returns the new ``h``, their Ritz values on the diagonal."""
        theta, s = top_eigenpairs(h, keep)
        self.blocks = [self.combine(s)]
        return np.diag(theta)

    def extend(self, f: np.ndarray, width: int, rng: np.random.Generator,
               floor: float = 1e-12) -> tuple[np.ndarray, np.ndarray]:
        """Next block: ``(P, R)`` with ``P`` (N x ``width``) orthonormal and orthogonal
        to the basis, and ``f = P R`` up to directions below ``floor``.

        ``f`` (orthogonal to the basis) is orthonormalised through its SVD;
        directions it does not reach (singular value <= ``floor``: the basis
        already holds an invariant subspace there) are filled with random ones
        orthogonal to everything so far, whose rows of ``R`` are zero."""
        u, sv, vt = np.linalg.svd(f, full_matrices=False)
        good = min(int(np.sum(sv > floor)), width)
        p, r = u[:, :good], np.zeros((width, f.shape[1]))
        r[:good] = sv[:good, None] * vt[:good]
        if good < width:
            fill = rng.standard_normal((self.n, width - good))
            _, fill = self.project_out(fill)
            fill -= p @ (p.T @ fill)
            p = np.hstack([p, orthonormalise(fill)])
        return p, r


def block_krylov_iteration(apply: Callable[[np.ndarray], np.ndarray], n: int, k: int, block: int, tol: float,
                           max_rounds: int, seed: int, basis_blocks: int = 20, patience: int = 16,
                           on_round: Callable[[dict], None] = lambda entry: None,
                           settled: Callable[[np.ndarray, np.ndarray], bool] = lambda theta, norms: False
                           ) -> IterationResult:
    """Top-k eigenvectors of a symmetric ``M`` with ``||M||_2 <= 1``, given only
    ``apply(X) = M X`` (one call = one federated round).

    Block Lanczos with full reorthogonalisation and Rayleigh-Ritz: round j
    multiplies the newest orthonormal block ``Q_j``; the server keeps the basis
    ``Q = [Q_0 .. Q_j]`` and ``H = Q^T M Q`` (the coefficients of ``M Q_j`` on
    the basis), and orthogonalises ``M Q_j`` against the basis into the next
    block, ``Q_{j+1} R``. So after j rounds the basis spans the block Krylov space
    ``{V, M V, .., M^(j-1) V}``, and Rayleigh-Ritz picks from it the best
    approximation any polynomial of degree j - 1 in ``M`` (Chebyshev filters
    included) could give. ``M Q = Q H + Q_{j+1} R E_j^T``, so a Ritz pair
    ``(theta, Q s)`` has residual ``||M Q s - theta Q s|| = ||R s_j||`` (``s_j`` the
    rows of ``s`` on ``Q_j``): the server computes it from the products it has.

    Stops when the top-k residuals are all <= ``tol`` ("converged"), when the
    largest has not halved for ``patience`` rounds because the products carry
    noise (fixed-point rounding of secure aggregation, DP noise: "stagnated"),
    after ``max_rounds`` rounds ("max-rounds"), or once ``settled(theta, norms)`` says the caller has
    what it needs from the top-k Ritz values and their residual norms ("settled": each Ritz value only
    grows towards its eigenvalue as the basis grows, and has an eigenvalue within its residual norm);
    ``on_round`` gets each round's history.
    Before the Krylov space reaches the top-k eigenvectors their residuals hover (on the
    1M-node SBM between 0.1 and 0.4 for 8 rounds), hence the patience of 16. A basis that would exceed
    ``basis_blocks`` blocks is restarted thickly (Krylov-Schur): its top Ritz
    vectors, half the room, become the basis (``H`` their Ritz values), the
    pending block stays orthogonal to them, no product is repeated.
    """
    _check_block(k, block, n)
    if basis_blocks < 2:
        raise ValueError(f"the Krylov basis needs room for at least 2 blocks, got {basis_blocks}")
    rng = np.random.default_rng([int(seed), 0x5EC7, 1])
    basis, h, pending = KrylovBasis(n), np.zeros((0, 0)), init_block(n, block, seed)
    max_cols = min(basis_blocks * block, n)
    rounds, history, stop_rule = 0, [], StopRule(tol, patience)
    stop = "max-rounds"
    while True:
        w = apply(pending)
        rounds += 1
        h, theta, s, pending, norms = lanczos_step(basis, h, pending, w, k, block, rng)
        residual = float(norms.max(initial=0.0))
        history.append({"round": rounds, "residual": residual, "ritz_k": float(theta[k - 1]), "basis": basis.width})
        on_round(history[-1])
        verdict = "settled" if settled(theta, norms) else stop_rule(residual)
        if verdict:
            stop = verdict
            break
        if rounds >= max_rounds:
            break
        if basis.width + pending.shape[1] > max_cols:
            h = basis.restart(h, max(k, (max_cols - pending.shape[1]) // 2))
    return IterationResult(basis.combine(s[:, :k]), theta[:k], rounds, stop == "converged", stop, history, norms)


def lanczos_step(basis: KrylovBasis, h: np.ndarray, pending: np.ndarray, w: np.ndarray, k: int, block: int,
                 rng: np.random.Generator):
    """One round of :func:`block_krylov_iteration` on the server, given ``w = M pending``: ``pending``
    joins the basis, ``H = Q^T M Q`` grows by its coefficients, Rayleigh-Ritz gives the top-k Ritz
    values ``theta`` and vectors (coefficients ``s``); the rest of ``w`` becomes the next block.
    Returns ``(H, theta, s, next block, the top-k residual norms)``."""
    m = basis.width
    basis.blocks.append(pending)
    c, f = basis.project_out(w)
    h = np.block([[h, c[:m]], [c[:m].T, (c[m:] + c[m:].T) * 0.5]])
    theta, s = top_eigenpairs(h, k)
    pending, r = basis.extend(f, min(block, basis.n - basis.width), rng)
    return h, theta, s, pending, np.linalg.norm(r @ s[m:, :k], axis=0)
