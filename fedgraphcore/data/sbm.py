"""Seeded attributed stochastic block model, vectorised for millions of nodes.

Edges are drawn per block pair without ever forming a dense matrix: the number
of edges between blocks ``a`` and ``b`` is ``Binomial(#pairs, p)`` (``p_in`` if
``a == b`` else ``p_out``), and that many *distinct* node pairs are then drawn
uniformly (random endpoints, deduplicated, topped up until the count is
reached). Given its count, the edge set of a block pair is a uniform random
subset of that size, so the graph has exactly the SBM distribution.

Features are Gaussian: node ``i`` in block ``b`` gets ``mu_b + N(0, I)``, with
the block means ``mu_b`` random directions of length ``signal / sqrt(2)``
(so two block means are about ``signal`` apart, in units of the noise std).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from fedgraphcore.config import ConfigError

from .types import GraphData


def block_sizes(nodes: int, blocks: int) -> np.ndarray:
    """Near-equal block sizes (the first ``nodes % blocks`` blocks get one more)."""
    sizes = np.full(blocks, nodes // blocks, dtype=np.int64)
    sizes[: nodes % blocks] += 1
    return sizes


def _distinct_pairs(rng: np.random.Generator, m: int, n_a: int, n_b: int, same: bool) -> np.ndarray:
    """``m`` distinct pairs as int64 keys ``u * n_b + v`` (``u < v`` if ``same``)."""
    keys = np.empty(0, dtype=np.int64)
    while keys.size < m:
        # Oversample a little so one round nearly always suffices.
        need = m - keys.size
        k = need + int(need * 0.05) + 16
        u = rng.integers(0, n_a, size=k, dtype=np.int64)
        v = rng.integers(0, n_b, size=k, dtype=np.int64)
        if same:
            keep = u != v
            u, v = u[keep], v[keep]
            u, v = np.minimum(u, v), np.maximum(u, v)
        new = u * n_b + v
        # Keep first occurrences in draw order, so the chosen set is a
        # uniform subset and independent of how many extra were drawn.
        allk = np.concatenate([keys, new])
        _, first = np.unique(allk, return_index=True)
        first.sort()
        keys = allk[first]
    return keys[:m]


def generate_sbm(
    nodes: int = 1000,
    blocks: int = 4,
    p_in: float = 0.05,
    p_out: float = 0.005,
    features: int = 16,
    signal: float = 5.0,
    seed: int = 0,
) -> GraphData:
    """Attributed SBM as :class:`GraphData` (labels = planted blocks).

    Node ids are a random permutation of the blocks (ids carry no block
    information). ``features=0`` gives ``x=None``. Memory is O(edges + n*f).
    """
    _check_sbm(nodes, blocks, p_in, p_out, features)
    rng = np.random.default_rng([int(seed), 0x5B])
    sizes = block_sizes(nodes, blocks)
    y = np.repeat(np.arange(blocks, dtype=np.int64), sizes)
    perm = rng.permutation(nodes)  # perm[k] = global id of the k-th node in block order
    y_global = np.empty(nodes, dtype=np.int64)
    y_global[perm] = y
    r, c = _sbm_edges(rng, sizes, perm, p_in, p_out)
    adj = _symmetric_adjacency(r, c, nodes)
    x = _block_features(rng, y_global, blocks, features, signal) if features > 0 else None
    meta = {
        "source": "synthetic",
        "generator": "attributed SBM",
        "nodes": int(nodes),
        "blocks": int(blocks),
        "p_in": float(p_in),
        "p_out": float(p_out),
        "features": int(features),
        "signal": float(signal),
        "seed": int(seed),
        "block_sizes": [int(s) for s in sizes],
    }
    return GraphData(name="sbm", adj=adj, x=x, y=y_global, meta=meta)


def _check_sbm(nodes: int, blocks: int, p_in: float, p_out: float, features: int) -> None:
    """A one-line ConfigError for sizes, probabilities or a feature count the SBM cannot have."""
    if nodes < 1 or blocks < 1 or blocks > nodes:
        raise ConfigError(f"invalid SBM size: nodes={nodes}, blocks={blocks}; need 1 <= blocks <= nodes")
    for key, p in (("p-in", p_in), ("p-out", p_out)):
        if not 0.0 <= p <= 1.0:
            raise ConfigError(f"invalid value {p!r} for 'sbm.{key}'; valid range: [0, 1]")
    if features < 0:
        raise ConfigError(f"invalid value {features!r} for 'sbm.features'; valid range: [0, inf]")


def _sbm_edges(rng: np.random.Generator, sizes: np.ndarray, perm: np.ndarray, p_in: float,
               p_out: float) -> tuple[np.ndarray, np.ndarray]:
    """Both endpoints (global ids) of every edge, each edge once: the edge count of every block
    pair (a <= b) in one vectorised draw, then that many distinct pairs of each."""
    blocks = sizes.size
    starts = np.concatenate([[0], np.cumsum(sizes)])
    pa, pb = np.triu_indices(blocks)
    same_all = pa == pb
    pair_counts = np.where(same_all, sizes[pa] * (sizes[pa] - 1) // 2, sizes[pa] * sizes[pb])
    counts = rng.binomial(pair_counts, np.where(same_all, p_in, p_out))
    rows, cols = [], []
    for a, b, m in zip(pa[counts > 0], pb[counts > 0], counts[counts > 0]):
        a, b = int(a), int(b)
        u, v = _block_pair_edges(rng, int(m), int(sizes[a]), int(sizes[b]), a == b)
        rows.append(perm[starts[a] + u])
        cols.append(perm[starts[b] + v])
    if not rows:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    return np.concatenate(rows), np.concatenate(cols)


def _block_pair_edges(rng: np.random.Generator, m: int, n_a: int, n_b: int,
                      same: bool) -> tuple[np.ndarray, np.ndarray]:
    """``m`` distinct edges between blocks of ``n_a`` and ``n_b`` nodes (``same``: within one
    block, ``u < v``), as indices into each block."""
    pairs = n_a * (n_a - 1) // 2 if same else n_a * n_b
    if m > pairs // 2:
        # Dense block pair: draw per-pair Bernoulli directly.
        if same:
            iu, ju = np.triu_indices(n_a, k=1)
        else:
            iu, ju = np.divmod(np.arange(pairs, dtype=np.int64), n_b)
        sel = np.sort(rng.choice(pairs, size=m, replace=False))
        return iu[sel], ju[sel]
    return np.divmod(_distinct_pairs(rng, m, n_a, n_b, same), n_b)


def _symmetric_adjacency(r: np.ndarray, c: np.ndarray, nodes: int) -> sp.csr_matrix:
    """The symmetric 0/1 adjacency of the edges ``(r, c)``, sorted indices, int32 where they fit."""
    idx_dtype = np.int32 if nodes < 2**31 - 1 else np.int64
    r = r.astype(idx_dtype, copy=False)
    c = c.astype(idx_dtype, copy=False)
    data = np.ones(2 * r.size, dtype=np.float64)
    adj = sp.csr_matrix(
        (data, (np.concatenate([r, c]), np.concatenate([c, r]))), shape=(nodes, nodes)
    )
    adj.sum_duplicates()  # no-op on data (pairs are distinct) but sorts indices
    adj.sort_indices()
    return adj


def _block_features(rng: np.random.Generator, y: np.ndarray, blocks: int, features: int,
                    signal: float) -> np.ndarray:
    """Node features ``mu_b + N(0, I)``: the block means random directions of length ``signal / sqrt(2)``."""
    means = rng.standard_normal((blocks, features))
    means *= (signal / np.sqrt(2.0)) / np.linalg.norm(means, axis=1, keepdims=True)
    x = rng.standard_normal((y.size, features))
    x += means[y]
    return x
