"""The result says how good it is: the reference method, a verdict by a stated rule, the
paper's figure for the same dataset, notes on misleading metrics, what DP covers."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from app import registry
from fedgraphcore.data import DATASETS
from fedgraphcore.data.evaluation import write_evaluation
from fedgraphcore.data.shards import server_data
from fedgraphcore.quality import CLOSE_ARI, PAPER_FIGURES, assess, notes, paper, verdict
from fedgraphcore.result import privacy_lines, summary_table, write_result
from app.run import run_experiment

AGREEING = {"ari": 0.95, "nmi": 0.9, "cluster_similarity": 0.99}


def test_the_verdict_follows_the_stated_rule():
    reference = {"acc": 0.70, "nmi": 0.50, "ari": 0.40, "f1": 0.60, "agreement": AGREEING}
    assert verdict({"acc": 0.1}, reference) == ("close", "close to the centralised reference: agreement ARI 0.950 "
                                                         ">= 0.9")
    other = {**reference, "agreement": {"ari": 0.5, "nmi": 0.6, "cluster_similarity": 0.8}}
    assert verdict({"acc": 0.69, "nmi": 0.52, "ari": 0.39, "f1": 0.61}, other) == (
        "as good", "as good as the centralised reference with other clusters: agreement ARI 0.500 < 0.9, but acc, "
                   "nmi, ari, f1 within 0.02 of it or better")
    assert verdict({"acc": 0.60, "nmi": 0.52, "ari": 0.39, "f1": 0.61}, other) == (
        "below", "below the centralised reference: agreement ARI 0.500 < 0.9; acc 0.600 vs 0.700")
    # without ground truth the graph metrics decide; lower conductance is better
    graph = {"modularity": 0.40, "conductance": 0.30, "agreement": other["agreement"]}
    assert verdict({"modularity": 0.41, "conductance": 0.25}, graph)[0] == "as good"
    assert verdict({"modularity": 0.41, "conductance": 0.35}, graph)[1].endswith("conductance 0.350 vs 0.300")
    assert verdict({}, None) == (None, "not compared with a centralised reference: reference=false")
    assert verdict({}, {"method": "m", "skipped": "why"}) == (None, "not compared with a centralised reference: why")


def test_a_one_sided_cluster_similarity_next_to_a_low_ari_is_explained():
    """The case of fedspectral-plus on email-eu-core: cluster_similarity 0.977, agreement ARI 0.19."""
    found = notes({}, {"agreement": {"ari": 0.19, "nmi": 0.47, "cluster_similarity": 0.977}}, 42, 42)
    assert len(found) == 1 and found[0].startswith("cluster_similarity 0.977 is one-sided")
    assert "agreement ARI (0.190)" in found[0]
    assert notes({}, {"agreement": AGREEING}, 42, 42) == []
    merged = notes({"coverage": 0.5}, {"ari": 0.05, "agreement": AGREEING}, 3, 10)
    assert [n.split(" ")[:4] for n in merged] == [["the", "centralised", "reference", "itself"],
                                                  ["the", "run", "uses", "3"], ["the", "metrics", "cover", "50.0%"]]


def test_the_paper_figure_is_given_only_for_its_dataset_with_the_setting_that_differs():
    config = {"num-clients": 4, "num-clusters": 42, "partition.overlap": 0.0, "fedspectral-plus.mode": "paper"}
    found = paper("fedspectral-plus", "email-eu-core", config, {"cluster_similarity": 0.977})
    assert found["reports"].startswith("clusterSimilarity 99.8%") and found["run"] == 0.977
    assert found["setting_differs"] == {"num-clients": {"run": 4, "paper": 5}, "num-clusters": {"run": 42, "paper": 10},
                                        "partition.overlap": {"run": 0.0, "paper": 0.4}}
    assert paper("fedspectral-plus", "karate", config, {}) is None
    for (strategy, dataset), figure in PAPER_FIGURES.items():  # every entry names real keys and data
        assert strategy in registry.STRATEGIES and dataset in DATASETS
        assert set(figure.setting) <= set(registry.schema().defaults())


@pytest.mark.parametrize("strategy", registry.STRATEGIES)
def test_every_strategy_names_its_reference_with_its_parameters(strategy):
    dataset = {"gw-ldp": "mutag", "kcagc": "cora", "kcagc-basic": "cora"}.get(strategy, "karate")
    config = registry.validate({"strategy": strategy, "dataset": dataset, "num-clusters": 3, "seed": 7})
    method = registry.get(strategy).strategy(config).reference_method()
    assert method.startswith("centralised ") and method.endswith("k = 3, seed 7")


def test_a_run_names_its_reference_and_says_how_close_it_is(tmp_path):
    result = run_experiment("fedkmeans", "sbm", 3, {"num-rounds": 10}, tmp_path / "run")
    on_disk = json.loads((tmp_path / "run" / "result.json").read_text())
    assert on_disk["reference"]["method"].startswith("centralised k-means (k-means++, 10 restarts) on the pooled "
                                                     "features")
    assert on_disk["quality"]["verdict"] == "close" and on_disk["reference"]["agreement"]["ari"] >= CLOSE_ARI
    assert on_disk["quality"]["clusters_found"] == 4 and on_disk["quality"]["paper"] is None
    table = summary_table(result)
    assert f"centralised method: {on_disk['reference']['method']}" in table
    assert (f"verdict (federated vs centralised clusters, not vs the ground truth): {on_disk['quality']['summary']}"
            in table)
    assert "quality against the ground truth" in table and "agreement of the federated and the centralised" in table
    unnamed = {k: v for k, v in result.items() if k != "dataset_name"}
    assert summary_table({**unnamed, "dataset": "memory:0123"}).startswith("fedkmeans on data given in memory with 3")


def test_a_reference_not_computed_is_named_with_the_reason(tmp_path):
    off = run_experiment("fedkmeans", "karate", 2, {"reference": False, "num-rounds": 2}, tmp_path / "off")
    assert set(off["reference"]) == {"method", "skipped"} and off["reference"]["skipped"] == "reference=false"
    assert off["quality"]["verdict"] is None and "verdict (nothing to compare): not compared" in summary_table(off)
    eval_file = write_evaluation(server_data("karate", None, 0), tmp_path / "eval.npz")
    labels_only = run_experiment("fedkmeans", "karate", 2, {"eval-file": str(eval_file), "num-rounds": 2},
                                 tmp_path / "labels-only")
    assert labels_only["reference"]["skipped"].startswith("the eval-file holds labels only")
    full = write_evaluation(server_data("karate", None, 0), tmp_path / "full.npz", contents="full")
    pooled = run_experiment("fedkmeans", "karate", 2, {"eval-file": str(full), "num-rounds": 2}, tmp_path / "full")
    assert "agreement" in pooled["reference"] and pooled["quality"]["verdict"] is not None


def test_the_privacy_lines_say_what_the_epsilon_covers_and_what_it_does_not():
    def upload(action, name, masked=False, noised=False):
        return {"action": action, "name": name, "masked": masked, "noised": noised}

    uploads = [upload("hello", "num_rows"), upload("round", "z", noised=True), upload("round", "sum", masked=True),
               upload("round", "z", noised=True), upload("final", "labels"), upload("final", "ids")]
    assert privacy_lines({"epsilon": 0.1, "delta": 1e-5, "uploads": uploads}) == [
        "privacy: (epsilon=0.1, delta=1e-05) covers the noised uploads only: round (z)",
        "privacy: masked by secure aggregation (the server sees sums), not covered by DP: round (sum)",
        "privacy: sent in clear, not covered by DP: hello (num_rows), final (labels, ids)"]
    assert privacy_lines({"epsilon": None, "uploads": uploads[:1]}) == [
        "privacy: no differential privacy guarantee",
        "privacy: sent in clear, not covered by DP: hello (num_rows)"]


@pytest.mark.parametrize("umask", [0o022, 0o027, 0o077])
def test_result_files_get_the_mode_of_ordinary_new_files(tmp_path, umask):
    previous = os.umask(umask)
    try:
        path = write_result({"strategy": "x"}, tmp_path / "out", np.zeros(3, dtype=np.int64))
    finally:
        os.umask(previous)
    for name in ("result.json", "labels.npy"):
        assert (path.parent / name).stat().st_mode & 0o777 == 0o666 & ~umask


def test_assess_is_the_result_sections_content():
    reference = {"acc": 0.7, "agreement": AGREEING}
    quality = assess("kcagc", "cora", {"num-clients": 2, "kcagc.local-factor": 1, "num-clusters": 7},
                     {"acc": 0.72}, reference, 7)
    assert quality["verdict"] == "close" and quality["paper"]["setting_differs"] == {}
    assert quality["paper"]["run"] == 0.72 and quality["notes"] == [] and "rule" in quality
