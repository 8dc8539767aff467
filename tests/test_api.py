"""``app.cluster``: every input type, the Result, pre-split pieces against the partitioner's
split, bad arguments, and ``app.data.check``."""

from __future__ import annotations

import json

import networkx as nx
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp

from app import Result, cluster
from fedgraphcore.config import ConfigError
from fedgraphcore.data import load_dataset, memory
from fedgraphcore.data.check import main as check_main
from fedgraphcore.data.formats import read_graph
from fedgraphcore.data.partition import partition
from fedgraphcore.data.prepare import run as prepare
from fedgraphcore.data.types import GraphData
from fedgraphcore.result import LABELS_CSV
from tests.conftest import run_labels, shared_datasets_or_skip

SMALL = {"num_clusters": 4, "num_rounds": 5, "config": {"fedkmeans.filter-order": 1}}


@pytest.fixture(scope="module")
def sbm() -> GraphData:
    return load_dataset("sbm", nodes=120, features=6, seed=0)


def as_files(g: GraphData, folder) -> str:
    """``g`` as a directory of nodes.csv and edges.csv with text IDs."""
    folder.mkdir()
    keys = np.array([f"v{i:04d}" for i in range(g.num_nodes)])  # sorted as the rows
    pd.DataFrame({"id": keys, **{f"x{j}": g.x[:, j] for j in range(g.x.shape[1])}, "label": g.y}).to_csv(
        folder / "nodes.csv", index=False)
    up = sp.triu(g.adj, 1, format="coo")
    pd.DataFrame({"source": keys[up.row], "target": keys[up.col]}).to_csv(folder / "edges.csv", index=False)
    return str(folder)


def inputs(g: GraphData, tmp_path) -> dict:
    from torch_geometric.data import Data
    import torch

    up = sp.triu(g.adj, 1, format="coo")
    graph = nx.Graph()
    graph.add_nodes_from((i, {"x": g.x[i], "label": int(g.y[i])}) for i in range(g.num_nodes))
    graph.add_edges_from(zip(up.row.tolist(), up.col.tolist()))
    edge_index = torch.tensor(np.vstack([np.r_[up.row, up.col], np.r_[up.col, up.row]]), dtype=torch.long)
    return {
        "GraphData": GraphData("mine", g.adj, g.x, g.y),
        "PyG Data": Data(x=torch.tensor(g.x), edge_index=edge_index, y=torch.tensor(g.y)),
        "networkx": graph,
        "numpy (adj, x, y)": (g.adj.toarray(), g.x, g.y),
        "scipy (adj, x, y)": (sp.csr_matrix(g.adj), g.x, g.y),
        "path": as_files(g, tmp_path / "files"),
    }


def test_every_input_type_gives_the_same_run(sbm, tmp_path):
    registered = dict(memory._TABLE)
    results = {kind: cluster("fedkmeans", data, 3, seed=1, **SMALL) for kind, data in inputs(sbm, tmp_path).items()}
    files = tmp_path / "files"  # an edge list with its node table elsewhere: the reader's option data.node-table
    (files / "edges.csv").rename(tmp_path / "e.csv")
    (files / "nodes.csv").rename(tmp_path / "n.csv")
    results["edge list + data.node-table"] = cluster("fedkmeans", str(tmp_path / "e.csv"), 3, seed=1, **{
        **SMALL, "config": {**SMALL["config"], "data.node-table": str(tmp_path / "n.csv")}})
    first = results["GraphData"]
    for kind, r in results.items():
        assert np.array_equal(r.labels, first.labels), kind
        assert r.metrics == first.metrics and r.timing["rounds"] == first.timing["rounds"], kind
    assert results["path"].ids.tolist() == [f"v{i:04d}" for i in range(sbm.num_nodes)]
    assert results["networkx"].ids.tolist() == list(range(sbm.num_nodes))
    assert memory._TABLE == registered  # every registration released


def test_without_out_dir_nothing_is_written_and_no_path_is_named(sbm, tmp_path, monkeypatch, caplog):
    """The labels stay in memory: no result.json in a temporary directory, no log line naming one."""
    import tempfile

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    written = cluster("fedkmeans", sbm, 2, out_dir=tmp_path / "out", **SMALL)
    before = sorted(p.name for p in tmp_path.iterdir())
    caplog.clear()
    with caplog.at_level("INFO"):
        kept = cluster("fedkmeans", sbm, 2, **SMALL)
    assert sorted(p.name for p in tmp_path.iterdir()) == before == ["out"]
    assert kept.path is None and "labels" not in kept.result and "result: " not in caplog.text
    assert np.array_equal(kept.labels, written.labels) and kept.metrics == written.metrics


@pytest.mark.shipped_defaults
def test_the_result_holds_what_result_json_holds(sbm, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = cluster("fedkmeans", sbm, 2, **SMALL)  # no out_dir: nothing written
    assert list(tmp_path.iterdir()) == [] and r.path is None
    assert isinstance(r, Result) and r.config["num-rounds"] == 5 and r.config["fedkmeans.filter-order"] == 1
    for key in ("metrics", "reference", "timing", "communication", "privacy", "history"):
        assert getattr(r, key) == r.result[key]
    frame = r.labels_frame()
    assert list(frame.columns) == ["node", "cluster", "centralised"] and frame["cluster"].tolist() == r.labels.tolist()
    assert frame["centralised"].tolist() == r.reference_labels.tolist() and r.report is None
    written = cluster("fedkmeans", sbm, 2, out_dir=tmp_path / "out", **SMALL)
    assert json.loads(written.path.read_text())["metrics"] == written.metrics
    assert np.array_equal(written.labels, r.labels)
    assert pd.read_csv(tmp_path / "out" / LABELS_CSV).equals(frame)  # the centralised labels beside the federated
    assert written.report == tmp_path / "out" / "report.html" and written.report.is_file()


PRESPLIT = {  # strategy, partitioner, run-config: split families whose pieces give the partitioner's split
    "node": ("fedkmeans", "node-random", {"num-rounds": 5, "fedkmeans.filter-order": 1}),
    "samples": ("fedsc", "sample", {"num-rounds": 3, "fedsc.sigma": 1.0, "fedsc.landmarks": 12}),
    "vertical": ("kcagc", "vertical", {"kcagc.iterations": 3, "kcagc.restarts": 2, "kcagc.local-restarts": 1,
                                       "kcagc.filter-order": 2}),
    "edge": ("fedspectral-plus", "edge", {"fedspectral-plus.mode": "paper", "fedspectral-plus.rounds": 3,
                                          "fedspectral-plus.iters": 2}),
}


@pytest.mark.parametrize("family", sorted(PRESPLIT))
def test_presplit_pieces_equal_the_same_split_cut_by_the_partitioner(family, sbm, tmp_path):
    strategy, partitioner, config = PRESPLIT[family]
    whole = cluster(strategy, sbm, 3, config={"partitioner": partitioner, **config}, num_clusters=4)
    prepare(["--dataset", "sbm", "--set", "sbm.nodes=120", "--set", "sbm.features=6", "--partitioner", partitioner,
             "--num-clients", "3", "--out", str(tmp_path / "parties"), "--format", "files"])
    pieces = [read_graph(tmp_path / "parties" / f"party-{i}", boundary=True) for i in range(3)]
    split = cluster(strategy, pieces, config={"partitioner": partitioner, **config}, num_clusters=4,
                    out_dir=tmp_path / "out")
    by_id = dict(zip(whole.ids.tolist(), whole.labels.tolist()))
    assert dict(zip(split.ids.tolist(), split.labels.tolist())) == by_id
    assert split.result["dataset"] == "parties" and split.reference["skipped"]
    for i, p in enumerate(pieces):  # each party's labels.csv: its own nodes with the whole run's labels
        written = pd.read_csv(run_labels(tmp_path / "out" / f"party-{i}"))
        assert written["node"].tolist() == p.keys.tolist()
        assert written["cluster"].tolist() == [by_id[k] for k in p.keys.tolist()]


@pytest.mark.integration
def test_presplit_graph_collections_give_the_partitioners_clustering(tmp_path):
    """The same partition of the graphs; the cluster numbers may differ, since the server orders the
    graphs by position (party by party) where the partitioned run orders them by graph id."""
    from sklearn.metrics import adjusted_rand_score

    root = str(shared_datasets_or_skip())
    config = {"partitioner": "graph-dirichlet", "num-rounds": 2, "gw-ldp.model": "gcn", "gw-ldp.workers": 1,
              "gw-ldp.epsilon": "inf", "partition.alpha": 100.0, "data-root": root}
    full = load_dataset("mutag", data_root=root)
    mutag = type(full)("mutag-72", full.graphs[::2][:72], full.y[::2][:72])  # fewer GW pairs, both classes
    whole = cluster("gw-ldp", mutag, 3, config=config, num_clusters=2)
    pieces = []
    for s in partition(mutag, "graph-dirichlet", 3, alpha=100.0):
        part = type(mutag)("piece", s.graphs, s.graph_y)
        part.graph_keys = np.asarray(s.graph_ids)
        pieces.append(part)
    split = cluster("gw-ldp", pieces, config={k: v for k, v in config.items() if k != "data-root"}, num_clusters=2)
    assert split.item == "graph" and split.labels_frame().columns.tolist() == ["party", "graph", "cluster"]
    by_id = dict(zip(split.ids.tolist(), split.labels.tolist()))
    assert adjusted_rand_score(whole.labels, [by_id[k] for k in whole.ids.tolist()]) == 1.0
    assert split.metrics["svc_test_acc"] == whole.metrics["svc_test_acc"]


@pytest.mark.parametrize("call, message", [
    (lambda g: cluster("fedkmeans", g, 2, num_rounds=3, config={"num-rounds": 4}),
     "^run-config key 'num-rounds' given twice"),
    (lambda g: cluster("fedkmeans", g, 2, config={"dataset": "cora"}),
     "^run-config key 'dataset' is cluster\\(\\)'s argument data; valid: pass it as that argument$"),
    (lambda g: cluster("fedkmeans", g, 2, num_round=3), "^unknown config key 'num-round'"),
    (lambda g: cluster("nope", g, 2), "^invalid value 'nope' for 'strategy'; valid choices: fedkmeans"),
    (lambda g: cluster("fedkmeans", g, 2, engine="ray"), "^unknown engine 'ray'; valid choices"),
    (lambda g: cluster("fedkmeans", g, 2, engine="simulation"),
     "^engine='simulation' with in-memory data; valid: 'inprocess', or a file path$"),
    (lambda g: cluster("fedkmeans", [g, g], 3), "^num_clients=3 with 2 pieces; valid: None or 2"),
    (lambda g: cluster("fedkmeans", [], 3), "^an empty list of pieces"),
    (lambda g: cluster("fedkmeans", [g, g]), "^num-clusters=0 \\(the number of classes\\) with dataset='parties'"),
    (lambda g: cluster("fedkmeans", {"not": "a graph"}), "^as_graph: a dict; valid: GraphData"),
    (lambda g: cluster("gw-ldp", g, 2), "^dataset given in memory is one graph; strategy 'gw-ldp'"),
])
def test_bad_arguments_are_one_line_config_errors(sbm, call, message):
    registered = dict(memory._TABLE)
    with pytest.raises(ConfigError, match=message) as err:
        call(sbm)
    assert "\n" not in str(err.value)
    assert memory._TABLE == registered


def test_check_prints_what_a_party_will_hold_and_refuses_bad_files(sbm, tmp_path, capsys):
    folder = as_files(sbm, tmp_path / "party")
    assert check_main([folder, "--partitioner", "vertical"]) == 0
    out = capsys.readouterr().out
    assert "120 nodes (text IDs), " in out and "6 feature columns, labels: 4 classes" in out
    assert "this party holds its feature columns of the node IDs every party holds" in out
    assert "node-set digest (every party must show the same): " in out
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "nodes.csv").write_text("id\nv1\nv2\n")
    cases = [
        ([str(tmp_path / "missing"), "--partitioner", "node-random"], "no such file or directory"),
        ([str(tmp_path / "empty"), "--partitioner", "vertical"], "has no feature columns; partitioner 'vertical'"),
        ([folder, "--partitioner", "graph-dirichlet"], "is one graph; partitioner 'graph-dirichlet' needs"),
        ([folder, "--partitioner", "nope"], "unknown partitioner 'nope'"),
        ([folder, "--partitioner", "edge", "--read", "sep=;"], "unknown node config key 'read.sep'"),
        ([folder, "--partitioner", "edge", "--set", "partition.bogus=1"], "unknown config key 'partition.bogus'"),
    ]
    for argv, message in cases:
        assert check_main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and message in err and err.count("\n") == 1, (argv, err)


def test_a_graph_read_from_a_path_is_named_by_it_not_as_data_in_memory(sbm, tmp_path, caplog):
    from fedgraphcore.data.formats import write_npz

    path = write_npz(sbm, tmp_path / "graph.npz")
    with caplog.at_level("INFO"):
        cluster("fedkmeans", str(path), 2, **SMALL)
    assert f"fedkmeans on {path} with 2 clients" in caplog.text and "given in memory" not in caplog.text
    caplog.clear()
    with caplog.at_level("INFO"):
        cluster("fedkmeans", sbm, 2, **SMALL)
    assert "fedkmeans on data given in memory with 2 clients" in caplog.text
