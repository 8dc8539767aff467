"""How much a fedkmeans result depends on its seed, by number of k-means starts.

    python benchmarks/fedkmeans_restarts.py [--restarts R ...] [--seeds N] [--datasets NAME ...] [--report]

Runs fedkmeans in-process, node split over 4 parties, at seeds 0..N-1 for each number of starts
``fedkmeans.restarts`` (the federated starts and the centralised reference's ``n_init``), on data the
other benchmarks do not tune to: Cora (features unfiltered: filter order 0) and a planted
partition of 2,100 nodes in 7 blocks (filter order 4 over the whole graph; the seed draws the graph).
Per setting it reports min / median / max over the seeds of ACC, NMI and ARI against the ground truth,
the agreement ARI with the centralised reference at the same seed, and the bytes moved.
Writes benchmarks/results/fedkmeans_restarts.json and docs/results/fedkmeans-restarts.md.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fedgraphcore.config import ArgumentParser  # noqa: E402
from pages import RESULTS_DIR, paragraph, table, write_page  # noqa: E402

MEASURE = "python benchmarks/fedkmeans_restarts.py --seeds 5"
RESULTS = "fedkmeans_restarts.json"
CLIENTS = 4
NODE = {"partitioner": "node-random"}
#: (dataset, its keys): held-out data, split by nodes with boundary edges
DATASETS = {
    "cora": ("cora", {**NODE, "fedkmeans.filter-order": 0}),
    "planted-2100": ("sbm", {**NODE, "sbm.nodes": 2100, "sbm.blocks": 7, "sbm.p-in": 0.02, "sbm.p-out": 0.002,
                             "sbm.signal": 1.0, "fedkmeans.filter-order": 4}),
}
SCORES = ("acc", "nmi", "ari", "agreement")


def run(dataset: str, restarts: int, seed: int) -> dict:
    """One in-process run's scores against the truth and the reference, and its traffic."""
    from app.run import run_experiment

    name, keys = DATASETS[dataset]
    with tempfile.TemporaryDirectory() as out:
        result = run_experiment("fedkmeans", name, CLIENTS, {**keys, "fedkmeans.restarts": restarts, "seed": seed},
                                out)
    metrics, comm = result["metrics"], result["communication"]
    return {"seed": seed, "acc": metrics["acc"], "nmi": metrics["nmi"], "ari": metrics["ari"],
            "agreement": result["reference"]["agreement"]["ari"], "rounds": result["timing"]["rounds"],
            "bytes": comm["bytes_up"] + comm["bytes_down"]}


def measure(restarts: list[int], seeds: int, datasets: list[str], previous: dict) -> dict:
    runs = dict(previous.get("runs", {}))
    for dataset in datasets or DATASETS:
        for r in restarts:
            runs[f"{dataset} | {r}"] = [run(dataset, r, seed) for seed in range(seeds)]
            print(dataset, r, runs[f"{dataset} | {r}"], flush=True)
    return {"measure": MEASURE, "clients": CLIENTS, "runs": runs}


def _spread(values: list[float]) -> str:
    ordered = sorted(values)
    return f"{ordered[0]:.3f} / {ordered[len(ordered) // 2]:.3f} / {ordered[-1]:.3f}"


def _default() -> int:
    """``fedkmeans.restarts``' default."""
    from dataclasses import fields

    from fedgraphcore.protocols.fedkmeans import FedKMeansConfig

    return next(f.default for f in fields(FedKMeansConfig) if f.name == "restarts")


def _order(key: str) -> tuple[int, int]:
    """Rows by dataset (as listed), then by number of starts."""
    dataset, restarts = key.split(" | ")
    return list(DATASETS).index(dataset), int(restarts)


def render(results: dict) -> Path:
    rows = []
    for key, runs in sorted(results["runs"].items(), key=lambda item: _order(item[0])):
        dataset, restarts = key.split(" | ")
        rows.append([dataset, restarts, *(_spread([r[s] for r in runs]) for s in SCORES),
                     f"{sum(r['bytes'] for r in runs) / len(runs) / 1e6:.1f}"])
    seeds = len(next(iter(results["runs"].values())))
    body = "\n\n".join([
        paragraph(f"fedkmeans, node split over {results['clients']} parties, seeds 0-{seeds - 1}: min / median / max "
                  "over the seeds of each score. restarts: `fedkmeans.restarts`, the k-means starts advanced side "
                  "by side in the same messages (the least summed inertia wins) and the centralised reference's "
                  "`n_init`. agreement: ARI with the centralised reference at the same seed. Cora: features "
                  "unfiltered; planted-2100: 2,100 nodes in 7 blocks (p_in 0.02, p_out 0.002), filter order 4 over "
                  "the whole graph, the seed drawing the graph. MB: bytes up and down per run."),
        table(["data", "restarts", "ACC", "NMI", "ARI", "agreement", "MB"], rows),
        paragraph(f"The default is {_default()} starts, scikit-learn's `n_init`. With one client the labels are "
                  "the centralised k-means' with as many restarts (each client's local seeds are its best of "
                  "that many k-means++ runs; `tests/test_app.py`). Each start still moving adds one start's "
                  "statistics to a round's messages, so the Lloyd rounds move up to that many times the bytes "
                  "of one start.")])
    return write_page("fedkmeans-restarts", "fedkmeans: spread across seeds by number of k-means starts", body,
                      MEASURE)


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python benchmarks/fedkmeans_restarts.py", description=__doc__.splitlines()[0])
    parser.add_argument("--restarts", type=int, nargs="+", default=[1, 3, 10])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--datasets", nargs="*", choices=sorted(DATASETS), default=[], help="default: all")
    parser.add_argument("--report", action="store_true", help="only render the page from the JSON")
    args = parser.parse_args(argv)
    path = RESULTS_DIR / RESULTS
    if args.report:
        if not path.is_file():
            raise SystemExit(f"error: {path} is missing; measure it first: `{MEASURE}`")
        results = json.loads(path.read_text())
    else:
        previous = json.loads(path.read_text()) if path.exists() else {}
        results = measure(args.restarts, args.seeds, args.datasets, previous)
        path.write_text(json.dumps(results, indent=1) + "\n")
    print(render(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
