"""Benchmark suites: ``python benchmarks/harness.py SUITE [--quick] [--seeds N] [--report]``.

A suite is one paper table: a list of experiments (strategy, dataset,
num_clients, run-config overrides), the seeds to repeat them over, the
metrics that go into the table and the paper's value per cell. The harness
runs every (experiment, seed) through :func:`app.run.run_experiment`, shows a
progress bar, and writes

* ``benchmarks/results/SUITE.json`` - every run's metrics, reference,
  agreement, timing and communication, plus mean/std per experiment;
* figures under ``docs/results/img/`` (:func:`suite_figures`): federated vs
  centralised (vs isolated) bars, metric vs rounds when runs carry a
  ``history``, a 2-D embedding of the first run's clusters when its
  ``labels.npy`` is still there.

:func:`render_markdown` gives the suite's tables for the page that shows it
(``docs/results/``, see ``benchmarks/pages.py``); ``--report`` redraws the
figures and prints the tables from the JSON without running anything.
Suites are added with :func:`register_suite` (see the ``smoke`` suite at the
bottom of this file). Label metrics (acc, f1, nmi, ari, cluster_similarity)
are shown in percent like the papers.

The scripts in ``benchmarks/`` parse their arguments with
:class:`fedgraphcore.config.ArgumentParser` and the ``type=`` helpers :func:`value_arg`, :func:`list_arg`,
:func:`config_value`, :func:`config_list`: every value, and every item of a
comma-separated list, is checked before the first run starts. They run
``main`` through :func:`run_script`, which ends on a later bad input (a
ConfigError) with one line, too.
"""

from __future__ import annotations

import argparse
import shutil
import contextlib
import json
import math
import re
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from fedgraphcore.result import jsonable
from pages import IMAGE_DIR, RESULTS_DIR, paragraph, table

PERCENT_METRICS = ("acc", "f1", "nmi", "ari", "cluster_similarity")
METRIC_NAMES = ("acc", "f1", "nmi", "ari", "modularity", "conductance", "cluster_similarity")
RunFn = Callable[..., dict]


@dataclass(frozen=True)
class Experiment:
    """One cell (or row) of a paper table.

    ``row`` / ``col`` place it in the table (defaults derived from the
    settings); ``paper`` maps metric -> the paper's value for this cell, in the
    table's units (percent for label metrics); ``quick=False`` leaves it out of
    ``--quick`` runs.
    """

    strategy: str
    dataset: str
    num_clients: int
    overrides: Mapping[str, Any] = field(default_factory=dict)
    row: str = ""
    col: str = ""
    paper: Mapping[str, float] = field(default_factory=dict)
    quick: bool = True

    @property
    def key(self) -> str:
        extra = ",".join(f"{k}={v}" for k, v in sorted(self.overrides.items()))
        base = f"{self.strategy}-{self.dataset}-c{self.num_clients}"
        return base + (f"-{extra}" if extra else "")

    @property
    def slug(self) -> str:
        return re.sub(r"[^A-Za-z0-9_.=-]+", "_", self.key)[:120]

    def row_label(self) -> str:
        return self.row or f"{self.strategy}"

    def col_label(self) -> str:
        return self.col or f"{self.dataset}, {self.num_clients} clients"


@dataclass(frozen=True)
class Suite:
    """A named set of experiments reproducing one paper table."""

    name: str
    title: str
    experiments: tuple[Experiment, ...]
    metrics: tuple[str, ...] = ("acc",)
    seeds: tuple[int, ...] = (0, 1, 2)
    quick_seeds: tuple[int, ...] = (0,)
    quick_overrides: Mapping[str, Any] = field(default_factory=dict)
    source: str = ""  # e.g. "kCAGC paper, Table II"
    notes: str = ""

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[a-z0-9][a-z0-9_-]*", self.name):
            raise ValueError(f"invalid suite name {self.name!r}; use lowercase letters, digits, '-' or '_'")
        bad = [m for m in self.metrics if m not in METRIC_NAMES]
        if bad:
            raise ValueError(f"unknown metric {bad[0]!r} in suite {self.name!r}; valid: {', '.join(METRIC_NAMES)}")
        if not self.experiments:
            raise ValueError(f"suite {self.name!r} has no experiments")


SUITES: dict[str, Suite] = {}


def register_suite(suite: Suite) -> Suite:
    """Add ``suite`` to the registry (names are unique)."""
    if suite.name in SUITES:
        raise ValueError(f"suite {suite.name!r} registered twice")
    SUITES[suite.name] = suite
    return suite


def get_suite(name: str) -> Suite:
    if name not in SUITES:
        raise KeyError(f"unknown suite {name!r}; valid suites: {', '.join(sorted(SUITES))}")
    return SUITES[name]


# ---------------------------------------------------------------------------
# running
# ---------------------------------------------------------------------------
class _Progress:
    """tqdm progress bar on stderr (plain counter lines if tqdm is missing)."""

    def __init__(self, total: int, desc: str, enabled: bool = True):
        self.total, self.n, self.enabled, self.bar = total, 0, enabled, None
        if enabled:
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=total, desc=desc, unit="run", file=sys.stderr, dynamic_ncols=True)
            except ImportError:  # pragma: no cover
                self.bar = None

    def step(self, label: str) -> None:
        self.n += 1
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.set_postfix_str(label[:60])
            self.bar.update(1)
        else:  # pragma: no cover
            print(f"[{self.n}/{self.total}] {label}", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _mean_std(values: Sequence[float]) -> dict[str, float] | None:
    vals = [float(v) for v in values if isinstance(v, (int, float)) and math.isfinite(float(v))]
    if not vals:
        return None
    m = sum(vals) / len(vals)
    sd = math.sqrt(sum((v - m) ** 2 for v in vals) / len(vals)) if len(vals) > 1 else 0.0
    return {"mean": m, "std": sd, "n": len(vals)}


def _summarise(runs: list[dict]) -> dict[str, Any]:
    ok = [r for r in runs if "error" not in r]
    out: dict[str, Any] = {"runs_ok": len(ok), "runs_failed": len(runs) - len(ok)}
    for block in ("metrics", "reference", "timing", "communication"):
        keys: list[str] = []
        for r in ok:
            for k, v in (r.get(block) or {}).items():
                if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in keys:
                    keys.append(k)
        out[block] = {k: s for k in keys if (s := _mean_std([(r.get(block) or {}).get(k) for r in ok]))}
    agree_keys = ("ari", "nmi", "cluster_similarity")
    out["agreement"] = {
        k: s
        for k in agree_keys
        if (s := _mean_std([((r.get("reference") or {}).get("agreement") or {}).get(k) for r in ok]))
    }
    iso = [r.get("isolated") for r in ok if isinstance(r.get("isolated"), dict)]
    if iso:
        keys = sorted({k for d in iso for k, v in d.items() if isinstance(v, (int, float))})
        out["isolated"] = {k: s for k in keys if (s := _mean_std([d.get(k) for d in iso]))}
    return out


def _run_record(result: dict, seed: int, out_dir: Path) -> dict:
    keep = ("metrics", "reference", "timing", "communication", "privacy", "history", "isolated")
    rec = {"seed": seed, "out_dir": str(out_dir)}
    rec.update({k: result[k] for k in keep if k in result})
    return rec


def run_suite(
    suite: str | Suite,
    quick: bool = False,
    seeds: Sequence[int] | None = None,
    run_fn: RunFn | None = None,
    results_dir: str | Path | None = None,
    image_dir: str | Path | None = None,
    plots: bool = True,
    progress: bool = True,
    engine: str = "inprocess",
) -> dict:
    """Run a suite and write its JSON (under ``results_dir``, default ``benchmarks/results``)
    and figures (under ``image_dir``, default ``docs/results/img``).

    ``run_fn`` defaults to :func:`app.run.run_experiment` (tests inject a fake
    with the same signature). A failing run is recorded with its error and the
    suite continues. Returns the summary dict written to ``SUITE.json``, with
    the paths of the figures under ``"plots"``.
    """
    suite = get_suite(suite) if isinstance(suite, str) else suite
    if run_fn is None:
        from app.run import run_experiment as run_fn  # noqa: N813
    results_dir = Path(results_dir) if results_dir is not None else RESULTS_DIR
    seeds = tuple(seeds) if seeds is not None else (suite.quick_seeds if quick else suite.seeds)
    if not seeds:
        raise ValueError("no seeds to run; pass --seeds N with N >= 1")
    experiments = [e for e in suite.experiments if e.quick] if quick else list(suite.experiments)
    if not experiments:
        raise ValueError(f"suite {suite.name!r} has no experiments marked quick")
    bar = _Progress(len(experiments) * len(seeds), f"{suite.name}", enabled=progress)
    started = time.time()
    exp_records = []
    try:
        for exp in experiments:
            runs = []
            for seed in seeds:
                overrides = {**dict(exp.overrides), **(dict(suite.quick_overrides) if quick else {}), "seed": int(seed)}
                out_dir = results_dir / suite.name / exp.slug / f"seed{seed}"
                t0 = time.perf_counter()
                try:
                    out_dir.mkdir(parents=True, exist_ok=True)
                    # the run's own printout goes to a log file; the progress bar stays readable
                    with open(out_dir / "stdout.log", "w") as log, contextlib.redirect_stdout(log):
                        result = run_fn(exp.strategy, exp.dataset, exp.num_clients, overrides,
                                        out_dir=out_dir, engine=engine)
                    rec = _run_record(result, int(seed), out_dir)
                except Exception as exc:  # keep going: one bad cell must not lose the table
                    rec = {
                        "seed": int(seed),
                        "out_dir": str(out_dir),
                        "error": f"{type(exc).__name__}: {exc}",
                        "traceback": traceback.format_exc(limit=5),
                    }
                    print(f"\n{exp.key} seed {seed} failed: {rec['error']}", file=sys.stderr)
                rec["wall_s"] = time.perf_counter() - t0
                runs.append(rec)
                bar.step(f"{exp.key} seed {seed}")
            exp_records.append({
                "key": exp.key,
                "strategy": exp.strategy,
                "dataset": exp.dataset,
                "num_clients": exp.num_clients,
                "overrides": dict(exp.overrides),
                "row": exp.row_label(),
                "col": exp.col_label(),
                "paper": dict(exp.paper),
                "summary": _summarise(runs),
                "runs": runs,
            })
    finally:
        bar.close()
    summary = {
        "suite": suite.name,
        "title": suite.title,
        "source": suite.source,
        "quick": bool(quick),
        "seeds": list(seeds),
        "metrics": list(suite.metrics),
        "generated_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "elapsed_s": time.time() - started,
        "experiments": exp_records,
    }
    results_dir.mkdir(parents=True, exist_ok=True)
    json_path = results_dir / f"{suite.name}.json"
    json_path.write_text(json.dumps(jsonable(summary), indent=2) + "\n")
    summary["plots"] = suite_figures(suite, summary, image_dir) if plots else []
    return summary


def load_summary(suite: str | Suite, results_dir: str | Path | None = None) -> dict:
    """The summary :func:`run_suite` wrote for ``suite`` (its ``SUITE.json``)."""
    name = suite if isinstance(suite, str) else suite.name
    path = (Path(results_dir) if results_dir is not None else RESULTS_DIR) / f"{name}.json"
    if not path.is_file():
        raise ValueError(f"no results for suite {name!r}: {path} is missing; run `python benchmarks/harness.py {name}`")
    return json.loads(path.read_text())


# ---------------------------------------------------------------------------
# Markdown
# ---------------------------------------------------------------------------
def _scale(metric: str) -> float:
    return 100.0 if metric in PERCENT_METRICS else 1.0


def _fmt(v: float | None, metric: str, signed: bool = False) -> str:
    if v is None or not math.isfinite(v):
        return "–"
    digits = 2 if metric in PERCENT_METRICS else 3
    return f"{v:+.{digits}f}" if signed else f"{v:.{digits}f}"


def _ours(summary: dict, block: str, metric: str) -> tuple[float | None, float | None, int]:
    s = (summary.get(block) or {}).get(metric)
    if not s:
        return None, None, 0
    return s["mean"] * _scale(metric), s["std"] * _scale(metric), int(s["n"])


def _ours_cell(e: dict, metric: str) -> str:
    mean, sd, n = _ours(e["summary"], "metrics", metric)
    text = "–" if mean is None else (_fmt(mean, metric) + (f" ± {_fmt(sd, metric)}" if n > 1 else ""))
    failed = e["summary"]["runs_failed"]
    return text + (f" ({failed} failed)" if failed else "")


def paper_rows(suite: Suite, summary: dict) -> list[list[str]]:
    """One row per experiment and metric: setting, metric, paper, ours (mean ± std over seeds), ours − paper."""
    rows = []
    for e in summary["experiments"]:
        for m in suite.metrics:
            paper = e["paper"].get(m)
            mean = _ours(e["summary"], "metrics", m)[0]
            diff = _fmt(mean - paper, m, signed=True) if (mean is not None and paper is not None) else "–"
            rows.append([f"{e['row']}, {e['col']}", m, _fmt(paper, m) if paper is not None else "–",
                         _ours_cell(e, m), diff])
    return rows


def reference_rows(suite: Suite, summary: dict) -> list[list[str]]:
    """One row per experiment: the first metric federated / centralised / isolated, the agreement of the
    federated with the centralised labels (ARI, NMI), time and bytes up + down."""
    m0 = suite.metrics[0]
    rows = []
    for e in summary["experiments"]:
        s = e["summary"]
        t = (s.get("timing") or {}).get("total_s")
        comm = s.get("communication") or {}
        traffic = sum(comm[k]["mean"] for k in ("bytes_up", "bytes_down") if k in comm)
        rows.append([
            f"{e['row']}, {e['col']}",
            *(_fmt(_ours(s, block, m0)[0], m0) for block in ("metrics", "reference", "isolated")),
            *(_fmt(_ours(s, "agreement", k)[0], k) for k in ("ari", "nmi")),
            f"{t['mean']:.2f}" if t else "–",
            f"{traffic:,.0f}" if comm else "–",
        ])
    return rows


def render_markdown(suite: Suite, summary: dict) -> str:
    """The suite's tables for its page: paper vs ours, then against the centralised reference."""
    m0 = suite.metrics[0]
    units = ", ".join(f"{m} in %" if m in PERCENT_METRICS else m for m in suite.metrics)
    seeds = ", ".join(map(str, summary["seeds"]))
    lines = [
        paragraph(f"Source: {suite.source or '–'}. Seeds {seeds}{' (quick run)' if summary['quick'] else ''}; "
                  f"{units}; ours = mean ± std over the seeds."),
        "",
        table(["setting", "metric", "paper", "ours", "ours − paper"], paper_rows(suite, summary)),
        "",
        paragraph(f"Against the centralised reference (same data and seed): {m0} federated / centralised / "
                  "isolated, the agreement of the federated with the centralised labels, seconds per run, bytes "
                  "up + down:"),
        "",
        table(["setting", "fed.", "central.", "isol.", "ARI", "NMI", "s", "bytes"], reference_rows(suite, summary)),
    ]
    failed = [(e["key"], r["seed"], r["error"]) for e in summary["experiments"] for r in e["runs"] if "error" in r]
    if failed:
        lines += ["", "Failed runs:", ""]
        lines += [f"- `{k}` seed {s}: {err}" for k, s, err in failed]
    if suite.notes:
        lines += ["", paragraph(suite.notes)]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------
# plots
# ---------------------------------------------------------------------------
def suite_figures(suite: Suite, summary: dict, image_dir: str | Path | None = None) -> list[str]:
    """Draw the suite's figures from its summary into ``image_dir`` (default ``docs/results/img``):
    ``SUITE_bars.png``, ``SUITE_rounds.png`` when runs carry a history, and ``SUITE_embedding.png`` when
    a run's ``labels.npy`` is still on disk (otherwise an embedding drawn before is kept). Returns the
    paths written; a figure that cannot be drawn is reported on stderr and skipped."""
    import plots  # matplotlib: the ``bench`` extra

    image_dir = Path(image_dir) if image_dir is not None else IMAGE_DIR
    out = []
    for name, draw in (("bars", _bars_figure), ("rounds", _rounds_figure), ("embedding", _embedding_figure)):
        try:
            path = draw(plots, suite, summary["experiments"], image_dir / f"{suite.name}_{name}.png")
        except Exception as exc:  # one figure must not lose the others
            print(f"{name} figure skipped: {type(exc).__name__}: {exc}", file=sys.stderr)
            continue
        if path is not None:
            out.append(str(path))
    return out


def _bars_figure(plots, suite: Suite, exps: list[dict], path: Path) -> Path | None:
    m0 = suite.metrics[0]
    series: dict[str, list[float]] = {}
    errors: dict[str, list[float]] = {}
    for name, block in (("federated", "metrics"), ("centralised", "reference"), ("isolated", "isolated")):
        vals = [_ours(e["summary"], block, m0) for e in exps]
        if any(v[0] is not None for v in vals):
            series[name] = [v[0] if v[0] is not None else float("nan") for v in vals]
            errors[name] = [v[1] if v[1] is not None else 0.0 for v in vals]
    if not series:
        return None
    return plots.plot_grouped_bars([f"{e['row']}, {e['col']}" for e in exps], series, path, errors=errors,
                                   ylabel=m0 + (" (%)" if m0 in PERCENT_METRICS else ""), title=suite.title)


def _rounds_figure(plots, suite: Suite, exps: list[dict], path: Path) -> Path | None:
    m0 = suite.metrics[0]
    series, rounds, ref = {}, {}, {}
    for e in exps:
        run = next((r for r in e["runs"] if r.get("history")), None)
        if run is None:
            continue
        pts = [(h.get("round", i + 1), h[m0]) for i, h in enumerate(run["history"])
               if isinstance(h.get(m0), (int, float))]
        if pts:
            label = f"{e['row']}, {e['col']}"
            rounds[label] = [p[0] for p in pts]
            series[label] = [p[1] for p in pts]
            if isinstance((run.get("reference") or {}).get(m0), (int, float)):
                ref[f"centralised ({label})"] = run["reference"][m0]
    if not series:
        return None
    return plots.plot_metric_vs_rounds(series, path, metric=m0, rounds=rounds, reference=ref, title=suite.title)


def _embedding_figure(plots, suite: Suite, exps: list[dict], path: Path) -> Path | None:
    """The first run whose labels are on disk, beside the ground truth and the centralised labels."""
    import numpy as np

    from fedgraphcore.data import load_dataset

    for e in exps:
        for r in e["runs"]:
            lab_path = Path(r["out_dir"]) / "labels.npy"
            if "error" in r or not lab_path.exists():
                continue
            data = load_dataset(e["dataset"], seed=r["seed"])
            labels = np.load(lab_path)
            if getattr(data, "adj", None) is None or labels.shape[0] != data.adj.shape[0]:
                continue
            coords = plots.embedding_2d(x=data.x, adj=data.adj, method="auto", seed=r["seed"])
            labelings = {}
            if data.y is not None:
                labelings["ground truth"] = data.y
            labelings[f"{e['strategy']} ({e['num_clients']} clients)"] = labels
            ref_path = Path(r["out_dir"]) / "reference_labels.npy"
            if ref_path.exists():
                labelings["centralised"] = np.load(ref_path)
            return plots.plot_embedding(coords, labelings, path, title=f"{e['dataset']}: {e['key']} seed {r['seed']}")
    return path if path.exists() else None


# ---------------------------------------------------------------------------
# the benchmark scripts' arguments
# ---------------------------------------------------------------------------
def fresh_dir(path: Path) -> Path:
    """``path`` emptied for a new run: a benchmark owns its run directories, and a run never
    replaces a result.json (:func:`fedgraphcore.result.write_result`)."""
    shutil.rmtree(path, ignore_errors=True)
    return path


def run_script(main: Callable[[], int]) -> int:
    """A benchmark script's exit code: bad input (a ConfigError: a bad argument, which
    :class:`fedgraphcore.config.ArgumentParser` raises, or a dataset whose files disagree, found by the first
    run) ends it with one line and exit code 2."""
    from fedgraphcore.config import ConfigError

    try:
        return main()
    except ConfigError as err:
        print(f"{Path(sys.argv[0]).name}: error: {err}", file=sys.stderr)
        return 2


def _valid(kind: Callable, choices: Sequence, low: float | None, high: float | None, valid: str) -> str:
    """The error's tail: what the valid values are."""
    if valid:
        return f"valid: {valid}"
    if choices:
        return "valid choices: " + ", ".join(map(str, choices))
    low, high = (v if v is None or isinstance(v, int) else f"{v:g}" for v in (low, high))  # 4294967295, not 4.3e+09
    if low is not None and high is not None:
        return f"valid: {kind.__name__}s in [{low}, {high}]"
    if low is not None:
        return f"valid: {kind.__name__}s >= {low}"
    return f"valid: {kind.__name__}s" + ("" if high is None else f" <= {high}")


def value_arg(kind: Callable[[str], Any] = str, choices: Sequence = (), low: float | None = None,
              high: float | None = None, valid: str = "") -> Callable[[str], Any]:
    """argparse ``type=`` for one value: ``kind`` converts it (a ValueError rejects it), then it must be one of
    ``choices`` and within [``low``, ``high``] where given. The error names the value and ``valid`` (the
    description of the valid values; default: the choices, or the kind and bounds)."""
    tail = _valid(kind, choices, low, high, valid)

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid value {text!r}; {tail}") from None
        # "not >=" rather than "<": NaN compares false and is out of every range
        if (choices and value not in choices) or (low is not None and not value >= low) \
                or (high is not None and not value <= high):
            raise argparse.ArgumentTypeError(f"invalid value {text!r}; {tail}")
        return value

    return parse


def list_arg(kind: Callable[[str], Any] = str, choices: Sequence = (), low: float | None = None,
             high: float | None = None, valid: str = "", empty_ok: bool = False) -> Callable[[str], list]:
    """argparse ``type=`` for a comma-separated list (``--parts a,b``) of :func:`value_arg` items, read whole
    at parse time: a typo late in the list stops the script before the first item runs. An empty list is an
    error unless ``empty_ok`` (a script that would run nothing would still rewrite its results)."""
    item = value_arg(kind, choices, low, high, valid)

    def parse(text: str) -> list:
        values = [item(part.strip()) for part in text.split(",") if part.strip()]
        if not values and not empty_ok:
            raise argparse.ArgumentTypeError(f"empty list {text!r}; {_valid(kind, choices, low, high, valid)}")
        return values

    return parse


def _config_checks(key: str) -> tuple:
    """The type, choices and range declared for run-config ``key`` (app.registry)."""
    from app import registry

    param = registry.schema().params[key]
    return param.kind, param.choices or (), param.low, param.high


def config_value(key: str) -> Callable[[str], Any]:
    """:func:`value_arg` for a value of run-config ``key``: an argument that feeds the key is checked as the
    runs would check it, before any starts."""
    return value_arg(*_config_checks(key))


def config_list(key: str, empty_ok: bool = False) -> Callable[[str], list]:
    """:func:`list_arg` of values of run-config ``key`` (see :func:`config_value`)."""
    return list_arg(*_config_checks(key), empty_ok=empty_ok)


def existing_file(text: str) -> str:
    """``kind`` for :func:`value_arg`: the path of a file that exists (e.g. results to merge)."""
    if not Path(text).is_file():
        raise ValueError(text)
    return text


def strategy_datasets(strategy: str) -> tuple[str, ...]:
    """The datasets ``strategy`` runs on with its default partitioner: those the run-config check accepts,
    so a benchmark's ``--datasets`` fails at parse time, not at its first run of that dataset."""
    from app import registry
    from fedgraphcore.config import ConfigError
    from fedgraphcore.data import DATASETS

    def fits(dataset: str) -> bool:
        try:
            registry.validate({"strategy": strategy, "dataset": dataset})
        except ConfigError:
            return False
        return True

    return tuple(d for d in DATASETS if fits(d))


# ---------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------
def main(argv: list[str] | None = None, run_fn: RunFn | None = None, results_dir: str | Path | None = None,
         image_dir: str | Path | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python benchmarks/harness.py",
                                 description="Run a benchmark suite (one paper table).")
    ap.add_argument("suite", nargs="?", help="suite name; --list shows them")
    ap.add_argument("--quick", action="store_true", help="the suite's quick variant (fewer seeds/experiments)")
    ap.add_argument("--seeds", type=int, default=None, metavar="N", help="repeat over seeds 0..N-1")
    ap.add_argument("--list", action="store_true", help="list suites and exit")
    ap.add_argument("--no-plots", action="store_true", help="skip the figures")
    ap.add_argument("--report", action="store_true",
                    help="run nothing: redraw the figures and print the tables from the suite's JSON")
    ap.add_argument("--engine", default="inprocess", choices=("inprocess", "simulation"))
    args = ap.parse_args(argv)
    if args.list:
        for s in sorted(SUITES.values(), key=lambda s: s.name):
            print(f"{s.name:<16} {len(s.experiments):>3} experiments  {s.title}")
        return 0
    if args.suite not in SUITES:
        given = "no suite given" if args.suite is None else f"unknown suite {args.suite!r}"
        print(f"error: {given}; valid suites: {', '.join(sorted(SUITES))}", file=sys.stderr)
        return 2
    if args.seeds is not None and args.seeds < 1:
        print(f"error: invalid --seeds {args.seeds}; need N >= 1", file=sys.stderr)
        return 2
    suite = get_suite(args.suite)
    seeds = tuple(range(args.seeds)) if args.seeds is not None else None
    try:
        if args.report:
            summary = load_summary(suite, results_dir)
            summary["plots"] = [] if args.no_plots else suite_figures(suite, summary, image_dir)
        else:
            summary = run_suite(suite, quick=args.quick, seeds=seeds, run_fn=run_fn, results_dir=results_dir,
                                image_dir=image_dir, plots=not args.no_plots, engine=args.engine)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(render_markdown(suite, summary))
    written = [] if args.report else [str(Path(results_dir or RESULTS_DIR) / f"{suite.name}.json")]
    print("wrote " + ", ".join(written + summary["plots"]) if written or summary["plots"] else "wrote nothing")
    failed = sum(e["summary"]["runs_failed"] for e in summary["experiments"])
    return 1 if failed else 0


# ---------------------------------------------------------------------------
# suites
# ---------------------------------------------------------------------------
register_suite(Suite(
    name="smoke",
    title="fedkmeans against centralised k-means on a planted-partition graph",
    source="none: fedkmeans has no paper, its target is the centralised k-means it reproduces",
    experiments=(
        Experiment("fedkmeans", "sbm", 2, row="fedkmeans", col="sbm, 2 clients"),
        Experiment("fedkmeans", "sbm", 4, row="fedkmeans", col="sbm, 4 clients"),
    ),
    metrics=("acc", "nmi"),
    seeds=(0, 1, 2),
    quick_seeds=(0,),
))


_FEDSPECTRAL = {"num-clusters": 10, "partition.overlap": 0.4}  # paper: 5 clients, 10 clusters, 40% overlap
register_suite(Suite(
    name="fedspectral",
    title="FedSpectral / FedSpectral+: clusterSimilarity against centralised spectral clustering",
    source="Thakkar & Joshi, FedSpectral+ (Results and Analysis); benchmarks/fedspectral.py adds the curves",
    experiments=tuple(
        Experiment(strategy, dataset, 5, {**_FEDSPECTRAL, **extra}, row=row, col=dataset,
                   paper={"cluster_similarity": value})
        for dataset, base, plus in (("ego-facebook", 77.63, 98.85), ("email-eu-core", 87.05, 99.8))
        for strategy, extra, row, value in (
            ("fedspectral", {}, "FedSpectral (baseline)", base),
            ("fedspectral-plus", {"fedspectral-plus.mode": "paper"}, "FedSpectral+ (paper mode, paper's iters/rounds)",
             plus),
            ("fedspectral-plus", {"fedspectral-plus.mode": "exact"}, "FedSpectral+ exact mode (ours)", plus),
        )
    ),
    metrics=("cluster_similarity", "nmi"),
    seeds=(0, 1, 2),
    quick_seeds=(0,),
    notes="clusterSimilarity (paper Algorithm 5) is one-sided: a single giant cluster scores 100%; read it "
          "next to the agreement ARI/NMI against the centralised labels. `nmi` is against the ground truth "
          "(email-eu-core departments; ego-facebook has none).",
))

if __name__ == "__main__":
    raise SystemExit(main())
