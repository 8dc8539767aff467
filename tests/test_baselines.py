"""fedgraphcore.clustering / fedgraphcore.graph_filters / fedgraphcore.models: k-means, spectral clustering, AGC, DMoN."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from fedgraphcore import clustering, graph_filters, models
from fedgraphcore import metrics as M

SHARED = Path(__file__).resolve().parents[2] / "shared" / "datasets"


# ---------------------------------------------------------------------------
# fixtures / helpers
# ---------------------------------------------------------------------------
def planted_partition(n=400, k=4, p_in=0.08, p_out=0.005, seed=0, feat_noise=1.0, f=20):
    """Symmetric SBM without self-loops, plus noisy block-indicator features."""
    rng = np.random.default_rng(seed)
    y = np.repeat(np.arange(k), n // k)
    n = y.shape[0]
    prob = np.where(y[:, None] == y[None, :], p_in, p_out)
    upper = np.triu(rng.random((n, n)) < prob, 1)
    A = sp.csr_matrix((upper | upper.T).astype(np.float64))
    centers = rng.normal(0, 1.0, (k, f))
    x = centers[y] + feat_noise * rng.normal(0, 1.0, (n, f))
    return A, x, y


def dense_filter(A, order, kind="agc"):
    """``G^order``: AGC's ``(I + A_hat) / 2`` as its code writes it, or the spectral-norm filter from the
    eigendecomposition of the self-looped normalised Laplacian (response ``(1 - lambda / lambda_max)^order``)."""
    A = A.toarray() + np.eye(A.shape[0])
    d = A.sum(1)
    A_hat = A / np.sqrt(np.outer(d, d))
    if kind == "agc":
        return np.linalg.matrix_power((np.eye(A.shape[0]) + A_hat) / 2, order)
    lam, Q = np.linalg.eigh(np.eye(A.shape[0]) - A_hat)
    return (Q * (1.0 - lam / lam.max()) ** order) @ Q.T


def _blobs(seed=0, n=300, k=3):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, k, n)
    X = rng.normal(0, 0.3, (n, 2)) + np.array([[0, 0], [5, 5], [-5, 5]])[y]
    return X, y


# ---------------------------------------------------------------------------
# k-means
# ---------------------------------------------------------------------------
def test_kmeans_recovers_blobs_and_is_deterministic():
    X, y = _blobs()
    a = clustering.kmeans(X, 3, seed=0)
    assert a.dtype == np.int64 and M.ari(y, a) == 1.0
    assert np.array_equal(a, clustering.kmeans(X, 3, seed=0))
    labels, centers = clustering.kmeans(X, 3, seed=1, return_centers=True)
    assert centers.shape == (3, 2) and M.ari(y, labels) == 1.0


def test_kmeans_weights_equal_duplicated_rows():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(40, 3))
    w = rng.integers(1, 4, 40)
    init = X[:4]
    lw, cw = clustering.kmeans(X, 4, 0, init=init, sample_weight=w, return_centers=True)
    Xd = np.repeat(X, w, axis=0)
    ld, cd = clustering.kmeans(Xd, 4, 0, init=init, return_centers=True)
    assert np.allclose(cw, cd)
    assert np.array_equal(np.repeat(lw, w), ld)


def test_auto_restarts_grow_with_rows_and_clusters_within_a_work_budget(monkeypatch):
    from sklearn.cluster import KMeans

    assert clustering.auto_restarts(34, 2) == 10  # small problems keep scikit-learn's 10
    assert clustering.auto_restarts(2708, 7) == 380  # Cora's embedding: one start per 50 rows x clusters
    assert clustering.auto_restarts(19717, 3) == 10_000_000 // (19717 * 3)  # the work budget binds
    assert clustering.auto_restarts(10**6, 10) == 10  # a million rows: no more than 10
    asked = []
    monkeypatch.setattr(clustering, "auto_restarts", lambda n, k: asked.append((n, k)) or 24)
    X = np.random.default_rng(2).normal(size=(60, 3))
    labels = clustering.kmeans(X, 4, 5, n_init=0)
    assert asked == [(60, 4)]
    assert np.array_equal(labels, KMeans(4, n_init=24, random_state=5).fit_predict(X))


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: clustering.kmeans(np.zeros((5, 2)), 2, 0, n_init=-1), "n_init=-1"),
        (lambda: clustering.kmeans(np.zeros((5, 2)), 0, 0), "k=0"),
        (lambda: clustering.kmeans(np.zeros((5, 2)), 6, 0), "k=6"),
        (lambda: clustering.kmeans(np.zeros((5, 2)), 2, -1), "seed"),
        (lambda: clustering.kmeans(np.zeros((5, 2)), 2, 0, sample_weight=np.ones(4)), "length mismatch"),
        (lambda: clustering.kmeans(np.zeros((5, 2)), 2, 0, init=np.zeros((3, 2))), "init"),
        (lambda: clustering.spectral_graph(sp.csr_matrix((4, 3)), 2, 0), "square"),
        (lambda: graph_filters.low_pass_filter(np.zeros((4, 2)), sp.eye(5), 2), "length mismatch"),
        (lambda: graph_filters.low_pass_filter(np.zeros((5, 2)), sp.eye(5), -1), "order"),
        (lambda: graph_filters.low_pass_filter(np.zeros((5, 2)), sp.eye(5), 2, "heat"),
         "unknown graph filter 'heat'; valid choices: agc, spectral-norm"),
        (lambda: graph_filters.agc(np.zeros((5, 2)), sp.eye(5), 0, 0, order=2), "k=0"),
        (lambda: graph_filters.agc(None, sp.eye(5), 2, 0, order=2), "features"),
        (lambda: models.train_dmon(None, sp.eye(5), 0, 0, epochs=1), "k=0"),
    ],
)
def test_bad_inputs_raise_one_line_value_errors(call, match):
    with pytest.raises(ValueError, match=match) as exc:
        call()
    assert "\n" not in str(exc.value)


# ---------------------------------------------------------------------------
# spectral clustering
# ---------------------------------------------------------------------------
def test_spectral_graph_two_cliques():
    A = np.zeros((10, 10))
    A[:5, :5] = 1
    A[5:, 5:] = 1
    np.fill_diagonal(A, 0)
    A[4, 5] = A[5, 4] = 1
    labels = clustering.spectral_graph(sp.csr_matrix(A), 2, seed=0)
    assert M.ari([0] * 5 + [1] * 5, labels) == 1.0


def test_spectral_graph_sbm_uses_sparse_solver():
    A, _, y = planted_partition(n=1600, k=4, p_in=0.02, p_out=0.001, seed=2)
    assert A.shape[0] > clustering._DENSE_EIG_MAX_N  # exercises eigsh
    labels = clustering.spectral_graph(A, 4, seed=0)
    assert M.ari(y, labels) > 0.9
    # the sparse embedding spans the same subspace as a dense eigendecomposition
    U, connected = clustering.spectral_embedding(A, 4, 0)
    d = np.asarray(A.sum(1)).ravel()
    inv = np.where(d > 0, 1 / np.sqrt(np.maximum(d, 1e-300)), 0.0)
    Mx = (A.multiply(np.outer(inv, inv))).toarray()
    V = np.linalg.eigh(Mx)[1][:, -4:][connected]
    Vn = V / np.linalg.norm(V, axis=1, keepdims=True)
    # row-normalised embeddings agree up to an orthogonal rotation
    R, *_ = np.linalg.lstsq(Vn, U[connected], rcond=None)
    assert np.abs(Vn @ R - U[connected]).max() < 1e-5
    assert np.all(U[~connected] == 0)


def test_spectral_graph_disconnected_and_isolated_nodes():
    A = np.zeros((12, 12))
    A[:4, :4] = 1
    A[4:8, 4:8] = 1
    A[8:10, 8:10] = 1  # a pair
    np.fill_diagonal(A, 0)  # nodes 10, 11 isolated
    labels = clustering.spectral_graph(sp.csr_matrix(A), 3, seed=0)
    assert labels.shape == (12,)
    assert M.ari([0] * 4 + [1] * 4 + [2] * 2, labels[:10]) == 1.0
    assert labels[10] == labels[11]  # isolated nodes all go to one cluster
    # more components than clusters, and no edges at all
    assert clustering.spectral_graph(sp.csr_matrix(A), 2, seed=0).shape == (12,)
    assert np.all(clustering.spectral_graph(sp.csr_matrix((5, 5)), 2, seed=0) == 0)


def test_spectral_affinity_dense_and_sparse_agree():
    X, y = _blobs(n=150)
    D2 = ((X[:, None, :] - X[None, :, :]) ** 2).sum(-1)
    K = np.exp(-D2 / (2 * np.mean(np.sqrt(D2)) ** 2 / 4))
    np.fill_diagonal(K, 0)
    a = clustering.spectral_affinity(K, 3, seed=0)
    b = clustering.spectral_affinity(sp.csr_matrix(K), 3, seed=0)
    assert M.ari(y, a) == 1.0 and M.ari(a, b) == 1.0


# ---------------------------------------------------------------------------
# AGC
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("kind", graph_filters.FILTERS)
@pytest.mark.parametrize("order", [0, 1, 3])
def test_low_pass_filter_matches_dense_formula(order, kind):
    A, x, _ = planted_partition(n=60, k=3, seed=1)
    out = graph_filters.low_pass_filter(x, A, order, kind)
    assert np.allclose(out, dense_filter(A, order, kind) @ x)
    assert np.allclose(graph_filters.low_pass_filter(sp.csr_matrix(x), A, order, kind), out)


def path_graph(n):
    return sp.csr_matrix(sp.diags([np.ones(n - 1), np.ones(n - 1)], [-1, 1]))


@pytest.mark.parametrize("graph", ["planted", "path"])
def test_spectral_norm_filter_zeroes_the_top_frequency(graph):
    """G = I - L_s / ||L_s|| has eigenvalues in [0, 1], the smallest exactly 0, on graphs large enough for
    the Lanczos norm (n > 64), including an even path, whose top eigenvector is orthogonal to the
    all-ones vector (a constant Lanczos start then finds the second-largest eigenvalue)."""
    A = planted_partition(n=200, k=4, seed=2)[0] if graph == "planted" else path_graph(100)
    eig = np.linalg.eigvalsh(graph_filters.agc_filter_matrix(A, "spectral-norm").toarray())
    assert abs(eig.min()) < 1e-9 and abs(eig.max() - 1.0) < 1e-9


@pytest.mark.parametrize("n", [5, 100])
def test_spectral_norm_filter_without_edges_is_the_identity(n):
    assert np.allclose(graph_filters.agc_filter_matrix(sp.csr_matrix((n, n)), "spectral-norm").toarray(), np.eye(n))


def test_agc_embedding_matches_dense_svd():
    A, x, _ = planted_partition(n=500, k=5, seed=3, f=60)
    F = dense_filter(A, 4) @ x
    U_dense = np.linalg.svd(F, full_matrices=False)[0][:, :5]
    U = graph_filters.agc_embedding(x, A, 5, 4, seed=0)
    assert np.allclose(U.T @ U, np.eye(5), atol=1e-10)
    # same subspace: projecting the dense vectors onto ours loses nothing
    assert np.linalg.norm(U_dense - U @ (U.T @ U_dense)) < 1e-6


def test_agc_intra_distance_matches_pairwise_loop():
    rng = np.random.default_rng(0)
    F = rng.normal(size=(30, 4))
    labels = rng.integers(0, 3, 30) + 5
    ref = 0.0
    cl = np.unique(labels)
    for c in cl:
        P = F[labels == c]
        ref += ((P[:, None, :] - P[None, :, :]) ** 2).sum() / len(P) ** 2
    assert graph_filters.agc_intra_distance(F, labels) == pytest.approx(ref / len(cl))


def test_agc_fixed_and_adaptive_on_sbm():
    A, x, y = planted_partition(n=400, k=4, seed=4, feat_noise=4.0)
    labels, order = graph_filters.agc(x, A, 4, seed=0, order=5)
    assert order == 5 and labels.shape == (400,) and M.accuracy(y, labels) > 0.9
    labels2, order2 = graph_filters.agc(x, A, 4, seed=0, max_order=6)
    assert 1 <= order2 <= 6 and M.accuracy(y, labels2) > 0.9
    assert np.array_equal(labels2, graph_filters.agc(x, A, 4, seed=0, max_order=6)[0])  # deterministic


def test_agc_with_fewer_feature_columns_than_clusters_keeps_every_singular_vector():
    """A narrow vertical block (iris over 2 parties: 2 columns, 3 classes) has fewer singular vectors
    than clusters: AGC clusters the whole column space."""
    A, x, y = planted_partition(n=300, k=3, seed=1, feat_noise=1.0)
    narrow = x[:, :2]
    for order in (3, None):
        labels, _ = graph_filters.agc(narrow, A, 3, seed=0, order=order, max_order=4)
        assert sorted(np.unique(labels)) == [0, 1, 2]
        # two singular vectors of a two-column matrix span its columns: the same clustering as U of X itself
        full = clustering.kmeans(np.linalg.svd(graph_filters.low_pass_filter(narrow, A, 3), full_matrices=False)[0], 3, 0)
        if order == 3:
            assert M.ari(labels, full) == 1.0
    with pytest.raises(ValueError, match=r"need k <= number of samples \(300\)"):
        graph_filters.agc(narrow, A, 301, seed=0, order=3)


def _load_planetoid(name: str, tmp: Path):
    tg = pytest.importorskip("torch_geometric.datasets")
    src = SHARED / "planetoid" / name
    if not src.exists():
        pytest.skip(f"dataset {src} not found (needs ../shared/datasets)")
    dst = tmp / "planetoid"
    shutil.copytree(SHARED / "planetoid", dst)
    d = tg.Planetoid(str(dst), name)[0]
    n = d.num_nodes
    ei = d.edge_index.numpy()
    A = sp.csr_matrix((np.ones(ei.shape[1]), (ei[0], ei[1])), shape=(n, n))
    A = ((A + A.T) > 0).astype(np.float64).tocsr()
    A.setdiag(0)
    A.eliminate_zeros()
    return sp.csr_matrix(d.x.numpy().astype(np.float64)), A, d.y.numpy()


@pytest.fixture(scope="module")
def cora(tmp_path_factory):
    return _load_planetoid("Cora", tmp_path_factory.mktemp("cora"))


def test_agc_cora_accuracy(cora):
    """kCAGC paper's fixed psi = 9: ACC 68.1 measured with a dense SVD here (paper 68.17);
    its time is measured by benchmarks/agc.py."""
    x, A, y = cora
    labels, order = graph_filters.agc(x, A, 7, seed=0, order=9)
    acc = M.accuracy(y, labels)
    assert order == 9
    assert 0.675 <= acc <= 0.69, f"Cora AGC ACC {acc:.4f}, expected 68.1 +- 0.6"
    assert M.nmi(y, labels) > 0.5


# ---------------------------------------------------------------------------
# DMoN
# ---------------------------------------------------------------------------
def _dense_dmon_loss(S, A, lam):
    """Direct dense computation of the DMoN paper's loss."""
    d = A.sum(1)
    two_m = d.sum()
    n, k = S.shape
    B_mod = A - np.outer(d, d) / two_m
    spectral = -np.trace(S.T @ B_mod @ S) / two_m
    collapse = np.sqrt(k) / n * np.linalg.norm(S.sum(0)) - 1
    return spectral + lam * collapse, spectral, collapse


@pytest.mark.parametrize("weighted", [False, True])
def test_dmon_loss_equals_dense_computation(weighted):
    torch = pytest.importorskip("torch")
    from fedgraphcore.models import adj_to_edge_index, dmon_loss

    rng = np.random.default_rng(0)
    A, _, _ = planted_partition(n=80, k=4, seed=5)
    if weighted:
        A = sp.triu(A, 1)
        A.data = rng.uniform(0.5, 2, A.nnz)
        A = sp.csr_matrix(A + A.T)
    S = torch.softmax(torch.tensor(rng.normal(size=(80, 5))), dim=1)
    ei, ew = adj_to_edge_index(A, dtype=torch.float64)
    total, spec, coll = dmon_loss(S, ei, ew, collapse_regularization=0.7, return_terms=True)
    ref = _dense_dmon_loss(S.numpy(), A.toarray(), 0.7)
    assert float(total) == pytest.approx(ref[0], abs=1e-10)
    assert float(spec) == pytest.approx(ref[1], abs=1e-10)
    assert float(coll) == pytest.approx(ref[2], abs=1e-10)


def test_dmon_loss_matches_pyg_dmon_pooling():
    torch = pytest.importorskip("torch")
    from torch_geometric.nn import DMoNPooling

    from fedgraphcore.models import adj_to_edge_index, dmon_loss

    A, x, _ = planted_partition(n=60, k=3, seed=6, f=8)
    torch.manual_seed(0)
    pool = DMoNPooling(8, 3)
    xt = torch.tensor(x, dtype=torch.float32)
    s, _, _, spectral, _, cluster = pool(xt.unsqueeze(0), torch.tensor(A.toarray(), dtype=torch.float32).unsqueeze(0))
    ei, ew = adj_to_edge_index(A)
    total = dmon_loss(s[0], ei, ew, collapse_regularization=1.0)
    assert float(total.detach()) == pytest.approx(float((spectral + cluster).detach()), abs=1e-5)


def test_dmon_model_and_training():
    torch = pytest.importorskip("torch")
    from fedgraphcore.models import DMoNModel

    A, x, y = planted_partition(n=200, k=4, p_in=0.15, p_out=0.005, seed=7, feat_noise=2.0)
    model = DMoNModel(20, 4)
    assert model.conv.out_channels == 64 and model.head.out_features == 4
    labels, model = models.train_dmon(x, A, 4, seed=0, epochs=150, lr=1e-2)
    assert labels.shape == (200,) and labels.dtype == np.int64
    hist = model.loss_history
    assert len(hist) == 150 and hist[-1] < hist[0]
    assert M.modularity(A, labels) > 0.5
    labels2, _ = models.train_dmon(x, A, 4, seed=0, epochs=150, lr=1e-2)
    assert np.array_equal(labels, labels2)  # seeded
    # the reference exports the model and the loss for the federated strategy
    assert models.DMoNModel is DMoNModel and callable(models.dmon_loss)
    s = model(torch.tensor(x, dtype=torch.float32), *models.adj_to_edge_index(A))
    assert torch.allclose(s.sum(1), torch.ones(200))


def test_agc_adaptive_rule_stops_at_first_increase(monkeypatch):
    """Adaptive order: keep the psi before the first rise of the intra-cluster distance."""
    A, x, _ = planted_partition(n=120, k=3, seed=8)
    seq = iter([5.0, 4.0, 3.0, 3.5, 1.0, 0.5])
    seen = []

    def fake_intra(F, labels):
        seen.append(labels.copy())
        return next(seq)

    monkeypatch.setattr(graph_filters, "agc_intra_distance", fake_intra)
    labels, order = graph_filters.agc(x, A, 3, seed=0)
    assert order == 3 and len(seen) == 4
    assert np.array_equal(labels, seen[2])  # the clustering of psi = 3
