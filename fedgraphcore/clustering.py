"""Clustering building blocks shared by the methods and their centralised references.

Plain functions (no Flower) that take a ``seed`` and are deterministic for it:

* :func:`kmeans` - scikit-learn k-means (k-means++ init, ``n_init`` restarts; 0:
  :func:`auto_restarts`).
* :func:`spectral_graph` / :func:`spectral_affinity` - normalised spectral
  clustering (Ng, Jordan & Weiss): top-k eigenvectors of
  ``D^-1/2 W D^-1/2``, rows normalised to unit length, k-means; on a graph,
  optionally regularised (``tau``, :func:`regularisation`).
"""

from __future__ import annotations

import math
import warnings

from contextlib import nullcontext
from typing import Any

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as sla

# Below this many multiply-adds per pass, BLAS/OpenMP run single-threaded: on a
# small shared machine thread spin-waits make small products 10x slower
# (measured: AGC on Cora 0.04 s single-threaded vs 0.5-0.9 s with 2 busy threads).
_SMALL_WORK = 1e8


def blas_threads(work: float):
    """Context limiting BLAS/OpenMP to one thread when ``work`` is small."""
    if work > _SMALL_WORK:
        return nullcontext()
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=1)


# ---------------------------------------------------------------------------
# validation helpers
# ---------------------------------------------------------------------------
def check_k(k: Any, n: int, what: str = "number of samples") -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise ValueError(f"invalid number of clusters k={k!r}; expected an integer >= 1")
    k = int(k)
    if k < 1:
        raise ValueError(f"invalid number of clusters k={k}; need k >= 1")
    if k > n:
        raise ValueError(f"invalid number of clusters k={k}; need k <= {what} ({n})")
    return k


def check_seed(seed: Any) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or int(seed) < 0:
        raise ValueError(f"invalid seed {seed!r}; expected an integer >= 0")
    return int(seed)


def square_sparse(adj: Any, name: str = "adj") -> sp.csr_matrix:
    if not sp.issparse(adj):
        arr = np.asarray(adj, dtype=np.float64)
        if arr.ndim != 2:
            raise ValueError(f"{name} must be a 2-D matrix, got shape {arr.shape}")
        adj = sp.csr_matrix(arr)
    if adj.shape[0] != adj.shape[1]:
        raise ValueError(f"{name} must be square, got shape {adj.shape}")
    return sp.csr_matrix(adj, dtype=np.float64)


def as_features(x: Any, n: int | None = None) -> np.ndarray | sp.csr_matrix:
    if x is None:
        raise ValueError("features x are None; this method needs node features")
    if sp.issparse(x):
        x = sp.csr_matrix(x, dtype=np.float64)
    else:
        x = np.asarray(x, dtype=np.float64)
        if x.ndim == 1:
            x = x[:, None]
        if x.ndim != 2:
            raise ValueError(f"features must be a 2-D matrix, got shape {x.shape}")
    if n is not None and x.shape[0] != n:
        raise ValueError(f"length mismatch: features have {x.shape[0]} rows, adjacency has {n} nodes")
    return x


# ---------------------------------------------------------------------------
# k-means
# ---------------------------------------------------------------------------
#: :func:`auto_restarts`: one start per this many row-cluster pairs ...
ROWS_PER_START = 50
#: ... until the starts' work (rows x clusters x starts, per Lloyd sweep) reaches this budget
#: (about 2 CPU-seconds of Lloyd on one core at k of about 7) ...
RESTART_WORK = 10_000_000
#: ... and never fewer or more starts than these
RESTARTS_RANGE = (10, 1000)


def auto_restarts(n: int, k: int) -> int:
    """k-means++ starts for ``n`` rows and ``k`` clusters (a key's ``n-init`` 0): ``n k / 50``, at most
    ``1e7 / (n k)``, within [10, 1000].

    A k-means problem has more local optima the more rows and clusters it has, so that one start
    reaches the best less often: on Cora's regularised spectral embedding (2,708 rows, k = 7) one
    k-means++ start in thirty does, and 10 starts land in different optima at different seeds. The
    starts grow with ``n k`` until their work, ``n k`` per start and Lloyd sweep, reaches a fixed
    budget: small problems keep scikit-learn's 10, and large ones (a million rows) too, rather than
    paying minutes.
    """
    work = max(int(n), 1) * max(int(k), 1)
    low, high = RESTARTS_RANGE
    return int(min(high, max(low, min(-(-work // ROWS_PER_START), RESTART_WORK // work))))


def kmeans(
    X: Any,
    k: int,
    seed: int,
    n_init: int = 10,
    init: Any = None,
    sample_weight: Any = None,
    max_iter: int = 300,
    return_centers: bool = False,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """k-means (Lloyd, scikit-learn) minimising ``sum_i w_i ||x_i - mu_{c_i}||^2``.

    ``init=None`` -> k-means++ with ``n_init`` restarts (best inertia kept; 0: :func:`auto_restarts`);
    an explicit ``(k, d)`` array of initial centres runs once from there.
    ``sample_weight`` gives each row a weight (kCAGC's virtual nodes).
    Returns int64 labels ``0..k-1`` (and the ``(k, d)`` centres if ``return_centers``).
    """
    from sklearn.cluster import KMeans
    from sklearn.exceptions import ConvergenceWarning

    X = as_features(X)
    n = X.shape[0]
    k = check_k(k, n)
    seed = check_seed(seed)
    if int(n_init) < 0:
        raise ValueError(f"invalid n_init={n_init}; need n_init >= 1, or 0 for auto_restarts")
    n_init = int(n_init) or auto_restarts(n, k)
    if sample_weight is not None:
        sample_weight = np.asarray(sample_weight, dtype=np.float64)
        if sample_weight.shape != (n,):
            raise ValueError(f"length mismatch: sample_weight has shape {sample_weight.shape}, X has {n} rows")
        if np.any(sample_weight < 0) or not np.all(np.isfinite(sample_weight)):
            raise ValueError("sample_weight must be finite and >= 0")
    if init is None:
        km = KMeans(n_clusters=k, init="k-means++", n_init=int(n_init), max_iter=max_iter, random_state=seed)
    else:
        init = np.asarray(init, dtype=np.float64)
        if init.shape != (k, X.shape[1]):
            raise ValueError(f"init must have shape ({k}, {X.shape[1]}), got {init.shape}")
        km = KMeans(n_clusters=k, init=init, n_init=1, max_iter=max_iter, random_state=seed)
    # fewer distinct rows than k: scikit-learn warns on every call (a client of a small shard, once
    # per message); the labels say it (fewer clusters) and a run warns about such shards itself
    with blas_threads(float(n) * X.shape[1] * k), warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=ConvergenceWarning)
        labels = km.fit_predict(X, sample_weight=sample_weight).astype(np.int64)
    if return_centers:
        return labels, np.asarray(km.cluster_centers_)
    return labels


# ---------------------------------------------------------------------------
# spectral clustering
# ---------------------------------------------------------------------------
_DENSE_EIG_MAX_N = 1000


#: choices of a method's ``regularise`` key: ``auto`` regularises a graph with more connected
#: components (of at least one edge) than clusters, where the top-k eigenvectors are not unique
REGULARISE = ("auto", "on", "off")


def components_with_edges(adj: Any) -> int:
    """Connected components of a graph that hold at least one edge (an isolated node is none):
    the multiplicity of eigenvalue 1 of ``D^-1/2 A D^-1/2``."""
    from scipy.sparse.csgraph import connected_components

    A = square_sparse(adj)
    _, labels = connected_components(A, directed=False)
    touched = np.asarray((A != 0).sum(axis=1)).ravel() > 0
    return int(np.unique(labels[touched]).size)


def regularisation(adj: Any, k: int, regularise: str, tau: float = 0.0) -> float:
    """The ``tau`` of regularised spectral clustering (:func:`spectral_embedding`) on ``adj``: 0
    (unregularised) for ``regularise="off"``, and for ``"auto"`` where the graph has at most ``k``
    components with an edge; else ``tau``, or where ``tau`` is 0 the graph's average degree
    ``sum(A) / n`` (Qin and Rohe 2013; Amini et al. 2013 take a multiple of it)."""
    if regularise not in REGULARISE:
        raise ValueError(f"invalid regularise={regularise!r}; valid choices: " + ", ".join(REGULARISE))
    if regularise == "off" or (regularise == "auto" and components_with_edges(adj) <= k):
        return 0.0
    A = square_sparse(adj)
    return float(tau) if tau > 0 else float(A.sum()) / max(A.shape[0], 1)


def normalised_operator(W: sp.csr_matrix, tau: float = 0.0):
    """``(M, d)``: ``M = D_tau^-1/2 (W + (tau/n) 1 1^T) D_tau^-1/2`` with ``d = W 1`` and ``D_tau =
    diag(d + tau)``, sparse (``tau`` 0: ``D^-1/2 W D^-1/2``, a zero row and column where ``d = 0``)
    or, for ``tau`` > 0, a LinearOperator (the added rank-one term keeps products sparse)."""
    n = W.shape[0]
    d = np.asarray(W.sum(axis=1)).ravel()
    inv = np.zeros(n)
    ok = d + tau > 0
    inv[ok] = 1.0 / np.sqrt(d[ok] + tau)
    if tau <= 0:
        return sp.csr_matrix(sp.diags(inv) @ W @ sp.diags(inv)), d

    def apply(x: np.ndarray) -> np.ndarray:
        y = inv[:, None] * x.reshape(n, -1)
        z = W @ y + (tau / n) * y.sum(axis=0, keepdims=True)
        return (inv[:, None] * z).reshape(x.shape)

    return sla.LinearOperator((n, n), matvec=apply, matmat=apply, dtype=np.float64), d


def spectral_embedding(W: Any, k: int, seed: int, tau: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Row-normalised top-k eigenvectors of ``M = D^-1/2 W D^-1/2`` (``d = W 1``), or with
    ``tau`` > 0 of the regularised ``M_tau = D_tau^-1/2 (W + (tau/n) 1 1^T) D_tau^-1/2``,
    ``D_tau = D + tau I`` (Amini et al. 2013; Joseph and Yu 2016).

    Returns ``(U, connected)``: ``U`` (n x k) with unit rows and ``connected``
    the mask of nodes with ``d_i + tau > 0``. Unregularised, nodes with zero degree get
    ``D^-1/2 = 0``, i.e. an all-zero row of M and of U (they are excluded from
    the eigenproblem's signal and left at the origin); regularised, every node is connected.
    Eigenvectors come from ``scipy.sparse.linalg.eigsh`` (largest algebraic, deterministic start
    vector from ``seed``) or a dense ``eigh`` for small n.
    """
    W = square_sparse(W, "affinity")
    n = W.shape[0]
    k = check_k(k, n)
    seed = check_seed(seed)
    if W.nnz and W.data.min() < 0:
        raise ValueError("affinity/adjacency has negative entries; spectral clustering needs W >= 0")
    if not (math.isfinite(tau) and tau >= 0):
        raise ValueError(f"invalid regularisation tau={tau!r}; expected a finite number >= 0")
    if (abs(W - W.T) > 1e-10 * (abs(W).max() if W.nnz else 1.0)).nnz:
        W = (W + W.T) * 0.5  # symmetrise a nearly/non-symmetric input
    M, d = normalised_operator(W, tau)
    connected = d + tau > 0
    if n <= _DENSE_EIG_MAX_N or k >= n - 1:
        dense = M.toarray() if tau <= 0 else M @ np.eye(n)
        vals, vecs = np.linalg.eigh((dense + dense.T) * 0.5)
        U = vecs[:, -k:]
    else:
        rng = np.random.default_rng(seed)
        v0 = rng.uniform(0.5, 1.5, n)
        vals, U = sla.eigsh(M, k=k, which="LA", v0=v0, tol=1e-9, maxiter=max(5000, 20 * n))
    U = np.ascontiguousarray(U[:, ::-1])
    norms = np.linalg.norm(U, axis=1)
    ok = norms > 1e-12
    U[ok] /= norms[ok, None]
    U[~ok] = 0.0
    return U, connected


def _spectral_cluster(W: Any, k: int, seed: int, n_init: int, tau: float = 0.0) -> np.ndarray:
    U, connected = spectral_embedding(W, k, seed, tau)
    n = U.shape[0]
    labels = np.zeros(n, dtype=np.int64)
    idx = np.flatnonzero(connected)
    if idx.size == 0:
        return labels  # no edges at all: one cluster
    kk = min(k, idx.size)
    sub, centers = kmeans(U[idx], kk, seed, n_init=n_init, return_centers=True)
    labels[idx] = sub
    if idx.size < n:  # isolated nodes: embedding row 0 -> cluster whose centre is nearest the origin
        labels[~connected] = int(np.argmin((centers**2).sum(axis=1)))
    return labels


def spectral_graph(adj: Any, k: int, seed: int, n_init: int = 10, tau: float = 0.0) -> np.ndarray:
    """Normalised spectral clustering of a graph (Ng-Jordan-Weiss), regularised with ``tau`` > 0.

    Top-k eigenvectors of ``D^-1/2 A D^-1/2`` (sparse eigensolver), rows
    normalised to unit length, k-means (k-means++, ``n_init`` restarts).

    Disconnected graphs: each component contributes eigenvalue 1; with more
    than k components (of at least one edge) the top-k eigenspace is not
    unique, and the solver returns one basis of it, which depends on its start
    (so on ``seed``): k-means then groups components, differently per seed.
    Regularised spectral clustering (``tau`` > 0: ``tau/n`` added to every entry of
    A and ``tau`` to every degree; :func:`regularisation` picks ``tau``) joins every node into
    one graph and has a unique top-k eigenspace. Unregularised, isolated nodes (degree 0)
    carry no structure: they are left out of the k-means fit and all assigned to the
    cluster whose centre is nearest the origin (their embedding row is 0). A graph with no
    edges gives one cluster. Returns int64 labels ``0..k-1``.
    """
    return _spectral_cluster(adj, k, seed, n_init, tau)


def spectral_affinity(K: Any, k: int, seed: int, n_init: int = 10) -> np.ndarray:
    """Normalised spectral clustering of a symmetric, non-negative affinity (kernel) matrix.

    Same algorithm as :func:`spectral_graph` with ``W = K`` (dense or sparse);
    the diagonal is used as given (zero it first for the textbook NJW form).
    """
    if not sp.issparse(K):
        K = np.asarray(K, dtype=np.float64)
        if K.ndim != 2 or K.shape[0] != K.shape[1]:
            raise ValueError(f"affinity must be a square matrix, got shape {K.shape}")
        if not np.all(np.isfinite(K)):
            raise ValueError("affinity has non-finite entries")
    return _spectral_cluster(K, k, seed, n_init)
