"""FedSC: protocol math (exact equivalences, invariants), end-to-end runs, privacy of uploads."""

from __future__ import annotations

import math

import numpy as np
import pytest

from app.client_app import build_client_app
from fedgraphcore.config import ConfigError
from fedgraphcore.data import load_dataset
from fedgraphcore.data.partition import partition
from app.inprocess import InProcessGrid
from fedgraphcore.metrics import ari
from fedgraphcore.protocols import fedsc
from app.registry import validate
from app.run import run_experiment
from app.server_app import run_server
from conftest import LeavingGrid, check_page, patch_reply
from fedgraphcore.wire import ProtocolError
from fedgraphcore.transport import unpack
from clients.fedsc import FedSCClient
from fedgraphcore.protocols.fedsc import pooled_features


def reconstruction_error(x: np.ndarray, z: np.ndarray, c: np.ndarray, sigma: float) -> float:
    """``||K(X, X) - C' K(Z, Z) C||_F / ||K(X, X)||_F`` (needs the pooled data: a test's oracle)."""
    k = fedsc.kernel(x, x, sigma)
    return float(np.linalg.norm(k - fedsc.reconstruct(z, c, sigma)) / np.linalg.norm(k))


def iris_blocks(num_clients: int, seed: int = 0):
    data = load_dataset("iris")
    shards = partition(data, "sample", num_clients, seed=seed)
    return data, shards, [np.asarray(s.x, dtype=np.float64) for s in shards]


# --------------------------------------------------------------------------- protocol math


def explicit_features(points: np.ndarray, sigma: float) -> np.ndarray:
    """Rows F with F F' = K(points, points) exactly (a finite feature map for these points)."""
    k = fedsc.kernel(points, points, sigma)
    vals, vecs = np.linalg.eigh(k)
    return vecs * np.sqrt(np.clip(vals, 0.0, None))


def test_c_step_equals_direct_least_squares_in_feature_space():
    rng = np.random.default_rng(0)
    x, z = rng.normal(size=(12, 3)), rng.normal(size=(5, 3))
    sigma, lam = 1.3, 0.05
    f = explicit_features(np.vstack([z, x]), sigma)
    phi_z, phi_x = f[:5].T, f[5:].T  # columns are feature vectors
    # min ||phi_x - phi_z C||^2 + lam ||C||^2 as one stacked least-squares problem
    a = np.vstack([phi_z, math.sqrt(lam) * np.eye(5)])
    b = np.vstack([phi_x, np.zeros((5, 12))])
    direct = np.linalg.lstsq(a, b, rcond=None)[0]
    c = fedsc.solve_coefficients(x, z, sigma, lam)
    np.testing.assert_allclose(c, direct, rtol=1e-7, atol=1e-9)
    # and the objective is the feature-space residual
    explicit = 0.5 * np.linalg.norm(phi_x - phi_z @ c) ** 2 + 0.5 * lam * np.linalg.norm(c) ** 2
    assert fedsc.objective(x, z, c, sigma, lam) == pytest.approx(explicit, rel=1e-8)


def test_landmark_gradient_matches_finite_differences():
    rng = np.random.default_rng(1)
    x, z = rng.normal(size=(15, 3)), rng.normal(size=(4, 3))
    sigma, lam = 0.9, 1e-3
    c = rng.normal(size=(4, 15))
    grad, _, _ = fedsc.landmark_gradient(x, z, c, sigma)
    eps = 1e-6
    numeric = np.zeros_like(z)
    for idx in np.ndindex(*z.shape):
        zp, zm = z.copy(), z.copy()
        zp[idx] += eps
        zm[idx] -= eps
        numeric[idx] = (fedsc.objective(x, zp, c, sigma, lam) - fedsc.objective(x, zm, c, sigma, lam)) / (2 * eps)
    np.testing.assert_allclose(grad, numeric, rtol=1e-5, atol=1e-7)


def one_client_sigma(x: np.ndarray) -> float:
    total, pairs = fedsc.local_distance_sum(x)
    return fedsc.combine_bandwidth([total], [pairs])


def test_one_client_with_landmarks_at_the_data_reconstructs_the_kernel():
    data, _, _ = iris_blocks(1)
    x = np.asarray(data.x, dtype=np.float64)
    sigma = one_client_sigma(x)
    errors = []

    def track(round_, z, cs):
        errors.append(reconstruction_error(x, z, np.hstack(cs), sigma))

    out = fedsc.simulate([x], 3, 0, rounds=3, z0=x.copy(), callback=track)
    assert out["d"] == len(x) and len(errors) == 3
    assert reconstruction_error(x, out["z"], out["c"], out["sigma"]) < 1e-3
    assert max(errors) < 1e-3
    # far from the data (random landmarks, few of them) it is not exact: the check can fail
    rough = fedsc.simulate([x], 3, 0, rounds=1, landmarks=3)
    assert reconstruction_error(x, rough["z"], rough["c"], rough["sigma"]) > 1e-2


def test_objective_decreases_every_round_with_one_client_and_overall_with_eight():
    data, _, xs = iris_blocks(8)
    x = np.asarray(data.x, dtype=np.float64)
    one = fedsc.simulate([x], 3, 0, rounds=10, landmarks=20)["objective"]
    assert all(b < a for a, b in zip(one, one[1:])), one
    eight = fedsc.simulate(xs, 3, 0, rounds=10, landmarks=20)["objective"]
    assert eight[-1] < 0.2 * eight[0]


def test_landmark_step_never_increases_the_local_objective():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(30, 4)) + 3.0
    z = rng.normal(size=(6, 4))
    sigma = 2.0
    for _ in range(5):
        c = fedsc.solve_coefficients(x, z, sigma)
        new = fedsc.landmark_step(x, z, c, sigma)
        assert fedsc.objective(x, new, c, sigma) <= fedsc.objective(x, z, c, sigma)
        z = new


def test_bandwidth_of_one_client_is_the_mean_pairwise_distance():
    from scipy.spatial.distance import pdist

    data, _, xs = iris_blocks(1)
    assert one_client_sigma(xs[0]) == pytest.approx(pdist(np.asarray(data.x)).mean(), rel=1e-12)
    with pytest.raises(ValueError, match="two samples"):
        fedsc.combine_bandwidth([0.0], [0.0])


def test_spectral_mass_rule():
    k = np.diag([5.0, 3.0, 1.0, 0.5, 0.5])  # mass 10
    assert fedsc.mass_rank(k, 0.5) == 1
    assert fedsc.mass_rank(k, 0.8) == 2
    assert fedsc.mass_rank(k, 0.9) == 3
    assert fedsc.mass_rank(k, 1.0) == 5
    assert fedsc.combine_landmark_counts([3, 7, 5]) == 7


def test_knn_affinity_matches_a_brute_force_construction():
    rng = np.random.default_rng(3)
    pts = rng.normal(size=(40, 2))
    k_hat = fedsc.kernel(pts, pts, 1.0) + 0.01 * rng.normal(size=(40, 40))
    k_hat = (k_hat + k_hat.T) / 2
    w = fedsc.knn_affinity(k_hat).toarray()
    q = fedsc.knn_count(40)
    assert q == math.ceil(math.log(40))
    scaled = (k_hat - k_hat.min()) / (k_hat.max() - k_hat.min())
    brute = np.zeros_like(scaled)
    for i in range(40):
        order = [j for j in np.argsort(-scaled[i]) if j != i][:q]
        brute[i, order] = scaled[i, order]
    brute = np.maximum(brute, brute.T)
    np.testing.assert_allclose(w, brute)
    assert np.all(np.diag(w) == 0) and w.max() <= 1.0 and np.all((w > 0).sum(1) >= q)


def test_noise_free_factors_reveal_the_samples_and_factor_noise_hides_them():
    """The honest limit of 'no sample leaves a client': the server can invert C_p."""
    from fedgraphcore.privacy.gaussian import noise_ratio_perturb

    _, _, xs = iris_blocks(8)
    x = np.vstack(xs)
    out = fedsc.simulate(xs, 3, 0, rounds=5, landmarks=20)
    recovered = fedsc.invert_coefficients(out["z"], out["c"], out["sigma"])
    np.testing.assert_allclose(recovered, x, atol=1e-8)
    noisy = noise_ratio_perturb(out["c"], 0.15, np.random.default_rng(0))
    guess = np.linalg.norm(x - x.mean(0))  # error of guessing every sample as the mean
    assert np.linalg.norm(fedsc.invert_coefficients(out["z"], noisy, out["sigma"]) - x) > guess


# --------------------------------------------------------------------------- end to end


@pytest.mark.shipped_defaults
def test_flower_run_equals_the_in_memory_protocol_and_tracks_centralised_sc(out_dir):
    cfg = {"num-rounds": 20, "fedsc.landmarks": 30}
    result = run_experiment("fedsc", "iris", 4, cfg, out_dir)
    assert "objective" in check_page(out_dir, figures=2)  # rows without edges: their embedding, the rounds
    _, shards, xs = iris_blocks(4)
    expected = fedsc.simulate(xs, 3, 0, rounds=20, landmarks=30)
    ids = np.concatenate([s.node_ids for s in shards])
    labels = np.load(out_dir / "labels.npy")
    assert np.array_equal(labels[ids], expected["labels"])
    assert [h["objective"] for h in result["history"]] == pytest.approx(expected["objective"], rel=1e-9)
    assert result["metrics"]["sigma"] == pytest.approx(expected["sigma"], rel=1e-12)
    assert result["metrics"]["acc"] >= 0.88  # paper: 0.900
    assert result["reference"]["acc"] - result["metrics"]["acc"] <= 0.02
    assert result["reference"]["agreement"]["ari"] > 0.9
    # handshake (with the bandwidth figures) excluded: rounds + final + labels
    assert result["timing"]["rounds"] == 20 + 2


def contains_row(flat: np.ndarray, rows: np.ndarray) -> bool:
    """True if any row of ``rows`` appears as a contiguous run in ``flat``."""
    m = rows.shape[1]
    if flat.size < m:
        return False
    windows = np.lib.stride_tricks.sliding_window_view(flat, m)
    return bool((windows[:, None, :] == rows[None, :, :]).all(-1).any())


@pytest.mark.parametrize("bound", [1e6, 10.0], ids=["default-bound", "bound-below-the-objective"])
def test_secure_aggregation_equals_plain_averaging_and_no_sample_leaves_a_client(out_dir, tmp_path, bound):
    """secagg.bound=10 holds iris's coordinates (< 8) but not a client's objective (up to its 50 samples / 2):
    the declared bound grows with the samples (update_bound), so the sum is exact at every size."""
    base = {"strategy": "fedsc", "dataset": "iris", "num-clients": 3, "num-rounds": 4, "fedsc.landmarks": 12}
    plain = run_server(InProcessGrid(build_client_app(base), 3), {**base, "out-dir": str(tmp_path / "plain")})
    raw = {**base, "fedsc.secure": True, "secagg.bound": bound, "out-dir": str(out_dir)}
    grid = InProcessGrid(build_client_app(raw), 3, record=True)
    secure = run_server(grid, raw)
    for p, s in zip(plain["history"], secure["history"]):
        assert s["objective"] == pytest.approx(p["objective"], abs=1e-4)
        assert s["shift"] == pytest.approx(p["shift"], abs=1e-4)
    assert ari(np.load(tmp_path / "plain" / "labels.npy"), np.load(out_dir / "labels.npy")) == 1.0
    assert secure["communication"]["secure_aggregations"] == 4
    rounds = [m for m in grid.pulled if m.metadata.message_type == "query.fedsc_round"]
    assert len(rounds) == 3 * 4
    assert all(unpack(m.content)[0]["update"].dtype.kind == "u" for m in rounds)  # masked ring elements
    # no raw sample (a feature row of any client) in any reply, in any form the server can read
    x = np.asarray(load_dataset("iris").x, dtype=np.float64)
    for reply in grid.pulled:
        arrays, values = unpack(reply.content)
        for name, array in arrays.items():
            if array.dtype.kind == "f":
                assert not contains_row(array.ravel(), x), (reply.metadata.message_type, name)
                assert not contains_row(array.T.ravel(), x), (reply.metadata.message_type, name)
        floats = np.array([v for v in values.values() if isinstance(v, float)])
        assert not contains_row(floats, x)
    names = {(u["action"], u["name"]) for u in secure["privacy"]["uploads"]
             if u["action"].startswith("fedsc") or u["name"] in ("features", "distance_sum", "pairs")}
    assert names == {("hello", "features"), ("hello", "distance_sum"),
                     ("hello", "pairs"), ("fedsc_round", "update"), ("fedsc_round", "secagg_shares"),
                     ("fedsc_final", "c"), ("fedsc_final", "node_ids")}
    assert all(u["masked"] for u in secure["privacy"]["uploads"] if u["action"] == "fedsc_round")


def test_labels_go_back_to_their_clients(out_dir):
    raw = {"strategy": "fedsc", "dataset": "iris", "num-clients": 3, "num-rounds": 2,
           "fedsc.landmarks": 10, "out-dir": str(out_dir)}
    grid = InProcessGrid(build_client_app(raw), 3)
    run_server(grid, raw)
    labels = np.load(out_dir / "labels.npy")
    _, shards, _ = iris_blocks(3)
    for i, shard in enumerate(shards):
        state = grid.contexts[1001 + i].state.array_records["labels"]["labels"].numpy()
        assert np.array_equal(state, labels[shard.node_ids])


def test_calibrated_noise_reports_epsilon_and_ratio_noise_reports_none(tmp_path):
    dp = run_experiment("fedsc", "iris", 3, {"num-rounds": 3, "fedsc.landmarks": 10, "fedsc.sigma": 2.5,
                                             "fedsc.dp-epsilon": 8.0, "fedsc.dp-clip-z": 50.0,
                                             "fedsc.dp-clip-c": 5.0}, tmp_path / "dp")
    privacy = dp["privacy"]
    names = {m["name"]: m for m in privacy["mechanisms"]}
    assert {"fedsc:gaussian-z", "fedsc:gaussian-c"} <= set(names)
    assert names["fedsc:gaussian-z"]["params"]["steps"] == 3 and names["fedsc:gaussian-c"]["params"]["steps"] == 1
    assert 7.0 < privacy["epsilon"] <= 8.0 + 0.1 and privacy["delta"] == pytest.approx(1e-5)
    assert all("objective" not in h for h in dp["history"])
    noised = {(u["action"], u["name"]) for u in privacy["uploads"] if u["noised"]}
    assert noised == {("fedsc_round", "update"), ("fedsc_final", "c")}
    # with sigma and d given, no distance statistic or landmark count leaves a client un-noised
    sent = {(u["action"], u["name"]) for u in privacy["uploads"]
            if u["action"].startswith("fedsc") or u["name"] in ("features", "distance_sum", "pairs")}
    assert sent == {("hello", "features"), ("fedsc_round", "update"),
                    ("fedsc_final", "c"), ("fedsc_final", "node_ids")}

    ratio = run_experiment("fedsc", "iris", 3, {"num-rounds": 2, "fedsc.landmarks": 10, "fedsc.noise-z": 0.05,
                                                "fedsc.noise-c": 0.05, "fedsc.data-noise": 0.3}, tmp_path / "r")
    mechs = {m["name"]: m for m in ratio["privacy"]["mechanisms"]}
    assert set(mechs) == {"fedsc:data-noise", "fedsc:noise-z", "fedsc:noise-c"}
    assert all(m["epsilon"] == "none" and m["guarantee"].startswith("none") for m in mechs.values())
    assert ratio["privacy"]["epsilon"] is None
    # the noised Z_p goes up alone: no un-noised objective value beside it
    assert [u["shape"] for u in ratio["privacy"]["uploads"] if u["name"] == "update"] == [[10 * 4]] * 3
    assert all("objective" not in h for h in ratio["history"])


def test_a_client_refuses_a_request_for_less_noise_than_its_own_budget_allows():
    """The clients add the noise; the multiplier comes with the request: a server that leaves it out
    (or sends a smaller one) must not get un-noised (or less noised) Z_p and C_p."""
    from flwr.app import Context, RecordDict

    from fedgraphcore.privacy.policy import PrivacyRefusal
    from strategies.fedsc import _noise_multiplier

    config = validate({"strategy": "fedsc", "dataset": "iris", "num-rounds": 3, "fedsc.sigma": 2.5,
                       "fedsc.landmarks": 10, "fedsc.dp-epsilon": 8.0, "fedsc.dp-clip-z": 50.0})
    client = FedSCClient(None, config, Context(run_id=1, node_id=1, node_config={}, state=RecordDict(),
                                               run_config={}))
    nm_z = _noise_multiplier(4.0, 5e-6, 3)  # what the server sends: half the budget over the rounds
    mech = client._dp_request({"dp_nm_z": nm_z}, "z")
    assert mech.clip == 50.0 and mech.noise_multiplier == nm_z and not mech.per_row
    assert client._dp_request({"dp_nm_c": _noise_multiplier(4.0, 5e-6, 1)}, "c").per_row
    with pytest.raises(PrivacyRefusal, match=r"rule 'fedsc.dp-epsilon': dp_nm_z=.*: 3 release\(s\) would spend "
                                             r"epsilon .*, above this client's 4 \(half its fedsc.dp-epsilon\)$"):
        client._dp_request({"dp_nm_z": 0.9 * nm_z}, "z")
    with pytest.raises(PrivacyRefusal, match=r"rule 'fedsc.dp-epsilon': fedsc_final was requested without noise; "
                                             r"this client's fedsc.dp-epsilon is 8$"):
        client._dp_request({}, "c")
    without = FedSCClient(None, validate({"strategy": "fedsc"}), client.context)
    assert without._dp_request({}, "z") is None
    # nor more releases than the budget covers: three rounds of Z_p, then a fourth request is refused
    for r in (1, 2, 3, 3):  # the third sent twice (a retry): the kept reply, no new release
        client.release("fedsc_round", {}, {"round": r}, lambda: {"update": np.zeros(2)}, multiplier=nm_z / 2,
                       most=client._budget("z"))
    with pytest.raises(PrivacyRefusal, match=r"rule 'releases': release 4 of fedsc_round in run 1: this client's "
                                             r"privacy budget for the run covers 3 \(ledger the run context"):
        client.release("fedsc_round", {}, {"round": 4}, lambda: {"update": np.zeros(2)}, multiplier=nm_z / 2,
                       most=client._budget("z"))


def clients_inputs(raw: dict, out_dir) -> list[np.ndarray]:
    """Run the protocol in memory; return the feature rows each client actually clustered."""
    grid = InProcessGrid(build_client_app(raw), raw["num-clients"])
    run_server(grid, {**raw, "out-dir": str(out_dir)})
    return [grid.contexts[1001 + i].state.array_records["fedsc"]["x"].numpy() for i in range(raw["num-clients"])]


def test_without_data_noise_the_reference_sees_exactly_the_clients_samples(tmp_path):
    raw = {"strategy": "fedsc", "dataset": "iris", "num-clients": 3, "num-rounds": 1, "fedsc.landmarks": 5}
    pooled, _, _ = pooled_features(load_dataset("iris"), validate(raw))
    np.testing.assert_array_equal(np.vstack(clients_inputs(raw, tmp_path)), pooled)


def test_data_noise_comes_from_client_entropy_not_from_the_seed(tmp_path):
    """The server knows seed and client id: noise derived from them could be regenerated and removed."""
    raw = {"strategy": "fedsc", "dataset": "iris", "num-clients": 3, "num-rounds": 1, "fedsc.landmarks": 5,
           "fedsc.data-noise": 0.7}
    first, second = clients_inputs(raw, tmp_path / "a"), clients_inputs(raw, tmp_path / "b")
    data = load_dataset("iris")
    config = validate(raw)
    pooled, _, _ = pooled_features(data, config)
    np.testing.assert_array_equal(pooled_features(data, config)[0], pooled)  # the reference is reproducible
    start = 0
    for shard, a, b in zip(partition(data, "sample", 3, seed=0), first, second):
        clean = np.asarray(shard.x, dtype=np.float64)
        ref = pooled[start:start + len(clean)]
        start += len(clean)
        assert np.all(a != b)  # same seed, same client: two independent draws
        assert np.all(a != ref)  # the reference's seeded draw is not the client's
        for noisy in (a, b, ref):  # the same mechanism: X + 0.7 std(X) N(0, 1) (200 draws: +-0.035)
            assert 0.5 < np.std(noisy - clean) / np.std(clean) < 0.9


def test_graph_mode_clusters_filtered_node_features(out_dir):
    result = run_experiment("fedsc", "sbm", 3, {"num-rounds": 4, "fedsc.landmarks": 20, "fedsc.filter-order": 2,
                                                "sbm.nodes": 300, "partitioner": "node-random"}, out_dir)
    assert result["metrics"]["ari"] > 0.8
    assert result["reference"]["agreement"]["ari"] > 0.8


def test_the_typed_view_reads_every_fedsc_key_lambda_included():
    """``lambda`` is a Python keyword: the view's field ``lambda_`` reads ``fedsc.lambda``."""
    from app.registry import get

    config = validate({"strategy": "fedsc", "fedsc.lambda": 0.25, "fedsc.n-init": 3})
    cfg = fedsc.FedSCConfig.of(config)
    assert (cfg.lambda_, cfg.n_init) == (0.25, 3)
    assert fedsc.FedSCConfig.keys() == {p.key: p.kind for p in get("fedsc").strategy.params}


def test_bad_config_is_one_line_naming_the_value():
    with pytest.raises(ConfigError, match="fedsc.mass.*valid range"):
        validate({"strategy": "fedsc", "fedsc.mass": 2.0})
    with pytest.raises(ConfigError, match="valid choices"):
        validate({"strategy": "fedsc", "partitioner": "vertical"})
    with pytest.raises(ConfigError, match="dp-epsilon.*valid choices"):
        validate({"strategy": "fedsc", "fedsc.dp-epsilon": 1.0, "fedsc.noise-z": 0.1})
    # under DP, an estimated sigma or d would upload sample statistics without noise
    with pytest.raises(ConfigError) as err:
        validate({"strategy": "fedsc", "fedsc.dp-epsilon": 1.0})
    assert str(err.value) == (
        "fedsc.dp-epsilon=1 with fedsc.sigma=0, fedsc.landmarks=0: each client would upload its distance_sum/pairs "
        "(sigma estimate) and spectral-mass landmark count without noise; valid choices: set fedsc.sigma > 0 and "
        "fedsc.landmarks > 0, or fedsc.dp-epsilon=0")
    with pytest.raises(ConfigError, match=r"fedsc.sigma=2.5, fedsc.landmarks=0: .* its spectral-mass landmark count "
                                          r"without noise; valid choices"):
        validate({"strategy": "fedsc", "fedsc.dp-epsilon": 1.0, "fedsc.sigma": 2.5})
    with pytest.raises(ConfigError, match=r"fedsc.sigma=0, fedsc.landmarks=10: .* its distance_sum/pairs \(sigma "
                                          r"estimate\) without noise"):
        validate({"strategy": "fedsc", "fedsc.dp-epsilon": 1.0, "fedsc.landmarks": 10})
    validate({"strategy": "fedsc", "fedsc.dp-epsilon": 1.0, "fedsc.sigma": 2.5, "fedsc.landmarks": 10})


def test_malformed_landmark_upload_is_rejected(out_dir, monkeypatch):
    def short_update(self, arrays, values):
        return {"update": np.zeros(3)}, {}

    monkeypatch.setattr(FedSCClient, "on_fedsc_round", short_update)
    with pytest.raises(ProtocolError, match="update.*shape"):
        run_experiment("fedsc", "iris", 2, {"num-rounds": 2, "fedsc.landmarks": 5}, out_dir)


def test_coefficients_missing_a_sample_are_rejected(out_dir, monkeypatch):
    honest = FedSCClient.on_fedsc_final

    def drop_one(self, arrays, values):
        out, vals = honest(self, arrays, values)
        return {"c": out["c"][:, 1:], "node_ids": out["node_ids"][1:]}, vals

    monkeypatch.setattr(FedSCClient, "on_fedsc_final", drop_one)
    with pytest.raises(ProtocolError, match="'c' has shape"):
        run_experiment("fedsc", "iris", 2, {"num-rounds": 1, "fedsc.landmarks": 5}, out_dir)


@pytest.mark.parametrize("change, reason", [
    ({"pairs": 2.5, "distance_sum": -1e6}, r"step 'hello' rejected 1 client\(s\): node \d+: value 'distance_sum' is "
                                          r"-1000000.0, expected numbers >= 0"),
    ({"pairs": 1}, r"step 'hello': client 1 reports 1 pairs for its 75 samples; expected 2775"),
    ({"features": "four"}, r"step 'hello' rejected 1 client\(s\): node \d+: value 'features' is 'four', expected "
                           r"whole numbers"),
    ({"features": 4.5}, r"step 'hello' rejected 1 client\(s\): node \d+: value 'features' is 4.5, expected whole "
                        r"numbers"),
])
def test_bandwidth_statistics_no_client_could_hold_stop_the_run_naming_the_client(out_dir, monkeypatch, change,
                                                                                   reason):
    """sigma comes from every client's distance sum and pair count: one client must not set it for all
    (before: a negative sum was averaged in, and a bad feature width read as a config error)."""
    patch_reply(monkeypatch, FedSCClient, "hello", lambda shard, out, vals: (out, {**vals, **change}), client=1)
    with pytest.raises(ProtocolError, match=reason):
        run_experiment("fedsc", "iris", 2, {"num-rounds": 1}, out_dir)


@pytest.mark.parametrize("landmarks, reason", [
    (10**9, r"client 1 \(node \d+\) sent landmarks=1000000000, more than its 75 samples"),
    ("x", r"step 'fedsc_rank' rejected 1 client\(s\): client 1 .*value 'landmarks' is 'x', expected whole numbers"),
])
def test_an_impossible_landmark_count_stops_the_run_naming_the_client(out_dir, monkeypatch, landmarks, reason):
    """The server takes the largest count: one client must not set d (and the memory) for all."""
    patch_reply(monkeypatch, FedSCClient, "fedsc_rank", lambda shard, out, vals: (out, {"landmarks": landmarks}),
                client=1)
    with pytest.raises(ProtocolError, match=reason):
        run_experiment("fedsc", "iris", 2, {"num-rounds": 1}, out_dir)


def test_more_landmarks_than_samples_are_refused_before_any_round(out_dir):
    """K(Z, Z) is d x d: fedsc.landmarks=100000 on iris would need 74.5 GiB on every client."""
    with pytest.raises(ConfigError, match=r"^fedsc.landmarks=100000 exceeds the 150 samples of all clients; "
                                          r"valid: 0 \(spectral-mass rule\) to 150$"):
        run_experiment("fedsc", "iris", 2, {"num-rounds": 1, "fedsc.landmarks": 100_000}, out_dir)


def test_sample_ids_of_another_client_are_rejected(out_dir, monkeypatch):
    """Without overlap every sample lives on one client: ids claiming another's samples stop the run."""
    patch_reply(monkeypatch, FedSCClient, "fedsc_final",
                lambda shard, out, vals: ({**out, "node_ids": np.arange(out["node_ids"].size)}, vals))
    with pytest.raises(ProtocolError, match=r"^step 'fedsc_final': item ids that cannot be the client's: "
                                            r"client 0: \d+ ids another client also sent; client 1: \d+ ids"):
        run_experiment("fedsc", "iris", 2, {"num-rounds": 1, "fedsc.landmarks": 5}, out_dir)
    monkeypatch.undo()
    # ids sent as uint64 at or above 2^63 are negative once cast to int64
    patch_reply(monkeypatch, FedSCClient, "fedsc_final", lambda shard, out, vals: (
        {**out, "node_ids": out["node_ids"].astype(np.uint64) + np.uint64(2**63)}, vals), client=1)
    with pytest.raises(ProtocolError, match=r"^step 'fedsc_final': item ids that cannot be the client's: "
                                            r"client 1: \d+ negative ids$"):
        run_experiment("fedsc", "iris", 2, {"num-rounds": 1, "fedsc.landmarks": 5}, out_dir)


def test_coefficients_far_out_of_range_stop_the_run(out_dir, monkeypatch):
    patch_reply(monkeypatch, FedSCClient, "fedsc_final",
                lambda shard, out, vals: ({**out, "c": np.full_like(out["c"], 1e200)}, vals), client=1)
    with pytest.raises(ProtocolError, match=r"affinity C'K\(Z,Z\)C is not finite"), np.errstate(over="ignore"):
        run_experiment("fedsc", "iris", 2, {"num-rounds": 1, "fedsc.landmarks": 5}, out_dir)


def test_clients_disagreeing_on_the_feature_dimension_stop_the_run(out_dir, monkeypatch):
    patch_reply(monkeypatch, FedSCClient, "hello",
                lambda shard, out, vals: (out, {**vals, "features": vals["features"] + shard.client_id}))
    with pytest.raises(ProtocolError, match=r"clients disagree on the feature dimension: \[4, 5\]"):
        run_experiment("fedsc", "iris", 2, {"num-rounds": 1, "fedsc.landmarks": 5}, out_dir)


def test_without_secure_aggregation_a_dropped_client_is_left_out(out_dir):
    raw = {"strategy": "fedsc", "dataset": "iris", "num-clients": 4, "num-rounds": 5, "min-clients": 3,
           "fedsc.landmarks": 30, "timeout": 30.0, "out-dir": str(out_dir)}
    result = run_server(LeavingGrid(build_client_app(raw), 4, leave_at=3, action="fedsc_round"), raw)
    assert [d["client"] for d in result["communication"]["dropped"]] == [3]
    labels = np.load(out_dir / "labels.npy")
    assert 0.6 < (labels >= 0).mean() < 0.9  # the dropped client's samples have no label
    assert result["metrics"]["acc"] > 0.8
