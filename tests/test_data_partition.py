"""Partitioners: sizes, coverage, determinism, overlap, isolation, error paths."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fedgraphcore.config import ConfigError  # noqa: E402
from fedgraphcore.data import GraphCollection, GraphData, load_dataset  # noqa: E402
from fedgraphcore.data.partition import PARTITIONERS, edge_replicas, khop_nodes, partition  # noqa: E402


@pytest.fixture(scope="module")
def sbm() -> GraphData:
    return load_dataset("sbm", seed=0, nodes=800, blocks=4, p_in=0.06, p_out=0.004, features=12)


@pytest.fixture(scope="module")
def sparse_x(sbm) -> GraphData:
    """Same graph with sparse features (as Cora/Wiki have)."""
    x = sp.csr_matrix(np.where(sbm.x > 1.0, sbm.x, 0.0))
    return GraphData("sbm-sparse", sbm.adj, x, sbm.y, {})


@pytest.fixture(scope="module")
def collection() -> GraphCollection:
    rng = np.random.default_rng(0)
    graphs, ys = [], []
    for i in range(120):
        n = int(rng.integers(3, 12))
        a = sp.triu(sp.random(n, n, density=0.4, random_state=i), 1)
        a = ((a + a.T) > 0).astype(np.float64).tocsr()
        a.sort_indices()
        graphs.append(GraphData(f"toy/{i}", a, rng.random((n, 3)), None, {"index": i}))
        ys.append(i % 3)
    return GraphCollection("toy", graphs, np.array(ys, dtype=np.int64))


def _edges(adj: sp.csr_matrix, ids: np.ndarray) -> set:
    coo = sp.triu(adj, 1).tocoo()
    return set(zip(ids[coo.row].tolist(), ids[coo.col].tolist()))


def _same(a: list, b: list) -> bool:
    for s, t in zip(a, b):
        if not np.array_equal(s.node_ids, t.node_ids):
            return False
        if (s.adj is None) != (t.adj is None) or (s.adj is not None and (s.adj != t.adj).nnz):
            return False
    return len(a) == len(b)


def test_names():
    assert PARTITIONERS == ("node-random", "node-community", "node-dirichlet", "edge", "vertical",
                            "sample", "sample-dirichlet", "khop", "graph-dirichlet")


# ----------------------------------------------------------------------------- node partitions


@pytest.mark.parametrize("name,kw", [
    ("node-random", {}), ("node-community", {"community": "louvain"}),
    ("node-community", {"community": "spectral"}), ("node-dirichlet", {"alpha": 1.0}),
    ("sample", {}), ("sample-dirichlet", {"alpha": 1.0}),
])
def test_node_partition_disjoint_cover(sbm, name, kw):
    shards = partition(sbm, name, 5, seed=7, **kw)
    assert len(shards) == 5 and [s.client_id for s in shards] == list(range(5))
    ids = np.concatenate([s.node_ids for s in shards])
    assert np.array_equal(np.sort(ids), np.arange(sbm.num_nodes)), "every node exactly once"
    for s in shards:
        assert s.num_clients == 5 and s.partitioner == name and s.owned.all()
        assert np.all(np.diff(s.node_ids) > 0)
        assert s.adj.shape == (s.num_nodes,) * 2 and (s.adj != s.adj.T).nnz == 0
        assert np.array_equal(s.x, sbm.x[s.node_ids]) and np.array_equal(s.y, sbm.y[s.node_ids])
        # Local edges are exactly the global edges inside the node set (cross edges dropped).
        sub = sbm.adj[s.node_ids][:, s.node_ids]
        assert (s.adj != sub).nnz == 0
    total = sum(s.num_edges for s in shards)
    assert total < sbm.num_edges
    again = partition(sbm, name, 5, seed=7, **kw)
    assert _same(shards, again), "same seed, same shards"
    if name != "node-community" or kw.get("community") != "louvain":
        other = partition(sbm, name, 5, seed=8, **kw)
        assert not _same(shards, other), "different seed, different shards"


def test_random_and_sample_are_balanced(sbm):
    for name in ("node-random", "sample"):
        sizes = [s.num_nodes for s in partition(sbm, name, 7, seed=1)]
        assert max(sizes) - min(sizes) <= 1 and sum(sizes) == 800


def test_community_keeps_more_edges_than_random(sbm):
    rand = sum(s.num_edges for s in partition(sbm, "node-random", 4, seed=0))
    for method in ("louvain", "spectral"):
        shards = partition(sbm, "node-community", 4, seed=0, community=method)
        kept = sum(s.num_edges for s in shards)
        assert kept > 0.7 * sbm.num_edges > 2 * rand, method
    sizes = [s.num_nodes for s in partition(sbm, "node-community", 3, seed=0, community="spectral")]
    assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize("name", ["node-random", "node-community", "node-dirichlet"])
def test_node_overlap_factor_and_isolation(sbm, name):
    shards = partition(sbm, name, 4, seed=2, overlap=0.25)
    n = sbm.num_nodes
    sizes = sum(s.num_nodes for s in shards)
    assert sizes == n + round(0.25 * n), "overlap factor 1.25"
    owned = np.concatenate([s.node_ids[s.owned] for s in shards])
    assert np.array_equal(np.sort(owned), np.arange(n)), "each node owned exactly once"
    copies = np.concatenate([s.node_ids[~s.owned] for s in shards])
    assert copies.size == round(0.25 * n) and np.unique(copies).size == copies.size
    counts = np.bincount(np.concatenate([s.node_ids for s in shards]), minlength=n)
    assert counts.max() == 2 and (counts == 2).sum() == copies.size
    # Nothing of one client appears in another's shard except the defined copies:
    # shared nodes are copies, and shared edges join two nodes that are both held twice.
    copy_set = set(copies.tolist())
    for i in range(4):
        for j in range(i + 1, 4):
            shared = np.intersect1d(shards[i].node_ids, shards[j].node_ids)
            assert np.isin(shared, copies).all()
            both = _edges(shards[i].adj, shards[i].node_ids) & _edges(shards[j].adj, shards[j].node_ids)
            assert all(u in copy_set or v in copy_set for u, v in both)


def test_dirichlet_alpha_controls_skew(sbm):
    def skew(alpha):
        shards = partition(sbm, "node-dirichlet", 4, seed=3, alpha=alpha, min_size=5)
        # Mean total-variation distance of client label histograms from the global one.
        glob = np.bincount(sbm.y, minlength=4) / sbm.num_nodes
        return np.mean([0.5 * np.abs(np.bincount(s.y, minlength=4) / s.num_nodes - glob).sum() for s in shards])

    assert skew(0.1) > 0.3 > 0.1 > skew(100.0)
    shards = partition(sbm, "node-dirichlet", 4, seed=3, alpha=0.1, min_size=50)
    assert min(s.num_nodes for s in shards) >= 50


def test_dirichlet_needs_labels(sbm):
    unlabeled = GraphData("nolab", sbm.adj, sbm.x, None, {})
    with pytest.raises(ConfigError, match="needs labels"):
        partition(unlabeled, "node-dirichlet", 3)


def test_sample_on_non_graph_data():
    d = load_dataset("iris")
    shards = partition(d, "sample-dirichlet", 3, seed=0, alpha=0.5, min_size=5)
    assert sum(s.num_nodes for s in shards) == 150 and all(s.adj.nnz == 0 for s in shards)
    rows = np.concatenate([s.x for s in shards])
    ids = np.concatenate([s.node_ids for s in shards])
    assert np.array_equal(rows, d.x[ids])


# ----------------------------------------------------------------------------- edge partition


@pytest.mark.parametrize("clients,overlap,r", [(4, 0.0, 1), (4, 0.5, 2), (5, 0.6, 3), (3, 1.0, 3)])
def test_edge_partition_replicas(sbm, clients, overlap, r):
    assert edge_replicas(clients, overlap) == r
    shards = partition(sbm, "edge", clients, seed=5, overlap=overlap)
    n, m = sbm.num_nodes, sbm.num_edges
    assert sum(s.num_edges for s in shards) == r * m, "overlap factor r"
    total = sp.csr_matrix((n, n))
    for s in shards:
        assert np.array_equal(s.node_ids, np.arange(n)) and s.adj.shape == (n, n)
        assert (s.adj != s.adj.T).nnz == 0 and s.adj.diagonal().sum() == 0
        assert s.x is None and s.y is None
        assert s.edge_weight.shape == s.adj.data.shape and np.all(s.edge_weight == r)
        assert s.meta["replicas"] == r
        assert (s.adj - s.adj.multiply(sbm.adj)).nnz == 0, "only real edges"
        total = total + sp.csr_matrix((s.adj.data / s.edge_weight, s.adj.indices, s.adj.indptr), shape=s.adj.shape)
    assert abs(total - sbm.adj).max() < 1e-12, "1/r-weighted union is the global graph"
    counts = sum((s.adj > 0).astype(np.int64) for s in shards)
    assert counts.max() == r and counts.min() == 0 and (counts.data == r).all(), "each edge in exactly r"
    # Balance: each client holds about r*m/C edges.
    sizes = np.array([s.num_edges for s in shards])
    assert np.abs(sizes - r * m / clients).max() < 6 * np.sqrt(r * m / clients) + 1
    assert _same(shards, partition(sbm, "edge", clients, seed=5, overlap=overlap))
    if r < clients:
        assert not _same(shards, partition(sbm, "edge", clients, seed=6, overlap=overlap))


def test_edge_replicas_param_and_features(sbm):
    shards = partition(sbm, "edge", 6, seed=0, replicas=4, with_features=True)
    assert all(s.meta["replicas"] == 4 for s in shards)
    assert shards[0].x is sbm.x
    with pytest.raises(ConfigError, match="replicas"):
        partition(sbm, "edge", 3, replicas=5)


def test_edge_choice_is_uniform(sbm):
    # With r=2 of C=4, every client pair should be chosen about equally often.
    shards = partition(sbm, "edge", 4, seed=11, overlap=0.5)
    sets = [_edges(s.adj, s.node_ids) for s in shards]
    pair = np.array([[len(sets[i] & sets[j]) for j in range(4)] for i in range(4)])
    off = pair[~np.eye(4, dtype=bool)]
    assert off.sum() == 2 * sbm.num_edges
    assert off.max() / off.min() < 1.25


# ----------------------------------------------------------------------------- vertical


@pytest.mark.parametrize("fixture", ["sbm", "sparse_x"])
@pytest.mark.parametrize("kw", [{"split": "contiguous"}, {"split": "random"}, {"sizes": "2,7,3"}])
def test_vertical_blocks_concatenate_back(request, fixture, kw):
    d = request.getfixturevalue(fixture)
    shards = partition(d, "vertical", 3, seed=4, **kw)
    cols = np.concatenate([s.feature_cols for s in shards])
    assert np.array_equal(np.sort(cols), np.arange(12)), "every column exactly once"
    blocks = [s.x.toarray() if sp.issparse(s.x) else s.x for s in shards]
    full = d.x.toarray() if sp.issparse(d.x) else d.x
    rebuilt = np.empty_like(full)
    rebuilt[:, cols] = np.hstack(blocks)
    assert np.array_equal(rebuilt, full)
    for s in shards:
        assert s.adj is d.adj and np.array_equal(s.node_ids, np.arange(d.num_nodes)) and s.y is None
    if "sizes" in kw:
        assert [s.x.shape[1] for s in shards] == [2, 7, 3]
    if kw.get("split") == "contiguous":
        assert np.array_equal(shards[0].feature_cols, np.arange(4))
    if kw.get("split") == "random":
        assert not _same_cols(shards, partition(d, "vertical", 3, seed=5, **kw))
        assert _same_cols(shards, partition(d, "vertical", 3, seed=4, **kw))


def _same_cols(a, b):
    return all(np.array_equal(s.feature_cols, t.feature_cols) for s, t in zip(a, b))


def test_vertical_errors(sbm):
    with pytest.raises(ConfigError, match="sizes"):
        partition(sbm, "vertical", 3, sizes="2,2,2")
    with pytest.raises(ConfigError, match="split"):
        partition(sbm, "vertical", 3, split="diagonal")
    with pytest.raises(ConfigError, match="needs node features"):
        partition(GraphData("nofeat", sbm.adj, None, sbm.y), "vertical", 2)


# ----------------------------------------------------------------------------- k-hop


def test_khop_subgraphs(sbm):
    shards = partition(sbm, "khop", 4, seed=0, hops=1, centres=100)
    centres = np.concatenate([s.graph_ids for s in shards])
    assert centres.size == 100 and np.unique(centres).size == 100, "centres disjoint over clients"
    assert [s.num_graphs for s in shards] == [25] * 4
    for s in shards:
        assert np.array_equal(s.graph_y, sbm.y[s.graph_ids]), "centre label is the pseudo-label"
        union = set()
        for c, g in zip(s.graph_ids, s.graphs):
            ids = np.array(g.meta["node_ids"])
            assert ids[0] == c and g.meta["centre"] == c
            expect = np.union1d([c], sbm.adj[c].indices)
            assert np.array_equal(np.sort(ids), expect), "1-hop ball around the centre"
            assert (g.adj != sbm.adj[ids][:, ids]).nnz == 0
            assert np.array_equal(g.x, sbm.x[ids]) and g.y is None
            union |= set(ids.tolist())
        assert np.array_equal(s.node_ids, np.array(sorted(union)))
    assert _same(shards, partition(sbm, "khop", 4, seed=0, hops=1, centres=100))


def test_khop_two_hops_and_cap(sbm):
    rng = np.random.default_rng(0)
    ids = khop_nodes(sbm.adj, 5, 2, 0, rng)
    a2 = (sbm.adj + sbm.adj @ sbm.adj)[5]
    assert set(ids.tolist()) == set(a2.indices.tolist()) | {5}
    capped = khop_nodes(sbm.adj, 5, 2, 20, rng)
    assert capped.size == 20 and capped[0] == 5 and set(capped.tolist()) <= set(ids.tolist())
    first = set(sbm.adj[5].indices.tolist())
    assert first <= set(capped.tolist()), "nearer layers are kept first"
    shards = partition(sbm, "khop", 2, seed=0, centres=10, max_nodes=8)
    assert all(g.num_nodes <= 8 for s in shards for g in s.graphs)


def test_khop_all_nodes_default(sbm):
    shards = partition(sbm, "khop", 3, seed=1, hops=1)
    assert sum(s.num_graphs for s in shards) == sbm.num_nodes


# ----------------------------------------------------------------------------- collections


def test_graph_dirichlet(collection):
    shards = partition(collection, "graph-dirichlet", 4, seed=0, alpha=0.5, min_size=3)
    ids = np.concatenate([s.graph_ids for s in shards])
    assert np.array_equal(np.sort(ids), np.arange(len(collection))), "each graph exactly once"
    for s in shards:
        assert s.num_graphs >= 3 and np.array_equal(s.graph_y, collection.y[s.graph_ids])
        assert all(g is collection.graphs[i] for g, i in zip(s.graphs, s.graph_ids))
        assert s.node_ids.size == 0 and s.adj is None
    again = partition(collection, "graph-dirichlet", 4, seed=0, alpha=0.5, min_size=3)
    assert all(np.array_equal(s.graph_ids, t.graph_ids) for s, t in zip(shards, again))
    other = partition(collection, "graph-dirichlet", 4, seed=1, alpha=0.5, min_size=3)
    assert not all(np.array_equal(s.graph_ids, t.graph_ids) for s, t in zip(shards, other))


def test_collection_errors(collection, sbm):
    for name in PARTITIONERS:
        if name == "graph-dirichlet":
            with pytest.raises(ConfigError, match="needs a graph collection"):
                partition(sbm, name, 2)
        else:
            with pytest.raises(ConfigError, match="graph collection.*graph-dirichlet"):
                partition(collection, name, 2)


# ----------------------------------------------------------------------------- errors


def test_error_messages_are_one_line(sbm):
    # A parameter is named by its keyword and its run-config key, which is what a run-config user typed.
    cases = [
        (dict(partitioner="nodes"), "unknown partitioner 'nodes'; valid choices: node-random"),
        (dict(partitioner="node-random", num_clients=0), "number of clients"),
        (dict(partitioner="node-random", num_clients=801), "at most 800"),
        (dict(partitioner="node-random", alpha=0.5), "unknown parameter 'alpha' for partitioner 'node-random'"),
        (dict(partitioner="node-random", overlap=1.5), "'overlap' (run-config 'partition.overlap')"),
        (dict(partitioner="node-community", community="metis"), "valid choices: louvain, spectral"),
        (dict(partitioner="node-dirichlet", alpha=0.0), "'alpha' (run-config 'partition.alpha')"),
        (dict(partitioner="node-dirichlet", min_size=500), "lower 'min_size' (run-config 'partition.min-size')"),
        (dict(partitioner="khop", centres=2, num_clients=3), "raise 'centres' (run-config 'khop.centres')"),
        (dict(partitioner="vertical", sizes="1,2"), "for 'sizes' (run-config 'partition.sizes'); need 3"),
        (dict(partitioner="node-random", overlap="lots"), "invalid value 'lots' for 'overlap'"),
        (dict(partitioner="khop", hops=1.5), "invalid value 1.5 for 'hops'"),
    ]
    for kw, match in cases:
        kw = {"num_clients": 3, **kw}
        with pytest.raises(ConfigError) as e:
            partition(sbm, **kw)
        assert match in str(e.value) and "\n" not in str(e.value), (kw, str(e.value))


def test_string_params_are_coerced(sbm):
    # Run-config values may arrive as strings.
    a = partition(sbm, "node-random", 3, seed=0, overlap="0.1")
    b = partition(sbm, "node-random", 3, seed=0, overlap=0.1)
    assert _same(a, b)
    assert partition(sbm, "edge", 4, seed=0, replicas="2", with_features="true")[0].meta["replicas"] == 2
