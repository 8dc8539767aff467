"""FedSpectral (baseline, paper Algorithms 1-2).

Each client clusters its local graph with normalised spectral clustering
and uploads the N labels. The server's co-association similarity
``S = (1/C) sum_c H_c H_c^T`` (``H_c`` one-hot, N x K; ``S_ij`` = fraction
of clients putting i and j together, ``S_ii = 1`` as in the paper's loop)
is never formed: ``S = B B^T`` with ``B = [H_1 .. H_C] / sqrt(C)`` (N x CK,
sparse), so the top eigenvectors of ``D^-1/2 S D^-1/2`` come from the small
CK x CK Gram matrix (:func:`coassociation_embedding`); its labels come from
the rows as in FedSpectral+ (:func:`fedgraphcore.protocols.fedspectral.plus.embedding_labels`).
"""

from __future__ import annotations

import math

import numpy as np
import scipy.sparse as sp

from fedgraphcore.protocols.fedspectral.plus import embedding_labels, inverse_sqrt_degrees


def local_spectral_labels(adj: sp.csr_matrix, k: int, seed: int, n_init: int = 10, regularise: str = "off",
                          tau: float = 0.0) -> np.ndarray:
    """Algorithm 1: normalised spectral clustering of the local graph (isolated
    nodes, i.e. no local edge, all go to one cluster, see ``spectral_graph``), regularised as
    :func:`fedgraphcore.clustering.regularisation` decides on that graph (``tau`` 0: its average degree)."""
    from fedgraphcore.clustering import regularisation, spectral_graph

    return spectral_graph(adj, k, seed, n_init=n_init, tau=regularisation(adj, k, regularise, tau))


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


def coassociation_labels(label_sets: list[np.ndarray], k: int, seed: int, n_init: int = 10) -> np.ndarray:
    """Algorithm 2 server side: spectral clustering of the co-association graph."""
    return embedding_labels(coassociation_embedding(label_sets, k), k, seed, n_init)
