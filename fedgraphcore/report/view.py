"""What a run's page draws, computed once from the run's data when the run ends.

The page (:mod:`fedgraphcore.report.page`) must be written again later from the run's folder alone
(``python -m app.report RUN_DIR``), also when the data was in memory or is gone: so everything it
needs of the data is kept in ``report-data.npz`` beside ``result.json`` (plain arrays and one JSON
text, read without pickle). What it holds depends on the data, and is capped so that the page
stays small and quick whatever the graph's size:

* a graph of at most :data:`SMALL_GRAPH` nodes: every node at a spring layout (networkx,
  seeded: the same picture every time) and every edge;
* a larger graph, or rows without edges: a sample of at most :data:`SAMPLE` items (every
  cluster represented) placed by the first two principal components of their features (on a
  graph, each node's features averaged with its neighbours', the view of the graph filters);
  without features, by the share of each node's edges into each cluster;
  and, on a graph, the cluster-level graph: the edge weight between and inside clusters;
* a graph collection (or k-hop subgraphs) with the method's distance matrix (gw-ldp's
  Gromov-Wasserstein distances): at most :data:`SAMPLE_GRAPHS` graphs placed by classical
  multidimensional scaling of their distances.

The ground truth of every item is kept too (the contingency tables need it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from fedgraphcore.data.types import GraphCollection, GraphData

VIEW_FILE = "report-data.npz"
#: nodes up to which the whole graph is drawn, every edge included
SMALL_GRAPH = 300
#: items drawn at most in an embedding of a larger graph or of rows
SAMPLE = 2000
#: graphs drawn at most from a collection
SAMPLE_GRAPHS = 400
#: items of every cluster the sample keeps at least (all of a smaller cluster)
PER_CLUSTER = 20
ARRAYS = ("truth", "sample", "xy", "edges", "cluster_edges")


@dataclass
class View:
    """The arrays the page draws and, in ``meta``, what they are (shown on the page)."""

    kind: str  # "graph" (every node, with its edges), "sample" (an embedding), "collection", "none"
    truth: np.ndarray | None = None
    sample: np.ndarray | None = None
    xy: np.ndarray | None = None
    edges: np.ndarray | None = None
    cluster_edges: np.ndarray | None = None
    meta: dict = field(default_factory=dict)

    def save(self, path: Path) -> Path:
        """Write the view to ``path`` (an ``.npz``; ``meta`` as one JSON text; labels in the narrowest
        integer type that holds them)."""
        arrays = {name: getattr(self, name) for name in ARRAYS if getattr(self, name) is not None}
        if self.truth is not None and self.truth.size:
            arrays["truth"] = self.truth.astype(np.min_scalar_type(-max(int(self.truth.max()), 1)))
        with open(path, "wb") as f:
            np.savez_compressed(f, meta=np.array(json.dumps({**self.meta, "kind": self.kind})), **arrays)
        return path

    @classmethod
    def load(cls, path: Path) -> "View":
        with np.load(path, allow_pickle=False) as stored:
            meta = json.loads(str(stored["meta"]))
            arrays = {name: stored[name] for name in ARRAYS if name in stored.files}
        if "truth" in arrays:
            arrays["truth"] = arrays["truth"].astype(np.int64)
        return cls(kind=meta.pop("kind"), meta=meta, **arrays)


def build_view(data, labels: np.ndarray, truth: np.ndarray | None = None, distances: np.ndarray | None = None,
               seed: int = 0) -> View:
    """The :class:`View` of a run whose items got ``labels`` (-1: none): ``data`` the pooled data
    (None on the parties' own data: nothing to draw), ``truth`` the items' ground truth when the
    items are not the data's own (k-hop subgraphs), ``distances`` the method's pairwise distances
    between the items (in item order) where it computes them."""
    labels = np.asarray(labels, dtype=np.int64)
    if data is None:
        return View("none", meta={"why": "the server holds no pooled data (each party keeps its own)"})
    view = _drawn(data, labels, truth, distances, seed)
    view.meta = {**shape(data, labels.size), **view.meta}
    return view


def shape(data, items: int) -> dict:
    """The data's size for the page's header: items, edges, feature columns, classes and their names."""
    if isinstance(data, GraphCollection):
        found = {"items": items, "graphs": data.num_graphs}
    else:
        found = {"items": items, "edges": data.num_edges if data.adj.nnz else None,
                 "features": data.num_features or None}
    names = data.meta.get("label_names")
    if getattr(data, "y", None) is not None and data.num_classes:
        found["classes"] = data.num_classes
        if names is not None and len(names) <= 200:
            found["class_names"] = [str(n) for n in names]
    return found


def _drawn(data, labels: np.ndarray, truth, distances, seed: int) -> View:
    """The :class:`View` of :func:`build_view` without the data's size."""
    if truth is None and getattr(data, "y", None) is not None and len(data.y) == labels.size:
        truth = np.asarray(data.y, dtype=np.int64)
    if distances is not None:
        return _collection(labels, truth, np.asarray(distances, dtype=np.float64), seed)
    if isinstance(data, GraphCollection) or labels.size != data.num_nodes:
        return View("none", truth=truth, meta={"why": "the method computes no distances between the graphs"})
    rows = data.x is not None and data.x.shape[1] > 0
    if data.adj.nnz and data.num_nodes <= SMALL_GRAPH:
        return _small_graph(data, labels, truth, seed)
    if not data.adj.nnz and not rows:
        return View("none", truth=truth, meta={"why": "the data holds neither edges nor features here"})
    return _sampled(data, labels, truth, seed)


def _small_graph(data: GraphData, labels: np.ndarray, truth, seed: int) -> View:
    import networkx as nx

    graph = nx.from_scipy_sparse_array(data.adj)
    placed = nx.spring_layout(graph, seed=seed, iterations=100)
    xy = np.array([placed[i] for i in range(data.num_nodes)], dtype=np.float32)
    upper = sp.triu(data.adj, k=1, format="coo")
    edges = np.column_stack([upper.row, upper.col]).astype(np.int32)
    return View("graph", truth=truth, sample=np.arange(data.num_nodes), xy=xy, edges=edges,
                cluster_edges=cluster_edges(data.adj, labels),
                meta={"layout": f"every node and edge, spring layout (networkx, seed {seed})",
                      "items": data.num_nodes, "edges": int(upper.nnz)})


def sample_items(labels: np.ndarray, limit: int, seed: int) -> np.ndarray:
    """At most ``limit`` item positions, sorted: a uniform draw, topped up so that every cluster
    (and the unlabelled items, -1) keeps :data:`PER_CLUSTER` items or all it has."""
    n = labels.size
    if n <= limit:
        return np.arange(n)
    rng = np.random.default_rng(seed)
    chosen = np.zeros(n, dtype=bool)
    for value in np.unique(labels):
        members = np.flatnonzero(labels == value)
        chosen[rng.choice(members, min(PER_CLUSTER, members.size), replace=False)] = True
    rest = np.flatnonzero(~chosen)
    room = max(0, limit - int(chosen.sum()))
    chosen[rng.choice(rest, min(room, rest.size), replace=False)] = True
    return np.flatnonzero(chosen)


def _sampled(data: GraphData, labels: np.ndarray, truth, seed: int) -> View:
    sample = sample_items(labels, SAMPLE, seed)
    graph = bool(data.adj.nnz)
    if data.x is not None and data.x.shape[1] > 0:
        rows, placed = _feature_rows(data, sample, graph), ("features averaged over each node and its neighbours"
                                                            if graph else "features")
    else:
        rows, placed = _neighbour_shares(data.adj, labels, sample), "share of each node's edges into each cluster"
    drawn = f"{sample.size} of {labels.size} items (every cluster kept)" if sample.size < labels.size else \
        f"all {labels.size} items"
    meta = {"layout": f"{drawn}, placed by the first two principal components of their {placed}",
            "items": int(labels.size), "drawn": int(sample.size)}
    view = View("sample", truth=truth, sample=sample, xy=principal_plane(rows, seed), meta=meta)
    if graph:
        view.cluster_edges = cluster_edges(data.adj, labels)
        meta["edges"] = int(data.adj.nnz // 2)
    return view


def _feature_rows(data: GraphData, sample: np.ndarray, graph: bool) -> np.ndarray:
    """The sample's feature rows (dense), each averaged with its neighbours' on a graph."""
    x = data.x
    rows = x[sample]
    if graph:
        adj = data.adj[sample]
        degree = np.asarray(adj.sum(axis=1)).ravel()
        rows = (rows + adj @ x) / (1.0 + degree)[:, None]
    return rows.toarray() if sp.issparse(rows) else np.asarray(rows, dtype=np.float64)


def _neighbour_shares(adj: sp.csr_matrix, labels: np.ndarray, sample: np.ndarray) -> np.ndarray:
    """Per sampled node, the share of its edge weight into each cluster (a row of zeros when isolated)."""
    k = int(labels.max()) + 2 if labels.size else 1
    sub = adj[sample].tocoo()
    shares = np.zeros((sample.size, k))
    np.add.at(shares, (sub.row, labels[sub.col] + 1), sub.data)
    total = shares.sum(axis=1, keepdims=True)
    return np.divide(shares, total, out=np.zeros_like(shares), where=total > 0)


def principal_plane(rows: np.ndarray, seed: int) -> np.ndarray:
    """``rows`` (m x f) projected on their first two principal axes (padded with zeros below 2
    columns), float32; a tiny seeded jitter keeps equal rows from hiding each other."""
    rows = np.nan_to_num(np.asarray(rows, dtype=np.float64))
    centred = rows - rows.mean(axis=0)
    if centred.shape[1] > 2 and centred.shape[0] > 2:
        _, _, vt = np.linalg.svd(centred, full_matrices=False)
        plane = centred @ vt[:2].T
    else:
        plane = np.pad(centred, ((0, 0), (0, max(0, 2 - centred.shape[1]))))[:, :2]
    spread = float(np.abs(plane).max()) if plane.size else 0.0
    plane += np.random.default_rng(seed).normal(0.0, 0.005 * (spread or 1.0), plane.shape)
    return plane.astype(np.float32)


def cluster_edges(adj: sp.csr_matrix, labels: np.ndarray) -> np.ndarray:
    """The k x k edge weight between clusters (each undirected edge once, in the upper triangle; an
    edge inside a cluster on the diagonal); items without a label (-1) left out. One pass over the
    stored entries (each edge is stored both ways: between clusters it counts once each way, inside
    one twice on the diagonal)."""
    k = int(labels.max()) + 1 if labels.size else 0
    adj = sp.csr_matrix(adj)
    code = np.where(labels >= 0, labels, k).astype(np.int32)  # the unlabelled as cluster k, dropped below
    pairs = np.repeat(code * (k + 1), np.diff(adj.indptr)) + code[adj.indices]
    weights = None if adj.nnz and (adj.data == 1.0).all() else adj.data
    both = np.bincount(pairs, weights=weights, minlength=(k + 1) ** 2).reshape(k + 1, k + 1)[:k, :k].astype(float)
    return np.triu(both, 1) + np.diag(np.diag(both) / 2)


def dense_distances(distances: np.ndarray, ids: np.ndarray | None, num_items: int) -> np.ndarray:
    """The method's distances between its items ``ids`` laid out over all ``num_items`` items (an
    item no client sent: at the largest distance from every other)."""
    if ids is None:
        return np.asarray(distances, dtype=np.float64)
    ids = np.asarray(ids, dtype=np.int64)
    out = np.full((num_items, num_items), float(np.max(distances)) if np.size(distances) else 0.0)
    out[np.ix_(ids, ids)] = distances
    np.fill_diagonal(out, 0.0)
    return out


def _collection(labels: np.ndarray, truth, distances: np.ndarray, seed: int) -> View:
    sample = sample_items(labels, SAMPLE_GRAPHS, seed)
    xy = classical_scaling(distances[np.ix_(sample, sample)])
    return View("collection", truth=truth, sample=sample, xy=xy,
                meta={"layout": (f"{sample.size} of {labels.size} graphs" if sample.size < labels.size else
                                 f"all {labels.size} graphs") + " placed by classical multidimensional scaling of "
                                "the method's distances between them", "items": int(labels.size),
                      "drawn": int(sample.size)})


def classical_scaling(distances: np.ndarray) -> np.ndarray:
    """2-D coordinates whose Euclidean distances best match ``distances`` (Torgerson's classical
    scaling: the top two eigenvectors of the double-centred squared distances), float32."""
    m = distances.shape[0]
    d2 = np.nan_to_num(np.square(0.5 * (distances + distances.T)))
    centring = np.eye(m) - 1.0 / m
    gram = -0.5 * centring @ d2 @ centring
    values, vectors = np.linalg.eigh(gram)
    top = np.argsort(values)[::-1][:2]
    xy = vectors[:, top] * np.sqrt(np.clip(values[top], 0.0, None))
    return np.pad(xy, ((0, 0), (0, 2 - xy.shape[1]))).astype(np.float32)
