"""FedSpectral and FedSpectral+ (Thakkar & Joshi): spectral clustering over
edge-partitioned graphs. Plain numpy/scipy, no Flower.

Setting: every client knows all ``N`` node ids and holds some of the edges
of one global graph, ``A_c`` (N x N, 0/1, global indexing). An edge may be held
by ``r`` clients; the partition protocol tells each client ``r`` per edge
(``Shard.edge_weight``), so ``sum_c A_c / r = A`` exactly.

FedSpectral+ (paper Algorithms 3-4, ``mode="paper"``)
    Server: random ``V`` (N x K), orthonormal. Each round every client returns
    ``P_c = M_c^iters V`` with its *local* normalised adjacency
    ``M_c = D_c^-1/2 A_c D_c^-1/2`` (``= I - L_c``); the server averages the
    ``P_c`` and orthonormalises with QR. k-means on the rows of ``V`` at the
    end. This is a heuristic: the average of local operators is not the
    global ``M = D^-1/2 A D^-1/2`` (local degrees differ from global ones,
    and powers do not commute with the average).

Exact orthogonal iteration (``mode="exact"``, beyond the paper)
    Once: the server learns the global degree vector ``d = sum_c A_c 1 / r``
    by a secure sum (only the sum over clients). Each round the server sends
    ``Y = D^-1/2 X``; client ``c`` returns ``Z_c = (A_c / r) Y``; the server's
    ``D^-1/2 sum_c Z_c = M X`` is *exactly* the global normalised operator
    applied to ``X`` (overlapping edges are weighted 1/r, so they count once;
    without the 1/r weights an edge held by r clients would count r times,
    i.e. the operator of a reweighted graph. With the ``edge`` partitioner's
    uniform r that reweighting is ``r A`` and cancels in ``D^-1/2 A D^-1/2``;
    it biases the result when multiplicities differ between edges, which the
    per-edge weights handle). The server runs an eigensolver that touches ``M``
    only through such products, one per round: :func:`block_krylov_iteration`
    (block Lanczos with Rayleigh-Ritz over the whole Krylov basis, stopping on
    the Ritz residuals) or :func:`chebyshev_subspace_iteration`
    (Chebyshev-filtered orthogonal iteration on one block, stopping when the
    top-k Ritz subspace stops moving). Both converge to the top-k eigenspace
    of ``M``, i.e. what :func:`app.clustering.spectral_graph` computes
    centrally, followed by the same row normalisation and k-means.

FedSpectral (baseline, paper Algorithms 1-2)
    Each client clusters its local graph with normalised spectral clustering
    and uploads the N labels. The server's co-association similarity
    ``S = (1/C) sum_c H_c H_c^T`` (``H_c`` one-hot, N x K; ``S_ij`` = fraction
    of clients putting i and j together, ``S_ii = 1`` as in the paper's loop)
    is never formed: ``S = B B^T`` with ``B = [H_1 .. H_C] / sqrt(C)`` (N x CK,
    sparse), so the top eigenvectors of ``D^-1/2 S D^-1/2`` come from the small
    CK x CK Gram matrix (:func:`coassociation_embedding`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, ClassVar

import numpy as np
import scipy.sparse as sp

from app.clustering import kmeans
from app.config import ConfigView
from app.wire import ArraySpec, ReplySpec

# -- wire: the protocol's steps and what a valid reply holds ------------------------------
FEDSPECTRAL_LOCAL = "fedspectral_local"
FEDSPECTRAL_POWER = "fedspectral_power"
FEDSPECTRAL_DEGREES = "fedspectral_degrees"
FEDSPECTRAL_PRODUCT = "fedspectral_product"

#: A reply that only acknowledges (the final ``labels``).
RECEIVED_REPLY = ReplySpec(values=("received",))


def local_reply(n: int, k: int) -> ReplySpec:
    """``fedspectral_local``: the client's label in ``0..k-1`` of each of the ``n`` nodes."""
    return ReplySpec(arrays={"labels": ArraySpec((n,), kind="iu", low=0, high=k)})


def upload_reply(name: str, shape: tuple[int, ...], masked: bool, noised: bool) -> ReplySpec:
    """Array ``name`` of ``shape``: masked integers when ``masked`` (``degrees``, n; ``block``, n x b)."""
    return ReplySpec(arrays={name: ArraySpec(shape, kind="u" if masked else "f", masked=masked, noised=noised)})


@dataclass(frozen=True)
class FedSpectralConfig(ConfigView):
    """The ``fedspectral.*`` keys (declared in :class:`strategies.fedspectral.FedSpectral`)."""

    prefix: ClassVar[str] = "fedspectral"
    n_init: int


@dataclass(frozen=True)
class FedSpectralPlusConfig(ConfigView):
    """The ``fedspectral-plus.*`` keys (declared in :class:`strategies.fedspectral.FedSpectralPlus`)."""

    prefix: ClassVar[str] = "fedspectral-plus"
    mode: str
    iters: int
    rounds: int
    block: int
    solver: str
    basis_blocks: int
    degree: int
    tol: float
    secure: bool
    noise_multiplier: float
    delta: float
    wire_dtype: str
    n_init: int

# --------------------------------------------------------------------------- client side


def local_normalised_operator(adj: sp.csr_matrix) -> sp.csr_matrix:
    """Paper client operator ``I - L_c = D_c^-1/2 A_c D_c^-1/2`` (local degrees;
    a node with no local edge gets a zero row and column)."""
    adj = sp.csr_matrix(adj, dtype=np.float64)
    deg = np.asarray(adj.sum(axis=1)).ravel()
    inv = np.zeros_like(deg)
    inv[deg > 0] = 1.0 / np.sqrt(deg[deg > 0])
    return sp.csr_matrix(sp.diags(inv) @ adj @ sp.diags(inv))


def weighted_local_adjacency(adj: sp.csr_matrix, edge_weight: np.ndarray | None) -> sp.csr_matrix:
    """``A_c / r``: each local edge divided by the number of clients holding it
    (``edge_weight`` aligned with ``adj.data``); None means r = 1."""
    out = sp.csr_matrix(adj, dtype=np.float64, copy=True)
    if edge_weight is not None:
        w = np.asarray(edge_weight, dtype=np.float64)
        if w.shape != out.data.shape:
            raise ValueError(f"edge_weight has shape {w.shape}, expected {out.data.shape} (one per stored edge)")
        if np.any(w <= 0):
            raise ValueError("edge_weight must be > 0 (number of clients holding each edge)")
        out.data = out.data / w
    return out


def paper_client_step(op: sp.csr_matrix, v: np.ndarray, iters: int) -> np.ndarray:
    """Algorithm 3: ``op^iters v`` (``iters`` sparse products)."""
    out = np.asarray(v, dtype=np.float64)
    for _ in range(int(iters)):
        out = op @ out
    return out


def local_degrees(weighted_adj: sp.csr_matrix) -> np.ndarray:
    """``(A_c / r) 1``: this client's share of every node's degree."""
    return np.asarray(weighted_adj.sum(axis=1)).ravel()


# --------------------------------------------------------------------------- server side


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


def paper_server_step(blocks: list[np.ndarray] | np.ndarray, num_clients: int) -> np.ndarray:
    """Algorithm 4 aggregation: average of the client blocks (or their sum
    divided by ``num_clients``), then QR."""
    total = blocks if isinstance(blocks, np.ndarray) else np.sum(blocks, axis=0)
    return orthonormalise(total / float(num_clients))


def inverse_sqrt_degrees(d: np.ndarray, floor: float = 0.0) -> np.ndarray:
    """``d^-1/2`` where ``d > floor``, else 0 (isolated node: zero row of M)."""
    d = np.asarray(d, dtype=np.float64)
    out = np.zeros_like(d)
    ok = d > floor
    out[ok] = 1.0 / np.sqrt(d[ok])
    return out


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


def chebyshev_subspace_iteration(
    apply: Callable[[np.ndarray], np.ndarray],
    n: int,
    k: int,
    block: int,
    degree: int,
    tol: float,
    max_rounds: int,
    seed: int,
    lower: float = -1.0,
    patience: int = 8,
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
    aggregation, DP noise: "stagnated"), or before a cycle would exceed
    ``max_rounds`` products ("max-rounds").
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
        verdict = stop_rule(dist)
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


def block_krylov_iteration(
    apply: Callable[[np.ndarray], np.ndarray],
    n: int,
    k: int,
    block: int,
    tol: float,
    max_rounds: int,
    seed: int,
    basis_blocks: int = 20,
    patience: int = 16,
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
    or after ``max_rounds`` rounds ("max-rounds"). Before the Krylov space
    reaches the top-k eigenvectors their residuals hover (on the 1M-node SBM
    between 0.1 and 0.4 for 8 rounds), hence the patience of 16. A basis that would exceed
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
        h, theta, s, pending, residual = lanczos_step(basis, h, pending, w, k, block, rng)
        history.append({"round": rounds, "residual": residual, "ritz_k": float(theta[k - 1]),
                        "basis": basis.width})
        verdict = stop_rule(residual)
        if verdict:
            stop = verdict
            break
        if rounds >= max_rounds:
            break
        if basis.width + pending.shape[1] > max_cols:
            h = basis.restart(h, max(k, (max_cols - pending.shape[1]) // 2))
    return IterationResult(basis.combine(s[:, :k]), theta[:k], rounds, stop == "converged", stop, history)


def lanczos_step(basis: KrylovBasis, h: np.ndarray, pending: np.ndarray, w: np.ndarray, k: int, block: int,
                 rng: np.random.Generator):
    """One round of :func:`block_krylov_iteration` on the server, given ``w = M pending``: ``pending``
    joins the basis, ``H = Q^T M Q`` grows by its coefficients, Rayleigh-Ritz gives the top-k Ritz
    values ``theta`` and vectors (coefficients ``s``); the rest of ``w`` becomes the next block.
    Returns ``(H, theta, s, next block, largest top-k residual)``."""
    m = basis.width
    basis.blocks.append(pending)
    c, f = basis.project_out(w)
    h = np.block([[h, c[:m]], [c[:m].T, (c[m:] + c[m:].T) * 0.5]])
    theta, s = top_eigenpairs(h, k)
    pending, r = basis.extend(f, min(block, basis.n - basis.width), rng)
    residual = float(np.linalg.norm(r @ s[m:, :k], axis=0).max(initial=0.0))
    return h, theta, s, pending, residual


def embedding_labels(u: np.ndarray, k: int, seed: int, n_init: int = 10,
                     connected: np.ndarray | None = None) -> np.ndarray:
    """Labels from a spectral embedding exactly as :func:`app.clustering.spectral_graph`
    does: rows normalised to unit length, k-means (k-means++, ``n_init``) on the
    rows of ``connected`` nodes; the others (zero rows) join the cluster whose
    centre is nearest the origin."""
    u = np.array(u, dtype=np.float64)
    n = u.shape[0]
    norms = np.linalg.norm(u, axis=1)
    ok = norms > 1e-12
    u[ok] /= norms[ok, None]
    u[~ok] = 0.0
    connected = ok if connected is None else (np.asarray(connected, bool) & ok)
    labels = np.zeros(n, dtype=np.int64)
    idx = np.flatnonzero(connected)
    if idx.size == 0:
        return labels
    sub, centres = kmeans(u[idx], min(k, idx.size), seed, n_init=n_init, return_centers=True)
    labels[idx] = sub
    if idx.size < n:
        labels[~connected] = int(np.argmin((centres ** 2).sum(axis=1)))
    return labels


# --------------------------------------------------------------------------- bounds for secure sums and DP


def product_bound(y: np.ndarray, max_degree: float) -> float:
    """Largest |entry| any client's ``(A_c / r) Y`` can have: a row sums at most
    ``d_i <= max_degree`` entries of Y, each weighted <= 1."""
    return float(max_degree) * float(np.abs(y).max(initial=0.0))


def paper_bound(y: np.ndarray) -> float:
    """Largest |entry| of ``M_c^t Y``: ``||M_c||_2 <= 1`` so every entry is at
    most ``||Y||_F``."""
    return float(np.linalg.norm(y))


def block_support(y: np.ndarray) -> tuple[float, int]:
    """The smallest effective support ``||y_j||_1^2 / ||y_j||_2^2`` over the nonzero columns
    ``y_j`` of a block, and that column (``(inf, -1)`` without one). The support lies in
    [1, N]: 1 for a basis vector, whose product ``A y_j`` is one row of ``A``; about
    0.64 N for a Gaussian column. It counts the nodes a column spreads over."""
    y = np.asarray(y, dtype=np.float64)
    squares = (y ** 2).sum(axis=0)
    nonzero = np.flatnonzero(squares > 0)
    if nonzero.size == 0:
        return math.inf, -1
    support = np.abs(y[:, nonzero]).sum(axis=0) ** 2 / squares[nonzero]
    j = int(np.argmin(support))
    return float(support[j]), int(nonzero[j])


def exact_edge_sensitivity(y: np.ndarray) -> float:
    """L2 change of the released products when one global edge (i, j) is added
    or removed (at all r clients holding it): rows i and j of ``sum_c Z_c`` move
    by ``Y_j`` and ``Y_i`` (each holder by 1/r of it), so at most
    ``sqrt(top1^2 + top2^2)`` of the row norms of Y (also bounds the stacked
    per-client uploads: ``sqrt(r) / r <= 1``)."""
    norms = np.sort(np.linalg.norm(y, axis=1))[::-1]
    top = norms[:2] if norms.size >= 2 else np.concatenate([norms, [0.0]])
    return float(math.sqrt(float(top[0]) ** 2 + float(top[1]) ** 2))


DEGREE_SENSITIVITY = math.sqrt(2.0)  # one edge moves two degrees by 1


def paper_edge_sensitivity(y: np.ndarray, iters: int, holders: int = 1) -> float:
    """L2 change of the uploads ``M_c^t Y`` when one edge changes at the (at most
    ``holders``) clients holding it: per client ``M_c - M_c'`` lives in rows and
    columns i, j, each row of a normalised adjacency has norm <= 1, so
    ``||M_c - M_c'||_F <= 4``, and telescoping ``M^t - M'^t`` gives
    ``<= 4 t ||Y||_2``; the holders' changes stack to ``sqrt(holders)`` times that
    (no 1/r weights in paper mode)."""
    return 4.0 * int(iters) * float(np.linalg.norm(y, 2)) * math.sqrt(int(holders))


# --------------------------------------------------------------------------- FedSpectral baseline


def local_spectral_labels(adj: sp.csr_matrix, k: int, seed: int, n_init: int = 10) -> np.ndarray:
    """Algorithm 1: normalised spectral clustering of the local graph (isolated
    nodes, i.e. no local edge, all go to one cluster, see ``spectral_graph``)."""
    from app.clustering import spectral_graph

    return spectral_graph(adj, k, seed, n_init=n_init)


def coassociation_matrix(label_sets: list[np.ndarray]) -> sp.csr_matrix:
    """Sparse ``B = [H_1 .. H_C] / sqrt(C)`` (N x sum_c K_c): ``S = B B^T`` is the
    paper's similarity graph (equation 1)."""
    c = len(label_sets)
    if c == 0:
        raise ValueError("no label sets")
    n = len(label_sets[0])
    blocks = []
    for labels in label_sets:
        labels = np.asarray(labels)
        if labels.shape != (n,):
            raise ValueError(f"label sets differ in length: {labels.shape} vs ({n},)")
        _, codes = np.unique(labels, return_inverse=True)
        blocks.append(sp.csr_matrix((np.ones(n), (np.arange(n), codes)), shape=(n, int(codes.max()) + 1)))
    return sp.csr_matrix(sp.hstack(blocks) / math.sqrt(c))


def coassociation_embedding(label_sets: list[np.ndarray], k: int) -> np.ndarray:
    """Top-k eigenvectors of ``D^-1/2 S D^-1/2`` with ``S = B B^T`` (never N x N).

    ``d = S 1 = B (B^T 1)``; with ``F = D^-1/2 B`` the nonzero eigenpairs of
    ``F F^T`` are ``(s^2, F w / s)`` for the eigenpairs ``(s^2, w)`` of the
    small Gram matrix ``F^T F``. Returns N x k (columns by decreasing eigenvalue;
    if rank(S) < k the remaining columns are zero).
    """
    b = coassociation_matrix(label_sets)
    d = b @ np.asarray(b.sum(axis=0)).ravel()
    f = sp.csr_matrix(sp.diags(inverse_sqrt_degrees(d)) @ b)
    gram = (f.T @ f).toarray()
    vals, w = np.linalg.eigh((gram + gram.T) * 0.5)
    vals, w = vals[::-1], w[:, ::-1]
    m = min(k, int(np.sum(vals > 1e-12 * max(vals[0], 1e-300))))
    u = np.zeros((b.shape[0], k))
    u[:, :m] = (f @ w[:, :m]) / np.sqrt(vals[:m])
    return u


def coassociation_dense(label_sets: list[np.ndarray]) -> np.ndarray:
    """The paper's N x N similarity graph (equation 1), for tests on small N only."""
    b = coassociation_matrix(label_sets)
    return (b @ b.T).toarray()


def coassociation_labels(label_sets: list[np.ndarray], k: int, seed: int, n_init: int = 10) -> np.ndarray:
    """Algorithm 2 server side: spectral clustering of the co-association graph."""
    return embedding_labels(coassociation_embedding(label_sets, k), k, seed, n_init)
