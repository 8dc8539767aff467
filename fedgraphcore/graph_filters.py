"""Low-pass graph filters and AGC (Zhang et al., IJCAI 2019), the centralised method kCAGC approximates.

AGC as in its public code and the kCAGC paper: ``G = (I + D~^-1/2 (A+I) D~^-1/2) / 2``
applied ``psi`` times, top-k left singular vectors, k-means; fixed or adaptive
``psi``. ``kind="spectral-norm"`` swaps in the kCAGC paper's second filter
``G = I - L_s / ||L_s||`` (its Appendix E.2). The SVD is a randomised range finder
on the implicit operator ``G^psi X`` (sparse products only), so Cora takes a few
tens of ms. Plain functions (no Flower), deterministic for a given ``seed``.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as sla

from fedgraphcore.clustering import check_k, check_seed, as_features, square_sparse, blas_threads, kmeans

AGC_MAX_ORDER = 60  # AGC code: max_iter = 60

#: Low-pass graph filters ``G = I - L_s / c`` on the self-looped normalised Laplacian
#: ``L_s = I - D~^-1/2 (A+I) D~^-1/2``: ``"agc"`` (c = 2, AGC's filter, frequency response
#: ``1 - lambda/2``) and ``"spectral-norm"`` (c = ||L_s||, its largest eigenvalue: response
#: ``1 - lambda/||L_s||``, which removes the top frequency; kCAGC paper, Appendix E.2).
FILTERS = ("agc", "spectral-norm")


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
    A = square_sparse(adj)
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
    x = as_features(x, G.shape[0])
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
    X = _maybe_dense(as_features(x, n))
    k = check_k(k, min(n, X.shape[1]), "the smaller of rows and columns")

    def filt(M: np.ndarray) -> np.ndarray:
        for _ in range(order):
            M = G @ M
        return np.asarray(M)

    f = X.shape[1]
    with blas_threads(0.0):
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
    seed = check_seed(seed)
    with blas_threads(0.0):  # thin-block products and QRs: one thread is fastest here
        return _agc(x, adj, k, seed, order, max_order, n_init, kind)


def _agc(x: Any, adj: Any, k: int, seed: int, order: int | None, max_order: int, n_init: int,
         kind: str) -> tuple[np.ndarray, int]:
    n = square_sparse(adj).shape[0]
    X = as_features(x, n)
    k = check_k(k, n)
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
