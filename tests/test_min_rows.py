"""The node-policy rule ``min-rows``: no statistic the server reads sums fewer of a node's rows.

The protocol functions are checked directly (fedkmeans' initial centres and Lloyd statistics),
the policy's defaults and refusals on their own, and fedsc / fedspectral-plus through a real
in-process run. What a malicious server reads at the extremes of every key it controls is
tests/test_malicious_server.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.cluster import KMeans

from app.client_app import build_client_app
from fedgraphcore.config import ConfigError
from app.inprocess import InProcessGrid
from fedgraphcore.privacy.policy import MIN_ROWS, PrivacyRefusal, node_policy
from fedgraphcore.protocols import fedkmeans
from app.server_app import run_server
from fedgraphcore.session import PrivacyRefused


def blobs(sizes, width=3, seed=0) -> np.ndarray:
    """Rows in tight, well separated groups of the given sizes."""
    rng = np.random.default_rng(seed)
    return np.vstack([rng.normal(10.0 * i, 0.1, size=(n, width)) for i, n in enumerate(sizes)])


def test_every_initial_centre_is_the_mean_of_at_least_min_rows_rows():
    x = blobs([1, 2, 30, 40])  # a one-row and a two-row group: k-means++ with k=4 isolates them
    centres, counts, _ = fedkmeans.local_seeds(x, 4, seed=0, min_rows=5)
    assert counts.min() >= 5 and counts.sum() == len(x)
    # each centre is the mean of the rows it counts: the rows nearest to it
    labels = fedkmeans.assign(x, centres)[0]
    np.testing.assert_allclose(centres, np.stack([x[labels == j].mean(0) for j in range(len(centres))]))
    assert not any(np.allclose(c, row) for c in centres for row in x)


def test_at_most_rows_over_min_rows_centres_even_when_the_server_asks_for_one_per_row():
    x = blobs([6, 6, 6, 6, 6])
    centres, counts, _ = fedkmeans.local_seeds(x, len(x), seed=0, min_rows=5)
    assert len(centres) <= len(x) // 5 and counts.min() >= 5
    with pytest.raises(ValueError, match="4 rows cannot give a centre of at least 5 rows"):
        fedkmeans.local_seeds(x[:4], 2, seed=0, min_rows=5)


def test_with_min_rows_one_the_initial_centres_are_local_k_means_plus_plus():
    x = blobs([1, 2, 30, 40])
    centres, counts, labels = fedkmeans.local_seeds(x, 4, seed=3, min_rows=1)
    km = KMeans(4, init="k-means++", n_init=1, random_state=3).fit(x)
    np.testing.assert_allclose(centres, km.cluster_centers_)
    np.testing.assert_array_equal(counts, np.bincount(km.labels_, minlength=4))
    np.testing.assert_array_equal(labels, km.labels_)


def test_a_cluster_of_fewer_than_min_rows_rows_is_withheld_from_the_sums():
    x = blobs([1, 2, 30])
    centres = np.stack([x[0], x[1], x[10]])  # a centre on one row: the server's probe
    sums, counts, withheld, inertia, audit = fedkmeans.lloyd_statistics(x, centres, 5, fedkmeans.Audit.empty(len(x)))
    assert counts.tolist() == [0, 0, 30] and withheld == 3 and audit.basis.shape == (33, 1)
    np.testing.assert_allclose(sums[:2], 0.0)
    np.testing.assert_allclose(sums[2], x[3:].sum(0))
    assert inertia == pytest.approx(((x[3:] - x[10]) ** 2).sum())  # the rows sent only
    plain = fedkmeans.lloyd_statistics(x, centres)
    assert plain[1].tolist() == [1, 2, 30] and plain[2] == 0.0 and plain[4] is None
    np.testing.assert_allclose(plain[0][0], x[0])  # what the rule stops: a one-row sum is the row


def test_a_sum_that_would_determine_a_row_with_the_sums_sent_before_is_withheld():
    """Differencing: the sums of rows {0..9} and then {1..9} would give row 0."""
    rows, basis = np.arange(20), fedkmeans.Audit.empty(20).basis
    basis, sent = fedkmeans.admit(basis, rows < 10, 5)
    assert sent
    basis, sent = fedkmeans.admit(basis, (rows >= 1) & (rows < 10), 5)
    assert not sent and basis.shape == (20, 1)
    basis, sent = fedkmeans.admit(basis, rows < 10, 5)  # the same set again adds nothing: sent
    assert sent and basis.shape == (20, 1)


def test_a_row_that_alone_would_change_cluster_stays_in_its_last_one():
    first = np.repeat([0, 1, 2], 10)
    labels, sent, audit = fedkmeans.release(first, 3, 5, fedkmeans.Audit.empty(30))
    assert sent.all() and (labels == first).all() and audit.basis.shape == (30, 3)
    moved = first.copy()
    moved[0] = 1  # row 0 alone leaves cluster 0: the difference of its two sums would be that row
    labels, sent, again = fedkmeans.release(moved, 3, 5, audit)
    assert (labels == first).all() and sent.all() and again.basis.shape == (30, 3)
    moved[20:25] = 1  # five rows leave cluster 2 together: no row follows from those sums
    labels, sent, after = fedkmeans.release(moved, 3, 5, audit)
    assert labels[0] == 0 and (labels[20:25] == 1).all() and (labels[1:20] == first[1:20]).all()
    assert after.basis.shape == (30, 4)


def in_span(queries: list[np.ndarray], i: int) -> bool:
    """Independent oracle: e_i lies in the span of the 0/1 query vectors (a rank test)."""
    q = np.array(queries, dtype=float)
    e = np.zeros(q.shape[1])
    e[i] = 1.0
    return np.linalg.matrix_rank(np.vstack([q, e])) == np.linalg.matrix_rank(q)


@pytest.mark.parametrize("seed", range(5))
def test_no_row_is_ever_in_the_span_of_the_sums_admitted(seed):
    rng = np.random.default_rng(seed)
    n, min_rows, basis, sent = 24, 3, fedkmeans.Audit.empty(24).basis, []
    for _ in range(200):  # random row sets, as a server choosing centres would make them
        member = rng.random(n) < rng.uniform(0.1, 0.9)
        basis, ok = fedkmeans.admit(basis, member, min_rows)
        if ok:
            sent.append(member.astype(float))
    assert len(sent) > 10  # the audit is not a refusal of everything
    assert not any(in_span(sent, i) for i in range(n))
    assert np.linalg.matrix_rank(np.array(sent)) <= n - min_rows + 1


def test_statistics_round_trip_through_one_vector():
    sums, counts = np.arange(6.0).reshape(2, 3), np.array([4.0, 5.0])
    stats = fedkmeans.join_statistics(sums, counts, 2.0, 7.5)
    back = fedkmeans.split_statistics(stats, 2)
    np.testing.assert_array_equal(back[0], sums)
    np.testing.assert_array_equal(back[1], counts)
    assert back[2:] == (2.0, 7.5)


def test_fewer_local_centres_than_clusters_split_the_heaviest():
    centres, weights = np.array([[0.0, 0.0], [10.0, 10.0], [20.0, 0.0]]), np.array([5.0, 30.0, 8.0])
    merged = fedkmeans.merge_seeds(centres, weights, 5, seed=0)
    assert merged.shape == (5, 2)
    np.testing.assert_array_equal(merged[:3], centres)
    # the two extra centres start next to the heaviest ones (30, then 8 rows), apart from each other
    assert np.abs(merged[3] - centres[1]).max() < 0.1 and np.abs(merged[4] - centres[2]).max() < 0.1
    assert len(np.unique(merged, axis=0)) == 5
    with pytest.raises(ConfigError, match="num-clusters=2 needs at least one local centre"):
        fedkmeans.merge_seeds(np.empty((0, 2)), np.empty(0), 2, seed=0)


def test_the_starts_begin_at_the_merged_seeds_then_differ_and_the_least_inertia_per_row_sent_wins():
    rng = np.random.default_rng(0)
    centres, weights = rng.normal(size=(12, 3)), rng.integers(5, 40, size=12).astype(float)
    starts = fedkmeans.starting_centres(centres, weights, 3, seed=0, restarts=4)
    assert starts.shape == (4, 3, 3)
    np.testing.assert_array_equal(starts[0], fedkmeans.merge_seeds(centres, weights, 3, seed=0))
    assert len({s.tobytes() for s in starts}) == 4
    np.testing.assert_array_equal(starts, fedkmeans.starting_centres(centres, weights, 3, seed=0, restarts=4))
    sums = np.zeros((2, 3))
    # start 1 has the smaller inertia but withheld half its rows: per row sent, start 2 is better
    totals = np.stack([fedkmeans.join_statistics(sums, np.array(c, float), w, i) for c, w, i in
                       [([10, 10, 10], 0, 90.0), ([5, 5, 5], 15, 60.0), ([10, 10, 10], 0, 75.0)]])
    assert fedkmeans.best_start(totals, 3) == 2
    assert fedkmeans.best_start(totals[[0, 0]], 3) == 0  # the first of equals


# -- the policy ------------------------------------------------------------------------------
def test_the_rule_applies_to_every_registered_strategy():
    from fedgraphcore.privacy.policy import EVERY
    from app.registry import STRATEGIES

    assert set(EVERY) == set(STRATEGIES)


def test_the_hello_centres_start_the_audit_with_their_local_clusters():
    labels = np.repeat([0, 1, 2], [5, 7, 8])
    audit = fedkmeans.Audit.of_seeds(labels, 3, 5)
    assert audit.basis.shape == (20, 3) and audit.labels is None
    np.testing.assert_allclose(np.einsum("ij,ij->i", audit.basis, audit.basis), 1 / np.bincount(labels)[labels])


def test_min_rows_defaults_and_a_nodes_own_value():
    default = node_policy({})
    assert default.for_strategy("fedkmeans")["min-rows"] == MIN_ROWS == 5
    assert default.for_strategy("kcagc")["min-rows"] == MIN_ROWS
    # one row of an image per row of the data: the papers' noise-free modes run unless a node asks
    assert default.for_strategy("fedsc")["min-rows"] == 1
    assert default.for_strategy("fedspectral-plus")["min-rows"] == 1
    strict = node_policy({"privacy.all.min-rows": 3})
    assert {strict.for_strategy(s)["min-rows"] for s in ("fedkmeans", "fedsc", "fedspectral-plus")} == {3}
    with pytest.raises(ConfigError, match=r"value 0 for 'min-rows' is out of range"):
        node_policy({"privacy.all.min-rows": 0})


def test_a_noise_free_row_image_is_refused_above_one_row_and_a_noised_one_passes():
    policy = node_policy({"privacy.all.min-rows": 2}).for_strategy("fedsc")
    with pytest.raises(PrivacyRefusal, match=r"rule 'min-rows': 'fedsc_final' was requested without noise"):
        policy.check_row_images("fedsc_final", None)
    policy.check_row_images("fedsc_final", 1.0)
    node_policy({}).for_strategy("fedsc").check_row_images("fedsc_final", None)


# -- through a run -----------------------------------------------------------------------------
SMALL = {"dataset": "sbm", "sbm.nodes": 90, "sbm.features": 6, "sbm.blocks": 3, "sbm.p-in": 0.3, "sbm.p-out": 0.02,
         "num-clusters": 3, "reference": False, "seed": 1, "num-clients": 3}


def run(raw: dict, policy: dict, tmp_path):
    raw = {**SMALL, **raw, "out-dir": str(tmp_path / "run")}
    nodes = [{"partition-id": i, "num-partitions": 3, **{f"privacy.all.{k}": v for k, v in policy.items()}}
             for i in range(3)]
    return run_server(InProcessGrid(build_client_app(raw), 3, nodes), raw)


@pytest.mark.parametrize("raw, step", [
    ({"strategy": "fedsc", "fedsc.landmarks": 10, "num-rounds": 2}, "fedsc_final"),
    ({"strategy": "fedspectral-plus"}, "fedspectral_product"),
], ids=["fedsc", "fedspectral-plus"])
def test_a_node_asking_for_min_rows_refuses_the_noise_free_row_images(raw, step, tmp_path):
    with pytest.raises(PrivacyRefused, match=rf"step '{step}'.*rule 'min-rows'") as stopped:
        run(raw, {"min-rows": 2}, tmp_path)
    assert {rule for rule, _ in stopped.value.refusals.values()} == {"min-rows"}


def test_a_node_asking_for_min_rows_runs_the_noised_fedspectral_plus(tmp_path):
    result = run({"strategy": "fedspectral-plus", "fedspectral-plus.noise-multiplier": 0.5,
                  "fedspectral-plus.rounds": 2}, {"min-rows": 2}, tmp_path)
    assert np.load(tmp_path / "run" / "labels.npy").shape == (90,)
    assert result["privacy"]["epsilon"] > 0


def sweep(session, rows: dict[int, int], f: int, rng) -> dict[int, list[np.ndarray]]:
    """A malicious server's differencing attack: two centres whose bisector is the plane u.x = theta;
    theta bisected, per node, until one row changes side between two readings, whose difference of
    below-sums (a side's sum, or the total less the other side's when it is withheld) is that row.
    Returns, per node, every vector it took for a row."""
    from fedgraphcore.transport import pack, unpack

    u = rng.normal(size=f)
    u /= np.linalg.norm(u)
    spec = fedkmeans.step_reply(1, 2 * f + 2 + 2, False)
    readings: dict[float, dict] = {}

    def read(theta: float) -> dict[int, tuple]:
        if theta not in readings:
            centres = np.stack([(theta - 1.0) * u, (theta + 1.0) * u])
            replies = session.broadcast(fedkmeans.KMEANS_STEP, pack({"starts": np.array([0]), "centres": centres[None]}),
                                        spec)
            readings[theta] = {node: fedkmeans.split_statistics(unpack(c)[0]["stats"][0], 2)
                               for node, c in replies.items()}
        return readings[theta]

    total = {node: s[0][1] for node, s in read(-1e6).items()}  # every row on the upper side

    def below(node: int, theta: float) -> tuple[int | None, np.ndarray | None]:
        sums, counts, _, _ = read(theta)[node]
        if counts.sum() == rows[node]:
            return int(counts[0]), sums[0]
        if counts[1] > 0:  # the lower side withheld: the total less the upper side
            return int(rows[node] - counts[1]), total[node] - sums[1]
        return (int(counts[0]), sums[0]) if counts[0] > 0 else (None, None)

    taken = {node: [] for node in rows}

    def split(node: int, a: float, b: float, depth: int = 0) -> None:
        (ca, sa), (cb, sb) = below(node, a), below(node, b)
        if ca is None or cb is None or cb == ca or depth > 40:
            return
        if cb - ca == 1:
            taken[node].append(sb - sa)
            return
        split(node, a, (a + b) / 2, depth + 1)
        split(node, (a + b) / 2, b, depth + 1)

    for node in rows:
        split(node, -1e6, 1e6)
    return taken


@pytest.mark.integration
def test_a_differencing_server_takes_no_row_from_fedkmeans_under_the_default_policy(monkeypatch, tmp_path):
    """The server moves a plane through the rows round after round and subtracts the sums it
    reads; under ``min-rows`` (its default 5) no difference it can take is one of the rows."""
    from clients.fedkmeans import FedKMeansClient
    from strategies.fedkmeans import FedKMeans

    taken, clients = {}, {}
    rng = np.random.default_rng(0)

    class Swept(Exception):
        """The sweep is over (the run has nothing more to show)."""

    def attack(self, session, rows, centres):
        taken.update(sweep(session, rows, centres.shape[2], rng))
        raise Swept

    step = FedKMeansClient.on_kmeans_step

    def remember(self, arrays, values):
        clients[int(self.context.node_id)] = self.features()
        return step(self, arrays, values)

    monkeypatch.setattr(FedKMeans, "_lloyd_rounds", attack)
    monkeypatch.setattr(FedKMeansClient, "on_kmeans_step", remember)
    with pytest.raises(Swept):  # as many Lloyd steps as the sweep takes: the audit, not the step count, is tried
        run({"strategy": "fedkmeans", "num-clusters": 2, "num-rounds": 100_000, "reference": False}, {}, tmp_path)
    assert set(taken) == set(clients)
    for node, x in clients.items():
        hits = [r for r in taken[node] if np.isclose(x, r, rtol=1e-9, atol=1e-9).all(1).any()]
        assert not hits, f"node {node}: {len(hits)} rows taken"
