"""Flower's simulation engine (Ray actors) runs each method's client code as the in-process grid does.

The in-process runs on Flower's engine are one test: the process starts Ray and its ClientApp actors
once and every later run uses them again (:mod:`app.engine`), so each run after the first costs its
protocol, not an actor's start-up; run as tests of their own, xdist's workers each started a Ray of
their own side by side. The CLI's own simulation run (a process of its own) is in tests/test_fedavg_dmon.py."""

from __future__ import annotations

import numpy as np
import pytest

from app import engine
from app.run import run_experiment
from fedgraphcore.config import ConfigError
from fedgraphcore.protocols import fedsc

pytestmark = pytest.mark.simulation


def fedsc_labels_and_objective_equal_the_in_memory_protocol(out):
    from test_fedsc import iris_blocks

    result = run_experiment("fedsc", "iris", 2, {"num-rounds": 2, "fedsc.landmarks": 10}, out, engine="simulation")
    assert result["num_clients"] == 2 and len(result["history"]) == 2
    _, shards, xs = iris_blocks(2)
    expected = fedsc.simulate(xs, 3, 0, rounds=2, landmarks=10)
    ids = np.concatenate([s.node_ids for s in shards])
    assert np.array_equal(np.load(out / "labels.npy")[ids], expected["labels"])
    assert [h["objective"] for h in result["history"]] == pytest.approx(expected["objective"], rel=1e-9)


def a_run_time_config_error_is_raised_and_writes_no_result(out, monkeypatch):
    """Flower's engine only logs the ServerApp's error (which runs in this process, the clients in
    Ray's); run_experiment raises it, and no result.json appears. (An earlier result in the out-dir is
    refused before the run: test_cli_refuses_an_out_dir_that_holds_a_result...)"""
    from strategies.fedkmeans import FedKMeans

    def refuse(self, session):
        raise ConfigError("found only once the run started")

    with monkeypatch.context() as patched:
        patched.setattr(FedKMeans, "run", refuse)
        with pytest.raises(ConfigError, match="^found only once the run started$"):
            run_experiment("fedkmeans", "karate", 2, {}, out, engine="simulation")
    assert not (out / "result.json").exists()


def kcagc_gives_the_in_process_labels(sim, ref):
    from test_kcagc import SBM

    common = {**SBM, "kcagc.filter-order": 2, "kcagc.local-factor": 2, "kcagc.restarts": 2}
    simulated = run_experiment("kcagc", "sbm", 2, common, sim, engine="simulation")
    in_process = run_experiment("kcagc", "sbm", 2, common, ref)
    assert simulated["num_clients"] == 2 and simulated["communication"]["rejected"] == []
    assert np.array_equal(np.load(sim / "labels.npy"), np.load(ref / "labels.npy"))
    assert simulated["metrics"]["virtual_nodes"] == in_process["metrics"]["virtual_nodes"]
    assert simulated["communication"]["secure_aggregations"] == in_process["communication"]["secure_aggregations"] > 0


def fedspectral_secure_exact_run_uploads_only_masked_blocks(out):
    from test_fedspectral import K, exact

    over = exact(**{"fedspectral-plus.secure": True, "partition.replicas": 2, "secagg.scale": 2.0**32,
                    "fedspectral-plus.tol": 1e-4, "fedspectral-plus.degree": 4})
    result = run_experiment("fedspectral-plus", "sbm", 2, over, out, engine="simulation")
    assert result["reference"]["agreement"]["ari"] == 1.0
    uploads = [u for u in result["privacy"]["uploads"] if u["action"].startswith("fedspectral")]
    assert {u["name"] for u in uploads} == {"block", "degrees"}
    for u in uploads:  # every array a client sent: masked uint64, N rows, never an edge list
        assert u["masked"] and u["dtype"] == "uint64" and u["shape"][0] == 300
        assert u["shape"] in ([300], [300, 2 * K])


def test_each_methods_clients_run_on_ray_actors_as_in_process(tmp_path, monkeypatch):
    """FedSC's labels and objective are the in-memory protocol's; a ServerApp's error stops its run
    with that error, and the next run goes on; kCAGC's labels are the in-process run's; FedSpectral+'s
    secure exact run uploads masked blocks only. Ray (and its actors) ends after the last run."""
    try:
        fedsc_labels_and_objective_equal_the_in_memory_protocol(tmp_path / "fedsc")
        a_run_time_config_error_is_raised_and_writes_no_result(tmp_path / "refused", monkeypatch)
        kcagc_gives_the_in_process_labels(tmp_path / "kcagc-sim", tmp_path / "kcagc-ref")
        fedspectral_secure_exact_run_uploads_only_masked_blocks(tmp_path / "fedspectral")
    finally:
        engine.stop_ray()  # not left idle beside the worker's later tests
