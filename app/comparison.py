"""Compare methods on your data: every strategy that fits it (or a named list), one table, one page.

::

    python -m app.run compare --dataset mygraph --num-clients 3 --out results/compare-mygraph

    from app import compare  # app.api.compare: this module's compare_runs with app.run's runs
    table = compare("mygraph", num_clients=3, out_dir="results/compare-mygraph")
    table.frame()            # pandas: one row per strategy

Each strategy runs as ``python -m app.run`` would run it (same ServerApp and ClientApp, in process by
default), with its first partitioner the data allows, into ``OUT/<strategy>/`` (its result.json and
report.html); a strategy the data does not fit, or whose run stops (a privacy floor, too few rows
for a client), gets a row saying why. The table: quality against the ground truth (ACC, NMI, ARI)
or, without one, the graph's modularity and conductance; agreement (ARI) with each method's own
centralised version; seconds; megabytes; privacy. ``OUT/compare.html`` shows it with a link to
every run's page, ``OUT/compare.json`` holds it.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from app import registry
from fedgraphcore.config import ArgumentParser, ConfigError, parse_assignments
from fedgraphcore.data import memory
from fedgraphcore.errors import FedGraphError

COMPARE_FILE, COMPARE_JSON = "compare.html", "compare.json"
DEFAULT_NUM_CLIENTS = 3
#: the columns of the printed table: key, heading, width
COLUMNS = (("strategy", "strategy", 17), ("partitioner", "split", 15), ("quality", "quality", 31),
           ("agreement", "agree ARI", 10), ("time_s", "seconds", 8), ("megabytes", "MB", 8), ("privacy", "privacy", 16))


@dataclass
class Comparison:
    """The rows of a comparison (one per strategy) and where its page is (None when nothing was written)."""

    dataset: str
    rows: list[dict] = field(default_factory=list)
    path: Path | None = None

    def frame(self):
        """A pandas DataFrame, one row per strategy."""
        import pandas as pd

        return pd.DataFrame(self.rows)

    def table(self) -> str:
        """The comparison as plain text: a row per strategy that ran, then those that did not and why."""
        lines = [f"compared on {self.dataset}: quality against the ground truth (without one, modularity and "
                 "conductance); agree ARI: federated vs the method's own centralised clusters (1: the same)"]
        lines.append("  ".join(f"{head:<{width}}" for _, head, width in COLUMNS).rstrip())
        for row in self.rows:
            if row["status"] == "ran":
                lines.append("  ".join(f"{_cell(row.get(key)):<{width}}" for key, _, width in COLUMNS).rstrip())
        lines += [f"{row['strategy']}: {row['status']}: {row['reason']}" for row in self.rows if row["status"] != "ran"]
        return "\n".join(lines)


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "-" if value is None else str(value)


def fitting_partitioner(strategy: str, dataset: str, data, overrides: Mapping[str, Any]) -> str:
    """The first of ``strategy``'s partitioners (the default first) that its settings and ``data``
    allow (a partitioner given in ``overrides``: that one); a ConfigError with the default's reason."""
    from fedgraphcore.data.datasets import DataProfile

    cls = registry.get(strategy).strategy
    given = overrides.get("partitioner", "auto")
    tried = cls.partitioners if given == "auto" else (given,)
    first = None
    for partitioner in tried:
        try:
            config = registry.validate({**overrides, "strategy": strategy, "dataset": dataset,
                                        "partitioner": partitioner})
            cls.check_data(config, DataProfile.of(data))
            return partitioner
        except ConfigError as err:
            first = first or err
    raise first


def row_of(strategy: str, partitioner: str, result: dict, out: Path | None) -> dict:
    """One strategy's row from its result."""
    metrics, reference = result["metrics"], result.get("reference") or {}
    names = [m for m in ("acc", "nmi", "ari") if m in metrics] or [m for m in ("modularity", "conductance")
                                                                    if m in metrics]
    privacy = result.get("privacy") or {}
    masked = any(u["masked"] for u in privacy.get("uploads", []))
    comm = result["communication"]
    row = {"strategy": strategy, "partitioner": partitioner, "status": "ran", "reason": "",
           **{m: metrics[m] for m in names},
           "quality": " ".join(f"{m.upper()[:4]} {metrics[m]:.3f}" for m in names) or "-",
           "agreement": (reference.get("agreement") or {}).get("ari"),
           "verdict": (result.get("quality") or {}).get("verdict"),
           "time_s": result["timing"]["total_s"],
           "megabytes": (comm["bytes_up"] + comm["bytes_down"]) / 1e6,
           "privacy": (f"eps {privacy['epsilon']:.3g}" if privacy.get("epsilon") is not None
                       else "masked, no DP" if masked else "clear, no DP"),
           "report": str(out / "report.html") if out is not None and (out / "report.html").exists() else None}
    return row


def compare_runs(run, data, strategies: Sequence[str] | None, num_clients: int | None, overrides: Mapping[str, Any],
                 out_dir: str | os.PathLike | None = None, engine: str = "inprocess", quiet: bool = True,
                 note=None) -> Comparison:
    """Run every strategy that fits ``data`` (or ``strategies``) with ``run`` (:func:`app.run.run_experiment`);
    the :class:`Comparison` (:func:`app.api.compare` documents the arguments)."""
    from fedgraphcore.data.formats import as_graph
    from fedgraphcore.data.params import data_root, dataset_kwargs
    from fedgraphcore.data.shards import server_data

    names = list(strategies) if strategies else list(registry.STRATEGIES)
    for name in names:
        registry.get(name)  # a one-line error for an unknown name
    dataset, registered = _dataset_name(data, dict(overrides), as_graph)
    try:
        config0 = registry.validate({**overrides, "strategy": names[0], "dataset": dataset})
        pooled = server_data(dataset, data_root(config0), config0["seed"], dataset_kwargs(config0.as_dict()))
        out = Path(out_dir).resolve() if out_dir is not None else None
        comparison = Comparison(memory.described(dataset))
        for name in names:
            comparison.rows.append(_one(run, name, dataset, pooled, dict(overrides), num_clients, out, engine, quiet,
                                        note))
    finally:
        if registered:
            memory.forget(dataset)
    if out is not None:
        comparison.path = _write(comparison, out)
    return comparison


def _dataset_name(data, overrides: dict, as_graph) -> tuple[str, bool]:
    """The dataset's name for the runs: a string as given, other data registered in memory (True)."""
    if isinstance(data, (str, os.PathLike)):
        return str(data), False
    options = {"node_table": None, "label_column": overrides.get("data.label-column", "label"),
               "weighted": overrides.get("data.weighted", True)}
    return memory.register(as_graph(data, **options)), True


def _one(run, name: str, dataset: str, pooled, overrides: dict, num_clients: int | None, out: Path | None,
         engine: str, quiet: bool, note) -> dict:
    """One strategy's row: run (with ``run``), refused (does not fit) or stopped."""
    from fedgraphcore import quiet as silence

    try:
        partitioner = fitting_partitioner(name, dataset, pooled, overrides)
    except ConfigError as err:
        return {"strategy": name, "status": "does not fit", "reason": str(err)}
    config = registry.validate({**overrides, "strategy": name, "dataset": dataset, "partitioner": partitioner})
    unused = set(registry.unused_keys(config, overrides))  # another strategy's keys
    own = {k: v for k, v in overrides.items() if k not in unused}
    run_out = out / name if out is not None else None
    if note:
        note(f"{name} ({partitioner}) ...")
    started = time.perf_counter()
    try:
        with silence.silenced(quiet):
            result = run(name, dataset, num_clients or DEFAULT_NUM_CLIENTS, {**own, "partitioner": partitioner},
                         run_out, engine, write=run_out is not None)
    except FedGraphError as err:
        row = {"strategy": name, "partitioner": partitioner, "status": "stopped", "reason": str(err)}
    else:
        row = row_of(name, partitioner, result, run_out)
    if note:
        note(f"{name}: {row['status']} in {time.perf_counter() - started:.1f} s")
    return row


def _write(comparison: Comparison, out: Path) -> Path:
    from fedgraphcore.report.compare_page import render

    out.mkdir(parents=True, exist_ok=True)
    (out / COMPARE_JSON).write_text(json.dumps({"dataset": comparison.dataset, "rows": comparison.rows}, indent=2,
                                               default=str) + "\n")
    path = out / COMPARE_FILE
    path.write_text(render(comparison.dataset, comparison.rows, out), encoding="utf-8")
    return path


def _parser() -> ArgumentParser:
    parser = ArgumentParser(prog="python -m app.run compare", description=(
        "Run every strategy that fits the data (or those named) and compare them in one table and one page."))
    parser.add_argument("--dataset", required=True, help="a built-in dataset or the path of your graph")
    parser.add_argument("--strategies", default=None, help="comma-separated names (default: every one that fits)")
    parser.add_argument("--num-clients", type=int, default=DEFAULT_NUM_CLIENTS)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a run-config key for every run")
    parser.add_argument("--out", default=None, help="folder for the runs and compare.html (default: "
                                                    "results/compare-<dataset>-<time>)")
    parser.add_argument("--engine", default="inprocess", help="inprocess (default) or simulation")
    parser.add_argument("-v", "--verbose", action="store_true", help="each run's summary and progress too")
    return parser


def main(argv: list[str], run) -> int:
    """``python -m app.run compare ...`` with ``run`` (:func:`app.run.run_experiment`): exit code 0, or 2
    with one line for a bad option."""
    from fedgraphcore.data.datasets import dataset_label
    from fedgraphcore.result import default_out_dir

    try:
        args = _parser().parse_args(argv)
        strategies = [s.strip() for s in args.strategies.split(",") if s.strip()] if args.strategies else None
        out = args.out or default_out_dir("compare", dataset_label(args.dataset))
        comparison = compare_runs(run, args.dataset, strategies, args.num_clients, parse_assignments(args.set), out,
                                  args.engine, quiet=not args.verbose,
                                  note=lambda line: print(line, file=sys.stderr, flush=True))
    except FedGraphError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
    print(comparison.table())
    print(f"page: {comparison.path}")
    return 0
