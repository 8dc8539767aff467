"""fedavg-dmon: FedAvg of DMoN weights over node-partitioned subgraphs.

Protocol math is tested directly (edge split, FedAvg weighting, local training
against fedgraphcore.models.train_dmon); the Flower layer end to end on the
in-process grid (same ServerApp/ClientApp code, no Ray).
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from fedgraphcore.models import train_dmon
from fedgraphcore.config import ConfigError
from fedgraphcore.data import load_dataset
from fedgraphcore.metrics import ari
from fedgraphcore.protocols import fedavg_dmon
from app.run import run_experiment
from clients.fedavg_dmon import FedAvgDMoNClient
from conftest import check_page

torch.set_num_threads(1)  # the clients run with one thread; bitwise comparisons need the same

#: the paper's setting (clients lose the edges between them; boundary mode: test_fedavg_dmon_boundary.py)
FAST = {"reference": False, "fedavg-dmon.lr": 1e-2, "partition.boundary": False}


# --------------------------------------------------------------------------- protocol math


def test_edge_split_is_a_symmetric_disjoint_partition_restricted_consistently():
    data = load_dataset("karate")
    n = data.num_nodes
    train, val, test = fedavg_dmon.split_adjacency(data.adj, np.arange(n), seed=4, val=0.1, test=0.2)
    assert (train + val + test - data.adj).nnz == 0
    for part in (train, val, test):
        assert (part - part.T).nnz == 0
    assert train.multiply(val).nnz == 0 and train.multiply(test).nnz == 0 and val.multiply(test).nnz == 0
    # a client's split is the restriction of the global split to its nodes
    ids = np.array([0, 2, 5, 7, 8, 13, 30, 32, 33])
    local = fedavg_dmon.split_adjacency(data.adj[ids][:, ids], ids, seed=4, val=0.1, test=0.2)
    for glob, loc in zip((train, val, test), local):
        assert (glob[ids][:, ids] - loc).nnz == 0
    # proportions on a larger graph (the embedded SBM, so the test needs no data files)
    sbm = load_dataset("sbm")
    parts = fedavg_dmon.split_adjacency(sbm.adj, np.arange(sbm.num_nodes), seed=0, val=0.1, test=0.2)
    fractions = np.array([p.nnz for p in parts]) / sbm.adj.nnz
    assert fractions == pytest.approx([0.7, 0.1, 0.2], abs=0.02)
    with pytest.raises(ValueError, match="invalid edge split"):
        fedavg_dmon.edge_split_codes(np.array([0]), np.array([1]), 0, 0.5, 0.5)


@pytest.mark.parametrize("clients", [2, 5])
def test_overlap_half_gives_each_client_the_authors_share_of_nodes(clients):
    """Figure 2 setting: the authors' ``random_overlapping`` gives every client 1.5 N/C nodes;
    ``partition.overlap=0.5`` must do the same (ownership and copies: test_data_partition)."""
    from fedgraphcore.data.partition import partition

    graph = load_dataset("sbm")  # embedded: the rule does not depend on the graph
    shards = partition(graph, "node-random", clients, seed=0, overlap=0.5)
    sizes = np.array([s.node_ids.size for s in shards])
    assert sizes.sum() == round(1.5 * graph.num_nodes)
    assert np.all(np.abs(sizes - 1.5 * graph.num_nodes / clients) < 0.1 * graph.num_nodes / clients)


def test_fedavg_weights_by_node_count_exactly():
    rng = np.random.default_rng(0)
    shapes = fedavg_dmon.param_shapes(5, 3, 4)
    clients = [{n: rng.normal(size=s).astype(np.float32) for n, s in shapes.items()} for _ in range(3)]
    counts = [10, 30, 60]
    avg = fedavg_dmon.fedavg(clients, counts)
    for name in fedavg_dmon.PARAM_NAMES:
        want = sum(c / 100 * w[name].astype(np.float64) for c, w in zip(counts, clients)).astype(np.float32)
        assert avg[name].dtype == np.float32 and np.array_equal(avg[name], want)
        assert not np.allclose(avg[name], np.mean([w[name] for w in clients], axis=0))  # not unweighted
    # one client, or identical clients: the weights come back bit for bit
    assert all(np.array_equal(fedavg_dmon.fedavg([clients[0]], [7])[n], clients[0][n]) for n in shapes)
    same = fedavg_dmon.fedavg([clients[1]] * 3, counts)
    assert all(np.array_equal(same[n], clients[1][n]) for n in shapes)
    with pytest.raises(ValueError, match="node counts"):
        fedavg_dmon.fedavg(clients[:2], [1, 0])
    flat = fedavg_dmon.flatten(clients[0])
    assert all(np.array_equal(fedavg_dmon.unflatten(flat, shapes)[n], clients[0][n]) for n in shapes)


def test_local_rounds_equal_centralised_training_step_for_step():
    data = load_dataset("sbm", seed=2)
    k, seed, rounds, epochs = 4, 5, 4, 3
    train, _, _ = fedavg_dmon.split_adjacency(data.adj, np.arange(data.num_nodes), seed, 0.1, 0.2)
    labels, model = train_dmon(data.x, train, k, seed, epochs=rounds * epochs, sparse_features=True)
    graph = fedavg_dmon.make_graph(data.x, train, sparse_features=True)
    weights = fedavg_dmon.init_weights(data.x.shape[1], k, seed)
    state = fedavg_dmon.start_state(weights, seed, 0, k, 64, 0.5)
    losses = []
    for _ in range(rounds):
        weights = fedavg_dmon.fedavg([state.weights], [data.num_nodes])
        state, got = fedavg_dmon.local_train(state, graph, k, epochs, weights=weights)
        losses += got
    central = fedavg_dmon.get_weights(model)
    assert all(np.array_equal(state.weights[n], central[n]) for n in fedavg_dmon.PARAM_NAMES)
    assert losses == model.loss_history
    assert np.array_equal(fedavg_dmon.assign(state.weights, graph, k), labels)
    # resetting Adam every round is a different algorithm: the test can tell
    state = fedavg_dmon.start_state(fedavg_dmon.init_weights(data.x.shape[1], k, seed), seed, 0, k, 64, 0.5)
    reset = []
    for _ in range(rounds):
        state, got = fedavg_dmon.local_train(state, graph, k, epochs, keep_optimizer=False)
        reset += got
    assert reset[:epochs] == model.loss_history[:epochs] and reset != model.loss_history


# --------------------------------------------------------------------------- end to end


def test_one_client_federated_equals_centralised_dmon(out_dir, tmp_path):
    rounds, epochs, seed = 6, 4, 3
    cfg = {**FAST, "seed": seed, "num-rounds": rounds, "fedavg-dmon.local-epochs": epochs,
           "fedavg-dmon.select": "last"}
    fed = run_experiment("fedavg-dmon", "sbm", 1, cfg, out_dir)
    cen = run_experiment("fedavg-dmon", "sbm", 1, {**cfg, "fedavg-dmon.mode": "centralised"}, tmp_path / "c")
    data = load_dataset("sbm", seed=seed)
    train, _, _ = fedavg_dmon.split_adjacency(data.adj, np.arange(data.num_nodes), seed, 0.1, 0.2)
    labels, model = train_dmon(data.x, train, fed["config"]["num-clusters"], seed, epochs=rounds * epochs,
                               lr=1e-2, sparse_features=True)
    assert [v for h in fed["history"] for v in h["losses"]] == model.loss_history
    assert [v for h in cen["history"] for v in h["losses"]] == model.loss_history
    assert np.array_equal(np.load(out_dir / "labels.npy"), labels)
    assert np.array_equal(np.load(tmp_path / "c" / "labels.npy"), labels)
    assert fed["timing"]["rounds"] == rounds + 1  # train rounds, assign (the sizes came with hello)


def test_federated_dmon_recovers_planted_blocks_and_reports_per_client(out_dir):
    result = run_experiment("fedavg-dmon", "sbm", 3, {**FAST, "num-rounds": 15}, out_dir)
    m = result["metrics"]
    assert m["ari"] > 0.8 and m["client_mean_f1"] > 0.85
    assert [c["client"] for c in m["clients"]] == [0, 1, 2]
    assert {"f1", "nmi", "modularity_test", "conductance_test"} <= set(m["clients"][0])
    # the weights with the best validation modularity: a round's, or the final weights' (round 16)
    scores = [h["val_modularity"] for h in result["history"]]
    assert m["selected_round"] in (int(np.argmax(scores)) + 1, 16)
    assert result["history"][-1]["val_modularity"] > result["history"][0]["val_modularity"]
    uploads = {(u["action"], u["name"]) for u in result["privacy"]["uploads"]}
    assert ("dmon_train", "conv.lin.weight") in uploads and ("dmon_assign", "labels") in uploads
    # isolated: the same rounds, but no weights ever leave a client
    iso = run_experiment("fedavg-dmon", "sbm", 3, {**FAST, "num-rounds": 3, "fedavg-dmon.mode": "isolated"},
                         out_dir.parent / "iso")
    names = {u["name"] for u in iso["privacy"]["uploads"] if u["action"] == "dmon_train"}
    assert names and not names & set(fedavg_dmon.PARAM_NAMES)
    assert iso["metrics"]["selected_round"] is None


@pytest.mark.shipped_defaults
def test_bad_weight_uploads_are_excluded_and_reported(out_dir, monkeypatch):
    honest = FedAvgDMoNClient.on_dmon_train

    def faulty(self, arrays, values):
        reply, vals = honest(self, arrays, values)
        if self.shard.client_id == 1:
            reply["head.bias"] = np.full_like(reply["head.bias"], np.nan)
        if self.shard.client_id == 2:
            reply["conv.bias"] = reply["conv.bias"][:-1]
        return reply, vals

    monkeypatch.setattr(FedAvgDMoNClient, "on_dmon_train", faulty)
    result = run_experiment("fedavg-dmon", "sbm", 3, {**FAST, "num-rounds": 2}, out_dir)
    rejected = result["communication"]["rejected"]
    assert len(rejected) == 2 and {r["action"] for r in rejected} == {"dmon_train"}
    reasons = " ".join(r["reason"] for r in rejected)
    assert "'head.bias' contains NaN" in reasons and "'conv.bias' has shape (63,)" in reasons
    # excluded from the average in round 1, then dropped by the session for the rest of the run
    assert [h["excluded"] for h in result["history"]] == [[1, 2], []]
    html = check_page(out_dir, figures=3)  # the page names who was refused, and why
    assert html.count("<td>rejected</td>") == 2 and "contains NaN" in html
    assert result["metrics"]["dropped_clients"] == [1, 2]
    assert [c["client"] for c in result["metrics"]["clients"]] == [0]
    assert np.isfinite(result["metrics"]["f1"]) and 0 < result["metrics"]["coverage"] < 1


def restart_run(out_dir, **changed_config):
    """fedavg-dmon on sbm, 3 clients, 5 rounds: client 2's SuperNode goes down before round 2
    and starts again before round 3."""
    from app.client_app import build_client_app
    from app.server_app import run_server
    from conftest import RestartingGrid

    raw = {"strategy": "fedavg-dmon", "dataset": "sbm", "num-clients": 3, "num-rounds": 5, "min-clients": 2,
           "out-dir": str(out_dir), **FAST}
    grid = RestartingGrid(build_client_app(raw), 3, leave_at=2, back_at=3, action=fedavg_dmon.DMON_TRAIN,
                          category="train", changed_config=changed_config)
    return run_server(grid, raw)


def train_replies(result) -> list[int]:
    return [r["replies"] for r in result["timing"]["per_round"] if r["action"] == fedavg_dmon.DMON_TRAIN]


def test_a_client_whose_supernode_restarts_is_taken_back_into_the_run(out_dir):
    result = restart_run(out_dir)
    # gone in round 2; back during round 3's request, so greeted again and averaged in from round 4
    assert [h["excluded"] for h in result["history"]] == [[], [2], [], [], []]
    assert train_replies(result) == [3, 2, 2, 3, 3]
    (back,) = result["communication"]["rejoined"]
    assert back["client"] == 2 and back["left_round"] < back["round"]
    assert result["communication"]["dropped"] == [] and result["metrics"]["dropped_clients"] == []
    assert [c["client"] for c in result["metrics"]["clients"]] == [0, 1, 2]
    assert (np.load(out_dir / "labels.npy") >= 0).all()  # its nodes are labelled too


def test_a_supernode_that_comes_back_with_another_shard_stays_out(out_dir):
    result = restart_run(out_dir, **{"partition-id": 0})
    assert train_replies(result) == [3, 2, 2, 2, 2]
    assert result["communication"]["rejoined"] == []
    (gone,) = result["communication"]["dropped"]
    assert gone["client"] == 2 and gone["reason"].startswith("came back with a different shard (")
    assert "partition_id" in gone["reason"] and result["metrics"]["dropped_clients"] == [2]


@pytest.mark.parametrize(
    "tamper, reason",
    [
        (lambda o: {**o, "owned": o["owned"][1:]},
         r"arrays of the same items differ in length: 'node_ids' (\d+), 'labels' \1, 'owned' (?!\1)\d+"),
        (lambda o: {**o, "labels": o["labels"] - 1}, r"array 'labels' has values in \[-1, \d\], expected \[0, 4\)"),
        (lambda o: {**o, "node_ids": o["node_ids"] * 0}, r"array 'node_ids' repeats entries"),
    ],
    ids=["short-owned", "negative-label", "repeated-id"],
)
def test_malformed_final_labels_stop_the_run_naming_the_client(out_dir, monkeypatch, tamper, reason):
    from fedgraphcore.wire import ProtocolError
    from conftest import patch_reply

    patch_reply(monkeypatch, FedAvgDMoNClient, "dmon_assign", lambda shard, out, vals: (tamper(out), vals), client=1)
    with pytest.raises(ProtocolError, match=r"step 'dmon_assign' rejected 1 client\(s\): client 1 .*" + reason):
        run_experiment("fedavg-dmon", "sbm", 2, {**FAST, "num-rounds": 1}, out_dir)


def test_owned_ids_that_cannot_be_the_clients_stop_the_run(out_dir, monkeypatch):
    from fedgraphcore.wire import ProtocolError
    from conftest import patch_reply

    # client 1 claims to own the first nodes, which client 0 owns
    patch_reply(monkeypatch, FedAvgDMoNClient, "dmon_assign",
                lambda shard, out, vals: ({**out, "node_ids": np.arange(out["node_ids"].size)}, vals), client=1)
    with pytest.raises(ProtocolError, match=r"^step 'dmon_assign': item ids that cannot be the client's: client 0: "
                                            r"\d+ ids another client also sent; client 1: \d+ ids another"):
        run_experiment("fedavg-dmon", "sbm", 2, {**FAST, "num-rounds": 1}, out_dir)


@pytest.mark.parametrize("tamper, reason", [
    (lambda v: {**v, "losses": v["losses"][1:]}, r"value 'losses' is \[.*\], expected a list of 5 numbers"),
    (lambda v: {**v, "losses": "x"}, r"value 'losses' is 'x', expected a list of 5 numbers"),
    (lambda v: {**v, "val_modularity": 1e9}, r"value 'val_modularity' is 1000000000.0, expected numbers in "
                                             r"\[-0.5, 1.0\]"),
    (lambda v: {**v, "val_edges": 2.5}, r"value 'val_edges' is 2.5, expected whole numbers"),
], ids=["short-losses", "text-losses", "modularity-above-1", "fractional-edges"])
def test_malformed_training_values_exclude_the_client_by_name(out_dir, monkeypatch, tamper, reason):
    """A client's score would steer model selection and its losses the history: a malformed one is
    excluded and reported, never averaged in (nor a crash naming nobody)."""
    from conftest import patch_reply

    patch_reply(monkeypatch, FedAvgDMoNClient, "dmon_train", lambda shard, out, vals: (out, tamper(vals)), client=1)
    result = run_experiment("fedavg-dmon", "sbm", 2, {**FAST, "num-rounds": 2}, out_dir)
    rejected = result["communication"]["rejected"]
    assert len(rejected) == 1 and rejected[0]["action"] == "dmon_train"
    assert re.search(reason, rejected[0]["reason"])
    assert [h["excluded"] for h in result["history"]] == [[1], []]
    assert result["metrics"]["dropped_clients"] == [1]


SCORES = {"val_modularity", "val_edges", "losses"}


def test_dp_fedavg_records_epsilon_and_secure_aggregation_masks(out_dir, tmp_path):
    cfg = {**FAST, "num-rounds": 3, "fedavg-dmon.dp-clip": 1.0, "fedavg-dmon.dp-epsilon": 8.0,
           "fedavg-dmon.secure": True, "fedavg-dmon.select": "last"}
    result = run_experiment("fedavg-dmon", "sbm", 2, cfg, out_dir)
    privacy = result["privacy"]
    mech = {m["name"]: m for m in privacy["mechanisms"]}
    assert "dp-fedavg" in mech and "secure-aggregation" in mech
    assert mech["dp-fedavg"]["params"]["steps"] == 3
    assert result["metrics"]["dp_epsilon"] == pytest.approx(8.0, rel=0.05)
    weights = [u for u in privacy["uploads"] if u["action"] == "dmon_train" and u["name"] == "weights"]
    assert [u["count"] for u in weights] == [3, 3]
    assert all(u["masked"] and u["noised"] and u["dtype"] == "uint64" for u in weights)
    # the masked noised vector is all a client sends in a training round
    assert {u["name"] for u in privacy["uploads"] if u["action"] == "dmon_train"} == {"weights"}
    assert result["communication"]["secure_aggregations"] == 3
    # secure aggregation without noise gives the plain FedAvg model up to fixed-point rounding
    plain = run_experiment("fedavg-dmon", "sbm", 2, {**FAST, "num-rounds": 3}, tmp_path / "p")
    masked = run_experiment("fedavg-dmon", "sbm", 2, {**FAST, "num-rounds": 3, "fedavg-dmon.secure": True},
                            tmp_path / "m")
    assert ari(np.load(tmp_path / "p" / "labels.npy"), np.load(tmp_path / "m" / "labels.npy")) > 0.99
    assert masked["history"][-1]["val_modularity"] == pytest.approx(plain["history"][-1]["val_modularity"], abs=1e-3)


def test_dp_sends_only_noised_weights_and_selects_the_last_round(out_dir):
    """Under client-level DP no validation score or loss leaves a client (the noise does not
    cover them): the ledger's uploads hold only the noised weights in the training rounds."""
    rounds = 2
    cfg = {**FAST, "num-rounds": rounds, "fedavg-dmon.dp-clip": 1.0, "fedavg-dmon.dp-noise": 1.0,
           "fedavg-dmon.select": "last"}
    result = run_experiment("fedavg-dmon", "sbm", 2, cfg, out_dir)
    uploads = result["privacy"]["uploads"]
    train = [u for u in uploads if u["action"] == "dmon_train"]
    assert {u["name"] for u in train} == set(fedavg_dmon.PARAM_NAMES)
    assert all(u["noised"] and u["count"] == rounds for u in train)
    assert not {u["action"] for u in uploads} & {"dmon_eval"}
    hello = {u["name"] for u in uploads if u["action"] == "hello"}
    assert {"num_features", "num_rows"} <= hello  # the sizes in clear, named in the ledger
    assign = {u["name"] for u in uploads if u["action"] == "dmon_assign"}
    assert "val_modularity" not in assign and {"labels", "f1", "modularity_test"} <= assign
    protects = {m["name"]: m["protects"] for m in result["privacy"]["mechanisms"]}["dp-fedavg"]
    assert "node count, sent once in clear" in protects and "evaluation outputs" in protects
    assert [(h["val_modularity"], h["loss"], h["losses"]) for h in result["history"]] == [(None, None, None)] * rounds
    assert result["metrics"]["selected_round"] == rounds + 1 and result["metrics"]["dp_epsilon"] > 0
    # without DP the same run reports the scores every round
    plain = run_experiment("fedavg-dmon", "sbm", 2, {**FAST, "num-rounds": 1}, out_dir.parent / "plain")
    assert SCORES <= {u["name"] for u in plain["privacy"]["uploads"] if u["action"] == "dmon_train"}
    assert plain["history"][0]["val_modularity"] is not None and len(plain["history"][0]["losses"]) == 5


def test_client_and_server_build_one_dp_mechanism():
    from app import registry
    from fedgraphcore.privacy.gaussian import calibrate_noise_multiplier
    from strategies.fedavg_dmon import FedAvgDMoN

    config = registry.validate({"strategy": "fedavg-dmon", "dataset": "sbm", "num-rounds": 4,
                                "partition.boundary": False, "fedavg-dmon.dp-clip": 0.5, "fedavg-dmon.dp-epsilon": 6.0,
                                "fedavg-dmon.select": "last"})
    client = FedAvgDMoNClient(None, config, None)._mechanism
    server = fedavg_dmon.dp_mechanism(FedAvgDMoN(config).cfg, 4)
    calibrated = calibrate_noise_multiplier(6.0, 1e-5, 4, adjacency="replace")
    assert client.noise_multiplier == server.noise_multiplier == calibrated
    assert (client.clip, client.adjacency) == (server.clip, server.adjacency) == (0.5, "replace")


def test_client_refuses_validation_score_under_dp():
    from fedgraphcore.privacy.policy import PrivacyRefusal

    from app import registry

    config = registry.validate({"strategy": "fedavg-dmon", "dataset": "sbm", "fedavg-dmon.dp-clip": 0.5,
                                "fedavg-dmon.select": "last", "partition.boundary": False})
    client = FedAvgDMoNClient(None, config, None)
    with pytest.raises(PrivacyRefusal, match="rule 'fedavg-dmon.dp-clip': dmon_eval refused"):
        client.on_dmon_eval({}, {"k": 2})


@pytest.mark.parametrize("overrides, message", [
    ({"fedavg-dmon.mode": "centralised"}, "needs num-clients=1"),
    ({"fedavg-dmon.mode": "isolated", "fedavg-dmon.dp-clip": 1.0}, "mode=federated only"),
    ({"fedavg-dmon.val-fraction": 0.5, "fedavg-dmon.test-fraction": 0.5}, "must be < 1"),
    ({"fedavg-dmon.val-fraction": 0.0}, "needs fedavg-dmon.val-fraction > 0"),
    ({"fedavg-dmon.dp-clip": 1.0}, r"select=val-modularity is not available with fedavg-dmon.dp-clip=1.0 .*"
                                   r"valid choices: select=last, or dp-clip=0"),
    ({"fedavg-dmon.mode": "split"}, "valid choices: federated, isolated, centralised"),
    ({"fedavg-dmon.dp-epsilon": 1.0}, r"fedavg-dmon.dp-epsilon=1.0 needs fedavg-dmon.dp-clip > 0 .* valid choices: "
                                      r"set dp-clip > 0, or dp-epsilon=0"),
    ({"partitioner": "edge"}, "valid choices: auto, node-random"),
])
def test_bad_config_is_one_line_error(out_dir, overrides, message):
    with pytest.raises(ConfigError, match=message) as err:
        run_experiment("fedavg-dmon", "sbm", 3, overrides, out_dir)
    assert "\n" not in str(err.value)
    assert not out_dir.exists()


@pytest.mark.simulation
def test_run_simulation_fedavg_dmon_on_karate(out_dir):
    """Flower's simulation engine end to end from the CLI (identity features: karate has none). The
    console holds only the app's own lines: Flower's deprecation notice, Ray's FutureWarning and what
    the Ray actors print (torch's torch.jit.script notice once per actor: the clients import PyG)
    stay out."""
    import json
    import subprocess
    import sys

    from conftest import HANG_GUARD_S, REPO

    sets = [arg for key, value in {**FAST, "num-rounds": 3}.items() for arg in ("--set", f"{key}={value}")]
    done = subprocess.run([sys.executable, "-m", "app.run", "--strategy", "fedavg-dmon", "--dataset", "karate",
                           "--num-clients", "2", *sets, "--out", str(out_dir)],
                          cwd=REPO, capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert done.returncode == 0, done.stderr
    for noise in ("deprecated", "Warning", "ClientAppActor", "Traceback"):
        assert noise not in done.stderr, done.stderr
    own = [line for line in done.stderr.splitlines() if line.strip()]
    assert own[0].endswith("val_modularity: the modularity of the model's clusters on held-out edges; the round "
                           "with the highest is kept")  # a figure is explained the first time it shows
    assert "round 1/3 | " in own[1]
    assert "INFO :      fedavg-dmon on karate with 2 clients (split 'node-random')" in own  # the summary's title
    result = json.loads((out_dir / "result.json").read_text())
    assert result["num_clients"] == 2 and len(result["history"]) == 3
    assert result["communication"]["rejected"] == []
    assert np.load(out_dir / "labels.npy").shape == (34,)
