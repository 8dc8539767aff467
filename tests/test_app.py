"""The whole loop: ServerApp -> ClientApps -> ServerApp -> result.json.

Most runs use the in-process grid (same ServerApp/ClientApp code, no Ray);
one test goes through Flower's simulation engine (``run_simulation``).
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from sklearn.cluster import KMeans

from fedgraphcore.data import load_dataset
from fedgraphcore.metrics import ari
from fedgraphcore.protocols import fedkmeans
from fedgraphcore.result import RESULT_FILE
from app.client_app import build_client_app
from app.inprocess import InProcessGrid
from app.run import run_experiment
from app.server_app import run_server
from fedgraphcore.transport import unpack
from conftest import check_page, patch_reply

TOP_KEYS = {"strategy", "dataset", "num_clients", "config", "metrics", "reference", "timing",
            "communication", "privacy"}


def check_result_file(result: dict, out_dir) -> dict:
    on_disk = json.loads((out_dir / RESULT_FILE).read_text())
    assert TOP_KEYS <= set(on_disk)
    assert {"total_s", "protocol_s", "rounds"} <= set(on_disk["timing"])
    assert {"bytes_up", "bytes_down", "messages", "secure_aggregations"} <= set(on_disk["communication"])
    assert on_disk["metrics"] == pytest.approx(result["metrics"])
    assert np.load(out_dir / "labels.npy").shape[0] > 0
    return on_disk


@pytest.mark.shipped_defaults
def test_fedkmeans_inprocess_result_has_stable_schema(out_dir):
    result = run_experiment("fedkmeans", "sbm", 4, {"seed": 1}, out_dir)
    on_disk = check_result_file(result, out_dir)
    assert on_disk["num_clients"] == 4 and on_disk["config"]["partitioner"] == "node-random"
    assert {"acc", "nmi", "ari", "f1", "modularity", "conductance", "cluster_similarity"} <= set(on_disk["metrics"])
    assert {"acc", "nmi", "agreement"} <= set(on_disk["reference"])
    assert set(on_disk["reference"]["agreement"]) == {"ari", "nmi", "cluster_similarity"}
    # the default filter's hops over the whole graph and the seeds after them, one round per Lloyd step, assign
    actions = [r["action"] for r in on_disk["timing"]["per_round"]]
    assert actions.count("kmeans_filter") == on_disk["config"]["fedkmeans.filter-order"] == 4
    assert actions.count("kmeans_init") == 1 and actions.count("kmeans_step") == len(on_disk["history"])
    assert actions[-1] == "kmeans_assign"
    uploads = {(u["action"], u["name"]) for u in on_disk["privacy"]["uploads"]}
    assert ("kmeans_step", "stats") in uploads and ("kmeans_assign", "labels") in uploads
    assert all(isinstance(u["client"], int) and 0 <= u["client"] < 4 for u in on_disk["privacy"]["uploads"])
    html = check_page(out_dir, figures=3)  # 1000 nodes: a sample drawn, the cluster-level graph, the rounds
    assert re.search(r"1,000 items, [\d,]+ edges, 16 feature columns, 4 classes", html) and "inertia" in html


def test_fedkmeans_one_client_equals_centralised_lloyd(out_dir):
    rounds = 8
    result = run_experiment("fedkmeans", "sbm", 1, {"num-rounds": rounds, "fedkmeans.tol": 0.0,
                                                    "fedkmeans.restarts": 1}, out_dir)
    data = load_dataset("sbm", seed=0)
    x = np.asarray(data.x, dtype=np.float64)
    k = result["config"]["num-clusters"]
    centres, counts, _ = fedkmeans.local_seeds(x, k, 0)
    init = fedkmeans.merge_seeds(centres, counts, k, 0)
    lloyd = KMeans(k, init=init, n_init=1, max_iter=rounds, tol=0.0, algorithm="lloyd").fit(x)
    labels = np.load(out_dir / "labels.npy")
    assert ari(lloyd.labels_, labels) == 1.0
    assert result["history"][-1]["inertia"] == pytest.approx(lloyd.inertia_, rel=1e-6)


def test_fedkmeans_one_client_with_restarts_is_centralised_kmeans_with_as_many(out_dir):
    """One client, R starts: the labels and inertia of scikit-learn's k-means with ``n_init`` R at the
    run's seed (the centralised reference), which one start does not reach on this data."""
    restarts = 4
    result = run_experiment("fedkmeans", "sbm", 1, {"fedkmeans.restarts": restarts}, out_dir)
    x = np.asarray(load_dataset("sbm", seed=0).x, dtype=np.float64)
    k = result["config"]["num-clusters"]
    best, one = (KMeans(k, init="k-means++", n_init=n, random_state=0).fit(x) for n in (restarts, 1))
    assert one.inertia_ > best.inertia_ * (1 + 1e-6)  # the restarts matter here
    assert ari(best.labels_, np.load(out_dir / "labels.npy")) == 1.0
    assert result["history"][-1]["inertia"] == pytest.approx(best.inertia_, rel=1e-9)
    assert result["reference"]["agreement"]["ari"] == 1.0


def test_federated_clustering_recovers_planted_blocks(out_dir):
    result = run_experiment("fedkmeans", "sbm", 3, {"fedkmeans.filter-order": 2}, out_dir)
    assert result["metrics"]["ari"] > 0.9
    assert result["reference"]["agreement"]["ari"] > 0.9


def test_side_by_side_time_counts_only_the_slowest_client_per_round(out_dir, tmp_path):
    """The in-process grid runs the clients one after another; ``parallel_s`` replaces
    each round's summed client seconds by the slowest client's."""
    result = run_experiment("fedkmeans", "sbm", 4, {"num-rounds": 3}, out_dir)
    t = check_result_file(result, out_dir)["timing"]
    rounds = t["per_round"]
    assert len(rounds) == t["rounds"]
    for r in rounds:
        assert 0 < r["client_max_s"] < r["client_sum_s"] <= r["seconds"]
    assert t["parallel_s"] == pytest.approx(
        t["protocol_s"] - sum(r["client_sum_s"] - r["client_max_s"] for r in rounds))
    assert t["parallel_s"] < t["protocol_s"]
    alone = run_experiment("fedkmeans", "sbm", 1, {"num-rounds": 3}, tmp_path / "one")["timing"]
    assert alone["parallel_s"] == alone["protocol_s"]


def test_bad_config_inside_the_run_writes_nothing(out_dir):
    from fedgraphcore.config import ConfigError

    with pytest.raises(ConfigError, match="valid choices"):
        run_experiment("fedkmeans", "sbm", 2, {"partitioner": "vertical"}, out_dir)
    assert not out_dir.exists()


@pytest.mark.parametrize(
    "action, tamper, reason",
    [
        ("hello", lambda o: {**o, "counts": o["counts"] * 1e9}, r"cluster sizes summing to 5e\+11, not its 500 rows"),
        ("hello", lambda o: {"centres": np.vstack([o["centres"]] * 2), "counts": np.concatenate([o["counts"]] * 2)},
         r"6 local centres for k=3"),
        ("kmeans_step", lambda o: {"stats": np.column_stack([o["stats"][:, :-1], np.full(len(o["stats"]), -1e9)])},
         r"a negative inertia -1e\+09"),
        ("kmeans_step", lambda o: {"stats": o["stats"] * 2}, r"cluster sizes summing to 1000, not its 500 rows"),
    ],
    ids=["inflated-sizes", "too-many-centres", "negative-inertia", "doubled-statistics"],
)
def test_fedkmeans_statistics_of_data_a_client_does_not_hold_stop_the_run(out_dir, monkeypatch, action, tamper,
                                                                          reason):
    """Sizes steer the merged seeds and the centres: they must add up to the rows each client announced."""
    from fedgraphcore.wire import ProtocolError
    from clients.fedkmeans import FedKMeansClient

    patch_reply(monkeypatch, FedKMeansClient, action, lambda shard, out, vals: (tamper(out), vals), client=1)
    with pytest.raises(ProtocolError, match=rf"step '{action}': client 1 \(node \d+\) sent " + reason):
        run_experiment("fedkmeans", "sbm", 2, {"num-clusters": 3, "num-rounds": 2}, out_dir)
    assert not (out_dir / RESULT_FILE).exists()


def test_fedkmeans_refuses_overlapping_rows(out_dir):
    from fedgraphcore.config import ConfigError

    with pytest.raises(ConfigError, match=r"invalid value 0.5 for 'partition.overlap' with strategy 'fedkmeans': "
                                          r"Lloyd's sums would count a row held by two clients twice; valid: 0"):
        run_experiment("fedkmeans", "sbm", 2, {"partition.overlap": 0.5}, out_dir)


@pytest.mark.parametrize(
    "action, tamper, reason",
    [
        ("kmeans_assign", lambda o: {**o, "node_ids": o["node_ids"] - 1},
         r"array 'node_ids' has values in \[-1, \d+\], expected >= 0"),
        ("kmeans_assign", lambda o: {**o, "node_ids": o["node_ids"] * 0},
         r"array 'node_ids' repeats entries"),
        ("kmeans_assign", lambda o: {**o, "labels": o["labels"][:-1]},
         r"arrays of the same items differ in length: 'node_ids' (\d+), 'labels' (?!\1)\d+"),
        ("kmeans_assign", lambda o: {**o, "labels": o["labels"] + 3},
         r"array 'labels' has values in \[\d+, \d+\], expected \[0, 3\)"),
        ("hello", lambda o: {**o, "counts": o["counts"][:-1]},
         r"arrays of the same items differ in length: 'centres' 3, 'counts' 2"),
        ("hello", lambda o: {**o, "centres": o["centres"][:, :-1]},
         r"clients disagree on the feature dimension \(client: width\): \{0: (\d+), 1: (?!\1)\d+\}"),
    ],
    ids=["negative-id", "repeated-id", "short-labels", "label-out-of-range", "short-counts", "narrow-centres"],
)
def test_fedkmeans_malformed_replies_stop_the_run_naming_the_client(out_dir, monkeypatch, action, tamper, reason):
    from fedgraphcore.wire import ProtocolError
    from clients.fedkmeans import FedKMeansClient

    patch_reply(monkeypatch, FedKMeansClient, action, lambda shard, out, vals: (tamper(out), vals), client=1)
    with pytest.raises(ProtocolError, match=reason) as err:
        run_experiment("fedkmeans", "sbm", 2, {"num-clusters": 3, "num-rounds": 2}, out_dir)
    if "disagree" not in reason:  # hello comes before the partition ids are known: it names the node
        who = r"node \d+" if action == "hello" else "client 1 "
        assert re.search(rf"step '{action}' rejected 1 client\(s\): {who}", str(err.value))
    assert not (out_dir / RESULT_FILE).exists()


@pytest.mark.parametrize(
    "tamper, reason",
    [
        (lambda o: {**o, "node_ids": np.arange(o["node_ids"].size)},  # ids client 0 holds too
         r"client 0: \d+ ids another client also sent; client 1: \d+ ids another client also sent$"),
        (lambda o: {"node_ids": o["node_ids"][:0], "labels": o["labels"][:0]},
         r"client 1: 0 ids for the (\d+) rows it announced$"),
        (lambda o: {**o, "node_ids": o["node_ids"].astype(np.uint64) + np.uint64(2**63)},
         r"client 1: \d+ negative ids$"),
    ],
    ids=["another-clients-ids", "no-labels", "ids-wrapping-negative"],
)
def test_fedkmeans_final_ids_that_cannot_be_the_clients_stop_the_run(out_dir, monkeypatch, tamper, reason):
    """Each per-client check passes; only ids set against the other clients' and the hello show the lie
    (before: the first label won, or the client's rows went unlabelled, and coverage fell silently)."""
    from fedgraphcore.wire import ProtocolError
    from clients.fedkmeans import FedKMeansClient

    patch_reply(monkeypatch, FedKMeansClient, "kmeans_assign", lambda shard, out, vals: (tamper(out), vals), client=1)
    with pytest.raises(ProtocolError, match=r"^step 'kmeans_assign': item ids that cannot be the client's: " + reason):
        run_experiment("fedkmeans", "sbm", 2, {"num-clusters": 3, "num-rounds": 2}, out_dir)
    assert not (out_dir / RESULT_FILE).exists()


def test_fedkmeans_initial_centres_every_client_would_square_to_inf_are_refused(out_dir, monkeypatch):
    """Finite centres of 1e300 pass the array checks, but every client's distances to them overflow:
    the run stops at once, naming the client that sent them, not a step later blaming all clients."""
    from fedgraphcore.wire import ProtocolError
    from clients.fedkmeans import FedKMeansClient

    patch_reply(monkeypatch, FedKMeansClient, "hello",
                lambda shard, out, vals: ({**out, "centres": np.full_like(out["centres"], 1e300)}, vals), client=1)
    with pytest.raises(ProtocolError, match=r"^step 'hello': client 1 \(node \d+\) sent centres of width \d+ "
                                            r"whose squared norms overflow$"):
        run_experiment("fedkmeans", "sbm", 2, {"num-clusters": 3, "num-rounds": 2}, out_dir)


def test_final_labels_with_item_ids_outside_the_dataset_are_refused():
    from fedgraphcore.wire import ProtocolError
    from strategies.base import StrategyOutput

    out = StrategyOutput(labels=np.array([0, 1, 1]), ids=np.array([2, 0, 1]))
    assert out.dense_labels(4).tolist() == [1, 1, 0, -1]
    with pytest.raises(ProtocolError, match=r"item ids in \[0, 2\], outside 0\.\.1"):
        out.dense_labels(2)
    with pytest.raises(ProtocolError, match=r"item ids in \[-1, 1\], outside 0\.\.3"):
        StrategyOutput(labels=np.array([0, 1]), ids=np.array([-1, 1])).dense_labels(4)
    with pytest.raises(ProtocolError, match="3 item ids for 2 labels"):
        StrategyOutput(labels=np.array([0, 1]), ids=np.array([0, 1, 2])).dense_labels(4)


@pytest.mark.simulation
@pytest.mark.slow
def test_run_simulation_smoke_on_karate(out_dir):
    """Flower's simulation engine end to end (Ray start-up dominates)."""
    result = run_experiment("fedkmeans", "karate", 2, {"num-rounds": 3}, out_dir, engine="simulation")
    on_disk = check_result_file(result, out_dir)
    assert on_disk["dataset"] == "karate" and on_disk["num_clients"] == 2
    assert on_disk["config"]["num-clusters"] == 4
    assert on_disk["communication"]["messages"] > 0
    assert "parallel_s" not in on_disk["timing"]  # Ray runs the clients concurrently: nothing to adjust


@pytest.mark.parametrize("strategy, dataset, overrides, share", [
    ("fedkmeans", "cora", {"num-rounds": 2}, 5),  # the last reply holds 10 starts' statistics
    ("kcagc", "cora", {}, 10),
])
def test_a_client_keeps_a_small_state_not_its_features(strategy, dataset, overrides, share, out_dir,
                                                       mirrored_datasets):
    """A deployed SuperNode moves ``context.state`` to and from the ClientApp of every message: it holds
    labels, keys, the audit and the last reply, never the features (a ``share``-th of a third of them at most)."""
    raw = {"strategy": strategy, "dataset": dataset, "num-clients": 3, "reference": False, "out-dir": str(out_dir),
           "partitioner": "auto", **overrides}
    grid = InProcessGrid(build_client_app(raw), 3)
    run_server(grid, raw)
    data = load_dataset(dataset)
    features = data.num_nodes * data.x.shape[1] * 8
    for context in grid.contexts.values():
        kept = sum(a.numpy().nbytes for record in context.state.array_records.values() for a in record.values())
        assert 0 < kept < features / 3 / share


def test_secure_aggregation_gives_the_same_clustering_and_hides_client_sums(out_dir, tmp_path):
    plain = run_experiment("fedkmeans", "sbm", 3, {"num-rounds": 5}, tmp_path / "plain")
    raw = {"strategy": "fedkmeans", "dataset": "sbm", "num-clients": 3, "num-rounds": 5,
           "fedkmeans.secure": True, "out-dir": str(out_dir)}
    grid = InProcessGrid(build_client_app(raw), 3, record=True)
    secure = run_server(grid, raw)
    # what the server received in each step: uniform-looking uint64, never the
    # client's own statistics in fixed point
    steps = [m for m in grid.pulled if m.metadata.message_type == "query.kmeans_step"]
    assert len(steps) == 3 * len(secure["history"])
    for reply in steps:
        stats = unpack(reply.content)[0]["stats"]
        assert stats.dtype == np.uint64
        top_bits = stats >> np.uint64(60)
        assert len(np.unique(top_bits)) > 8  # fixed-point of small values would sit at 0 or 15
    assert np.array_equal(np.load(tmp_path / "plain" / "labels.npy"), np.load(out_dir / "labels.npy"))
    for p, s in zip(plain["history"], secure["history"]):
        assert s["inertia"] == pytest.approx(p["inertia"], abs=1e-4)
    assert secure["communication"]["secure_aggregations"] == len(secure["history"])
    steps = [u for u in secure["privacy"]["uploads"] if u["action"] == "kmeans_step"]
    assert steps and all(u["masked"] and u["dtype"] == ("uint8" if u["name"] == "secagg_shares" else "uint64")
                         for u in steps)  # the statistics, and the sealed shares of their self masks
    mechanisms = {m["name"] for m in secure["privacy"]["mechanisms"]}
    assert "secure-aggregation" in mechanisms


def test_the_server_app_lets_flower_see_a_config_error_unless_app_run_collects_it():
    """Under `flwr run` a SystemExit ends the ServerApp process before Flower records why: the run
    showed as failed with 'No heartbeat received' and no reason. The error must propagate there;
    app.run's simulation (which passes a list) gets it in the list and the ServerApp ends without
    raising (no SystemExit in the engine's thread)."""
    from flwr.app import Context, RecordDict

    from fedgraphcore.config import ConfigError
    from app.server_app import build_server_app

    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={})
    bad = {"strategy": "nope"}
    with pytest.raises(ConfigError, match="invalid value 'nope' for 'strategy'"):
        build_server_app(bad)(None, context)
    errors = []
    build_server_app(bad, errors)(None, context)
    assert [type(e) for e in errors] == [ConfigError]


def test_unsigned_node_ids_from_one_client_give_the_same_labels(tmp_path, monkeypatch):
    """int64 and uint64 ids concatenate to float64: the server casts each client's ids first."""
    from clients.fedkmeans import FedKMeansClient

    honest = run_experiment("fedkmeans", "iris", 3, {}, tmp_path / "honest")
    patch_reply(monkeypatch, FedKMeansClient, "kmeans_assign",
                lambda shard, out, vals: ({**out, "node_ids": out["node_ids"].astype(np.uint64)}, vals), client=1)
    unsigned = run_experiment("fedkmeans", "iris", 3, {}, tmp_path / "unsigned")
    assert np.array_equal(np.load(tmp_path / "honest" / "labels.npy"), np.load(tmp_path / "unsigned" / "labels.npy"))
    assert unsigned["metrics"]["acc"] == honest["metrics"]["acc"]


@pytest.mark.parametrize("with_hello", [True, False], ids=["key-with-hello", "key-in-its-own-round"])
def test_a_malformed_public_key_stops_secure_aggregation_naming_the_party(tmp_path, monkeypatch, with_hello):
    from fedgraphcore.wire import ProtocolError
    from clients.base import ClusteringClient
    from strategies.fedkmeans import FedKMeans

    honest = ClusteringClient.on_secagg_setup

    def short_key(self, arrays, values, **step):
        out, vals = honest(self, arrays, values, **step)
        return out, ({**vals, "public_key": 32} if self.shard.client_id == 1 else vals)

    monkeypatch.setattr(ClusteringClient, "on_secagg_setup", short_key)
    if not with_hello:  # a strategy that masks without saying so beforehand: the key exchange takes two rounds
        monkeypatch.setattr(FedKMeans, "masks_uploads", classmethod(lambda cls, config, clients: False))
    step = "hello" if with_hello else "secagg_setup"
    with pytest.raises(ProtocolError, match=rf"^step '{step}': party 1: public key must be 32 bytes, got int$"):
        run_experiment("fedkmeans", "iris", 3, {"fedkmeans.secure": True}, tmp_path / "r")


def test_secure_aggregation_keys_travel_with_hello_and_the_first_masked_step(tmp_path, monkeypatch):
    """The key exchange costs no round of its own when the strategy says beforehand that it masks;
    the same run with the two-round exchange gives the same labels."""
    from strategies.fedkmeans import FedKMeans

    config = {"fedkmeans.secure": True, "num-rounds": 3}
    merged = run_experiment("fedkmeans", "iris", 3, config, tmp_path / "merged")
    monkeypatch.setattr(FedKMeans, "masks_uploads", classmethod(lambda cls, config, clients: False))
    apart = run_experiment("fedkmeans", "iris", 3, config, tmp_path / "apart")
    actions = [[r["action"] for r in run["timing"]["per_round"]] for run in (merged, apart)]
    assert actions[0] == [a for a in actions[1] if a not in ("secagg_setup", "secagg_agree")]
    assert actions[1][:2] == ["secagg_setup", "secagg_agree"]  # the first steps after hello
    assert merged["communication"]["messages"] == apart["communication"]["messages"] - 2 * 2 * 3  # 2 rounds x (request + reply) x 3 clients
    assert "public_key" in {u["name"] for u in merged["privacy"]["uploads"] if u["action"] == "hello"}
    assert np.array_equal(np.load(tmp_path / "merged" / "labels.npy"), np.load(tmp_path / "apart" / "labels.npy"))
