"""FedSpectral+ math: the clients' operators and the server's steps around the eigensolver.

Paper mode (Algorithms 3-4, ``mode="paper"``)
    Server: random ``V`` (N x K), orthonormal. Each round every client returns
    ``P_c = M_c^iters V`` with its *local* normalised adjacency
    ``M_c = D_c^-1/2 A_c D_c^-1/2`` (``= I - L_c``); the server averages the
    ``P_c`` and orthonormalises with QR. k-means on the rows of ``V`` at the
    end. This is a heuristic: the average of local operators is not the
    global ``M = D^-1/2 A D^-1/2`` (local degrees differ from global ones,
    and powers do not commute with the average).

Exact mode (``mode="exact"``, beyond the paper)
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
    only through such products, one per round
    (:mod:`fedgraphcore.protocols.fedspectral.block_iteration`). It converges to the
    top-k eigenspace of ``M``, i.e. what :func:`fedgraphcore.clustering.spectral_graph`
    computes centrally, followed by the same row normalisation and k-means
    (:func:`embedding_labels`).

Regularised (``fedspectral-plus.regularise``; Amini et al. 2013, Qin and Rohe 2013)
    ``M_tau = D_tau^-1/2 (A + (tau/N) 1 1^T) D_tau^-1/2`` with ``D_tau = D + tau I``: exact
    mode's server takes ``D_tau`` from the degree sum and adds the rank-one term itself
    (:func:`regularised_sum`: the column sums of the block it sent), so the clients' products
    and what leaves them do not change. Paper mode regularises each client's local operator
    (:func:`local_normalised_operator`).
"""

from __future__ import annotations

import math

import numpy as np
import scipy.sparse as sp

from fedgraphcore.clustering import kmeans, normalised_operator, regularisation
from fedgraphcore.protocols.fedspectral.block_iteration import orthonormalise

#: a (k+1)-th eigenvalue of ``D^-1/2 A D^-1/2`` this close to 1 (or closer than the solver's final
#: error) means more than k connected components with an edge: the top-k eigenvectors are not unique
DEGENERATE = 1e-6


def local_normalised_operator(adj: sp.csr_matrix, tau: float = 0.0):
    """Paper client operator ``I - L_c = D_c^-1/2 A_c D_c^-1/2`` (local degrees;
    a node with no local edge gets a zero row and column), regularised with ``tau`` > 0
    (:func:`fedgraphcore.clustering.normalised_operator`)."""
    return normalised_operator(sp.csr_matrix(adj, dtype=np.float64), tau)[0]


def paper_tau(adj: sp.csr_matrix, k: int, regularise: str, tau: float, noised: bool) -> float:
    """The ``tau`` of a paper-mode client's own graph (:func:`fedgraphcore.clustering.regularisation`). Under
    noise the edge sensitivity holds for a fixed ``tau`` only: ``auto`` is off there, and ``on`` needs
    ``tau`` > 0 (the average degree and the component count move with every edge)."""
    if noised and (regularise == "auto" or tau <= 0):
        if regularise == "on":
            raise ValueError("fedspectral-plus.regularise=on under noise needs fedspectral-plus.tau > 0: the "
                             "average degree depends on every edge")
        return 0.0
    return regularisation(adj, k, regularise, tau)


def regularised_sum(total: np.ndarray, y: np.ndarray, tau: float) -> np.ndarray:
    """``(A + (tau/N) 1 1^T) Y`` from ``total = A Y`` (the clients' summed products) and the block ``Y``
    the server sent: one column sum of ``Y`` per product."""
    if tau <= 0:
        return total
    return total + (float(tau) / y.shape[0]) * y.sum(axis=0, keepdims=True)


def more_components_than(theta: np.ndarray, k: int, error: float | None) -> bool:
    """Whether Ritz values ``theta`` (decreasing, at least ``k + 1``) of ``D^-1/2 A D^-1/2`` show more
    than ``k`` connected components with an edge: the (k+1)-th is 1 up to :data:`DEGENERATE` or the
    solver's final ``error`` (None: not measured yet)."""
    return len(theta) > k and float(theta[k]) >= 1.0 - max(DEGENERATE, float(error or 0.0))


def at_most_components(theta: np.ndarray, norms: np.ndarray | None, k: int, tol: float) -> bool:
    """Whether Ritz values ``theta`` (decreasing, at least ``k + 1``) of ``D^-1/2 A D^-1/2`` with residual
    norms ``norms`` (None: not measured) settle at most ``k`` connected components with an edge before the
    (k+1)-th pair converges: the top-k residuals are at most ``tol`` and the (k+1)-th eigenvalue is below 1,
    because the eigenvalue within ``norms[k]`` of ``theta[k]`` (a residual bound) lies below ``1 - DEGENERATE``
    and ``theta[k]`` is at most the (k+1)-th eigenvalue (interlacing); like every Krylov stop, this takes
    the basis to hold the top eigenvectors it approximates."""
    return (norms is not None and len(theta) > k and float(np.max(norms[:k], initial=0.0)) <= tol
            and float(theta[k] + norms[k]) < 1.0 - DEGENERATE)


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


def embedding_labels(u: np.ndarray, k: int, seed: int, n_init: int = 10,
                     connected: np.ndarray | None = None) -> np.ndarray:
    """Labels from a spectral embedding exactly as :func:`fedgraphcore.clustering.spectral_graph`
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
