"""Graph assembly shared by every reader: node IDs to rows, the checks, the notes.

Every format ends here with the same arrays: the two ends of each edge (row
positions), optional weights, optional node IDs, features and labels. This
module puts the rows in ID order (numeric when every ID is an integer, else
lexicographic), builds the symmetric adjacency and refuses what cannot be a
graph, each time with one line naming the file, the line (or array entry) and
what was expected (:class:`DataFileError`, a ConfigError: exit code 2 from the
CLIs), and the file-suffix facts the readers share. What it repairs it says: repeated edges are merged and self-loops
dropped, and isolated nodes are kept; each is one note in ``meta["notes"]``.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import scipy.sparse as sp

from fedgraphcore.config import ConfigError

from .types import GraphCollection, GraphData

#: An integer written as text.
INTEGER = r"[+-]?\d+"
#: Separator of a delimited text file per suffix (None: runs of whitespace).
SEPARATORS: dict[str, str | None] = {".csv": ",", ".tsv": "\t", ".txt": None, ".edges": None, ".edgelist": None}


def text_suffix(path: Path) -> str:
    """The suffix that says the format, under a ``.gz``."""
    suffixes = [s.lower() for s in path.suffixes]
    return suffixes[-2] if len(suffixes) > 1 and suffixes[-1] == ".gz" else path.suffix.lower()


#: Data file names the formats fix (a directory's parts) and the suffixes they read: what the
#: server may hear of a party's file (:func:`file_kind`), never its directory or own name.
FIXED_NAMES = tuple(f"{stem}{suffix}{gz}" for stem in ("graphs", "edges", "nodes")
                    for suffix in (".csv", ".tsv", ".txt") for gz in ("", ".gz"))
KNOWN_SUFFIXES = (".csv", ".tsv", ".txt", ".edges", ".edgelist", ".npz", ".pt", ".pth", ".mat")


def file_kind(file: object) -> str:
    """A party's data file as the server may hear of it: its name where the formats fix it
    (``nodes.csv``), else its format suffix (``a .csv file``), else ``the party's data``."""
    name = Path(str(file)).name.lower() if file is not None else ""
    if name in FIXED_NAMES:
        return name
    suffixes = Path(name).suffixes
    gz = len(suffixes) > 1 and suffixes[-1] == ".gz"
    suffix = suffixes[-2] if gz else suffixes[-1] if suffixes else ""
    return f"a {suffix}{'.gz' if gz else ''} file" if suffix in KNOWN_SUFFIXES else "the party's data"


class DataFileError(ConfigError):
    """A data file (or object) that is not a usable graph; the message is one line.

    ``file`` (shown as :func:`file_kind`) and ``rule`` (the rule it breaks, without the
    file's values) make its public part (:mod:`fedgraphcore.disclosure`)."""

    def __init__(self, message: str, *, file: object = None, rule: str | None = None) -> None:
        named = "" if rule is None else f", rule '{rule}'"
        super().__init__(message, public=f"data check failed: {file_kind(file)}{named}")


@dataclass
class Source:
    """Where the arrays came from, for messages: ``file`` names the file (or the object), ``edge(i)``
    and ``node(i)`` name edge row i and node row i in it (``line 17``, ``edge_index column 3``)."""

    file: str
    edge: Callable[[int], str] = lambda i: f"edge {i}"
    node: Callable[[int], str] = lambda i: f"node {i}"
    notes: list[str] = field(default_factory=list)

    def error(self, what: str, valid: str, rule: str | None = None) -> DataFileError:
        """``<file>: <what>; valid: <valid>``; its public rule ``rule``, else ``valid`` (then a text
        without the file's values)."""
        return DataFileError(f"{self.file}: {what}; valid: {valid}", file=self.file, rule=rule or valid)

    def note(self, text: str) -> None:
        self.notes.append(f"{self.file}: {text}")


def describe(err: BaseException) -> str:
    """An exception as one line: its type and the first line of its message."""
    return f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[0]}"


@contextmanager
def one_line(what: str, valid: str, file: object = None):
    """A parser failing inside in a way the readers do not name is still one line: any exception but a
    ConfigError becomes ``DataFileError('<what> (<Type>: <first line>); valid: <valid>')`` (``file``: the
    file it reads, for its public part)."""
    try:
        yield
    except ConfigError:
        raise
    except Exception as err:
        raise DataFileError(f"{what} ({describe(err)}); valid: {valid}", file=file,
                            rule="a file its format's parser reads") from None


#: A compressed file may expand this many times, and any file to :data:`EXPANSION_FLOOR` bytes: more
#: is refused before it is read (a compression bomb reads to gigabytes from kilobytes).
MAX_EXPANSION = 100
EXPANSION_FLOOR = 64 << 20
#: The largest magnitude a feature or weight may have: squared distances and degree sums over many
#: rows stay finite (1e308 passes as finite, its square overflows).
MAX_MAGNITUDE = 1e150


def _sizes(expanded: int, packed: int) -> str:
    return (f"expands to {expanded / 1e6:.0f} MB, {expanded // max(packed, 1):,} times its "
            f"{packed / 1e3:.0f} kB on disk")


def check_expansion(path: Path) -> None:
    """A ``.gz`` file or a zip archive (``.npz``, ``.pt``) that expands more than :data:`MAX_EXPANSION`
    times and past :data:`EXPANSION_FLOOR` bytes is refused, one line naming the sizes (a ``.gz`` is
    counted as it inflates, up to the limit; a zip member by its declared size, which reading it
    enforces)."""
    import gzip
    import zipfile

    path = Path(path)
    packed = path.stat().st_size
    limit = max(EXPANSION_FLOOR, MAX_EXPANSION * packed)
    valid = (f"a file that expands at most {MAX_EXPANSION} times (or to {EXPANSION_FLOOR >> 20} MiB): a compression "
             "bomb, or data to store uncompressed (or sparse)")
    if path.name.lower().endswith(".gz"):
        expanded = 0
        try:
            with gzip.open(path, "rb") as f:
                while expanded <= limit and (chunk := f.read(1 << 20)):
                    expanded += len(chunk)
        except (OSError, EOFError):  # not gzip, or truncated: the reader names it
            return
        if expanded > limit:
            raise DataFileError(f"{path}: expands past {limit / 1e6:.0f} MB, over {limit // max(packed, 1):,} times "
                                f"its {packed / 1e3:.0f} kB on disk; valid: {valid}", file=path,
                                rule=f"expands at most {MAX_EXPANSION} times")
    elif zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                if info.file_size > max(EXPANSION_FLOOR, MAX_EXPANSION * info.compress_size):
                    raise DataFileError(f"{path}: member {info.filename!r} {_sizes(info.file_size, info.compress_size)}"
                                        f"; valid: {valid}", file=path, rule=f"expands at most {MAX_EXPANSION} times")


def show(value) -> str:
    """A node ID or label as the user wrote it (strings quoted)."""
    return repr(value.item() if isinstance(value, np.generic) else value)


# --------------------------------------------------------------------------- IDs and labels


def id_array(values, source: Source, what: str = "node IDs") -> np.ndarray:
    """``values`` as IDs: int64 when every one is an integer (also integers written as text),
    else a unicode array of their text. Two spellings of one integer (``7``, ``007``) are refused."""
    a = np.asarray(values)
    if a.dtype.kind in "iu":
        if a.dtype.kind == "u" and a.size and int(a.max()) > np.iinfo(np.int64).max:
            return a.astype(str)
        return a.astype(np.int64)
    if a.dtype.kind in "fcb":
        raise source.error(f"{what} of type {a.dtype}", "integers or strings")
    import pandas as pd  # not at import: the ClientApp imports this module on every message

    text = a.astype(str)
    if not text.size or not pd.Series(text).str.fullmatch(INTEGER).all():
        return text
    try:
        ints = text.astype(np.int64)
    except OverflowError:  # beyond 64 bits: kept as text
        return text
    unique, first = np.unique(ints, return_index=True)
    if unique.size != np.unique(text).size:
        clash = np.flatnonzero(ints == ints[np.setdiff1d(np.arange(ints.size), first)[0]])
        raise source.error(f"{what} {text[clash[0]]!r} and {text[clash[1]]!r} are the same integer",
                           "one spelling per node")
    return ints


def label_codes(raw, source: Source, what: str, where: Callable[[int], str],
                negative_unknown: bool = False) -> tuple[np.ndarray, list]:
    """Labels as int64 codes ``0..C-1`` in the order of their values (numeric when all are integers)
    and the values themselves. Text labels: an empty one is unknown (-1). Integer arrays: with
    ``negative_unknown`` (the -1 of :class:`GraphData`) a negative label is unknown, else every value
    is a class (TU's -1/1). Labels of a single class are refused: nothing to score a clustering
    against. ``what`` names the labels (``column 'label'``), ``where(i)`` the row of label i."""
    a = np.asarray(raw)
    if a.dtype.kind == "f":
        bad = np.flatnonzero(~np.isfinite(a) | (a != np.round(a)))
        if bad.size:
            raise source.error(f"{where(bad[0])}: {what} holds {a[bad[0]]!r}", "integer or text class labels")
        a = a.astype(np.int64)
    if a.dtype.kind in "iu":
        values = a.astype(np.int64)
        known = values >= 0 if negative_unknown else np.ones(values.shape, bool)
    else:
        text = a.astype(str)
        known = text != ""
        given = id_array(text[known], source, what)
        values = np.full(a.shape, -1 if given.dtype == np.int64 else "", dtype=given.dtype)
        values[known] = given
    names, codes = np.unique(values[known], return_inverse=True)
    if names.size < 2:
        found = f"one class ({show(names[0])})" if names.size else "no known label"
        raise source.error(f"{what} has {found}", "two classes or more, or no labels (then set num-clusters)")
    y = np.full(a.shape, -1, dtype=np.int64)
    y[known] = codes
    return y, names.tolist()


def _canonical_order(keys: np.ndarray) -> np.ndarray:
    return np.argsort(keys, kind="stable")


def _check_distinct(keys: np.ndarray, source: Source) -> None:
    order = _canonical_order(keys)
    same = np.flatnonzero(keys[order][1:] == keys[order][:-1])
    if same.size:
        i, j = sorted(order[same[0]: same[0] + 2])
        raise source.error(f"{source.node(j)} repeats node ID {show(keys[j])} of {source.node(i)}",
                           "each node ID once")


# --------------------------------------------------------------------------- edges


def _check_weights(weight: np.ndarray, source: Source) -> None:
    bad = np.flatnonzero(~(np.isfinite(weight) & (weight > 0)))
    if bad.size:
        raise source.error(f"{source.edge(bad[0])} has weight {weight[bad[0]]:g}",
                           "finite weights > 0 (leave a missing edge out)")


def edge_adjacency(n: int, src: np.ndarray, dst: np.ndarray, weight: np.ndarray | None, keys: np.ndarray,
                   source: Source) -> sp.csr_matrix:
    """The symmetric CSR adjacency of the edges ``src[i] - dst[i]`` (row positions 0..n-1).

    A self-loop is dropped and an edge given again (same direction, same weight) merged, each said
    in a note; an edge and its reverse are one undirected edge. A weight that is not finite and
    positive, and an edge or its reverse given again with another weight, are refused."""
    src, dst = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
    if weight is not None:
        weight = np.asarray(weight, dtype=np.float64)
        _check_weights(weight, source)
    loops = np.flatnonzero(src == dst)
    if loops.size:
        source.note(f"{loops.size} self-loop(s) dropped (first: {source.edge(loops[0])}, node "
                    f"{show(keys[src[loops[0]]])})")
    index = np.flatnonzero(src != dst)
    lo, hi = np.minimum(src[index], dst[index]), np.maximum(src[index], dst[index])
    # one key per undirected pair, the direction in the lowest bit: sorted, an edge given again
    # is next to its first occurrence, and a reverse pair next to the pair
    pair = (lo * np.int64(n) + hi) * 2 + (src[index] > dst[index])
    order = np.argsort(pair, kind="stable")
    pair = pair[order]
    same_pair = (pair[1:] >> 1) == (pair[:-1] >> 1)
    repeated = same_pair & (pair[1:] == pair[:-1])
    if weight is not None:
        w = weight[index][order]
        clash = np.flatnonzero(same_pair & (w[1:] != w[:-1]))
        if clash.size:
            _refuse_weight_clash(clash, order, index, pair, w, src, dst, keys, source)
    if repeated.any():
        later = index[order[1:][repeated]]
        first = int(later.min())
        twin = index[order[np.flatnonzero(repeated)[np.argmin(later)]]]
        source.note(f"{int(repeated.sum())} repeated edge(s) merged (first: {source.edge(first)} repeats "
                    f"{source.edge(int(twin))}, {show(keys[src[first]])} - {show(keys[dst[first]])})")
    keep = np.concatenate([[True], ~same_pair]) if pair.size else np.zeros(0, bool)
    rows, cols = lo[order][keep], hi[order][keep]
    data = np.ones(rows.size) if weight is None else weight[index][order][keep]
    adj = sp.csr_matrix((np.concatenate([data, data]), (np.concatenate([rows, cols]), np.concatenate([cols, rows]))),
                        shape=(n, n), dtype=np.float64)
    adj.sort_indices()
    return adj


def _refuse_weight_clash(clash, order, index, pair, w, src, dst, keys, source: Source) -> None:
    """One line for the earliest edge that gives an undirected pair a second weight."""
    later = np.maximum(index[order[clash]], index[order[clash + 1]])
    k = clash[np.argmin(later)]
    i, j = sorted((int(index[order[k]]), int(index[order[k + 1]])))
    a, b = show(keys[src[j]]), show(keys[dst[j]])
    wi, wj = (w[k], w[k + 1]) if index[order[k]] == i else (w[k + 1], w[k])
    kind = "repeats" if pair[k] == pair[k + 1] else "reverses"
    raise source.error(f"{source.edge(j)} ({a} - {b}, weight {wj:g}) {kind} {source.edge(i)} with weight {wi:g}",
                       "one weight per undirected edge")


# --------------------------------------------------------------------------- one graph


def assemble(name: str, num_nodes: int, src, dst, source: Source, *, keys=None, weight=None, x=None,
             labels=None, labels_what: str = "labels", label_source: Source | None = None,
             negative_unknown: bool = False, meta: dict | None = None, linked=None) -> GraphData:
    """A checked :class:`GraphData` from row positions: edges ``src[i] - dst[i]`` (0..num_nodes-1),
    optional edge ``weight``, node ``keys`` (IDs, see :func:`id_array`), features ``x`` and raw
    ``labels`` (see :func:`label_codes`, with ``negative_unknown``; named ``labels_what`` in
    ``label_source``, default ``source``), all in the source's row order; the graph's rows follow
    the IDs' order. ``source.notes`` end up in ``meta['notes']``. ``linked``: rows (source order)
    with an edge to another party's node, not isolated though without an edge here."""
    if num_nodes == 0:
        raise source.error("no nodes (an empty graph)", "at least one edge or node-table row")
    src, dst = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
    _check_ends(num_nodes, src, dst, source)
    keys = np.arange(num_nodes, dtype=np.int64) if keys is None else id_array(keys, source)
    _check_distinct(keys, source)
    label_source = label_source or source
    y, label_names = (None, None) if labels is None else label_codes(labels, label_source, labels_what,
                                                                      label_source.node, negative_unknown)
    order = _canonical_order(keys)
    rank = np.empty(num_nodes, dtype=np.int64)
    rank[order] = np.arange(num_nodes)
    keys = keys[order]
    adj = edge_adjacency(num_nodes, rank[src], rank[dst], weight, keys, source)
    if x is not None:
        x = x[order]
    if y is not None:
        y = y[order]
    _note_isolated(adj, keys, source, None if linked is None else rank[np.asarray(linked, dtype=np.int64)])
    meta = {**(meta or {}), "notes": list(source.notes)}
    if label_names is not None:
        meta["label_names"] = label_names
    canonical = keys.dtype == np.int64 and np.array_equal(keys, np.arange(num_nodes))
    return GraphData(name, adj, x, y, meta, None if canonical else keys)


def _check_ends(n: int, src: np.ndarray, dst: np.ndarray, source: Source) -> None:
    bad = np.flatnonzero((src < 0) | (src >= n) | (dst < 0) | (dst >= n))
    if bad.size:
        end = src[bad[0]] if not 0 <= src[bad[0]] < n else dst[bad[0]]
        raise source.error(f"{source.edge(bad[0])} refers to node {end}", f"node positions 0..{n - 1}",
                           "edge ends among the node positions")


def _note_isolated(adj: sp.csr_matrix, keys: np.ndarray, source: Source, linked: np.ndarray | None = None) -> None:
    if not adj.nnz and (linked is None or not linked.size):
        source.note(f"no edges: {adj.shape[0]} nodes with features only (strategies that need edges refuse it)")
        return
    without = np.diff(adj.indptr) == 0
    if linked is not None:
        without[linked] = False
    alone = np.flatnonzero(without)
    if alone.size:
        source.note(f"{alone.size} isolated node(s) kept, without an edge (first: {show(keys[alone[0]])})")


# --------------------------------------------------------------------------- collections


def assemble_collection(name: str, graph_of: np.ndarray, num_graphs: int, src, dst, source: Source, *,
                        graph_keys=None, graph_labels=None, labels_what: str = "labels",
                        label_source: Source | None = None, graph_where: Callable[[int], str] | None = None,
                        node_keys=None, weight=None,
                        x=None, meta: dict | None = None) -> GraphCollection:
    """A checked :class:`GraphCollection` from row positions over all graphs at once: node i belongs to
    graph ``graph_of[i]`` (0..num_graphs-1), every edge joins two nodes of one graph, and the checks and
    notes of :func:`assemble` hold over the whole collection (one note each, not one per graph). Graphs
    follow their ``graph_keys`` order, nodes within a graph their ``node_keys`` order (IDs scoped to
    the graph); a graph's node keys are dropped."""
    where = graph_where or (lambda i: f"graph {i}")
    graph_of = np.asarray(graph_of, dtype=np.int64)
    n = graph_of.size
    sizes = np.bincount(graph_of, minlength=num_graphs)
    src, dst = _checked_collection_edges(graph_of, num_graphs, sizes, src, dst, source, where)
    gkeys = np.arange(num_graphs, dtype=np.int64) if graph_keys is None else id_array(graph_keys, source, "graph IDs")
    _check_distinct(gkeys, Source(source.file, node=where))
    within = np.arange(n) if node_keys is None else id_array(node_keys, source)
    _check_distinct_within(graph_of, within, source)
    order = _collection_order(graph_of, gkeys, within)
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n)
    adj = edge_adjacency(n, rank[src], rank[dst], weight, within[order], source)
    y, label_names = label_codes(graph_labels, label_source or source, labels_what, where)
    gorder = _canonical_order(gkeys)
    bounds = np.concatenate([[0], np.cumsum(sizes[gorder])])
    graphs = _graph_blocks(name, adj, None if x is None else x[order], bounds)
    _note_isolated_in_graphs(adj, bounds, source)
    meta = {**(meta or {}), "notes": list(source.notes), "label_names": label_names}
    gkeys = gkeys[gorder]
    canonical = gkeys.dtype == np.int64 and np.array_equal(gkeys, np.arange(num_graphs))
    return GraphCollection(name, graphs, y[gorder], meta, None if canonical else gkeys)


def _checked_collection_edges(graph_of: np.ndarray, num_graphs: int, sizes: np.ndarray, src, dst, source: Source,
                              where: Callable[[int], str]) -> tuple[np.ndarray, np.ndarray]:
    """The edges' ends as int64 rows, once every graph has a node and every edge ends at two nodes
    (:func:`_check_ends`) of one graph."""
    if num_graphs == 0 or not sizes.all():
        what = "no graphs" if num_graphs == 0 else f"{where(int(np.flatnonzero(sizes == 0)[0]))} has no nodes"
        raise source.error(what, "graphs of one node or more")
    src, dst = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
    _check_ends(graph_of.size, src, dst, source)
    across = np.flatnonzero(graph_of[src] != graph_of[dst])
    if across.size:
        raise source.error(f"{source.edge(across[0])} joins two graphs", "edges within one graph")
    return src, dst


def _collection_order(graph_of: np.ndarray, gkeys: np.ndarray, within: np.ndarray) -> np.ndarray:
    """The rows in the collection's order: graphs in their keys' canonical order, nodes within a
    graph in their keys' order."""
    graph_rank = np.empty(gkeys.size, dtype=np.int64)
    graph_rank[_canonical_order(gkeys)] = np.arange(gkeys.size)
    inner = np.argsort(within, kind="stable")
    return inner[np.argsort(graph_rank[graph_of[inner]], kind="stable")]


def _graph_blocks(name: str, adj: sp.csr_matrix, x: np.ndarray | None, bounds: np.ndarray) -> list[GraphData]:
    """One :class:`GraphData` per diagonal block ``bounds[g]:bounds[g + 1]`` of ``adj`` (and rows of ``x``)."""
    graphs = []
    for g in range(bounds.size - 1):
        a, b = bounds[g], bounds[g + 1]
        block = adj[a:b, a:b].tocsr()
        block.sort_indices()
        graphs.append(GraphData(f"{name}/{g}", block, None if x is None else x[a:b], None, {"index": g}))
    return graphs


def _note_isolated_in_graphs(adj: sp.csr_matrix, bounds: np.ndarray, source: Source) -> None:
    alone = np.diff(adj.indptr) == 0
    if alone.any():
        graph_at = np.repeat(np.arange(bounds.size - 1), np.diff(bounds))
        source.note(f"{int(alone.sum())} isolated node(s) kept, without an edge, in "
                    f"{np.unique(graph_at[alone]).size} graph(s)")


def _check_distinct_within(graph_of: np.ndarray, keys: np.ndarray, source: Source) -> None:
    order = np.lexsort((keys, graph_of))
    same = np.flatnonzero((keys[order][1:] == keys[order][:-1]) & (graph_of[order][1:] == graph_of[order][:-1]))
    if same.size:
        i, j = sorted(order[same[0]: same[0] + 2])
        raise source.error(f"{source.node(j)} repeats node ID {show(keys[j])} of {source.node(i)} in one graph",
                           "each node ID once per graph")


def feature_matrix(x, n: int, source: Source, what: str) -> np.ndarray | sp.csr_matrix | None:
    """``x`` as n x f float64 (dense, or CSR with sorted indices), every value finite."""
    if x is None:
        return None
    if sp.issparse(x):
        x = sp.csr_matrix(x, dtype=np.float64)
        x.sort_indices()
        values = x.data
    else:
        x = np.asarray(x)
        if x.dtype.kind not in "biuf":
            raise source.error(f"{what} of type {x.dtype}", "numeric features")
        x = np.asarray(x, dtype=np.float64)
        values = x
    if x.ndim != 2 or x.shape[0] != n:
        raise source.error(f"{what} of shape {x.shape}", f"{n} rows (one per node), one column per feature",
                           "one feature row per node")
    if not (np.abs(values) <= MAX_MAGNITUDE).all():
        dense = x.toarray() if sp.issparse(x) else x
        row = np.argwhere(~(np.abs(dense) <= MAX_MAGNITUDE))[0]
        value = dense[row[0], row[1]]
        problem = f"is {float(value):g}, out of range" if np.isfinite(value) else "is not a finite number"
        raise source.error(f"{what} row {row[0]}, column {row[1]} {problem}",
                           f"finite features of magnitude at most {MAX_MAGNITUDE:g}", "finite features in range")
    return x
