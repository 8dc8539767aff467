"""fedgraphcore.metrics: hand-computed cases, scikit-learn / networkx agreement, invariances."""

from __future__ import annotations

import itertools

import networkx as nx
import numpy as np
import pytest
import scipy.sparse as sp
from sklearn import metrics as skm

from fedgraphcore import metrics as M


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------
def _random_labels(rng, n, k, offset=0, scale=1):
    return (rng.integers(0, k, n) + offset) * scale


def _mapped_labels(y_true, y_pred):
    """Labels after the Hungarian map, unmatched clusters renamed outside the classes."""
    mapping = M.hungarian_map(y_true, y_pred)
    fresh = itertools.count(int(np.max(y_true)) + 1)
    extra = {}
    out = []
    for c in y_pred:
        c = int(c)
        if c in mapping:
            out.append(mapping[c])
        else:
            extra.setdefault(c, next(fresh))
            out.append(extra[c])
    return np.array(out)


def _brute_acc(y_true, y_pred):
    """Best accuracy over all injective maps clusters -> classes (small k only)."""
    classes, clusters = np.unique(y_true), np.unique(y_pred)
    best = 0
    for perm in itertools.permutations(list(classes) + [None] * max(0, len(clusters) - len(classes)), len(clusters)):
        m = dict(zip(clusters, perm))
        best = max(best, sum(m[p] == t for t, p in zip(y_true, y_pred)))
    return best / len(y_true)


def _cluster_similarity_loop(reference, candidate):
    """FedSpectral Algorithm 5 verbatim: O(N^2) loop over ordered pairs."""
    n = len(reference)
    mismatch = 0
    for i in range(n):
        for j in range(n):
            if reference[i] == reference[j]:
                if candidate[i] != candidate[j]:
                    mismatch += 1
    return 1 - mismatch / n**2


def _random_graph(rng, n, p, weighted=False):
    A = sp.random(n, n, density=p, random_state=int(rng.integers(1 << 30)), format="csr")
    A.data[:] = rng.uniform(0.5, 2.0, A.nnz) if weighted else 1.0
    A = sp.triu(A, k=1)
    return sp.csr_matrix(A + A.T)


# ---------------------------------------------------------------------------
# hand-computed cases
# ---------------------------------------------------------------------------
def test_accuracy_and_f1_hand_computed():
    y = [0, 0, 0, 1, 1, 1]
    p = [5, 5, 7, 7, 7, 7]  # 5->0 (2 hits), 7->1 (3 hits)
    assert M.accuracy(y, p) == pytest.approx(5 / 6)
    # class 0: tp 2, |class| 3, |cluster 5| 2 -> F1 = 4/5 ; class 1: tp 3, 3, 4 -> 6/7
    assert M.macro_f1(y, p) == pytest.approx((4 / 5 + 6 / 7) / 2)


def test_accuracy_rectangular_tables():
    # more clusters than classes: cluster 9 stays unmatched -> its items are errors
    y = [0, 0, 1, 1, 1]
    p = [3, 3, 4, 4, 9]
    assert M.accuracy(y, p) == pytest.approx(4 / 5)
    assert M.macro_f1(y, p) == pytest.approx((1.0 + 2 * 2 / (3 + 2)) / 2)
    # fewer clusters than classes: class 2 unmatched -> F1_2 = 0
    y = [0, 0, 1, 1, 2, 2]
    p = [1, 1, 0, 0, 0, 0]
    assert M.accuracy(y, p) == pytest.approx(4 / 6)
    assert M.macro_f1(y, p) == pytest.approx((1.0 + 2 * 2 / (2 + 4) + 0.0) / 3)


def test_nmi_ari_hand_computed():
    assert M.nmi([0, 0, 1, 1], [1, 1, 0, 0]) == 1.0
    assert M.ari([0, 0, 1, 1], [1, 1, 0, 0]) == 1.0
    assert M.nmi([0, 0, 0, 0], [0, 1, 2, 3]) == 0.0
    assert M.ari([0, 0, 1, 1], [0, 1, 0, 1]) == pytest.approx(-0.5)
    assert M.nmi([3, 3, 3], [7, 7, 7]) == 1.0  # both constant
    # MI of [0,0,1,1] vs [0,0,0,1]: H(a)=ln2, H(b)=-(3/4 ln 3/4 + 1/4 ln 1/4)
    a, b = [0, 0, 1, 1], [0, 0, 0, 1]
    ha = np.log(2)
    hb = -(0.75 * np.log(0.75) + 0.25 * np.log(0.25))
    mi = 0.5 * np.log(0.5 / (0.5 * 0.75)) + 0.25 * np.log(0.25 / (0.5 * 0.75)) + 0.25 * np.log(0.25 / (0.5 * 0.25))
    assert M.nmi(a, b) == pytest.approx(mi / ((ha + hb) / 2))


def test_cluster_similarity_hand_computed_and_one_sided():
    ref = [0, 0, 1, 1]
    # candidate splits pair (0,1): ordered mismatches (0,1),(1,0) -> 1 - 2/16
    assert M.cluster_similarity(ref, [0, 1, 2, 2]) == pytest.approx(1 - 2 / 16)
    # one giant cluster never splits anything: 100 %, although ARI is 0
    assert M.cluster_similarity(ref, [0, 0, 0, 0]) == 1.0
    assert M.ari(ref, [0, 0, 0, 0]) == 0.0
    # all singletons split every reference pair: 1 - (2*2 + 2*2 - 4)/16 (i==j never mismatches)
    assert M.cluster_similarity(ref, [0, 1, 2, 3]) == pytest.approx(1 - 4 / 16)


def test_pairwise_prf_hand_computed():
    y = [0, 0, 0, 1, 1]  # true pairs: 3 + 1 = 4
    p = [0, 0, 1, 1, 1]  # pred pairs: 1 + 3 = 4 ; together in both: (0,1), (3,4) = 2
    pr, rc, f1 = M.pairwise_prf(y, p)
    assert (pr, rc, f1) == pytest.approx((0.5, 0.5, 0.5))
    assert M.pairwise_prf([0, 1, 2], [0, 1, 2]) == (1.0, 1.0, 1.0)  # no pairs: vacuous
    assert M.pairwise_prf([0, 0, 0], [0, 1, 2]) == (1.0, 0.0, 0.0)


def test_modularity_conductance_hand_computed():
    # two triangles joined by one edge; clusters = triangles
    g = nx.Graph([(0, 1), (1, 2), (0, 2), (3, 4), (4, 5), (3, 5), (2, 3)])
    A = nx.to_scipy_sparse_array(g, nodelist=range(6), format="csr")
    labels = np.array([0, 0, 0, 1, 1, 1])
    # m = 7; each cluster: 3 internal edges, volume 7 -> Q = 2 * (3/7 - (7/14)^2)
    assert M.modularity(A, labels) == pytest.approx(2 * (3 / 7 - 0.25))
    # cut = 1 edge, both directions: 2 / 14
    assert M.conductance(A, labels) == pytest.approx(2 / 14)
    assert M.conductance(A, np.zeros(6, int)) == 0.0


# ---------------------------------------------------------------------------
# agreement with scikit-learn / networkx / brute force on random inputs
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(25))
def test_label_metrics_match_sklearn(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 60))
    y = _random_labels(rng, n, int(rng.integers(1, 6)), offset=-2, scale=3)  # arbitrary ints
    p = _random_labels(rng, n, int(rng.integers(1, 8)), offset=100)
    assert M.ari(y, p) == pytest.approx(skm.adjusted_rand_score(y, p), abs=1e-12)
    assert M.nmi(y, p) == pytest.approx(skm.normalized_mutual_info_score(y, p), abs=1e-12)
    mapped = _mapped_labels(y, p)
    assert M.accuracy(y, p) == pytest.approx(skm.accuracy_score(y, mapped))
    classes = np.unique(y)
    assert M.macro_f1(y, p) == pytest.approx(
        skm.f1_score(y, mapped, labels=classes, average="macro", zero_division=0)
    )


@pytest.mark.parametrize("seed", range(10))
def test_accuracy_is_optimal_over_all_maps(seed):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, 12)
    p = rng.integers(0, int(rng.integers(2, 5)), 12)
    assert M.accuracy(y, p) == pytest.approx(_brute_acc(y, p))


@pytest.mark.parametrize("seed", range(10))
def test_pairwise_prf_matches_pair_confusion(seed):
    rng = np.random.default_rng(seed)
    y, p = rng.integers(0, 4, 40), rng.integers(0, 5, 40)
    (tn, fp), (fn, tp) = skm.cluster.pair_confusion_matrix(y, p)
    pr, rc, f1 = M.pairwise_prf(y, p)
    assert pr == pytest.approx(tp / (tp + fp))
    assert rc == pytest.approx(tp / (tp + fn))
    assert f1 == pytest.approx(2 * tp / (2 * tp + fp + fn))


@pytest.mark.parametrize("seed", range(10))
def test_cluster_similarity_equals_algorithm5_loop(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 70))
    ref = _random_labels(rng, n, int(rng.integers(1, 6)), offset=-1)
    cand = _random_labels(rng, n, int(rng.integers(1, 6)), scale=10)
    assert M.cluster_similarity(ref, cand) == pytest.approx(_cluster_similarity_loop(ref, cand), abs=1e-15)


@pytest.mark.parametrize("seed", range(8))
def test_graph_metrics_match_networkx(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(5, 80))
    A = _random_graph(rng, n, 0.15, weighted=bool(seed % 2))
    labels = rng.integers(0, int(rng.integers(1, 6)), n) * 7 - 3
    g = nx.from_scipy_sparse_array(A)
    if g.number_of_edges() == 0:
        pytest.skip("empty random graph")
    comms = [set(np.flatnonzero(labels == c).tolist()) for c in np.unique(labels)]
    assert M.modularity(A, labels) == pytest.approx(nx.community.modularity(g, comms, weight="weight"), abs=1e-12)
    cut = sum(d["weight"] for u, v, d in g.edges(data=True) if labels[u] != labels[v])
    total = sum(d["weight"] for _, _, d in g.edges(data=True))
    assert M.conductance(A, labels) == pytest.approx(cut / total, abs=1e-12)


def test_directed_modularity_matches_networkx():
    rng = np.random.default_rng(3)
    A = sp.random(40, 40, density=0.1, random_state=3, format="csr")
    A.setdiag(0)
    A.eliminate_zeros()
    A.data[:] = 1.0
    labels = rng.integers(0, 3, 40)
    g = nx.from_scipy_sparse_array(A, create_using=nx.DiGraph)
    comms = [set(np.flatnonzero(labels == c).tolist()) for c in np.unique(labels)]
    assert M.modularity(A, labels) == pytest.approx(nx.community.modularity(g, comms), abs=1e-12)


# ---------------------------------------------------------------------------
# invariances
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(5))
def test_permutation_invariance(seed):
    rng = np.random.default_rng(seed)
    n = 200
    y, p = rng.integers(0, 4, n), rng.integers(0, 5, n)
    A = _random_graph(rng, n, 0.05)
    base = M.evaluate(p, y_true=y, adj=A)
    base.update(M.agreement(y, p))
    base["pf"] = M.pairwise_prf(y, p)
    # renaming clusters changes nothing
    rename = rng.permutation(50)[:5] * 13 - 7
    p2 = rename[p]
    out = M.evaluate(p2, y_true=y, adj=A)
    out.update(M.agreement(y, p2))
    out["pf"] = M.pairwise_prf(y, p2)
    # permuting the nodes (labels and graph together) changes nothing
    perm = rng.permutation(n)
    P = sp.csr_matrix((np.ones(n), (np.arange(n), perm)), shape=(n, n))
    A3 = P @ A @ P.T
    out3 = M.evaluate(p[perm], y_true=y[perm], adj=A3)
    out3.update(M.agreement(y[perm], p[perm]))
    out3["pf"] = M.pairwise_prf(y[perm], p[perm])
    for key in base:
        assert out[key] == pytest.approx(base[key], abs=1e-12), key
        assert out3[key] == pytest.approx(base[key], abs=1e-12), key


# ---------------------------------------------------------------------------
# bundles, types, errors
# ---------------------------------------------------------------------------
def test_evaluate_keys_masking_and_types():
    y = np.array([0, 0, 1, 1, -1, -1])
    p = np.array([1, 1, 0, 0, 0, 1])
    A = sp.csr_matrix(np.ones((6, 6)) - np.eye(6))
    out = M.evaluate(p, y_true=y, adj=A)
    assert set(out) == {"acc", "nmi", "ari", "f1", "modularity", "conductance"}
    assert out["acc"] == 1.0 and out["nmi"] == 1.0  # the -1 nodes are ignored
    assert all(type(v) is float for v in out.values())
    assert set(M.evaluate(p, y_true=y)) == {"acc", "nmi", "ari", "f1"}
    assert set(M.evaluate(p, adj=A)) == {"modularity", "conductance"}
    assert M.evaluate(p, adj=sp.csr_matrix((6, 6))) == {}
    assert M.evaluate(p, y_true=-np.ones(6, int)) == {}
    ag = M.agreement(y, p)
    assert set(ag) == {"ari", "nmi", "cluster_similarity"} and all(type(v) is float for v in ag.values())
    for fn in (M.accuracy, M.macro_f1, M.nmi, M.ari, M.cluster_similarity):
        assert type(fn([0, 1, 1], [1, 0, 0])) is float
    assert all(type(v) is float for v in M.pairwise_prf([0, 1, 1], [1, 0, 0]))
    ref = M.reference_metrics(p, y[::-1].clip(0), y_true=y, adj=A)
    assert set(ref) == {"acc", "nmi", "ari", "f1", "modularity", "conductance", "agreement"}


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: M.accuracy([0, 1], [0, 1, 1]), "length mismatch"),
        (lambda: M.nmi([], []), "empty"),
        (lambda: M.ari([[0, 1]], [[0, 1]]), "1-D"),
        (lambda: M.cluster_similarity([0, 1.5], [0, 1]), "integer"),
        (lambda: M.accuracy(["a", "b"], [0, 1]), "integer"),
        (lambda: M.modularity(sp.csr_matrix((3, 3)), [0, 1, 1]), "no edges"),
        (lambda: M.modularity(sp.csr_matrix(np.ones((3, 3))), [0, 1]), "length mismatch"),
        (lambda: M.conductance(sp.csr_matrix(np.ones((3, 2))), [0, 1, 1]), "square"),
        (lambda: M.evaluate([0, 1], y_true=[0, 1, 1]), "length mismatch"),
    ],
)
def test_bad_inputs_raise_one_line_value_errors(call, match):
    with pytest.raises(ValueError, match=match) as exc:
        call()
    assert "\n" not in str(exc.value)


def test_million_nodes_without_an_n_by_n_matrix():
    """All metrics on a 1,000,000-node graph: vectorised (a dense N x N would need 8 TB);
    the time is measured by benchmarks/metrics_scale.py, not here."""
    rng = np.random.default_rng(0)
    n, k = 1_000_000, 20
    y = rng.integers(0, k, n)
    p = np.where(rng.random(n) < 0.8, y, rng.integers(0, k, n)) * 3 + 11
    rows = rng.integers(0, n, 2_000_000)
    cols = np.where(rng.random(rows.shape[0]) < 0.7, rows + rng.integers(1, 50, rows.shape[0]), rng.integers(0, n, rows.shape[0])) % n
    A = sp.csr_matrix((np.ones(rows.shape[0]), (rows, cols)), shape=(n, n))
    A = A + A.T
    out = M.evaluate(p, y_true=y, adj=A)
    out.update(M.agreement(y, p))
    assert out["acc"] == pytest.approx(0.8 + 0.2 / k, abs=0.01)
    assert out["nmi"] == pytest.approx(skm.normalized_mutual_info_score(y, p), abs=1e-9)
    assert out["ari"] == pytest.approx(skm.adjusted_rand_score(y, p), abs=1e-9)
    # pair counts from the contingency table: pairs together in both / in p / in y
    pairs = lambda c: float((c * (c - 1) // 2).sum())  # noqa: E731
    both = pairs(np.unique(np.stack([y, p]), axis=1, return_counts=True)[1])
    precision, recall, f1 = M.pairwise_prf(y, p)
    assert (precision, recall) == pytest.approx((both / pairs(np.bincount(p)), both / pairs(np.bincount(y))))
    assert f1 == pytest.approx(2 * precision * recall / (precision + recall))
    edges = A.tocoo()
    cut = float(edges.data[p[edges.row] != p[edges.col]].sum())
    assert out["conductance"] == pytest.approx(cut / edges.data.sum())
