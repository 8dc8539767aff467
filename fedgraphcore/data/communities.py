"""Community detection for the ``node-community`` partitioner: one client per community.

:func:`louvain` (networkx's Louvain communities, largest first) and :func:`spectral_parts`
(balanced k-way recursive spectral bisection with a Kernighan-Lin refinement of each cut).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp


def louvain(adj: sp.csr_matrix, seed: int) -> np.ndarray:
    """Louvain communities of ``adj`` as one label per node, numbered largest first."""
    import networkx as nx

    g = nx.from_scipy_sparse_array(adj)
    comms = nx.community.louvain_communities(g, seed=int(seed))
    label = np.empty(adj.shape[0], dtype=np.int64)
    for i, cset in enumerate(sorted(comms, key=lambda s: (-len(s), min(s)))):
        label[list(cset)] = i
    return label


def _fiedler_order(adj: sp.csr_matrix, rng: np.random.Generator, iters: int = 60) -> np.ndarray:
    """Approximate Fiedler vector of the normalised graph by power iteration on
    ``(I + D^-1/2 A D^-1/2) / 2`` with the top eigenvector deflated."""
    n = adj.shape[0]
    deg = np.asarray(adj.sum(axis=1)).ravel() + 1e-9
    dinv = 1.0 / np.sqrt(deg)
    m = sp.diags(dinv) @ adj @ sp.diags(dinv)
    top = np.sqrt(deg)
    top /= np.linalg.norm(top)
    v = rng.standard_normal(n)
    for _ in range(iters):
        v -= top * (top @ v)
        v = 0.5 * (v + m @ v)
        nv = np.linalg.norm(v)
        if nv == 0:
            break
        v /= nv
    # Tie-break by a random key so equal scores (e.g. isolated nodes) spread evenly.
    return np.lexsort((rng.random(n), v * dinv))


def _refine_bisection(adj: sp.csr_matrix, left: np.ndarray, rounds: int = 30) -> np.ndarray:
    """Kernighan-Lin/FM-style refinement: swap equal numbers of positive-gain
    nodes across the cut while the cut shrinks (part sizes are unchanged)."""
    deg = np.asarray(adj.sum(axis=1)).ravel()

    def cut_and_gain(side):
        to_left = adj @ side.astype(np.float64)
        external = np.where(side, deg - to_left, to_left)
        return external.sum() / 2, 2 * external - deg  # gain of moving a node across

    cut, gain = cut_and_gain(left)
    for _ in range(rounds):
        li = np.flatnonzero(left & (gain > 0))
        ri = np.flatnonzero(~left & (gain > 0))
        k = min(li.size, ri.size)
        if k == 0:
            break
        li = li[np.argsort(-gain[li], kind="stable")[:k]]
        ri = ri[np.argsort(-gain[ri], kind="stable")[:k]]
        trial = left.copy()
        trial[li] = False
        trial[ri] = True
        new_cut, new_gain = cut_and_gain(trial)
        if new_cut >= cut:
            # Try the best half only, else stop.
            k //= 2
            if k == 0:
                break
            trial = left.copy()
            trial[li[:k]] = False
            trial[ri[:k]] = True
            new_cut, new_gain = cut_and_gain(trial)
            if new_cut >= cut:
                break
        left, cut, gain = trial, new_cut, new_gain
    return left


def spectral_parts(adj: sp.csr_matrix, k: int, rng: np.random.Generator) -> np.ndarray:
    """Balanced k-way partition by recursive spectral bisection (METIS-style goal:
    equal part sizes, few cut edges). Part sizes differ by at most one."""
    n = adj.shape[0]
    label = np.zeros(n, dtype=np.int64)
    stack = [(np.arange(n), 0, k)]
    while stack:
        ids, first, parts = stack.pop()
        if parts == 1:
            label[ids] = first
            continue
        left_parts = parts // 2
        target = int(round(ids.size * left_parts / parts))
        if ids.size > 2:
            sub = adj[ids][:, ids]
            order = _fiedler_order(sub, rng)
            left = np.zeros(ids.size, dtype=bool)
            left[order[:target]] = True
            left = _refine_bisection(sub, left)
        else:
            left = np.zeros(ids.size, dtype=bool)
            left[rng.permutation(ids.size)[:target]] = True
        stack.append((ids[left], first, left_parts))
        stack.append((ids[~left], first + left_parts, parts - left_parts))
    return label
