"""A ``networkx`` graph as a checked :class:`GraphData` (:func:`fedgraphcore.data.formats.as_graph`)."""

from __future__ import annotations

import numpy as np

from .assemble import Source, assemble, feature_matrix
from .types import GraphData


def is_networkx(obj) -> bool:
    """Whether ``obj`` is a networkx graph (networkx is imported only when asked)."""
    import networkx as nx

    return isinstance(obj, nx.Graph)


def from_networkx(g, name: str, label_column: str, weighted: bool) -> GraphData:
    """A networkx graph: node IDs its nodes, features the node attribute ``x`` (a sequence of numbers),
    labels the node attribute ``label_column``, weights the edge attribute ``weight`` (1 where an edge
    has none). Directed graphs are symmetrised, parallel edges of a multigraph merged."""
    nodes = list(g.nodes)
    plain = all(isinstance(v, (int, np.integer, str)) and not isinstance(v, bool) for v in nodes)
    keys = np.asarray(nodes if plain else [str(v) for v in nodes])
    source = Source(f"networkx graph {name!r}", node=lambda i: f"node {nodes[i]!r}")
    index = {v: i for i, v in enumerate(nodes)}
    edges = list(g.edges(data=True))
    source.edge = lambda i: f"edge ({edges[i][0]!r}, {edges[i][1]!r})"
    src = np.fromiter((index[u] for u, _, _ in edges), dtype=np.int64, count=len(edges))
    dst = np.fromiter((index[v] for _, v, _ in edges), dtype=np.int64, count=len(edges))
    weight = None
    if weighted and any("weight" in d for _, _, d in edges):
        weight = np.asarray([d.get("weight", 1.0) for _, _, d in edges], dtype=np.float64)
    x = _node_attribute(g, nodes, "x", source)
    if x is not None:
        try:
            x = np.asarray([np.asarray(v, dtype=np.float64).reshape(-1) for v in x])
        except (TypeError, ValueError):
            raise source.error("node attribute 'x' that is not a sequence of numbers of one length",
                               "x = a numeric vector per node") from None
    labels = None
    if any(label_column in d for _, d in g.nodes(data=True)):
        labels = np.asarray(["" if (v := d.get(label_column)) is None else str(v) for _, d in g.nodes(data=True)])
    return assemble(name, len(nodes), src, dst, source, keys=keys, weight=weight,
                    x=feature_matrix(x, len(nodes), source, "node attribute 'x'"), labels=labels,
                    labels_what=f"node attribute {label_column!r}", meta={"source": "networkx"})


def _node_attribute(g, nodes: list, key: str, source: Source) -> list | None:
    values = [d.get(key) for _, d in g.nodes(data=True)]
    missing = [i for i, v in enumerate(values) if v is None]
    if len(missing) == len(values):
        return None
    if missing:
        raise source.error(f"{source.node(missing[0])} has no attribute {key!r} (other nodes have one)",
                           f"{key} on every node or on none", "a node attribute on every node or on none")
    return values
