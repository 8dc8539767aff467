"""The node-policy default ``min-rows`` on fedkmeans: 5 (its default) against 1 (plain Lloyd).

    python benchmarks/min_rows.py [--seeds N] [--report]

With ``min-rows`` m, every hello centre is the mean of at least m of a node's rows and a Lloyd
cluster holding fewer of its rows (but some) is withheld from the sums. This runs fedkmeans
in-process on data the other benchmarks do not tune to (karate, Cora, CiteSeer: real graphs
with clusters of very unequal sizes), 4 and 10 clients, unfiltered and AGC-filtered 4 times,
under every node's ``privacy.all.min-rows`` 1 and 5, and reports ACC and the rows withheld.
Writes benchmarks/results/min_rows.json and docs/results/min-rows.md (``--report``: only the
page, from the JSON).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fedgraphcore.config import ArgumentParser, ConfigError  # noqa: E402
from pages import RESULTS_DIR, paragraph, read_results, table, write_page  # noqa: E402

MEASURE = "python benchmarks/min_rows.py --seeds 2"
RESULTS = "min_rows.json"
DATASETS = ("karate", "cora", "citeseer")
CLIENTS = (4, 10)
FILTER_ORDERS = (0, 4)
MIN_ROWS = (1, 5)


def run_case(dataset: str, clients: int, order: int, min_rows: int, seed: int) -> dict:
    """One in-process fedkmeans run; its ACC, the rows withheld over its rounds, or why it stopped."""
    from app.run import run_experiment
    from fedgraphcore.session import PrivacyRefused

    nodes = [{"partition-id": i, "num-partitions": clients, "privacy.all.min-rows": min_rows}
             for i in range(clients)]
    with tempfile.TemporaryDirectory() as out:
        try:
            result = run_experiment("fedkmeans", dataset, clients, {"fedkmeans.filter-order": order, "seed": seed},
                                    out, node_configs=nodes)
        except (PrivacyRefused, ConfigError) as err:
            return {"refused": str(err).splitlines()[0]}
    return {"acc": result["metrics"]["acc"], "reference_acc": result["reference"]["acc"],
            "withheld": sum(h.get("withheld", 0) for h in result["history"]), "rounds": len(result["history"])}


def measure(seeds: int) -> dict:
    cases = []
    for dataset in DATASETS:
        for clients in CLIENTS:
            for order in FILTER_ORDERS:
                for min_rows in MIN_ROWS:
                    runs = [run_case(dataset, clients, order, min_rows, seed) for seed in range(seeds)]
                    cases.append({"dataset": dataset, "clients": clients, "filter_order": order,
                                  "min_rows": min_rows, "runs": runs})
                    print(dataset, clients, order, min_rows, runs, flush=True)
    return {"measure": MEASURE, "seeds": seeds, "cases": cases}


def _mean(runs: list[dict], key: str, scale: float = 1.0, digits: int = 1) -> str:
    values = [r[key] for r in runs if key in r]
    if len(values) < len(runs):
        return "refused (`min-rows`)"
    return f"{scale * sum(values) / len(values):.{digits}f}"


def render(results: dict) -> Path:
    by_key = {(c["dataset"], c["clients"], c["filter_order"], c["min_rows"]): c["runs"] for c in results["cases"]}
    rows, gaps = [], []
    for dataset, clients, order in sorted({k[:3] for k in by_key}):
        plain, default = by_key[(dataset, clients, order, 1)], by_key[(dataset, clients, order, 5)]
        rows.append([dataset, clients, order, _mean(plain, "acc", 100), _mean(default, "acc", 100),
                     _mean(plain, "rounds"), _mean(default, "rounds"), _mean(default, "withheld")])
        if all("acc" in r for r in plain + default):
            gaps.append(sum(r["acc"] for r in default) / len(default) - sum(r["acc"] for r in plain) / len(plain))
    body = "\n\n".join([
        paragraph(f"fedkmeans ACC (%, mean over {results['seeds']} seeds) with every node's `min-rows` 1 (plain "
                  "Lloyd, local k-means++ centres) and 5 (the default: hello centres of at least 5 of a node's "
                  "rows; a new assignment only when its sums, with every sum the node sent before, determine "
                  "none of its rows, else a row that alone would change cluster stays in its last one). Rounds: "
                  "Lloyd rounds until no centre moved (at most 20). Withheld: rows left out of the sums, added up "
                  "over a run's rounds and clients."),
        table(["dataset", "clients", "filter order", "ACC, min-rows 1", "ACC, min-rows 5", "rounds, 1", "rounds, 5",
               "withheld rows, 5"], rows),
        paragraph(f"Over the {len(gaps)} settings both ran, `min-rows` 5 changes ACC by "
                  f"{100 * sum(gaps) / len(gaps):+.1f} points on average (from {100 * min(gaps):+.1f} to "
                  f"{100 * max(gaps):+.1f}); runs stop earlier, when every node keeps its last statistics. A node "
                  "with fewer than 5 rows (karate over 10 clients) refuses."),
    ])
    return write_page("min-rows", "fedkmeans under the node policy's min-rows", body, MEASURE)


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python benchmarks/min_rows.py", description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--report", action="store_true", help="only render the page from the JSON")
    args = parser.parse_args(argv)
    if args.report:
        results = read_results(RESULTS, MEASURE)
    else:
        results = measure(args.seeds)
        (RESULTS_DIR / RESULTS).write_text(json.dumps(results, indent=1) + "\n")
    print(render(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
