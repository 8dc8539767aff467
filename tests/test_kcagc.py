"""kCAGC (``kcagc``, ``kcagc-basic``): protocol math and end-to-end runs on the in-process grid."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.cluster import KMeans

from fedgraphcore.graph_filters import agc
from app.client_app import build_client_app
from fedgraphcore.config import ConfigError
from fedgraphcore.data import load_dataset
from fedgraphcore.data.partition import partition
from app.inprocess import InProcessGrid
from fedgraphcore.metrics import ari
from fedgraphcore.privacy.secagg import FixedPointEncoder, unmask_sum
from fedgraphcore.protocols import kcagc
from fedgraphcore.result import RESULT_FILE
from app.run import main as run_main
from app.run import run_experiment
from app.server_app import run_server
from fedgraphcore.wire import ProtocolError
from fedgraphcore.transport import unpack
from clients.kcagc import KCAGCClient
from conftest import check_page, patch_reply

N = 240
#: the paper's protocol (the default, kcagc.mode = exact, is tests/test_kcagc_exact.py's; kcagc-basic reads no mode)
SBM = {"sbm.nodes": N, "sbm.features": 12, "sbm.blocks": 4, "sbm.signal": 3.0, "kcagc.mode": "paper"}


def lloyd_reference(z: np.ndarray, weights: np.ndarray, init: np.ndarray, iterations: int) -> np.ndarray:
    """Plain weighted Lloyd from ``init`` (kk x d): assign to the centres, then at
    most ``iterations`` times update the centres and assign again, stopping early
    when the assignment repeats; returns the last assignment. What the secure
    protocol computes, in one place."""
    centres = init[None].copy()
    labels, _ = kcagc.assign(kcagc.partial_distances(z, centres), weights)
    for _ in range(iterations):
        centres = kcagc.update_centres(z, weights, labels, centres)
        new, _ = kcagc.assign(kcagc.partial_distances(z, centres), weights)
        if np.array_equal(new, labels):
            break
        labels = new
    return labels[0]


def client_embeddings(num_clients: int, order: int, seed: int = 0, dim: int = 4,
                      kind: str = "projection-unit", filter_kind: str = "agc") -> list[np.ndarray]:
    """What each client computes locally (the same call the client makes; default embedding)."""
    data = load_dataset("sbm", seed=seed, nodes=N, features=12, blocks=4, signal=3.0)
    shards = partition(data, "vertical", num_clients, seed=seed)
    return [kcagc.embedding(s.x, s.adj, dim, order, seed, kind, k_adaptive=4, filter_kind=filter_kind)[0]
            for s in shards]


# --------------------------------------------------------------------------- protocol math
def test_intersections_are_the_virtual_nodes():
    a = np.array([0, 0, 1, 1, 2, 2, 0])
    b = np.array([1, 1, 1, 0, 0, 0, 0])
    members, weights = kcagc.intersect([a, b])
    pairs = {(x, y) for x, y in zip(a, b)}
    assert len(weights) == len(pairs) and weights.sum() == len(a)
    for i in range(len(a)):
        for j in range(len(a)):
            assert (members[i] == members[j]) == ((a[i], b[i]) == (a[j], b[j]))
    assert np.array_equal(np.bincount(members), weights)
    # every party receives ``members``: renaming another party's clusters must not change them,
    # else the IDs' order would give that party's labels away
    for relabel in ([2, 0, 1], [1, 2, 0]):
        renamed, renamed_weights = kcagc.intersect([a, np.array(relabel)[b]])
        assert np.array_equal(renamed, members) and np.array_equal(renamed_weights, weights)
    assert np.array_equal(members, [0, 0, 1, 2, 3, 3, 4])  # numbered by smallest member
    with pytest.raises(ValueError, match="different numbers of nodes"):
        kcagc.intersect([a, b[:-1]])


def test_partial_distances_add_up_over_column_blocks():
    rng = np.random.default_rng(0)
    y, c = rng.normal(size=(30, 7)), rng.normal(size=(2, 5, 7))
    full = kcagc.partial_distances(y, c)
    split = kcagc.partial_distances(y[:, :3], c[:, :, :3]) + kcagc.partial_distances(y[:, 3:], c[:, :, 3:])
    assert np.allclose(full, split)
    brute = ((y[None, :, None, :] - c[:, None, :, :]) ** 2).sum(-1)
    assert np.allclose(full, brute)


def test_unit_row_distances_stay_within_the_bound_that_picks_the_small_ring():
    rng = np.random.default_rng(1)
    z = rng.normal(size=(400, 6))
    z /= np.linalg.norm(z, axis=1, keepdims=True)
    z[1] = -z[0]  # an antipodal pair: the extreme squared distance 4
    members = rng.integers(0, 40, 400)
    members[:2] = [0, 1]
    y = kcagc.virtual_block(z, np.unique(members, return_inverse=True)[1])
    d = np.concatenate([kcagc.point_distances(z, z).ravel(), kcagc.point_distances(y, z).ravel()])
    assert d.max() == pytest.approx(4.0) and d.max() <= kcagc.UNIT_ROW_DISTANCE_BOUND
    assert kcagc.distance_bound("projection-unit", 1e6) == kcagc.distance_bound("normalized", 1e6) \
        == kcagc.UNIT_ROW_DISTANCE_BOUND
    assert kcagc.distance_bound("projection-unit", 2.0) == 2.0  # a tighter configured bound is kept
    for kind in ("projection", "svd", "filtered", "projection-joint-unit"):
        assert kcagc.distance_bound(kind, 1e6) == 1e6
    assert FixedPointEncoder(2.0**20, kcagc.UNIT_ROW_DISTANCE_BOUND, 511).dtype == np.uint32
    assert FixedPointEncoder(2.0**20, kcagc.UNIT_ROW_DISTANCE_BOUND, 512).dtype == np.uint64


def test_weighted_lloyd_on_virtual_nodes_equals_sklearn_from_the_same_centres():
    rng = np.random.default_rng(1)
    y = np.vstack([rng.normal(m, 1.0, size=(40, 3)) for m in (0, 4, 8)])
    w = rng.integers(1, 20, size=len(y)).astype(float)
    init = y[[0, 50, 100]]
    ours = lloyd_reference(y, w, init, iterations=20)
    ref = KMeans(3, init=init, n_init=1, max_iter=20, tol=0.0, algorithm="lloyd").fit(y, sample_weight=w)
    assert np.array_equal(ours, ref.labels_)


def test_moved_centres_are_those_whose_member_set_changed():
    rng = np.random.default_rng(3)
    kk = 5
    before = rng.integers(-1, kk, size=(4, 30))
    after = np.where(rng.random((4, 30)) < 0.1, rng.integers(-1, kk, size=(4, 30)), before)
    after[2] = before[2]  # a restart that has converged
    expected = [r * kk + j for r in range(4) for j in range(kk)
                if not np.array_equal(before[r] == j, after[r] == j)]
    got = kcagc.moved_centres(before, after, kk)
    assert got.tolist() == expected and len(expected) > 0 and not any(i // kk == 2 for i in expected)


def test_embeddings_of_the_filtered_block():
    data = load_dataset("sbm", seed=0, nodes=N, features=12, blocks=4, signal=3.0)
    from fedgraphcore.graph_filters import agc_embedding, low_pass_filter

    f = low_pass_filter(data.x, data.adj, 2)
    u = kcagc.embedding(data.x, data.adj, 4, 2, 0, "svd")[0]  # 12 columns: exact SVD of the dense block
    ref = agc_embedding(data.x, data.adj, 4, 2, 0)  # Lanczos SVD: same subspace, columns up to sign
    assert np.allclose(np.abs(u.T @ ref), np.eye(4), atol=1e-6)
    rows = kcagc.embedding(data.x, data.adj, 4, 2, 0, "normalized")[0]
    assert np.allclose(np.linalg.norm(rows, axis=1), 1.0) and np.allclose(rows * np.linalg.norm(u, axis=1)[:, None], u)
    # projection: same pairwise distances as the filtered rows projected on their top-4 right singular vectors
    p = kcagc.embedding(data.x, data.adj, 4, 2, 0, "projection")[0]
    v = np.linalg.svd(f, full_matrices=False)[2][:4].T
    assert np.allclose(p @ p.T, (f @ v) @ (f @ v).T, rtol=1e-6, atol=1e-6 * np.abs(p).max() ** 2)
    # projection-unit (the default): the projection's rows scaled to unit length
    q = kcagc.embedding(data.x, data.adj, 4, 2, 0)[0]
    assert np.allclose(np.linalg.norm(q, axis=1), 1.0) and np.allclose(q * np.linalg.norm(p, axis=1)[:, None], p)
    with pytest.raises(ValueError, match="valid choices: normalized, svd, projection, projection-unit, filtered, "
                                         "projection-joint-unit, projection-mixed-unit"):
        kcagc.embedding(data.x, data.adj, 4, 2, 0, "pca")


def test_joint_unit_rows_give_the_concatenation_unit_rows():
    data = load_dataset("sbm", seed=0, nodes=N, features=12, blocks=4, signal=3.0)
    shards = partition(data, "vertical", 3, seed=0)
    parts = [kcagc.embedding(s.x, s.adj, 4, 2, 0, "projection-joint-unit")[0] for s in shards]
    assert np.array_equal(parts[0], kcagc.embedding(shards[0].x, shards[0].adj, 4, 2, 0, "projection")[0])
    parts[1][:5] = 0.0  # a node with nothing on one party keeps its other parties' share
    parts = [np.vstack([p, np.zeros((1, p.shape[1]))]) for p in parts]  # ... and one with nothing anywhere
    total = sum((p ** 2).sum(1) for p in parts)
    joint = np.hstack([kcagc.joint_unit_rows(p, total) for p in parts])
    assert np.allclose(np.linalg.norm(joint[:-1], axis=1), 1.0) and not joint[-1].any()
    assert np.allclose(joint[:-1], np.hstack(parts)[:-1] / np.sqrt(total[:-1])[:, None])
    with pytest.raises(ValueError, match=f"joint squared norms must be {N + 1} finite values"):
        kcagc.joint_unit_rows(parts[0], np.append(total[:-1], np.nan))


def test_mixed_rows_lie_between_own_and_joint_unit_rows():
    data = load_dataset("sbm", seed=0, nodes=N, features=12, blocks=4, signal=3.0)
    shards = partition(data, "vertical", 3, seed=0)
    parts = [kcagc.embedding(s.x, s.adj, 4, 2, 0, "projection-mixed-unit")[0] for s in shards]
    assert np.array_equal(parts[0], kcagc.embedding(shards[0].x, shards[0].adj, 4, 2, 0, "projection")[0])
    parts[1][:5] = 0.0  # a zero row on one party stays zero there
    total = sum((p ** 2).sum(1) for p in parts)
    own = [kcagc.embedding(s.x, s.adj, 4, 2, 0, "projection-unit")[0] for s in shards]
    for p, unit in zip(parts, own):
        # beta = 1: the party's own unit rows; beta = 0: the joint scaling, bit for bit
        assert np.allclose(kcagc.joint_unit_rows(p, total, 1.0)[5:], unit[5:])
        assert np.array_equal(kcagc.joint_unit_rows(p, total, 0.0), kcagc.joint_unit_rows(p, total))
        # beta = 1/2: a block's squared length is its share of the node's joint norm
        half = kcagc.joint_unit_rows(p, total, 0.5)
        assert np.allclose((half ** 2).sum(1), np.linalg.norm(p, axis=1) / np.sqrt(total))
    assert not kcagc.joint_unit_rows(parts[1], total, 0.5)[:5].any()
    with pytest.raises(ValueError, match=r"own_exponent=1.5 is outside \[0, 1\]"):
        kcagc.joint_unit_rows(parts[0], total, 1.5)


def test_pruning_rule_keeps_only_confident_points():
    d = np.array([[1.0, 9.0, 20.0], [1.0, 8.0, 20.0], [5.0, 0.5, 100.0]])
    assert kcagc.prune(d).tolist() == [0, -1, 1]
    y = np.array([[0.0], [2.0], [10.0]])
    c = kcagc.update_centres(y, np.ones(3), np.array([[0, -1, 1]]), np.array([[[7.0], [7.0]]]))
    assert c[0, :, 0].tolist() == [0.0, 10.0]  # the unconfident point 2.0 is left out


def test_filter_order_defaults_and_tree_levels():
    assert kcagc.filter_order("cora", 0) == 9 and kcagc.filter_order("wiki", 0) == 2
    assert kcagc.filter_order("sbm", 0) is None and kcagc.filter_order("cora", -1) is None
    assert kcagc.filter_order("cora", 3) == 3
    assert kcagc.filter_order("citeseer", 0, "spectral-norm") == 5  # the paper's Appendix E.2
    assert kcagc.filter_order("wiki", 0, "spectral-norm") is None  # no paper value: adaptive
    with pytest.raises(ValueError, match="unknown graph filter 'heat'; valid choices: agc, spectral-norm"):
        kcagc.filter_order("cora", 3, "heat")
    # no client alone above the leaves: an odd one joins the last pair
    assert kcagc.tree_groups(5) == [[[0], [1], [2], [3], [4]], [[0, 1], [2, 3, 4]], [[0, 1, 2, 3, 4]]]
    assert kcagc.tree_groups(3) == [[[0], [1], [2]], [[0, 1, 2]]]


# --------------------------------------------------------------------------- end to end
@pytest.mark.shipped_defaults
@pytest.mark.parametrize("kind", ["agc", "spectral-norm"])
def test_one_client_equals_local_agc_kmeans(out_dir, kind):
    result = run_experiment("kcagc", "sbm", 1, {**SBM, "kcagc.filter-order": 2, "kcagc.embedding": "svd",
                                                "kcagc.filter": kind}, out_dir)
    data = load_dataset("sbm", seed=0, nodes=N, features=12, blocks=4, signal=3.0)
    ref, _ = agc(data.x, data.adj, 4, 0, order=2, kind=kind)
    labels = np.load(out_dir / "labels.npy")
    assert ari(ref, labels) == 1.0
    assert result["reference"]["agreement"]["ari"] == 1.0  # the strategy's own centralised AGC, same filter
    assert result["metrics"]["virtual_nodes"] == [4]
    check_page(out_dir, figures=2)  # 240 nodes drawn whole, the rounds


def test_every_node_its_own_virtual_node_equals_basic(tmp_path):
    common = {**SBM, "kcagc.filter-order": 2, "kcagc.restarts": 3}
    full = run_experiment("kcagc", "sbm", 3, {**common, "kcagc.local-factor": N}, tmp_path / "a")
    basic = run_experiment("kcagc-basic", "sbm", 3, common, tmp_path / "b")
    assert full["metrics"]["virtual_nodes"] == [N] == basic["metrics"]["virtual_nodes"]
    assert np.array_equal(np.load(tmp_path / "a" / "labels.npy"), np.load(tmp_path / "b" / "labels.npy"))
    assert full["metrics"]["aggregated_values"] == basic["metrics"]["aggregated_values"]


@pytest.mark.parametrize("kind", ["agc", "spectral-norm"])
def test_basic_equals_centralised_kmeans_on_the_concatenation(out_dir, kind):
    q = 6
    result = run_experiment("kcagc-basic", "sbm", 3, {**SBM, "kcagc.filter-order": 2, "kcagc.restarts": 1,
                                                      "kcagc.iterations": q, "kcagc.filter": kind}, out_dir)
    z = np.hstack(client_embeddings(3, order=2, filter_kind=kind))
    seeds = next(h["seeds"] for h in result["history"] if h.get("stage") == "seeds")[0]
    ref = KMeans(4, init=z[seeds], n_init=1, max_iter=q, tol=0.0, algorithm="lloyd").fit(z)
    labels = np.load(out_dir / "labels.npy")
    assert np.array_equal(labels, ref.labels_)
    assert np.array_equal(labels, lloyd_reference(z, np.ones(N), z[seeds], q))
    # the clients filtered with ``kind``: the secure sums give this embedding's inertia at the seeds
    first = next(h for h in result["history"] if h.get("stage") == "lloyd")["inertia"][0]
    assert first == pytest.approx(((z[:, None] - z[seeds][None]) ** 2).sum(2).min(1).sum(), rel=1e-5)
    # one secure sum per seeding step and per Lloyd iteration
    steps = [r for r in result["timing"]["per_round"] if r["action"] == "kcagc_step"]
    lloyd = [h for h in result["history"] if h.get("stage") == "lloyd"]
    assert len(steps) == (4 - 1) + len(lloyd) == result["communication"]["secure_aggregations"]


@pytest.mark.shipped_defaults
def test_basic_at_the_default_adaptive_order_equals_centralised_kmeans(out_dir):
    """AGC's adaptive rule picks a high order on the SBM: nearly parallel rows whose squared
    distances lie far below secagg.scale's 2^-20; the secure sums must still decide as floats do."""
    q = 6
    result = run_experiment("kcagc-basic", "sbm", 2, {"kcagc.restarts": 1, "kcagc.iterations": q}, out_dir)
    check_page(out_dir, figures=3)
    shards = partition(load_dataset("sbm", seed=0), "vertical", 2, seed=0)
    z = np.hstack([kcagc.embedding(s.x, s.adj, 4, None, 0, k_adaptive=4)[0] for s in shards])
    seeds = next(h["seeds"] for h in result["history"] if h.get("stage") == "seeds")[0]
    gaps = ((z[:, None] - z[seeds][None]) ** 2).sum(2)
    assert np.median(gaps) < 4 * 2.0 ** -20  # a few steps of the default resolution: rounding would decide
    ref = KMeans(4, init=z[seeds], n_init=1, max_iter=q, tol=0.0, algorithm="lloyd").fit(z)
    assert np.array_equal(np.load(out_dir / "labels.npy"), ref.labels_)
    # two clients in the 32-bit ring: 2 * round(4 * 2^27) < 2^31 is the finest power of two
    assert result["metrics"]["secagg_scale"] == 2.0 ** 27


def test_joint_unit_rows_by_one_secure_sum_then_basic_equals_centralised_kmeans(out_dir):
    q = 6
    result = run_experiment("kcagc-basic", "sbm", 3,
                            {**SBM, "kcagc.filter-order": 2, "kcagc.restarts": 1, "kcagc.iterations": q,
                             "kcagc.embedding": "projection-joint-unit"}, out_dir)
    parts = client_embeddings(3, order=2, kind="projection")
    total = sum((p ** 2).sum(1) for p in parts)
    z = np.hstack(parts) / np.sqrt(total)[:, None]  # the concatenation with unit rows
    seeds = next(h["seeds"] for h in result["history"] if h.get("stage") == "seeds")[0]
    ref = KMeans(4, init=z[seeds], n_init=1, max_iter=q, tol=0.0, algorithm="lloyd").fit(z)
    assert np.array_equal(np.load(out_dir / "labels.npy"), ref.labels_)
    # one extra secure sum (the n squared row norms), uploaded masked
    steps = [r for r in result["timing"]["per_round"] if r["action"] == "kcagc_step"]
    assert result["communication"]["secure_aggregations"] == len(steps) + 1
    joint = [u for u in result["privacy"]["uploads"] if u["action"] == "kcagc_joint" and u["name"] == "s"]
    assert len(joint) == 3 and all(u["masked"] and u["dtype"] == "uint64" and u["shape"] == [N] for u in joint)
    # jointly unit rows have no proved per-party bound (the norms are fixed-point sums): 64-bit ring
    assert {u["dtype"] for u in result["privacy"]["uploads"] if u["action"] == "kcagc_step"} == {"uint64"}
    revealed = {m["name"]: m for m in result["privacy"]["mechanisms"]}["kcagc:joint-row-norms"]
    assert "n values" in revealed["params"]["revealed"] and revealed["guarantee"].startswith("none")


def test_one_client_joint_unit_rows_equal_unit_rows(tmp_path):
    common = {**SBM, "kcagc.filter-order": 2, "kcagc.local-factor": 2}
    run_experiment("kcagc", "sbm", 1, {**common, "kcagc.embedding": "projection-joint-unit"}, tmp_path / "a")
    run_experiment("kcagc", "sbm", 1, common, tmp_path / "b")
    assert np.array_equal(np.load(tmp_path / "a" / "labels.npy"), np.load(tmp_path / "b" / "labels.npy"))


def test_mixed_rows_are_scaled_with_the_secure_sum_of_row_norms(tmp_path):
    # several clients: basic = centralised Lloyd on the mixed-scaled concatenation from the same seeds
    q = 6
    result = run_experiment("kcagc-basic", "sbm", 3,
                            {**SBM, "kcagc.filter-order": 2, "kcagc.restarts": 1, "kcagc.iterations": q,
                             "kcagc.embedding": "projection-mixed-unit", "kcagc.mix-exponent": 0.25},
                            tmp_path / "basic")
    parts = client_embeddings(3, order=2, kind="projection")
    total = sum((p ** 2).sum(1) for p in parts)
    own = [np.linalg.norm(p, axis=1) for p in parts]
    z = np.hstack([p / (o ** 0.25 * np.sqrt(total) ** 0.75)[:, None] for p, o in zip(parts, own)])
    seeds = next(h["seeds"] for h in result["history"] if h.get("stage") == "seeds")[0]
    ref = KMeans(4, init=z[seeds], n_init=1, max_iter=q, tol=0.0, algorithm="lloyd").fit(z)
    assert np.array_equal(np.load(tmp_path / "basic" / "labels.npy"), ref.labels_)
    assert {u["masked"] for u in result["privacy"]["uploads"] if u["action"] == "kcagc_joint" and u["name"] == "s"} == {True}
    # one client: its own norm is the joint norm, so any exponent gives projection-unit's clustering
    common = {**SBM, "kcagc.filter-order": 2, "kcagc.local-factor": 2}
    run_experiment("kcagc", "sbm", 1, {**common, "kcagc.embedding": "projection-mixed-unit"}, tmp_path / "a")
    run_experiment("kcagc", "sbm", 1, common, tmp_path / "b")
    assert np.array_equal(np.load(tmp_path / "a" / "labels.npy"), np.load(tmp_path / "b" / "labels.npy"))


def test_restarts_run_side_by_side_and_converged_ones_stop_uploading(out_dir):
    q, R, k = 10, 6, 4
    result = run_experiment("kcagc-basic", "sbm", 3,
                            {**SBM, "kcagc.filter-order": 2, "kcagc.restarts": R, "kcagc.iterations": q}, out_dir)
    z = np.hstack(client_embeddings(3, order=2))
    seeds = np.array(next(h["seeds"] for h in result["history"] if h.get("stage") == "seeds"))

    def plain_restart(init):  # Lloyd from init; inertia = distances to the centres of the last assignment
        centres, prev = init, None
        for _ in range(q + 1):
            d = ((z[:, None, :] - centres[None]) ** 2).sum(axis=2)
            a = d.argmin(axis=1)
            if prev is not None and np.array_equal(a, prev):
                break
            prev = a
            centres = kcagc.update_centres(z, np.ones(N), a[None], centres[None])[0]
        return prev, d.min(axis=1).sum()

    refs = [plain_restart(z[s]) for s in seeds]
    best = int(np.argmin([i for _, i in refs]))
    assert np.array_equal(np.load(out_dir / "labels.npy"), refs[best][0])
    lloyd = [h for h in result["history"] if h.get("stage") == "lloyd"]
    assert lloyd[-1]["inertia"][0] == pytest.approx(refs[best][1], rel=1e-6)
    # the first Lloyd round measures only the last seed of each restart (the seeding rounds summed
    # the others); later, only centres whose members changed; a restart without one has converged
    measured = [R] + [h["moved"][0] for h in lloyd[:-1]]
    assert sum(measured) < R * k * len(lloyd)
    assert result["metrics"]["aggregated_values"] == (k - 1) * R * N + sum(measured) * N


class DroppingGrid(InProcessGrid):
    """Records the traffic; the last node leaves at the ``drop_at_step``-th Lloyd step."""

    def __init__(self, *args, drop_at_step: int | None = None, **kwargs):
        super().__init__(*args, record=True, **kwargs)
        self.drop_at_step, self.steps = drop_at_step, 0

    def push_messages(self, messages):
        messages = list(messages)
        if messages and messages[0].metadata.message_type == "query.kcagc_step":
            self.steps += 1
            if self.steps == self.drop_at_step:  # a participant leaves mid-protocol
                self.dropped.add(max(self.contexts))
        return super().push_messages(messages)


def test_secure_sum_equals_plain_sum_and_server_sees_only_masked_distances(out_dir):
    raw = {**SBM, "strategy": "kcagc-basic", "dataset": "sbm", "num-clients": 2, "kcagc.filter-order": 2,
           "kcagc.restarts": 1, "kcagc.iterations": 2, "out-dir": str(out_dir)}
    grid = DroppingGrid(build_client_app(raw), 2)
    result = run_server(grid, raw)
    z = client_embeddings(2, order=2)
    seeds = next(h["seeds"] for h in result["history"] if h.get("stage") == "seeds")[0]
    # first Lloyd round: the distances to the last seed (the seeding rounds summed those to the others)
    down = [m for m in grid.pushed if m.metadata.message_type == "query.kcagc_step"
            and "seeds" in unpack(m.content)[0]]
    assert len(down) == 2
    values = unpack(down[0].content)[1]
    ids = {m.metadata.message_id for m in down}
    replies = {grid.contexts[r.metadata.src_node_id].node_config["partition-id"]: unpack(r.content)[0]["d"]
               for r in grid.pulled if r.metadata.reply_to_message_id in ids}
    encoder = FixedPointEncoder(values["secagg_scale"], values["secagg_bound"], values["secagg_parties"])
    summed = unmask_sum(replies, {0, 1}, encoder)
    parts = [kcagc.point_distances(zl, zl[seeds[-1:]]).ravel() for zl in z]
    assert np.allclose(summed, parts[0] + parts[1], atol=1e-5)
    # unit rows: every part is at most 4, so the sums travel in the 32-bit ring
    assert values["secagg_bound"] == kcagc.UNIT_ROW_DISTANCE_BOUND and encoder.dtype == np.uint32
    for p, d in replies.items():
        assert d.dtype == np.uint32
        assert not np.array_equal(d, encoder.encode(parts[p]))  # never the client's own distances
        assert len(np.unique(d >> np.uint32(28))) > 8  # uniform-looking, not small fixed-point values
    uploads = [u for u in result["privacy"]["uploads"] if u["action"] == "kcagc_step"]
    assert uploads and all(u["masked"] and u["dtype"] == "uint32" for u in uploads)
    # the assignments sent down travel as int8 (clusters -1..k-1)
    k = result["config"]["num-clusters"]
    assigns = [unpack(m.content)[0]["assign"] for m in grid.pushed if m.metadata.message_type == "query.kcagc_step"
               and "assign" in unpack(m.content)[0]]
    assert assigns and all(a.dtype == np.int8 and a.min() >= -1 and a.max() < k for a in assigns)
    assert "secure-aggregation" in {m["name"] for m in result["privacy"]["mechanisms"]}


def test_participant_dropping_mid_protocol_stops_with_a_clear_error(out_dir):
    raw = {**SBM, "strategy": "kcagc", "dataset": "sbm", "num-clients": 3, "kcagc.filter-order": 2,
           "kcagc.local-factor": 2, "timeout": 2.0, "out-dir": str(out_dir)}
    grid = DroppingGrid(build_client_app(raw), 3, drop_at_step=3)
    with pytest.raises(ProtocolError, match=r"step .kcagc_step. rejected 1 client"):
        run_server(grid, raw)
    assert not (out_dir / RESULT_FILE).exists()


def test_kcagc_recovers_blocks_with_fewer_secure_values_than_basic(tmp_path):
    common = {**SBM, "kcagc.filter-order": 2}
    fed = run_experiment("kcagc", "sbm", 2, common, tmp_path / "a")
    basic = run_experiment("kcagc-basic", "sbm", 2, common, tmp_path / "b")
    # default projection-unit embedding: measured 0.801, 0.853
    assert fed["metrics"]["ari"] > 0.7 and basic["metrics"]["ari"] > 0.8
    assert fed["metrics"]["aggregated_values"] < 0.2 * basic["metrics"]["aggregated_values"]
    assert fed["communication"]["bytes_up"] < basic["communication"]["bytes_up"]
    local = [u for u in fed["privacy"]["uploads"] if u["action"] == "kcagc_local"]
    assert {u["name"] for u in local} == {"labels"} and not any(u["masked"] for u in local)
    assert fed["metrics"]["filter_order"] == basic["metrics"]["filter_order"] == 2  # configured, not uploaded
    assert "kcagc:tree-group-sums" not in {m["name"] for m in fed["privacy"]["mechanisms"]}


def test_tree_variant_with_an_odd_number_of_clients(out_dir):
    q = 2
    raw = {**SBM, "strategy": "kcagc", "dataset": "sbm", "num-clients": 5, "kcagc.filter-order": 2,
           "kcagc.local-factor": 2, "kcagc.tree": True, "kcagc.iterations": q, "out-dir": str(out_dir)}
    grid = DroppingGrid(build_client_app(raw), 5)
    tree = run_server(grid, raw)
    assert tree["metrics"]["ari"] > 0.5  # flat protocol: ~0.8; each internal node re-clusters to k_hat
    # level 1: clients (0, 1) and (2, 3, 4) re-clustered to k_hat (no client alone); level 2: root to k
    local = {grid.contexts[r.metadata.src_node_id].node_config["partition-id"]: unpack(r.content)[0]["labels"]
             for r in grid.pulled if r.metadata.message_type == "query.kcagc_local"}
    root_members = next(unpack(m.content)[0]["members"] for m in grid.pushed
                        if m.metadata.message_type == "query.kcagc_step" and unpack(m.content)[1]["level"] == 2
                        and "members" in unpack(m.content)[0])
    pairs = set(zip(local[0].tolist(), local[1].tolist()))  # the non-empty intersections of clients 0 and 1
    triples = set(zip(local[2].tolist(), local[3].tolist(), local[4].tolist()))
    assert tree["metrics"]["virtual_nodes"] == [len(pairs), len(triples), int(root_members.max()) + 1]
    # at most Q = 2 updates per level, fewer only when every restart's assignment repeats
    lloyd = [h for h in tree["history"] if h.get("stage") == "lloyd"]
    assert len(tree["metrics"]["lloyd_iterations"]) == 2
    for level, iterations in enumerate(tree["metrics"]["lloyd_iterations"], start=1):
        rounds = [h for h in lloyd if h["level"] == level]
        assert iterations == len(rounds) - 1
        assert iterations == q or not any(rounds[-1]["moved"])
    groups = {m["name"]: m for m in tree["privacy"]["mechanisms"]}["kcagc:tree-group-sums"]["params"]
    assert groups["groups_per_level"] == [{"level": 1, "groups": [[0, 1], [2, 3, 4]]},
                                          {"level": 2, "groups": [[0, 1, 2, 3, 4]]}]


def test_tree_sums_each_internal_node_among_its_own_clients(out_dir):
    result = run_experiment("kcagc", "sbm", 4, {**SBM, "kcagc.filter-order": 2, "kcagc.local-factor": 2,
                                                "kcagc.tree": True, "kcagc.restarts": 2}, out_dir)
    k_hat, k = 8, 4
    # level 1: pairs (0, 1) and (2, 3), one secure sum each per round in which the pair still has an
    # unconverged restart; root: one sum over all four
    lloyd = [h for h in result["history"] if h.get("stage") == "lloyd"]
    sums = 2 * (k_hat - 1) + (k - 1)
    for level in (1, 2):
        its = [h for h in lloyd if h["level"] == level]
        sums += len(its[0]["moved"]) + sum(sum(mv > 0 for mv in h["moved"]) for h in its[:-1])
    assert result["communication"]["secure_aggregations"] == sums
    groups = {m["name"]: m for m in result["privacy"]["mechanisms"]}["kcagc:tree-group-sums"]["params"]
    assert groups["groups_per_level"] == [{"level": 1, "groups": [[0, 1], [2, 3]]},
                                          {"level": 2, "groups": [[0, 1, 2, 3]]}]
    steps = [u for u in result["privacy"]["uploads"] if u["action"] == "kcagc_step"]
    assert steps and all(u["masked"] for u in steps)
    assert result["metrics"]["ari"] > 0.4  # 3 features per client, each pair re-clusters: lossy (~0.54)


def test_bad_configuration_is_one_line(out_dir):
    with pytest.raises(ConfigError, match="partitioner 'node-random' does not fit strategy 'kcagc'"):
        run_experiment("kcagc", "sbm", 2, {"partitioner": "node-random"}, out_dir)
    with pytest.raises(ConfigError, match="valid choices: normalized, svd, projection, projection-unit, filtered, "
                                          "projection-joint-unit, projection-mixed-unit"):
        run_experiment("kcagc-basic", "sbm", 2, {"kcagc.embedding": "pca"}, out_dir)
    with pytest.raises(ConfigError, match=r"value 1.5 for 'kcagc.mix-exponent' is out of range; valid range: \[0, 1\]"):
        run_experiment("kcagc", "sbm", 2, {"kcagc.mix-exponent": 1.5}, out_dir)
    with pytest.raises(ConfigError, match="kcagc.local-factor"):
        run_experiment("kcagc", "sbm", 2, {"kcagc.local-factor": 0}, out_dir)
    with pytest.raises(ConfigError, match="'heat'.*valid choices: agc, spectral-norm"):
        run_experiment("kcagc", "sbm", 2, {"kcagc.filter": "heat"}, out_dir)
    assert not out_dir.exists()


def test_more_clients_than_columns_stops_with_one_line(out_dir, capsys):
    # the command line splits the data before any engine starts: one line, exit 2, no result
    argv = ["--strategy", "kcagc", "--dataset", "sbm", "--num-clients", "17", "--engine", "inprocess",
            "--out", str(out_dir)]
    assert run_main(argv) == 2
    assert capsys.readouterr().err == "error: cannot split 16 feature columns of 'sbm' over 17 clients\n"
    assert not out_dir.exists()
    # in a deployment every client refuses its shard: the identical refusals are said once
    raw = {"strategy": "kcagc", "dataset": "sbm", "num-clients": 17, "out-dir": str(out_dir)}
    with pytest.raises(ProtocolError) as err:
        run_server(InProcessGrid(build_client_app(raw), 17), raw)
    assert str(err.value).startswith("step 'hello' rejected 17 client(s)")
    assert str(err.value).count("cannot split 16 feature columns of 'sbm' over 17 clients") == 1
    assert not (out_dir / RESULT_FILE).exists()


def test_adaptive_filter_order_is_chosen_per_client_and_not_uploaded(out_dir):
    # protocol: each client picks psi by AGC's adaptive rule on its own columns
    data = load_dataset("sbm", seed=0, nodes=N, features=12, blocks=4, signal=3.0)
    for shard in partition(data, "vertical", 2, seed=0):
        z, order = kcagc.embedding(shard.x, shard.adj, 4, None, 0, k_adaptive=4)
        assert order == agc(shard.x, shard.adj, 4, 0, order=None, n_init=3)[1]
        assert np.array_equal(z, kcagc.embedding(shard.x, shard.adj, 4, order, 0)[0])
    # run: the order stays on the client; only the local labels go up
    raw = {**SBM, "strategy": "kcagc", "dataset": "sbm", "num-clients": 2, "kcagc.filter-order": -1,
           "out-dir": str(out_dir)}
    grid = DroppingGrid(build_client_app(raw), 2)
    result = run_server(grid, raw)
    local = [unpack(r.content) for r in grid.pulled if r.metadata.message_type == "query.kcagc_local"]
    assert len(local) == 2 and all(set(a) == {"labels"} and not v for a, v in local)
    assert {u["name"] for u in result["privacy"]["uploads"] if u["action"] == "kcagc_local"} == {"labels"}
    assert result["metrics"]["filter_order"] == "adaptive (per client, not disclosed)"
    assert result["metrics"]["ari"] > 0.5


def test_local_labels_out_of_range_are_rejected_naming_the_client(out_dir, monkeypatch):
    # client 1 numbers its clusters from 1 to k_hat
    patch_reply(monkeypatch, KCAGCClient, "kcagc_local",
                lambda shard, out, vals: ({"labels": out["labels"] + 1}, vals), client=1)
    with pytest.raises(ProtocolError, match=r"client 1 \(node \d+\) sent local cluster labels 1\.\.4, "
                                            r"outside 0\.\.3 \(k_hat=4\)"):
        run_experiment("kcagc", "sbm", 2, {**SBM, "kcagc.filter-order": 2}, out_dir)


@pytest.mark.parametrize("action, name, step", [("kcagc_joint", "s", r"kcagc_joint"),
                                                ("kcagc_step", "d", r"kcagc_step \(\w+, level 1\)")])
def test_a_negative_squared_norm_or_distance_stops_the_run(out_dir, monkeypatch, action, name, step):
    """One client, so its parts go up unmasked: a negative part gives a negative sum."""
    patch_reply(monkeypatch, KCAGCClient, action,
                lambda shard, out, vals: ({name: -1.0 - out[name]} if name in out else out, vals))
    with pytest.raises(ProtocolError, match=step + r"': a summed squared \w+ .* < 0; every client's part is >= 0"):
        run_experiment("kcagc", "sbm", 1, {**SBM, "kcagc.filter-order": 2,
                                           "kcagc.embedding": "projection-joint-unit"}, out_dir)
    assert not (out_dir / RESULT_FILE).exists()


def test_clients_disagreeing_on_the_node_count_are_rejected(out_dir, monkeypatch):
    honest = KCAGCClient.on_hello

    def fewer(self, arrays, values):
        out, summary = honest(self, arrays, values)
        return out, {**summary, "num_rows": summary["num_rows"] - self.shard.client_id}

    monkeypatch.setattr(KCAGCClient, "on_hello", fewer)
    with pytest.raises(ProtocolError, match=r"every client to hold all nodes.*\{0: 240, 1: 239\}"):
        run_experiment("kcagc", "sbm", 2, {**SBM, "kcagc.filter-order": 2}, out_dir)


def test_a_negative_secure_sum_is_rejected_as_malformed(out_dir, monkeypatch):
    honest = KCAGCClient.masked

    def negative(self, array, values, participants=None, floor=None):  # client 0 uploads -1, not its distances
        return honest(self, -np.ones_like(array) if self.shard.client_id == 0 else array, values, participants, floor)

    monkeypatch.setattr(KCAGCClient, "masked", negative)
    with pytest.raises(ProtocolError, match=r"step 'kcagc_step \(seed, level 1\)': a summed squared distance "
                                            r".* < 0"):
        run_experiment("kcagc-basic", "sbm", 2, {**SBM, "kcagc.filter-order": 2, "kcagc.restarts": 1}, out_dir)


def test_a_secure_sum_above_the_clients_bounds_is_rejected_as_malformed(out_dir, monkeypatch):
    honest = KCAGCClient.masked

    def inflated(self, array, values, participants=None, floor=None):  # client 0 adds 7 to every masked part
        up = honest(self, array, values, participants, floor)
        extra = np.array(7 * int(values["secagg_scale"]), dtype=up.dtype) if self.shard.client_id == 0 else 0
        return up + extra

    monkeypatch.setattr(KCAGCClient, "masked", inflated)
    # unit rows: a part is at most 4, so two clients' sum at most 8 (and at least the 7 added)
    with pytest.raises(ProtocolError, match=r"^secure sum '\d+:d0': the unmasked sum over 2 parties reaches "
                                            r"[\d.]+, beyond 2 x the declared bound 4: an upload is not an honest"):
        run_experiment("kcagc-basic", "sbm", 2, {**SBM, "kcagc.filter-order": 2, "kcagc.restarts": 1}, out_dir)
    assert not (out_dir / RESULT_FILE).exists()


def _kcagc_benchmark():
    """benchmarks/kcagc.py as a module (the benchmarks directory is not a package)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "kcagc.py"
    spec = importlib.util.spec_from_file_location("kcagc_benchmark", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_all_columns_svd_at_d_equal_k_is_centralised_agc():
    bench = _kcagc_benchmark()
    data = load_dataset("sbm")
    runs = bench.all_columns_runs("sbm", [2], [1, 2], ("svd", "projection-unit"), [0, 1], restarts=10)
    assert len(runs) == 2 * 2 * 2
    for seed in (0, 1):
        labels, _ = agc(data.x, data.adj, data.num_classes, seed, order=2, n_init=10)
        (run,) = [r for r in runs if r["seed"] == seed and r["dim"] == 1 and r["embedding"] == "svd"]
        assert run["ari"] == pytest.approx(ari(data.y, labels), abs=1e-12)
    best = bench.all_columns_best({"runs": runs}, "sbm")
    assert best[0] == max(np.mean([r["acc"] for r in runs if (r["embedding"], r["dim"]) == key])
                          for key in {(r["embedding"], r["dim"]) for r in runs})


@pytest.mark.parametrize("argv, message", [
    (["--parts", "all-columns", "--dims", "1,0"], "argument --dims: invalid value '0'; valid: ints >= 1"),
    (["--parts", "all-columns", "--datasets", "sbm"], "part 'all-columns' needs --orders for dataset 'sbm'"),
    (["--parts", "order", "--clients", "2", "--factors", "1", "--orders", "9,x"],
     "argument --orders: invalid value 'x'; valid: ints >= 1"),
])
def test_benchmark_rejects_bad_all_columns_and_order_arguments(argv, message, capsys):
    from harness import run_script

    assert run_script(lambda: _kcagc_benchmark().main(argv)) == 2
    assert message in capsys.readouterr().err


def test_kcagc_basic_reads_the_kcagc_keys_of_protocol_2_only():
    """The unused-key warning named kcagc.filter-order for kcagc-basic, which does read it."""
    from app.registry import unused_keys, validate

    keys = ["kcagc.filter-order", "kcagc.embedding", "kcagc.restarts", "kcagc.prune", "kcagc.local-factor",
            "kcagc.local-restarts", "kcagc.tree"]
    config = validate({"strategy": "kcagc-basic", "dataset": "cora", "kcagc.filter-order": 1})
    assert unused_keys(config, keys) == ["kcagc.local-factor", "kcagc.local-restarts", "kcagc.tree"]
    assert unused_keys(validate({"strategy": "kcagc", "dataset": "cora"}), keys) == []
