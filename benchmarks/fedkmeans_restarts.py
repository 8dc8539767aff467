"""How much a fedkmeans result depends on its seed, by number of k-means starts.

    python benchmarks/fedkmeans_restarts.py [--restarts R ...] [--seeds N] [--datasets NAME ...] [--report]
    python benchmarks/fedkmeans_restarts.py --bound [--seeds N] [--datasets NAME ...]

Runs fedkmeans in-process, node split over 4 parties, at seeds 0..N-1 for each number of starts
``fedkmeans.restarts`` (the federated starts and the centralised reference's ``n_init``), on data the
other benchmarks do not tune to: Cora (features unfiltered: filter order 0) and a planted
partition of 2,100 nodes in 7 blocks (filter order 4 over the whole graph; the seed draws the graph).
Per setting it reports min / median / max over the seeds of ACC, NMI and ARI against the ground truth,
the agreement ARI with the centralised reference at the same seed, and the bytes moved.
``--bound`` measures, per seed, the target against what the node policy's row audit allows: the
default run's agreement beside the reference's agreement with itself at the next seed, the same run
where every node sets ``min-rows`` 1 and Lloyd runs to convergence, and Lloyd with the protocol's own
client functions from 10 k-means++ starts on the pooled rows (the reference's kind of start), audited
(``min-rows`` 5) and not.
Writes benchmarks/results/fedkmeans_restarts.json and docs/results/fedkmeans-restarts.md.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from fedgraphcore.config import ArgumentParser  # noqa: E402
from pages import RESULTS_DIR, paragraph, table, write_page  # noqa: E402

MEASURE = "python benchmarks/fedkmeans_restarts.py --seeds 5"
MEASURE_BOUND = "python benchmarks/fedkmeans_restarts.py --bound --seeds 3"
RESULTS = "fedkmeans_restarts.json"
CLIENTS = 4
NODE = {"partitioner": "node-random"}
#: (dataset, its keys): held-out data, split by nodes with boundary edges
DATASETS = {
    "cora": ("cora", {**NODE, "fedkmeans.filter-order": 0}),
    "planted-2100": ("sbm", {**NODE, "sbm.nodes": 2100, "sbm.blocks": 7, "sbm.p-in": 0.02, "sbm.p-out": 0.002,
                             "sbm.signal": 1.0, "fedkmeans.filter-order": 4}),
}
#: ``--bound``: the data of the target, each with fedkmeans' defaults (Cora: filter order 4 on 96 projected columns)
BOUND = {"planted-2100": DATASETS["planted-2100"], "cora": ("cora", NODE)}
SCORES = ("acc", "nmi", "ari", "agreement")
#: Lloyd steps where a run goes to convergence (scikit-learn's max_iter)
CONVERGED_ROUNDS = 300
#: the node policy's default min-rows (fedgraphcore.privacy.policy)
AUDITED_MIN_ROWS = 5


def run(dataset: str, restarts: int, seed: int, min_rows: int | None = None, rounds: int | None = None,
        data: dict = DATASETS) -> dict:
    """One in-process run's scores against the truth and the reference, and its traffic (``min_rows``:
    every node's policy sets it; ``rounds``: num-rounds; ``data``: where ``dataset`` is)."""
    from app.run import run_experiment

    name, keys = data[dataset]
    nodes = None if min_rows is None else [{"partition-id": i, "num-partitions": CLIENTS,
                                            "privacy.fedkmeans.min-rows": min_rows} for i in range(CLIENTS)]
    with tempfile.TemporaryDirectory() as out:
        result = run_experiment("fedkmeans", name, CLIENTS, {**keys, "fedkmeans.restarts": restarts, "seed": seed,
                                                             **({"num-rounds": rounds} if rounds else {})},
                                out, node_configs=nodes)
    metrics, comm = result["metrics"], result["communication"]
    return {"seed": seed, "acc": metrics["acc"], "nmi": metrics["nmi"], "ari": metrics["ari"],
            "agreement": result["reference"]["agreement"]["ari"], "rounds": result["timing"]["rounds"],
            "bytes": comm["bytes_up"] + comm["bytes_down"]}


def pooled(dataset: str, seed: int) -> tuple:
    """The run's rows as the centralised reference sees them (projected, filtered), the rows of each
    party under the run's node split, k, and the reference's labels at ``seed`` and ``seed + 1``."""
    from app import registry
    from app.server_app import evaluation_data, with_cluster_count
    from fedgraphcore.config import RunConfig
    from fedgraphcore.data.partition import partition
    from fedgraphcore.protocols.fedkmeans import local_features

    name, keys = BOUND[dataset]
    config = registry.validate({"strategy": "fedkmeans", "dataset": name, "num-clients": CLIENTS, **keys, "seed": seed})
    data = evaluation_data(config)
    strategy = registry.get("fedkmeans").strategy(RunConfig(with_cluster_count(config, data)))
    x = local_features(data.x, data.adj, strategy.cfg, seed, strategy.cfg.filter_order)
    parties = [x[shard.node_ids] for shard in partition(data, "node-random", CLIENTS, seed=seed)]
    references = [registry.get("fedkmeans").strategy(RunConfig({**with_cluster_count(config, data), "seed": s}))
                  .reference(data) for s in (seed, seed + 1)]
    return x, parties, data.num_classes, references


def lloyd_from_row_starts(x, parties: list, k: int, seed: int, min_rows: int, restarts: int = 10) -> tuple:
    """Federated Lloyd with the clients' own functions (local seeds and their audit, audited
    statistics, the best start, the final centres) from ``restarts`` k-means++ starts on the pooled
    rows ``x``, up to :data:`CONVERGED_ROUNDS` steps: the labels of every row and the steps taken."""
    from sklearn.cluster import kmeans_plusplus

    from fedgraphcore.protocols import fedkmeans as fk

    audits = []
    for rows in parties:
        labels = fk.local_seeds(rows, k, seed, min_rows, restarts)[2]
        audits.append(fk.StartAudits.starting(fk.Audit.of_seeds(labels, k, min_rows).basis, restarts, k)
                      if min_rows > 1 else None)
    centres = np.stack([kmeans_plusplus(x, k, random_state=int(np.random.SeedSequence([seed, r]).generate_state(1)[0]))[0]
                        for r in range(restarts)])
    running, last, stats = np.arange(restarts), centres.copy(), np.zeros((restarts, centres[0].size + k + 2))
    for step in range(1, CONVERGED_ROUNDS + 1):
        total = 0
        for p, rows in enumerate(parties):
            sent, _, audits[p] = fk.start_statistics(rows, centres[running], running, min_rows, audits[p])
            total = total + sent
        last[running], stats[running] = centres[running], total
        new = np.stack([fk.update_centres(centres[s], *fk.split_statistics(t, k)[:2]) for s, t in zip(running, total)])
        moved = np.abs(new - centres[running]).max(axis=(1, 2))
        centres[running], running = new, running[moved > 1e-6]
        if not len(running):
            break
    best = fk.best_start(stats, k)
    return fk.assign(x, fk.final_centres(last[best], 0, stats[best]))[0], step


def bound(dataset: str, seed: int) -> dict:
    """One seed of ``--bound``: the default run, the reference's agreement with itself, the run with
    every node at min-rows 1 to convergence, and Lloyd from row starts audited and not."""
    from fedgraphcore.metrics import agreement

    x, parties, k, (reference, following) = pooled(dataset, seed)
    got = {"seed": seed, "default": run(dataset, _default(), seed, data=BOUND),
           "reference_self": agreement(reference, following)["ari"],
           "unaudited": run(dataset, _default(), seed, min_rows=1, rounds=CONVERGED_ROUNDS, data=BOUND)}
    for arm, min_rows in (("row_starts_audited", AUDITED_MIN_ROWS), ("row_starts_unaudited", 1)):
        labels, steps = lloyd_from_row_starts(x, parties, k, seed, min_rows)
        got[arm] = {"agreement": agreement(labels, reference)["ari"], "rounds": steps}
    return got


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
    body = "\n\n".join([body, *_bound_section(results.get("bound") or {})])
    return write_page("fedkmeans-restarts", "fedkmeans: spread across seeds by number of k-means starts", body,
                      MEASURE)


def _bound_section(bound: dict) -> list[str]:
    """``--bound``: per seed, the default's agreement against the reference's own spread, and what the
    row audit allows (Lloyd from row starts, audited and not; the run with every node at min-rows 1)."""
    rows = [[dataset, str(r["seed"]), f"{r['default']['agreement']:.3f}", f"{r['reference_self']:.3f}",
             "yes" if r["default"]["agreement"] >= r["reference_self"] else "no",
             f"{r['unaudited']['agreement']:.3f}", f"{r['row_starts_audited']['agreement']:.3f} "
             f"({r['row_starts_audited']['rounds']})", f"{r['row_starts_unaudited']['agreement']:.3f} "
             f"({r['row_starts_unaudited']['rounds']})"]
            for dataset in BOUND for r in bound.get(dataset, [])]
    if not rows:
        return []
    return ["## The target and what the row audit allows", paragraph(
        f"Measured with `{MEASURE_BOUND}`: fedkmeans' defaults (Cora too: filter order 4 on 96 projected "
        "columns), node split over 4 parties. Per seed: the default run's agreement ARI with the centralised "
        "reference, and the reference's with itself at the next seed (k-means with restarts has no unique "
        "answer; the target is agreement at least this). min-rows 1: the same run where every node's policy "
        f"sets `min-rows` 1 (plain Lloyd, no row audit) and `num-rounds` {CONVERGED_ROUNDS}, so that Lloyd runs "
        "to convergence. Row starts: Lloyd with the clients' own functions (local seeds and their audit, the "
        "audited statistics, the best start, the final centres) over the run's node split, from 10 k-means++ "
        "starts drawn on the pooled rows, as the reference draws its own (its algorithm with another draw), "
        f"with the default `min-rows` {AUDITED_MIN_ROWS} and with 1, to convergence (Lloyd steps in brackets)."),
        table(["data", "seed", "agreement", "reference vs itself", "at least", "min-rows 1", "row starts, audited",
               "row starts, min-rows 1"], rows),
        paragraph(_draw(bound) + "The audit (a sum goes out only if, with every sum the node sent, it determines "
                  "none of its rows) refuses Lloyd's late moves, in which one or two of a party's rows change "
                  "cluster, since the old and the new sum of that cluster differ by exactly those rows: a start "
                  "whose move is refused sends its last statistics again and stops there, short of Lloyd's fixed "
                  "point. Starts far from an optimum (k-means++ on rows) lose most; fedkmeans' own starts (k-means "
                  "of the parties' local centres, already near an optimum) lose less. A node that accepts what "
                  "differencing gives away sets `min-rows = 1` (and a run `num-rounds` "
                  f"{CONVERGED_ROUNDS}, so that Lloyd converges).")]


def _draw(bound: dict) -> str:
    """Where the reference's own algorithm with another draw of starts (row starts, min-rows 1) agrees
    with the reference less than the reference at the next seed does: there the target is a draw."""
    short = [f"{dataset} seed {r['seed']}" for dataset in BOUND for r in bound.get(dataset, [])
             if r["row_starts_unaudited"]["agreement"] < r["reference_self"]]
    if not short:
        return ""
    return (f"Without the audit, 10 other k-means++ starts on the pooled rows (the reference's own algorithm, "
            f"another draw) agree with the reference less than its next seed does at {', '.join(short)}: per "
            "seed, the target is partly a draw of the starts. ")


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python benchmarks/fedkmeans_restarts.py", description=__doc__.splitlines()[0])
    parser.add_argument("--restarts", type=int, nargs="+", default=[1, 3, 10])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--datasets", nargs="*", choices=sorted(DATASETS), default=[], help="default: all")
    parser.add_argument("--bound", action="store_true",
                        help="measure the target against what the row audit allows (into the JSON)")
    parser.add_argument("--report", action="store_true", help="only render the page from the JSON")
    args = parser.parse_args(argv)
    path = RESULTS_DIR / RESULTS
    if args.report:
        if not path.is_file():
            raise SystemExit(f"error: {path} is missing; measure it first: `{MEASURE}`")
        results = json.loads(path.read_text())
    elif args.bound:
        results = json.loads(path.read_text()) if path.exists() else {}
        results["bound"] = {**results.get("bound", {}), **{
            dataset: [bound(dataset, seed) for seed in range(args.seeds)] for dataset in args.datasets or BOUND}}
    else:
        previous = json.loads(path.read_text()) if path.exists() else {}
        results = {**previous, **measure(args.restarts, args.seeds, args.datasets, previous)}
    if not args.report:
        path.write_text(json.dumps(results, indent=1) + "\n")
    print(render(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
