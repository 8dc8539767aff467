"""Regularised spectral clustering (tau/N on every entry of A, tau on every degree): the centralised
function, the federated exact operator and its auto switch, paper mode's local operator."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.linalg as sla

from fedgraphcore.clustering import components_with_edges, regularisation, spectral_embedding, spectral_graph
from fedgraphcore.config import ConfigError
from fedgraphcore.data import load_dataset
from fedgraphcore.metrics import ari
from fedgraphcore.protocols.fedspectral import block_iteration, plus
from app.registry import validate
from app.run import run_experiment

#: four blocks of 75 nodes too sparse to hold together: dozens of components with an edge, for k = 4
FRAGMENTED = {"sbm.nodes": 300, "sbm.blocks": 4, "sbm.p-in": 0.012, "sbm.p-out": 0.0005, "sbm.features": 0}
CONNECTED = {"sbm.nodes": 300, "sbm.blocks": 4, "sbm.p-in": 0.12, "sbm.p-out": 0.01, "sbm.features": 0}


def graph(params: dict, seed: int = 0):
    return load_dataset("sbm", seed=seed, **{k.split(".", 1)[1].replace("-", "_"): v for k, v in params.items()})


def dense_regularised(adj, tau: float) -> np.ndarray:
    a = adj.toarray()
    n = a.shape[0]
    inv = 1.0 / np.sqrt(a.sum(axis=1) + tau)
    return inv[:, None] * (a + tau / n) * inv[None, :]


def test_regularisation_is_on_where_components_outnumber_clusters_at_the_average_degree():
    fragmented, connected = graph(FRAGMENTED), graph(CONNECTED)
    assert components_with_edges(fragmented.adj) > 4 >= components_with_edges(connected.adj)
    average = float(fragmented.adj.sum()) / fragmented.num_nodes
    assert regularisation(fragmented.adj, 4, "auto") == pytest.approx(average)
    assert regularisation(connected.adj, 4, "auto") == 0.0
    assert regularisation(connected.adj, 4, "on", tau=2.5) == 2.5
    assert regularisation(fragmented.adj, 4, "off") == 0.0
    # an isolated node is no component with an edge
    path = sp.csr_matrix(np.array([[0, 1, 0], [1, 0, 0], [0, 0, 0]], dtype=float))
    assert components_with_edges(path) == 1
    with pytest.raises(ValueError, match="invalid regularise='sometimes'; valid choices: auto, on, off"):
        regularisation(path, 1, "sometimes")


def same_rows_up_to_rotation(u: np.ndarray, v: np.ndarray) -> bool:
    """Whether unit-row embeddings ``u`` and ``v`` are one another's rows in another orthonormal basis."""
    rotation = np.linalg.lstsq(v, u, rcond=None)[0]
    return np.abs(v @ rotation - u).max() < 1e-6 and np.allclose(rotation.T @ rotation, np.eye(u.shape[1]), atol=1e-6)


@pytest.mark.parametrize("nodes", [300, 1050])  # the dense solver, and eigsh on the implicit operator
def test_regularised_embedding_spans_the_top_eigenvectors_of_the_dense_regularised_matrix(nodes):
    data = graph({**FRAGMENTED, "sbm.nodes": nodes, "sbm.p-in": 3.6 / nodes})
    tau = regularisation(data.adj, 4, "on")
    u, connected = spectral_embedding(data.adj, 4, seed=0, tau=tau)
    assert connected.all()  # every node has degree d + tau > 0
    _, top = sla.eigsh(dense_regularised(data.adj, tau), k=4, which="LA", tol=1e-12)
    assert same_rows_up_to_rotation(u, top / np.linalg.norm(top, axis=1, keepdims=True))


def test_regularised_labels_do_not_depend_on_the_solvers_start():
    """More components than clusters: unregularised, the top-k eigenvectors are any basis of a larger
    eigenspace; regularised, one eigenspace, the same labels at every seed's start vector."""
    data = graph({**FRAGMENTED, "sbm.nodes": 1200, "sbm.p-in": 3.6 / 1200})
    tau = regularisation(data.adj, 4, "auto")
    u0, _ = spectral_embedding(data.adj, 4, seed=0, tau=tau)
    u1, _ = spectral_embedding(data.adj, 4, seed=1, tau=tau)
    assert same_rows_up_to_rotation(u0, u1)
    w0, _ = spectral_embedding(data.adj, 4, seed=0)
    w1, _ = spectral_embedding(data.adj, 4, seed=1)
    assert not same_rows_up_to_rotation(w0, w1)  # unregularised: another basis of a larger eigenspace


def test_the_servers_rank_one_term_gives_the_regularised_product():
    data = graph(FRAGMENTED)
    tau, n = 2.0, data.num_nodes
    y = np.random.default_rng(0).standard_normal((n, 3))
    expected = (data.adj.toarray() + tau / n) @ y
    assert np.allclose(plus.regularised_sum(data.adj @ y, y, tau), expected)
    assert np.array_equal(plus.regularised_sum(data.adj @ y, y, 0.0), data.adj @ y)


def test_paper_mode_regularises_each_clients_own_graph_and_needs_a_fixed_tau_under_noise():
    data = graph(FRAGMENTED)
    local = regularisation(data.adj, 4, "auto")
    assert local > 0 and plus.paper_tau(data.adj, 4, "auto", 0.0, noised=False) == pytest.approx(local)
    assert plus.paper_tau(data.adj, 4, "auto", 0.0, noised=True) == 0.0
    assert plus.paper_tau(data.adj, 4, "on", 1.5, noised=True) == 1.5
    x = np.random.default_rng(1).standard_normal((data.num_nodes, 2))
    assert np.allclose(plus.local_normalised_operator(data.adj, 1.5) @ x, dense_regularised(data.adj, 1.5) @ x)
    with pytest.raises(ConfigError, match="regularise=on in paper mode under noise needs fedspectral-plus.tau > 0"):
        validate({"strategy": "fedspectral-plus", "fedspectral-plus.mode": "paper",
                  "fedspectral-plus.noise-multiplier": 1.0, "fedspectral-plus.regularise": "on"})


@pytest.mark.parametrize("partitioner", ["edge", "node-random"])
def test_federated_auto_regularises_a_fragmented_graph_and_reaches_the_centralised_labels(tmp_path, partitioner):
    over = {**FRAGMENTED, "num-clusters": 4, "partitioner": partitioner, "secagg.scale": 2.0**32}
    result = run_experiment("fedspectral-plus", "sbm", 3, over, tmp_path)
    metrics = result["metrics"]
    assert metrics["regularised"] and metrics["tau"] == pytest.approx(regularisation(graph(FRAGMENTED).adj, 4, "on"))
    assert result["reference"]["agreement"]["ari"] == 1.0
    assert "regularised (tau = the average degree) where the graph" in result["reference"]["method"]


def test_federated_auto_leaves_a_connected_graph_unregularised(tmp_path):
    result = run_experiment("fedspectral-plus", "sbm", 2, {**CONNECTED, "num-clusters": 4}, tmp_path)
    assert not result["metrics"]["regularised"] and result["metrics"]["tau"] == 0.0
    assert result["reference"]["agreement"]["ari"] == 1.0


def test_fedspectral_baseline_regularises_each_clients_graph_like_its_reference(tmp_path):
    """One client holds the whole graph: its local regularised labels are the centralised ones."""
    result = run_experiment("fedspectral", "sbm", 1, {**FRAGMENTED, "num-clusters": 4}, tmp_path)
    assert result["reference"]["agreement"]["ari"] == 1.0
    adj, labels = graph(FRAGMENTED).adj, np.load(tmp_path / "labels.npy")
    tau = regularisation(adj, 4, "auto")
    assert tau > 0 and ari(labels, spectral_graph(adj, 4, 0, tau=tau)) == 1.0 > ari(labels, spectral_graph(adj, 4, 0))


def test_auto_with_as_many_clusters_as_nodes_asks_for_no_extra_eigenvector(tmp_path):
    """k = N leaves no (k+1)-th eigenvalue to test: the run stays unregularised instead of asking for N+1 vectors."""
    result = run_experiment("fedspectral-plus", "karate", 2, {"num-clusters": 34, "reference": False}, tmp_path)
    assert not result["metrics"]["regularised"] and result["metrics"]["tau"] == 0.0
    assert np.load(tmp_path / "labels.npy").shape == (34,)


def test_auto_does_not_take_an_unconverged_solve_for_extra_components(tmp_path):
    """A connected graph with four tight communities, k = 2 and a round budget the solver cannot converge
    in: the (k+1)-th Ritz value is near 1 but no component is extra, so the run stays unregularised
    like its reference (the solver's unconverged error says nothing about an eigenvalue being 1)."""
    tight = {"sbm.nodes": 300, "sbm.blocks": 4, "sbm.p-in": 0.2, "sbm.p-out": 0.001, "sbm.features": 0}
    assert components_with_edges(graph(tight).adj) == 1
    over = {**tight, "num-clusters": 2, "fedspectral-plus.mode": "exact", "fedspectral-plus.solver": "chebyshev",
            "fedspectral-plus.rounds": 10, "fedspectral-plus.tol": 0.0}
    result = run_experiment("fedspectral-plus", "sbm", 2, over, tmp_path)
    assert result["metrics"]["stop"] == "max-rounds" and not result["metrics"]["converged"]
    assert not result["metrics"]["regularised"] and result["metrics"]["tau"] == 0.0


@pytest.mark.parametrize("data, components", [(FRAGMENTED, True), (CONNECTED, False)])
def test_the_detection_solve_stops_once_the_top_k_converge_below_a_bounded_kth_plus_one(data, components):
    """k + 1 components: a (k+1)-th Ritz value at 1 settles it. Connected: the top k converge and the (k+1)-th
    eigenvalue is bounded below 1 by its residual before its own pair converges."""
    g, tol = graph(data), 1e-8
    m = plus.local_normalised_operator(g.adj)
    result = block_iteration.block_krylov_iteration(
        lambda x: m @ x, g.num_nodes, 5, 10, tol, 500, seed=0,
        settled=lambda theta, norms: plus.more_components_than(theta, 4, None)
        or plus.at_most_components(theta, norms, 4, tol))
    assert result.stop == "settled"
    assert plus.more_components_than(result.values, 4, None) is components
    assert (components_with_edges(g.adj) > 4) is components
    if not components:  # the top k are the eigenvalues, the (k+1)-th pair had not converged yet
        exact = np.sort(sla.eigsh(m, k=5, which="LA", tol=1e-12)[0])[::-1]
        assert np.allclose(result.values[:4], exact[:4], atol=1e-6) and exact[4] < 1 - plus.DEGENERATE
        assert result.history[-1]["residual"] > tol
    assert plus.at_most_components(np.array([1.0, 0.9, 0.5]), np.array([0.0, 1e-9, 0.6]), 2, 1e-8) is False
    assert plus.at_most_components(np.array([1.0, 0.9, 0.5]), np.array([0.0, 1e-7, 0.1]), 2, 1e-8) is False
    assert plus.at_most_components(np.array([1.0, 0.9, 0.5]), np.array([0.0, 1e-9, 0.1]), 2, 1e-8) is True
    assert plus.more_components_than(np.array([1.0, 1.0, 0.9]), 2, 1e-3) is False
    assert plus.more_components_than(np.array([1.0, 1.0, 0.9995]), 2, 1e-3) is True
