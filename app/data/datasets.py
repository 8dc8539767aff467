"""Dataset loaders: every dataset as :class:`GraphData` or :class:`GraphCollection`.

Embedded (no files): ``karate`` (PyG KarateClub), ``sbm`` (seeded synthetic
attributed SBM), ``iris`` and ``digits`` (scikit-learn), ``circles``
(scikit-learn ``make_circles``).

From a data root (see :func:`resolve_data_root`), laid out as in
``shared/datasets/README.md``: Planetoid ``cora``/``citeseer``/``pubmed``,
TUDataset ``mutag``/``proteins``/``imdb-binary``, SNAP ``email-eu-core`` (with
department labels) and ``ego-facebook``, and the AGC ``wiki`` graph.

Nothing here downloads. Before a PyG loader runs, its raw files are checked
and copied into a cache directory (``FEDGRAPH_CACHE`` or
``~/.cache/fedgraph``), so PyG writes its ``processed/`` folder there and the
data root stays read-only. A missing file raises :class:`DatasetNotFound`
(a :class:`~app.config.ConfigError`) with one line naming the dataset, the
expected path and layout, and where to obtain it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
from functools import partial
from pathlib import Path
from typing import Callable

import numpy as np
import scipy.sparse as sp

from app.config import ConfigError

from .sbm import generate_sbm
from .types import GraphCollection, GraphData

DATASETS: tuple[str, ...] = (
    "karate",
    "sbm",
    "iris",
    "digits",
    "circles",
    "cora",
    "citeseer",
    "pubmed",
    "wiki",
    "mutag",
    "proteins",
    "imdb-binary",
    "email-eu-core",
    "ego-facebook",
)

#: Datasets that need files under the data root.
FILE_DATASETS = ("cora", "citeseer", "pubmed", "wiki", "mutag", "proteins", "imdb-binary",
                 "email-eu-core", "ego-facebook")
#: Datasets loaded as a GraphCollection.
COLLECTIONS = ("mutag", "proteins", "imdb-binary")
#: Point clouds: datasets without edges.
EDGELESS = ("iris", "digits", "circles")
#: Datasets without node features (``sbm`` too with ``sbm.features = 0``).
FEATURELESS = ("email-eu-core", "ego-facebook", "imdb-binary")
#: The partitioners that split a graph collection (every other one splits one graph).
COLLECTION_PARTITIONERS = ("graph-dirichlet",)

#: Keyword parameters each dataset accepts (beyond data_root and seed).
DATASET_PARAMS: dict[str, tuple[str, ...]] = {
    "sbm": ("nodes", "blocks", "p_in", "p_out", "features", "signal"),
    "circles": ("samples", "noise", "factor"),
}

ENV_DATA_ROOT = "FEDGRAPH_DATA_ROOT"
ENV_CACHE = "FEDGRAPH_CACHE"
REPO_ROOT = Path(__file__).resolve().parents[2]


class DatasetNotFound(ConfigError):
    """A dataset's files are missing under the data root (one-line message)."""


# --------------------------------------------------------------------------- helpers


def resolve_data_root(data_root: str | os.PathLike | None = None) -> Path | None:
    """Argument (if non-empty), else ``$FEDGRAPH_DATA_ROOT``, else ``<repo>/../shared/datasets`` if it exists."""
    if data_root not in (None, ""):
        return Path(data_root).expanduser().resolve()
    env = os.environ.get(ENV_DATA_ROOT, "")
    if env:
        return Path(env).expanduser().resolve()
    default = (REPO_ROOT / ".." / "shared" / "datasets").resolve()
    return default if default.is_dir() else None


def cache_root() -> Path:
    """Writable cache for PyG ``processed/`` files (``$FEDGRAPH_CACHE`` or ``~/.cache/fedgraph``)."""
    env = os.environ.get(ENV_CACHE, "")
    path = Path(env).expanduser() if env else Path.home() / ".cache" / "fedgraph"
    try:
        path.mkdir(parents=True, exist_ok=True)
        if os.access(path, os.W_OK):
            return path
    except OSError:
        pass
    if env:
        raise ConfigError(f"cache directory {path} (${ENV_CACHE}) is not writable")
    return Path(tempfile.gettempdir()) / f"fedgraph-cache-{os.getuid()}"


def symmetric_adjacency(rows: np.ndarray, cols: np.ndarray, n: int) -> sp.csr_matrix:
    """Undirected 0/1 CSR adjacency from an edge list: symmetrised, self-loops
    dropped, duplicate edges collapsed to weight 1, float64, sorted indices."""
    rows = np.asarray(rows).ravel()
    cols = np.asarray(cols).ravel()
    keep = rows != cols
    rows, cols = rows[keep], cols[keep]
    r = np.concatenate([rows, cols])
    c = np.concatenate([cols, rows])
    adj = sp.csr_matrix((np.ones(r.size, dtype=np.float64), (r, c)), shape=(n, n))
    adj.sum_duplicates()
    adj.data[:] = 1.0
    adj.sort_indices()
    return adj


def _binarise(adj: sp.spmatrix) -> sp.csr_matrix:
    coo = sp.coo_matrix(adj)
    nz = coo.data != 0
    return symmetric_adjacency(coo.row[nz], coo.col[nz], adj.shape[0])


def empty_adjacency(n: int) -> sp.csr_matrix:
    return sp.csr_matrix((n, n), dtype=np.float64)


def _missing(name: str, path: Path, layout: str, how: str) -> DatasetNotFound:
    return DatasetNotFound(
        f"dataset '{name}': missing {path}; expected layout {layout}; {how}"
    )


def _need_root(name: str, data_root) -> Path:
    root = resolve_data_root(data_root)
    if root is None:
        raise DatasetNotFound(
            f"dataset '{name}' needs a data root: set run-config 'data-root' or "
            f"${ENV_DATA_ROOT} to the datasets folder (see shared/datasets/README.md)"
        )
    return root


def _check_files(name: str, base: Path, files: list[str], layout: str, how: str) -> None:
    for f in files:
        p = base / f
        if not p.is_file():
            raise _missing(name, p, layout, how)


def _inconsistent(name: str, what: str, valid: str) -> ConfigError:
    """Files that parse but disagree with each other (counts, node ids): one line naming them."""
    return ConfigError(f"dataset '{name}': {what}; valid: {valid}")


def _check_node_ids(name: str, ids: np.ndarray, n: int, source: str, nodes: str, first: int = 0) -> None:
    """Every node id in ``ids`` (read from ``source``) is one of the ``n`` nodes ``nodes`` defines, numbered
    from ``first``; the parsers would otherwise drop, wrap or index past such an id without a word."""
    bad = (ids < first) | (ids >= n + first)
    if bad.any():
        raise _inconsistent(name, f"{source} refers to node {ids[bad][0]}", f"nodes {first}..{n - 1 + first} ({nodes})")


@contextlib.contextmanager
def _file_lock(path: Path):
    """Exclusive inter-process lock (several simulated clients may load at once)."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _cached_copy(src_dir: Path, rel: str) -> Path:
    """Copy ``src_dir`` (a dataset folder with ``raw/``) into the cache, return the
    cache root to hand to the PyG loader. The copy is keyed by the source path
    and refreshed when raw file sizes or mtimes change; it is made in a temp dir
    and renamed into place, under a lock."""
    key = hashlib.sha1(str(src_dir.resolve()).encode()).hexdigest()[:12]
    base = cache_root() / key
    dst = base / rel
    stamp = ";".join(
        f"{p.relative_to(src_dir)}:{p.stat().st_size}:{int(p.stat().st_mtime)}"
        for p in sorted(src_dir.rglob("*"))
        if p.is_file() and "processed" not in p.relative_to(src_dir).parts
    )
    stamp_file = dst / ".source-stamp"
    if stamp_file.is_file() and stamp_file.read_text() == stamp:
        return dst
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".copy-", dir=dst.parent))
    try:
        shutil.copytree(src_dir / "raw", tmp / "raw") if (src_dir / "raw").is_dir() else None
        (tmp / ".source-stamp").write_text(stamp)
        if dst.exists():
            shutil.rmtree(dst)
        os.replace(tmp, dst)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return dst


def _pyg_load(src_dir: Path, rel: str, make: Callable[[Path], object]):
    """Copy to cache and run a PyG dataset constructor on the cache copy, locked."""
    import warnings

    lock = cache_root() / ".lock"
    with _file_lock(lock):
        dst = _cached_copy(src_dir, rel)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*not writable.*", category=UserWarning)
            return make(dst)


def _np(t) -> np.ndarray:
    return t.detach().cpu().numpy()


# --------------------------------------------------------------------------- embedded


def load_karate(**_: object) -> GraphData:
    """Zachary's karate club from PyG (34 nodes, 4 community labels, one-hot x).
    ``meta['club']`` holds the classic 2-faction split (networkx)."""
    from torch_geometric.datasets import KarateClub
    import networkx as nx

    d = KarateClub()[0]
    ei = _np(d.edge_index)
    n = int(d.num_nodes)
    g = nx.karate_club_graph()
    club = [0 if g.nodes[i]["club"] == "Mr. Hi" else 1 for i in range(n)]
    return GraphData(
        name="karate",
        adj=symmetric_adjacency(ei[0], ei[1], n),
        x=_np(d.x).astype(np.float64),
        y=_np(d.y).astype(np.int64),
        meta={"source": "torch_geometric.datasets.KarateClub", "club": club},
    )


def load_iris(**_: object) -> GraphData:
    from sklearn.datasets import load_iris as _load

    b = _load()
    n = b.data.shape[0]
    return GraphData("iris", empty_adjacency(n), np.asarray(b.data, dtype=np.float64),
                     np.asarray(b.target, dtype=np.int64), {"source": "sklearn.datasets.load_iris"})


def load_digits(**_: object) -> GraphData:
    from sklearn.datasets import load_digits as _load

    b = _load()
    n = b.data.shape[0]
    return GraphData("digits", empty_adjacency(n), np.asarray(b.data, dtype=np.float64),
                     np.asarray(b.target, dtype=np.int64), {"source": "sklearn.datasets.load_digits"})


def load_circles(samples: int = 1000, noise: float = 0.05, factor: float = 0.5, seed: int = 0,
                 **_: object) -> GraphData:
    """Two concentric circles (scikit-learn ``make_circles``), seeded."""
    from sklearn.datasets import make_circles

    if samples < 2:
        raise ConfigError(f"invalid value {samples!r} for 'circles.samples'; need >= 2")
    if not 0.0 <= factor < 1.0:
        raise ConfigError(f"invalid value {factor!r} for 'circles.factor'; valid range: [0, 1)")
    x, y = make_circles(n_samples=samples, noise=noise, factor=factor, random_state=seed)
    meta = {"source": "sklearn.datasets.make_circles", "noise": noise, "factor": factor, "seed": seed}
    return GraphData("circles", empty_adjacency(samples), x.astype(np.float64), y.astype(np.int64), meta)


# --------------------------------------------------------------------------- from files

_PLANETOID = {"cora": "Cora", "citeseer": "CiteSeer", "pubmed": "PubMed"}
_PLANETOID_SUFFIX = ["x", "tx", "allx", "y", "ty", "ally", "graph", "test.index"]


def load_planetoid(name: str, data_root=None, **_: object) -> GraphData:
    """Planetoid citation graph; x is the raw 0/1 bag-of-words as CSR, y the class."""
    from_name = _PLANETOID[name]
    root = _need_root(name, data_root)
    src = root / "planetoid" / from_name
    files = [f"raw/ind.{name}.{s}" for s in _PLANETOID_SUFFIX]
    _check_files(
        name, src, files,
        f"<data-root>/planetoid/{from_name}/raw/ind.{name}.{{{','.join(_PLANETOID_SUFFIX)}}}",
        "obtain from github.com/kimiyoung/planetoid (data/ind.*), the files PyG Planetoid downloads",
    )

    def make(dst: Path):
        from torch_geometric.datasets import Planetoid

        return Planetoid(root=str(dst.parent), name=from_name)[0]

    d = _pyg_load(src, f"planetoid/{from_name}", make)
    n = int(d.num_nodes)
    ei = _np(d.edge_index)
    # PyG stacks the feature and label files separately and never compares their lengths
    if len(d.y) != n:
        raise _inconsistent(name, f"ind.{name}.{{allx,tx}} under {src / 'raw'} hold {n} feature rows but "
                                  f"ind.{name}.{{ally,ty}} {len(d.y)} label rows", "one of each per node")
    _check_node_ids(name, ei, n, str(src / "raw" / f"ind.{name}.graph"), "the feature rows")
    x = sp.csr_matrix(_np(d.x).astype(np.float64))
    return GraphData(
        name=name,
        adj=symmetric_adjacency(ei[0], ei[1], n),
        x=x,
        y=_np(d.y).astype(np.int64),
        meta={"source": str(src), "loader": "torch_geometric.datasets.Planetoid"},
    )


_TU = {"mutag": "MUTAG", "proteins": "PROTEINS", "imdb-binary": "IMDB-BINARY"}


def load_tudataset(name: str, data_root=None, **_: object) -> GraphCollection:
    """TUDataset graph collection; per-graph x = PyG node features (one-hot node
    labels for MUTAG/PROTEINS; None for IMDB-BINARY), y = graph labels 0..C-1."""
    tu = _TU[name]
    root = _need_root(name, data_root)
    src = root / "tudataset" / tu
    files = [f"raw/{tu}_A.txt", f"raw/{tu}_graph_indicator.txt", f"raw/{tu}_graph_labels.txt"]
    _check_files(
        name, src, files,
        f"<data-root>/tudataset/{tu}/raw/{tu}_{{A,graph_indicator,graph_labels,...}}.txt",
        f"obtain {tu}.zip from the TU Dortmund graph kernel benchmark collection and extract it into raw/",
    )

    _check_tu_files(name, src / "raw", tu)

    def make(dst: Path):
        from torch_geometric.datasets import TUDataset

        return TUDataset(root=str(dst.parent), name=tu)

    ds = _pyg_load(src, f"tudataset/{tu}", make)
    data, slices = ds._data, ds.slices
    ei_all = _np(data.edge_index)
    x_all = _np(data.x).astype(np.float64) if data.x is not None else None
    ys = _np(data.y).astype(np.int64).ravel()
    node_ptr = _np(slices["x"]) if "x" in slices else None
    e_ptr = _np(slices["edge_index"])
    if node_ptr is None:
        # No node features (IMDB-BINARY): node counts from num_nodes.
        counts = np.array([int(ds[i].num_nodes) for i in range(len(ds))], dtype=np.int64)
        node_ptr = np.concatenate([[0], np.cumsum(counts)])
    graphs = []
    for i in range(len(ds)):
        n = int(node_ptr[i + 1] - node_ptr[i])
        ei = ei_all[:, e_ptr[i]: e_ptr[i + 1]]
        x = None if x_all is None else x_all[node_ptr[i]: node_ptr[i + 1]]
        graphs.append(GraphData(f"{name}/{i}", symmetric_adjacency(ei[0], ei[1], n), x, None,
                                {"index": i}))
    return GraphCollection(name=name, graphs=graphs, y=ys,
                           meta={"source": str(src), "loader": "torch_geometric.datasets.TUDataset"})


def _tu_ints(path: Path) -> np.ndarray:
    """A TU text file as PyG's reader takes it (its newline-terminated lines, comma-separated ints), 2-D."""
    rows = path.read_text().split("\n")[:-1]
    return np.loadtxt(rows, dtype=np.int64, delimiter=",", ndmin=2) if rows else np.zeros((0, 1), np.int64)


def _tu_graph_ids(name: str, indicator: Path) -> np.ndarray:
    """Each node's graph id (1-based) from ``*_graph_indicator.txt``. PyG slices the graphs by counting
    nodes per id, so the ids must run 1, 2, ... in order, every graph with a node."""
    graph_of = _tu_ints(indicator).ravel()
    jumps = np.flatnonzero(~np.isin(np.diff(graph_of, prepend=0), (0, 1)))
    if jumps.size or not graph_of.size:
        where = f"line {jumps[0] + 1} has graph id {graph_of[jumps[0]]}" if jumps.size else "is empty"
        raise _inconsistent(name, f"{indicator} {where}", "graph ids 1, 2, ... in order, one line per node")
    return graph_of


def _tu_edges(name: str, adjacency: Path, graph_of: np.ndarray) -> np.ndarray:
    """The (1-based) edges of ``*_A.txt``, each between two nodes of one graph."""
    edges = _tu_ints(adjacency)
    if edges.size and edges.shape[1] != 2:
        raise _inconsistent(name, f"{adjacency} has {edges.shape[1]} columns", "2 (one 'i, j' edge a line)")
    _check_node_ids(name, edges, graph_of.size, str(adjacency), "the lines of the graph indicator", first=1)
    across = np.flatnonzero(graph_of[edges[:, 0] - 1] != graph_of[edges[:, -1] - 1])
    if across.size:
        i, j = edges[across[0]]
        raise _inconsistent(name, f"{adjacency} line {across[0] + 1} joins node {i} of graph {graph_of[i - 1]} "
                                  f"to node {j} of graph {graph_of[j - 1]}", "edges within one graph")
    return edges


def _check_tu_files(name: str, raw: Path, tu: str) -> None:
    """The TU files agree with each other, checked before PyG reads them: PyG pairs whatever counts it
    finds, so a labels file cut short loads and fails only where a benchmark compares the labels."""
    indicator, adjacency = raw / f"{tu}_graph_indicator.txt", raw / f"{tu}_A.txt"
    graph_of = _tu_graph_ids(name, indicator)
    edges = _tu_edges(name, adjacency, graph_of)
    counts = {"graph": (int(graph_of[-1]), f"{indicator.name} numbers {graph_of[-1]} graphs"),
              "node": (graph_of.size, f"{indicator.name} has {graph_of.size} nodes"),
              "edge": (len(edges), f"{adjacency.name} has {len(edges)} edges")}
    for unit, part in (("graph", "labels"), ("graph", "attributes"), ("node", "labels"), ("node", "attributes"),
                       ("edge", "labels"), ("edge", "attributes")):
        path = raw / f"{tu}_{unit}_{part}.txt"
        count, source = counts[unit]
        if path.is_file() and (lines := path.read_text().count("\n")) != count:  # PyG's records: the lines
            raise _inconsistent(name, f"{path} has {lines} lines but {source}", f"one line per {unit}")


def load_email_eu_core(data_root=None, **_: object) -> GraphData:
    """SNAP email-Eu-core (PyG EmailEUCore): directed e-mails symmetrised,
    self-loops dropped; y = one of 42 departments; no features."""
    name = "email-eu-core"
    root = _need_root(name, data_root)
    src = root / "snap" / "email-Eu-core"
    _check_files(
        name, src, ["raw/email-Eu-core.txt", "raw/email-Eu-core-department-labels.txt"],
        "<data-root>/snap/email-Eu-core/raw/{email-Eu-core.txt,email-Eu-core-department-labels.txt}",
        "obtain both files from the SNAP dataset page 'email-Eu-core' (gunzip, space-separated)",
    )

    def make(dst: Path):
        from torch_geometric.datasets import EmailEUCore

        return EmailEUCore(root=str(dst))[0]

    labels = src / "raw" / "email-Eu-core-department-labels.txt"
    # PyG takes line i of the labels file as node i's label, whatever node the line names
    ids = np.loadtxt(labels, dtype=np.int64, ndmin=2)[:, 0]
    off = np.flatnonzero(ids != np.arange(ids.size))
    if off.size:
        raise _inconsistent(name, f"{labels} line {off[0] + 1} names node {ids[off[0]]}",
                            "nodes 0, 1, ... in order, one line each")
    d = _pyg_load(src, "snap/email-Eu-core", make)
    n = int(d.num_nodes)
    ei = _np(d.edge_index)
    _check_node_ids(name, ei, n, str(src / "raw" / "email-Eu-core.txt"), f"the lines of {labels.name}")
    return GraphData(name, symmetric_adjacency(ei[0], ei[1], n), None,
                     _np(d.y).astype(np.int64),
                     {"source": str(src), "loader": "torch_geometric.datasets.EmailEUCore"})


def load_ego_facebook(data_root=None, **_: object) -> GraphData:
    """SNAP ego-Facebook combined graph (4039 nodes); no features or labels."""
    name = "ego-facebook"
    root = _need_root(name, data_root)
    path = root / "snap" / "ego-Facebook" / "facebook_combined.txt"
    if not path.is_file():
        raise _missing(name, path, "<data-root>/snap/ego-Facebook/facebook_combined.txt (one 'u v' edge a line)",
                       "obtain facebook_combined.txt.gz from the SNAP dataset page 'ego-Facebook' and gunzip it")
    e = np.loadtxt(path, dtype=np.int64, comments="#", ndmin=2)
    n = int(e.max()) + 1 if e.size else 0
    _check_node_ids(name, e, n, str(path), "ids >= 0")
    return GraphData(name, symmetric_adjacency(e[:, 0], e[:, 1], n), None, None, {"source": str(path)})


def load_wiki(data_root=None, **_: object) -> GraphData:
    """AGC Wiki (2405 nodes, 4973 TF-IDF features as CSR, 17 classes, labels 0..16);
    the weighted W is binarised, symmetrised and stripped of its diagonal."""
    import scipy.io as sio

    name = "wiki"
    root = _need_root(name, data_root)
    path = root / "agc" / "wiki.mat"
    if not path.is_file():
        raise _missing(name, path, "<data-root>/agc/wiki.mat (MATLAB file with W, fea, gnd)",
                       "obtain wiki.mat from github.com/karenlatong/AGC-master")
    m = sio.loadmat(str(path))
    w, rows, labels = m["W"].shape, m["fea"].shape[0], np.asarray(m["gnd"]).size
    if w != (rows, rows) or labels != rows:
        raise _inconsistent(name, f"{path} holds a {w[0]}x{w[1]} W, {rows} fea rows and {labels} gnd entries",
                            "a square W with one fea row and one gnd entry per node")
    adj = _binarise(m["W"])
    x = sp.csr_matrix(m["fea"], dtype=np.float64)
    x.sort_indices()
    y = np.asarray(m["gnd"]).ravel().astype(np.int64) - 1
    return GraphData(name, adj, x, y, {"source": str(path)})


# --------------------------------------------------------------------------- entry point


def load_dataset(name: str, data_root=None, seed: int = 0, **params) -> GraphData | GraphCollection:
    """Load dataset ``name`` (one of :data:`DATASETS`).

    ``params`` are the dataset's own parameters (:data:`DATASET_PARAMS`, e.g.
    ``nodes=...`` for ``sbm``); unknown ones raise ConfigError. ``seed`` only
    affects synthetic datasets (sbm, circles).
    """
    if name not in DATASETS:
        raise ConfigError(f"unknown dataset {name!r}; valid choices: " + ", ".join(DATASETS))
    allowed = DATASET_PARAMS.get(name, ())
    bad = sorted(set(params) - set(allowed))
    if bad:
        raise ConfigError(
            f"unknown parameter {bad[0]!r} for dataset '{name}'; valid parameters: "
            + (", ".join(allowed) if allowed else "none")
        )
    if name == "sbm":
        return generate_sbm(seed=seed, **params)
    if name == "circles":
        return load_circles(seed=seed, **params)
    if name == "karate":
        return load_karate()
    if name == "iris":
        return load_iris()
    if name == "digits":
        return load_digits()
    return _load_files(name, data_root)


def _load_files(name: str, data_root) -> GraphData | GraphCollection:
    """A dataset read from the data root; files that are there but cannot be parsed
    (truncated, corrupt, another format) stop with one line naming the dataset."""
    if name in _PLANETOID:
        load = partial(load_planetoid, name)
    elif name in _TU:
        load = partial(load_tudataset, name)
    else:
        load = {"email-eu-core": load_email_eu_core, "ego-facebook": load_ego_facebook, "wiki": load_wiki}[name]
    try:
        return load(data_root=data_root)
    except ConfigError:
        raise
    except Exception as err:  # the parsers raise anything from EOFError to IndexError on a bad file
        detail = (str(err).strip().splitlines() or [""])[0]
        raise ConfigError(f"dataset '{name}': its files under {_need_root(name, data_root)} could not be read "
                          f"({type(err).__name__}: {detail}); valid: the layout in shared/datasets/README.md") from None
