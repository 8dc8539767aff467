"""Boundary edges of a node split: a party's edges to nodes another party holds.

A party's edge list may name node IDs its node table does not list: each such edge
joins one of its own nodes to a node of another party (a payment between two banks'
customers is on both banks' books), and is one of its :class:`~fedgraphcore.data.types.Boundary`
edges. This module reads them out of an edge list (:func:`split_edges`), puts them
in the graph's row order (:func:`in_row_order`), and pools node-split pieces into
the one graph the centralised reference runs on, every edge once (:func:`pool`).
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import pandas as pd
import scipy.sparse as sp

from .assemble import DataFileError, show
from .types import Boundary, GraphData, check_keys, no_boundary


def _merged(rows: np.ndarray, keys: np.ndarray, weight: np.ndarray, where: Callable[[int], str],
            line: np.ndarray) -> Boundary:
    """One entry per (row, other end): a repeat with the same weight merges; another weight is refused."""
    if rows.size == 0:
        return Boundary(rows.astype(np.int64), keys, weight.astype(np.float64))
    order = np.lexsort((keys, rows))
    rows, keys, weight, line = rows[order], keys[order], weight[order], line[order]
    same = (rows[1:] == rows[:-1]) & (keys[1:] == keys[:-1])
    clash = np.flatnonzero(same & (weight[1:] != weight[:-1]))
    if clash.size:
        i = int(clash[0])
        raise DataFileError(f"{where(int(line[i + 1]))}: the edge to node {show(keys[i])} has weight "
                            f"{weight[i + 1]:g} and, on {where(int(line[i]))}, {weight[i]:g}; valid: one weight per "
                            "undirected edge", rule="one weight per undirected edge")
    keep = np.concatenate([[True], ~same])
    return Boundary(rows[keep].astype(np.int64), keys[keep], weight[keep].astype(np.float64))


def split_edges(table_keys: np.ndarray, edge_keys: np.ndarray, src: np.ndarray, dst: np.ndarray,
                weight: np.ndarray | None, where: Callable[[int], str]) -> tuple[np.ndarray, np.ndarray,
                                                                                  np.ndarray | None, Boundary]:
    """Split edges ``src[i] - dst[i]`` (codes into ``edge_keys``) into those between two
    node-table rows (returned as table rows, with their weights) and boundary edges (one
    end in the table, the other not: table row, other end's ID, weight), in table-row order.
    An edge with neither end in the table is refused (``where(i)`` names edge ``i``)."""
    rows = pd.Index(table_keys).get_indexer(edge_keys)
    a, b = rows[src], rows[dst]
    neither = np.flatnonzero((a < 0) & (b < 0))
    if neither.size:
        i = int(neither[0])
        raise DataFileError(f"{where(i)} joins nodes {show(edge_keys[src[i]])} and {show(edge_keys[dst[i]])}, neither "
                            "of which the node table lists; valid: an edge with at least one end in the node table "
                            "(the other end may be another party's node)", rule="an edge end in the node table")
    inside = (a >= 0) & (b >= 0)
    line = np.flatnonzero(~inside)
    own = np.where(a[line] >= 0, a[line], b[line])
    other = np.where(a[line] >= 0, dst[line], src[line])
    w = np.ones(line.size) if weight is None else np.asarray(weight, dtype=np.float64)[line]
    boundary = _merged(own.astype(np.int64), np.asarray(edge_keys)[other], w, where, line)
    return a[inside], b[inside], None if weight is None else weight[inside], boundary


def in_row_order(boundary: Boundary, table_keys: np.ndarray, graph_keys: np.ndarray) -> Boundary:
    """``boundary`` with its rows moved from node-table order to the graph's row order."""
    to_graph = pd.Index(graph_keys).get_indexer(np.asarray(table_keys)[boundary.rows])
    return Boundary(to_graph.astype(np.int64), boundary.keys, boundary.weight)


def count(boundary: Boundary | None) -> tuple[int, int]:
    """Boundary edges and the distinct other-party nodes they reach."""
    if boundary is None or not len(boundary):
        return 0, 0
    return len(boundary), int(np.unique(boundary.keys).size)


def pool(pieces: Sequence[GraphData], name: str = "pooled") -> GraphData:
    """The whole graph of node-split ``pieces`` (each a party's nodes, its edges among them and
    its boundary edges): every node once, every edge once (a cut edge is a boundary edge of
    both its ends' parties and counts once), features and labels stacked. The centralised
    reference runs on it. ``ValueError`` for a node held twice, a boundary edge to an ID no
    piece holds, or a cut edge two pieces weigh differently."""
    numeric = all(p.keys.dtype == np.int64 for p in pieces)
    keys = np.concatenate([p.keys if numeric else _text(p.keys) for p in pieces])
    check_keys(keys, keys.size, f"{name}: node IDs over the pieces")
    offsets = np.concatenate([[0], np.cumsum([p.num_nodes for p in pieces])])
    position = pd.Index(_text(keys))
    blocks, cut = [], []
    for i, p in enumerate(pieces):
        coo = sp.coo_matrix(p.adj)
        blocks.append((coo.row + offsets[i], coo.col + offsets[i], coo.data))
        b = p.boundary if p.boundary is not None else no_boundary()
        far = position.get_indexer(_text(b.keys))
        if (far < 0).any():
            raise ValueError(f"{name}: piece {i} has a boundary edge to node {show(b.keys[far < 0][0])}, which no "
                             "piece holds")
        cut.append((b.rows + offsets[i], far, b.weight))
    adj = _pooled_adjacency(blocks, cut, keys.size, name)
    x = _stacked([p.x for p in pieces])
    y = None if any(p.y is None for p in pieces) else np.concatenate([p.y for p in pieces]).astype(np.int64)
    return GraphData(name, adj, x, y, {"pieces": len(pieces)}, keys).validate()


def _pooled_adjacency(blocks: list, cut: list, n: int, name: str) -> sp.csr_matrix:
    """Inner edges as given; each cut edge from its two listings, which must agree."""
    rows = np.concatenate([b[0] for b in blocks] + [np.zeros(0, np.int64)])
    cols = np.concatenate([b[1] for b in blocks] + [np.zeros(0, np.int64)])
    data = np.concatenate([b[2] for b in blocks] + [np.zeros(0)])
    inner = sp.csr_matrix((data, (rows, cols)), shape=(n, n))
    cr = np.concatenate([c[0] for c in cut] + [np.zeros(0, np.int64)])
    cc = np.concatenate([c[1] for c in cut] + [np.zeros(0, np.int64)])
    cw = np.concatenate([c[2] for c in cut] + [np.zeros(0)])
    listed = sp.csr_matrix((cw, (cr, cc)), shape=(n, n))
    times = sp.csr_matrix((np.ones_like(cw), (cr, cc)), shape=(n, n))
    # a cut edge listed by both ends' pieces: (i, j) and (j, i) each once, with one weight
    one_sided = (times != times.T).nnz
    if one_sided or (listed != listed.T).nnz:
        raise ValueError(f"{name}: a cut edge that only one of its two pieces lists, or with two weights; valid: "
                         "each piece lists its nodes' edges to other pieces' nodes with the same weight")
    adj = sp.csr_matrix(inner + listed)
    adj.sort_indices()
    return adj


def _stacked(blocks: list):
    if any(b is None for b in blocks):
        return None
    if any(sp.issparse(b) for b in blocks):
        return sp.csr_matrix(sp.vstack([sp.csr_matrix(b) for b in blocks]))
    return np.vstack(blocks)


def _text(keys: np.ndarray) -> np.ndarray:
    """IDs compared as text (an integer ID 7 and a text ID "7" are one node, as in the digests)."""
    return np.asarray(keys).astype(str)
