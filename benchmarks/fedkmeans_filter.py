"""What fedkmeans' default graph filter (with its shared projection) buys and costs.

    python benchmarks/fedkmeans_filter.py [--seeds N] [--datasets NAME ...] [--centralised] [--report]

Runs fedkmeans in-process, node split over 4 parties with boundary edges, at seeds 0..N-1, with its
defaults (filter order 4 over the whole graph on the features projected to ``fedkmeans.dims``
columns) and with the features alone (``fedkmeans.filter-order=0``), on Cora and on CiteSeer (which
no benchmark tunes to). Per run: ACC and NMI against the ground truth, the agreement ARI with the
centralised reference at the same seed, and the bytes moved up and down. Also what the projection
alone costs: centralised k-means (10 starts) on the filtered features, all f columns against the
projected ones. Adds its runs to
benchmarks/results/fedkmeans_filter.json and writes docs/results/fedkmeans-filter.md.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fedgraphcore.config import ArgumentParser  # noqa: E402
from pages import RESULTS_DIR, ScoreRow, paragraph, table, write_page, write_scoreboard_rows  # noqa: E402

MEASURE = "python benchmarks/fedkmeans_filter.py"
RESULTS = "fedkmeans_filter.json"
CLIENTS = 4
DEFAULT = "default (filter 4, 96 projected columns)"
SETTINGS = {DEFAULT: {}, "filter-order 0": {"fedkmeans.filter-order": 0}}
#: the issue's budget for the default's traffic on Cora, and what it must beat
TARGET_MB = 60.0


def run(dataset: str, keys: dict, seed: int) -> dict:
    """One in-process run's scores against the truth and the reference, and its traffic."""
    from app.run import run_experiment

    with tempfile.TemporaryDirectory() as out:
        result = run_experiment("fedkmeans", dataset, CLIENTS, {"partitioner": "node-random", **keys, "seed": seed},
                                out)
    metrics, comm = result["metrics"], result["communication"]
    return {"seed": seed, "acc": metrics["acc"], "nmi": metrics["nmi"],
            "agreement": result["reference"]["agreement"]["ari"], "mb": (comm["bytes_up"] + comm["bytes_down"]) / 1e6}


def centralised(dataset: str, seed: int) -> dict:
    """ACC of centralised k-means (10 starts) on the features filtered 4 times: all f columns, and
    first projected to the default ``fedkmeans.dims`` (the shared projection of ``seed``)."""
    import numpy as np

    from fedgraphcore.clustering import kmeans
    from fedgraphcore.data import load_dataset
    from fedgraphcore.metrics import accuracy
    from fedgraphcore.protocols import fedkmeans

    data = load_dataset(dataset, seed=seed)
    k, acc = int(np.max(data.y)) + 1, {}
    for name, dims in (("all columns", 0), ("projected", fedkmeans.FedKMeansConfig().dims)):
        rows = fedkmeans.local_features(data.x, data.adj, fedkmeans.FedKMeansConfig(dims=dims), seed)
        acc[name] = accuracy(data.y, kmeans(rows, k, seed=seed, n_init=10))
    return {"seed": seed, **acc}


def _mean(runs: list[dict], score: str) -> float:
    return sum(r[score] for r in runs) / len(runs)


def rows(runs: dict) -> list[list[str]]:
    out = []
    for key, seeds in runs.items():
        dataset, setting = key.split(" | ")
        out.append([dataset, setting, ", ".join(f"{r['acc']:.3f}" for r in seeds), f"{_mean(seeds, 'acc'):.3f}",
                    f"{_mean(seeds, 'nmi'):.3f}", ", ".join(f"{r['agreement']:.3f}" for r in seeds),
                    f"{_mean(seeds, 'mb'):.1f}"])
    return out


def score_rows(results: dict) -> list[ScoreRow]:
    """The scoreboard's row: the default's ACC on Cora, beside the centralised k-means on the same rows,
    against filter-order 0's within the traffic budget."""
    ours, plain = results["runs"][f"cora | {DEFAULT}"], results["runs"]["cora | filter-order 0"]
    acc, mb, unfiltered = _mean(ours, "acc"), _mean(ours, "mb"), _mean(plain, "acc")
    reference = _mean(results["centralised"]["cora"], "projected")
    met = acc > unfiltered and mb <= TARGET_MB
    return [ScoreRow(method="fedkmeans, default filter", dataset="cora, 4 parties", metric="ACC %", paper="-",
                     ours=f"{100 * acc:.2f}", reference=f"{100 * reference:.2f}", time="-", traffic=f"{mb:.1f} MB",
                     epsilon="none (no noise)", verdict="met" if met else "not met",
                     why=f"ACC above filter-order 0's ({100 * unfiltered:.2f}) at <= {TARGET_MB:.0f} MB",
                     page="fedkmeans-filter")]


def render(results: dict) -> Path:
    runs = results["runs"]
    seeds = len(next(iter(runs.values())))
    body = "\n\n".join([
        paragraph(f"fedkmeans, node split over {results['clients']} parties with boundary edges (in-process), seeds "
                  f"0-{seeds - 1}. default: `fedkmeans.filter-order` 4 over the whole graph on the features times "
                  "a Gaussian projection to `fedkmeans.dims` 96 columns every party draws from the run's seed; "
                  "filter-order 0: the features alone. agreement: ARI with the centralised reference at the same "
                  "seed (which filters, or not, as the run does). MB: bytes up and down per run. CiteSeer is data no default was chosen on."),
        table(["data", "fedkmeans", "ACC per seed", "ACC", "NMI", "agreement per seed", "MB"], rows(runs)),
        paragraph("What the projection alone costs: centralised k-means (10 starts) on the features filtered 4 "
                  "times, all f columns against the 96 projected ones, mean ACC over the same seeds."),
        table(["data", "all f columns", "96 projected columns"],
              [[name, *(f"{_mean(seeds, column):.3f}" for column in ("all columns", "projected"))]
               for name, seeds in results.get("centralised", {}).items()]),
        paragraph("What the filter costs: the three linking steps and one padded secure sum per hop, each moving "
                  "(parties + 1) x N x 96 x 8 bytes (Cora: about 10 MB a hop), and filter-order + 4 more rounds "
                  "before the first Lloyd step. The Lloyd rounds then move the 10 starts' 96-wide sums instead of "
                  "f-wide ones, which saves more than the hops cost: the default moves less than filter-order 0 on "
                  "both graphs. Without the projection the four hops move about 627 MB on Cora. The projection "
                  "costs accuracy where 96 random directions keep less of the features' structure than all f "
                  "(CiteSeer, in the table above); the filter still gains more than that over the features alone.")])
    return write_page("fedkmeans-filter", "fedkmeans: the default graph filter against the features alone", body,
                      MEASURE)


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python benchmarks/fedkmeans_filter.py", description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--datasets", nargs="+", default=["cora", "citeseer"])
    parser.add_argument("--report", action="store_true", help="only render the page from the JSON")
    parser.add_argument("--centralised", action="store_true", help="only the centralised check of the projection")
    args = parser.parse_args(argv)
    path = RESULTS_DIR / RESULTS
    results = json.loads(path.read_text()) if path.exists() else {"clients": CLIENTS, "runs": {}}
    if args.report and not results["runs"]:
        raise SystemExit(f"error: {path} is missing; measure it first: `{MEASURE}`")
    for dataset in [] if args.report else args.datasets:
        results.setdefault("centralised", {})[dataset] = [centralised(dataset, seed) for seed in range(args.seeds)]
        for setting, keys in {} if args.centralised else SETTINGS.items():
            results["runs"][f"{dataset} | {setting}"] = [run(dataset, keys, seed) for seed in range(args.seeds)]
            print(dataset, setting, results["runs"][f"{dataset} | {setting}"], flush=True)
        path.write_text(json.dumps(results, indent=1) + "\n")
    print(render(results))
    if "cora | filter-order 0" in results["runs"] and "cora" in results.get("centralised", {}):
        write_scoreboard_rows("fedkmeans-filter", score_rows(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
