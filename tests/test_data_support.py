"""Runs whose data cannot support the method stop with one line before the first protocol step, or
warn in the summary and result.json when the support is merely weak; shard files of different cuts
are refused at the hello handshake; an occupied out-dir stops the ServerApp before any message; a
secure sum over a client's rows is bounded by its rows, so defaults hold at every size."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedgraphcore.config import ConfigError
from fedgraphcore.data.partition import partition
from fedgraphcore.data.datasets import load_dataset
from fedgraphcore.data.shards import data_hash, write_shards
from app.inprocess import InProcessGrid
from fedgraphcore.privacy.secagg import FixedPointEncoder
from fedgraphcore.protocols.fedkmeans import statistics_bound
from app.run import run_experiment
from fedgraphcore.session import ClientInfo, ServerSession
from fedgraphcore.wire import ProtocolError
from strategies.fedkmeans import FedKMeans
from strategies.fedspectral import FedSpectral, FedSpectralPlus
from app import registry


@pytest.fixture
def graph_files(tmp_path):
    """An edgeless graph with features, and a ring whose features hold one NaN (row 3, column 2)."""
    rng = np.random.default_rng(0)
    n = 40
    y = np.arange(n) % 3
    np.savez(tmp_path / "edgeless.npz", edge_index=np.zeros((2, 0), dtype=np.int64), num_nodes=np.array(n),
             x=rng.normal(size=(n, 5)), y=y)
    x = rng.normal(size=(n, 5))
    x[3, 2] = np.nan
    ring = np.array([[i, (i + 1) % n] for i in range(n)]).T
    np.savez(tmp_path / "nan.npz", edge_index=ring, num_nodes=np.array(n), x=x, y=y)
    return tmp_path


@pytest.mark.parametrize("strategy,file,message", [
    ("fedspectral-plus", "edgeless.npz", "dataset '{d}/edgeless.npz' has no edges; strategy 'fedspectral-plus' needs "
                                         "them; valid: a dataset with edges, e.g. karate, sbm, cora"),
    ("fedspectral", "edgeless.npz", "dataset '{d}/edgeless.npz' has no edges; strategy 'fedspectral' needs them; "
                                    "valid: a dataset with edges, e.g. karate, sbm, cora"),
    ("kcagc", "nan.npz", "{d}/nan.npz: x row 3, column 2 is not a finite number; valid: finite features of magnitude at "
                           "most 1e+150"),
    ("fedkmeans", "nan.npz", "{d}/nan.npz: x row 3, column 2 is not a finite number; valid: finite features of magnitude at "
                           "most 1e+150"),
])
def test_data_the_method_cannot_use_is_one_line_before_the_run(graph_files, strategy, file, message, tmp_path):
    with pytest.raises(ConfigError) as err:
        run_experiment(strategy, str(graph_files / file), 2, {}, str(tmp_path / "out"), "inprocess")
    assert str(err.value) == message.format(d=graph_files)
    assert not (tmp_path / "out" / "result.json").exists()


def test_a_garbage_email_eu_core_file_names_the_line(tmp_path):
    raw = tmp_path / "snap" / "email-Eu-core" / "raw"
    raw.mkdir(parents=True)
    (raw / "email-Eu-core.txt").write_text("a b\nc d\n")
    (raw / "email-Eu-core-department-labels.txt").write_text("0 1\n1 x\n")
    with pytest.raises(ConfigError) as err:
        run_experiment("fedspectral", "email-eu-core", 2, {"data-root": str(tmp_path)}, str(tmp_path / "out"),
                       "inprocess")
    assert str(err.value) == (f"dataset 'email-eu-core': {raw}/email-Eu-core.txt: line 1 names node 'a', which "
                              f"{raw}/email-Eu-core-department-labels.txt does not list; valid: node IDs of the node "
                              "table")


def test_karate_over_100_clients_stops_fedspectral_at_the_handshake(tmp_path):
    """78 edges over 100 clients: 45 clients hold none, 96% of the rows are isolated in their shard;
    fedspectral clusters each shard's graph, so it stops (it wrote ARI 0.015 vs 0.77 before)."""
    with pytest.raises(ProtocolError) as err:
        run_experiment("fedspectral", "karate", 100, {}, str(tmp_path / "out"), "inprocess")
    assert str(err.value).startswith("96% of the clients' rows have no edge in their own shard and clients 3, 4, 7, "
                                     "8, 9, 14, 15, 24 and 37 more hold none at all: strategy 'fedspectral' clusters "
                                     "each shard's own graph, and these carry almost no structure (over 90%)")
    assert not (tmp_path / "out" / "result.json").exists()


def test_weak_support_is_a_warning_in_the_summary_and_result_json(tmp_path, caplog):
    """karate over 8 clients: 59% of the rows isolated in their shard: the run goes on and says so."""
    result = run_experiment("fedspectral", "karate", 8, {"reference": False}, str(tmp_path / "out"), "inprocess")
    warning = ("59% of the clients' rows have no edge in their own shard: strategy 'fedspectral' clusters each "
               "shard's own graph, so the result rests on little structure; fewer clients give each more edges")
    assert result["quality"]["notes"][0] == warning
    assert json.loads((tmp_path / "out" / "result.json").read_text())["quality"]["notes"][0] == warning
    assert f"note: {warning}" in caplog.text
    assert f"warning: {warning}" in caplog.text


def _client(pid: int, rows: int, edges: int, isolated: int, partitioner: str = "edge", graphs: int = 0):
    return ClientInfo(100 + pid, pid, {"partitioner": partitioner, "num_rows": rows, "num_edges": edges,
                                       "num_isolated": isolated, "num_graphs": graphs, "shard_cut": ""})


def test_check_shards_stops_on_an_empty_shard_and_an_edgeless_structure_run():
    with pytest.raises(ProtocolError, match=r"^client 1 holds no rows: an empty shard; valid: fewer clients"):
        FedKMeans.check_shards([_client(0, 5, 0, 5, "node-random"), _client(1, 0, 0, 0, "node-random")])
    with pytest.raises(ProtocolError, match=r"^clients 0, 1 hold no graphs"):
        registry.get("gw-ldp").strategy.check_shards([_client(i, 0, 0, 0, "graph-dirichlet") for i in range(2)])
    with pytest.raises(ProtocolError, match=r"^no client holds an edge in its shard; strategy 'fedspectral-plus' clusters by"):
        FedSpectralPlus.check_shards([_client(i, 10, 0, 10) for i in range(2)])
    # fedspectral-plus sums the shards' products exactly: isolated rows in a shard are no warning
    assert FedSpectralPlus.check_shards([_client(0, 10, 1, 8), _client(1, 10, 0, 10)]) == []
    assert FedSpectral.check_shards([_client(0, 10, 9, 1), _client(1, 10, 9, 1)]) == []
    assert "client 1 holds none at all" in FedSpectral.check_shards([_client(0, 10, 9, 0), _client(1, 10, 0, 10)])[0]
    assert FedKMeans.check_shards([_client(i, 10, 0, 10, "node-random") for i in range(2)]) == []


@pytest.fixture(scope="module")
def small_sbm():
    return load_dataset("sbm", seed=0, nodes=120, blocks=3, p_in=0.2, p_out=0.01, features=4)


def _write_cut(sbm, seed: int, out):
    write_shards(partition(sbm, "node-random", 2, seed=seed), out,
                 {"seed": seed, "params": {}, "dataset_params": {}, "data_hash": data_hash(sbm)})
    return [{"shard": str(out / f"client-{i}.npz")} for i in range(2)]


def test_shard_files_of_different_cuts_are_refused_at_the_hello(small_sbm, tmp_path):
    """Client 0 from the seed-0 cut, client 1 from the seed-1 cut: each file is sound on its own,
    together they hold some nodes twice and miss others; the hello names both cuts."""
    first, second = _write_cut(small_sbm, 0, tmp_path / "a"), _write_cut(small_sbm, 1, tmp_path / "b")
    raw = {"strategy": "fedkmeans", "dataset": "sbm", "num-clients": 2, "partitioner": "node-random",
           "sbm.nodes": 120, "sbm.blocks": 3, "sbm.p-in": 0.2, "sbm.p-out": 0.01, "sbm.features": 4,
           "reference": False, "out-dir": str(tmp_path / "out")}
    from app.client_app import build_client_app
    from app.server_app import run_server

    grid = InProcessGrid(build_client_app(raw), 2, [first[0], second[1]])
    with pytest.raises(ProtocolError) as err:
        run_server(grid, raw)
    digest = data_hash(small_sbm)[:12]
    assert str(err.value).startswith(f"the clients' shards come from different cuts of the data (client 0: seed 0, "
                                     f"data {digest}, parameters ")
    assert f"; client 1: seed 1, data {digest}, parameters " in str(err.value)
    assert str(err.value).endswith("valid: the shard files of one python -m app.data.prepare run")
    assert not (tmp_path / "out").exists()


def test_an_occupied_out_dir_stops_the_server_app_before_the_first_message(tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    (out / "result.json").write_text("{}")
    from app.server_app import run_server

    def no_connect(self):
        raise AssertionError("the run connected before checking its out-dir")

    monkeypatch.setattr(ServerSession, "connect", no_connect)
    with pytest.raises(ConfigError) as err:
        run_server(None, {"strategy": "fedkmeans", "dataset": "iris", "num-clients": 2, "out-dir": str(out)})
    assert str(err.value) == f"out-dir {str(out)!r} already holds a result.json; valid: a new or empty directory"


def test_statistics_bound_grows_with_the_rows():
    assert statistics_bound(1_000_000, 1e6) == 1e12
    assert statistics_bound(0, 0.5) == 1.0  # the count's 1 per row


def test_a_derived_bound_beyond_the_ring_at_secagg_scale_gets_a_coarser_scale():
    config = registry.validate({"strategy": "fedkmeans", "dataset": "iris", "num-clients": 4})
    session = ServerSession(None, config)
    session.clients = [_client(i, 1, 0, 1) for i in range(4)]
    session._secagg_ready = True
    values = session.secagg_values("stats", 1e15)
    assert values["secagg_scale"] < float(config["secagg.scale"])
    FixedPointEncoder(values["secagg_scale"], values["secagg_bound"], 4)  # fits the 64-bit ring
    assert session.secagg_values("stats", 1e6)["secagg_scale"] == float(config["secagg.scale"])
    with pytest.raises(ProtocolError, match="does not fit the 64-bit ring even at resolution 1"):
        session.secagg_values("stats", 1e19)


def test_secure_fedkmeans_equals_plain_with_sums_far_beyond_secagg_bound(tmp_path):
    """secagg.bound=100 per row (each feature and squared distance below it); each client's counts (600),
    sums and inertia exceed it: the step's bound is its rows x 100, so nothing is clipped and the secure
    run equals the plain one."""
    common = {"sbm.nodes": 1200, "sbm.p-in": 0.01, "sbm.p-out": 0.001, "secagg.bound": 100.0, "reference": False}
    plain = run_experiment("fedkmeans", "sbm", 2, common, str(tmp_path / "plain"), "inprocess")
    secure = run_experiment("fedkmeans", "sbm", 2, {**common, "fedkmeans.secure": True}, str(tmp_path / "secure"),
                            "inprocess")
    assert len(secure["history"]) == len(plain["history"])
    for a, b in zip(plain["history"], secure["history"]):
        assert a["inertia"] == pytest.approx(b["inertia"], rel=1e-6)
    assert np.array_equal(np.load(tmp_path / "plain" / "labels.npy"), np.load(tmp_path / "secure" / "labels.npy"))
