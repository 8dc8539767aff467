"""A client's graphs: node features, its train/validation/test split and the block-diagonal batch."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from .wire import FOLDS, SPLIT_TEST, SPLIT_TRAIN, SPLIT_VAL


def node_features(graph, degree_dim: int) -> np.ndarray:
    """Dense float32 node features of one graph; graphs without features
    (IMDB-BINARY) get a one-hot of ``min(degree, degree_dim - 1)``."""
    if graph.x is not None:
        x = graph.x.toarray() if sp.issparse(graph.x) else np.asarray(graph.x)
        return x.astype(np.float32)
    deg = np.asarray(graph.adj.sum(axis=1)).ravel().astype(np.int64)
    out = np.zeros((graph.adj.shape[0], degree_dim), dtype=np.float32)
    out[np.arange(deg.size), np.minimum(deg, degree_dim - 1)] = 1.0
    return out


def split_items(n: int, seed: int, client: int, ratios=(0.7, 0.2, 0.1), fold: int = -1) -> np.ndarray:
    """Train/val/test split (codes 0/1/2) of ``n`` items, seeded per client.

    ``fold = -1``: a random split in ``ratios`` (7:2:1 by default), at least
    one training item when ``n >= 1``. ``fold`` in ``0..9``: ten-fold
    cross-validation of the same 7:2:1 shape: the items are permuted (seeded)
    and cut into ten near-equal chunks; chunk ``fold`` is the test set, the
    next two chunks (cyclically) the validation set, the other seven the
    training set, so the ten folds test every item exactly once.
    """
    rng = np.random.default_rng([int(seed), 8, int(client)])
    split = np.full(n, SPLIT_TRAIN, dtype=np.int8)
    perm = rng.permutation(n)
    if fold >= 0:
        if fold >= FOLDS:
            raise ValueError(f"fold {fold} out of range; valid: -1 (random split) or 0..{FOLDS - 1}")
        chunk = (np.arange(n) * FOLDS) // max(n, 1)   # chunk of each permuted position
        split[perm[chunk == fold]] = SPLIT_TEST
        split[perm[np.isin(chunk, [(fold + 1) % FOLDS, (fold + 2) % FOLDS])]] = SPLIT_VAL
        return split
    n_test = int(round(ratios[2] * n))
    n_val = int(round(ratios[1] * n))
    if n - n_test - n_val < 1:
        n_test = min(n_test, max(0, n - 1))
        n_val = max(0, n - 1 - n_test)
    split[perm[:n_val]] = SPLIT_VAL
    split[perm[n_val:n_val + n_test]] = SPLIT_TEST
    return split


@dataclass
@dataclass
class GraphBatch:
    """Block-diagonal batch of graphs for full-batch training."""

    x: "object"            # torch float tensor (total nodes x f)
    edge_index: "object"   # torch long tensor (2 x E)
    batch: "object"        # torch long tensor: graph index of each node
    offsets: np.ndarray    # first node of each graph (num_graphs + 1,)

    @property
    def num_graphs(self) -> int:
        return len(self.offsets) - 1


def make_batch(graphs, degree_dim: int) -> GraphBatch:
    import torch

    xs, edges, sizes = [], [], []
    start = 0
    for g in graphs:
        xs.append(node_features(g, degree_dim))
        coo = sp.coo_matrix(g.adj)
        edges.append(np.vstack([coo.row, coo.col]).astype(np.int64) + start)
        sizes.append(g.adj.shape[0])
        start += g.adj.shape[0]
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    return GraphBatch(
        x=torch.from_numpy(np.vstack(xs)) if xs else torch.zeros((0, 1)),
        edge_index=torch.from_numpy(np.hstack(edges)) if edges else torch.zeros((2, 0), dtype=torch.long),
        batch=torch.from_numpy(np.repeat(np.arange(len(sizes)), sizes).astype(np.int64)),
        offsets=offsets,
    )


def graph_slices(batch: GraphBatch) -> list[tuple]:
    """Per graph of the batch, its own ``(x, edge_index)`` (local node ids)."""
    import torch

    # one stable sort of the edges by graph instead of a mask over all edges per graph
    src_graph = batch.batch[batch.edge_index[0]]
    order = torch.argsort(src_graph, stable=True)
    ends = torch.bincount(src_graph, minlength=len(batch.offsets) - 1).cumsum(0).tolist()
    edges = batch.edge_index[:, order]
    out, start = [], 0
    for (a, b), end in zip(zip(batch.offsets[:-1], batch.offsets[1:]), ends):
        out.append((batch.x[int(a):int(b)], edges[:, start:end] - int(a)))
        start = end
    return out
