"""A page per run (fedgraphcore.report), a member's page, and comparing methods (app.comparison).

The page of each strategy is checked on a run its own tests already make (``check_page`` in
test_app, test_fedspectral, test_fedsc, test_kcagc, test_fedavg_dmon); gw-ldp's, on a small
collection here. Here: what the page draws of the data and how it caps it, the page written again
from the run's folder alone, a member's page, and ``compare``.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import scipy.sparse as sp

from app import cluster, compare, registry
from fedgraphcore.data.types import GraphCollection, GraphData
from fedgraphcore.report import main as report_main
from fedgraphcore.report.view import (PER_CLUSTER, SAMPLE, SMALL_GRAPH, View, build_view, classical_scaling, cluster_edges,
                             dense_distances, sample_items)
from app.run import run_experiment
from conftest import check_page

pytestmark = pytest.mark.shipped_defaults  # these tests look at the runs' pages


def planted(n: int, k: int, features: int = 3, seed: int = 0) -> GraphData:
    """``k`` blocks of a ring-of-cliques-like graph: edges inside blocks, a few between."""
    rng = np.random.default_rng(seed)
    y = np.arange(n) % k
    rows, cols = np.nonzero(np.triu((y[:, None] == y[None]) & (rng.random((n, n)) < 8 / n * k), 1))
    adj = sp.coo_matrix((np.ones(rows.size), (rows, cols)), shape=(n, n))
    adj = (adj + adj.T).tocsr()
    x = rng.normal(size=(n, features)) + y[:, None] if features else None
    return GraphData("planted", adj, x, y.astype(np.int64))


# -- what the page draws ----------------------------------------------------------------------
def test_a_small_graph_is_drawn_whole_with_every_edge():
    g = planted(SMALL_GRAPH, 3)
    view = build_view(g, g.y, seed=1)
    assert view.kind == "graph" and view.xy.shape == (SMALL_GRAPH, 2) and len(view.edges) == g.num_edges
    assert view.meta["items"] == SMALL_GRAPH and view.meta["edges"] == g.num_edges and view.meta["classes"] == 3
    again = build_view(g, g.y, seed=1)
    assert np.array_equal(view.xy, again.xy)  # a seeded layout: the same picture every time


def test_a_larger_graph_is_a_capped_sample_keeping_every_cluster_and_its_cluster_graph():
    g = planted(SAMPLE + 500, 4)
    labels = g.y.copy()
    labels[:3] = 4  # a cluster of three: kept whole in the sample
    view = build_view(g, labels)
    assert view.kind == "sample" and view.sample.size == SAMPLE and view.xy.shape == (SAMPLE, 2)
    assert set(np.flatnonzero(labels == 4)) <= set(view.sample.tolist())
    assert all((labels[view.sample] == c).sum() >= PER_CLUSTER for c in range(4))
    assert view.cluster_edges.shape == (5, 5) and view.cluster_edges.sum() == g.num_edges
    assert f"{SAMPLE} of {SAMPLE + 500} items" in view.meta["layout"]


def test_the_cluster_graph_counts_each_edge_once_and_leaves_unlabelled_items_out():
    adj = sp.csr_matrix(np.array([[0, 2, 1, 0], [2, 0, 0, 0], [1, 0, 0, 1], [0, 0, 1, 0]], dtype=float))
    assert cluster_edges(adj, np.array([0, 0, 1, -1])).tolist() == [[2.0, 1.0], [0.0, 0.0]]


def test_rows_without_features_or_edges_draw_nothing_and_say_why():
    g = GraphData("bare", sp.csr_matrix((5, 5)), None, None)
    view = build_view(g, np.zeros(5, dtype=np.int64))
    assert view.kind == "none" and "neither edges nor features" in view.meta["why"]


def test_a_collection_is_placed_by_its_distances():
    points = np.array([0.0, 1.0, 3.0, 7.0])
    distances = np.abs(points[:, None] - points[None])
    xy = classical_scaling(distances)
    assert np.allclose(np.linalg.norm(xy[:, None] - xy[None], axis=2), distances, atol=1e-4)
    dense = dense_distances(distances[:2, :2], np.array([3, 1]), 4)
    assert dense[3, 1] == 1.0 and dense[0, 2] == 1.0 and dense[2, 2] == 0.0  # a missing item: the farthest


def test_sampling_is_uniform_beyond_the_clusters_floor():
    labels = np.repeat(np.arange(10), 1000)
    drawn = sample_items(labels, 2000, seed=0)
    assert drawn.size == 2000 and np.all(np.diff(drawn) > 0)
    assert np.bincount(labels[drawn]).min() > PER_CLUSTER


def test_the_view_round_trips_through_its_file_without_pickle(tmp_path):
    g = planted(60, 3)
    view = build_view(g, g.y)
    loaded = View.load(view.save(tmp_path / "v.npz"))
    assert loaded.kind == view.kind and loaded.meta == view.meta and np.array_equal(loaded.xy, view.xy)
    assert np.array_equal(loaded.truth, g.y) and np.array_equal(loaded.edges, view.edges)


# -- the page from the run's folder ---------------------------------------------------------------
def test_the_page_is_written_again_from_the_runs_folder_alone(tmp_path, capsys):
    out = tmp_path / "run"
    run_experiment("fedkmeans", "karate", 2, {"num-rounds": 3}, out)
    first = check_page(out, figures=2)  # 34 nodes drawn whole with their edges, the rounds
    assert "verdict compares the federated clusters with the same method run centrally" in first
    assert re.search(r"ACC [\d.]+ \(centralised [\d.]+\).* against the ground truth", first)
    (out / "report.html").unlink()
    summaries = {name: entry.strategy.summary for name, entry in registry.STRATEGIES.items()}  # as __main__ gives
    assert report_main([str(out)], summaries) == 0 and capsys.readouterr().out == f"report: {out / 'report.html'}\n"
    assert check_page(out, figures=2) == first  # nothing in the page but what the folder holds
    assert report_main([str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"error: {str(tmp_path)!r} holds no result.json; valid: the folder of a " \
                                      "finished run\n"


def test_a_collections_page_draws_the_graphs_by_their_gromov_wasserstein_distances(tmp_path):
    rng = np.random.default_rng(0)
    graphs = []
    for i in range(16):  # rings and stars of 5 to 8 nodes
        n = 5 + i % 4
        edges = [(j, (j + 1) % n) for j in range(n)] if i % 2 else [(0, j) for j in range(1, n)]
        rows, cols = np.array(edges).T
        adj = sp.coo_matrix((np.ones(len(edges)), (rows, cols)), shape=(n, n))
        graphs.append(GraphData(f"g{i}", (adj + adj.T).tocsr(), rng.normal(size=(n, 2)), None))
    data = GraphCollection("shapes", graphs, np.arange(16, dtype=np.int64) % 2)
    result = cluster("gw-ldp", data, 2, out_dir=tmp_path / "run", num_rounds=1, quiet=True,
                     config={"gw-ldp.svc": False, "gw-ldp.model": "gcn", "reference": False})
    html = check_page(tmp_path / "run", figures=2)  # the graphs placed by their distances, the rounds
    assert "all 16 graphs placed by classical multidimensional scaling" in html
    assert result.report == tmp_path / "run" / "report.html"


# -- a member's page, the summary of a run on the parties' own data ------------------------------------
def test_each_party_writes_its_own_page_and_the_summary_has_no_empty_table(tmp_path, caplog):
    g = planted(40, 2, features=4)
    pieces = [GraphData("a", g.adj, g.x[:, :2], None), GraphData("b", g.adj, g.x[:, 2:], None)]
    result = cluster("kcagc", pieces, num_clusters=2, out_dir=tmp_path / "run")
    summary = caplog.text
    assert "federated  centralised" not in summary and "agreement of the" not in summary
    assert re.search(r"cluster sizes: \d+, \d+ \(of 40 items", summary)
    for party in (0, 1):
        page = next((tmp_path / "run" / f"party-{party}").glob("run-*/report.html")).read_text()
        assert "<h2>Its clusters</h2>" in page and "<h2>What it sent</h2>" in page
        sent = re.findall(r"<tr><td>(\w+)</td><td>(\w+)</td>", page)
        assert ("hello", "num_rows") in sent and ("kcagc_exact", "p") in sent and ("labels", "received") in sent
    assert result.report is not None and "partitioner &#x27;vertical&#x27;" in result.report.read_text()


# -- compare ---------------------------------------------------------------------------------------
def test_compare_runs_the_methods_that_fit_and_says_why_the_others_do_not(tmp_path):
    table = compare("iris", ["fedkmeans", "fedspectral", "fedsc"], num_clients=2, out_dir=tmp_path / "cmp",
                    num_rounds=3)
    rows = {r["strategy"]: r for r in table.rows}
    assert rows["fedkmeans"]["status"] == rows["fedsc"]["status"] == "ran"
    assert rows["fedspectral"]["status"] == "does not fit" and "has no edges" in rows["fedspectral"]["reason"]
    assert rows["fedkmeans"]["partitioner"] == "node-random" and rows["fedsc"]["partitioner"] == "sample"
    assert 0.5 < rows["fedkmeans"]["acc"] <= 1 and rows["fedkmeans"]["agreement"] is not None
    text = table.table()
    assert text.startswith("compared on iris: quality against the ground truth") and "fedspectral: does not fit" in text
    page = (tmp_path / "cmp" / "compare.html").read_text()
    assert re.findall(r'href="([^"]+)"', page) == ["fedkmeans/report.html", "fedsc/report.html"]
    check_page(tmp_path / "cmp" / "fedsc", figures=2)
    assert json.loads((tmp_path / "cmp" / "compare.json").read_text())["rows"][0]["strategy"] == "fedkmeans"
    assert list(table.frame()["strategy"]) == ["fedkmeans", "fedspectral", "fedsc"]


def test_compare_refuses_an_unknown_strategy_in_one_line():
    from fedgraphcore.config import ConfigError

    with pytest.raises(ConfigError, match="unknown strategy 'kmeans'"):
        compare("iris", ["kmeans"])
