"""Per-party folders in the user file format, cut from a whole graph, to rehearse a deployment.

``python -m app.data.prepare ... --format files`` writes ``OUT/party-<i>/`` with
what party i would hold in the split (:mod:`fedgraphcore.data.parties`), in the layout
:func:`fedgraphcore.data.formats.read_graph` reads from a directory, with the whole
graph's node and graph IDs:

* node split (``node-*``, ``sample*``): ``nodes.csv`` (``id``, the feature columns and the label
  column, named as the data's node table names them, else ``x<column>`` and ``label``) of its
  nodes, ``edges.csv`` (``source``,
  ``target``[, ``weight``]) of the edges among them and (``partition.boundary``)
  of its boundary edges, to the other end's ID;
* ``edge``: ``nodes.csv`` with every node's ID (and features with
  ``partition.with-features``), ``edges.csv`` of its edges;
* ``vertical``: ``nodes.csv`` with every node's ID, its feature columns and the labels,
  ``edges.csv`` of the whole graph;
* ``graph-dirichlet``: ``graphs.csv`` (``graph``, ``label``), ``edges.csv``
  (``graph``, ``source``, ``target``[, ``weight``]) and ``nodes.csv`` (``graph``,
  ``id``, feature columns) of its graphs.

An edges file is left out where a party holds no edge (``nodes.csv`` then says
which nodes it holds). A label column is written only where a party's labels
hold two classes or more (the reader refuses one class), with the labels as the
data wrote them; unknown labels are empty fields. ``khop`` parties hold nodes: cut them with a node partitioner.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import scipy.sparse as sp

from fedgraphcore.config import ConfigError

from .parties import family
from .types import GraphCollection, GraphData, Shard


def _weighted(*adjs: sp.csr_matrix) -> bool:
    return any(a.nnz and (a.data != 1.0).any() for a in adjs)


def _edges(adj: sp.csr_matrix, keys: np.ndarray, weighted: bool, lead: dict | None = None) -> pd.DataFrame:
    """Each undirected edge once (upper triangle), its ends as ``keys``, with its weight if ``weighted``."""
    up = sp.triu(adj, k=1, format="coo")
    frame = {**(lead or {}), "source": keys[up.row], "target": keys[up.col]}
    if weighted:
        frame["weight"] = up.data
    return pd.DataFrame(frame)


def _features(x, columns: np.ndarray, names: list[str] | None = None) -> dict:
    """The feature columns ``columns`` of ``x``, named as the data names them (else ``x<column>``)."""
    if x is None:
        return {}
    dense = x.toarray() if sp.issparse(x) else np.asarray(x)
    return {(names[int(c)] if names and int(c) < len(names) else f"x{int(c)}"): dense[:, i]
            for i, c in enumerate(columns)}


def _label_column(y, meta: dict | None = None) -> dict:
    """The label column for labels of two classes or more (unknown: empty), named and valued as the
    data's node table has them, else ``label`` and the class numbers; else nothing."""
    if y is None or np.unique(y[y >= 0]).size < 2:
        return {}
    meta = meta or {}
    names = meta.get("label_names")
    column = meta.get("label_column") or "label"
    if names is not None and len(names) > int(y.max()):
        values = np.asarray(names, dtype=object)[np.clip(y, 0, None)]
        return {column: pd.Series(values).where(y >= 0)}
    return {column: pd.Series(y).astype("Int64").where(y >= 0)}


def _write(frame: pd.DataFrame, path: Path) -> None:
    frame.to_csv(path, index=False)


def write_party_folder(data: GraphData | GraphCollection, shard: Shard, folder: Path) -> list[str]:
    """Write what ``shard`` (cut from ``data``) holds into ``folder`` in the user file format;
    return the names of the files written."""
    kind = family(shard.partitioner)
    if kind == "khop":
        raise ConfigError("--format files with partitioner 'khop': a khop party holds nodes and the edges among "
                          "them; valid: cut with a node partitioner (node-random, ...) and run with partitioner=khop")
    folder.mkdir(parents=True, exist_ok=True)
    keys = data.keys
    if kind == "graphs":
        return _write_graphs(data, shard, folder, keys)
    rows = np.asarray(shard.node_ids, dtype=np.int64)
    y = shard.y
    if kind == "vertical":
        columns = shard.feature_cols
        y = data.y if y is None and data.y is not None else y  # every party holds every node: the labels too
    else:
        columns = np.arange(0 if shard.x is None else shard.x.shape[1])
    meta = data.meta
    nodes = {meta.get("id_column") or "id": keys[rows], **_features(shard.x, columns, meta.get("feature_names")),
             **_label_column(y if y is None or len(y) == len(rows) else y[rows], meta)}
    _write(pd.DataFrame(nodes), folder / "nodes.csv")
    written = ["nodes.csv"]
    if (shard.adj is not None and shard.adj.nnz) or shard.num_boundary:
        edges = _edges(shard.adj, keys[rows], _weighted(data.adj))
        if shard.num_boundary:
            edges = pd.concat([edges, _boundary_edges(shard, keys, _weighted(data.adj))], ignore_index=True)
        _write(edges, folder / "edges.csv")
        written.append("edges.csv")
    return written


def _boundary_edges(shard: Shard, keys: np.ndarray, weighted: bool) -> pd.DataFrame:
    """The shard's boundary edges, each from its own node to the other end's ID."""
    b = shard.boundary
    frame = {"source": keys[shard.node_ids[b.rows]], "target": keys[b.keys]}
    if weighted:
        frame["weight"] = b.weight
    return pd.DataFrame(frame)


def _write_graphs(data: GraphCollection, shard: Shard, folder: Path, keys: np.ndarray) -> list[str]:
    graph_keys = keys[np.asarray(shard.graph_ids, dtype=np.int64)]
    _write(pd.DataFrame({"graph": graph_keys, **_label_column(np.asarray(shard.graph_y))}), folder / "graphs.csv")
    nodes, edges = [], []
    weighted = _weighted(*(g.adj for g in data.graphs))
    for key, g in zip(graph_keys, shard.graphs):
        node_keys = g.keys
        lead = {"graph": np.full(g.num_nodes, key)}
        nodes.append(pd.DataFrame({**lead, "id": node_keys, **_features(g.x, np.arange(g.num_features))}))
        edges.append(_edges(g.adj, node_keys, weighted, {"graph": np.full(g.num_edges, key)}))
    _write(pd.concat(nodes, ignore_index=True), folder / "nodes.csv")
    _write(pd.concat(edges, ignore_index=True), folder / "edges.csv")
    return ["graphs.csv", "nodes.csv", "edges.csv"]
