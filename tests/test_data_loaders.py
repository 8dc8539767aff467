"""Dataset loaders: contract, synthetic generators, real files without network."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fedgraphcore.config import ConfigError  # noqa: E402
from fedgraphcore.data import DATASETS, DatasetNotFound, GraphCollection, GraphData, load_dataset  # noqa: E402
from fedgraphcore.data.datasets import resolve_data_root, symmetric_adjacency  # noqa: E402

DEFAULT_ROOT = Path(__file__).resolve().parents[1].parent / "shared" / "datasets"
SHARED = Path(os.environ.get("FEDGRAPH_DATA_ROOT") or DEFAULT_ROOT)
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason=f"shared datasets not found at {SHARED}")


@pytest.fixture
def no_network(monkeypatch):
    """Any attempt to open a connection fails loudly."""
    def refuse(*args, **kwargs):
        raise AssertionError(f"network connection attempted: {args[1:]!r}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def _snapshot(root: Path) -> dict:
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}


def test_dataset_names_exact():
    assert DATASETS == ("karate", "sbm", "iris", "digits", "circles", "cora", "citeseer", "pubmed",
                        "wiki", "mutag", "proteins", "imdb-binary", "email-eu-core", "ego-facebook")


def test_unknown_dataset_is_one_line_config_error():
    with pytest.raises(ConfigError) as e:
        load_dataset("coraa")
    msg = str(e.value)
    assert "\n" not in msg and "'coraa'" in msg and "cora, citeseer" in msg


def test_unknown_dataset_parameter():
    with pytest.raises(ConfigError, match="unknown parameter 'node' for dataset 'sbm'.*nodes"):
        load_dataset("sbm", node=10)
    with pytest.raises(ConfigError, match="dataset 'iris'"):
        load_dataset("iris", nodes=10)


def test_symmetric_adjacency_canonical():
    a = symmetric_adjacency(np.array([0, 1, 1, 2, 2]), np.array([1, 0, 1, 0, 0]), 4)
    assert a.dtype == np.float64 and a.shape == (4, 4)
    assert (a != a.T).nnz == 0 and a.diagonal().sum() == 0
    assert sorted(zip(*a.nonzero())) == [(0, 1), (0, 2), (1, 0), (2, 0)]
    assert set(a.data) == {1.0}


# ----------------------------------------------------------------------------- SBM


def test_sbm_structure_and_determinism():
    d = load_dataset("sbm", seed=3, nodes=600, blocks=3, p_in=0.1, p_out=0.01, features=8, signal=4.0)
    d.validate()
    assert d.num_nodes == 600 and d.x.shape == (600, 8) and d.num_classes == 3
    assert np.array_equal(np.bincount(d.y), [200, 200, 200])
    # Node ids carry no block info: labels are not sorted.
    assert (np.diff(d.y) != 0).sum() > 100
    coo = sp.triu(d.adj, 1).tocoo()
    same = d.y[coo.row] == d.y[coo.col]
    pairs_in = 3 * 200 * 199 / 2
    pairs_out = 3 * 200 * 200
    assert abs(same.sum() / pairs_in - 0.1) < 0.01
    assert abs((~same).sum() / pairs_out - 0.01) < 0.002
    # Feature means separate the blocks.
    means = np.stack([d.x[d.y == b].mean(0) for b in range(3)])
    assert np.linalg.norm(means[0] - means[1]) > 2.5
    d2 = load_dataset("sbm", seed=3, nodes=600, blocks=3, p_in=0.1, p_out=0.01, features=8, signal=4.0)
    assert (d.adj != d2.adj).nnz == 0 and np.array_equal(d.x, d2.x) and np.array_equal(d.y, d2.y)
    d3 = load_dataset("sbm", seed=4, nodes=600, blocks=3, p_in=0.1, p_out=0.01, features=8, signal=4.0)
    assert (d.adj != d3.adj).nnz > 0


def test_sbm_default_is_small_and_clustered():
    d = load_dataset("sbm")
    assert d.num_nodes == 1000 and d.num_classes == 4 and d.x.shape[1] > 0
    from sklearn.cluster import KMeans
    from sklearn.metrics import adjusted_rand_score

    pred = KMeans(4, n_init=4, random_state=0).fit_predict(d.x)
    assert adjusted_rand_score(d.y, pred) > 0.9


def test_sbm_sparse_large_edge_count():
    n, b = 200_000, 8
    bs = n // b
    d = load_dataset("sbm", nodes=n, blocks=b, p_in=8 / bs, p_out=1 / (n - bs), features=0)
    assert d.x is None and sp.isspmatrix_csr(d.adj)
    expected = (8 / bs) * b * bs * (bs - 1) / 2 + (1 / (n - bs)) * (n * n - b * bs * bs) / 2
    assert abs(d.num_edges - expected) < 5 * np.sqrt(expected)
    assert d.adj.diagonal().sum() == 0 and d.adj.data.max() == 1.0


def test_sbm_dense_blocks():
    d = load_dataset("sbm", seed=2, nodes=60, blocks=2, p_in=0.9, p_out=0.0, features=0)
    d.validate()
    coo = sp.triu(d.adj, 1).tocoo()
    assert (d.y[coo.row] == d.y[coo.col]).all()
    assert abs(d.num_edges / (2 * 30 * 29 / 2) - 0.9) < 0.05
    full = load_dataset("sbm", nodes=50, blocks=1, p_in=1.0, p_out=0.0, features=0)
    assert full.num_edges == 50 * 49 // 2


def test_sbm_bad_sizes():
    with pytest.raises(ConfigError, match="blocks"):
        load_dataset("sbm", nodes=3, blocks=5)


# ----------------------------------------------------------------------------- embedded


@pytest.mark.parametrize("name,n,f,k", [("iris", 150, 4, 3), ("digits", 1797, 64, 10), ("circles", 1000, 2, 2)])
def test_sample_datasets_have_empty_graph(name, n, f, k):
    d = load_dataset(name)
    d.validate()
    assert isinstance(d, GraphData)
    assert d.adj.shape == (n, n) and d.adj.nnz == 0 and d.x.shape == (n, f) and d.num_classes == k


def test_circles_seeded():
    a, b, c = load_dataset("circles", seed=1), load_dataset("circles", seed=1), load_dataset("circles", seed=2)
    assert np.array_equal(a.x, b.x) and not np.array_equal(a.x, c.x)
    assert load_dataset("circles", samples=300).num_nodes == 300


def test_karate(no_network):
    d = load_dataset("karate")
    d.validate()
    assert (d.num_nodes, d.num_edges, d.num_classes) == (34, 78, 4)
    assert sorted(np.bincount(d.meta["club"])) == [17, 17]


# ----------------------------------------------------------------------------- data root


def test_data_root_resolution(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDGRAPH_DATA_ROOT", str(tmp_path / "env"))
    assert resolve_data_root(str(tmp_path / "arg")) == (tmp_path / "arg").resolve()
    assert resolve_data_root("") == (tmp_path / "env").resolve()
    monkeypatch.delenv("FEDGRAPH_DATA_ROOT")
    default = resolve_data_root(None)
    assert default == (DEFAULT_ROOT.resolve() if DEFAULT_ROOT.is_dir() else None)


@pytest.mark.parametrize("name,rel,held", [
    ("pubmed", "planetoid/PubMed/raw/ind.pubmed.x", None),  # never downloaded
    ("cora", "planetoid/Cora/raw/ind.cora.x", "planetoid/Cora/raw/ind.cora.y"),
    ("mutag", "tudataset/MUTAG/raw/MUTAG_A.txt", "tudataset/MUTAG/raw/MUTAG_graph_labels.txt"),
    ("email-eu-core", "snap/email-Eu-core/raw/email-Eu-core.txt",
     "snap/email-Eu-core/raw/email-Eu-core-department-labels.txt"),
])
def test_missing_files_one_line(tmp_path, name, rel, held, no_network):
    """A data root holding part of a dataset (a download completes none: test_data_fetch.py)."""
    if held:
        (tmp_path / held).parent.mkdir(parents=True)
        (tmp_path / held).write_text("1\n")
    with pytest.raises(DatasetNotFound) as e:
        load_dataset(name, data_root=tmp_path)
    msg = str(e.value)
    assert "\n" not in msg and f"'{name}'" in msg and str(tmp_path / rel) in msg
    assert "expected layout" in msg and "obtain" in msg
    assert isinstance(e.value, ConfigError)


@pytest.mark.parametrize("name, rel, content, error", [
    ("wiki", "agc/wiki.mat", b"MATLAB 5.0", ": not a MATLAB file (MatReadError: "),
    ("ego-facebook", "snap/ego-Facebook/facebook_combined.txt", b"0 a\n",
     " names node 'a'; valid: node ids 0..n-1, as in the published files"),
])
def test_corrupt_files_one_line(tmp_path, name, rel, content, error, no_network):
    """A file that is there but cannot be parsed, or is not the dataset, is a bad input too, not a traceback."""
    (tmp_path / rel).parent.mkdir(parents=True)
    (tmp_path / rel).write_bytes(content)
    with pytest.raises(ConfigError) as e:
        load_dataset(name, data_root=tmp_path)
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith(f"dataset '{name}': {tmp_path / rel}{error}")


# ----------------------------------------------------------------------------- real files


@needs_shared
def test_cora_from_shared_without_network(no_network):
    before = _snapshot(SHARED)
    d = load_dataset("cora", data_root=SHARED)
    d.validate()
    assert (d.num_nodes, d.num_edges, d.num_features, d.num_classes) == (2708, 5278, 1433, 7)
    assert sp.isspmatrix_csr(d.x) and set(np.unique(d.x.data)) == {1.0}
    assert _snapshot(SHARED) == before, "the data root must stay read-only"


@needs_shared
def test_mutag_from_shared_without_network(no_network):
    before = _snapshot(SHARED)
    c = load_dataset("mutag", data_root=SHARED)
    assert isinstance(c, GraphCollection)
    assert len(c) == 188 and c.num_nodes == 3371 and c.num_classes == 2
    assert sorted(np.bincount(c.y)) == [63, 125]
    assert sum(g.num_edges for g in c.graphs) == 7442 // 2
    for g in c.graphs[:20]:
        g.validate()
        assert g.x.shape == (g.num_nodes, 7)
    assert _snapshot(SHARED) == before


@needs_shared
@pytest.mark.parametrize("name,nodes,edges,feats,classes", [
    ("citeseer", 3327, 4552, 3703, 6),
    ("wiki", 2405, 11596, 4973, 17),
    ("email-eu-core", 1005, 16064, 0, 42),
    ("ego-facebook", 4039, 88234, 0, 0),
])
def test_other_graphs_from_shared(name, nodes, edges, feats, classes, no_network):
    d = load_dataset(name, data_root=SHARED)
    d.validate()
    assert (d.num_nodes, d.num_edges, d.num_features, d.num_classes) == (nodes, edges, feats, classes)


@needs_shared
def test_env_var_data_root(no_network, monkeypatch):
    monkeypatch.setenv("FEDGRAPH_DATA_ROOT", str(SHARED))
    assert load_dataset("wiki").num_nodes == 2405
    monkeypatch.setenv("FEDGRAPH_DATA_ROOT", "/nonexistent/root")
    monkeypatch.setenv("FEDGRAPH_DATA_URL", "file:///nonexistent/mirror")  # not there either: no download
    with pytest.raises(ConfigError, match=r"could not download file:///nonexistent/mirror/agc/wiki\.mat .*"
                                          r"\(searched: /nonexistent/root\)"):
        load_dataset("wiki")


# ----------------------------------------------------------------------------- files that disagree


@pytest.fixture
def mutag_copy(tmp_path):
    """A writable copy of the shared MUTAG files under a fresh data root."""
    import shutil

    shutil.copytree(SHARED / "tudataset" / "MUTAG", tmp_path / "tudataset" / "MUTAG")
    return tmp_path / "tudataset" / "MUTAG" / "raw"


def _cut(path: Path, lines: int) -> None:
    path.write_text("".join(path.read_text().splitlines(keepends=True)[:lines]))


def _append(path: Path, line: str) -> None:
    path.write_text(path.read_text() + line + "\n")


@needs_shared
@pytest.mark.parametrize("corrupt, file, detail", [
    (lambda raw: _cut(raw / "MUTAG_graph_labels.txt", 100), "MUTAG_graph_labels.txt",
     "has 100 lines but MUTAG_graph_indicator.txt numbers 188 graphs; valid: one line per graph"),
    (lambda raw: _cut(raw / "MUTAG_node_labels.txt", 3000), "MUTAG_node_labels.txt",
     "has 3000 lines but MUTAG_graph_indicator.txt has 3371 nodes; valid: one line per node"),
    (lambda raw: _cut(raw / "MUTAG_edge_labels.txt", 7000), "MUTAG_edge_labels.txt",
     "has 7000 lines but MUTAG_A.txt has 7442 edges; valid: one line per edge"),
    (lambda raw: _append(raw / "MUTAG_A.txt", "1, 9999"), "MUTAG_A.txt",
     "refers to node 9999; valid: nodes 1..3371 (the lines of the graph indicator)"),
    (lambda raw: _append(raw / "MUTAG_A.txt", "1, 3371"), "MUTAG_A.txt",
     "line 7443 joins node 1 of graph 1 to node 3371 of graph 188; valid: edges within one graph"),
    (lambda raw: _append(raw / "MUTAG_graph_indicator.txt", "190"), "MUTAG_graph_indicator.txt",
     "line 3372 has graph id 190; valid: graph ids 1, 2, ... in order, one line per node"),
], ids=["graph-labels-cut", "node-labels-cut", "edge-labels-cut", "edge-out-of-range", "edge-across-graphs",
        "graph-id-gap"])
def test_inconsistent_tu_files_stop_at_load(mutag_copy, corrupt, file, detail, no_network):
    """TU files that parse but disagree (the reproduced case: graph labels cut to 100 lines) stop the load
    with one line naming the dataset, the file and the mismatch, not a length error at the end of a run."""
    corrupt(mutag_copy)
    with pytest.raises(ConfigError) as e:
        load_dataset("mutag", data_root=mutag_copy.parents[2])
    assert str(e.value) == f"dataset 'mutag': {mutag_copy / file} {detail}"


@needs_shared
@pytest.mark.parametrize("part, change, detail", [
    ("ally", lambda ally: np.vstack([ally, ally[:5]]),
     "ind.cora.{{allx,tx}} under {raw} hold 2708 feature rows but ind.cora.{{ally,ty}} 2713 label rows; "
     "valid: one of each per node"),
    ("graph", lambda graph: {**graph, 0: [*graph[0], 5000]},
     "{raw}/ind.cora.graph refers to node 5000; valid: nodes 0..2707 (the feature rows)"),
], ids=["labels-longer", "edge-out-of-range"])
def test_inconsistent_planetoid_files_stop_at_load(tmp_path, part, change, detail, no_network):
    import pickle
    import shutil

    raw = tmp_path / "planetoid" / "Cora" / "raw"
    shutil.copytree(SHARED / "planetoid" / "Cora" / "raw", raw)
    path = raw / f"ind.cora.{part}"
    path.write_bytes(pickle.dumps(change(pickle.loads(path.read_bytes(), encoding="latin1"))))
    with pytest.raises(ConfigError) as e:
        load_dataset("cora", data_root=tmp_path)
    assert str(e.value) == "dataset 'cora': " + detail.format(raw=raw)


@pytest.mark.parametrize("name, files, detail", [
    ("email-eu-core", {"email-Eu-core.txt": "0 1\n1 2\n", "email-Eu-core-department-labels.txt": "0 1\n2 1\n"},
     "{raw}/email-Eu-core.txt: line 1 names node 1, which {raw}/email-Eu-core-department-labels.txt does not list; "
     "valid: node IDs of the node table"),
    ("email-eu-core", {"email-Eu-core.txt": "0 1\n0 5\n", "email-Eu-core-department-labels.txt": "0 1\n1 1\n"},
     "{raw}/email-Eu-core.txt: line 2 names node 5, which {raw}/email-Eu-core-department-labels.txt does not list; "
     "valid: node IDs of the node table"),
    ("ego-facebook", {"facebook_combined.txt": "0 1\n2 -1\n"},
     "{raw}/facebook_combined.txt names node -1; valid: node ids 0..n-1, as in the published files"),
], ids=["email-label-missing", "email-edge-unknown-node", "facebook-negative-id"])
def test_inconsistent_snap_files_stop_at_load(tmp_path, name, files, detail, no_network):
    raw = tmp_path / "snap" / ("email-Eu-core/raw" if name == "email-eu-core" else "ego-Facebook")
    raw.mkdir(parents=True)
    for file, text in files.items():
        (raw / file).write_text(text)
    with pytest.raises(ConfigError) as e:
        load_dataset(name, data_root=tmp_path)
    assert str(e.value) == f"dataset '{name}': " + detail.format(raw=raw)


def test_inconsistent_wiki_matrices_stop_at_load(tmp_path, no_network):
    import scipy.io as sio

    path = tmp_path / "agc" / "wiki.mat"
    path.parent.mkdir()
    sio.savemat(path, {"W": sp.csr_matrix(np.ones((3, 3))), "fea": np.ones((2, 4)), "gnd": np.array([[1], [2], [1]])})
    with pytest.raises(ConfigError) as e:
        load_dataset("wiki", data_root=tmp_path)
    assert str(e.value) == (f"dataset 'wiki': {path} holds a 3x3 W, 2 fea rows and 3 gnd entries; "
                            "valid: a square W with one fea row and one gnd entry per node")
