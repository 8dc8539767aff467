"""Datasets: the built-in ones by name, a user's own by path; each a :class:`GraphData` or
:class:`GraphCollection`.

Embedded (no files): ``karate`` (PyG KarateClub), ``sbm`` (seeded synthetic
attributed SBM), ``iris`` and ``digits`` (scikit-learn), ``circles``
(scikit-learn ``make_circles``).

From files (:func:`dataset_root`): the data root (:func:`resolve_data_root`) when it holds
the dataset, else the user cache, into which they are downloaded on first use and checked
against their SHA-256 (:mod:`fedgraphcore.data.fetch`; pubmed is never downloaded, its checksums are not
recorded). Both are laid out alike (``planetoid/Cora/raw/ind.cora.x``, ``tudataset/MUTAG/raw/``,
``snap/email-Eu-core/raw/``, ``snap/ego-Facebook/``, ``agc/wiki.mat``). Each is read by the reader
of its file format (:mod:`fedgraphcore.data.formats`, the same readers as a user's files): Planetoid
``cora``/``citeseer``/``pubmed`` (restricted unpickler), TU ``mutag``/``proteins``/
``imdb-binary`` (TU text files), SNAP ``email-eu-core`` (edge list + node table of
department labels) and ``ego-facebook`` (edge list), and the AGC ``wiki`` graph
(``.mat``, binarised). A data root holding part of a dataset raises :class:`DatasetNotFound`
(a :class:`~fedgraphcore.config.ConfigError`) with one line naming the dataset, the missing path, the
layout and where to obtain it; a failed download raises :class:`~fedgraphcore.data.fetch.FetchError`.

Any other ``dataset`` value is a path, read by :func:`fedgraphcore.data.formats.read_graph`
with the options of :data:`PATH_PARAMS`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from fedgraphcore.config import ConfigError

from . import fetch
from .assemble import DataFileError, one_line, show
from .fetch import ENV_DATA_ROOT
from .formats import FORMAT_HELP, dataset_name, graph_kind, read_graph, read_mat
from .planetoid import PARTS as PLANETOID_PARTS, read_planetoid
from .sbm import generate_sbm
from .tu import read_tu
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
#: The partitioners that split a graph collection (every other one splits one graph).
COLLECTION_PARTITIONERS = ("graph-dirichlet",)

#: Keyword parameters each dataset accepts (beyond data_root and seed).
DATASET_PARAMS: dict[str, tuple[str, ...]] = {
    "sbm": ("nodes", "blocks", "p_in", "p_out", "features", "signal"),
    "circles": ("samples", "noise", "factor"),
}
#: Keyword parameters of a dataset given by path (:func:`fedgraphcore.data.formats.read_graph`'s options).
PATH_PARAMS = ("node_table", "label_column", "weighted")

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class DataProfile:
    """What the data holds, as the strategies' checks see it (:meth:`ClusteringStrategy.check_data`)."""

    collection: bool
    edges: bool
    features: bool
    labels: bool
    weighted: bool

    @classmethod
    def of(cls, data: GraphData | GraphCollection) -> "DataProfile":
        if isinstance(data, GraphCollection):
            return cls(True, any(g.adj.nnz for g in data.graphs), any(g.x is not None for g in data.graphs), True,
                       data.weighted)
        return cls(False, bool(data.adj.nnz), data.x is not None, data.y is not None and data.num_classes > 0,
                   data.weighted)


_GRAPH = DataProfile(collection=False, edges=True, features=True, labels=True, weighted=False)
_POINTS = DataProfile(collection=False, edges=False, features=True, labels=True, weighted=False)
_COLLECTION = DataProfile(collection=True, edges=True, features=True, labels=True, weighted=False)
#: The built-ins' profiles, known without loading them (a test checks them against the loaded data);
#: sbm's features follow ``sbm.features`` (:func:`builtin_profile`).
BUILTIN_PROFILES: dict[str, DataProfile] = {
    **{name: _GRAPH for name in ("karate", "sbm", "cora", "citeseer", "pubmed", "wiki")},
    **{name: _POINTS for name in ("iris", "digits", "circles")},
    "mutag": _COLLECTION,
    "proteins": _COLLECTION,
    "imdb-binary": DataProfile(collection=True, edges=True, features=False, labels=True, weighted=False),
    "email-eu-core": DataProfile(collection=False, edges=True, features=False, labels=True, weighted=False),
    "ego-facebook": DataProfile(collection=False, edges=True, features=False, labels=False, weighted=False),
}


def builtin_profile(name: str, sbm_features: int = 16) -> DataProfile:
    """The profile of built-in dataset ``name`` (sbm with ``sbm_features`` feature columns)."""
    profile = BUILTIN_PROFILES[name]
    if name == "sbm" and not sbm_features:
        return DataProfile(False, True, False, True, False)
    return profile


def is_builtin(dataset: str) -> bool:
    return dataset in DATASETS


def dataset_label(dataset: str, disk: bool = True) -> str:
    """The name data loaded from ``dataset`` carries: a built-in's name, a path's file name without
    its format suffix (:func:`fedgraphcore.data.formats.dataset_name`; ``disk`` False: from its spelling)."""
    return dataset if is_builtin(dataset) else dataset_name(dataset, disk)


def check_dataset_value(dataset: str) -> None:
    """``dataset`` is a built-in name or a path: of a file or directory in a known format where it
    exists. A path that does not exist here is let through (a deployed SuperNode reads its own files,
    not the one the run-config names; where it is read, :func:`fedgraphcore.data.formats.read_graph` names it
    as missing); anything else is a one-line ConfigError naming it, the built-in names and the formats."""
    if is_builtin(dataset):
        return
    valid = f"valid: a built-in dataset ({', '.join(DATASETS)}) or the path of {FORMAT_HELP}"
    path = Path(dataset).expanduser()
    if not dataset:
        raise ConfigError(f"invalid value '' for 'dataset'; {valid}")
    if path.exists():
        if graph_kind(path) is None:
            found = f"suffix {path.suffix!r}" if path.is_file() else "a directory without graph files"
            raise ConfigError(f"invalid value {dataset!r} for 'dataset': unknown format ({found}); {valid}")
    elif not (os.sep in dataset or "/" in dataset or graph_kind(path) is not None):
        raise ConfigError(f"invalid value {dataset!r} for 'dataset': neither a built-in dataset nor an existing file "
                          f"or directory; {valid}")


def absolute_dataset(dataset: str) -> str:
    """``dataset`` as every process of a run reads it, whatever its working folder: a built-in name,
    ``parties`` or in-memory data as given, a path made absolute."""
    from .memory import is_memory

    if is_builtin(dataset) or dataset == "parties" or is_memory(dataset) or not dataset:
        return dataset
    return os.path.abspath(os.path.expanduser(dataset))  # links left as they are (a loop is the reader's to name)


def source_stamp(dataset: str, params: dict | None = None) -> tuple:
    """Sizes and modification times of the files a path dataset reads (empty for a built-in): a
    cache of loaded data is keyed by it, so a file changed in place is read again."""
    if is_builtin(dataset):
        return ()
    paths = [Path(dataset)]
    if params and params.get("node_table"):
        paths.append(Path(params["node_table"]))
    files = [f for p in paths for f in ([p] if not p.is_dir() else sorted(p.rglob("*")))]
    return tuple((str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files if f.is_file())


class DatasetNotFound(ConfigError):
    """A dataset's files are missing under the data root (one-line message; a client tells the
    server that much, not the data root's path: :mod:`fedgraphcore.disclosure`)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, public="dataset files not found under the node's data root")


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


def empty_adjacency(n: int) -> sp.csr_matrix:
    return sp.csr_matrix((n, n), dtype=np.float64)


def _missing(name: str, path: Path, layout: str, how: str) -> DatasetNotFound:
    return DatasetNotFound(
        f"dataset '{name}': missing {path}; expected layout {layout}; {how}"
    )


def dataset_root(name: str, data_root=None) -> Path:
    """The folder built-in ``name``'s files are read from: the data root (:func:`resolve_data_root`)
    when it holds any of them (the rest missing there is a one-line error), else the user cache,
    after fetching into it what it lacks (:func:`fedgraphcore.data.fetch.fetch`)."""
    root = resolve_data_root(data_root)
    files = fetch.FILES.get(name)
    if files is None:
        if root is None:
            raise DatasetNotFound(
                f"dataset '{name}' needs a data root: set run-config 'data-root' or ${ENV_DATA_ROOT} to a folder "
                "holding its files (it is not downloaded: their checksums are not recorded)")
        return root
    if root is not None and any((root / f.path).is_file() for f in files):
        return root
    return fetch.fetch(name, searched=root)


def _check_files(name: str, base: Path, files: list[str], layout: str, how: str) -> None:
    for f in files:
        p = base / f
        if not p.is_file():
            raise _missing(name, p, layout, how)


# --------------------------------------------------------------------------- embedded


def load_karate(**_: object) -> GraphData:
    """Zachary's karate club from PyG (34 nodes, 4 community labels, one-hot x).
    ``meta['club']`` holds the classic 2-faction split (networkx)."""
    from torch_geometric.datasets import KarateClub
    import networkx as nx

    d = KarateClub()[0]
    ei = d.edge_index.numpy()
    n = int(d.num_nodes)
    g = nx.karate_club_graph()
    club = [0 if g.nodes[i]["club"] == "Mr. Hi" else 1 for i in range(n)]
    return GraphData(
        name="karate",
        adj=symmetric_adjacency(ei[0], ei[1], n),
        x=d.x.numpy().astype(np.float64),
        y=d.y.numpy().astype(np.int64),
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
_TU = {"mutag": "MUTAG", "proteins": "PROTEINS", "imdb-binary": "IMDB-BINARY"}


def load_planetoid(name: str, data_root=None, **_: object) -> GraphData:
    """Planetoid citation graph; x is the raw 0/1 bag-of-words as CSR, y the class."""
    from_name = _PLANETOID[name]
    raw = dataset_root(name, data_root) / "planetoid" / from_name / "raw"
    _check_files(
        name, raw, [f"ind.{name}.{s}" for s in PLANETOID_PARTS],
        f"<data-root>/planetoid/{from_name}/raw/ind.{name}.{{{','.join(PLANETOID_PARTS)}}}",
        "obtain from github.com/kimiyoung/planetoid (data/ind.*), the files PyG Planetoid downloads",
    )
    return read_planetoid(raw, name, name)


def load_tudataset(name: str, data_root=None, **_: object) -> GraphCollection:
    """TUDataset graph collection; per-graph x = one-hot node labels (MUTAG/PROTEINS; None for
    IMDB-BINARY), y = graph labels 0..C-1."""
    tu = _TU[name]
    raw = dataset_root(name, data_root) / "tudataset" / tu / "raw"
    _check_files(
        name, raw, [f"{tu}_A.txt", f"{tu}_graph_indicator.txt", f"{tu}_graph_labels.txt"],
        f"<data-root>/tudataset/{tu}/raw/{tu}_{{A,graph_indicator,graph_labels,...}}.txt",
        f"obtain {tu}.zip from the TU Dortmund graph kernel benchmark collection and extract it into raw/",
    )
    return read_tu(raw, tu, name)


def load_email_eu_core(data_root=None, **_: object) -> GraphData:
    """SNAP email-Eu-core: the directed e-mail edge list symmetrised, self-loops dropped, with its
    department-labels file as the node table (id, label); 42 departments, no features."""
    name = "email-eu-core"
    raw = dataset_root(name, data_root) / "snap" / "email-Eu-core" / "raw"
    _check_files(
        name, raw, ["email-Eu-core.txt", "email-Eu-core-department-labels.txt"],
        "<data-root>/snap/email-Eu-core/raw/{email-Eu-core.txt,email-Eu-core-department-labels.txt}",
        "obtain both files from the SNAP dataset page 'email-Eu-core' (gunzip, space-separated)",
    )
    from .tables import read_edge_list

    return read_edge_list(raw / "email-Eu-core.txt", name, raw / "email-Eu-core-department-labels.txt",
                          node_columns=["id", "label"], node_sep=None)


def load_ego_facebook(data_root=None, **_: object) -> GraphData:
    """SNAP ego-Facebook combined graph (4039 nodes); no features or labels."""
    name = "ego-facebook"
    path = dataset_root(name, data_root) / "snap" / "ego-Facebook" / "facebook_combined.txt"
    if not path.is_file():
        raise _missing(name, path, "<data-root>/snap/ego-Facebook/facebook_combined.txt (one 'u v' edge a line)",
                       "obtain facebook_combined.txt.gz from the SNAP dataset page 'ego-Facebook' and gunzip it")
    from .tables import read_edge_list

    return read_edge_list(path, name)


def load_wiki(data_root=None, **_: object) -> GraphData:
    """AGC Wiki (2405 nodes, 4973 TF-IDF features as CSR, 17 classes, labels 0..16);
    the weighted W is binarised, symmetrised and stripped of its diagonal."""
    name = "wiki"
    path = dataset_root(name, data_root) / "agc" / "wiki.mat"
    if not path.is_file():
        raise _missing(name, path, "<data-root>/agc/wiki.mat (MATLAB file with W, fea, gnd)",
                       "obtain wiki.mat from github.com/karenlatong/AGC-master")
    return read_mat(path, name, weighted=False)


# --------------------------------------------------------------------------- entry point


def load_dataset(name: str, data_root=None, seed: int = 0, **params) -> GraphData | GraphCollection:
    """Load dataset ``name``: one of :data:`DATASETS`, or the path of a graph file or directory.

    ``params`` are the dataset's own parameters (:data:`DATASET_PARAMS`, e.g.
    ``nodes=...`` for ``sbm``; :data:`PATH_PARAMS` for a path); unknown ones raise
    ConfigError. ``seed`` only affects synthetic datasets (sbm, circles).
    """
    if not is_builtin(name):
        check_dataset_value(name)
        _check_params(name, params, PATH_PARAMS)
        return read_graph(name, **params)
    _check_params(name, params, DATASET_PARAMS.get(name, ()))
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


def _check_params(name: str, params: dict, allowed: tuple[str, ...]) -> None:
    bad = sorted(set(params) - set(allowed))
    if bad:
        raise ConfigError(
            f"unknown parameter {bad[0]!r} for dataset '{name}'; valid parameters: "
            + (", ".join(allowed) if allowed else "none")
        )


def _load_files(name: str, data_root) -> GraphData | GraphCollection:
    """A dataset read from the data root: a file that disagrees with the dataset's layout is one
    line naming the dataset and the file (a built-in's node IDs are 0..n-1)."""
    if name in _PLANETOID:
        load = partial(load_planetoid, name)
    elif name in _TU:
        load = partial(load_tudataset, name)
    else:
        load = {"email-eu-core": load_email_eu_core, "ego-facebook": load_ego_facebook, "wiki": load_wiki}[name]
    root = dataset_root(name, data_root)
    try:
        with one_line(f"its files under {root} could not be read",
                      "the files as published (with none of them in the data root, they are downloaded and checked)"):
            data = load(data_root=root)
    except DataFileError as err:
        raise ConfigError(f"dataset '{name}': {err}") from None
    if isinstance(data, GraphData) and data.node_keys is not None:
        keys = data.node_keys
        odd = keys[~np.isin(keys, np.arange(data.num_nodes))] if keys.dtype == np.int64 else \
            keys[~np.char.isdigit(keys)] if (~np.char.isdigit(keys)).any() else keys
        raise ConfigError(f"dataset '{name}': {data.meta['source']} names node {show(odd[0])}; valid: node ids "
                          "0..n-1, as in the published files")
    return data
