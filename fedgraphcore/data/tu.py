"""Graph collections in the TU Dortmund text format (``DS_A.txt``, ``DS_graph_indicator.txt``,
``DS_graph_labels.txt``, optional ``DS_node_labels.txt`` and the other label/attribute files).

Read as PyG's ``TUDataset`` reads them by default (``use_node_attr=False``): node
features are the one-hot node labels (one block per label column, each label
shifted to start at 0), none without a node-labels file; graph labels are
numbered in the order of their values; node attributes and edge files are not
used. The files must agree with each other (graph ids 1, 2, ... in order, edges
within one graph, one line per node/edge/graph in each other file), else one
line names the file and the mismatch.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .assemble import DataFileError, Source, assemble_collection
from .types import GraphCollection


def _ints(path: Path) -> np.ndarray:
    """A TU text file as PyG's reader takes it (its newline-terminated lines, comma-separated ints), 2-D."""
    rows = path.read_text().split("\n")[:-1]
    try:
        return np.loadtxt(rows, dtype=np.int64, delimiter=",", ndmin=2) if rows else np.zeros((0, 1), np.int64)
    except ValueError as err:
        raise DataFileError(f"{path}: {err}; valid: comma-separated integers, one record a line") from None


def _disagree(what: str, valid: str) -> DataFileError:
    return DataFileError(f"{what}; valid: {valid}")


def _graph_ids(indicator: Path) -> np.ndarray:
    """Each node's graph id (1-based) from the graph indicator: ids 1, 2, ... in order, every graph
    with a node (PyG slices the graphs by counting nodes per id)."""
    graph_of = _ints(indicator).ravel()
    jumps = np.flatnonzero(~np.isin(np.diff(graph_of, prepend=0), (0, 1)))
    if jumps.size or not graph_of.size:
        where = f"line {jumps[0] + 1} has graph id {graph_of[jumps[0]]}" if jumps.size else "is empty"
        raise _disagree(f"{indicator} {where}", "graph ids 1, 2, ... in order, one line per node")
    return graph_of


def _edges(adjacency: Path, graph_of: np.ndarray) -> np.ndarray:
    """The (1-based) edges of ``DS_A.txt``, each between two nodes of one graph."""
    edges = _ints(adjacency)
    if edges.size and edges.shape[1] != 2:
        raise _disagree(f"{adjacency} has {edges.shape[1]} columns", "2 (one 'i, j' edge a line)")
    n = graph_of.size
    bad = (edges < 1) | (edges > n)
    if bad.any():
        raise _disagree(f"{adjacency} refers to node {edges[bad][0]}", f"nodes 1..{n} (the lines of the graph indicator)")
    across = np.flatnonzero(graph_of[edges[:, 0] - 1] != graph_of[edges[:, -1] - 1])
    if across.size:
        i, j = edges[across[0]]
        raise _disagree(f"{adjacency} line {across[0] + 1} joins node {i} of graph {graph_of[i - 1]} to node {j} "
                        f"of graph {graph_of[j - 1]}", "edges within one graph")
    return edges.reshape(-1, 2)


def _check_counts(raw: Path, prefix: str, graph_of: np.ndarray, edges: np.ndarray) -> None:
    """Every other TU file has one line per graph, node or edge (PyG pairs whatever counts it finds)."""
    indicator, adjacency = f"{prefix}_graph_indicator.txt", f"{prefix}_A.txt"
    counts = {"graph": (int(graph_of[-1]), f"{indicator} numbers {graph_of[-1]} graphs"),
              "node": (graph_of.size, f"{indicator} has {graph_of.size} nodes"),
              "edge": (len(edges), f"{adjacency} has {len(edges)} edges")}
    for unit, part in (("graph", "labels"), ("graph", "attributes"), ("node", "labels"), ("node", "attributes"),
                       ("edge", "labels"), ("edge", "attributes")):
        path = raw / f"{prefix}_{unit}_{part}.txt"
        count, source = counts[unit]
        if path.is_file() and (lines := path.read_text().count("\n")) != count:  # PyG's records: the lines
            raise _disagree(f"{path} has {lines} lines but {source}", f"one line per {unit}")


def _one_hot_labels(path: Path) -> np.ndarray:
    """PyG's node features from the node labels: per column, the label minus the column's smallest, one-hot."""
    labels = _ints(path)
    labels = labels - labels.min(axis=0)
    blocks = [np.eye(int(col.max()) + 1, dtype=np.float64)[col] for col in labels.T]
    return np.hstack(blocks)


def read_tu(raw: Path, prefix: str, name: str) -> GraphCollection:
    """The graph collection of the TU files ``raw/<prefix>_*.txt`` (unweighted: edge attributes are not used)."""
    indicator, adjacency = raw / f"{prefix}_graph_indicator.txt", raw / f"{prefix}_A.txt"
    labels_path = raw / f"{prefix}_graph_labels.txt"
    for path in (indicator, adjacency, labels_path):
        if not path.is_file():
            raise DataFileError(f"{path}: missing; valid: a TU dataset folder with {prefix}_A.txt, "
                                f"{prefix}_graph_indicator.txt and {prefix}_graph_labels.txt")
    graph_of = _graph_ids(indicator)
    edges = _edges(adjacency, graph_of)
    _check_counts(raw, prefix, graph_of, edges)
    node_labels = raw / f"{prefix}_node_labels.txt"
    x = _one_hot_labels(node_labels) if node_labels.is_file() else None
    graph_labels = _ints(labels_path)[:, 0]
    source = Source(str(adjacency), edge=lambda i: f"line {i + 1}", node=lambda i: f"node {i + 1}")
    return assemble_collection(
        name, graph_of - 1, int(graph_of[-1]), edges[:, 0] - 1, edges[:, 1] - 1, source,
        graph_labels=graph_labels, labels_what=f"{labels_path.name}", label_source=Source(str(labels_path)),
        graph_where=lambda g: f"graph {g + 1}", node_keys=np.arange(1, graph_of.size + 1), x=x,
        meta={"source": str(raw), "format": "tu"})


def find_tu(directory: Path) -> tuple[Path, str] | None:
    """``(folder, prefix)`` of the TU files in ``directory`` (or its ``raw/``), else None."""
    for raw in (directory, directory / "raw"):
        found = sorted(raw.glob("*_graph_indicator.txt"))
        if found:
            return raw, found[0].name[: -len("_graph_indicator.txt")]
    return None
