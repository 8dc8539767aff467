"""``privacy.noise-seed``: a simulated or in-process run with privacy noise repeats byte for byte
(every strategy, run twice); without it the noise is fresh; a node with its own data refuses it."""

from __future__ import annotations

import json

import pytest

from app.client_app import build_client_app
from fedgraphcore.data import load_dataset
from fedgraphcore.data.partition import partition
from fedgraphcore.data.shards import data_hash, write_shards
from app.inprocess import InProcessGrid
from app.run import run_experiment
from app.server_app import run_server
from fedgraphcore.session import PrivacyRefused

SBM = {"sbm.nodes": 160, "sbm.blocks": 3, "sbm.p-in": 0.15, "sbm.p-out": 0.01, "sbm.features": 4, "num-rounds": 2}
#: strategy -> (dataset, clients, run-config): each small, with noise where the method has any
RUNS = {
    "fedkmeans": ("sbm", 2, {**SBM, "fedkmeans.filter-order": 1}),
    "kcagc": ("sbm", 2, {**SBM, "kcagc.filter-order": 2}),
    "kcagc-basic": ("sbm", 2, {**SBM, "kcagc.filter-order": 2}),
    "fedspectral": ("sbm", 2, SBM),
    "fedspectral-plus": ("sbm", 2, {**SBM, "fedspectral-plus.noise-multiplier": 1.0, "fedspectral-plus.rounds": 4}),
    "fedsc": ("iris", 2, {"num-clusters": 3, "num-rounds": 2, "fedsc.sigma": 1.0, "fedsc.landmarks": 8,
                          "fedsc.dp-epsilon": 5.0, "fedsc.data-noise": 0.1}),
    "fedavg-dmon": ("karate", 2, {"num-clusters": 2, "num-rounds": 2, "fedavg-dmon.local-epochs": 1,
                                  "fedavg-dmon.hidden": 4, "fedavg-dmon.dp-clip": 1.0, "fedavg-dmon.dp-noise": 1.0,
                                  "fedavg-dmon.select": "last", "partition.boundary": False}),
    "gw-ldp": ("karate", 2, {"partitioner": "khop", "khop.hops": 1, "khop.centres": 16, "gw-ldp.model": "gcn",
                             "num-clusters": 4, "num-rounds": 1, "gw-ldp.epsilon": 1.0, "gw-ldp.svc": False,
                             "gw-ldp.dp": "client", "gw-ldp.dp-clip": 1.0, "gw-ldp.dp-noise": 0.5}),
}


def outcome(out_dir) -> tuple[bytes, str]:
    """The labels' bytes and the result without its clock readings."""
    result = json.loads((out_dir / "result.json").read_text())
    kept = {key: result[key] for key in ("metrics", "history", "reference", "privacy")}
    kept["reference"] = {k: v for k, v in kept["reference"].items() if k != "time_s"}
    kept["metrics"] = {k: v for k, v in kept["metrics"].items() if not k.endswith("_s")}
    return (out_dir / "labels.npy").read_bytes(), json.dumps(kept, sort_keys=True, default=str)


@pytest.mark.parametrize("strategy", list(RUNS))
def test_a_seeded_run_repeats_byte_for_byte(strategy, tmp_path):
    dataset, clients, over = RUNS[strategy]
    over = {**over, "privacy.noise-seed": 11, "reference": False}  # the reference draws no privacy noise
    first = run_experiment(strategy, dataset, clients, over, tmp_path / "first")
    run_experiment(strategy, dataset, clients, over, tmp_path / "second")
    assert outcome(tmp_path / "first") == outcome(tmp_path / "second")
    if strategy in ("fedspectral-plus", "fedsc", "fedavg-dmon", "gw-ldp"):
        assert first["privacy"]["epsilon"] not in (None, 0, "none")  # the runs are noised


def test_without_a_seed_the_noise_is_fresh(tmp_path):
    dataset, clients, over = RUNS["fedspectral-plus"]
    over = {**over, "reference": False}
    first = run_experiment("fedspectral-plus", dataset, clients, over, tmp_path / "first")
    second = run_experiment("fedspectral-plus", dataset, clients, over, tmp_path / "second")
    assert first["history"] != second["history"]
    seeded = run_experiment("fedspectral-plus", dataset, clients, {**over, "privacy.noise-seed": 3}, tmp_path / "s")
    assert seeded["history"] not in (first["history"], second["history"])


def test_a_node_with_its_own_data_refuses_a_run_that_names_a_noise_seed(tmp_path):
    data = load_dataset("sbm", seed=0, nodes=160, blocks=3, p_in=0.15, p_out=0.01, features=4)
    write_shards(partition(data, "node-random", 2, seed=0), tmp_path / "shards",
                 {"seed": 0, "params": {}, "dataset_params": {}, "data_hash": data_hash(data)})
    nodes = [{"shard": str(tmp_path / "shards" / f"client-{i}.npz")} for i in range(2)]
    raw = {"strategy": "fedkmeans", "dataset": "sbm", "num-clients": 2, "partitioner": "node-random",
           **{k: v for k, v in SBM.items() if k.startswith("sbm.")}, "reference": False,
           "privacy.noise-seed": 5, "out-dir": str(tmp_path / "out")}
    with pytest.raises(PrivacyRefused) as refused:
        run_server(InProcessGrid(build_client_app(raw), 2, nodes), raw)
    message = str(refused.value)
    assert "\n" not in message and message.startswith("step 'hello' refused by the privacy policy of node")
    assert message.count("rule 'noise-seed'") == 2
    assert not (tmp_path / "out" / "result.json").exists()
