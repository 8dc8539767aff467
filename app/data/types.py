"""In-memory data types shared by loaders, partitioners, strategies and clients.

Conventions (checked by :meth:`GraphData.validate`):

* ``adj`` is a ``scipy.sparse.csr_matrix`` of shape ``(n, n)``, symmetric,
  ``float64``, with sorted indices, no explicit zeros and no self-loops.
  Loaders symmetrise directed sources and collapse duplicate edges to weight 1.
  Non-graph datasets (iris, digits, circles) carry an empty ``(n, n)`` matrix.
* ``x`` is ``None`` or an ``(n, f)`` float64 array (dense ``ndarray`` or CSR for
  bag-of-words style features).
* ``y`` is ``None`` or an ``int64`` array of length ``n``; ``-1`` = unknown.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp



def _num_classes(y: np.ndarray | None) -> int:
    if y is None or len(y) == 0:
        return 0
    return int(np.unique(y[y >= 0]).size)


@dataclass
class GraphData:
    """One attributed graph (or a plain sample matrix with an empty graph)."""

    name: str
    adj: sp.csr_matrix
    x: np.ndarray | sp.csr_matrix | None = None
    y: np.ndarray | None = None
    meta: dict = field(default_factory=dict)

    @property
    def num_nodes(self) -> int:
        return int(self.adj.shape[0])

    @property
    def num_edges(self) -> int:
        """Number of undirected edges (each stored twice in ``adj``)."""
        return int(self.adj.nnz // 2)

    @property
    def num_features(self) -> int:
        return 0 if self.x is None else int(self.x.shape[1])

    @property
    def num_classes(self) -> int:
        """Number of distinct known labels (``-1`` excluded); 0 without labels."""
        return _num_classes(self.y)

    def validate(self) -> "GraphData":
        """Raise ``ValueError`` if the data breaks the conventions above."""
        a = self.adj
        n = a.shape[0]
        if not sp.isspmatrix_csr(a) or a.shape != (n, n):
            raise ValueError(f"{self.name}: adj must be a square CSR matrix")
        if a.dtype != np.float64:
            raise ValueError(f"{self.name}: adj must be float64, got {a.dtype}")
        if a.nnz:
            if a.diagonal().any():
                raise ValueError(f"{self.name}: adj has self-loops")
            if (a != a.T).nnz:
                raise ValueError(f"{self.name}: adj is not symmetric")
            if not a.has_sorted_indices:
                raise ValueError(f"{self.name}: adj indices are not sorted")
        if self.x is not None and self.x.shape[0] != n:
            raise ValueError(f"{self.name}: x has {self.x.shape[0]} rows, expected {n}")
        if self.y is not None:
            if self.y.shape != (n,) or self.y.dtype != np.int64:
                raise ValueError(f"{self.name}: y must be int64 of shape ({n},)")
        return self


@dataclass
class GraphCollection:
    """A set of small graphs with one label per graph (TUDataset style)."""

    name: str
    graphs: list[GraphData]
    y: np.ndarray
    meta: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.graphs)

    @property
    def num_graphs(self) -> int:
        return len(self.graphs)

    @property
    def num_classes(self) -> int:
        return _num_classes(self.y)

    @property
    def num_nodes(self) -> int:
        """Total number of nodes over all graphs."""
        return int(sum(g.num_nodes for g in self.graphs))


@dataclass
class Shard:
    """Everything one client holds, nothing more.

    ``node_ids`` are the global ids of the rows held (edge and vertical splits:
    all nodes). ``adj``/``x``/``y`` are in ``node_ids`` order. ``owned`` marks
    the rows this client is the primary owner of (node partitions with overlap:
    each node is owned by exactly one client, so concatenating the owned rows
    of all clients gives every node once). ``edge_weight`` (edge partition) is
    aligned with ``adj.data``: the number of clients that hold each local edge,
    so ``adj.data / edge_weight`` summed over clients gives the global graph.
    ``graphs``/``graph_ids``/``graph_y`` hold graph-level samples (k-hop
    subgraphs or a share of a graph collection). ``keys`` (a party's own data,
    ``dataset = 'parties'``) are the user's IDs of its items in row order: node
    IDs, or graph IDs for a graph split; they never leave the party.
    """

    client_id: int
    num_clients: int
    dataset: str
    partitioner: str
    node_ids: np.ndarray
    adj: sp.csr_matrix | None = None
    x: np.ndarray | sp.csr_matrix | None = None
    y: np.ndarray | None = None
    feature_cols: np.ndarray | None = None
    edge_weight: np.ndarray | None = None
    graphs: list[GraphData] | None = None
    graph_ids: np.ndarray | None = None
    graph_y: np.ndarray | None = None
    owned: np.ndarray | None = None
    keys: np.ndarray | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def num_nodes(self) -> int:
        return int(len(self.node_ids))

    @property
    def num_edges(self) -> int:
        return 0 if self.adj is None else int(self.adj.nnz // 2)

    @property
    def num_graphs(self) -> int:
        return 0 if self.graphs is None else len(self.graphs)
