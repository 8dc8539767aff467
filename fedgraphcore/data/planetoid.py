"""Planetoid citation graphs (``ind.<name>.{x,tx,allx,y,ty,ally,graph,test.index}``), read without
running code from the files.

The files are Python pickles. :class:`RestrictedUnpickler` builds only what they
hold (numpy arrays and dtypes, a scipy CSR matrix's arrays, lists, dicts,
``defaultdict(list)``) and refuses every other global with one line, so a
crafted file cannot call anything. The arrays are then put together as PyG's
``Planetoid`` does (``torch_geometric.io.planetoid.read_planetoid_data``): the
test rows moved to their ``test.index`` positions, citeseer's missing test
nodes as zero rows, labels the argmax of the one-hot rows, self-loops dropped.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from .assemble import DataFileError, Source, assemble, describe
from .types import GraphData

PARTS = ("x", "tx", "allx", "y", "ty", "ally", "graph", "test.index")


class _PickledCSR:
    """Stands in for ``scipy.sparse.csr_matrix`` while unpickling: keeps the state, runs nothing."""

    def __setstate__(self, state):
        self.state = state


def _numpy_reconstruct():
    try:
        from numpy._core.multiarray import _reconstruct
    except ImportError:  # numpy < 2
        from numpy.core.multiarray import _reconstruct
    return _reconstruct


def _frombuffer(buffer, dtype, shape, order):
    """numpy's own ``_frombuffer`` (protocol-5 pickles of arrays), written here: a read-only view."""
    return np.frombuffer(buffer, dtype=dtype).reshape(shape, order=order)


_NUMPY_CORE = ("numpy.core.multiarray", "numpy._core.multiarray")
_ALLOWED = {
    **{(module, "_reconstruct"): _numpy_reconstruct for module in _NUMPY_CORE},
    **{(module, "_frombuffer"): lambda: _frombuffer for module in ("numpy.core.numeric", "numpy._core.numeric")},
    ("numpy", "ndarray"): lambda: np.ndarray,
    ("numpy", "dtype"): lambda: np.dtype,
    **{(module, "csr_matrix"): lambda: _PickledCSR for module in ("scipy.sparse.csr", "scipy.sparse._csr",
                                                                   "scipy.sparse")},
    ("collections", "defaultdict"): lambda: __import__("collections").defaultdict,
    ("_codecs", "encode"): lambda: __import__("codecs").encode,  # bytes as Python 3 writes them in protocols 2-3
    ("__builtin__", "list"): lambda: list,
    ("builtins", "list"): lambda: list,
}


class RestrictedUnpickler(pickle.Unpickler):
    """An unpickler that knows only the globals of Planetoid files (see :data:`_ALLOWED`)."""

    def find_class(self, module: str, name: str):
        make = _ALLOWED.get((module, name))
        if make is None:
            raise pickle.UnpicklingError(f"global '{module}.{name}' is not allowed")
        return make()


def load_pickle(path: Path):
    """The object pickled in ``path``, built by :class:`RestrictedUnpickler`; anything else (a refused
    global, a truncated file) is one line naming the file."""
    try:
        return RestrictedUnpickler(io.BytesIO(path.read_bytes()), encoding="latin1").load()
    except Exception as err:  # the unpickler raises anything from UnpicklingError to ValueError on bad bytes
        raise DataFileError(f"{path}: not a Planetoid pickle ({describe(err)}); valid: the files "
                            "of github.com/kimiyoung/planetoid (numpy arrays, a scipy CSR matrix, a dict of "
                            "lists)") from None


def _matrix(path: Path, obj) -> np.ndarray | sp.csr_matrix:
    """A feature or label part as a 2-D float32 array or CSR matrix (PyG's float32, exact for 0/1)."""
    if isinstance(obj, _PickledCSR):
        state = obj.state if isinstance(obj.state, dict) else {}
        try:
            m = sp.csr_matrix((state["data"], state["indices"], state["indptr"]),
                              shape=tuple(int(s) for s in state.get("_shape", state.get("shape"))))
            m.check_format(full_check=True)
        except Exception as err:
            raise DataFileError(f"{path}: a CSR matrix that does not hold together ({type(err).__name__}: "
                                f"{err}); valid: the Planetoid feature matrix") from None
        m.sum_duplicates()
        return sp.csr_matrix(m, dtype=np.float32)
    if isinstance(obj, np.ndarray) and obj.ndim == 2 and obj.dtype.kind in "biuf":
        return obj.astype(np.float32)
    raise DataFileError(f"{path}: holds a {type(obj).__name__}; valid: a 2-D numeric array or CSR matrix")


def _edges(path: Path, graph) -> tuple[np.ndarray, np.ndarray]:
    """The ``graph`` part (node -> list of neighbours) as two arrays, in the dict's order."""
    if not isinstance(graph, dict) or not all(isinstance(v, list) for v in graph.values()):
        raise DataFileError(f"{path}: holds a {type(graph).__name__}; valid: a dict of neighbour lists")
    try:
        rows = np.repeat(np.asarray(list(graph.keys()), dtype=np.int64), [len(v) for v in graph.values()])
        cols = np.asarray([c for v in graph.values() for c in v], dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        raise DataFileError(f"{path}: a node that is not an integer; valid: integer node ids") from None
    return rows, cols


def read_planetoid(raw: Path, prefix: str, name: str) -> GraphData:
    """The Planetoid graph in ``raw/ind.<prefix>.*``: x as CSR float64, y the class of each node."""
    files = {part: raw / f"ind.{prefix}.{part}" for part in PARTS}
    parts = {part: load_pickle(path) for part, path in files.items() if part != "test.index"}
    try:
        test_index = np.loadtxt(files["test.index"], dtype=np.int64, ndmin=1)
    except ValueError as err:
        raise DataFileError(f"{files['test.index']}: {err}; valid: one integer a line") from None
    tx, allx = _matrix(files["tx"], parts["tx"]), _matrix(files["allx"], parts["allx"])
    ty, ally = _matrix(files["ty"], parts["ty"]), _matrix(files["ally"], parts["ally"])
    sorted_test = np.sort(test_index)
    if test_index.size and (test_index.min() < 0 or tx.shape[0] != len(test_index) or ty.shape[0] != len(test_index)):
        raise DataFileError(f"{files['test.index']}: {len(test_index)} test nodes for {tx.shape[0]} rows of tx "
                            f"and {ty.shape[0]} of ty; valid: one test index per tx and ty row, >= 0")
    if test_index.size and test_index.max() - test_index.min() + 1 > len(test_index):
        # test nodes missing from tx/ty (citeseer's isolated nodes): zero rows in their places
        tx, ty = _spread(tx, sorted_test - test_index.min()), _spread(ty, sorted_test - test_index.min())
    if allx.shape[1] != tx.shape[1] or ally.shape[1] != ty.shape[1]:
        raise DataFileError(f"ind.{prefix}.{{allx,tx}} under {raw} have {allx.shape[1]} and {tx.shape[1]} columns, "
                            f"ind.{prefix}.{{ally,ty}} {ally.shape[1]} and {ty.shape[1]}; valid: one width per pair")
    x = sp.vstack([sp.csr_matrix(allx), sp.csr_matrix(tx)], format="csr")
    labels = np.vstack([_dense(ally), _dense(ty)])
    n = x.shape[0]
    if labels.shape[0] != n:
        raise DataFileError(f"ind.{prefix}.{{allx,tx}} under {raw} hold {n} feature rows but ind.{prefix}.{{ally,ty}} "
                            f"{labels.shape[0]} label rows; valid: one of each per node")
    if test_index.size and sorted_test.max() >= n:
        raise DataFileError(f"{files['test.index']} refers to node {sorted_test.max()}; valid: nodes 0..{n - 1}")
    perm = np.arange(n)
    perm[test_index] = sorted_test
    x = x[perm]
    x.sum_duplicates()
    x.eliminate_zeros()
    y = labels.argmax(axis=1)[perm].astype(np.int64)
    rows, cols = _edges(files["graph"], parts["graph"])
    bad = np.flatnonzero((rows < 0) | (rows >= n) | (cols < 0) | (cols >= n))
    if bad.size:
        node = rows[bad[0]] if not 0 <= rows[bad[0]] < n else cols[bad[0]]
        raise DataFileError(f"{files['graph']} refers to node {node}; valid: nodes 0..{n - 1} (the feature rows)")
    source = Source(str(files["graph"]), edge=lambda i: f"edge {i}")
    return assemble(name, n, rows, cols, source, x=sp.csr_matrix(x, dtype=np.float64), labels=y,
                    labels_what=f"the classes of ind.{prefix}.{{ally,ty}}",
                    meta={"source": str(raw), "format": "planetoid"})


def _dense(m) -> np.ndarray:
    return m.toarray() if sp.issparse(m) else np.asarray(m)


def _spread(m, at: np.ndarray):
    """``m``'s rows placed at rows ``at`` of a zero matrix ``at.max() + 1`` rows tall."""
    if sp.issparse(m):
        return sp.csr_matrix((np.ones(len(at), np.float32), (at, np.arange(len(at)))),
                             shape=(int(at.max()) + 1, m.shape[0])) @ m
    out = np.zeros((int(at.max()) + 1, m.shape[1]), dtype=m.dtype)
    out[at] = m
    return out


def find_planetoid(directory: Path) -> tuple[Path, str] | None:
    """``(raw folder, prefix)`` of the Planetoid files in ``directory`` (or its ``raw/``), else None."""
    for raw in (directory, directory / "raw"):
        found = sorted(raw.glob("ind.*.graph"))
        if found:
            return raw, found[0].name[len("ind."):-len(".graph")]
    return None
