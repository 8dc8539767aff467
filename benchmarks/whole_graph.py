"""The clustering the whole graph gives, on every split: federated against centralised.

    python benchmarks/whole_graph.py [--only METHOD ...] [--datasets NAME ...] [--seeds N] [--report]

Runs each method in-process on data the other benchmarks do not tune to (a planted partition of
2,100 nodes in 7 blocks at fresh seeds; Cora; a planted partition of PubMed's size, 19,717 nodes in
3 blocks, since PubMed itself is not among the shared datasets) split the way the method expects (node split
with boundary edges, vertical split, edge split), beside the same method with cut edges dropped
(the papers' node splits) or the paper's protocol where one exists. Each run reports its ACC and
macro-F1, the centralised reference's on the same data and seed, the agreement ARI between the two
labelings, the rounds and bytes the protocol moved, and what the server learns.
Writes benchmarks/results/whole_graph.json (merging runs of other methods already there),
docs/results/whole-graph.md and the scoreboard rows (``--report``: only the page and rows).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import pages  # noqa: E402,F401 - tests point its directories elsewhere
from fedgraphcore.config import ArgumentParser  # noqa: E402
from pages import (RESULTS_DIR, ScoreRow, figure, image_path, mean_spread, paragraph, seed_list, table,  # noqa: E402
                   write_page, write_scoreboard_rows)

MEASURE = "python benchmarks/whole_graph.py --seeds 3"
RESULTS = "whole_graph.json"
CLIENTS = 4

#: Held-out data: (name, dataset, its keys, seeds). The planted partition is drawn at seeds no other
#: benchmark uses (the run's seed draws the graph).
DATASETS = {
    "planted-2100": ("sbm", {"sbm.nodes": 2100, "sbm.blocks": 7, "sbm.p-in": 0.02, "sbm.p-out": 0.002,
                                     "sbm.signal": 1.0},
                     (101, 102, 103)),
    "cora": ("cora", {}, (0, 1, 2)),
    "planted-19717": ("sbm", {"sbm.nodes": 19717, "sbm.blocks": 3, "sbm.p-in": 0.0015, "sbm.p-out": 0.0001,
                              "sbm.signal": 1.0}, (201,)),
}


class Case(NamedTuple):
    """One method on one split: ``keys`` its run-config beyond the data's."""

    split: str
    method: str
    label: str
    keys: dict
    learns: str
    datasets: tuple[str, ...] = ("planted-2100", "cora", "planted-19717")


NODE = {"partitioner": "node-random"}
EDGE = {"partitioner": "edge", "partition.overlap": 0.4}
#: scikit-learn's fixed k-means restarts, against the default's (n k / 50 on the embedding: 380 on Cora),
#: which reach the best local optimum of Cora's regularised embedding (one single start in thirty does)
KMEANS_RESTARTS = 10
RESTARTS_CASE = f"fedspectral-plus, exact, {KMEANS_RESTARTS} k-means restarts"
#: the case whose Cora row is the regularised target (ACC beside the unregularised arm's)
REGULARISED_CASE = "fedspectral-plus, exact"
LANDSCAPE_STARTS = 300
UNREGULARISED_CASE = "fedspectral-plus, exact, unregularised"
DROPPED = {**NODE, "partition.boundary": False}
#: fedkmeans' default (filter order 4 on 96 projected columns, 10 restarts): its target is the reference's own spread
FEDKMEANS_CASE = "fedkmeans (default: filter 4, 96 columns), boundary edges"
CASES = (
    Case("node", "fedspectral-plus", "fedspectral-plus, boundary edges", NODE,
         "the degree vector and the products A Y of its own blocks (sums over parties); not who holds which edge"),
    Case("node", "fedkmeans", FEDKMEANS_CASE, NODE,
         "nothing of the filter (padded sums); then the per-cluster sums and counts in clear", ("planted-2100", "cora")),
    Case("node", "fedkmeans", "fedkmeans (default), cut edges dropped", DROPPED,
         "the per-cluster sums and counts", ("planted-2100", "cora")),
    Case("node", "fedavg-dmon", "fedavg-dmon, boundary edges", NODE,
         "nothing of the first layer or the cut-edge terms (padded sums); the trained weights",
         ("planted-2100", "cora")),
    Case("node", "fedavg-dmon", "fedavg-dmon, cut edges dropped (paper)", DROPPED, "the trained weights",
         ("planted-2100", "cora")),
    Case("vertical", "kcagc", "kcagc, exact", {"partitioner": "vertical", "kcagc.mode": "exact"},
         "the products F F^T Y of its blocks (sums over parties), so the final embedding",
         ("planted-2100", "cora")),
    Case("vertical", "kcagc", "kcagc, paper protocol", {"partitioner": "vertical", "kcagc.mode": "paper"},
         "the virtual nodes' sizes and summed distances", ("planted-2100", "cora")),
    Case("edge", "fedspectral-plus", "fedspectral-plus, exact", EDGE,
         "the degree vector and the products A Y of its own blocks (sums over clients)"),
    Case("edge", "fedspectral-plus", RESTARTS_CASE,
         {**EDGE, "fedspectral-plus.n-init": KMEANS_RESTARTS},
         "the degree vector and the products A Y of its own blocks (sums over clients)", ("cora",)),
    Case("edge", "fedspectral-plus", UNREGULARISED_CASE,
         {**EDGE, "fedspectral-plus.regularise": "off"},
         "the degree vector and the products A Y of its own blocks (sums over clients)", ("cora",)),
)


def run_case(case: Case, dataset: str, seed: int) -> dict:
    """One in-process run: its scores, the reference's, agreement, rounds and bytes (or why it stopped)."""
    from app.run import run_experiment

    name, keys, _ = DATASETS[dataset]
    with tempfile.TemporaryDirectory() as out:
        try:
            result = run_experiment(case.method, name, CLIENTS, {**keys, **case.keys, "seed": seed}, out)
        except Exception as err:  # noqa: BLE001 - a case that cannot run is a finding of the benchmark
            return {"error": f"{type(err).__name__}: {str(err).splitlines()[0]}"}
    ref, comm = result["reference"], result["communication"]
    return {"acc": result["metrics"].get("acc"), "f1": result["metrics"].get("f1"),
            "reference_acc": ref.get("acc"), "reference_f1": ref.get("f1"),
            "agreement": (ref.get("agreement") or {}).get("ari"), "rounds": result["timing"]["rounds"],
            "ritz_min": min(result["metrics"].get("ritz_values") or [None], key=lambda v: v or 0.0),
            "tau": result["metrics"].get("tau"),
            "bytes": comm["bytes_up"] + comm["bytes_down"], "seconds": result["timing"]["total_s"]}


def reference_spread(case: Case, dataset: str, seed: int) -> float | None:
    """How unique the centralised answer is: agreement ARI of the method's centralised reference
    at the run's seed with the same reference at the next seed, on the same data (a method whose
    reference depends on its seed cannot agree with it more closely than this, whatever it computes)."""
    from app import registry
    from fedgraphcore.config import RunConfig
    from fedgraphcore.metrics import agreement
    from app.server_app import with_cluster_count, evaluation_data

    name, keys, _ = DATASETS[dataset]
    config = registry.validate({"strategy": case.method, "dataset": name, "num-clients": CLIENTS, **keys,
                                **case.keys, "seed": seed})
    data = evaluation_data(config)  # the run's seed draws the planted graphs: keep it for the data
    labels = []
    for reference_seed in (seed, seed + 1):
        values = {**with_cluster_count(config, data), "seed": reference_seed}
        labels.append(registry.get(case.method).strategy(RunConfig(values)).reference(data))
    return agreement(labels[0], labels[1])["ari"]


def kmeans_landscape(starts: int = LANDSCAPE_STARTS) -> dict:
    """k-means' local optima on Cora's regularised spectral embedding (the reference's, seed 0): ``starts``
    single k-means++ starts; the best and the best start of another clustering (labels ARI < 0.95 to the
    best's), the ARI between them and the share of starts that end at the best's clustering (ARI >= 0.95)."""
    from sklearn.cluster import KMeans

    from fedgraphcore.clustering import regularisation, spectral_embedding
    from fedgraphcore.data import load_dataset
    from fedgraphcore.metrics import agreement

    data = load_dataset("cora", seed=0)
    k = data.num_classes
    embedding, _ = spectral_embedding(data.adj, k, 0, regularisation(data.adj, k, "auto"))
    fits = sorted((KMeans(k, n_init=1, random_state=s).fit(embedding) for s in range(starts)), key=lambda f: f.inertia_)
    best = fits[0]
    same = [agreement(best.labels_, f.labels_)["ari"] >= 0.95 for f in fits]
    other = next(f for f, s in zip(fits, same) if not s)
    return {"starts": starts, "best_inertia": float(best.inertia_), "other_inertia": float(other.inertia_),
            "ari_between": agreement(best.labels_, other.labels_)["ari"], "share_best": sum(same) / starts}


def measure(seeds: int, only: list[str], datasets: list[str], previous: dict, labels: list[str] = ()) -> dict:
    runs = {k: v for k, v in previous.get("runs", {}).items()}
    for case in CASES:
        if (only and case.method not in only) or (labels and case.label not in labels):
            continue
        for dataset in case.datasets:
            if datasets and dataset not in datasets:
                continue
            key = f"{case.label} | {dataset}"
            runs[key] = [{"seed": seed, **run_case(case, dataset, seed),
                          "reference_self": reference_spread(case, dataset, seed)}
                         for seed in DATASETS[dataset][2][:seeds]]
            print(key, runs[key], flush=True)
    return {"measure": MEASURE, "clients": CLIENTS, "runs": runs}


def _mean(runs: list[dict], key: str, scale: float = 1.0, digits: int = 1) -> str:
    """:func:`_value` as a table cell (a case that could not run: its error)."""
    mean = _value(runs, key)
    if mean != mean:
        return next((r["error"] for r in runs if "error" in r), "-")
    return f"{scale * mean:.{digits}f}"


def _row(case: Case, dataset: str, runs: list[dict]) -> list[str]:
    return [case.label, dataset, str(len(runs)), _mean(runs, "acc", 100), _mean(runs, "reference_acc", 100),
            _mean(runs, "f1", 100), _mean(runs, "reference_f1", 100), _mean(runs, "agreement", 1, 3),
            _mean(runs, "reference_self", 1, 3), _mean(runs, "rounds", 1, 0), _mean(runs, "bytes", 1e-6, 1),
            case.learns]


HEADER = ["method", "data", "seeds", "ACC", "centralised ACC", "F1", "centralised F1", "agreement ARI",
          "centralised vs itself", "rounds", "MB moved", "what the server learns"]


def _figure(runs: dict) -> str:
    """Agreement ARI with the centralised labels, and the reference's with itself, per case."""
    import plots

    keys = [f"{c.label} | {d}" for c in CASES for d in c.datasets if f"{c.label} | {d}" in runs]
    path = plots.plot_grouped_bars([k.replace(" | ", ", ") for k in keys],
                                   {"federated vs centralised": [_value(runs[k], "agreement") for k in keys],
                                    "centralised vs itself": [_value(runs[k], "reference_self") for k in keys]},
                                   image_path("whole_graph.png"), ylabel="agreement ARI",
                                   title="Agreement with the centralised labels")
    return figure(path, "agreement ARI with the centralised labels, and the centralised reference's with itself")


def _degenerate(runs: dict) -> str:
    """What fedspectral-plus found where its labels differ from the reference's."""
    low = [(key, min(r["ritz_min"] for r in got)) for key, got in runs.items()
           if key.startswith("fedspectral-plus") and all(r.get("ritz_min") is not None for r in got)
           and _value(got, "agreement") < 0.99]
    if not low:
        return ""
    found = "; ".join(f"{key.replace(' | ', ', ')}: {value:.6f}" for key, value in low)
    return paragraph("Where fedspectral-plus' labels differ from the reference's, its eigensolver still converged "
                     f"to the top-k eigenspace: the smallest of its k Ritz values ({found}) is the top eigenvalue "
                     "1 of the normalised adjacency, which a graph with more connected components than k has "
                     "many times over. Any basis of that eigenspace is the top-k eigenvectors, and k-means on "
                     "two bases groups the components differently: spectral clustering's labels are not defined "
                     "there, centrally or not.")


#: Where the literature stands on regularised spectral clustering of Cora (the section's last paragraph).
LITERATURE = (
    "Literature: no paper in the project's library (papers/NOTES.md) gives a regularised spectral clustering "
    "figure on Cora, nor does de Lara and Bonald, Spectral embedding of regularized block models (ICLR 2020), "
    "whose real graphs are 20 Newsgroups and Wikipedia for Schools. The closest published figure is the "
    "unregularised graph-only spectral baseline ('Spectral-g') on Cora in Table 2 of Zhang et al., Attributed "
    "Graph Clustering via Adaptive Graph Convolution (IJCAI 2019).")


def _landscape(results: dict) -> str:
    """What moves the regularised reference with its seed: k-means' local optima (``--landscape``)."""
    got = results.get("kmeans_landscape")
    if not got:
        return ""
    gap = 100 * (got["other_inertia"] / got["best_inertia"] - 1)
    return paragraph(
        "Regularised, the top-7 eigenspace is unique and the federated labels are the reference's; what still moves "
        "with the seed is the last step, k-means on the embedding (`python benchmarks/whole_graph.py --landscape`: "
        f"{got['starts']} single k-means++ starts on the reference's embedding). Its best local optimum and the best "
        f"start of another clustering differ by {gap:.1f}% in inertia and their labels agree at ARI {got['ari_between']:.2f}; "
        f"{100 * got['share_best']:.0f}% of single starts reach the best, so {KMEANS_RESTARTS} restarts often miss it "
        "(the row with 10 restarts). The default `fedspectral-plus.n-init` 0, which the reference shares, takes one "
        "k-means++ start per 50 rows x clusters (380 on Cora; 10 to 1000, and at most 1e7 / (n k), so that a "
        "million rows keep 10) and reaches it from every seed run.")


def _regularised(results: dict) -> list[str]:
    """Regularised against unregularised fedspectral-plus on Cora's edge split: ACC, agreement and the
    reference's agreement with itself, per seed range."""
    runs = results["runs"]
    arms = [(c, runs[f"{c.label} | cora"]) for c in CASES if c.split == "edge" and f"{c.label} | cora" in runs]
    if len(arms) < 2:
        return []
    rows = []
    for case, got in arms:
        taus = sorted({round(r["tau"], 3) for r in got if r.get("tau") is not None})
        ok = [r for r in got if "error" not in r]
        rows.append([case.label, ", ".join(f"{t:g}" for t in taus) or "0", seed_list([r["seed"] for r in got if "seed" in r]),
                     mean_spread([r["acc"] for r in ok], 1, 100), mean_spread([r["reference_acc"] for r in ok], 1, 100),
                     f"{min(r['agreement'] for r in ok):.3f}", f"{min(r['reference_self'] for r in ok):.3f}"])
    return ["## Regularised spectral clustering on Cora", paragraph(
        "fedspectral-plus, exact mode, on Cora's edge split (4 clients, edge overlap 0.4: the whole graph's edges "
        "spread over the clients, as in the edge-split table above). Regularised (the default `regularise=auto`: "
        "Cora has more components with an edge than k = 7) with tau = the average degree: tau/N added to every "
        "entry of A and tau to every degree, on the server's product and on the centralised reference alike. "
        "ACC in %, mean ± std over the seeds; agreement ARI and centralised vs itself (the reference at seed s "
        "against seed s+1): the smallest over the seeds."),
        table(["variant", "tau", "seeds", "ACC", "centralised ACC", "agreement ARI (min)",
               "centralised vs itself (min)"], rows),
        _landscape(results),
        paragraph(LITERATURE)]


def _fedkmeans(runs: dict) -> list[str]:
    """fedkmeans' default against its reference's own spread, per seed."""
    rows = [[dataset, str(r["seed"]), f"{100 * r['acc']:.1f}", f"{100 * r['reference_acc']:.1f}",
             f"{r['agreement']:.3f}", f"{r['reference_self']:.3f}",
             "yes" if r["agreement"] >= r["reference_self"] else "no"]
            for dataset in ("planted-2100", "cora") for r in runs.get(f"{FEDKMEANS_CASE} | {dataset}", [])]
    if not rows:
        return []
    return ["## fedkmeans against its reference's own spread", paragraph(
        "fedkmeans with its defaults (filter order 4 over the whole graph, features wider than 96 first multiplied "
        "by a Gaussian projection drawn from the run's seed, 10 k-means starts advanced side by side) on the node "
        "split with boundary edges, per seed: k-means with restarts has no unique answer, so the target is the "
        "agreement the centralised reference (10 k-means++ starts on the pooled rows, the same projection and "
        "filter) has with itself at the next seed. On Cora the next seed also draws another projection of its "
        "1,433 columns, so the reference's spread there includes the projection's; planted-2100 has 16 columns "
        "and is not projected. Under the default node policy (`min-rows` 5) the row audit refuses Lloyd's late "
        "moves of one or two of a party's rows, and per seed the target is partly a draw of the starts: what the "
        "audit costs, and how the reference's own algorithm with another draw agrees with it, are measured in "
        "[fedkmeans-restarts](fedkmeans-restarts.md#the-target-and-what-the-row-audit-allows)."),
        table(["data", "seed", "ACC", "centralised ACC", "agreement ARI", "centralised vs itself", "at least"], rows)]


def _value(runs: list[dict], key: str) -> float:
    values = [r[key] for r in runs if r.get(key) is not None]
    return sum(values) / len(values) if values else float("nan")


def render(results: dict) -> Path:
    runs = results["runs"]
    sections = []
    for split, title in (("node", "Node split with boundary edges"), ("vertical", "Vertical split"),
                         ("edge", "Edge split")):
        rows = [_row(c, d, runs[f"{c.label} | {d}"]) for c in CASES if c.split == split for d in c.datasets
                if f"{c.label} | {d}" in runs]
        sections += [f"## {title}", table(HEADER, rows)]
    body = "\n\n".join([
        paragraph(f"Measured with `{MEASURE}`: {results['clients']} clients. ACC and macro-F1 in %, seed means; centralised: the method's "
                  "centralised reference (result.json `reference`) on the pooled data at the same seed; agreement "
                  "ARI: federated labels against the centralised reference's; centralised vs itself: the "
                  "reference at the run's seed against the reference at the next seed on the same data, the "
                  "closest any method can agree with a reference whose answer depends on its seed (k-means' "
                  "local optima; unregularised spectral clustering of Cora, whose 78 connected components give the "
                  "normalised adjacency's top eigenvalue multiplicity 78 > k, so that its top-k eigenvectors are not "
                  "unique: fedspectral-plus regularises there by default, last section). Rounds: message exchanges of "
                  "the protocol; MB moved: bytes up and down. planted-2100: 2,100 nodes in 7 planted blocks (p_in "
                  "0.02, p_out 0.002, 16 features 1 noise std apart), drawn at seeds 101-103, which no other benchmark "
                  "uses; planted-19717: PubMed's size (3 blocks, p_in 0.0015, p_out 0.0001, mean degree 11, features "
                  "as planted-2100), seed 201."),
        _figure(runs),
        *sections,
        _degenerate(runs),
        *_fedkmeans(runs),
        *_regularised(results),
    ])
    _scoreboard(runs)
    return write_page("whole-graph", "The clustering the whole graph gives, on every split", body,
                      "python benchmarks/whole_graph.py --report")


def _scoreboard(runs: dict) -> None:
    """One row per case that should reach the centralised result: the target is the labels (agreement
    ARI >= 0.99), or for a trained model (fedavg-dmon) ACC and F1 within 2 points."""
    rows = []
    for case in CASES:
        if "paper" in case.label or "dropped" in case.label or case.label in (UNREGULARISED_CASE, RESTARTS_CASE):
            continue  # comparison arms: their own pages or sections carry them
        for dataset in case.datasets:
            got = runs.get(f"{case.label} | {dataset}") or []
            if _value(got, "agreement") != _value(got, "agreement"):  # no run gave an agreement
                continue
            score = {"fedavg-dmon": _scores_gap, "fedkmeans": _spread_reached}.get(case.method, _labels_reached)
            metric, ours, reference, met, why = score(got)
            section = case.split + "-split" + ("-with-boundary-edges" if case.split == "node" else "")
            if case.label == REGULARISED_CASE and dataset == "cora":  # the regularised target: a unique reference too
                section = "regularised-spectral-clustering-on-cora"
                itself = min(r["reference_self"] for r in got)
                met = met and itself >= 0.95
                unregularised = runs.get(f"{UNREGULARISED_CASE} | cora") or []
                why += (f"; the reference agrees with itself at >= {itself:.3f} (target 0.95); ACC "
                        f"{_mean(got, 'acc', 100)} % (unregularised {_mean(unregularised, 'acc', 100)} %), "
                        f"seeds {seed_list([r['seed'] for r in got])}")
            rows.append(ScoreRow(case.label, dataset, metric, "-", ours, reference, _mean(got, "seconds", 1, 1) + " s",
                                 _mean(got, "bytes", 1e-6, 1) + " MB", "-", "met" if met else "not met",
                                 f"{case.split} split: {why}", "whole-graph", section))
    write_scoreboard_rows("whole-graph", rows)


def _labels_reached(got: list[dict]) -> tuple[str, str, str, bool, str]:
    """Scoreboard cells of a case whose target is the centralised labels: metric, ours, centralised, met, why."""
    mean, itself = _value(got, "agreement"), _mean(got, "reference_self", 1, 3)
    why = ("the centralised labels reached" if mean >= 0.99 else f"the centralised labels not reached (ARI "
           f"{mean:.3f} < 0.99; the centralised reference agrees with itself at the next seed at {itself})")
    return "agreement ARI vs centralised", f"{mean:.3f}", f"{itself} (itself at the next seed)", mean >= 0.99, why


def _spread_reached(got: list[dict]) -> tuple[str, str, str, bool, str]:
    """Scoreboard cells of k-means with restarts, whose reference moves with its seed: the target is the
    agreement the reference has with itself at the next seed, at every seed."""
    short = [r["seed"] for r in got if r["agreement"] < r["reference_self"]]
    why = ("agreement with the reference at least the reference's with itself at the next seed, at every seed"
           if not short else f"agreement below the reference's with itself at seed {', '.join(map(str, short))}")
    return ("agreement ARI vs centralised", _mean(got, "agreement", 1, 3),
            f"{_mean(got, 'reference_self', 1, 3)} (itself at the next seed)", not short, why)


def _scores_gap(got: list[dict]) -> tuple[str, str, str, bool, str]:
    """Scoreboard cells of a trained model's case: its ACC and F1 against centralised training's."""
    acc = 100 * (_value(got, "acc") - _value(got, "reference_acc"))
    f1 = 100 * (_value(got, "f1") - _value(got, "reference_f1"))
    met = abs(acc) <= 2 and abs(f1) <= 2
    reference = f"{_mean(got, 'reference_acc', 100)}, {_mean(got, 'reference_f1', 100)} (ACC, F1)"
    return ("ACC, F1 - centralised (points)", f"{acc:+.1f}, {f1:+.1f}", reference, met,
            f"ACC and F1 {'within' if met else 'not within'} 2 points of centralised DMoN's")


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python benchmarks/whole_graph.py", description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--only", nargs="*", default=[], help="methods to run (default: all)")
    parser.add_argument("--datasets", nargs="*", default=[], help="datasets to run (default: all)")
    parser.add_argument("--cases", nargs="*", default=[], help="case labels to run (default: all)")
    parser.add_argument("--landscape", action="store_true",
                        help="only measure k-means' local optima on Cora's regularised embedding (into the JSON)")
    parser.add_argument("--report", action="store_true", help="only render the page from the JSON")
    args = parser.parse_args(argv)
    known = {d for c in CASES for d in c.datasets}
    methods = {c.method for c in CASES}
    labels = {c.label for c in CASES}
    unknown = ([d for d in args.datasets if d not in known] + [m for m in args.only if m not in methods]
               + [c for c in args.cases if c not in labels])
    if unknown:  # a name that selects nothing would run nothing and still exit 0
        print(f"error: {unknown[0]!r} is none of this benchmark's datasets ({', '.join(sorted(known))}), methods "
              f"({', '.join(sorted(methods))}) or cases ({'; '.join(sorted(labels))}); valid: those names; your own "
              "data: python -m app.run compare --dataset PATH", file=sys.stderr)
        return 2
    path = RESULTS_DIR / RESULTS  # the committed JSON (a report into another directory still reads it)
    if args.report:
        if not path.is_file():
            raise SystemExit(f"error: {path} is missing; measure it first: `{MEASURE}`")
        results = json.loads(path.read_text())
    elif args.landscape:
        results = {**json.loads(path.read_text()), "kmeans_landscape": kmeans_landscape()}
        path.write_text(json.dumps(results, indent=1) + "\n")
    else:
        previous = json.loads(path.read_text()) if path.exists() else {}
        results = {**previous, **measure(args.seeds, args.only, args.datasets, previous, args.cases)}
        path.write_text(json.dumps(results, indent=1) + "\n")
    print(render(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
