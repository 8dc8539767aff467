"""Parties with their own data (``dataset = 'parties'``): shards per split family, the
handshake (partition ids, node-set digests), positions, per-party labels.csv."""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp

from app.client_app import build_client_app
from fedgraphcore.config import ConfigError
from fedgraphcore.data import load_dataset, memory
from fedgraphcore.result import LABELS_CSV
from fedgraphcore.data.parties import PARTIES, item_offsets, node_set_digest, party_shard, to_positions
from fedgraphcore.party_outputs import write_party_labels
from fedgraphcore.data.partition import partition
from fedgraphcore.data.types import GraphCollection, GraphData
from app.inprocess import InProcessGrid
from app.run import run_experiment
from app.server_app import run_server
from fedgraphcore.transport import unpack
from fedgraphcore.wire import ProtocolError
from clients.fedkmeans import FedKMeansClient
from tests.conftest import patch_reply, run_labels


def piece(adj, x=None, y=None, keys=None) -> GraphData:
    g = GraphData("piece", sp.csr_matrix(adj, dtype=np.float64), x, y)
    g.node_keys = None if keys is None else np.asarray(keys)
    return g


def pieces_of(shards) -> list[GraphData]:
    """The partitioner's shards as the pieces parties would hold, with the global ids as node IDs."""
    return [piece(s.adj, s.x, s.y, np.asarray(s.node_ids, dtype=np.int64)) for s in shards]


def register(pieces, out=None, ids=True) -> list[dict]:
    """Node configs of parties holding ``pieces`` (in-memory), partition ids given unless not ``ids``."""
    configs = []
    for i, p in enumerate(pieces):
        config = {"data": memory.register(p)}
        if ids:
            config["partition-id"] = i
        if out is not None:
            config["out-dir"] = str(out / f"party-{i}")
        configs.append(config)
    return configs


@pytest.fixture(autouse=True)
def forget_registered_pieces():
    """The pieces a test registers (:func:`register`) are released after it."""
    before = set(memory._TABLE)
    yield
    for name in set(memory._TABLE) - before:
        while name in memory._TABLE:
            memory.forget(name)


@pytest.fixture(scope="module")
def sbm():
    return load_dataset("sbm", nodes=120, features=6, seed=0)


SMALL = {"num-clusters": 4, "num-rounds": 5}


def test_party_shard_per_split_family():
    adj = np.array([[0, 1, 0, 0], [1, 0, 1, 0], [0, 1, 0, 1], [0, 0, 1, 0]])
    x, y = np.arange(12.0).reshape(4, 3), np.array([0, 1, 1, 0])
    g = piece(adj, x, y, np.array(["a", "b", "c", "d"]))
    node = party_shard(g, "node-random", 1, 3)
    assert (node.client_id, node.num_clients, node.dataset) == (1, 3, PARTIES)
    assert node.node_ids.tolist() == [0, 1, 2, 3] and node.owned.all() and node.keys.tolist() == list("abcd")
    assert np.array_equal(node.x, x) and np.array_equal(node.y, y) and (node.adj != g.adj).nnz == 0
    edge = party_shard(g, "edge", 0, 3, params={"replicas": 2, "overlap": 0.0, "with_features": False})
    assert edge.x is None and edge.edge_weight.tolist() == [2.0] * 6 and edge.num_edges == 3
    assert party_shard(g, "edge", 0, 3).edge_weight.tolist() == [1.0] * 6  # default: each edge on one party
    vertical = party_shard(g, "vertical", 2, 3)
    assert np.array_equal(vertical.x, x) and vertical.y is None and vertical.node_ids.tolist() == [0, 1, 2, 3]
    khop = party_shard(g, "khop", 0, 2, params={"hops": 1, "centres": 0, "max_nodes": 0})
    assert khop.graph_ids.tolist() == [0, 1, 2, 3] and [h.num_nodes for h in khop.graphs] == [2, 3, 3, 2]
    assert khop.graph_y.tolist() == y.tolist() and khop.keys.tolist() == list("abcd")
    coll = GraphCollection("c", [g, g], np.array([1, 0]))
    coll.graph_keys = np.array([10, 20])
    graphs = party_shard(coll, "graph-dirichlet", 0, 2)
    assert graphs.graph_ids.tolist() == [0, 1] and graphs.graph_y.tolist() == [1, 0]
    assert graphs.keys.tolist() == [10, 20] and graphs.num_graphs == 2


def test_party_labels_keep_the_class_numbers_the_party_wrote():
    g = piece(np.zeros((3, 3)), np.ones((3, 1)), np.array([1, -1, 0]))
    g.meta["label_names"] = [1, 3]  # the file held classes 1 and 3, read as 0 and 1
    assert party_shard(g, "node-random", 0, 1).y.tolist() == [3, -1, 1]
    g.meta["label_names"] = ["a", "b"]  # text classes: the reader's numbers
    assert party_shard(g, "node-random", 0, 1).y.tolist() == [1, -1, 0]


@pytest.mark.parametrize("make, partitioner, message", [
    (lambda g: GraphCollection("c", [g], np.array([0])), "node-random",
     "the party's data is a collection of graphs; partitioner 'node-random' needs one graph (nodes and edges)"),
    (lambda g: g, "graph-dirichlet", "the party's data is one graph; partitioner 'graph-dirichlet' needs a collection"),
    (lambda g: piece(g.adj), "vertical", "the party's data has no feature columns; partitioner 'vertical' needs"),
    (lambda g: piece(np.zeros((0, 0))), "edge", "the party's data holds no nodes"),
])
def test_party_shard_refuses_a_piece_the_split_cannot_use(make, partitioner, message):
    g = piece(np.ones((2, 2)) - np.eye(2), np.ones((2, 1)))
    with pytest.raises(ConfigError, match="^" + re.escape(message)):
        party_shard(make(g), partitioner, 0, 2)


def test_positions_offset_by_the_parties_before_and_refuse_other_rows():
    assert item_offsets("node-random", [3, 5, 2]) == [0, 3, 8]
    assert item_offsets("graph-dirichlet", [4, 1]) == [0, 4]
    assert item_offsets("vertical", [7, 7]) == item_offsets("edge", [7, 7]) == [0, 0]
    assert to_positions(np.array([0, 2, 4]), 3, 5).tolist() == [3, 5, 7]
    for bad in ([5], [-1]):
        with pytest.raises(ValueError, match=r"outside its 5 rows 0\.\.4"):
            to_positions(np.array(bad), 3, 5)


def test_node_set_digest_is_of_the_ids_in_order_by_value():
    assert node_set_digest(np.array([1, 2, 7])) == node_set_digest(np.array(["1", "2", "7"]))
    assert node_set_digest(np.array([1, 2, 7])) != node_set_digest(np.array([2, 1, 7]))
    assert node_set_digest(np.array(["ab", "c"])) != node_set_digest(np.array(["a", "bc"]))


def test_a_party_holding_other_node_ids_stops_the_run_at_hello_with_the_counts_only(sbm, tmp_path):
    keys = np.array([f"secret-{i:04d}" for i in range(sbm.num_nodes)])
    shards = partition(sbm, "vertical", 2)
    drop = np.arange(1, sbm.num_nodes)
    pieces = [piece(shards[0].adj, shards[0].x, keys=keys),
              piece(shards[1].adj[drop][:, drop], shards[1].x[drop], keys=keys[drop])]
    raw = {"strategy": "kcagc", "dataset": PARTIES, "num-clients": 2, "partitioner": "vertical", **SMALL,
           "out-dir": str(tmp_path / "out")}
    grid = InProcessGrid(build_client_app(raw), 2, register(pieces), record=True)
    with pytest.raises(ProtocolError) as err:
        run_server(grid, raw)
    assert str(err.value) == ("partitioner 'vertical' needs the same node IDs on every party, but the parties' node "
                              "sets differ; node counts: party 0: 120, party 1: 119")
    assert {m.metadata.message_type for m in grid.pushed} == {"query.hello"}
    assert not (tmp_path / "out").exists()
    same_count = [pieces[0], piece(shards[1].adj, shards[1].x, keys=np.roll(keys, 1))]  # same IDs, another order
    with pytest.raises(ProtocolError, match=r"differ \(equal counts, different IDs\); node counts: party 0: 120, "
                                            r"party 1: 120$"):
        run_experiment("kcagc", PARTIES, 2, {"partitioner": "vertical", **SMALL}, tmp_path / "b",
                       node_configs=register(same_count))


def read_labels(path) -> pd.DataFrame:
    return pd.read_csv(path, dtype={"node": str})


def test_each_party_receives_and_writes_only_its_own_labels(sbm, tmp_path):
    shards = partition(sbm, "node-random", 3)
    pieces = pieces_of(shards)
    for p in pieces:  # the user's IDs: text
        p.node_keys = np.array([f"n{k}" for k in p.node_keys])
    raw = {"strategy": "fedkmeans", "dataset": PARTIES, "num-clients": 3, "partitioner": "node-random", **SMALL,
           "out-dir": str(tmp_path / "server")}
    grid = InProcessGrid(build_client_app(raw), 3, register(pieces, tmp_path), record=True)
    result = run_server(grid, raw)
    labels = np.load(tmp_path / "server" / "labels.npy")
    sent = {m.metadata.dst_node_id: m for m in grid.pushed if m.metadata.message_type == "query.labels"}
    offset = 0
    for i, p in enumerate(pieces):
        n = p.num_nodes
        own = labels[offset: offset + n]
        written = read_labels(run_labels(tmp_path / f"party-{i}"))
        assert list(written.columns) == ["node", "cluster"]
        assert written["node"].tolist() == p.node_keys.tolist() and written["cluster"].tolist() == own.tolist()
        assert np.array_equal(unpack(sent[1001 + i].content)[0]["labels"], own)
        offset += n
    assert result["reference"]["skipped"].startswith("dataset 'parties': the server holds no pooled data")
    assert result["metrics"]["cluster_sizes"] == np.bincount(labels).tolist() and result["metrics"]["coverage"] == 1
    # the ids the server saw are rows of each party, made positions by the server
    ids = [unpack(m.content)[0]["node_ids"] for m in grid.pulled
           if m.metadata.message_type == "query.kmeans_assign"]
    assert [a.tolist() for a in ids] == [list(range(p.num_nodes)) for p in pieces]


def test_the_server_assigns_partition_ids_by_node_id_unless_a_party_names_its_own(sbm, tmp_path, caplog):
    pieces = pieces_of(partition(sbm, "node-random", 2))
    overrides = {"partitioner": "node-random", **SMALL}
    run_experiment("fedkmeans", PARTIES, 2, overrides, tmp_path / "a", node_configs=register(pieces, tmp_path / "a",
                                                                                              ids=False))
    configs = register(pieces, tmp_path / "b", ids=False)
    configs[0]["partition-id"], configs[1]["partition-id"] = 1, 0
    run_experiment("fedkmeans", PARTIES, 2, overrides, tmp_path / "b", node_configs=configs)
    n0, n1 = pieces[0].num_nodes, pieces[1].num_nodes
    # run a: partition ids by node id, the first piece first; run b: the second piece is partition 0
    for run, first in (("a", slice(0, n0)), ("b", slice(n1, n1 + n0))):
        labels = np.load(tmp_path / run / "labels.npy")
        written = read_labels(run_labels(tmp_path / run / "party-0"))
        assert written["node"].tolist() == [str(k) for k in pieces[0].node_keys]
        assert written["cluster"].tolist() == labels[first].tolist()
    configs = register(pieces, ids=False)
    configs[1]["partition-id"] = 0  # the server gave the other one 0 as well
    with pytest.raises(ProtocolError, match=r"partition ids \[0, 0\] are not 0\.\.1 exactly once"):
        run_experiment("fedkmeans", PARTIES, 2, overrides, tmp_path / "c", node_configs=configs)
    configs[1]["partition-id"] = 5  # seen by the party itself at hello (a deployment has no check before the run)
    raw = {"strategy": "fedkmeans", "dataset": PARTIES, "num-clients": 2, **overrides, "out-dir": str(tmp_path / "d")}
    with pytest.raises(ProtocolError, match=r"node 1002: client error: PartyError: node config 'partition-id', "
                                            r"rule 'a whole number 0\.\.1'$"):
        run_server(InProcessGrid(build_client_app(raw), 2, configs), raw)
    assert "node config partition-id=5; valid: a whole number 0..1 for the 2 parties" in caplog.text  # its own log


def test_a_party_sending_ids_beyond_its_rows_stops_the_run_naming_it(sbm, tmp_path, monkeypatch):
    pieces = pieces_of(partition(sbm, "node-random", 2))
    patch_reply(monkeypatch, FedKMeansClient, "kmeans_assign",
                lambda shard, out, vals: ({**out, "node_ids": out["node_ids"] + 1}, vals), client=1)
    with pytest.raises(ProtocolError, match=r"^step 'kmeans_assign': client 1 \(node 1002\) sent item ids in \[1, 60\], "
                                            r"outside its 60 rows 0\.\.59$"):
        run_experiment("fedkmeans", PARTIES, 2, {"partitioner": "node-random", **SMALL}, tmp_path / "out",
                       node_configs=register(pieces))


def test_an_out_dir_a_party_cannot_write_stops_the_run_at_hello(sbm, tmp_path, caplog):
    pieces = pieces_of(partition(sbm, "node-random", 2))
    (tmp_path / "file").write_text("")
    configs = register(pieces)
    configs[1]["out-dir"] = str(tmp_path / "file" / "labels")
    raw = {"strategy": "fedkmeans", "dataset": PARTIES, "num-clients": 2, "partitioner": "node-random", **SMALL,
           "out-dir": str(tmp_path / "out")}
    with pytest.raises(ProtocolError, match=r"^step 'hello' rejected 1 client\(s\): node 1002: client error: "
                                            r"PartyError: node config 'out-dir', rule 'a writable directory'$"):
        run_server(InProcessGrid(build_client_app(raw), 2, configs), raw)
    assert re.search(r"node config out-dir: '.*/file' is a file; valid: a writable directory", caplog.text)
    # a local run (every party in this process) names it before the run starts
    with pytest.raises(ConfigError, match=r"^node config out-dir: '.*/file' is a file; valid: a writable directory"):
        run_experiment("fedkmeans", PARTIES, 2, {"partitioner": "node-random", **SMALL}, tmp_path / "out",
                       node_configs=configs)
    assert not (tmp_path / "out" / "result.json").exists()


@pytest.mark.parametrize("overrides, configs, message", [
    ({"num-clusters": 0}, True, "^num-clusters=0 \\(the number of classes\\) with dataset='parties': the server holds "
                                "no labels to count; valid: num-clusters >= 1$"),
    ({"eval-file": "eval.npz"}, True, "^eval-file with dataset='parties'"),
    ({}, False, "^dataset='parties' needs parties that bring their own data"),
])
def test_runs_on_the_parties_data_refuse_what_the_server_cannot_have(sbm, tmp_path, overrides, configs, message):
    node_configs = register(pieces_of(partition(sbm, "node-random", 2))) if configs else None
    with pytest.raises(ConfigError, match=message):
        run_experiment("fedkmeans", PARTIES, 2, {"partitioner": "node-random", **SMALL, **overrides},
                       tmp_path / "out", node_configs=node_configs)


def test_a_data_node_config_in_a_run_of_a_named_dataset_is_refused(sbm, tmp_path, caplog):
    raw = {"strategy": "fedkmeans", "dataset": "sbm", "sbm.nodes": 100, "num-clients": 2, "num-rounds": 2}
    configs = [{"partition-id": i, "num-partitions": 2, "data": "/somewhere"} for i in range(2)]
    with pytest.raises(ProtocolError, match="client error: PartyError: node config 'data', rule 'with dataset "
                                            "parties only'$"):
        run_server(InProcessGrid(build_client_app(raw), 2, configs), {**raw, "out-dir": str(tmp_path / "o")})
    assert "node config 'data' is read with dataset='parties' only, but this run uses dataset='sbm'" in caplog.text


def test_the_ledger_lists_the_digest_and_the_result_has_no_pooled_scores(sbm, tmp_path):
    pieces = pieces_of(partition(sbm, "vertical", 2))
    result = run_experiment("kcagc-basic", PARTIES, 2, {"partitioner": "vertical", **SMALL,
                                                       "kcagc.restarts": 2, "kcagc.iterations": 3},
                            tmp_path / "out", node_configs=register(pieces, tmp_path))
    hello = {(u["client"], u["name"]) for u in result["privacy"]["uploads"] if u["action"] == "hello"}
    assert {(0, "node_digest"), (1, "node_digest"), (0, "num_graphs")} <= hello
    assert "acc" not in result["metrics"] and sum(result["metrics"]["cluster_sizes"]) == sbm.num_nodes
    labels = np.load(tmp_path / "out" / "labels.npy")
    for i in range(2):  # both hold every node: both get every label, from kcagc's own labels step
        assert read_labels(run_labels(tmp_path / f"party-{i}"))["cluster"].tolist() == labels.tolist()
    assert sum(r["action"] == "labels" for r in result["timing"]["per_round"]) == 1
    assert json.loads((tmp_path / "out" / "result.json").read_text())["dataset"] == PARTIES


def test_write_party_labels_refuses_a_count_mismatch(tmp_path):
    with pytest.raises(ValueError, match="3 IDs for 2 labels"):
        write_party_labels(tmp_path, 7, np.array([1, 2, 3]), np.array([0, 1]))
    assert not list(tmp_path.rglob(LABELS_CSV))
