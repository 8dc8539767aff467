"""FedSpectral / FedSpectral+: protocol math, end-to-end runs, privacy of uploads."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.linalg as sla

from fedgraphcore.clustering import spectral_affinity, spectral_graph
from app.client_app import build_client_app
from fedgraphcore.config import ConfigError
from fedgraphcore.data import load_dataset
from fedgraphcore.data.partition import partition
from app.inprocess import InProcessGrid
from fedgraphcore.metrics import ari
from fedgraphcore.privacy.gaussian import GaussianMechanism
from fedgraphcore.protocols.fedspectral import baseline, block_iteration, plus
from app.registry import validate
from app.run import run_experiment
from app.server_app import run_server
from fedgraphcore.wire import ProtocolError
from fedgraphcore.transport import pack, unpack
from conftest import LeavingGrid, check_page, patch_reply

SBM = {"sbm.nodes": 300, "sbm.blocks": 4, "sbm.p-in": 0.12, "sbm.p-out": 0.01, "sbm.features": 0}
K = 4


def coassociation_dense(label_sets: list[np.ndarray]) -> np.ndarray:
    """The paper's N x N similarity graph (equation 1), dense (small N only)."""
    b = baseline.coassociation_matrix(label_sets)
    return (b @ b.T).toarray()


def sbm_graph(seed: int = 0):
    return load_dataset("sbm", seed=seed, nodes=300, blocks=4, p_in=0.12, p_out=0.01, features=0)


def normalised(adj):
    d = np.asarray(adj.sum(axis=1)).ravel()
    inv = plus.inverse_sqrt_degrees(d)
    return sp.csr_matrix(sp.diags(inv) @ adj @ sp.diags(inv))


# --------------------------------------------------------------------------- protocol math


@pytest.mark.parametrize("replicas", [1, 2, 3])
def test_weighted_client_products_sum_to_the_global_operator(replicas):
    data = sbm_graph()
    shards = partition(data, "edge", 3, seed=1, replicas=replicas)
    weighted = [plus.weighted_local_adjacency(s.adj, s.edge_weight) for s in shards]
    assert abs(sum(weighted) - data.adj).max() < 1e-12
    d = sum(plus.local_degrees(w) for w in weighted)
    np.testing.assert_allclose(d, np.asarray(data.adj.sum(axis=1)).ravel(), atol=1e-12)
    x = np.random.default_rng(0).standard_normal((data.num_nodes, 5))
    dinv = plus.inverse_sqrt_degrees(d)
    mx = dinv[:, None] * sum(w @ (dinv[:, None] * x) for w in weighted)
    np.testing.assert_allclose(mx, normalised(data.adj) @ x, atol=1e-12)
    if replicas > 1:  # without the 1/r weights overlapping edges count r times
        unweighted = sum(s.adj for s in shards)
        assert abs(unweighted - replicas * data.adj).max() == 0


def test_weighted_adjacency_rejects_misaligned_weights():
    adj = sbm_graph().adj
    with pytest.raises(ValueError, match="edge_weight has shape"):
        plus.weighted_local_adjacency(adj, np.ones(3))


def test_qr_output_is_orthonormal_and_paper_step_averages():
    rng = np.random.default_rng(3)
    blocks = [rng.standard_normal((200, 6)) for _ in range(4)]
    v = plus.paper_server_step(blocks, 4)
    np.testing.assert_allclose(v.T @ v, np.eye(6), atol=1e-12)
    mean = np.mean(blocks, axis=0)
    # same column space as the average (QR only orthonormalises)
    assert block_iteration.subspace_distance(block_iteration.orthonormalise(mean), v) < 1e-10
    q = block_iteration.init_block(200, 6, seed=5)
    np.testing.assert_allclose(q.T @ q, np.eye(6), atol=1e-12)
    assert np.array_equal(q, block_iteration.init_block(200, 6, seed=5))


def test_paper_client_step_is_local_normalised_adjacency_power():
    shard = partition(sbm_graph(), "edge", 3, seed=0, replicas=2)[1]
    a = shard.adj.toarray()
    d = a.sum(1)
    inv = np.where(d > 0, 1 / np.sqrt(np.maximum(d, 1e-300)), 0.0)
    m = inv[:, None] * a * inv[None, :]  # I - L_c with the local degrees
    v = np.random.default_rng(1).standard_normal((a.shape[0], 4))
    got = plus.paper_client_step(plus.local_normalised_operator(shard.adj), v, 3)
    np.testing.assert_allclose(got, m @ m @ m @ v, atol=1e-12)


def test_chebyshev_iteration_finds_the_top_eigenspace():
    data = sbm_graph(seed=2)
    m = normalised(data.adj)
    calls = []

    def apply(x):
        calls.append(1)
        return m @ x

    res = block_iteration.chebyshev_subspace_iteration(apply, m.shape[0], K, 2 * K, 6, 1e-10, 2000, seed=0)
    vals, vecs = sla.eigsh(m, k=K, which="LA", tol=1e-12)
    assert res.converged and res.stop == "converged" and res.rounds == len(calls)
    np.testing.assert_allclose(res.values, vals[::-1], atol=1e-9)
    assert block_iteration.subspace_distance(res.vectors, vecs) < 1e-7
    np.testing.assert_allclose(res.vectors.T @ res.vectors, np.eye(K), atol=1e-10)


def test_chebyshev_iteration_stops_on_a_noise_floor_and_on_max_rounds():
    m = normalised(sbm_graph().adj)
    rng = np.random.default_rng(0)
    noisy = block_iteration.chebyshev_subspace_iteration(
        lambda x: m @ x + 1e-4 * rng.standard_normal(x.shape), m.shape[0], K, 8, 4, 1e-12, 5000, seed=0)
    assert noisy.stop == "stagnated" and not noisy.converged and noisy.rounds < 5000
    capped = block_iteration.chebyshev_subspace_iteration(lambda x: m @ x, m.shape[0], K, 8, 4, 0.0, 21, seed=0)
    assert capped.stop == "max-rounds" and capped.rounds <= 21
    with pytest.raises(ValueError, match="k <= block"):
        block_iteration.chebyshev_subspace_iteration(lambda x: x, 10, 4, 3, 2, 1e-6, 10, seed=0)


def federated_operator(shards):
    """``X -> D^-1/2 sum_c (A_c / r) D^-1/2 X`` from the clients' own weighted adjacencies and
    degree shares (what exact mode's server gets back each round), counting the rounds."""
    weighted = [plus.weighted_local_adjacency(s.adj, s.edge_weight) for s in shards]
    dinv = plus.inverse_sqrt_degrees(sum(plus.local_degrees(w) for w in weighted), floor=0.5)
    calls = []

    def apply(x):
        calls.append(x.shape[1])
        y = dinv[:, None] * x
        return dinv[:, None] * sum(w @ y for w in weighted)

    return apply, calls


def test_block_krylov_with_one_client_finds_the_centralised_eigenspace():
    data = sbm_graph(seed=2)
    apply, calls = federated_operator(partition(data, "edge", 1, seed=0))
    res = block_iteration.block_krylov_iteration(apply, data.num_nodes, K, 2 * K, 1e-10, 2000, seed=0)
    vals, vecs = sla.eigsh(normalised(data.adj), k=K, which="LA", tol=1e-12)
    assert res.converged and res.stop == "converged" and res.rounds == len(calls)
    assert set(calls) == {2 * K}  # every round one block of the configured width
    np.testing.assert_allclose(res.values, vals[::-1], atol=1e-10)
    assert block_iteration.subspace_distance(res.vectors, vecs) < 1e-8
    np.testing.assert_allclose(res.vectors.T @ res.vectors, np.eye(K), atol=1e-12)
    # the residual the server stopped on is the true one
    m = normalised(data.adj)
    true = np.linalg.norm(m @ res.vectors - res.vectors * res.values, axis=0).max()
    assert true <= 1e-10 and true == pytest.approx(res.history[-1]["residual"], rel=1e-3)
    cheb = block_iteration.chebyshev_subspace_iteration(apply, data.num_nodes, K, 2 * K, 8, 1e-10, 2000, seed=0)
    assert res.rounds < cheb.rounds


@pytest.mark.parametrize("replicas", [1, 2])
def test_block_krylov_with_several_clients_equals_the_one_client_run(replicas):
    data = sbm_graph(seed=3)
    runs = []
    for clients in (1, 3):
        apply, _ = federated_operator(partition(data, "edge", clients, seed=1, replicas=min(replicas, clients)))
        runs.append(block_iteration.block_krylov_iteration(apply, data.num_nodes, K, 2 * K, 1e-9, 2000, seed=4))
    one, several = runs
    assert several.rounds == one.rounds and several.stop == one.stop == "converged"
    assert block_iteration.subspace_distance(several.vectors, one.vectors) < 1e-9
    np.testing.assert_allclose(several.values, one.values, atol=1e-12)
    assert np.array_equal(plus.embedding_labels(several.vectors, K, 0), plus.embedding_labels(one.vectors, K, 0))


def test_block_krylov_restarts_within_its_basis_and_exhausts_small_spaces():
    m = normalised(sbm_graph(seed=1).adj)
    vals, vecs = sla.eigsh(m, k=K, which="LA", tol=1e-12)
    res = block_iteration.block_krylov_iteration(lambda x: m @ x, m.shape[0], K, K + 1, 1e-9, 2000, seed=0, basis_blocks=3)
    widths = [h["basis"] for h in res.history]
    assert res.converged and max(widths) <= 3 * (K + 1) and widths != sorted(widths)  # restarted at least once
    assert block_iteration.subspace_distance(res.vectors, vecs) < 1e-7
    # a 6-node graph: two blocks of 4 span everything, the residual is 0
    small = normalised(sp.csr_matrix(np.ones((6, 6)) - np.eye(6)))
    tiny = block_iteration.block_krylov_iteration(lambda x: small @ x, 6, 2, 4, 0.0, 50, seed=0)
    assert tiny.converged and tiny.rounds == 2 and tiny.history[-1]["residual"] == 0.0


def test_block_krylov_stops_on_a_noise_floor_and_on_max_rounds():
    m = normalised(sbm_graph().adj)
    rng = np.random.default_rng(0)
    noisy = block_iteration.block_krylov_iteration(
        lambda x: m @ x + 1e-4 * rng.standard_normal(x.shape), m.shape[0], K, 8, 1e-12, 5000, seed=0)
    assert noisy.stop == "stagnated" and not noisy.converged and noisy.rounds < 100
    capped = block_iteration.block_krylov_iteration(lambda x: m @ x, m.shape[0], K, 8, 0.0, 7, seed=0)
    assert capped.stop == "max-rounds" and capped.rounds == 7
    with pytest.raises(ValueError, match="k <= block"):
        block_iteration.block_krylov_iteration(lambda x: x, 10, 4, 3, 1e-6, 10, seed=0)
    with pytest.raises(ValueError, match="at least 2 blocks"):
        block_iteration.block_krylov_iteration(lambda x: x, 10, 2, 3, 1e-6, 10, seed=0, basis_blocks=1)


def test_coassociation_low_rank_equals_dense_similarity_graph():
    rng = np.random.default_rng(0)
    truth = np.repeat(np.arange(5), 40)
    sets = []
    for _ in range(4):  # noisy copies of a planted partition, relabelled
        lab = truth.copy()
        flip = rng.random(lab.size) < 0.15
        lab[flip] = rng.integers(0, 5, flip.sum())
        sets.append(rng.permutation(5)[lab])
    s = coassociation_dense(sets)
    expected = np.mean([np.equal.outer(lab, lab) for lab in sets], axis=0)
    np.testing.assert_allclose(s, expected, atol=1e-12)  # equation 1 incl. the diagonal
    u = baseline.coassociation_embedding(sets, 5)
    d = s.sum(1)
    mm = s / np.sqrt(np.outer(d, d))
    vals, vecs = np.linalg.eigh(mm)
    assert block_iteration.subspace_distance(u, vecs[:, -5:]) < 1e-8
    labels = baseline.coassociation_labels(sets, 5, seed=0)
    assert ari(spectral_affinity(s, 5, seed=0), labels) == 1.0
    with pytest.raises(ValueError, match="differ in length"):
        baseline.coassociation_matrix([np.zeros(3), np.zeros(4)])


def test_edge_sensitivity_bounds_hold():
    rng = np.random.default_rng(0)
    data = sbm_graph()
    adj = data.adj.tolil()
    y = rng.standard_normal((data.num_nodes, 4))
    base_exact = data.adj @ y
    base_paper = plus.paper_client_step(plus.local_normalised_operator(data.adj), block_iteration.orthonormalise(y), 3)
    q = block_iteration.orthonormalise(y)
    for _ in range(20):
        i, j = rng.choice(data.num_nodes, 2, replace=False)
        other = adj.copy()
        other[i, j] = other[j, i] = 0.0 if adj[i, j] else 1.0
        other = sp.csr_matrix(other)
        other.eliminate_zeros()
        assert np.linalg.norm(other @ y - base_exact) <= plus.exact_edge_sensitivity(y) + 1e-12
        moved = plus.paper_client_step(plus.local_normalised_operator(other), q, 3) - base_paper
        assert np.linalg.norm(moved) <= plus.paper_edge_sensitivity(q, 3) + 1e-12


def test_bad_config_values_are_one_line_errors():
    with pytest.raises(ConfigError, match="fedspectral-plus.mode.*valid choices: paper, exact"):
        validate({"strategy": "fedspectral-plus", "fedspectral-plus.mode": "fast"})
    with pytest.raises(ConfigError, match="block=2 is smaller than num-clusters=4"):
        validate({"strategy": "fedspectral-plus", "num-clusters": 4, "fedspectral-plus.block": 2})
    with pytest.raises(ConfigError, match="partitioner 'node-random' does not fit"):
        validate({"strategy": "fedspectral", "partitioner": "node-random"})
    with pytest.raises(ConfigError, match="wire-dtype"):
        validate({"strategy": "fedspectral-plus", "fedspectral-plus.wire-dtype": "float16"})
    with pytest.raises(ConfigError, match="fedspectral-plus.solver.*valid choices: auto, krylov, chebyshev"):
        validate({"strategy": "fedspectral-plus", "fedspectral-plus.solver": "lanczos"})
    with pytest.raises(ConfigError, match="fedspectral-plus.basis-blocks"):
        validate({"strategy": "fedspectral-plus", "fedspectral-plus.basis-blocks": 1})


# --------------------------------------------------------------------------- end to end (in-process)


def exact(**extra):
    return {**SBM, "num-clusters": K, "fedspectral-plus.mode": "exact", **extra}


def paper(**extra):
    return {**SBM, "num-clusters": K, "fedspectral-plus.mode": "paper", **extra}


@pytest.mark.parametrize("solver", ["krylov", "chebyshev"])
def test_one_client_exact_mode_equals_centralised_spectral_clustering(out_dir, solver):
    result = run_experiment("fedspectral-plus", "sbm", 1, exact(**{"fedspectral-plus.solver": solver}), out_dir)
    assert result["metrics"]["converged"] and result["metrics"]["stop"] == "converged"
    assert result["metrics"]["solver"] == solver
    final = result["metrics"]["final_residual" if solver == "krylov" else "final_subspace_change"]
    assert final <= result["metrics"]["tol"] == 1e-9
    assert result["reference"]["agreement"]["ari"] == 1.0
    labels = np.load(out_dir / "labels.npy")
    data = sbm_graph()
    assert np.array_equal(labels, spectral_graph(data.adj, K, 0, n_init=0))  # the default restarts
    assert ari(data.y, labels) == 1.0  # planted blocks recovered
    # one client: nothing to mask, and the ledger says so
    [degrees] = [u for u in result["privacy"]["uploads"] if u["name"] == "degrees"]
    assert not degrees["masked"] and degrees["dtype"] == "float64"
    mech = {m["name"]: m for m in result["privacy"]["mechanisms"]}["fedspectral-plus:global-degrees"]
    assert mech["protects"].startswith("nothing: one client")


@pytest.mark.shipped_defaults
def test_exact_mode_with_overlapping_edges_equals_centralised(out_dir):
    result = run_experiment("fedspectral-plus", "sbm", 3, exact(**{"partition.replicas": 2}), out_dir)
    check_page(out_dir, figures=2)  # 300 nodes drawn whole with their edges, the rounds
    assert result["reference"]["agreement"]["ari"] == 1.0
    degrees = [m for m in result["privacy"]["mechanisms"] if m["name"] == "fedspectral-plus:global-degrees"]
    assert degrees and degrees[0]["guarantee"].startswith("none")
    ups = [u for u in result["privacy"]["uploads"] if u["action"] == "fedspectral_degrees"]
    # a degree is at most n = 300, so 3 clients' sum fits the 32-bit ring (at its finest scale, 2^20 or finer)
    assert len(ups) == 3 and all(u["masked"] and u["dtype"] == "uint32" for u in ups)


class RecordingGrid(InProcessGrid):
    """In-process grid keeping every reply; ``tamper(node, content)`` may rewrite one."""

    def __init__(self, *args, tamper=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen, self.tamper = [], tamper

    def pull_messages(self, message_ids):
        replies = list(super().pull_messages(message_ids))
        if self.tamper:
            for reply in replies:
                self.tamper(reply)
        self.seen.extend(replies)
        return replies


def run_recorded(strategy, clients, overrides, out_dir, tamper=None):
    raw = {**overrides, "strategy": strategy, "dataset": "sbm", "num-clients": clients, "out-dir": str(out_dir)}
    grid = RecordingGrid(build_client_app(raw), clients, tamper=tamper)
    return grid, run_server(grid, raw)


@pytest.mark.parametrize("mode", ["exact", "paper"])
def test_secure_aggregation_gives_the_same_labels(mode, tmp_path):
    over = exact() if mode == "exact" else paper(**{"fedspectral-plus.rounds": 6})
    over = {**over, "partition.replicas": 2, "secagg.scale": 2.0**32}
    run_experiment("fedspectral-plus", "sbm", 3, over, tmp_path / "plain")
    grid, secure = run_recorded("fedspectral-plus", 3, {**over, "fedspectral-plus.secure": True}, tmp_path / "s")
    assert np.array_equal(np.load(tmp_path / "plain" / "labels.npy"), np.load(tmp_path / "s" / "labels.npy"))
    action = "query.fedspectral_product" if mode == "exact" else "query.fedspectral_power"
    blocks = [unpack(m.content)[0]["block"] for m in grid.seen if m.metadata.message_type == action]
    assert blocks and all(b.dtype == np.uint64 for b in blocks)
    for b in blocks:  # masked: uniform-looking top bits, not small fixed-point numbers
        assert len(np.unique(b >> np.uint64(60))) > 8
    ups = [u for u in secure["privacy"]["uploads"] if u["name"] == "block"]
    assert ups and all(u["masked"] for u in ups)
    assert secure["communication"]["secure_aggregations"] >= len(blocks) // 3


@pytest.mark.parametrize("bad", ["shape", "nan"])
def test_malformed_block_is_rejected_and_reported(bad, out_dir):
    def tamper(reply):
        if reply.metadata.message_type != "query.fedspectral_power" or reply.metadata.src_node_id != 1002:
            return
        arrays, values = unpack(reply.content)
        block = arrays["block"]
        arrays["block"] = block[:-1] if bad == "shape" else np.where(block == block.max(), np.nan, block)
        reply.content = pack(arrays, values)

    # paper mode averages the valid blocks: the bad client is dropped and reported
    _, result = run_recorded("fedspectral-plus", 3, paper(**{"fedspectral-plus.rounds": 2}), out_dir, tamper)
    [dropped] = result["communication"]["dropped"]
    assert dropped["action"] == "fedspectral_power" and dropped["node"] == 1002
    reason = dropped["reason"]
    assert ("has shape (299, 4), expected (300, 4)" in reason) if bad == "shape" else ("NaN" in reason)
    # with secure aggregation every block is needed: the same reply stops the run
    with pytest.raises(ProtocolError) as err:
        run_recorded("fedspectral-plus", 3, paper(**{"fedspectral-plus.rounds": 2, "fedspectral-plus.secure": True}),
                     out_dir / "secure", tamper)
    assert "fedspectral_power" in str(err.value) and "node 1002" in str(err.value)


def test_uploads_never_carry_the_edge_list(out_dir):
    """What leaves a client: N x b float blocks (plus) or N labels (baseline)."""
    over = paper(**{"partition.replicas": 1, "fedspectral-plus.rounds": 3})
    grid, result = run_recorded("fedspectral-plus", 2, over, out_dir / "plus")
    data = sbm_graph()
    shards = partition(data, "edge", 2, seed=0, replicas=1)
    for reply in grid.seen:
        arrays, _ = unpack(reply.content)
        for name, a in arrays.items():
            assert name == "block" and a.shape == (data.num_nodes, K) and a.dtype == np.float64
            assert np.count_nonzero(a) > 0.9 * a.size  # dense products, not 0/1 adjacency rows
            # no row of a node with local edges looks like an adjacency row (0/1 entries); a
            # node without local edges gets a zero row (documented: that fact does leak)
            has_edges = np.diff(shards[reply.metadata.src_node_id - 1001].adj.indptr) > 0
            assert not np.any(np.all(np.isin(a, (0.0, 1.0)), axis=1) & has_edges)
            assert np.all(a[~has_edges] == 0)
    grid, _ = run_recorded("fedspectral", 2, {**SBM, "num-clusters": K}, out_dir / "base")
    got = [unpack(r.content)[0] for r in grid.seen if r.metadata.message_type == "query.fedspectral_local"]
    assert len(got) == 2
    for arrays in got:
        assert set(arrays) == {"labels"} and arrays["labels"].shape == (data.num_nodes,)
        assert arrays["labels"].min() >= 0 and arrays["labels"].max() < K


@pytest.mark.shipped_defaults
def test_baseline_with_one_client_reproduces_centralised(out_dir):
    result = run_experiment("fedspectral", "sbm", 1, {**SBM, "num-clusters": K}, out_dir)
    check_page(out_dir, figures=2)
    assert result["reference"]["agreement"]["ari"] == 1.0
    assert result["metrics"]["cluster_similarity"] == 1.0


def test_baseline_local_labels_outside_0_to_k_are_rejected_naming_the_client(out_dir, monkeypatch):
    from clients.fedspectral import FedSpectralClient

    # client 1 numbers its clusters from 1 to k
    patch_reply(monkeypatch, FedSpectralClient, "fedspectral_local",
                lambda shard, out, vals: ({"labels": out["labels"] + 1}, vals), client=1)
    with pytest.raises(ProtocolError, match=r"step 'fedspectral_local' rejected 1 client\(s\): client 1 .*"
                                            r"array 'labels' has values in \[1, 4\], expected \[0, 4\)"):
        run_experiment("fedspectral", "sbm", 2, {**SBM, "num-clusters": K}, out_dir)


def test_exact_mode_refuses_degrees_no_graph_gives(out_dir, monkeypatch):
    from clients.fedspectral import FedSpectralPlusClient
    from strategies.fedspectral import _check_degrees

    # one client, whose degrees are the sum: negated, every node looked isolated and the run "converged"
    patch_reply(monkeypatch, FedSpectralPlusClient, "fedspectral_degrees",
                lambda shard, out, vals: ({"degrees": -out["degrees"]}, vals))
    with pytest.raises(ProtocolError, match=r"step 'fedspectral_degrees': the summed degrees range from -\d+ "
                                            r"to -\d+, outside \[0, 300\]"):
        run_experiment("fedspectral-plus", "sbm", 1, exact(), out_dir)
    _check_degrees(np.array([-2.9, 302.9]), 300, slack=3.0)  # within the noise allowance
    for d in ([-3.1, 5.0], [0.0, 303.1]):
        with pytest.raises(ProtocolError, match="outside"):
            _check_degrees(np.array(d), 300, slack=3.0)


def test_paper_mode_recovers_planted_blocks_and_float32_wire(tmp_path):
    over = paper(**{"partition.replicas": 2})
    r64 = run_experiment("fedspectral-plus", "sbm", 3, over, tmp_path / "a")
    assert r64["metrics"]["protocol_rounds"] == 20 and r64["metrics"]["iters"] == 6  # paper defaults
    assert r64["metrics"]["ari"] > 0.95
    r32 = run_experiment("fedspectral-plus", "sbm", 3, {**over, "fedspectral-plus.wire-dtype": "float32"},
                         tmp_path / "b")
    assert np.array_equal(np.load(tmp_path / "a" / "labels.npy"), np.load(tmp_path / "b" / "labels.npy"))
    assert r32["communication"]["bytes_up"] < 0.6 * r64["communication"]["bytes_up"]


def test_client_noise_has_the_requested_std_and_a_re_sent_request_gets_the_same_draw():
    from flwr.app import Context, RecordDict

    from fedgraphcore.privacy.policy import PrivacyRefusal
    from app.registry import validate
    from clients.fedspectral import FedSpectralPlusClient

    def client(multiplier: float) -> FedSpectralPlusClient:
        config = validate({"strategy": "fedspectral-plus", "fedspectral-plus.noise-multiplier": multiplier})
        return FedSpectralPlusClient(None, config, context)

    context = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})
    request = {"block": np.ones((3, 2))}

    def upload(release, std=0.5, multiplier=0.0):
        return client(multiplier)._upload("fedspectral_product", request, {"noise_std": std, "release": release},
                                          "block", lambda: np.zeros((20000, 2)), 0.2, masked_by_run=False,
                                          floor=0.0)[0]["block"]

    first = upload(1)
    assert first.std() == pytest.approx(0.5, rel=0.03) and abs(first.mean()) < 0.02  # the noise is really added
    assert np.array_equal(upload(1), first)  # the same request again: the first draw, no second release
    assert not np.array_equal(upload(2), first)  # the next release: fresh noise
    assert not upload(3, std=0.0).any()  # no noise requested, none added
    # a client whose own config asks for noise refuses a request for less than its multiplier x sensitivity
    assert upload(4, std=0.4, multiplier=2.0).std() == pytest.approx(0.4, rel=0.03)
    for std, got in ((0.39, "noise multiplier 1.95"), (0.0, "no noise")):
        with pytest.raises(PrivacyRefusal, match=rf"rule 'noise-multiplier': 'fedspectral_product' was requested "
                                                 rf"with {got}; this client needs at least 2 \(its node's "
                                                 r"noise-multiplier 0, its run's 2\)$"):
            upload(5, std=std, multiplier=2.0)


def test_a_noised_block_re_sent_after_a_timeout_is_one_release(out_dir):
    from app.inprocess import FIRST_CLIENT_NODE_ID
    from conftest import LateReplyGrid

    raw = {**exact(**{"fedspectral-plus.rounds": 3, "fedspectral-plus.noise-multiplier": 2.0}),
           "strategy": "fedspectral-plus", "dataset": "sbm", "num-clients": 2, "retries": 1, "timeout": 0.5,
           "reference": False, "out-dir": str(out_dir)}
    node = FIRST_CLIENT_NODE_ID + 1
    grid = LateReplyGrid(build_client_app(raw), 2, record=True, node=node, action="fedspectral_product")
    result = run_server(grid, raw)
    asked = [m for m in grid.pushed if m.metadata.message_type == "query.fedspectral_product"]
    assert len(grid.late) == 1 and [m.metadata.dst_node_id for m in asked].count(node) == result["metrics"][
        "protocol_rounds"] + 1  # the first product asked twice
    answered = next(unpack(r.content)[0]["block"] for r in grid.pulled
                    if r.metadata.message_type == "query.fedspectral_product" and r.metadata.src_node_id == node)
    # the server holds the late draw's twin, not a second draw to average with it
    assert np.array_equal(answered, unpack(grid.late[0].content)[0]["block"])
    mech = {m["name"]: m for m in result["privacy"]["mechanisms"]}["gaussian:fedspectral-plus"]
    assert mech["params"]["releases"] == result["metrics"]["protocol_rounds"] + 1  # + the degree vector


@pytest.mark.parametrize("mode, action", [("paper", "fedspectral_power"), ("exact", "fedspectral_product")])
def test_a_block_beyond_any_honest_value_stops_the_run_naming_the_client(out_dir, monkeypatch, mode, action):
    from clients.fedspectral import FedSpectralPlusClient

    patch_reply(monkeypatch, FedSpectralPlusClient, action,
                lambda shard, out, vals: ({"block": out["block"] + 1e6}, vals), client=1)
    with pytest.raises(ProtocolError, match=rf"step '{action}': client 1 \(node \d+\) sent a block entry "
                                            r"[\d.e+]+, above [\d.e+]+, the largest an honest block"):
        run_experiment("fedspectral-plus", "sbm", 2, {**SBM, "num-clusters": K, "fedspectral-plus.mode": mode,
                                                       "fedspectral-plus.rounds": 2}, out_dir)


def test_degree_shares_survive_a_coarse_secagg_scale(out_dir):
    """Each client's degree is a sum of 1/r shares: summed at secagg.scale = 1 they would round to 0 or 1;
    the degree sum uses the finest scale its ring holds instead, and exact mode stays exact."""
    result = run_experiment("fedspectral-plus", "karate", 3, {"fedspectral-plus.mode": "exact",
                                                              "partition.replicas": 3, "secagg.scale": 1.0}, out_dir)
    assert result["metrics"]["converged"] and result["reference"]["agreement"]["ari"] == 1.0


def test_gaussian_noise_is_accounted_per_edge(tmp_path):
    over = exact(**{"fedspectral-plus.rounds": 30, "fedspectral-plus.noise-multiplier": 2.0})
    res = run_experiment("fedspectral-plus", "sbm", 2, over, tmp_path / "a")
    mech = {m["name"]: m for m in res["privacy"]["mechanisms"]}["gaussian:fedspectral-plus"]
    releases = mech["params"]["releases"]
    assert releases == res["metrics"]["protocol_rounds"] + 1  # + the degree vector
    eps = res["privacy"]["epsilon"]
    assert eps is not None and 0 < eps < float("inf") and res["privacy"]["delta"] == pytest.approx(1e-5)
    ups = [u for u in res["privacy"]["uploads"] if u["name"] in ("block", "degrees")]
    assert ups and all(u["noised"] for u in ups)
    # the noised degree vector is one of the Gaussian releases: not listed as uncovered
    assert "not covered" not in res["privacy"]["overall_note"]
    ref = GaussianMechanism(1.0, 2.0, delta=1e-5, adjacency="remove")
    ref.step(releases)
    assert eps == pytest.approx(ref.epsilon(), rel=1e-9)  # RDP composition over every release
    stronger = GaussianMechanism(1.0, 8.0, delta=1e-5, adjacency="remove")
    stronger.step(releases)
    assert stronger.epsilon() < eps
    assert res["metrics"]["solver"] == "chebyshev"  # auto under noise
    krylov = run_experiment("fedspectral-plus", "sbm", 2, {**over, "fedspectral-plus.solver": "krylov"}, tmp_path / "k")
    mech = {m["name"]: m for m in krylov["privacy"]["mechanisms"]}["gaussian:fedspectral-plus"]
    assert krylov["metrics"]["solver"] == "krylov" and krylov["metrics"]["stop"] in ("stagnated", "max-rounds")
    assert mech["params"]["releases"] == krylov["metrics"]["protocol_rounds"] + 1
    ref = GaussianMechanism(1.0, 2.0, delta=1e-5, adjacency="remove")
    ref.step(mech["params"]["releases"])
    assert krylov["privacy"]["epsilon"] == pytest.approx(ref.epsilon(), rel=1e-9)
    plain = run_experiment("fedspectral-plus", "sbm", 2, paper(**{"fedspectral-plus.rounds": 3,
                                                                  "fedspectral-plus.noise-multiplier": 2.0}),
                           tmp_path / "c")
    mech = {m["name"]: m for m in plain["privacy"]["mechanisms"]}["gaussian:fedspectral-plus"]
    assert mech["params"]["releases"] == 3  # one per round, no degree release in paper mode
    # paper-mode sensitivity: 4 * iters * ||V||_2 * sqrt(clients), V scaled to max |entry| 1
    assert mech["params"]["max_sensitivity"] > 4 * 6 * np.sqrt(2)


# --------------------------------------------------------------------------- Flower simulation engine


def test_paper_mode_continues_without_a_dropped_client_and_exact_mode_stops(out_dir, tmp_path):
    base = {"strategy": "fedspectral-plus", "dataset": "sbm", "num-clients": 3, "partitioner": "edge",
            "partition.overlap": 0.67, "fedspectral-plus.mode": "paper", "fedspectral-plus.rounds": 4,
            "fedspectral-plus.iters": 2, "min-clients": 2, "timeout": 30.0}
    raw = {**base, "out-dir": str(out_dir)}
    result = run_server(LeavingGrid(build_client_app(raw), 3, leave_at=3, action="fedspectral_power"), raw)
    assert [d["client"] for d in result["communication"]["dropped"]] == [2]
    assert len(result["history"]) == 4 and result["metrics"]["ari"] > 0.5
    raw = {**base, "fedspectral-plus.mode": "exact", "out-dir": str(tmp_path / "exact")}
    grid = LeavingGrid(build_client_app(raw), 3, leave_at=1, action="fedspectral_product")
    with pytest.raises(ProtocolError, match="step 'fedspectral_product' rejected 1 client.*client 2 "):
        run_server(grid, raw)
    assert not (tmp_path / "exact" / "result.json").exists()
