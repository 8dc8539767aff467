"""In-memory data types shared by loaders, partitioners, strategies and clients.

Conventions (checked by :meth:`GraphData.validate`):

* ``adj`` is a ``scipy.sparse.csr_matrix`` of shape ``(n, n)``, symmetric,
  ``float64``, with sorted indices, no self-loops and finite positive entries:
  the edge weights, 1 unless the source gives weights (see
  :attr:`GraphData.weighted`). Readers symmetrise directed sources.
  Non-graph datasets (iris, digits, circles) carry an empty ``(n, n)`` matrix.
* ``x`` is ``None`` or an ``(n, f)`` float64 array (dense ``ndarray`` or CSR for
  bag-of-words style features).
* ``y`` is ``None`` or an ``int64`` array of length ``n``; ``-1`` = unknown.
* ``node_keys`` is ``None`` (the nodes are ``0..n-1``) or the user's node IDs in
  row order: ``n`` distinct values, ``int64`` or a numpy unicode array. The
  readers of :mod:`fedgraphcore.data.formats` put the rows in ID order (numeric when
  every ID is an integer, else lexicographic), so one graph gives the same rows
  whatever order its file lists it in, and leave ``None`` for IDs ``0..n-1``.
  ``GraphCollection.graph_keys`` is the same for its graphs.
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


def check_keys(keys: np.ndarray | None, count: int, what: str) -> None:
    """``keys`` is None or ``count`` distinct int64 or unicode IDs (``what`` names them in the error)."""
    if keys is None:
        return
    if keys.ndim != 1 or len(keys) != count:
        raise ValueError(f"{what} must be 1-D of length {count}, got shape {keys.shape}")
    if keys.dtype != np.int64 and keys.dtype.kind != "U":
        raise ValueError(f"{what} must be int64 or a unicode array, got {keys.dtype}")
    if np.unique(keys).size != count:
        raise ValueError(f"{what} are not distinct")


def key_list(keys: np.ndarray | None, count: int) -> np.ndarray:
    """The IDs of ``count`` items: ``keys``, or ``0..count-1`` when None."""
    return np.arange(count, dtype=np.int64) if keys is None else keys


@dataclass
class Boundary:
    """A node split's boundary edges: edges from a party's own rows to nodes it does not hold.

    Each party knows its own nodes' edges, including those to another party's nodes (a
    payment between two banks' customers is on both banks' books), so a cut edge is a
    boundary edge of both its ends' parties. Edge ``e`` joins local row ``rows[e]`` to the
    node whose ID is ``keys[e]`` (the user's ID on a party's own data, the global node id on
    partitioned data) with weight ``weight[e]``; each (row, key) pair once.
    """

    rows: np.ndarray
    keys: np.ndarray
    weight: np.ndarray

    def __len__(self) -> int:
        return int(self.rows.size)

    def validate(self, num_rows: int, what: str = "boundary") -> "Boundary":
        """Raise ``ValueError`` unless rows are in ``0..num_rows-1``, the three arrays align,
        weights are finite and positive and no (row, key) pair repeats."""
        if not (self.rows.shape == self.keys.shape == self.weight.shape and self.rows.ndim == 1):
            raise ValueError(f"{what}: rows, keys and weight must be 1-D of one length")
        if self.rows.dtype != np.int64 or self.weight.dtype != np.float64:
            raise ValueError(f"{what}: rows must be int64 and weight float64")
        if self.keys.dtype != np.int64 and self.keys.dtype.kind != "U":
            raise ValueError(f"{what}: keys must be int64 or a unicode array, got {self.keys.dtype}")
        if self.rows.size and (self.rows.min() < 0 or self.rows.max() >= num_rows):
            raise ValueError(f"{what}: a row outside 0..{num_rows - 1}")
        if not (np.isfinite(self.weight).all() and (self.weight > 0).all()):
            raise ValueError(f"{what}: a weight that is not finite and positive")
        order = np.lexsort((self.keys, self.rows))
        rows, keys = self.rows[order], self.keys[order]
        if ((rows[1:] == rows[:-1]) & (keys[1:] == keys[:-1])).any():
            raise ValueError(f"{what}: a (row, key) pair listed twice")
        return self


def no_boundary(keys_dtype=np.int64) -> Boundary:
    """An empty :class:`Boundary` (a party whose nodes have no edge to another party's)."""
    return Boundary(np.zeros(0, np.int64), np.zeros(0, keys_dtype), np.zeros(0, np.float64))


@dataclass
class GraphData:
    """One attributed graph (or a plain sample matrix with an empty graph).

    ``boundary``: a party's piece read with its edges to node IDs it does not hold
    (:class:`Boundary`); None for a whole graph."""

    name: str
    adj: sp.csr_matrix
    x: np.ndarray | sp.csr_matrix | None = None
    y: np.ndarray | None = None
    meta: dict = field(default_factory=dict)
    node_keys: np.ndarray | None = None
    boundary: Boundary | None = None

    @property
    def num_nodes(self) -> int:
        return int(self.adj.shape[0])

    @property
    def weighted(self) -> bool:
        """Whether some edge has a weight other than 1."""
        return bool(self.adj.nnz) and bool((self.adj.data != 1.0).any())

    @property
    def keys(self) -> np.ndarray:
        """The node IDs in row order (``0..n-1`` without ``node_keys``)."""
        return key_list(self.node_keys, self.num_nodes)

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
            if not (np.isfinite(a.data).all() and (a.data > 0).all()):
                raise ValueError(f"{self.name}: adj has an entry that is not a finite positive weight")
        if self.x is not None and self.x.shape[0] != n:
            raise ValueError(f"{self.name}: x has {self.x.shape[0]} rows, expected {n}")
        if self.y is not None:
            if self.y.shape != (n,) or self.y.dtype != np.int64:
                raise ValueError(f"{self.name}: y must be int64 of shape ({n},)")
        check_keys(self.node_keys, n, f"{self.name}: node_keys")
        if self.boundary is not None:
            self.boundary.validate(n, f"{self.name}: boundary")
        return self


@dataclass
class GraphCollection:
    """A set of small graphs with one label per graph (TUDataset style)."""

    name: str
    graphs: list[GraphData]
    y: np.ndarray
    meta: dict = field(default_factory=dict)
    graph_keys: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.graphs)

    @property
    def weighted(self) -> bool:
        """Whether some edge of some graph has a weight other than 1."""
        return any(g.weighted for g in self.graphs)

    @property
    def keys(self) -> np.ndarray:
        """The graph IDs in order (``0..len-1`` without ``graph_keys``); one per label, so also for
        an evaluation file's labels without their graphs."""
        return key_list(self.graph_keys, len(self.y))

    def validate(self) -> "GraphCollection":
        """Raise ``ValueError`` if a graph breaks the :class:`GraphData` conventions or the
        graph labels or IDs do not fit the graphs."""
        for g in self.graphs:
            g.validate()
        if self.y.shape != (self.num_graphs,) or self.y.dtype != np.int64:
            raise ValueError(f"{self.name}: y must be int64 of shape ({self.num_graphs},)")
        check_keys(self.graph_keys, self.num_graphs, f"{self.name}: graph_keys")
        return self

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
    IDs, or graph IDs for a graph split; they never leave the party. ``boundary`` (node
    splits): the edges from the owned rows to nodes this client does not hold
    (:class:`Boundary`); None when the split drops cut edges.
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
    boundary: Boundary | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    #: Which cut of the data a shard file belongs to (:func:`fedgraphcore.data.shards.shard_cut`); "" for a
    #: shard cut in this process.
    cut: str = ""

    @property
    def num_nodes(self) -> int:
        return int(len(self.node_ids))

    @property
    def num_edges(self) -> int:
        return 0 if self.adj is None else int(self.adj.nnz // 2)

    @property
    def num_graphs(self) -> int:
        return 0 if self.graphs is None else len(self.graphs)

    @property
    def num_boundary(self) -> int:
        """Edges from this client's rows to nodes it does not hold."""
        return 0 if self.boundary is None else len(self.boundary)

    @property
    def item_keys(self) -> np.ndarray:
        """The IDs of the rows: the party's own (``keys``), else the global node ids."""
        return self.node_ids if self.keys is None else self.keys

    @property
    def num_isolated(self) -> int:
        """Rows without an edge in this shard (every row when it holds no graph)."""
        if self.adj is None:
            return self.num_nodes
        return int((sp.csr_matrix(self.adj).getnnz(axis=1) == 0).sum())
