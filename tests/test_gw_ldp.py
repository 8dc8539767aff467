"""GW-LDP: protocol math (GW matrix, LDP encoder, FedAvg, SVC, k-medoids) and
end-to-end runs on the in-process grid (k-hop Citeseer subgraphs, MUTAG)."""

from __future__ import annotations

import math

import numpy as np
import ot
import pytest
import scipy.sparse as sp

from app.client_app import build_client_app
from fedgraphcore.config import ConfigError
from app.inprocess import InProcessGrid
from fedgraphcore.models import build_model
from fedgraphcore.privacy.ldp import default_m, multibit_probabilities
from fedgraphcore.privacy.policy import PrivacyRefusal
from fedgraphcore.protocols import gw_ldp
from fedgraphcore.protocols.gw_ldp.solver import MATRIX_CG_ITERATIONS
from app.run import run_experiment
from app.server_app import run_server
from fedgraphcore.wire import ProtocolError
from fedgraphcore.transport import unpack
from tests.conftest import HANG_GUARD_S, shared_datasets_or_skip, wait_until


def random_graph(rng, n, p=0.3):
    a = sp.random(n, n, density=p, random_state=rng, data_rvs=np.ones)
    a = ((a + a.T) > 0).astype(np.float64)
    a.setdiag(0)
    a.eliminate_zeros()
    return sp.csr_matrix(a)


# --------------------------------------------------------------------------- GW


def test_gw_matrix_is_symmetric_zero_diagonal_and_equals_pot_directly():
    rng = np.random.default_rng(0)
    mats = [gw_ldp.shortest_path_matrix(random_graph(rng, int(n))) for n in rng.integers(5, 12, 9)]
    d = gw_ldp.gw_matrix(mats, workers=1)
    assert d.shape == (9, 9)
    assert np.array_equal(d, d.T) and np.all(np.diag(d) == 0)
    for i, j in [(0, 1), (2, 7), (3, 8)]:
        p, q = ot.unif(len(mats[i])), ot.unif(len(mats[j]))
        assert d[i, j] == pytest.approx(ot.gromov.gromov_wasserstein2(mats[i], mats[j], p, q, "square_loss"),
                                        abs=1e-12)
    # the process pool gives the same matrix
    many = mats * 8  # 72 items, identical spaces are deduplicated: still 36 distinct pairs solved
    stats = {}
    big = gw_ldp.gw_matrix(many, workers=2, stats=stats)
    assert stats == {"pairs": 72 * 71 // 2, "distinct_spaces": 9, "solved_pairs": 36}
    assert np.allclose(big[:9, :9], d) and np.allclose(big[9:18, :9], d)


@pytest.mark.parametrize("max_iter, decimals", [(10_000, gw_ldp.EXACT_MERGE_DECIMALS),
                                               (MATRIX_CG_ITERATIONS, gw_ldp.MATRIX_MERGE_DECIMALS)])
def test_gw_pool_matches_sequential_on_many_distinct_pairs(max_iter, decimals):
    rng = np.random.default_rng(5)
    mats = [gw_ldp.embedding_space(rng.dirichlet(np.ones(3), int(n)), features=True, decimals=decimals)
            for n in rng.integers(3, 7, 30)]  # 435 pairs of fused spaces, as a matrix by default merges them
    d = gw_ldp.gw_matrix(mats, workers=1, max_iter=max_iter, alpha=0.5)
    assert np.array_equal(gw_ldp.gw_matrix(mats, workers=2, max_iter=max_iter, alpha=0.5), d)
    assert np.array_equal(d, d.T) and np.all(np.diag(d) == 0) and np.all(d[np.triu_indices(30, 1)] > 0)


def random_tree(rng, n):
    """Random recursive tree (molecule-like sparse graph)."""
    parents = [int(rng.integers(0, v)) for v in range(1, n)]
    a = sp.coo_matrix((np.ones(n - 1), (parents, list(range(1, n)))), shape=(n, n)).tocsr()
    return sp.csr_matrix(((a + a.T) > 0).astype(np.float64))


def test_isomorphic_graphs_have_gw_near_zero():
    rng = np.random.default_rng(1)
    # topology (shortest paths), POT's conditional gradient from the default
    # coupling p q': GW is non-convex, so CG can stop in a local minimum for
    # some permutations, but typically it finds the isomorphism (GW = 0)
    iso, other = [], []
    for _ in range(20):
        a = random_tree(rng, 10)
        perm = rng.permutation(10)
        iso.append(gw_ldp.gw_pair(gw_ldp.shortest_path_matrix(a), gw_ldp.shortest_path_matrix(a[perm][:, perm])))
        other.append(gw_ldp.gw_pair(gw_ldp.shortest_path_matrix(a), gw_ldp.shortest_path_matrix(random_tree(rng, 10))))
    assert np.median(iso) < 1e-9 and np.mean(np.abs(iso) < 1e-9) >= 0.5
    assert np.mean(iso) < 0.5 * np.mean(other)
    # embeddings: a node permutation gives the same metric-measure space, GW exactly 0
    h = rng.random((12, 2))
    d = gw_ldp.gw_matrix([gw_ldp.embedding_space(h), gw_ldp.embedding_space(h[rng.permutation(12)]),
                         gw_ldp.embedding_space(rng.random((12, 2)))], workers=1)
    assert d[0, 1] == 0.0 and d[0, 2] > 1e-6


def test_merging_duplicate_rows_keeps_the_gw_value():
    rng = np.random.default_rng(2)
    for _ in range(10):
        h1 = rng.random((3, 2))[rng.integers(0, 3, 15)]
        h2 = rng.random((4, 2))[rng.integers(0, 4, 11)]
        plain = gw_ldp.gw_pair(gw_ldp.intra_distance(h1), gw_ldp.intra_distance(h2))
        c1, w1 = gw_ldp.embedding_space(h1)
        c2, w2 = gw_ldp.embedding_space(h2)
        assert len(w1) <= 3 and w1.sum() == pytest.approx(1.0)
        assert gw_ldp.gw_pair(c1, c2, w1, w2) == pytest.approx(plain, abs=1e-7)


def test_fused_gw_equals_pot_and_sees_what_plain_gw_cannot():
    rng = np.random.default_rng(8)
    h1 = rng.dirichlet(np.ones(2), size=9)
    h2 = rng.dirichlet(np.ones(2), size=7)
    c1, w1, x1 = gw_ldp.embedding_space(h1, merge=False, features=True)
    c2, w2, x2 = gw_ldp.embedding_space(h2, merge=False, features=True)
    want = ot.gromov.fused_gromov_wasserstein2(ot.dist(h1, h2), c1, c2, ot.unif(9), ot.unif(7), "square_loss",
                                               alpha=0.5)
    assert gw_ldp.gw_pair(c1, c2, w1, w2, x1=x1, x2=x2, alpha=0.5) == pytest.approx(want, abs=1e-12)
    # swapping the two softmax classes is an isometry: GW 0, fused GW not
    swapped = h1[:, ::-1]
    d_gw = gw_ldp.gw_matrix([gw_ldp.embedding_space(h1, features=True), gw_ldp.embedding_space(swapped, features=True)],
                           workers=1)
    d_fgw = gw_ldp.gw_matrix([gw_ldp.embedding_space(h1, features=True), gw_ldp.embedding_space(swapped, features=True)],
                            workers=1, alpha=0.5)
    assert d_gw[0, 1] == pytest.approx(0.0, abs=1e-12) and d_fgw[0, 1] > 1e-3
    # merged duplicate rows keep the fused value too; the pool gives the sequential matrix
    hs = [rng.random((3, 2))[rng.integers(0, 3, int(n))] for n in rng.integers(5, 12, 24)]  # 276 pairs
    merged = gw_ldp.gw_matrix([gw_ldp.embedding_space(h, features=True) for h in hs], workers=2, alpha=0.5)
    plain = gw_ldp.gw_matrix([gw_ldp.embedding_space(h, merge=False, features=True) for h in hs], workers=1,
                            alpha=0.5)
    assert np.allclose(merged, plain, atol=1e-7)
    with pytest.raises(ValueError, match="features"):
        gw_ldp.gw_matrix([c1, c2], workers=1, alpha=0.5)


def test_ten_fold_splits_test_every_item_once_in_7_2_1_shape():
    n = 57
    splits = np.stack([gw_ldp.split_items(n, 3, 1, fold=f) for f in range(gw_ldp.FOLDS)])
    assert np.all((splits == gw_ldp.SPLIT_TEST).sum(0) == 1)  # every item tested exactly once
    assert np.all((splits == gw_ldp.SPLIT_VAL).sum(0) == 2)
    counts = np.stack([np.bincount(s, minlength=3) for s in splits])
    assert counts[:, 2].min() >= 5 and counts[:, 2].max() <= 6 and counts[:, 1].min() >= 11
    with pytest.raises(ValueError, match="0..9"):
        gw_ldp.split_items(n, 3, 1, fold=10)


def test_gw_pool_workers_die_with_a_killed_parent(tmp_path):
    import contextlib
    import os
    import signal
    import subprocess
    import sys

    script = tmp_path / "pool.py"
    script.write_text(
        "import sys, numpy as np\n"
        f"sys.path.insert(0, {str(gw_ldp.__file__.rsplit('/fedgraphcore/', 1)[0])!r})\n"
        "from fedgraphcore.protocols import gw_ldp\n"
        "rng = np.random.default_rng(0)\n"
        "mats = [gw_ldp.intra_distance(rng.random((30, 3))) for _ in range(400)]\n"
        "print('start', flush=True)\n"
        "gw_ldp.gw_matrix(mats, workers=2)\n")
    def alive(pids: list[int]) -> list[int]:
        """Those of ``pids`` still running (a zombie has ended)."""
        out = []
        for pid in pids:
            with contextlib.suppress(OSError):
                if open(f"/proc/{pid}/stat").read().split()[2] != "Z":
                    out.append(pid)
        return out

    for sig in (signal.SIGTERM, signal.SIGKILL):
        proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "start"
        children: list[int] = []

        def pool_started() -> bool:
            out = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout
            children[:] = [int(x) for x in out.split()]
            return len(children) >= 2

        wait_until(pool_started, "the pool's two workers")
        os.kill(proc.pid, sig)
        proc.wait(timeout=HANG_GUARD_S)
        wait_until(lambda: not alive(children), f"the pool workers {children} to end after {sig!r} (orphaned?)")


# --------------------------------------------------------------------------- LDP (Algorithm 1)


def test_ldp_encoder_range_sparsity_and_probabilities_match_algorithm_1():
    rng = np.random.default_rng(3)
    n, d = 40, 6
    h = rng.dirichlet(np.ones(d), size=n)
    for eps_g in (1.0 / n, 0.5, 30.0):
        codes, stats = gw_ldp.encode_graph(h, eps_g, rng)
        m = default_m(eps_g, d)
        assert codes.dtype == np.int8 and codes.shape == (n, d)
        assert set(np.unique(codes)) <= {-1, 0, 1}
        assert np.all((codes != 0).sum(1) == m)  # m sampled coordinates per row
        assert stats["epsilon"] == pytest.approx(eps_g / n) and stats["m"] == m
    # P(+1) of a sampled entry is 1/(e^(eps/(mn))+1) + h (e^(eps/(mn))-1)/(e^(eps/(mn))+1); at
    # eps_g = 4.4 (m = 2, n = 2: 1.1 per entry) a per-entry budget of eps/n, eps or eps/(5mn) would
    # move P(+1) at h = 0.9 or 0 by 0.07-0.2, far beyond the sampling error of 8000 draws
    eps_g, n = 4.4, 2
    h = np.array([[0.9, 0.1, 0.5, 0.0], [0.2, 0.8, 0.5, 1.0]])
    m = default_m(eps_g, 4)
    assert m == 2
    draws = np.stack([gw_ldp.encode_graph(h, eps_g, rng)[0] for _ in range(8000)]).astype(float)
    sampled = (draws != 0).mean(0)
    assert np.allclose(sampled, m / 4, atol=0.02)
    p_plus = (draws == 1).sum(0) / np.maximum((draws != 0).sum(0), 1)
    e = math.exp(eps_g / (m * n))
    want = 1 / (e + 1) + h * (e - 1) / (e + 1)
    assert np.allclose(p_plus, want, atol=0.025)
    assert np.allclose(want, multibit_probabilities(h, eps_g / n, 0.0, 1.0, m))


def test_epsilon_inf_reproduces_the_plain_embedding_matrix():
    rng = np.random.default_rng(4)
    hs = [rng.dirichlet(np.ones(3), size=int(n)) for n in rng.integers(4, 9, 6)]
    coded = [gw_ldp.encode_graph(h, math.inf, rng)[0] for h in hs]
    assert all(np.array_equal(c, h) for c, h in zip(coded, hs))
    plain = gw_ldp.gw_matrix([gw_ldp.intra_distance(h) for h in hs], workers=1)
    assert np.allclose(gw_ldp.gw_matrix([gw_ldp.embedding_space(c) for c in coded], workers=1), plain, atol=1e-7)
    assert gw_ldp.graph_epsilon(20, 0.0) == pytest.approx(1 / 20) and gw_ldp.graph_epsilon(20, 0.3) == 0.3
    with pytest.raises(ValueError, match="epsilon"):
        gw_ldp.graph_epsilon(5, -1.0)


# --------------------------------------------------------------------------- FedAvg, SVC, clustering


def test_training_dp_mechanism_is_the_runs_choice_for_client_and_server():
    from app import registry

    def mechanism(dp):
        config = registry.validate({"strategy": "gw-ldp", "dataset": "mutag", "gw-ldp.dp": dp,
                                    "gw-ldp.dp-clip": 0.5, "gw-ldp.dp-noise": 1.5, "gw-ldp.dp-sample-rate": 0.25})
        return gw_ldp.training_mechanism(gw_ldp.GWLDPConfig.of(config))

    assert mechanism("none") is None
    client, sgd = mechanism("client"), mechanism("sgd")
    # DP-FedAvg: a client's whole update (replace one client's data), every round; DP-SGD: one graph
    # (add/remove), Poisson-sampled at the run's rate
    assert (client.clip, client.noise_multiplier, client.sample_rate, client.adjacency) == (0.5, 1.5, 1.0, "replace")
    assert (sgd.clip, sgd.noise_multiplier, sgd.sample_rate, sgd.adjacency) == (0.5, 1.5, 0.25, "remove")


def test_fedavg_weights_by_sample_count():
    a = {"w": np.array([1.0, 2.0], np.float32)}
    b = {"w": np.array([3.0, 6.0], np.float32)}
    assert np.allclose(gw_ldp.fedavg([a, b], [1, 3])["w"], [2.5, 5.0])
    with pytest.raises(ValueError, match="total sample count is 0"):
        gw_ldp.fedavg([a], [0])
    # the strategy aggregates with Flower's aggregate_arrayrecords: same result
    from app import registry
    from fedgraphcore.transport import pack
    from strategies.gw_ldp import GWLDP

    strategy = GWLDP(registry.validate({"strategy": "gw-ldp", "dataset": "mutag"}))
    replies = {1: pack({"w.w": a["w"]}, {"num_examples": 1, "loss": 0.5}),
               2: pack({"w.w": b["w"]}, {"num_examples": 3, "loss": 0.1}),
               3: pack({"w.w": b["w"] * 100}, {"num_examples": 0, "loss": 0.0})}  # no training graphs
    limits = {1: (0, 1), 2: (1, 3), 3: (2, 0)}  # node -> (client, training graphs it described)
    new, loss = strategy._aggregate(replies, a, limits)
    assert np.allclose(new["w"], [2.5, 5.0]) and loss == pytest.approx(0.2)
    # a count that is not a whole number within the client's training graphs stops the run, never weighs in
    for bad in (-5, 2.9, 4, 10**9, True, "3"):
        with pytest.raises(ProtocolError, match=f"client 1: num_examples={bad!r}; valid: a whole number from 0"):
            strategy._aggregate({**replies, 2: pack({"w.w": b["w"]}, {"num_examples": bad, "loss": 0.1})}, a, limits)
    for bad in ("abc", False):  # a loss that is no number is named, not a crash in float()
        with pytest.raises(ProtocolError, match=f"client 1: loss={bad!r}; valid: a finite number"):
            strategy._aggregate({**replies, 2: pack({"w.w": b["w"]}, {"num_examples": 3, "loss": bad})}, a, limits)


def test_malformed_describe_replies_are_named():
    assert gw_ldp.describe_problem({"in_dim": 7, "graphs": 10, "train": 7}) is None
    assert gw_ldp.describe_problem({"in_dim": 7.0, "graphs": 10, "train": 0}) is None  # whole-number floats
    cases = [({"in_dim": -1}, "in_dim=-1; valid: a whole number >= 1"),
             ({"in_dim": 3703.9}, "in_dim=3703.9; valid: a whole number >= 1"),  # not truncated to 3703
             ({"graphs": "ten"}, "graphs='ten'; valid: a whole number >= 1"),
             ({"graphs": float("nan")}, "graphs=nan; valid: a whole number >= 1"),
             ({"train": 7.9}, "train=7.9; valid: a whole number from 0 to its 10 graphs"),
             ({"train": -3}, "train=-3; valid: a whole number from 0 to its 10 graphs"),
             ({"train": 11}, "train=11; valid: a whole number from 0 to its 10 graphs"),
             ({"train": True}, "train=True; valid")]
    for change, message in cases:
        assert gw_ldp.describe_problem({"in_dim": 7, "graphs": 10, "train": 7, **change}).startswith(message)


def test_duplicate_graph_ids_across_clients_name_both_clients():
    from strategies.gw_ldp import GWLDP

    def up(ids):
        n = len(ids)
        return {"sizes": np.ones(n, np.int64), "graph_ids": np.array(ids), "split": np.zeros(n, np.int64),
                "labels": np.zeros(n, np.int64), "eval_labels": np.zeros(n, np.int64),
                "embeddings": [np.ones((1, 2)) for _ in ids]}

    ok = GWLDP._combine({0: (2, up([5, 1])), 3: (2, up([2, 9]))})
    assert ok["graph_ids"].tolist() == [1, 2, 5, 9]
    with pytest.raises(ProtocolError, match=r"^clients 0 and 3 both uploaded graph id 9$"):
        GWLDP._combine({3: (2, up([2, 9])), 0: (2, up([9, 1])), 1: (2, up([4]))})


def test_local_training_reduces_the_loss_for_both_models():
    from fedgraphcore.data.types import GraphData

    rng = np.random.default_rng(6)
    graphs, y = [], []
    for i in range(24):
        dense = i % 2 == 0
        a = random_graph(rng, 8, 0.7 if dense else 0.15)
        graphs.append(GraphData(name="g", adj=a, x=None, y=None, meta={}))
        y.append(int(dense))
    batch = gw_ldp.make_batch(graphs, degree_dim=8)
    y = np.array(y)
    for kind in gw_ldp.MODELS:
        model = build_model(kind, 8, 2, seed=0)
        with gw_ldp.torch_threads(1):
            first = gw_ldp.local_train(model, batch, y, np.arange(24), "graph", 1, 0.01, 0)
            last = gw_ldp.local_train(model, batch, y, np.arange(24), "graph", 25, 0.01, 0)
        assert last < first
        for layer, width in (("classes", 2), ("hidden", {"gcn": 16, "gin": 64}[kind])):
            h = gw_ldp.node_embeddings(model, batch, layer)
            assert gw_ldp.embedding_width(model, 2, layer) == width
            assert len(h) == 24 and all(x.shape == (8, width) for x in h)
            assert all(np.allclose(x.sum(1), 1.0) and x.min() >= 0 for x in h)
        with pytest.raises(ValueError, match="valid choices: classes, hidden"):
            gw_ldp.node_embeddings(model, batch, "logits")


def test_unknown_labels_take_no_part_in_the_svc():
    rng = np.random.default_rng(8)
    y = np.repeat([0, 1], 30)
    pts = rng.normal(size=(60, 2)) * 0.3 + np.array([[0, 0], [3, 0]])[y]
    dist = np.linalg.norm(pts[:, None] - pts[None], axis=2) ** 2
    split = gw_ldp.split_items(60, 0, 0)
    unknown = y.copy()
    unknown[np.flatnonzero(split == gw_ldp.SPLIT_TRAIN)[:5]] = -1
    unknown[np.flatnonzero(split == gw_ldp.SPLIT_TEST)[:2]] = -1
    keep = unknown >= 0  # the labelled items decide; the kernel's median scale still sees every item
    res, alone = gw_ldp.svc_select(dist, unknown, split), gw_ldp.svc_select(dist[np.ix_(keep, keep)], y[keep], split[keep])
    assert res["test_acc"] == alone["test_acc"] == 1.0 and (res["C"], res["gamma"]) == (alone["C"], alone["gamma"])
    assert np.array_equal(res["predictions"][keep], alone["predictions"])
    assert gw_ldp.svc_problem(unknown, np.where(split == gw_ldp.SPLIT_VAL, gw_ldp.SPLIT_TRAIN, split),
                             "validation").startswith("no labelled validation graphs")
    with pytest.raises(ValueError, match="no labelled validation graphs"):
        gw_ldp.svc_select(dist, np.where(split == gw_ldp.SPLIT_VAL, -1, y), split)


def test_malformed_embedding_uploads_are_named():
    good = {"embeddings": np.array([[1, 0], [0, -1], [-1, 0]], np.int8), "sizes": np.array([2, 1]),
            "graph_ids": np.array([4, 9]), "split": np.array([0, 2]), "labels": np.array([1, -1]),
            "eval_labels": np.array([1, 0])}
    assert gw_ldp.embedding_upload_problem(good, 2, 2, epsilon=0.0) is None  # 1/|V|: m = 1 per row
    bad = {
        "graphs it described": ({}, 3),
        "LDP codes outside": ({"embeddings": good["embeddings"] * 100}, 2),
        "sum to 4": ({"sizes": np.array([3, 1])}, 2),
        "graph ids negative or repeated": ({"graph_ids": np.array([4, 4])}, 2),
        "split codes outside": ({"split": np.array([0, 7])}, 2),
        "'labels' outside -1..1": ({"labels": np.array([99, -1])}, 2),
        "'eval_labels' outside -1..1": ({"eval_labels": np.array([1, -5])}, 2),
        "labels of test graphs must be -1": ({"labels": np.array([1, 0])}, 2),
        "'split' has shape": ({"split": np.array([0])}, 2),
    }
    for message, (change, graphs) in bad.items():
        assert message in gw_ldp.embedding_upload_problem({**good, **change}, graphs, 2, epsilon=0.0)
    # four sizes of 2^62 + 1 or more: each >= 1, and their int64 sum wraps around onto the 4 rows
    # (np.repeat over them crashed the server process)
    four = {"embeddings": np.array([[1, 0]] * 4, np.int8), "sizes": np.ones(4, np.int64) + 2**62,
            "graph_ids": np.arange(4), "split": np.zeros(4, np.int64), "labels": np.ones(4, np.int64),
            "eval_labels": np.ones(4, np.int64)}
    assert "(each from 1 to 4 expected)" in gw_ldp.embedding_upload_problem(four, 4, 2, epsilon=0.0)
    # Algorithm 1 samples exactly m coordinates per row: an all-zero row (nothing released, yet recorded
    # as noised) or a row with more non-zeros is no code of the mechanism
    codes = good["embeddings"]
    for rows, row in (([[1, 0], [0, 0], [-1, 0]], 1), ([[1, 0], [0, -1], [1, 1]], 2)):
        assert gw_ldp.embedding_upload_problem({**good, "embeddings": np.array(rows, np.int8)}, 2, 2, 0.0) == (
            f"graph {good['graph_ids'][row // 2]}: LDP code row {row} has {np.count_nonzero(rows[row])} non-zeros, "
            "Algorithm 1 gives exactly m=1")
    # at epsilon 10 every graph gets m = min(d, floor(10 / 2.18)) = 2: the m = 1 codes (e.g. a raw one-hot) fail
    assert default_m(gw_ldp.graph_epsilon(2, 10.0), 2) == 2
    assert "graph 4: LDP code row 0 has 1 non-zeros, Algorithm 1 gives exactly m=2" == \
        gw_ldp.embedding_upload_problem(good, 2, 2, epsilon=10.0)
    assert gw_ldp.embedding_upload_problem({**good, "embeddings": np.where(codes == 0, 1, codes)}, 2, 2, 10.0) is None
    # without LDP: softmax rows, entries >= 0 summing to 1 (float32 softmax rounding allowed)
    floats = {**good, "embeddings": np.array([[0.2, 0.8], [1.0, 0.0], [0.5, 0.5 + 1e-6]])}
    assert gw_ldp.embedding_upload_problem(floats, 2, 2, epsilon=math.inf) is None
    for row, rows in ((2, [[0.2, 0.8], [1.0, 0.0], [0.5, np.nan]]), (1, [[0.2, 0.8], [0.0, 0.0], [0.5, 0.5]]),
                      (0, [[-0.2, 1.2], [1.0, 0.0], [0.5, 0.5]]), (2, [[0.2, 0.8], [1.0, 0.0], [0.5, np.inf]])):
        problem = gw_ldp.embedding_upload_problem({**good, "embeddings": np.array(rows)}, 2, 2, epsilon=math.inf)
        assert problem.startswith(f"graph {good['graph_ids'][row // 2]}: embedding row {row} is not a softmax row")


def test_svc_and_kmedoids_recover_separable_groups():
    rng = np.random.default_rng(7)
    y = np.repeat([0, 1, 2], 20)
    pts = rng.normal(size=(60, 2)) * 0.1 + np.array([[0, 0], [5, 0], [0, 5]])[y]
    dist = np.linalg.norm(pts[:, None] - pts[None], axis=2) ** 2
    split = gw_ldp.split_items(60, 0, 0)
    assert np.bincount(split).tolist() == [42, 12, 6]
    res = gw_ldp.svc_select(dist, y, split)
    assert res["test_acc"] == 1.0 and res["val_acc"] == 1.0 and res["test_acc_grid_max"] == 1.0
    # labels unrelated to the geometry: the grid maximum is the best test accuracy of any grid point
    from sklearn.svm import SVC

    noisy = np.random.default_rng(1).integers(0, 2, 60)
    res = gw_ldp.svc_select(dist, noisy, split, c_grid=(0.1, 10.0), gamma_grid=(0.5, 8.0))
    tr, te = split == gw_ldp.SPLIT_TRAIN, split == gw_ldp.SPLIT_TEST
    kernels = [np.exp(-g * gw_ldp.normalise(dist)) for g in (0.5, 8.0)]
    accs = [(SVC(C=c, kernel="precomputed").fit(k[np.ix_(tr, tr)], noisy[tr]).predict(k[np.ix_(te, tr)])
             == noisy[te]).mean() for k in kernels for c in (0.1, 10.0)]
    assert res["test_acc_grid_max"] == max(accs) >= res["test_acc"]
    # cv: the grid point with the best 5-fold score over train + validation, refitted on both
    from sklearn.model_selection import StratifiedKFold

    cv = gw_ldp.svc_select(dist, noisy, split, "cv", c_grid=(0.1, 10.0), gamma_grid=(0.5, 8.0))
    pool = np.flatnonzero(split != gw_ldp.SPLIT_TEST)
    folds = list(StratifiedKFold(5, shuffle=True, random_state=0).split(pool, noisy[pool]))
    scores = [np.mean([(SVC(C=c, kernel="precomputed").fit(k[np.ix_(pool[a], pool[a])], noisy[pool[a]])
                        .predict(k[np.ix_(pool[b], pool[a])]) == noisy[pool[b]]).mean() for a, b in folds])
              for k in kernels for c in (0.1, 10.0)]
    pick = int(np.argmax(scores))
    k, c = kernels[pick // 2], (0.1, 10.0)[pick % 2]
    expected = SVC(C=c, kernel="precomputed").fit(k[np.ix_(pool, pool)], noisy[pool]).predict(k[:, pool])
    assert cv["val_acc"] == scores[pick] and np.array_equal(cv["predictions"], expected)
    assert cv["test_acc"] == (expected[te] == noisy[te]).mean()
    assert gw_ldp.svc_select(dist, y, split, "cv")["test_acc"] == 1.0
    with pytest.raises(ValueError, match="selection='test'; valid choices: validation, cv"):
        gw_ldp.svc_select(dist, y, split, "test")
    with pytest.raises(ValueError, match="too few train/validation graphs per class"):
        gw_ldp.svc_select(dist, np.isin(np.arange(60), np.flatnonzero(split == 0)[:3]).astype(int), split, "cv")
    from fedgraphcore.metrics import ari

    assert ari(y, gw_ldp.kmedoids(dist, 3, seed=0)) == 1.0
    assert ari(y, gw_ldp.cluster_gw(dist, 3, "spectral", seed=0)) == 1.0
    with pytest.raises(ValueError, match="valid choices"):
        gw_ldp.cluster_gw(dist, 3, "kmeans", 0)


# --------------------------------------------------------------------------- end to end


KHOP = {"partitioner": "khop", "khop.hops": 1, "khop.centres": 60, "gw-ldp.model": "gcn",
        "num-rounds": 3, "gw-ldp.local-epochs": 2}


def test_khop_citeseer_end_to_end_plain_embeddings_are_the_model_output(out_dir):
    shared_datasets_or_skip()
    raw = {"strategy": "gw-ldp", "dataset": "citeseer", "num-clients": 3, **KHOP,
           "gw-ldp.epsilon": "inf", "gw-ldp.embedding": "classes", "out-dir": str(out_dir)}
    grid = InProcessGrid(build_client_app(raw), 3, record=True)
    result = run_server(grid, raw)
    m = result["metrics"]
    assert m["gw_pairs"] == 60 * 59 // 2 and {"acc", "nmi", "ari", "svc_test_acc"} <= set(m)
    assert np.load(out_dir / "labels.npy").shape == (60,)
    assert result["reference"] is not None and "agreement" in result["reference"]
    assert len(result["history"]) == 3
    # uploads of the last step are exactly the final model's softmax of its class scores (6 classes)
    from app.client_app import node_shard
    from app import registry

    config = registry.validate(raw)
    down = next(msg for msg in grid.pushed if msg.metadata.message_type == "query.gw_embed")
    weights = {k[2:]: v for k, v in unpack(down.content)[0].items()}
    for reply in (r for r in grid.pulled if r.metadata.message_type == "query.gw_embed"):
        arrays, _ = unpack(reply.content)
        part = next(i for i in range(3) if np.array_equal(
            node_shard(config, {"partition-id": i, "num-partitions": 3}).graph_ids, arrays["graph_ids"]))
        shard = node_shard(config, {"partition-id": part, "num-partitions": 3})
        batch = gw_ldp.make_batch(shard.graphs, 64)
        model = build_model("gcn", batch.x.shape[1], 6, 0)
        gw_ldp.set_weights(model, weights)
        assert arrays["embeddings"].shape[1] == 6
        assert np.allclose(np.vstack(gw_ldp.node_embeddings(model, batch, "classes")), arrays["embeddings"])
    mech = {x["name"]: x for x in result["privacy"]["mechanisms"]}
    assert mech["ldp:multibit-embeddings"]["guarantee"].startswith("none")


@pytest.mark.integration
def test_mutag_run_uploads_no_raw_graph_and_records_ldp_epsilon(out_dir):
    shared_datasets_or_skip()
    from fedgraphcore.data import load_dataset

    raw = {"strategy": "gw-ldp", "dataset": "mutag", "num-clients": 4, "num-rounds": 2, "reference": False,
           "gw-ldp.svc-selection": "cv", "out-dir": str(out_dir)}
    grid = InProcessGrid(build_client_app(raw), 4, record=True)
    result = run_server(grid, raw)
    data = load_dataset("mutag")
    model_shapes = {f"w.{k}": v.shape for k, v in gw_ldp.get_weights(build_model("gin", 7, 2, 0)).items()}
    names = set()
    for reply in grid.pulled:  # every upload: model weights of the model's shapes, or 1-D / n x h arrays
        arrays, _ = unpack(reply.content)
        names.update(arrays)
        for name, a in arrays.items():
            if name.startswith("w."):
                assert a.shape == model_shapes[name]
            else:
                assert a.ndim == 1 or (name == "embeddings" and a.shape[1] == 64)  # GIN's hidden width
    weight_names = {n for n in names if n.startswith("w.")}
    assert weight_names == set(model_shapes)
    # moments: GIN's BatchNorm statistics pooled after training, per channel (1 + 2 x 64 numbers)
    assert names - weight_names == {"embeddings", "sizes", "graph_ids", "split", "labels", "eval_labels", "moments"}
    moments = [unpack(r.content)[0]["moments"] for r in grid.pulled if r.metadata.message_type == "query.gw_norm"]
    assert len(moments) == 4 * 10 and all(m.shape == (1 + 2 * 64,) for m in moments)  # 4 clients x 10 layers
    assert result["metrics"]["norm_statistics"] == "pooled" and result["metrics"]["norm_rounds"] == 10
    embed = [unpack(r.content)[0] for r in grid.pulled if r.metadata.message_type == "query.gw_embed"]
    codes = np.vstack([a["embeddings"] for a in embed])
    assert codes.dtype == np.int8 and codes.shape == (sum(g.num_nodes for g in data.graphs), 64)
    assert np.all((codes != 0).sum(1) == 1)  # m = 1 at epsilon = 1/|V|
    labels = np.concatenate([a["labels"] for a in embed])
    split = np.concatenate([a["split"] for a in embed])
    assert np.all(labels[split == gw_ldp.SPLIT_TEST] == -1) and np.all(labels[split != gw_ldp.SPLIT_TEST] >= 0)
    mechs = {x["name"]: x for x in result["privacy"]["mechanisms"]}
    mech = mechs["ldp:multibit-embeddings"]
    smallest = min(g.num_nodes for g in data.graphs)
    assert mech["epsilon"] == pytest.approx(1 / smallest) and mech["delta"] == 0.0
    # the epsilon covers the codes only: what goes up in clear is listed beside it, and the note names it
    clear = mechs["gw-ldp:clear-uploads"]
    assert clear["guarantee"].startswith("none") and clear["epsilon"] == "none"
    revealed = " ".join(clear["params"]["revealed"])
    assert all(w in revealed for w in ("GNN weights", "BatchNorm layer's input", "evaluation label", "graph sizes"))
    assert result["privacy"]["epsilon"] == pytest.approx(1 / smallest)
    assert result["privacy"]["overall_note"].endswith("not covered by a DP guarantee: gw-ldp:clear-uploads")
    assert "group privacy" not in mech["protects"]  # disjoint graphs: one graph is one unit
    uploads = [u for u in result["privacy"]["uploads"] if u["name"] == "embeddings"]
    assert len(uploads) == 4 and all(u["noised"] for u in uploads)
    assert result["metrics"]["gw_pairs"] == 188 * 187 // 2
    # an accuracy over exactly the test graphs: a whole number of them right
    right = result["metrics"]["svc_test_acc"] * np.sum(split == gw_ldp.SPLIT_TEST)
    assert right == pytest.approx(round(right)) and result["metrics"]["svc_selection"] == "cv"


def test_client_level_dp_is_accounted_and_marks_weights_noised(out_dir):
    shared_datasets_or_skip()
    result = run_experiment("gw-ldp", "citeseer", 2, {**KHOP, "khop.centres": 20, "gw-ldp.dp": "client",
                                                       "gw-ldp.dp-noise": 2.0, "reference": False,
                                                       "gw-ldp.svc": False, "gw-ldp.embed-every": 2},
                            out_dir)
    mech = {x["name"]: x for x in result["privacy"]["mechanisms"]}
    ldp = mech["ldp:multibit-embeddings"]  # Algorithm 2's periodic signal: round 2 and after training
    assert ldp["params"]["releases"] == 2 and "group privacy" in ldp["protects"]
    assert ldp["epsilon"] == pytest.approx(2 * ldp["params"]["epsilon_max_per_graph"])
    assert sum(1 for r in result["timing"]["per_round"] if r["action"] == "gw_embed") == 2
    dp = mech["dp-fedavg:weights"]
    assert dp["guarantee"].startswith("(epsilon, delta)-DP per client (its whole model update)")
    assert dp["params"]["steps"] == 3 and 0 < dp["epsilon"] < math.inf and dp["delta"] == 1e-5
    fit = [u for u in result["privacy"]["uploads"] if u["action"] == "fit"]
    assert {u["name"] for u in fit if not u["name"].startswith("w.")} == {"num_examples"}  # no loss under DP
    assert all(u["noised"] for u in fit if u["name"].startswith("w."))
    revealed = " ".join(mech["gw-ldp:clear-uploads"]["params"]["revealed"])
    assert "number of training graphs" in revealed and "GNN weights" not in revealed and "BatchNorm" not in revealed


def test_ldp_noise_is_fresh_at_every_run_and_not_derived_from_the_seed(out_dir):
    """Same seed, same deterministic training: the weights sent down agree, the LDP codes do not
    (the server knows the seed, so codes drawn from it could be replayed and the noise removed)."""
    shared_datasets_or_skip()
    raw = {"strategy": "gw-ldp", "dataset": "citeseer", "num-clients": 2, **KHOP, "khop.centres": 20,
           "gw-ldp.epsilon": 2.0, "gw-ldp.svc": False, "reference": False}
    runs = []
    for run in range(2):
        grid = InProcessGrid(build_client_app(raw), 2, record=True)
        run_server(grid, {**raw, "out-dir": str(out_dir / str(run))})
        down = next(m for m in grid.pushed if m.metadata.message_type == "query.gw_embed")
        codes = {tuple(a["graph_ids"]): a["embeddings"] for a in
                 (unpack(r.content)[0] for r in grid.pulled if r.metadata.message_type == "query.gw_embed")}
        runs.append((unpack(down.content)[0], codes))
    (w0, c0), (w1, c1) = runs
    assert all(np.array_equal(w0[k], w1[k]) for k in w0) and c0.keys() == c1.keys()
    assert any(not np.array_equal(c0[g], c1[g]) for g in c0)


def _client(raw: dict, partition: int = 0):
    """A GWLDPClient for partition ``partition`` with its own Context, and the initial weights sent down."""
    from flwr.app import Context, RecordDict

    from app import registry
    from app.client_app import node_shard
    from clients.gw_ldp import GWLDPClient

    config = registry.validate(raw)
    shard = node_shard(config, {"partition-id": partition, "num-partitions": 2})
    context = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})
    client = GWLDPClient(shard, config, context)
    batch = client._local()[0]
    weights = gw_ldp.get_weights(build_model(config["gw-ldp.model"], int(batch.x.shape[1]), 2, 0))
    return client, {f"w.{k}": v for k, v in weights.items()}


def test_client_takes_its_privacy_settings_from_its_own_config_not_the_server():
    shared_datasets_or_skip()
    raw = {"strategy": "gw-ldp", "dataset": "mutag", "num-clients": 2, "gw-ldp.model": "gcn"}
    client, weights = _client(raw)
    codes, _ = client.on_gw_embed(weights, {"epsilon": 0.0, "layer": "hidden", "round": 2})
    assert codes["embeddings"].dtype == np.int8 and np.all((codes["embeddings"] != 0).sum(1) == 1)
    # a server asking for epsilon = inf (or any budget but the client's own) gets no embeddings at all
    for asked in (math.inf, 5.0):
        with pytest.raises(PrivacyRefusal, match=rf"rule 'gw-ldp.epsilon': gw_embed at epsilon={asked!r} refused: "
                                                 r"this client's gw-ldp.epsilon is 0 \(0 = 1/\|V\|, inf = no LDP\); "
                                                 r"valid: only its own"):
            client.on_gw_embed(weights, {"epsilon": asked, "layer": "hidden", "round": 2})
    # under training DP the BatchNorm moments are not covered by the noise: the client refuses them itself
    gin = {**raw, "gw-ldp.model": "gin"}
    client, weights = _client({**gin, "gw-ldp.dp": "sgd"})
    with pytest.raises(PrivacyRefusal, match="rule 'gw-ldp.dp': gw_norm refused: this client runs gw-ldp.dp='sgd'"):
        client.on_gw_norm(weights, {"layer": "convs.0.nn.1"})
    client, weights = _client(gin)
    assert client.on_gw_norm(weights, {"layer": "convs.0.nn.1"})[0]["moments"].shape == (1 + 2 * 64,)


@pytest.mark.integration
def test_a_re_sent_embedding_request_returns_the_first_draw_and_is_one_release(out_dir):
    shared_datasets_or_skip()
    from app.inprocess import FIRST_CLIENT_NODE_ID
    from conftest import LateReplyGrid

    raw = {"strategy": "gw-ldp", "dataset": "mutag", "num-clients": 2, "gw-ldp.model": "gcn", "num-rounds": 1,
           "gw-ldp.epsilon": 2.0, "gw-ldp.svc": False, "reference": False, "retries": 1, "timeout": 0.5,
           "out-dir": str(out_dir)}
    grid = LateReplyGrid(build_client_app(raw), 2, record=True, node=FIRST_CLIENT_NODE_ID + 1, action="gw_embed")
    result = run_server(grid, raw)
    assert len(grid.late) == 1 and result["metrics"]["dropped_clients"] == []
    asked = [m for m in grid.pushed if m.metadata.message_type == "query.gw_embed"]
    assert [m.metadata.dst_node_id for m in asked].count(FIRST_CLIENT_NODE_ID + 1) == 2  # asked twice
    answered = next(unpack(r.content)[0] for r in grid.pulled if r.metadata.message_type == "query.gw_embed"
                    and r.metadata.src_node_id == FIRST_CLIENT_NODE_ID + 1)
    # the same codes as the draw whose reply came late: the server holds one release, not two to average
    assert np.array_equal(answered["embeddings"], unpack(grid.late[0].content)[0]["embeddings"])
    ldp = {x["name"]: x for x in result["privacy"]["mechanisms"]}["ldp:multibit-embeddings"]
    assert ldp["params"]["releases"] == 1 and ldp["epsilon"] == pytest.approx(2.0)


def test_non_finite_embeddings_stop_the_run_and_name_the_client(out_dir, monkeypatch):
    shared_datasets_or_skip()
    from clients.gw_ldp import GWLDPClient
    from conftest import patch_reply

    patch_reply(monkeypatch, GWLDPClient, "gw_embed",
                lambda shard, out, vals: ({**out, "embeddings": np.full_like(out["embeddings"], np.nan)}, vals),
                client=1)
    with pytest.raises(ProtocolError, match=r"client 1: malformed embedding upload: graph \d+: embedding row 0 "
                                            r"is not a softmax row \(min nan"):
        run_experiment("gw-ldp", "mutag", 2, {"gw-ldp.model": "gcn", "num-rounds": 1, "gw-ldp.epsilon": "inf",
                                               "gw-ldp.svc": False, "reference": False}, out_dir)


def _fail_final_release(monkeypatch, client_id: int):
    """Client ``client_id`` answers its first gw_embed (the periodic release) and fails the next."""
    from clients.gw_ldp import GWLDPClient

    honest, calls = GWLDPClient.on_gw_embed, []

    def flaky(self, arrays, values):
        if self.shard.client_id == client_id:
            calls.append(1)
            if len(calls) > 1:
                raise RuntimeError("connection lost")
        return honest(self, arrays, values)

    monkeypatch.setattr(GWLDPClient, "on_gw_embed", flaky)


@pytest.mark.integration
def test_a_client_that_drops_keeps_its_periodic_release_in_the_matrix(out_dir, monkeypatch):
    shared_datasets_or_skip()
    _fail_final_release(monkeypatch, 1)
    result = run_experiment("gw-ldp", "citeseer", 3, {**KHOP, "khop.centres": 30, "gw-ldp.embed-every": 2,
                                                       "gw-ldp.svc": False, "reference": False}, out_dir)
    m = result["metrics"]
    assert m["dropped_clients"] == [1] and m["stale_clients"] == [{"client": 1, "round": 2}]
    assert m["graphs_missing"] == 0 and m["gw_pairs"] == 30 * 29 // 2  # every subgraph is still compared
    assert [r["action"] for r in result["communication"]["rejected"]] == ["gw_embed"]
    # without the periodic signal the dropped client's graphs are missing: reported, and the scores
    # cover only the graphs that were clustered (no -1 "cluster")
    from clients.gw_ldp import GWLDPClient

    honest = GWLDPClient.on_gw_embed

    def lost(self, arrays, values):
        if self.shard.client_id == 1:
            raise RuntimeError("connection lost")
        return honest(self, arrays, values)

    monkeypatch.setattr(GWLDPClient, "on_gw_embed", lost)
    result = run_experiment("gw-ldp", "mutag", 3, {"num-rounds": 1, "gw-ldp.svc": False, "reference": False},
                            out_dir.parent / "b")
    m = result["metrics"]
    assert m["dropped_clients"] == [1] and m["stale_clients"] == [] and 0 < m["graphs_missing"] < 188
    assert m["gw_pairs"] == (188 - m["graphs_missing"]) * (187 - m["graphs_missing"]) // 2
    assert m["coverage"] == pytest.approx(1 - m["graphs_missing"] / 188) and np.isfinite(m["acc"])
    with pytest.raises(ProtocolError, match="below min-clients=3"):
        run_experiment("gw-ldp", "mutag", 3, {"num-rounds": 1, "gw-ldp.svc": False, "reference": False,
                                               "min-clients": 3}, out_dir.parent / "c")


def test_a_malformed_embedding_upload_stops_the_run_and_names_the_client(out_dir, monkeypatch):
    shared_datasets_or_skip()
    from clients.gw_ldp import GWLDPClient

    honest = GWLDPClient.on_gw_embed

    def corrupt(self, arrays, values):
        reply, vals = honest(self, arrays, values)
        if self.shard.client_id == 1:
            reply["labels"] = np.full_like(reply["labels"], 99)
        return reply, vals

    monkeypatch.setattr(GWLDPClient, "on_gw_embed", corrupt)
    with pytest.raises(ProtocolError, match=r"client 1: malformed embedding upload: 'labels' outside -1..5"):
        run_experiment("gw-ldp", "citeseer", 2, {**KHOP, "khop.centres": 20, "reference": False}, out_dir)


def test_a_release_that_names_other_graphs_than_the_one_before_stops_the_run(out_dir, monkeypatch):
    # Ids are checked for repeats and range only within one release; a later release must repeat
    # the graphs of the earlier one, or the server would mix one client's codes under two sets of ids.
    shared_datasets_or_skip()
    from clients.gw_ldp import GWLDPClient

    honest, calls = GWLDPClient.on_gw_embed, []

    def shifted(self, arrays, values):
        reply, vals = honest(self, arrays, values)
        if self.shard.client_id == 1:
            calls.append(1)
            if len(calls) > 1:
                reply["graph_ids"] = reply["graph_ids"] + 100_000
        return reply, vals

    monkeypatch.setattr(GWLDPClient, "on_gw_embed", shifted)
    with pytest.raises(ProtocolError, match=r"^client 1: its embedding release of round 4 changes 'graph_ids' "
                                            r"from its release of round 2$"):
        run_experiment("gw-ldp", "citeseer", 2, {**KHOP, "khop.centres": 20, "gw-ldp.embed-every": 2,
                                                 "gw-ldp.svc": False, "reference": False}, out_dir)


def _trained_gin_and_client_batches(clients: int):
    """A GIN trained a few full-batch steps on 60 random graphs (so its statistics and
    weights are not at their initial values), the graphs cut into ``clients`` batches."""
    from fedgraphcore.data.types import GraphData

    rng = np.random.default_rng(11)
    graphs = [GraphData(name="g", adj=random_graph(rng, int(rng.integers(5, 12)), 0.4), x=None, y=None, meta={})
              for _ in range(60)]
    y = np.arange(60) % 2
    model = build_model("gin", 8, 2, seed=0)
    with gw_ldp.torch_threads(1):
        gw_ldp.local_train(model, gw_ldp.make_batch(graphs, 8), y, np.arange(60), "graph", 5, 0.01, 0)
    cuts = np.array_split(np.arange(60), clients)
    return model, graphs, [gw_ldp.make_batch([graphs[i] for i in c], 8) for c in cuts]


def _pool(model, batches, select) -> dict:
    """The strategy's rounds without Flower: per BatchNorm layer in forward order, every
    client's moments of its selected graphs, summed into the layer's new statistics."""
    weights = gw_ldp.get_weights(model)
    for layer in gw_ldp.norm_layers(model, 8):
        gw_ldp.set_weights(model, weights)
        moments = [gw_ldp.norm_input_moments(model, b, s, layer) for b, s in zip(batches, select)]
        assert all(gw_ldp.moments_problem(m, 64) is None for m in moments)
        weights = gw_ldp.with_norm_statistics(weights, layer, *gw_ldp.pooled_norm_statistics(moments))
    return weights


def test_pooled_batchnorm_statistics_equal_one_pass_over_every_clients_graphs():
    import copy

    import torch

    model, graphs, parts = _trained_gin_and_client_batches(3)
    layers = gw_ldp.norm_layers(model, 8)
    assert len(layers) == 10 and layers[:2] == ["convs.0.nn.1", "norms.0"]  # forward order, not registration
    assert gw_ldp.norm_layers(build_model("gcn", 8, 2, 0), 8) == []
    with gw_ldp.torch_threads(1):
        three = _pool(copy.deepcopy(model), parts, [np.arange(b.num_graphs) for b in parts])
        one = _pool(copy.deepcopy(model), [gw_ldp.make_batch(graphs, 8)], [np.arange(60)])
        # the split over clients does not matter: same statistics as one client holding every graph
        assert all(np.allclose(three[k], one[k], rtol=1e-5, atol=1e-6) for k in one)
        # a client's graphs outside ``select`` take no part
        half = _pool(copy.deepcopy(model), parts, [np.arange(b.num_graphs // 2) for b in parts])
        assert not np.allclose(half["norms.4.running_var"], three["norms.4.running_var"], rtol=1e-3)
        # reference: PyTorch's own train-mode pass over all graphs at once (momentum None stores the
        # batch mean and unbiased variance). The first layer's input is the same, so it agrees to float
        # precision; later layers' inputs differ by train mode normalising with the biased variance
        # (a factor (N-1)/N on the variance, N = 463 nodes), so they agree to a few times 1/N.
        ref = copy.deepcopy(model)
        for mod in ref.modules():
            if isinstance(mod, torch.nn.modules.batchnorm._BatchNorm):
                mod.reset_running_stats()
                mod.momentum = None
        full = gw_ldp.make_batch(graphs, 8)
        ref.train()
        with torch.no_grad():
            ref(full.x, full.edge_index)
        want = gw_ldp.get_weights(ref)
    first = [k for k in want if k.startswith("convs.0.nn.1.running")]
    assert all(np.allclose(three[k], want[k], rtol=1e-5, atol=1e-6) for k in first)
    nodes = full.x.shape[0]

    def off(stats, k):  # largest deviation from the reference, relative to the layer's scale
        return np.abs(stats[k] - want[k]).max() / np.abs(want[k]).max()

    rest = [k for k in want if "running" in k]
    assert max(off(three, k) for k in rest) <= 4 / nodes
    # what FedAvg of the clients' own statistics gives instead is far off
    averaged = {}
    for b in parts:
        m = copy.deepcopy(ref)
        for mod in m.modules():
            if isinstance(mod, torch.nn.modules.batchnorm._BatchNorm):
                mod.reset_running_stats()
        m.train()
        with torch.no_grad():
            m(b.x, b.edge_index)
        averaged[b.num_graphs] = gw_ldp.get_weights(m)
    avg = gw_ldp.fedavg(list(averaged.values()), list(averaged))
    assert max(off(avg, k) for k in rest) > 40 / nodes


def test_malformed_batchnorm_moments_are_named():
    ok = np.concatenate([[4.0], [2.0, -2.0], [2.0, 1.0]])
    assert gw_ldp.moments_problem(ok, 2) is None
    assert gw_ldp.moments_problem(np.zeros(5), 2) is None  # a client without training graphs
    cases = {"shape": np.zeros(4), "finite": np.array([4.0, np.nan, 0, 1, 1]),
             "whole number": np.array([2.5, 0, 0, 1, 1]), "whole number >= 0": np.array([-1.0, 0, 0, 1, 1]),
             "squared sums": np.array([4.0, 4.0, 0, 3.9, 0]), "zero nodes": np.array([0.0, 1.0, 0, 1, 0])}
    for words, bad in cases.items():
        assert words in gw_ldp.moments_problem(bad, 2)
    assert "not finite floats" in gw_ldp.moments_problem(np.zeros(5, dtype=np.int64), 2)
    with pytest.raises(ValueError, match="at least 2 nodes, the clients hold 1"):
        gw_ldp.pooled_norm_statistics([np.array([1.0, 3.0, 9.0])])


@pytest.mark.integration
def test_malformed_batchnorm_moments_stop_the_run_and_dp_keeps_averaged_statistics(out_dir, monkeypatch):
    shared_datasets_or_skip()
    from clients.gw_ldp import GWLDPClient

    honest = GWLDPClient.on_gw_norm

    def corrupt(self, arrays, values):
        reply, vals = honest(self, arrays, values)
        if self.shard.client_id == 1:
            reply["moments"][0] = -3.0
        return reply, vals

    monkeypatch.setattr(GWLDPClient, "on_gw_norm", corrupt)
    with pytest.raises(ProtocolError, match=r"client 1: malformed BatchNorm moments for 'convs.0.nn.1': node "
                                            r"count -3.0 is not a whole number >= 0"):
        run_experiment("gw-ldp", "mutag", 2, {"num-rounds": 1, "gw-ldp.svc": False, "reference": False}, out_dir)
    # under training DP the activation moments would be unprotected: auto keeps the averaged statistics
    # (no gw_norm round), and asking for pooled ones is refused
    result = run_experiment("gw-ldp", "mutag", 2, {"num-rounds": 1, "gw-ldp.svc": False, "reference": False,
                                                    "gw-ldp.dp": "sgd"}, out_dir.parent / "dp")
    assert result["metrics"]["norm_statistics"] == "averaged" and result["metrics"]["norm_rounds"] == 0
    assert not any(r["action"] == "gw_norm" for r in result["timing"]["per_round"])
    with pytest.raises(ConfigError, match="invalid value 'pooled' for 'gw-ldp.norm-statistics' with "
                                          "gw-ldp.dp='client'.*valid with DP: auto, averaged"):
        run_experiment("gw-ldp", "mutag", 2, {"gw-ldp.dp": "client", "gw-ldp.norm-statistics": "pooled"},
                       out_dir.parent / "bad")


def test_client_level_dp_update_is_clipped_and_leaves_batchnorm_statistics_alone():
    from fedgraphcore.data.types import GraphData
    from fedgraphcore.privacy.gaussian import GaussianMechanism

    rng = np.random.default_rng(4)
    graphs = [GraphData(name="g", adj=random_graph(rng, 7, 0.5), x=None, y=None, meta={}) for _ in range(10)]
    batch = gw_ldp.make_batch(graphs, degree_dim=7)
    y = np.arange(10) % 2
    model = build_model("gin", 7, 2, seed=0)
    start = gw_ldp.get_weights(model)
    with gw_ldp.torch_threads(1):
        gw_ldp.local_train(model, batch, y, np.arange(10), "graph", 5, 0.05, 0, freeze_norm=True)
    new = gw_ldp.get_weights(model)
    trainable = gw_ldp.trainable_names(model)
    stats = [k for k in start if k not in trainable]
    assert stats and all(np.array_equal(start[k], new[k]) for k in stats)  # frozen by local training
    # no noise: the update of the trainable weights is clipped to L2 0.1, statistics come back as sent
    quiet = gw_ldp.privatise_update(start, new, trainable, GaussianMechanism(0.1, 1e-12, delta=1e-5),
                                   np.random.default_rng(0))
    step = np.concatenate([(quiet[k] - start[k]).ravel() for k in trainable])
    assert 0.099 < np.linalg.norm(step) <= 0.1 + 1e-6
    # heavy noise (GIN's BatchNorm variance would turn negative if it were noised): finite, statistics intact
    noisy = gw_ldp.privatise_update(start, new, trainable, GaussianMechanism(1.0, 8.0, delta=1e-5),
                                   np.random.default_rng(0))
    assert all(np.isfinite(v).all() for v in noisy.values())
    assert all(np.array_equal(noisy[k], start[k]) for k in stats)
    gw_ldp.set_weights(model, noisy)
    assert all(np.isfinite(h).all() for h in gw_ldp.node_embeddings(model, batch, "hidden"))
    # a diverged model is reported as such, not clipped into a NaN upload
    weight = sorted(trainable)[0]
    with pytest.raises(ValueError, match="diverged"):
        gw_ldp.privatise_update(start, {**new, weight: new[weight] * np.nan}, trainable,
                               GaussianMechanism(1.0, 1.0, delta=1e-5), np.random.default_rng(0))
    # a statistic that changed during DP training would leave unprotected: refused
    moved = {**new, stats[0]: new[stats[0]] + 1.0}
    with pytest.raises(ValueError, match=stats[0]):
        gw_ldp.privatise_update(start, moved, trainable, GaussianMechanism(1.0, 1.0, delta=1e-5),
                               np.random.default_rng(0))


def test_local_dp_sgd_clips_per_graph_and_its_epsilon_is_opacus_rdp(out_dir):
    shared_datasets_or_skip()
    from opacus.accountants import RDPAccountant

    from fedgraphcore.data.types import GraphData

    # per-graph clipping: with a tiny clip and no noise, one step moves the
    # weights by at most lr per coordinate (Adam) and the result is reproducible
    rng = np.random.default_rng(9)
    graphs = [GraphData(name="g", adj=random_graph(rng, 6, 0.5), x=None, y=None, meta={}) for _ in range(8)]
    batch = gw_ldp.make_batch(graphs, degree_dim=6)
    y = np.arange(8) % 2
    runs = []
    for _ in range(2):
        model = build_model("gin", 6, 2, seed=0)
        before = gw_ldp.get_weights(model)
        with gw_ldp.torch_threads(1):
            assert gw_ldp.dp_sgd_train(model, batch, y, np.arange(8), "graph", 1, 0.01, 1e-3, 1e-9, 1.0, 3) == 1
        after = gw_ldp.get_weights(model)
        runs.append(after)
        assert max(np.abs(after[k] - before[k]).max() for k in before) <= 0.01 + 1e-6
        bn = [k for k in before if "running" in k]
        assert bn and all(np.array_equal(before[k], after[k]) for k in bn)  # BN statistics frozen
    assert all(np.array_equal(runs[0][k], runs[1][k]) for k in runs[0])
    # end to end: the ledger's epsilon is Opacus' RDP accountant for rounds * epochs steps
    result = run_experiment("gw-ldp", "citeseer", 2, {**KHOP, "khop.centres": 20, "gw-ldp.dp": "sgd",
                                                       "gw-ldp.dp-noise": 1.1, "gw-ldp.dp-sample-rate": 0.25,
                                                       "gw-ldp.svc": False, "reference": False}, out_dir)
    mech = {x["name"]: x for x in result["privacy"]["mechanisms"]}["dp-sgd:local-graphs"]
    acc = RDPAccountant()
    for _ in range(3 * 2):
        acc.step(noise_multiplier=1.1, sample_rate=0.25)
    assert mech["epsilon"] == pytest.approx(acc.get_epsilon(delta=1e-5), rel=1e-9)
    assert mech["params"]["steps"] == 6 and mech["delta"] == 1e-5
    fit = [u for u in result["privacy"]["uploads"] if u["action"] == "fit"]
    assert all(u["noised"] for u in fit if u["name"].startswith("w."))
    assert {u["name"] for u in fit if not u["name"].startswith("w.")} == {"num_examples"}


def test_bad_config_is_one_line_error(out_dir):
    with pytest.raises(ConfigError, match="valid choices: validation, cv"):
        run_experiment("gw-ldp", "mutag", 2, {"gw-ldp.svc-selection": "test"}, out_dir)
    with pytest.raises(ConfigError, match="valid choices"):
        run_experiment("gw-ldp", "mutag", 2, {"partitioner": "node-random"}, out_dir)
    with pytest.raises(ConfigError, match="valid choices"):
        run_experiment("gw-ldp", "mutag", 2, {"gw-ldp.model": "gat"}, out_dir)
    with pytest.raises(ConfigError, match="valid choices: classes, hidden"):
        run_experiment("gw-ldp", "mutag", 2, {"gw-ldp.embedding": "logits"}, out_dir)
    with pytest.raises(ConfigError, match="gw-ldp.epsilon"):
        run_experiment("gw-ldp", "mutag", 2, {"gw-ldp.epsilon": -1}, out_dir)


def test_clients_reporting_different_feature_widths_stop_the_run(out_dir, monkeypatch):
    from clients.gw_ldp import GWLDPClient
    from conftest import patch_reply

    shared_datasets_or_skip()
    patch_reply(monkeypatch, GWLDPClient, "hello",
                lambda shard, out, vals: (out, {**vals, "in_dim": vals["in_dim"] + shard.client_id}))
    with pytest.raises(ProtocolError, match=r"clients report different feature widths \[7, 8\]"):
        run_experiment("gw-ldp", "mutag", 2, {"num-rounds": 1, "reference": False}, out_dir)


def test_a_malformed_describe_reply_stops_the_run_and_names_the_client(out_dir, monkeypatch):
    from clients.gw_ldp import GWLDPClient
    from conftest import patch_reply

    shared_datasets_or_skip()
    patch_reply(monkeypatch, GWLDPClient, "hello",
                lambda shard, out, vals: (out, {**vals, "train": vals["graphs"] + 1}), client=1)
    with pytest.raises(ProtocolError, match=r"^client 1: malformed hello figures: train=\d+; valid: a whole "
                                            r"number from 0 to its \d+ graphs$"):
        run_experiment("gw-ldp", "mutag", 2, {"num-rounds": 1, "reference": False}, out_dir)


@pytest.mark.integration
def test_a_client_whose_supernode_restarts_is_taken_back_into_training(out_dir, mirrored_datasets):
    from app.client_app import build_client_app
    from app.server_app import run_server
    from conftest import RestartingGrid

    raw = {"strategy": "gw-ldp", "dataset": "mutag", "num-clients": 3, "num-rounds": 4, "min-clients": 2,
           "gw-ldp.svc": False, "reference": False, "out-dir": str(out_dir)}
    grid = RestartingGrid(build_client_app(raw), 3, leave_at=2, back_at=3, action=gw_ldp.FIT, category="train")
    result = run_server(grid, raw)
    fits = [r["replies"] for r in result["timing"]["per_round"] if r["action"] == gw_ldp.FIT]
    assert fits == [3, 2, 2, 3]  # gone in round 2, back during round 3's request, trains again from round 4
    assert [r["client"] for r in result["communication"]["rejoined"]] == [2]
    m = result["metrics"]
    assert m["dropped_clients"] == [] and m["stale_clients"] == [] and m["graphs_missing"] == 0
