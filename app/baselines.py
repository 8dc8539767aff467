"""Centralised reference methods: what a user would run on the pooled data.

Every federated strategy reports one of these, run on the same data with the
same seed, beside its own result. All functions are plain (no Flower), take a
``seed`` and are deterministic for a given seed.

* :func:`kmeans` - scikit-learn k-means (k-means++ init, ``n_init`` restarts).
* :func:`spectral_graph` / :func:`spectral_affinity` - normalised spectral
  clustering (Ng, Jordan & Weiss): top-k eigenvectors of
  ``D^-1/2 W D^-1/2``, rows normalised to unit length, k-means.
* :func:`low_pass_filter` / :func:`agc` - AGC (Zhang et al., IJCAI 2019) as in
  its public code and the kCAGC paper: ``G = (I + D~^-1/2 (A+I) D~^-1/2) / 2``
  applied ``psi`` times, top-k left singular vectors, k-means; fixed or
  adaptive ``psi``. ``kind="spectral-norm"`` swaps in the kCAGC paper's second
  filter ``G = I - L_s / ||L_s||`` (its Appendix E.2). The SVD is a randomised range finder on the implicit
  operator ``G^psi X`` (sparse products only), so Cora takes a few tens of ms.
* :func:`train_dmon` - DMoN trained full batch (model and loss in
  :mod:`app.models`, re-exported here as :class:`DMoNModel` / :func:`dmon_loss`).
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any, Callable

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as sla

__all__ = [
    "kmeans",
    "spectral_embedding",
    "spectral_graph",
    "spectral_affinity",
    "FILTERS",
    "check_filter",
    "agc_filter_matrix",
    "laplacian_norm",
    "low_pass_filter",
    "agc_embedding",
    "agc_intra_distance",
    "agc",
    "train_dmon",
    "DMoNModel",
    "dmon_loss",
]

AGC_MAX_ORDER = 60  # AGC code: max_iter = 60

#: Low-pass graph filters ``G = I - L_s / c`` on the self-looped normalised Laplacian
#: ``L_s = I - D~^-1/2 (A+I) D~^-1/2``: ``"agc"`` (c = 2, AGC's filter, frequency response
#: ``1 - lambda/2``) and ``"spectral-norm"`` (c = ||L_s||, its largest eigenvalue: response
#: ``1 - lambda/||L_s||``, which removes the top frequency; kCAGC paper, Appendix E.2).
FILTERS = ("agc", "spectral-norm")


def __getattr__(name: str) -> Any:  # lazy re-export: importing torch costs ~1 s
    if name in ("DMoNModel", "dmon_loss", "adj_to_edge_index"):
        from app import models

        return getattr(models, name)
    raise AttributeError(f"module 'app.baselines' has no attribute {name!r}")


# Below this many multiply-adds per pass, BLAS/OpenMP run single-threaded: on a
# small shared machine thread spin-waits make small products 10x slower
# (measured: AGC on Cora 0.04 s single-threaded vs 0.5-0.9 s with 2 busy threads).
_SMALL_WORK = 1e8


def _threads(work: float):
    """Context limiting BLAS/OpenMP to one thread when ``work`` is small."""
    if work > _SMALL_WORK:
        return nullcontext()
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - threadpoolctl ships with scikit-learn
        return nullcontext()
    return threadpool_limits(limits=1)


# ---------------------------------------------------------------------------
# validation helpers
# ---------------------------------------------------------------------------
def _check_k(k: Any, n: int, what: str = "number of samples") -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise ValueError(f"invalid number of clusters k={k!r}; expected an integer >= 1")
    k = int(k)
    if k < 1:
        raise ValueError(f"invalid number of clusters k={k}; need k >= 1")
    if k > n:
        raise ValueError(f"invalid number of clusters k={k}; need k <= {what} ({n})")
    return k


def _check_seed(seed: Any) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or int(seed) < 0:
        raise ValueError(f"invalid seed {seed!r}; expected an integer >= 0")
    return int(seed)


def _square_sparse(adj: Any, name: str = "adj") -> sp.csr_matrix:
    if not sp.issparse(adj):
        arr = np.asarray(adj, dtype=np.float64)
        if arr.ndim != 2:
            raise ValueError(f"{name} must be a 2-D matrix, got shape {arr.shape}")
        adj = sp.csr_matrix(arr)
    if adj.shape[0] != adj.shape[1]:
        raise ValueError(f"{name} must be square, got shape {adj.shape}")
    return sp.csr_matrix(adj, dtype=np.float64)


def _features(x: Any, n: int | None = None) -> np.ndarray | sp.csr_matrix:
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

    ``init=None`` -> k-means++ with ``n_init`` restarts (best inertia kept);
    an explicit ``(k, d)`` array of initial centres runs once from there.
    ``sample_weight`` gives each row a weight (kCAGC's virtual nodes).
    Returns int64 labels ``0..k-1`` (and the ``(k, d)`` centres if ``return_centers``).
    """
    from sklearn.cluster import KMeans

    if sp.issparse(X):
        X = sp.csr_matrix(X, dtype=np.float64)
    else:
        X = np.asarray(X, dtype=np.float64)
        if X.ndim == 1:
            X = X[:, None]
        if X.ndim != 2:
            raise ValueError(f"X must be a 2-D matrix, got shape {X.shape}")
    n = X.shape[0]
    k = _check_k(k, n)
    seed = _check_seed(seed)
    if int(n_init) < 1:
        raise ValueError(f"invalid n_init={n_init}; need n_init >= 1")
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
    with _threads(float(n) * X.shape[1] * k):
        labels = km.fit_predict(X, sample_weight=sample_weight).astype(np.int64)
    if return_centers:
        return labels, np.asarray(km.cluster_centers_)
    return labels


# ---------------------------------------------------------------------------
# spectral clustering
# ---------------------------------------------------------------------------
_DENSE_EIG_MAX_N = 1000


def spectral_embedding(W: Any, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Row-normalised top-k eigenvectors of ``M = D^-1/2 W D^-1/2`` (``d = W 1``).

    Returns ``(U, connected)``: ``U`` (n x k) with unit rows and ``connected``
    the mask of nodes with ``d_i > 0``. Nodes with zero degree get
    ``D^-1/2 = 0``, i.e. an all-zero row of M and of U (they are excluded from
    the eigenproblem's signal and left at the origin). Eigenvectors come from
    ``scipy.sparse.linalg.eigsh`` (largest algebraic, deterministic start
    vector from ``seed``) or a dense ``eigh`` for small n.
    """
    W = _square_sparse(W, "affinity")
    n = W.shape[0]
    k = _check_k(k, n)
    seed = _check_seed(seed)
    if W.nnz and W.data.min() < 0:
        raise ValueError("affinity/adjacency has negative entries; spectral clustering needs W >= 0")
    if (abs(W - W.T) > 1e-10 * (abs(W).max() if W.nnz else 1.0)).nnz:
        W = (W + W.T) * 0.5  # symmetrise a nearly/non-symmetric input
    d = np.asarray(W.sum(axis=1)).ravel()
    connected = d > 0
    inv = np.zeros(n)
    inv[connected] = 1.0 / np.sqrt(d[connected])
    M = sp.diags(inv) @ W @ sp.diags(inv)
    if n <= _DENSE_EIG_MAX_N or k >= n - 1:
        vals, vecs = np.linalg.eigh(M.toarray())
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


def _spectral_cluster(W: Any, k: int, seed: int, n_init: int) -> np.ndarray:
    U, connected = spectral_embedding(W, k, seed)
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


def spectral_graph(adj: Any, k: int, seed: int, n_init: int = 10) -> np.ndarray:
    """Normalised spectral clustering of a graph (Ng-Jordan-Weiss).

    Top-k eigenvectors of ``D^-1/2 A D^-1/2`` (sparse eigensolver), rows
    normalised to unit length, k-means (k-means++, ``n_init`` restarts).

    Disconnected graphs: nothing special is needed, each component contributes
    eigenvalue 1 and the solver returns an orthonormal basis of the top-k
    eigenspace (with more than k components, k-means groups the components).
    Isolated nodes (degree 0) carry no structure: they are left out of the
    k-means fit and all assigned to the cluster whose centre is nearest the
    origin (their embedding row is 0). A graph with no edges gives one cluster.
    Returns int64 labels ``0..k-1``.
    """
    return _spectral_cluster(adj, k, seed, n_init)


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


# ---------------------------------------------------------------------------
# AGC
# ---------------------------------------------------------------------------
def check_filter(kind: str) -> None:
    """One-line error for a graph filter name not in :data:`FILTERS`."""
    if kind not in FILTERS:
        raise ValueError(f"unknown graph filter {kind!r}; valid choices: " + ", ".join(FILTERS))


def agc_filter_matrix(adj: Any, kind: str = "agc") -> sp.csr_matrix:
    """Low-pass filter ``G = I - L_s / c`` with ``L_s = I - A_hat``, ``A_hat = D~^-1/2 (A + I) D~^-1/2``.

    ``D~`` is the degree matrix of ``A + I`` (AGC's ``preprocess_adj``), so the
    eigenvalues ``lambda`` of ``L_s`` lie in ``[0, 2)`` and G's are ``1 - lambda/c``.
    ``kind="agc"``: ``c = 2``, i.e. ``G = (I + A_hat) / 2`` (AGC). ``kind="spectral-norm"``:
    ``c = ||L_s|| = lambda_max`` (kCAGC, Appendix E.2); G is then the identity on a graph
    without edges (``L_s = 0``).
    """
    check_filter(kind)
    A = _square_sparse(adj)
    n = A.shape[0]
    A = A + sp.eye(n, format="csr")
    d = np.asarray(A.sum(axis=1)).ravel()
    if np.any(d <= 0):
        raise ValueError("adjacency + I has a non-positive degree; negative edge weights are not supported")
    inv = 1.0 / np.sqrt(d)
    A_hat = sp.csr_matrix(sp.diags(inv) @ A @ sp.diags(inv))
    if kind == "agc":
        return sp.csr_matrix((sp.eye(n, format="csr") + A_hat) * 0.5)  # AGC's own expression, bit for bit
    top = laplacian_norm(A_hat)
    if top <= 0.0:
        return sp.eye(n, format="csr")
    return sp.csr_matrix(sp.eye(n, format="csr") - (sp.eye(n, format="csr") - A_hat) / top)


def laplacian_norm(A_hat: sp.csr_matrix) -> float:
    """``||I - A_hat||`` for a normalised adjacency ``A_hat``: the largest eigenvalue of the normalised
    Laplacian (its spectral norm: it is symmetric and positive semi-definite); 0 without edges.
    Deterministic: a fixed pseudo-random Lanczos start vector, so every party that holds the graph
    computes the same filter. (A constant start vector can be orthogonal to the top eigenvector, e.g.
    on an even path, and then finds the second-largest eigenvalue.)"""
    n = A_hat.shape[0]
    lap = sp.csr_matrix(sp.eye(n, format="csr") - A_hat)
    if not lap.count_nonzero():
        return 0.0
    if n <= 64:
        return float(np.linalg.eigvalsh(lap.toarray())[-1])
    start = np.random.default_rng(0).standard_normal(n)
    return float(sla.eigsh(lap, k=1, which="LA", v0=start, tol=1e-12, return_eigenvectors=False)[0])


def _check_order(order: Any) -> int:
    if isinstance(order, bool) or not isinstance(order, (int, np.integer)) or int(order) < 0:
        raise ValueError(f"invalid filter order {order!r}; expected an integer >= 0")
    return int(order)


def low_pass_filter(x: Any, adj: Any, order: int, kind: str = "agc") -> np.ndarray:
    """Filtered features ``X_bar = G^order X`` (dense n x f), by ``order`` sparse products.

    ``G`` as in :func:`agc_filter_matrix` (``kind``); never forms a dense n x n matrix.
    """
    order = _check_order(order)
    G = agc_filter_matrix(adj, kind)
    x = _features(x, G.shape[0])
    F = x.toarray() if sp.issparse(x) else np.array(x, dtype=np.float64, copy=True)
    for _ in range(order):
        F = G @ F
    return np.asarray(F)


def filtered_features(x: Any, adj: Any, order: int) -> np.ndarray:
    """Dense float64 features, low-pass filtered ``order`` times over ``adj``
    (unfiltered when ``order`` is 0 or the graph has no edges)."""
    x = np.asarray(x.todense() if hasattr(x, "todense") else x, dtype=np.float64)
    if order > 0 and adj is not None and adj.nnz:
        x = low_pass_filter(x, adj, order)
    return x


def _randomized_left_sv(
    matvec: Callable[[np.ndarray], np.ndarray],
    rmatvec: Callable[[np.ndarray], np.ndarray],
    shape: tuple[int, int],
    k: int,
    seed: int,
    oversample: int | None = None,
    max_iter: int = 60,
    min_iter: int = 4,
    tol: float = 1e-7,
    start: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Top-k left singular vectors/values of an implicit n x f operator M (Halko et al.).

    Block power (subspace) iteration with ``l = max(2k, k + 10)`` columns:
    ``Y_0 = M Omega``, ``Y_{t+1} = M orth(M' U_t)`` where ``U_t`` are the left
    singular vectors of ``Y_t``; it stops once the top-k subspace moves less
    than ``tol`` (``||U_prev - U U' U_prev||_F``) after at least ``min_iter``
    passes, or after ``max_iter``. The subspace error then is ~1e-6 or less,
    which matters: on Wiki a 1e-3 error already changes k-means' outcome for
    some seeds. Finally ``B = Q' M`` (l x f) is decomposed exactly and
    ``U = Q U_B``. ``start`` (f x l, e.g. the right basis of a nearby operator)
    replaces the Gaussian ``Omega`` (warm start).
    Returns ``(U_k, s_k, V_l)`` with ``V_l`` the f x l right basis.
    """
    n, f = shape
    l = min(max(2 * k, k + 10) if oversample is None else k + oversample, n, f)
    if start is None:
        start = np.random.default_rng(seed).standard_normal((f, l))
    Y = matvec(start)
    prev = None
    for it in range(max_iter):
        Uy = np.linalg.svd(Y, full_matrices=False)[0]
        Uk = Uy[:, :k]
        if prev is not None and it >= min_iter and np.linalg.norm(prev - Uk @ (Uk.T @ prev)) < tol:
            break
        prev = Uk
        Z, _ = np.linalg.qr(rmatvec(Uy))
        Y = matvec(Z)
    Q, _ = np.linalg.qr(Y)
    B = rmatvec(Q).T  # l x f = Q' M
    Ub, s, Vt = np.linalg.svd(B, full_matrices=False)
    return Q @ Ub[:, :k], s[:k], Vt.T


def _maybe_dense(x: np.ndarray | sp.csr_matrix) -> np.ndarray | sp.csr_matrix:
    if sp.issparse(x) and x.nnz > 0.05 * x.shape[0] * x.shape[1]:
        return x.toarray()
    return x


def agc_embedding(x: Any, adj: Any, k: int, order: int, seed: int, kind: str = "agc") -> np.ndarray:
    """Top-k left singular vectors of ``G^order X`` without forming it.

    The Lanczos SVD (ARPACK) only needs ``(G^order X) b = G^order (X b)`` and
    ``(G^order X)' c = X' (G^order c)`` (G symmetric), i.e. sparse products:
    O(order * nnz(G) + nnz(X)) per product. Matches the dense SVD's subspace to
    ~1e-8 (k-means on Wiki changes with a 1e-3 error, so the accuracy matters).
    """
    return agc_singular(x, adj, k, order, seed, kind)[0]


def agc_singular(x: Any, adj: Any, k: int, order: int, seed: int, kind: str = "agc") -> tuple[np.ndarray, np.ndarray]:
    """Top-k left singular vectors and singular values ``(U_k, s_k)`` of ``G^order X``
    (as :func:`agc_embedding`); ``U_k * s_k = G^order X V_k`` is the projection of
    the filtered rows on their top-k right singular subspace, in its own coordinates.
    ``kind``: the graph filter (:data:`FILTERS`)."""
    order = _check_order(order)
    G = agc_filter_matrix(adj, kind)
    n = G.shape[0]
    X = _maybe_dense(_features(x, n))
    k = _check_k(k, min(n, X.shape[1]), "the smaller of rows and columns")

    def filt(M: np.ndarray) -> np.ndarray:
        for _ in range(order):
            M = G @ M
        return np.asarray(M)

    f = X.shape[1]
    with _threads(0.0):
        if k >= min(n, f):  # ARPACK needs k < min(n, f); this is a full SVD anyway
            U, s, _ = np.linalg.svd(filt(X.toarray() if sp.issparse(X) else np.asarray(X)), full_matrices=False)
            return U[:, :k], s[:k]
        # Lanczos (ARPACK) on the implicit operator: ~3x fewer products than the
        # block subspace iteration for the same ~1e-8 subspace accuracy (Wiki).
        op = sla.LinearOperator(
            (n, f), dtype=np.float64,
            matvec=lambda v: filt(np.asarray(X @ v)), rmatvec=lambda c: np.asarray(X.T @ filt(c)),
            matmat=lambda B: filt(np.asarray(X @ B)), rmatmat=lambda C: np.asarray(X.T @ filt(C)))
        v0 = np.random.default_rng(seed).standard_normal(min(n, f))
        U, s, _ = sla.svds(op, k=k, tol=1e-10, v0=v0, solver="arpack")
    top = np.argsort(s)[::-1]
    return U[:, top], s[top]


def agc_intra_distance(F: np.ndarray, labels: np.ndarray) -> float:
    """AGC's ``intra(C) = (1/|C|) sum_{c in C} 2 (mean_{i in c} ||f_i||^2 - ||mu_c||^2)``.

    i.e. the mean over clusters of the average squared distance between two
    members (with i = j pairs), as in the public AGC code's ``square_dist``.
    """
    codes, labels_k = np.unique(labels, return_inverse=True)
    kk = codes.shape[0]
    counts = np.bincount(labels_k, minlength=kk).astype(np.float64)
    onehot = sp.csr_matrix((np.ones(labels_k.shape[0]), (labels_k, np.arange(labels_k.shape[0]))), shape=(kk, labels_k.shape[0]))
    means = np.asarray(onehot @ F) / counts[:, None]
    sq = np.bincount(labels_k, weights=np.einsum("ij,ij->i", F, F), minlength=kk) / counts
    return float(2.0 * np.sum(sq - np.einsum("ij,ij->i", means, means)) / kk)


def agc(
    x: Any,
    adj: Any,
    k: int,
    seed: int,
    order: int | None = None,
    max_order: int = AGC_MAX_ORDER,
    n_init: int = 10,
    kind: str = "agc",
) -> tuple[np.ndarray, int]:
    """AGC: low-pass filter, top-k left singular vectors, k-means. Returns ``(labels, order)``.

    Fixed ``order`` (psi): ``U = top-k left singular vectors of G^psi X``
    (:func:`agc_embedding`), labels = k-means(U) with k-means++ and ``n_init``
    restarts. The kCAGC paper uses psi = 9 (Cora), 15 (CiteSeer), 60 (Pubmed),
    2 (Wiki).

    ``order=None``: AGC's adaptive rule. For psi = 1, 2, ...: filter once more,
    cluster, compute :func:`agc_intra_distance` of the filtered features; stop at
    the first psi whose intra distance is larger than the previous one and
    return the previous psi's clustering (at most ``max_order``). Deviation
    from the AGC code: one k-means with ``n_init`` restarts per psi instead of
    the mean over 10 k-means runs (deterministic for a seed).

    ``kind``: the graph filter G (:data:`FILTERS`; ``"agc"`` is AGC's own).
    """
    seed = _check_seed(seed)
    with _threads(0.0):  # thin-block products and QRs: one thread is fastest here
        return _agc(x, adj, k, seed, order, max_order, n_init, kind)


def _agc(x: Any, adj: Any, k: int, seed: int, order: int | None, max_order: int, n_init: int,
         kind: str) -> tuple[np.ndarray, int]:
    n = _square_sparse(adj).shape[0]
    X = _features(x, n)
    k = _check_k(k, n)
    # with fewer feature columns than clusters (a narrow vertical block) every singular vector is kept
    dim = min(k, X.shape[1])
    if order is not None:
        order = _check_order(order)
        U = agc_embedding(X, adj, dim, order, seed, kind)
        return kmeans(U, k, seed, n_init=n_init), order
    if int(max_order) < 1:
        raise ValueError(f"invalid max_order={max_order}; need >= 1")
    G = agc_filter_matrix(adj, kind)
    F = X.toarray() if sp.issparse(X) else np.array(X, dtype=np.float64, copy=True)
    prev_labels, prev_intra, V = None, np.inf, None
    for psi in range(1, int(max_order) + 1):
        F = np.asarray(G @ F)
        # G^psi X changes little from psi-1 to psi: warm-start from the last right basis
        U, _, V = _randomized_left_sv(lambda B: F @ B, lambda C: F.T @ C, F.shape, dim, seed,
                                      min_iter=4 if V is None else 1, start=V)
        labels = kmeans(U, k, seed, n_init=n_init)
        intra = agc_intra_distance(F, labels)
        if intra > prev_intra:
            return prev_labels, psi - 1
        prev_labels, prev_intra = labels, intra
    return prev_labels, int(max_order)


# ---------------------------------------------------------------------------
# DMoN
# ---------------------------------------------------------------------------
def train_dmon(
    x: Any,
    adj: Any,
    k: int,
    seed: int,
    epochs: int = 1000,
    lr: float = 1e-3,
    dropout: float = 0.5,
    hidden: int = 64,
    collapse_regularization: float = 1.0,
    weight_decay: float = 0.0,
    sparse_features: bool = False,
) -> tuple[np.ndarray, Any]:
    """Train DMoN centrally, full batch (Adam), and return ``(labels, model)``.

    ``labels = argmax_j S_ij`` of the trained model in eval mode (no dropout).
    ``x=None`` uses identity features; ``sparse_features`` feeds them to the
    GCN as a torch sparse COO tensor (same model, much faster on bag-of-words
    features). The per-epoch loss is kept in
    ``model.loss_history``. Model/loss: :class:`app.models.DMoNModel`,
    :func:`app.models.dmon_loss` (lambda = ``collapse_regularization``).
    """
    import torch

    from app.models import DMoNModel, adj_to_edge_index, dmon_loss, features_to_tensor

    A = _square_sparse(adj)
    n = A.shape[0]
    k = _check_k(k, n)
    seed = _check_seed(seed)
    if isinstance(epochs, bool) or int(epochs) < 0:
        raise ValueError(f"invalid epochs={epochs!r}; need an integer >= 0")
    if not lr > 0:
        raise ValueError(f"invalid lr={lr!r}; need lr > 0")
    if x is not None:
        _features(x, n)
    torch.manual_seed(seed)
    xt = features_to_tensor(x, n)
    if sparse_features:
        xt = xt.to_sparse()
    edge_index, edge_weight = adj_to_edge_index(A)
    model = DMoNModel(xt.shape[1], k, hidden=hidden, dropout=dropout)
    opt = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay)
    history: list[float] = []
    model.train()
    for _ in range(int(epochs)):
        opt.zero_grad()
        s = model(xt, edge_index, edge_weight)
        loss = dmon_loss(s, edge_index, edge_weight, collapse_regularization)
        loss.backward()
        opt.step()
        history.append(float(loss.detach()))
    model.eval()
    with torch.no_grad():
        s = model(xt, edge_index, edge_weight)
    model.loss_history = history
    return s.argmax(dim=1).numpy().astype(np.int64), model
