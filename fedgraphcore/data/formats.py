"""One graph (or a collection of graphs) from a file or a Python object: the loader layer of the
built-in datasets and of a user's own data.

* :func:`read_graph` - a path; the format follows the suffix or the directory's files
  (:data:`FORMAT_HELP`).
* :func:`as_graph` - an object: :class:`GraphData`/:class:`GraphCollection` (as is), a PyG ``Data``
  (or a list of them, one graph label each), a ``networkx`` graph, a scipy sparse or numpy adjacency,
  a tuple ``(adj, x[, y])``, or a path.
* :func:`write_npz` - a :class:`GraphData` in the ``.npz`` layout :func:`read_graph` reads.

Options (the run-config keys of :mod:`fedgraphcore.data.params` in brackets): ``node_table``
[``data.node-table``] a node table for an edge list (a directory's ``nodes.csv`` by
default); ``label_column`` [``data.label-column``] the label column of a node table or
``graphs.csv``, the node attribute of a networkx graph, the variable of a ``.mat``
(default ``label``; used when present); ``weighted`` [``data.weighted``] False reads every
edge as weight 1; ``name`` the dataset's name (default: the file name without its suffixes).

Nothing here runs code from a file: ``.npz`` with ``allow_pickle=False``, ``.pt`` with
``torch.load(weights_only=True)`` allowing PyG's ``Data`` classes only, Planetoid pickles
through a restricted unpickler (:mod:`fedgraphcore.data.planetoid`), ``.mat`` through
``scipy.io.loadmat`` (MATLAB v5, no pickles).

The ``.npz`` layout: ``edge_index`` (2 x E integers, row positions) with an optional
``edge_weight`` (E) and ``num_nodes``, or the CSR parts ``adj_data``, ``adj_indices``,
``adj_indptr``, ``adj_shape``; ``x`` (n x f) or its CSR parts ``x_data``, ``x_indices``,
``x_indptr``, ``x_shape``; ``y`` (n labels, integers with -1 unknown, or text with ''
unknown); ``node_ids`` (n integers or strings). A file written by
``scipy.sparse.save_npz`` is read as the adjacency alone.
"""

from __future__ import annotations

import os
import pickle
import re
import warnings
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from .assemble import (SEPARATORS, DataFileError, Source, assemble, assemble_collection, check_expansion, describe,
                       feature_matrix, one_line, text_suffix)
from .networkx_graph import from_networkx, is_networkx
from .planetoid import find_planetoid, read_planetoid
from .tu import find_tu, read_tu
from .types import GraphCollection, GraphData

FORMAT_HELP = ("an edge list (.csv, .tsv, .txt, .edges, .edgelist, also .gz), .npz, a saved PyG Data (.pt, .pth), "
               ".mat, or a directory: edges.csv [+ nodes.csv], graphs.csv + edges.csv [+ nodes.csv] (a collection), "
               "TU files (DS_A.txt, DS_graph_indicator.txt, DS_graph_labels.txt) or Planetoid files (ind.NAME.*)")
NPZ_ARRAYS = ("edge_index", "edge_weight", "num_nodes", "adj_data", "adj_indices", "adj_indptr", "adj_shape", "x",
              "x_data", "x_indices", "x_indptr", "x_shape", "y", "node_ids")
MAT_ADJACENCY = ("W", "A", "adj", "network", "G")
MAT_FEATURES = ("fea", "X", "x", "features", "attributes")
MAT_LABELS = ("gnd", "y", "labels", "label", "group")
_SUFFIXES = {**{s: "edge-list" for s in SEPARATORS}, ".npz": "npz", ".pt": "pyg", ".pth": "pyg", ".mat": "mat"}
_EDGE_FILES = ("edges.csv", "edges.tsv", "edges.txt", "edges.csv.gz", "edges.tsv.gz", "edges.txt.gz")
_NODE_FILES = ("nodes.csv", "nodes.tsv")
#: the files a directory's layouts read by name
PART_FILES = _EDGE_FILES + _NODE_FILES + ("graphs.csv",)


def dataset_name(path: str | os.PathLike, disk: bool = True) -> str:
    """The name of the data in ``path``: the file name without its format suffix (and ``.gz``); a
    directory's name. ``disk`` False: from the spelling alone (a known format suffix is taken off
    whatever lies there)."""
    p = Path(path)
    name = p.name
    if not (disk and p.is_dir()):
        for suffix in (".gz", text_suffix(p)):
            if name.lower().endswith(suffix) and (suffix == ".gz" or suffix in _SUFFIXES):
                name = name[: -len(suffix)]
    return name or p.name


def graph_kind(path: Path) -> str | None:
    """The format of ``path`` (without reading it), or None when it is none of :data:`FORMAT_HELP`."""
    if path.is_dir():
        if (path / "graphs.csv").is_file():
            return "csv-collection"
        if any((path / f).is_file() for f in _EDGE_FILES + _NODE_FILES):
            return "edge-dir"
        if find_tu(path):
            return "tu"
        if find_planetoid(path):
            return "planetoid"
        return None
    return _SUFFIXES.get(text_suffix(path))


def read_graph(path: str | os.PathLike, *, name: str | None = None, node_table: str | os.PathLike | None = None,
               label_column: str = "label", weighted: bool = True, boundary: bool = False) -> GraphData | GraphCollection:
    """The graph (or collection) in ``path``; see the module docstring for formats and options.

    Parameters
    ----------
    path : path
        A file or directory in one of the formats of :data:`FORMAT_HELP`.
    name : str, optional
        The data's name (default: the file name without its format suffix).
    node_table : path, optional
        A node table (ID, features, label) beside an edge list.
    label_column : str
        The node table's label column.
    weighted : bool
        Read edge weights where the file has them; False reads every edge as weight 1.
    boundary : bool
        A party's piece of a node split, whose edge list may name nodes its node table does
        not list (its boundary edges, ``GraphData.boundary``); else such an edge is an error.

    Returns
    -------
    GraphData or GraphCollection
        Checked: symmetric adjacency, rows in ID order, repairs noted in ``meta["notes"]``.

    Raises
    ------
    fedgraphcore.data.assemble.DataFileError
        One line (a :class:`fedgraphcore.config.ConfigError`) naming the file, the line or array entry
        and what was expected.
    """
    path = Path(path)
    for link in [path] + (sorted(p for p in path.iterdir() if p.name in PART_FILES) if path.is_dir() else []):
        if link.is_symlink() and not link.exists():
            raise DataFileError(f"{link}: a symbolic link that leads nowhere (a loop or a missing target); valid: a "
                                "link to an existing file, or the file itself", file=link, rule="an existing file")
    if not path.exists():
        raise DataFileError(f"{path}: no such file or directory; valid: {FORMAT_HELP}",
                            file=path, rule="an existing file or directory")
    kind = graph_kind(path)
    if kind is None:
        found = f"suffix {path.suffix!r}" if path.is_file() else "a directory without graph files"
        raise DataFileError(f"{path}: unknown format ({found}); valid: {FORMAT_HELP}", file=path, rule="a known format")
    if node_table and kind not in ("edge-list", "edge-dir"):
        raise DataFileError(f"{path}: a node table (data.node-table={node_table}) goes with an edge list, not a "
                            f"{kind} file; valid: data.node-table empty",
                            file=path, rule="data.node-table with an edge list only")
    if node_table and not Path(node_table).is_file():
        raise DataFileError(f"{node_table}: no such file (data.node-table); valid: a node table file",
                            file=node_table, rule="an existing node table file")
    name = name or dataset_name(path)
    for file in [path] if path.is_file() else [path / f for f in PART_FILES if (path / f).is_file()]:
        check_expansion(file)
    if node_table:
        check_expansion(Path(node_table))
    with one_line(f"{path}: cannot be read as {kind}", FORMAT_HELP, path):
        return _read(path, kind, name, node_table, label_column, weighted, boundary)


def _read(path: Path, kind: str, name: str, node_table, label_column: str, weighted: bool, boundary: bool):
    from .tables import read_collection_dir, read_edge_list  # pandas: not at import (the ClientApp's)

    if kind == "edge-list":
        return read_edge_list(path, name, _path(node_table), label_column, weighted,
                              node_sep=_separator(node_table), boundary=boundary)
    if kind == "edge-dir":
        edges = next((path / f for f in _EDGE_FILES if (path / f).is_file()), None)
        nodes = _path(node_table) or next((path / f for f in _NODE_FILES if (path / f).is_file()), None)
        return read_edge_list(edges, name, nodes, label_column, weighted, node_sep=_separator(nodes),
                              boundary=boundary)
    if kind == "csv-collection":
        return read_collection_dir(path, name, label_column, weighted)
    if kind == "tu":
        return read_tu(*find_tu(path), name)
    if kind == "planetoid":
        return read_planetoid(*find_planetoid(path), name)
    if kind == "npz":
        return read_npz(path, name, weighted)
    if kind == "pyg":
        return read_pyg(path, name, weighted)
    return read_mat(path, name, label_column, weighted)


def _path(value) -> Path | None:
    return Path(value) if value else None


def _separator(path) -> str | None:
    return SEPARATORS.get(text_suffix(Path(path)), ",") if path else ","


# --------------------------------------------------------------------------- arrays


def _entries(adj, source: Source) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """The stored entries of a square adjacency (explicit zeros are no edges)."""
    m = sp.coo_matrix(adj) if sp.issparse(adj) else sp.coo_matrix(np.asarray(adj))
    if m.shape[0] != m.shape[1]:
        raise source.error(f"adjacency of shape {m.shape}", "a square n x n matrix")
    m.eliminate_zeros()
    return m.row.astype(np.int64), m.col.astype(np.int64), m.data.astype(np.float64), int(m.shape[0])


def from_adjacency(adj, x=None, y=None, *, name: str = "graph", weighted: bool = True, keys=None,
                   source: Source | None = None) -> GraphData:
    """A graph from an adjacency matrix (its entries are the edges and their weights; an entry
    without its transpose is an edge all the same), features ``x`` and labels ``y`` (-1 unknown)."""
    source = source or Source("adjacency matrix")
    row, col, data, n = _entries(adj, source)
    source.edge = lambda i: f"adjacency entry ({row[i]}, {col[i]})"
    return assemble(name, n, row, col, source, keys=keys, weight=data if weighted else None,
                    x=feature_matrix(x, n, source, "x"), labels=y, labels_what="y", negative_unknown=True,
                    meta={"source": source.file})


def read_npz(path: Path, name: str, weighted: bool = True) -> GraphData:
    """The graph of an ``.npz`` file (module docstring), read with ``allow_pickle=False``."""
    arrays = _npz_arrays(path)
    source = Source(str(path), node=lambda i: f"node_ids[{i}]")
    if "format" in arrays:  # scipy.sparse.save_npz
        try:
            adj = sp.load_npz(path)
        except (ValueError, KeyError, NotImplementedError) as err:
            raise source.error(f"a scipy sparse file that cannot be read ({err})", "scipy.sparse.save_npz of the "
                               "adjacency") from None
        return from_adjacency(adj, name=name, weighted=weighted, source=source)
    unknown = sorted(set(arrays) - set(NPZ_ARRAYS))
    if unknown:
        raise source.error(f"unknown array {unknown[0]!r}", "arrays named " + ", ".join(NPZ_ARRAYS))
    if "edge_index" in arrays and "adj_data" in arrays:
        raise source.error("both edge_index and adj_data", "one of them: the edges or the adjacency's CSR parts")
    x = arrays.get("x")
    if "x_data" in arrays:
        x = _csr_parts(arrays, "x", source)
    y, node_ids = arrays.get("y"), arrays.get("node_ids")
    n = _node_count(arrays, x, source)
    if "edge_index" in arrays:
        ei = _edge_index(arrays["edge_index"], source, "edge_index")
        src, dst = ei
        weight = arrays.get("edge_weight")
        if weight is not None and weight.shape != (ei.shape[1],):
            raise source.error(f"edge_weight of shape {weight.shape}", f"({ei.shape[1]},): one per edge_index column",
                               "one edge_weight per edge_index column")
        source.edge = lambda i: f"edge_index column {i}"
        n = n if n is not None else int(ei.max()) + 1 if ei.size else 0
    elif "adj_data" in arrays:
        src, dst, weight, n_adj = _entries(_csr_parts(arrays, "adj", source), source)
        source.edge = lambda i: f"adjacency entry ({src[i]}, {dst[i]})"
        if n is not None and n != n_adj:
            raise source.error(f"adj_shape {n_adj} x {n_adj} for {n} nodes", "one adjacency row per node")
        n = n_adj
    else:
        src = dst = np.zeros(0, np.int64)
        weight = None
        n = n or 0
    if node_ids is not None and node_ids.dtype.kind not in "iuU":
        raise source.error(f"node_ids of type {node_ids.dtype}", "integers or strings")
    return assemble(name, n, src, dst, source, keys=node_ids, weight=weight if weighted else None,
                    x=feature_matrix(x, n, source, "x"), labels=y, labels_what="y", negative_unknown=True,
                    label_source=Source(str(path), node=lambda i: f"y[{i}]"),
                    meta={"source": str(path), "format": "npz"})


def _npz_arrays(path: Path) -> dict[str, np.ndarray]:
    valid = "valid: np.savez of the arrays " + ", ".join(NPZ_ARRAYS)
    try:
        archive = np.load(path, allow_pickle=False)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as err:
        what = ("neither a zip of .npy arrays nor one .npy array; a pickle is never read" if "pickled" in str(err)
                else describe(err))
        raise DataFileError(f"{path}: not an .npz archive ({what}); {valid}",
                            file=path, rule="an .npz archive") from None
    if not hasattr(archive, "files"):
        raise DataFileError(f"{path}: a single .npy array, not an .npz archive; {valid}",
                            file=path, rule="an .npz archive")
    with archive:
        arrays = {}
        for key in archive.files:
            try:
                arrays[key] = archive[key]
            except ValueError:  # allow_pickle=False refuses an object array
                raise DataFileError(f"{path}: array {key!r} holds Python objects (pickled); valid: numeric or string "
                                    "arrays", file=path, rule="numeric or string arrays") from None
            except (zipfile.BadZipFile, OSError, EOFError) as err:
                raise DataFileError(f"{path}: array {key!r} cannot be read ({describe(err)}); {valid}",
                                    file=path, rule="readable arrays") from None
            if not isinstance(arrays[key], np.ndarray):  # a member other than an .npy: numpy hands its raw bytes
                raise DataFileError(f"{path}: member {key!r} is not a numpy array (.npy); {valid}", file=path,
                                    rule="numeric or string arrays")
    return arrays


def _csr_parts(arrays: dict, prefix: str, source: Source) -> sp.csr_matrix:
    parts = [f"{prefix}_{p}" for p in ("data", "indices", "indptr", "shape")]
    missing = [p for p in parts if p not in arrays]
    if missing:
        raise source.error(f"{parts[0]} without {missing[0]}", "all of " + ", ".join(parts))
    try:
        m = sp.csr_matrix((arrays[parts[0]], arrays[parts[1]], arrays[parts[2]]),
                          shape=tuple(int(s) for s in arrays[parts[3]]))
        m.check_format(full_check=True)
    except (ValueError, TypeError) as err:
        raise source.error(f"{', '.join(parts)} do not make a CSR matrix ({err})", "scipy CSR parts") from None
    return m


def _edge_index(ei: np.ndarray, source: Source, what: str) -> np.ndarray:
    if ei.ndim != 2 or ei.shape[0] != 2 or (ei.size and ei.dtype.kind not in "iu"):
        raise source.error(f"{what} of shape {ei.shape} and type {ei.dtype}", "2 x E integer row positions")
    return ei.astype(np.int64)


def _node_count(arrays: dict, x, source: Source) -> int | None:
    """n as every per-node array gives it (they must agree), None when none does."""
    sizes = {}
    if "num_nodes" in arrays:
        sizes["num_nodes"] = int(np.asarray(arrays["num_nodes"]).reshape(-1)[0])
    for key, value in (("x", x), ("y", arrays.get("y")), ("node_ids", arrays.get("node_ids"))):
        if value is not None:
            sizes[key] = int(value.shape[0])
    if len(set(sizes.values())) > 1:
        listed = ", ".join(f"{k} {v}" for k, v in sizes.items())
        raise source.error(f"node counts disagree ({listed})", "one row of x, y and node_ids per node")
    return next(iter(sizes.values()), None)


def write_npz(data: GraphData, path: str | os.PathLike) -> Path:
    """``data`` in the ``.npz`` layout of :func:`read_npz` (CSR parts, ``node_ids`` when the graph has
    them); reading it back gives the same arrays."""
    adj = sp.csr_matrix(data.adj)
    arrays = {"adj_data": adj.data, "adj_indices": adj.indices, "adj_indptr": adj.indptr,
              "adj_shape": np.asarray(adj.shape, dtype=np.int64)}
    if sp.issparse(data.x):
        x = sp.csr_matrix(data.x)
        arrays.update(x_data=x.data, x_indices=x.indices, x_indptr=x.indptr,
                      x_shape=np.asarray(x.shape, dtype=np.int64))
    elif data.x is not None:
        arrays["x"] = np.asarray(data.x)
    if data.y is not None:
        arrays["y"] = np.asarray(data.y)
    if data.node_keys is not None:
        arrays["node_ids"] = data.node_keys
    path = Path(path)
    np.savez_compressed(path, **arrays)
    return path


# --------------------------------------------------------------------------- .mat


def read_mat(path: Path, name: str, label_column: str = "label", weighted: bool = True) -> GraphData:
    """A MATLAB v5 ``.mat`` graph: the adjacency (:data:`MAT_ADJACENCY`), features (:data:`MAT_FEATURES`)
    and labels (``label_column`` or :data:`MAT_LABELS`), as in the AGC wiki file (W, fea, gnd)."""
    import scipy.io as sio

    try:
        m = sio.loadmat(str(path))
    except NotImplementedError:
        raise DataFileError(f"{path}: a MATLAB v7.3 (HDF5) file; valid: a MATLAB v5 file (save -v7, "
                            "scipy.io.savemat)", file=path, rule="a MATLAB v5 file") from None
    except Exception as err:  # scipy raises anything from MatReadError to TypeError on a bad file
        raise DataFileError(f"{path}: not a MATLAB file ({describe(err)}); "
                            "valid: a MATLAB v5 file with the adjacency, features and labels",
                            file=path, rule="a MATLAB v5 file") from None
    names = [k for k in m if not k.startswith("__")]
    adj_key = next((k for k in MAT_ADJACENCY if k in m), None)
    if adj_key is None:
        raise DataFileError(f"{path}: no adjacency variable (found {', '.join(names) or 'none'}); valid: one of "
                            + ", ".join(MAT_ADJACENCY), file=path, rule="an adjacency variable")
    x_key = next((k for k in MAT_FEATURES if k in m), None)
    y_key = next((k for k in (label_column, *MAT_LABELS) if k in m), None)
    adj, x = m[adj_key], None if x_key is None else m[x_key]
    y = None if y_key is None else np.asarray(m[y_key])
    rows = adj.shape[0]
    if (adj.shape != (rows, rows) or (x is not None and x.shape[0] != rows)
            or (y is not None and y.size != rows)):
        fea = "no" if x is None else x.shape[0]
        gnd = "no" if y is None else y.size
        raise DataFileError(f"{path} holds a {adj.shape[0]}x{adj.shape[1]} {adj_key}, {fea} {x_key or 'fea'} rows "
                            f"and {gnd} {y_key or 'gnd'} entries; valid: a square {adj_key} with one "
                            f"{x_key or 'fea'} row and one {y_key or 'gnd'} entry per node",
                            file=path, rule="one feature row and one label per adjacency row")
    source = Source(str(path))
    row, col, data, n = _entries(adj, source)
    source.edge = lambda i: f"{adj_key} entry ({row[i]}, {col[i]})"
    return assemble(name, n, row, col, source, weight=data if weighted else None, x=feature_matrix(x, n, source, x_key),
                    labels=None if y is None else y.ravel(), labels_what=f"variable {y_key!r}",
                    label_source=Source(str(path), node=lambda i: f"{y_key}[{i}]"),
                    meta={"source": str(path), "format": "mat"})


# --------------------------------------------------------------------------- PyG


def _pyg_classes():
    """PyG's ``Data`` and the classes a saved ``Data`` pickles (its attribute and storage types)."""
    from torch_geometric.data import Data
    from torch_geometric.data.data import DataEdgeAttr, DataTensorAttr
    from torch_geometric.data.storage import GlobalStorage

    return Data, [Data, DataEdgeAttr, DataTensorAttr, GlobalStorage]


def read_pyg(path: Path, name: str, weighted: bool = True) -> GraphData | GraphCollection:
    """A ``torch.save``\\ d PyG ``Data`` (one graph) or list of ``Data`` (a collection, a graph label
    ``y`` each), loaded with ``torch.load(weights_only=True)``: only tensors, plain containers and
    PyG's Data classes are built, nothing is called."""
    import torch

    Data, allowed = _pyg_classes()
    try:
        with torch.serialization.safe_globals(allowed), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's notes on a pickle protocol: the refusal below says it in one line
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        found = re.search(r"(?:Unsupported global: GLOBAL|unsupported GLOBAL) ([\w.]+)", str(err))
        other = re.search(r"WeightsUnpickler error:\s*([^\n]+)", str(err))
        detail = (f"it refers to {found.group(1)}" if found else f"a pickle of other Python objects: "
                  f"{other.group(1).strip()}" if other else "a pickle of other objects")
        raise DataFileError(f"{path} is not a PyG Data ({detail}, which weights-only loading refuses); valid: "
                            "torch.save of a torch_geometric Data or a list of Data",
                            file=path, rule="a torch.save of PyG Data only") from None
    except Exception as err:  # torch raises RuntimeError, EOFError, ... on a file that is not a torch.save
        raise DataFileError(f"{path} is not a PyG Data (not a torch.save file: {type(err).__name__}); valid: "
                            "torch.save of a torch_geometric Data or a list of Data",
                            file=path, rule="a torch.save of PyG Data only") from None
    return _from_pyg(obj, name, Source(str(path), edge=lambda i: f"edge_index column {i}"), weighted)


def _from_pyg(obj, name: str, source: Source, weighted: bool) -> GraphData | GraphCollection:
    Data, _ = _pyg_classes()
    if isinstance(obj, Data):
        return _pyg_graph(obj, name, source, weighted)
    if isinstance(obj, (list, tuple)) and obj and all(isinstance(d, Data) for d in obj):
        return _pyg_collection(list(obj), name, source, weighted)
    raise source.error(f"is not a PyG Data (it holds a {type(obj).__name__})",
                       "a torch_geometric Data or a non-empty list of Data")


def _numpy(value, what: str, source: Source) -> np.ndarray | None:
    if value is None:
        return None
    if isinstance(value, (list, tuple)):  # node_ids as a list of strings or ints
        return np.asarray(value)
    try:
        import torch

        if isinstance(value, torch.Tensor):
            value = value.to_dense() if value.is_sparse else value
            return value.detach().cpu().numpy()
    except ImportError:  # pragma: no cover - torch is a dependency
        pass
    raise source.error(f"{what} is a {type(value).__name__}", "a tensor")


def _pyg_parts(d, source: Source, weighted: bool) -> dict[str, Any]:
    """The arrays of one Data: edges, weights, n, features, node labels (y of n entries), node IDs."""
    ei = _numpy(d.edge_index, "edge_index", source)
    ei = np.zeros((2, 0), np.int64) if ei is None else _edge_index(ei, source, "edge_index")
    n = int(d.num_nodes) if d.num_nodes is not None else 0
    weight = _numpy(getattr(d, "edge_weight", None), "edge_weight", source)
    if weight is not None and weight.shape != (ei.shape[1],):
        raise source.error(f"edge_weight of shape {weight.shape}", f"({ei.shape[1]},): one per edge",
                           "one edge_weight per edge")
    y = _numpy(d.y, "y", source)
    keys = _numpy(getattr(d, "node_ids", None), "node_ids", source)
    return {"ei": ei, "n": n, "weight": weight if weighted else None, "x": _numpy(d.x, "x", source), "y": y,
            "keys": keys}


def _pyg_graph(d, name: str, source: Source, weighted: bool) -> GraphData:
    p = _pyg_parts(d, source, weighted)
    y = p["y"]
    if y is not None and y.reshape(-1).shape != (p["n"],):
        raise source.error(f"y of shape {y.shape} for {p['n']} nodes", "one label per node (or no y)")
    return assemble(name, p["n"], p["ei"][0], p["ei"][1], source, keys=p["keys"], weight=p["weight"],
                    x=feature_matrix(p["x"], p["n"], source, "x"), labels=None if y is None else y.reshape(-1),
                    labels_what="y", negative_unknown=True, meta={"source": source.file, "format": "pyg"})


def _pyg_collection(items: list, name: str, source: Source, weighted: bool) -> GraphCollection:
    parts = [_pyg_parts(d, source, weighted) for d in items]
    bad = next((i for i, p in enumerate(parts) if p["y"] is None or p["y"].size != 1), None)
    if bad is not None:
        raise source.error(f"graph {bad} has no graph label (y of one value)", "a list of Data with a graph label y each")
    widths = {None if p["x"] is None else p["x"].shape[1:] for p in parts}
    if len(widths) > 1:
        raise source.error("graphs with different feature widths (or some without x)", "one feature width")
    offsets = np.concatenate([[0], np.cumsum([p["n"] for p in parts])])
    src = np.concatenate([p["ei"][0] + offsets[i] for i, p in enumerate(parts)])
    dst = np.concatenate([p["ei"][1] + offsets[i] for i, p in enumerate(parts)])
    weighted_parts = [p["weight"] for p in parts]
    weight = None if any(w is None for w in weighted_parts) else np.concatenate(weighted_parts)
    x = None if widths == {None} else np.vstack([p["x"] for p in parts])
    graph_of = np.repeat(np.arange(len(parts)), np.diff(offsets))
    return assemble_collection(name, graph_of, len(parts), src, dst, source,
                               graph_labels=np.concatenate([p["y"].reshape(-1) for p in parts]), labels_what="y",
                               graph_where=lambda g: f"graph {g}", weight=weight,
                               x=feature_matrix(x, int(offsets[-1]), source, "x"),
                               meta={"source": source.file, "format": "pyg"})


# --------------------------------------------------------------------------- objects


def as_graph(obj, *, name: str | None = None, node_table=None, label_column: str = "label",
             weighted: bool = True, boundary: bool = False) -> GraphData | GraphCollection:
    """``obj`` as a checked :class:`GraphData` or :class:`GraphCollection` (module docstring).

    Parameters
    ----------
    obj : graph-like
        A path (:func:`read_graph`), a ``GraphData`` or ``GraphCollection``, a PyG ``Data`` (or
        a list of them: a collection), a ``networkx`` graph, a scipy sparse or numpy adjacency,
        or a tuple ``(adjacency, features[, labels])``.
    name, node_table, label_column, weighted, boundary
        As for :func:`read_graph` (``node_table`` with a path only).

    Returns
    -------
    GraphData or GraphCollection

    Raises
    ------
    fedgraphcore.data.assemble.DataFileError
        One line naming what cannot be a graph and the valid kinds of ``obj``.
    """
    if isinstance(obj, (str, os.PathLike)):
        return read_graph(obj, name=name, node_table=node_table, label_column=label_column, weighted=weighted,
                          boundary=boundary)
    if node_table:
        raise DataFileError(f"node_table={node_table} goes with an edge-list path, not a {type(obj).__name__}; "
                            "valid: node_table=None")
    if isinstance(obj, (GraphData, GraphCollection)):
        try:
            return obj.validate()
        except ValueError as err:
            raise DataFileError(f"{err}; valid: the conventions of fedgraphcore.data.types") from None
    name = name or "graph"
    if _is_pyg(obj):
        return _from_pyg(obj, name, Source(f"PyG data {name!r}", edge=lambda i: f"edge_index column {i}"), weighted)
    if is_networkx(obj):
        return from_networkx(obj, name, label_column, weighted)
    if sp.issparse(obj) or isinstance(obj, np.ndarray):
        return from_adjacency(obj, name=name, weighted=weighted)
    if isinstance(obj, tuple) and 2 <= len(obj) <= 3 and (sp.issparse(obj[0]) or isinstance(obj[0], np.ndarray)):
        return from_adjacency(obj[0], obj[1], obj[2] if len(obj) == 3 else None, name=name, weighted=weighted)
    raise DataFileError(f"as_graph: a {type(obj).__name__}; valid: GraphData, GraphCollection, a PyG Data (or a list "
                        "of Data), a networkx graph, a scipy sparse or numpy adjacency, (adj, x[, y]), or a path")


def _is_pyg(obj) -> bool:
    try:
        Data, _ = _pyg_classes()
    except ImportError:  # pragma: no cover - torch_geometric is a dependency
        return False
    return isinstance(obj, Data) or (isinstance(obj, list) and bool(obj) and all(isinstance(d, Data) for d in obj))


__all__ = ["FORMAT_HELP", "as_graph", "dataset_name", "from_adjacency", "graph_kind", "read_graph", "write_npz"]
