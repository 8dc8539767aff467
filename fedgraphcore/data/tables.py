"""Delimited text tables: edge lists, node tables and the CSV layout of a graph collection.

Each file is read once by pandas' C parser (``.gz`` too); ``#`` starts a
comment, blank lines are skipped. The separator follows the suffix: ``.csv``
comma, ``.tsv`` tab, ``.txt``/``.edges``/``.edgelist`` whitespace.

* Edge list: columns source, target and an optional weight. The first row is a
  header when it names the columns (:data:`SOURCE_NAMES`, :data:`TARGET_NAMES`,
  :data:`WEIGHT_NAMES`, any case), else there is none and the rows have 2 or 3
  fields.
* Node table: an ID column first, then numeric feature columns and an optional
  label column. The first row is a header when its first field is one of
  :data:`ID_NAMES`; without one every column after the ID is a feature.
* Collection (a directory): ``graphs.csv`` (graph, label), ``edges.csv``
  (graph, source, target[, weight]) and optionally ``nodes.csv`` (graph, id,
  features...), each with its header; node IDs are scoped to their graph.

Node IDs are integers when every ID in the file is one (compared as numbers:
``7`` and ``007`` are one node), else text. Errors name the file and line.
"""

from __future__ import annotations

import csv
import gzip
import io
import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import pandas as pd

from .assemble import (INTEGER, MAX_MAGNITUDE, SEPARATORS, DataFileError, Source, assemble, assemble_collection,
                       id_array, show, text_suffix)
from .boundary import in_row_order, split_edges
from .types import GraphCollection, GraphData

SOURCE_NAMES = ("source", "src", "from", "u", "node1", "source_id")
TARGET_NAMES = ("target", "dst", "to", "v", "node2", "target_id")
WEIGHT_NAMES = ("weight", "w", "value")
ID_NAMES = ("id", "node", "node_id", "name")
GRAPH_NAMES = ("graph", "graph_id")
_PARSER_LINE = re.compile(r"Expected (\d+) fields in line (\d+), saw (\d+)")


def _open(path: Path):
    if path.suffix.lower() == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8-sig", newline="")
    return open(path, encoding="utf-8-sig", newline="")  # a byte-order mark (spreadsheets write one) is not text


def _skipped(line: str, sep: str | None) -> bool:
    """Whether pandas (``comment='#'``, blank lines skipped) reads no row from ``line``."""
    content = line.rstrip("\r\n")
    return content == "" or content.startswith("#") or (content.strip() == "" and (sep is None or sep not in content))


def _fields(line: str, sep: str | None) -> list[str]:
    content = line.rstrip("\r\n").split("#", 1)[0]
    return content.split() if sep is None else [f.strip() for f in content.split(sep)]


def _written_fields(line: str, sep: str | None) -> list[str]:
    """The fields of ``line`` as pandas reads them (quotes kept together, ``#`` starts a comment),
    each as written."""
    content = line.rstrip("\r\n").split("#", 1)[0]
    if sep is None:
        return content.split()
    return next(csv.reader([content], delimiter=sep, skipinitialspace=True), [])


@dataclass
class Table:
    """One delimited file read into ``frame``; ``where(i)`` names row i as ``line N`` of the file."""

    path: Path
    sep: str | None
    frame: pd.DataFrame
    header: bool

    @property
    def source(self) -> Source:
        return Source(str(self.path), edge=self.where, node=self.where)

    def error(self, what: str, valid: str, rule: str | None = None) -> DataFileError:
        return self.source.error(what, valid, rule)

    def where(self, row: int) -> str:
        lines = self._lines
        return f"line {lines[row]}" if lines is not None else f"data row {row + 1}"

    @cached_property
    def _lines(self) -> np.ndarray | None:
        """The line number of every row (a scan of the file, made only for a message); None when the
        scan disagrees with pandas about the rows (then messages count data rows)."""
        with _open(self.path) as f:
            lines = [i for i, line in enumerate(f, 1) if not _skipped(line, self.sep)]
        lines = lines[1:] if self.header else lines
        return np.asarray(lines) if len(lines) == len(self.frame) else None

    def column(self, name: str) -> np.ndarray:
        return self.frame[name].to_numpy()

    def written(self, rows: np.ndarray) -> dict[int, list[str]]:
        """The fields of data rows ``rows`` as the file writes them (a scan of the file; empty
        where the rows' lines are not known)."""
        lines = self._lines
        if lines is None:
            return {}
        wanted = {int(lines[r]): int(r) for r in rows}
        found = {}
        with _open(self.path) as f:
            for number, line in enumerate(f, 1):
                if number in wanted:
                    found[wanted[number]] = _written_fields(line, self.sep)
                    if len(found) == len(wanted):
                        break
        return found

    def check_whole_rows(self) -> None:
        """Every data row has as many fields as the header (or, without one, the first row): a row
        with a field too many or too few is refused naming its line, not read with a value in the
        wrong column (a label read as a feature) or a cell left empty."""
        width, shape = len(self.frame.columns), "the header" if self.header else "the first row"
        if not isinstance(self.frame.index, pd.RangeIndex):  # pandas made the surplus first field an index
            raise self.error(f"{self.where(0)} has {width + 1} fields", f"{width} fields like {shape}",
                             "as many fields a line as the header")
        last = self.frame[self.frame.columns[-1]] if width else None
        if last is None or pd.api.types.is_numeric_dtype(last):  # a short row leaves an empty text in the last column
            return
        suspects = np.flatnonzero(last.to_numpy(dtype=object) == "")
        for row, fields in sorted(self.written(suspects).items()):
            if len(fields) < width:
                raise self.error(f"{self.where(row)} has {len(fields)} field{'s' * (len(fields) != 1)}",
                                 f"{width} fields like {shape}", "as many fields a line as the header")

    def numbers(self, name: str, what: str, positive: bool = False) -> np.ndarray:
        """Column ``name`` as float64, every value a finite number of magnitude at most
        :data:`MAX_MAGNITUDE` (``positive``: above 0 too), else one line naming the cell as the
        file writes it."""
        col = self.frame[name]
        values = pd.to_numeric(col, errors="coerce").to_numpy(dtype=np.float64)
        with np.errstate(invalid="ignore"):
            bad = np.flatnonzero(~(np.abs(values) <= MAX_MAGNITUDE) | (positive & ~(values > 0)))
        if bad.size:
            row = int(bad[0])
            position = list(self.frame.columns).index(name)
            fields = self.written(np.array([row])).get(row, [])
            cell = fields[position] if position < len(fields) else str(col.iloc[row])
            value = values[row]
            problem = ("is not a finite number" if not np.isfinite(value) else "is out of range"
                       if abs(value) > MAX_MAGNITUDE else "is not above 0 (leave a missing edge out)")
            bounds = f"finite, above 0 and at most {MAX_MAGNITUDE:g}" if positive else \
                f"finite and of magnitude at most {MAX_MAGNITUDE:g}"
            raise self.error(f"{self.where(row)}, column {name!r}: {cell!r} {problem}", f"{what}, {bounds}", what)
        return values


def first_fields(path: Path, sep: str | None) -> tuple[int, list[str]]:
    """The line number and fields of the first row (0 and [] for a file without one)."""
    try:
        with _open(path) as f:
            for number, line in enumerate(f, 1):
                if not _skipped(line, sep):
                    return number, _fields(line, sep)
    except (UnicodeDecodeError, gzip.BadGzipFile, EOFError) as err:
        raise _not_text(path, err) from None
    return 0, []


def _not_text(path: Path, err: BaseException) -> DataFileError:
    return DataFileError(f"{path}: not a UTF-8 text file ({type(err).__name__}); valid: a delimited text file",
                         file=path, rule="a delimited text file")


def read_table(path: Path, sep: str | None, names: list[str] | None, text_columns: tuple[str, ...],
               id_columns: tuple[str, ...]) -> Table:
    """``path`` as a :class:`Table`: with ``names`` for a file without a header, else the header row's.
    ``text_columns`` are read as text; ``id_columns`` as integers when every value in them is one,
    else as text (read again as text only when pandas typed them differently)."""
    kwargs = dict(sep=sep if sep is not None else r"\s+", comment="#", keep_default_na=False, engine="c",
                  skipinitialspace=sep is not None, compression="infer")
    if names is None:
        kwargs["header"] = 0
    else:
        kwargs.update(header=None, names=names)

    def parse(text: tuple[str, ...]) -> pd.DataFrame:
        try:
            return pd.read_csv(path, dtype={c: object for c in text}, **kwargs)
        except pd.errors.ParserError as err:
            found = _PARSER_LINE.search(str(err))
            if found:
                want, line, saw = found.groups()
                shape = "the header" if names is None else "the first row"
                raise DataFileError(f"{path}: line {line} has {saw} fields; valid: {want} fields like {shape}",
                                    file=path, rule="as many fields a line as the first row") from None
            raise DataFileError(f"{path}: cannot be parsed ({str(err).strip().splitlines()[0]}); valid: a "
                                "delimited text file", file=path, rule="a delimited text file") from None
        except (UnicodeDecodeError, gzip.BadGzipFile, EOFError) as err:
            raise _not_text(path, err) from None
        except pd.errors.EmptyDataError:
            return pd.DataFrame({c: [] for c in names or ()})

    frame = parse(text_columns)
    ids = [c for c in id_columns if c in frame.columns]
    kinds = {frame[c].dtype.kind for c in ids}
    if kinds and kinds != {"i"} and any(frame[c].dtype.kind in "iuf" for c in ids):
        frame = parse(text_columns + tuple(ids))  # one ID column typed as numbers, another as text
    table = Table(path, sep, frame, names is None)
    table.check_whole_rows()
    return table


def _missing_ids(table: Table, columns: list[str], valid: str, rule: str | None = None) -> None:
    for name in columns:
        col = table.frame[name]
        if col.dtype.kind not in "iu":
            empty = np.flatnonzero(col.to_numpy(dtype=object) == "")
            if empty.size:
                which = "" if name.lower() in ID_NAMES + GRAPH_NAMES else f"{name} "
                raise table.error(f"{table.where(empty[0])} has no {which}ID", valid, rule)


# --------------------------------------------------------------------------- edge lists


@dataclass
class Edges:
    """An edge list read from a file: each end's ID, the weights (None without a weight column)."""

    table: Table
    src: np.ndarray
    dst: np.ndarray
    weight: np.ndarray | None
    graph: np.ndarray | None = None


def _is(field: str, names: tuple[str, ...]) -> bool:
    return field.strip().lower() in names


def _number(field: str) -> bool:
    try:
        float(field)
    except ValueError:
        return False
    return True


def read_edges(path: Path, sep: str | None, collection: bool = False, beside_nodes: bool = False) -> Edges:
    """The edge list in ``path`` (with a leading graph column when ``collection``); one without a
    row (empty, or a header only) only ``beside_nodes`` (a node table gives the nodes)."""
    line, fields = first_fields(path, sep)
    lead = ("graph",) if collection else ()
    shape = ("graph, " if collection else "") + "source, target[, weight]"
    if collection:
        header = len(fields) >= 3 and _is(fields[0], GRAPH_NAMES)
        if not header:
            raise DataFileError(f"{path}: line {line or 1} is not a header row ({', '.join(fields) or 'empty'}); "
                                f"valid: a header row naming the columns {shape}",
                                file=path, rule="a header row naming the columns")
    else:
        header = len(fields) >= 2 and _is(fields[0], SOURCE_NAMES) and _is(fields[1], TARGET_NAMES)
    if header:
        roles = _edge_roles(path, line, fields, lead, shape)
        names = None
    else:
        if len(fields) not in (0, 2, 3):
            raise DataFileError(f"{path}: line {line} has {len(fields)} field{'s' * (len(fields) != 1)}; valid: 2 "
                                "(source, target) or 3 "
                                "(source, target, weight), or a header row naming the columns",
                                file=path, rule="2 or 3 fields a line, or a header row")
        names = ["source", "target", "weight"][:max(len(fields), 2)]
        roles = {n: n for n in names}
    table = read_table(path, sep, names, (roles["graph"],) if collection else (),
                       (roles["source"], roles["target"]))
    if table.frame.empty and not beside_nodes:
        raise table.error("no edges", "one edge or more a line" + ("" if collection else
                                                                   ", or a node table (nodes.csv, data.node-table)"))
    _missing_ids(table, [roles["source"], roles["target"]] + ([roles["graph"]] if collection else []),
                 f"{len(roles)} fields a line ({shape})")
    weight = None
    if "weight" in roles:
        weight = table.numbers(roles["weight"], "numeric edge weights", positive=True)
    graph = table.column(roles["graph"]) if collection else None
    return Edges(table, table.column(roles["source"]), table.column(roles["target"]), weight, graph)


def _edge_roles(path: Path, line: int, fields: list[str], lead: tuple[str, ...], shape: str) -> dict[str, str]:
    """Header name of each column role (graph, source, target, weight)."""
    roles = dict(zip(lead + ("source", "target"), fields))
    for name in fields[len(roles):]:
        if _is(name, WEIGHT_NAMES) and "weight" not in roles:
            roles["weight"] = name
        else:
            raise DataFileError(f"{path}: line {line}: column {name!r} is not a weight column; valid: the columns "
                                f"{shape} (weight named one of {', '.join(WEIGHT_NAMES)})",
                                file=path, rule="known columns (a weight column named as such)")
    if len(set(fields)) != len(fields):
        raise DataFileError(f"{path}: line {line} names a column twice; valid: distinct column names",
                            file=path, rule="distinct column names")
    return roles


# --------------------------------------------------------------------------- node tables


@dataclass
class Nodes:
    """A node table: IDs, features (None without feature columns), raw labels (None without a label column)."""

    table: Table
    ids: np.ndarray
    x: np.ndarray | None
    labels: np.ndarray | None
    label_column: str | None
    graph: np.ndarray | None = None
    feature_names: list[str] | None = None


def read_nodes(path: Path, sep: str | None, label_column: str = "label", names: list[str] | None = None,
               collection: bool = False, id_names: tuple[str, ...] = ID_NAMES) -> Nodes:
    """The node table in ``path``: the first column (after the graph column when ``collection``) holds
    the IDs, ``label_column`` (when present; an error when it is not the default ``label`` and absent)
    the labels, every other column a numeric feature. ``names``: the columns of a file without header;
    ``id_names``: the names of the ID column that make the first row a header."""
    line, fields = first_fields(path, sep)
    lead = 1 if collection else 0
    if names is None and len(fields) > lead and _is(fields[lead], id_names) and (not collection
                                                                                 or _is(fields[0], GRAPH_NAMES)):
        columns = None
        header = fields
        if len(set(header)) != len(header):
            raise DataFileError(f"{path}: line {line} names a column twice; valid: distinct column names",
                                file=path, rule="distinct column names")
    elif collection:
        raise DataFileError(f"{path}: line {line or 1} is not a header row; valid: a header row graph, id, "
                            "features...[, label]", file=path, rule="a header row graph, id, features...[, label]")
    else:
        if names is None and any(not _number(f) for f in fields[1:]):
            raise DataFileError(f"{path}: line {line} is neither a header (its first column {fields[0]!r} is not "
                                f"one of {', '.join(id_names)}) nor an ID followed by numbers; valid: a header "
                                f"row whose first column is named one of {', '.join(id_names)}",
                                file=path, rule="a header row naming the ID column, or an ID followed by numbers")
        columns = names or (["id"] + [f"x{i}" for i in range(len(fields) - 1)])
        header = columns
    if label_column not in header[lead + 1:] and label_column != "label":
        raise DataFileError(f"{path}: no column {label_column!r} (data.label-column); valid: one of "
                            f"{', '.join(header[lead + 1:]) or 'none (the table has an ID column only)'}",
                            file=path, rule="a label column (data.label-column)")
    label = label_column if label_column in header[lead + 1:] else None
    id_name = header[lead]
    table = read_table(path, sep, columns, tuple(header[:lead]) + ((label,) if label else ()), (id_name,))
    if table.frame.empty:
        raise table.error("no rows", "one node a line")
    _missing_ids(table, list(header[:lead + 1]), f"an ID in column {id_name!r} on every line", "an ID on every line")
    features = [c for c in header[lead + 1:] if c != label]
    x = None
    if features:
        x = np.column_stack([table.numbers(c, "numeric feature columns (name the label column with "
                                              "data.label-column)") for c in features])
    labels = table.column(label).astype(str) if label else None
    graph = table.column(header[0]) if collection else None
    return Nodes(table, table.column(id_name), x, labels, label, graph, features)


# --------------------------------------------------------------------------- one graph


def read_edge_list(path: Path, name: str, node_table: Path | None = None, label_column: str = "label",
                   weighted: bool = True, node_columns: list[str] | None = None,
                   node_sep: str | None = ",", boundary: bool = False) -> GraphData:
    """One graph from an edge list (None: from the node table alone, a graph without edges) and an
    optional node table: the node table's IDs are the nodes, without one the IDs the edges name.
    An edge naming an ID the node table does not list is an error, or with ``boundary`` (a
    party's piece of a node split) one of the graph's boundary edges (:mod:`fedgraphcore.data.boundary`).
    ``weighted=False`` reads every edge as weight 1."""
    edges = None if path is None else read_edges(path, SEPARATORS[text_suffix(path)],
                                                 beside_nodes=node_table is not None)
    nodes = None if node_table is None else read_nodes(node_table, node_sep, label_column, node_columns)
    if edges is not None and edges.table.frame.empty:  # an edge list without a row beside a node table: no edges
        edges = None
    source = edges.table.source if edges is not None else nodes.table.source
    weight = edges.weight if edges is not None and weighted else None
    outside = None
    if edges is None:
        src = dst = np.zeros(0, np.int64)
        keys = nodes.ids
    else:
        codes, ends = pd.factorize(np.concatenate([edges.src, edges.dst]))
        _refuse_unnamed_header(edges, ends)
        src, dst = codes[:len(edges.src)], codes[len(edges.src):]
        if nodes is None:
            keys = ends
        elif boundary:
            table_keys, edge_keys = _comparable_keys(edges, nodes, ends)
            src, dst, weight, outside = split_edges(table_keys, edge_keys, src, dst, weight,
                                                       lambda i: f"{edges.table.path}: {edges.table.where(i)}")
            keys = nodes.ids
        else:
            codes, keys = _edges_in_table(edges, nodes, codes, ends), nodes.ids
            src, dst = codes[:len(edges.src)], codes[len(edges.src):]
    meta = {"source": str(path if path is not None else node_table)}
    if nodes is not None:  # the table's own names, which python -m app.data.prepare --format files writes back
        meta.update(node_table=str(node_table), id_column=str(nodes.table.frame.columns[0]),
                    feature_names=nodes.feature_names, label_column=nodes.label_column)
    graph = assemble(name, len(keys), src, dst, source, keys=keys, weight=weight,
                     x=None if nodes is None else nodes.x, labels=None if nodes is None else nodes.labels,
                     labels_what=f"column {nodes.label_column!r}" if nodes is not None else "labels",
                     label_source=None if nodes is None else nodes.table.source, meta=meta,
                     linked=None if outside is None else outside.rows)
    if outside is not None:
        graph.boundary = in_row_order(outside, id_array(nodes.ids, nodes.table.source), graph.keys)
    return graph


def _comparable_keys(edges: Edges, nodes: Nodes, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The node table's IDs and the edge ends' IDs, of one kind."""
    table_keys = id_array(nodes.ids, nodes.table.source)
    _check_table_distinct(nodes, table_keys)
    edge_keys = np.asarray(ends).astype(str) if table_keys.dtype.kind == "U" else id_array(ends, edges.table.source)
    return _comparable(table_keys, edge_keys)


def _refuse_unnamed_header(edges: Edges, ends: np.ndarray) -> None:
    """A first row of words over integer IDs is a header with names the reader does not know: refused,
    not read as an edge between two nodes named like the columns."""
    if edges.table.header or np.asarray(ends).dtype.kind in "iu" or len(edges.src) < 2:
        return
    text = np.asarray(ends).astype(str)
    first = [str(edges.src[0]), str(edges.dst[0])]
    words = pd.Series(first).str.fullmatch(INTEGER)
    rest = pd.Series(text[~np.isin(text, first)])
    if not words.any() and rest.size and rest.str.fullmatch(INTEGER).all():
        raise edges.table.error(f"{edges.table.where(0)} ({', '.join(first)}) reads as a header with unknown column "
                                "names", "a header naming source and target (" + ", ".join(
                                    f"{s},{t}" for s, t in zip(SOURCE_NAMES[:4], TARGET_NAMES[:4]))
                                + ") or no header")


def _edges_in_table(edges: Edges, nodes: Nodes, codes: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The node-table row of every edge end; an ID the table does not hold is refused."""
    table_keys, edge_keys = _comparable_keys(edges, nodes, ends)
    rows = pd.Index(table_keys).get_indexer(edge_keys)
    unknown = np.flatnonzero(rows < 0)
    if unknown.size:
        at = np.flatnonzero(np.isin(codes, unknown))
        rows_at = at % len(edges.src)
        first = int(at[np.argmin(rows_at)])
        raise edges.table.error(f"{edges.table.where(int(rows_at.min()))} names node {show(edge_keys[codes[first]])}, which "
                                f"{nodes.table.path} does not list", "node IDs of the node table")
    return rows[codes]


def _comparable(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Two ID arrays of one kind: as text when one is integers and the other is not."""
    return (a, b) if a.dtype.kind == b.dtype.kind else (a.astype(str), b.astype(str))


def _check_table_distinct(nodes: Nodes, keys: np.ndarray) -> None:
    order = np.argsort(keys, kind="stable")
    same = np.flatnonzero(keys[order][1:] == keys[order][:-1])
    if same.size:
        i, j = sorted(order[same[0]: same[0] + 2])
        raise nodes.table.error(f"{nodes.table.where(j)} repeats node ID {show(keys[j])} of {nodes.table.where(i)}",
                                "each node ID once")


# --------------------------------------------------------------------------- collections


COLLECTION_FILES = ("graphs.csv", "edges.csv", "nodes.csv")


def read_collection_dir(directory: Path, name: str, label_column: str = "label",
                        weighted: bool = True) -> GraphCollection:
    """A graph collection in the CSV layout (module docstring)."""
    graphs_path, edges_path, nodes_path = (directory / f for f in COLLECTION_FILES)
    graphs = read_nodes(graphs_path, ",", label_column, id_names=GRAPH_NAMES)
    if graphs.labels is None:
        raise graphs.table.error(f"no column {label_column!r} (data.label-column)", "graph, label columns",
                                 "a label column (data.label-column)")
    gkeys = id_array(graphs.ids, graphs.table.source, "graph IDs")
    _check_table_distinct(graphs, gkeys)
    edges = read_edges(edges_path, ",", collection=True)
    nodes = read_nodes(nodes_path, ",", "label", collection=True) if nodes_path.is_file() else None
    gindex = pd.Index(gkeys)
    edge_graph = _graph_rows(edges.table, edges.graph, gindex, graphs_path)
    codes, ends = pd.factorize(np.concatenate([edges.src, edges.dst]))
    pair_graph, pair_key = np.concatenate([edge_graph, edge_graph]), id_array(ends, edges.table.source)[codes]
    if nodes is None:
        node_graph, node_keys = pair_graph, pair_key
        frame = pd.DataFrame({"g": node_graph, "k": node_keys}).drop_duplicates()
        node_graph, node_keys, x = frame["g"].to_numpy(), frame["k"].to_numpy(), None
        node_source = edges.table
    else:
        node_graph = _graph_rows(nodes.table, nodes.graph, gindex, graphs_path)
        node_keys, x, node_source = id_array(nodes.ids, nodes.table.source), nodes.x, nodes.table
        node_keys, pair_key = _comparable(node_keys, pair_key)
    index = pd.MultiIndex.from_arrays([node_graph, node_keys])
    at = index.get_indexer(pd.MultiIndex.from_arrays([pair_graph, pair_key])) if index.is_unique else None
    if at is None:
        _refuse_repeated_nodes(nodes, node_graph, node_keys)
    unknown = np.flatnonzero(at < 0)
    if unknown.size:
        first = unknown[np.argmin(unknown % len(edges.src))]
        raise edges.table.error(f"{edges.table.where(int(first % len(edges.src)))} names node "
                                f"{show(pair_key[first])} of graph {show(gkeys[pair_graph[first]])}, which "
                                f"{nodes_path} does not list",
                                "node IDs of the node table, per graph")
    # graphs without a node in the tables are refused by assemble_collection, naming their line
    source = Source(str(edges_path), edge=edges.table.where, node=node_source.where)
    return assemble_collection(
        name, node_graph, len(gkeys), at[:len(edges.src)], at[len(edges.src):], source, graph_keys=gkeys,
        graph_labels=graphs.labels, labels_what=f"column {label_column!r}", label_source=graphs.table.source,
        graph_where=lambda g: f"graph {show(gkeys[g])} ({graphs_path} {graphs.table.where(g)})",
        node_keys=node_keys, weight=edges.weight if weighted else None, x=x,
        meta={"source": str(directory), "format": "csv-collection"})


def _graph_rows(table: Table, graph_ids: np.ndarray, gindex: pd.Index, graphs_path: Path) -> np.ndarray:
    keys, known = _comparable(id_array(graph_ids, table.source, "graph IDs"), gindex.to_numpy())
    rows = pd.Index(known).get_indexer(keys)
    bad = np.flatnonzero(rows < 0)
    if bad.size:
        raise table.error(f"{table.where(bad[0])} names graph {show(keys[bad[0]])}, which {graphs_path} does not "
                          "list", "graph IDs of graphs.csv")
    return rows


def _refuse_repeated_nodes(nodes: Nodes, graph: np.ndarray, keys: np.ndarray) -> None:
    frame = pd.DataFrame({"g": graph, "k": keys})
    twice = np.flatnonzero(frame.duplicated(keep="first").to_numpy())[0]
    first = np.flatnonzero((graph == graph[twice]) & (keys == keys[twice]))[0]
    raise nodes.table.error(f"{nodes.table.where(twice)} repeats node ID {show(keys[twice])} of "
                            f"{nodes.table.where(first)} in one graph", "each node ID once per graph")
