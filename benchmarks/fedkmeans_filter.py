"""What fedkmeans' default graph filter (with its shared projection) buys and costs.

    python benchmarks/fedkmeans_filter.py [--seeds N] [--datasets NAME ...]

Runs fedkmeans in-process, node split over 4 parties with boundary edges, at seeds 0..N-1, with its
defaults (filter order 4 over the whole graph on the features projected to ``fedkmeans.dims``
columns) and with the features alone (``fedkmeans.filter-order=0``), on Cora and on CiteSeer (which
no benchmark tunes to). Per run: ACC and NMI against the ground truth, the agreement ARI with the
centralised reference at the same seed, and the bytes moved up and down. Adds its runs to
benchmarks/results/fedkmeans_filter.json and prints the table of all of them.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.config import ArgumentParser  # noqa: E402
from pages import RESULTS_DIR, table  # noqa: E402

CLIENTS = 4
SETTINGS = {"default (filter 4, 96 projected columns)": {}, "filter-order 0": {"fedkmeans.filter-order": 0}}


def run(dataset: str, keys: dict, seed: int) -> dict:
    """One in-process run's scores against the truth and the reference, and its traffic."""
    from app.run import run_experiment

    with tempfile.TemporaryDirectory() as out:
        result = run_experiment("fedkmeans", dataset, CLIENTS, {"partitioner": "node-random", **keys, "seed": seed},
                                out)
    metrics, comm = result["metrics"], result["communication"]
    return {"seed": seed, "acc": metrics["acc"], "nmi": metrics["nmi"],
            "agreement": result["reference"]["agreement"]["ari"], "mb": (comm["bytes_up"] + comm["bytes_down"]) / 1e6}


def rows(runs: dict) -> list[list[str]]:
    out = []
    for key, seeds in runs.items():
        dataset, setting = key.split(" | ")
        mean = {s: sum(r[s] for r in seeds) / len(seeds) for s in ("acc", "nmi", "agreement", "mb")}
        out.append([dataset, setting, ", ".join(f"{r['acc']:.3f}" for r in seeds), f"{mean['acc']:.3f}",
                    f"{mean['nmi']:.3f}", ", ".join(f"{r['agreement']:.3f}" for r in seeds), f"{mean['mb']:.1f}"])
    return out


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python benchmarks/fedkmeans_filter.py", description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--datasets", nargs="+", default=["cora", "citeseer"])
    args = parser.parse_args(argv)
    path = RESULTS_DIR / "fedkmeans_filter.json"
    runs = json.loads(path.read_text())["runs"] if path.exists() else {}
    for dataset in args.datasets:
        for setting, keys in SETTINGS.items():
            runs[f"{dataset} | {setting}"] = [run(dataset, keys, seed) for seed in range(args.seeds)]
            print(dataset, setting, runs[f"{dataset} | {setting}"], flush=True)
    path.write_text(json.dumps({"clients": CLIENTS, "runs": runs}, indent=1) + "\n")
    print(table(["data", "fedkmeans", "ACC per seed", "ACC", "NMI", "agreement per seed", "MB"], rows(runs)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
