"""How good a run's result is: a verdict against the centralised reference, the paper's
figure for the same dataset, and notes on metrics that can mislead.

The rule (also in docs/running.md):

* **close** to the reference: agreement ARI (federated vs centralised labels) >= 0.9;
* **as good, with other clusters**: agreement ARI < 0.9, but every quality metric within
  0.02 of the reference's or better (ACC, NMI, ARI, F1 against the ground truth; without
  ground truth, modularity and conductance, where lower conductance is better);
* **below** the reference otherwise: the metrics more than 0.02 worse are named.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

CLOSE_ARI = 0.9
TOLERANCE = 0.02
WEAK_REFERENCE_ARI = 0.2  # below it the reference's own clustering barely matches the ground truth
LABEL_METRICS = ("acc", "nmi", "ari", "f1")
GRAPH_METRICS = ("modularity", "conductance")
LOWER_IS_BETTER = ("conductance",)
RULE = (f"close: agreement ARI >= {CLOSE_ARI}; as good: every quality metric (ACC, NMI, ARI, F1; without labels "
        f"modularity, conductance) within {TOLERANCE} of the reference or better; else below")


@dataclass(frozen=True)
class PaperFigure:
    """What a method's paper reports on one dataset, in the setting it names (run-config keys)."""

    source: str
    figure: str
    metric: str  # the result.json key it compares with
    setting: Mapping[str, object]


_SPECTRAL_SETTING = {"num-clients": 5, "num-clusters": 10, "partition.overlap": 0.4}
_GW_LDP = "GW-LDP paper, Table 1 (SVM on GW of the LDP embeddings, GW_H*(GIN); 10 clients, Dirichlet split)"

#: Published figures for the datasets the papers used (shared/papers/NOTES.md).
PAPER_FIGURES: dict[tuple[str, str], PaperFigure] = {
    ("kcagc", "cora"): PaperFigure("kCAGC paper, Table II", "ACC 67.81% with 2 parties and k_hat = k; best over "
                                   "k_hat 72.12% (2 parties), 72.44% / 71.89% / 72.78% (4 / 8 / 16)", "acc", {}),
    ("kcagc", "citeseer"): PaperFigure("kCAGC paper, Table II", "best ACC over k_hat 69.74% / 69.90% / 69.96% / "
                                       "70.32% with 2 / 4 / 8 / 16 parties", "acc", {}),
    ("kcagc", "pubmed"): PaperFigure("kCAGC paper, Table II", "best ACC over k_hat about 69.85%", "acc", {}),
    ("kcagc", "wiki"): PaperFigure("kCAGC paper, Table II", "best ACC over k_hat 50.45% / 53.57% / 53.54% / 53.08% "
                                   "with 2 / 4 / 8 / 16 parties", "acc", {}),
    ("kcagc-basic", "cora"): PaperFigure("kCAGC paper, Table II", "b-kCAGC ACC 67.6%", "acc", {}),
    ("fedspectral-plus", "ego-facebook"): PaperFigure(
        "FedSpectral+ paper", "clusterSimilarity 98.85% against centralised spectral clustering", "cluster_similarity",
        {**_SPECTRAL_SETTING, "fedspectral-plus.mode": "paper"}),
    ("fedspectral-plus", "email-eu-core"): PaperFigure(
        "FedSpectral+ paper", "clusterSimilarity 99.8% against centralised spectral clustering", "cluster_similarity",
        {**_SPECTRAL_SETTING, "fedspectral-plus.mode": "paper"}),
    ("fedspectral", "ego-facebook"): PaperFigure(
        "FedSpectral+ paper", "FedSpectral clusterSimilarity 77.63% against centralised spectral clustering",
        "cluster_similarity", _SPECTRAL_SETTING),
    ("fedspectral", "email-eu-core"): PaperFigure(
        "FedSpectral+ paper", "FedSpectral clusterSimilarity 87.05% against centralised spectral clustering",
        "cluster_similarity", _SPECTRAL_SETTING),
    ("fedsc", "iris"): PaperFigure("FedSC paper", "ACC 0.900 (centralised spectral clustering 0.900)", "acc",
                                   {"num-clients": 8}),
    ("gw-ldp", "proteins"): PaperFigure(_GW_LDP, "test accuracy 76.89% (without LDP, GW_H: 75.53%)", "svc_test_acc",
                                        {"num-clients": 10, "gw-ldp.model": "gin"}),
    ("gw-ldp", "mutag"): PaperFigure(_GW_LDP, "test accuracy 91.17% (without LDP, GW_H: 93.08%)", "svc_test_acc",
                                     {"num-clients": 10, "gw-ldp.model": "gin"}),
    ("gw-ldp", "imdb-binary"): PaperFigure(_GW_LDP, "test accuracy 73.6% (without LDP, GW_H: 74.4%)", "svc_test_acc",
                                           {"num-clients": 10, "gw-ldp.model": "gin"}),
}


def _gaps(metrics: Mapping, reference: Mapping) -> dict[str, float]:
    """Federated minus reference per quality metric, signed so that negative is worse: the
    label metrics where both have them, else the graph metrics."""
    names = [m for m in LABEL_METRICS if m in metrics and m in reference] or \
            [m for m in GRAPH_METRICS if m in metrics and m in reference]
    return {m: (reference[m] - metrics[m]) if m in LOWER_IS_BETTER else (metrics[m] - reference[m]) for m in names}


def verdict(metrics: Mapping, reference: Mapping | None) -> tuple[str | None, str]:
    """``(close | as good | below | None, one line)`` by the module's rule."""
    if not reference or "agreement" not in reference:
        why = (reference or {}).get("skipped", "reference=false")
        return None, f"not compared with a centralised reference: {why}"
    agreement = reference["agreement"]["ari"]
    if agreement >= CLOSE_ARI:
        return "close", f"close to the centralised reference: agreement ARI {agreement:.3f} >= {CLOSE_ARI}"
    gaps = _gaps(metrics, reference)
    worse = {m: g for m, g in gaps.items() if g < -TOLERANCE}
    if gaps and not worse:
        return "as good", (f"as good as the centralised reference with other clusters: agreement ARI "
                           f"{agreement:.3f} < {CLOSE_ARI}, but {', '.join(gaps)} within {TOLERANCE} of it or better")
    listed = "; " + ", ".join(f"{m} {metrics[m]:.3f} vs {reference[m]:.3f}" for m in worse) if worse else ""
    return "below", f"below the centralised reference: agreement ARI {agreement:.3f} < {CLOSE_ARI}{listed}"


def paper(strategy: str, dataset: str, config: Mapping, metrics: Mapping) -> dict | None:
    """The paper's figure for this strategy and dataset with the run's own value beside it, and
    where the run's setting differs from the paper's; None when the paper used other data."""
    figure = PAPER_FIGURES.get((strategy, dataset))
    if figure is None:
        return None
    differs = {key: {"run": config.get(key), "paper": value} for key, value in figure.setting.items()
               if config.get(key) != value}
    return {"source": figure.source, "reports": figure.figure, "metric": figure.metric,
            "run": metrics.get(figure.metric), "setting_differs": differs}


def notes(metrics: Mapping, reference: Mapping | None, clusters_found: int, clusters_asked: int) -> list[str]:
    """Warnings about figures that read better than the clustering is."""
    out = []
    agreement = (reference or {}).get("agreement") or {}
    similarity = agreement.get("cluster_similarity")
    if similarity is not None and similarity >= CLOSE_ARI > agreement["ari"]:
        out.append(f"cluster_similarity {similarity:.3f} is one-sided (FedSpectral's Algorithm 5): it only counts "
                   "pairs the reference keeps together and the run splits, so merging clusters costs nothing (one "
                   f"cluster scores 1.0); the symmetric agreement ARI ({agreement['ari']:.3f}) is the one that says how far "
                   "the clusterings differ")
    if (reference or {}).get("ari", 1.0) < WEAK_REFERENCE_ARI:
        out.append(f"the centralised reference itself finds little of the ground truth (ARI {reference['ari']:.3f}): "
                   "the method does not fit this data at these settings, and agreeing with it says little")
    if 0 < clusters_found < clusters_asked:
        out.append(f"the run uses {clusters_found} of the {clusters_asked} clusters asked for; fewer, larger "
                   "clusters lower the conductance and raise cluster_similarity without being better")
    if metrics.get("coverage", 1.0) < 1.0:
        out.append(f"the metrics cover {metrics['coverage']:.1%} of the items: no client returned a label for the "
                   "rest")
    return out


def assess(strategy: str, dataset: str, config: Mapping, metrics: Mapping, reference: Mapping | None,
           clusters_found: int, data_warnings: Sequence[str] = ()) -> dict:
    """The ``quality`` section of result.json; ``data_warnings``: where the clients' shards support
    the method weakly (:meth:`strategies.base.ClusteringStrategy.check_shards`), first among the notes."""
    kind, line = verdict(metrics, reference)
    return {"verdict": kind, "summary": line, "rule": RULE,
            "paper": paper(strategy, dataset, config, metrics),
            "clusters_found": clusters_found,
            "notes": [*data_warnings, *notes(metrics, reference, clusters_found, int(config.get("num-clusters", 0)))]}
