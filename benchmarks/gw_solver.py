"""The GW matrix's solvers side by side: POT (``ot.gromov.*gromov_wasserstein2``, converged), the
project's conditional gradient converged (``cg``, POT's values bit for bit) and the default: stopped after
``MATRIX_CG_ITERATIONS`` linear programs (``gw-ldp.gw-max-iter``), on embedding rows merged at
``MATRIX_MERGE_DECIMALS`` decimals (``gw-ldp.merge-decimals``; GW_A's shortest-path spaces have no rows to merge).

    python benchmarks/gw_solver.py [--parts pairs,matrix,accuracy,gw-h] [--pairs 500] [--folds 3]
    python benchmarks/gw_solver.py --report

Parts (each merges its figures into ``benchmarks/results/gw_solver.json``; every run re-renders
``docs/results/gw-solver.md``):

* ``pairs``: per dataset a fixed random sample of pairs of Table 1's GW_A spaces (FGW_AX, alpha 0.5:
  shortest paths and one-hot node labels; shortest-path GW where the graphs have no labels), each
  pair solved by the three solvers in turn in this process on one BLAS thread. CPU seconds
  (``time.process_time``) on the same pairs give the ratios on a shared machine; the whole matrix's
  seconds are extrapolated as ms per pair x the matrix's solved pairs / 2 workers.
* ``matrix``: MUTAG's first 100 graphs, GW_A by default, with 1 and 2 workers: the matrices must be equal.
* ``accuracy``: the default's whole GW_A matrix (wall seconds, 2 workers) and its SVC accuracy on
  folds ``0..folds-1`` beside the converged matrix's in ``gw_ldp.json`` (Table 1).
* ``gw-h``: GW_H(GIN) folds with Table 1's settings: the class-score embeddings of a fold run
  (``gw_ldp.fold_run`` with the default keys; cached in ``benchmarks/results/gw_solver/`` so a rerun
  trains nothing), the default's matrix on them (one worker: its CPU seconds, pairs of equal sizes in
  stacks) and its SVC accuracy, and the three solvers' CPU time on a sample of pairs of fold 0's graphs
  one pair at a time (POT and cg on the exactly merged rows, the default on its own), whose two halves
  are timed before and after fold 0's matrix, so both arms see the same load.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from threadpoolctl import threadpool_limits

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.append(str(ROOT / "benchmarks"))  # pages; opacus installs a top-level ``benchmarks`` package

from fedgraphcore.config import ArgumentParser  # noqa: E402
from fedgraphcore.data import load_dataset  # noqa: E402
from fedgraphcore.protocols import gw_ldp  # noqa: E402
from fedgraphcore.protocols.gw_ldp import MATRIX_MERGE_DECIMALS  # noqa: E402
from fedgraphcore.protocols.gw_ldp.solver import MATRIX_CG_ITERATIONS  # noqa: E402
from harness import list_arg, run_script  # noqa: E402

import pages  # noqa: E402

JSON_PATH = ROOT / "benchmarks" / "results" / "gw_solver.json"
TABLE1_JSON = ROOT / "benchmarks" / "results" / "gw_ldp.json"
REGENERATE = "python benchmarks/gw_solver.py --report"
DATASETS = ("proteins", "imdb-binary")
#: Table 1's FGW_AX weight of the structure term (GW_A with node labels) and of GW_H's
TABLE1_ALPHA = 0.5
#: the mark of an ``accuracy`` entry this script measured (the page names the entries without it)
MEASURED_BY = "benchmarks/gw_solver.py --parts accuracy"
ARMS = {"pot": {"solver": "pot"}, "cg": {}, "default": {"max_iter": MATRIX_CG_ITERATIONS}}
#: the run-config keys of the default matrix (GW_H fold runs set them explicitly: Table 1's are exact)
DEFAULT_KEYS = {"gw-ldp.gw-max-iter": MATRIX_CG_ITERATIONS, "gw-ldp.merge-decimals": MATRIX_MERGE_DECIMALS}
#: cached GW_H(GIN) fold embeddings (git ignores the folder)
EMBEDDINGS = ROOT / "benchmarks" / "results" / "gw_solver"


def gw_a_spaces(name: str) -> tuple[list, float, np.ndarray]:
    """Table 1's GW_A items of ``name`` (shortest paths, one-hot labels if any), its alpha, the labels."""
    data = load_dataset(name)
    has_x = data.graphs[0].x is not None
    spaces = [(gw_ldp.shortest_path_matrix(g.adj), None, gw_ldp.node_features(g, 2) if has_x else None)
              for g in data.graphs]
    return spaces, (TABLE1_ALPHA if has_x else 1.0), data.y


def pair_sample(n: int, count: int, seed: int = 0) -> list[tuple[int, int]]:
    """``count`` distinct pairs ``i < j`` of ``n`` items, uniformly at random (fixed by ``seed``)."""
    iu, ju = np.triu_indices(n, 1)
    pick = np.random.default_rng(seed).choice(iu.size, min(count, iu.size), replace=False)
    return list(zip(iu[pick].tolist(), ju[pick].tolist()))


def compare(spaces: list, alpha: float, pairs: list, default_spaces: list | None = None, halfway=None) -> dict:
    """Every arm on every pair in turn: CPU ms per pair, the ratios to POT, how the values differ.
    ``default_spaces``: the same graphs' spaces as the default merges them (else ``spaces``);
    ``halfway``: called (untimed here) after the first half of the pairs."""
    exact = [as_item(s, alpha) for s in spaces]
    merged = exact if default_spaces is None else [as_item(s, alpha) for s in default_spaces]
    items = {arm: merged if arm == "default" else exact for arm in ARMS}
    cpu, values = dict.fromkeys(ARMS, 0.0), {arm: [] for arm in ARMS}
    load = os.getloadavg()[0]
    with threadpool_limits(limits=1):
        for arm, kw in ARMS.items():  # first calls pay imports and backend set-up: not timed
            (c1, p, x1), (c2, q, x2) = items[arm][0], items[arm][1]
            gw_ldp.gw_pair(c1, c2, p, q, x1=x1, x2=x2, alpha=alpha, **kw)
        for t, (i, j) in enumerate(pairs):
            if halfway is not None and t == len(pairs) // 2:
                halfway()
            for arm, kw in ARMS.items():
                (c1, p, x1), (c2, q, x2) = items[arm][i], items[arm][j]
                t0 = time.process_time()
                values[arm].append(gw_ldp.gw_pair(c1, c2, p, q, x1=x1, x2=x2, alpha=alpha, **kw))
                cpu[arm] += time.process_time() - t0
    pot, cg, fast = (np.array(values[a]) for a in ARMS)
    rel = (fast - cg) / np.maximum(np.abs(cg), 1e-300)
    out = {f"{arm}_ms_per_pair": 1e3 * cpu[arm] / len(pairs) for arm in ARMS}
    out["load"] = [load, os.getloadavg()[0]]  # the 1-minute load average before and after
    out.update({"pairs": len(pairs), "pot_over_cg": cpu["pot"] / cpu["cg"], "pot_over_default": cpu["pot"] / cpu["default"],
                "cg_identical_to_pot": int((cg == pot).sum()), "default_rel_excess_median": float(np.median(rel)),
                "default_rel_excess_p90": float(np.quantile(rel, 0.9)),
                "default_spearman": float(_spearman(fast, cg)), "default_below_converged": int((rel < 0).sum())})
    return out


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    from scipy.stats import spearmanr

    return float(spearmanr(a, b)[0])


def as_item(space: tuple, alpha: float) -> tuple:
    """``(distance, weights, features or None)`` of a space as :func:`gw_ldp.gw_matrix` solves it
    (float64, uniform weights unless given, features only for fused GW)."""
    c = np.ascontiguousarray(space[0], dtype=np.float64)
    w = space[1] if len(space) > 1 and space[1] is not None else np.full(c.shape[0], 1.0 / c.shape[0])
    x = None if alpha >= 1.0 or len(space) < 3 or space[2] is None else np.ascontiguousarray(space[2], np.float64)
    return c, np.ascontiguousarray(w, dtype=np.float64), x


def solved_pairs(spaces: list, alpha: float) -> int:
    """The pairs :func:`gw_ldp.gw_matrix` solves for ``spaces``: those of distinct spaces."""
    items = [as_item(s, alpha) for s in spaces]
    u = len({c.tobytes() + (b"" if x is None else x.tobytes()) + bytes(str(c.shape), "ascii") for c, _, x in items})
    return u * (u - 1) // 2


def part_pairs(args, result: dict) -> None:
    for name in args.datasets:
        spaces, alpha, _ = gw_a_spaces(name)
        row = compare(spaces, alpha, pair_sample(len(spaces), args.pairs))
        row["solved_pairs"] = solved_pairs(spaces, alpha)
        result.setdefault("pairs", {})[f"{name}/GW_A"] = row
        print(f"  {name} GW_A: POT {row['pot_ms_per_pair']:.2f}, cg {row['cg_ms_per_pair']:.2f}, default "
              f"{row['default_ms_per_pair']:.2f} ms per pair (CPU); POT/default x{row['pot_over_default']:.2f}; "
              f"cg = POT on {row['cg_identical_to_pot']}/{row['pairs']}", flush=True)


def part_matrix(args, result: dict) -> None:
    """MUTAG's first 100 graphs, GW_A by default, 1 and 2 workers (wall seconds; equal matrices?)."""
    spaces, alpha, _ = gw_a_spaces("mutag")
    out, first = {}, None
    for workers in (1, 2):
        t0 = time.perf_counter()
        d = gw_ldp.gw_matrix(spaces[:100], workers, max_iter=MATRIX_CG_ITERATIONS, alpha=alpha)
        out[f"workers{workers}_s"] = time.perf_counter() - t0
        first = d if first is None else first
        out[f"workers{workers}_equal"] = bool(np.array_equal(d, first))
    out["symmetric_zero_diagonal"] = bool(np.array_equal(first, first.T) and not np.diag(first).any())
    result["mutag_matrix"] = out
    print(f"  MUTAG GW_A (100 graphs) by default: 1 worker {out['workers1_s']:.1f} s, 2 workers "
          f"{out['workers2_s']:.1f} s, equal: {out['workers2_equal']}", flush=True)


def table1_today() -> dict:
    """Table 1's converged figures per (dataset, matrix): SVC accuracy per fold and matrix seconds."""
    t1 = json.loads(TABLE1_JSON.read_text())["table1"]
    out = {}
    for name in DATASETS:
        if f"GW_A|{name}" in t1:
            row = t1[f"GW_A|{name}"]
            out[f"{name}/GW_A"] = {"accs": row["accs"], "gw_s": row["gw_s"]}
        if f"GW_H(GIN)|{name}" in t1:
            runs = t1[f"GW_H(GIN)|{name}"]["runs"]
            out[f"{name}/GW_H(GIN)"] = {"accs": [r["svc_test_acc"] for r in runs], "gw_s": [r["gw_s"] for r in runs]}
    return out


def gw_a_accuracy(name: str, folds: int) -> dict:
    """The default's whole GW_A matrix of ``name`` (2 workers) and its SVC accuracy per fold."""
    spaces, alpha, y = gw_a_spaces(name)
    t0 = time.perf_counter()
    d = gw_ldp.gw_matrix(spaces, 2, max_iter=MATRIX_CG_ITERATIONS, alpha=alpha)
    wall = time.perf_counter() - t0
    accs = [gw_ldp.svc_select(d, y, gw_ldp.split_items(len(spaces), 0, 0, fold=f))["test_acc"] for f in range(folds)]
    return {"accs": accs, "matrix_s": wall, "measured_by": MEASURED_BY}


class _RecordUploads:
    """While active, the strategy's :func:`gw_ldp.embedding_space` calls record each graph's embedding and
    its :func:`gw_ldp.svc_select` call the labels and split (the uploads the server's matrix is built from)."""

    def __enter__(self):
        self.real = gw_ldp.embedding_space, gw_ldp.svc_select
        self.h, self.y, self.split = [], None, None

        def space(h, *args, **kwargs):
            self.h.append(np.asarray(h, dtype=np.float64))
            return self.real[0](h, *args, **kwargs)

        def svc(dist, y, split, *args, **kwargs):
            self.y, self.split = np.asarray(y), np.asarray(split)
            return self.real[1](dist, y, split, *args, **kwargs)

        gw_ldp.embedding_space, gw_ldp.svc_select = space, svc
        return self

    def __exit__(self, *exc):
        gw_ldp.embedding_space, gw_ldp.svc_select = self.real
        return False


def fold_embeddings(name: str, fold: int) -> dict:
    """Per graph the class-score embedding of a GW_H(GIN) fold run with Table 1's settings (and its
    default GW matrix), the labels and split its SVC used: from the cache, else from a run that fills it."""
    path = EMBEDDINGS / f"{name}-gin-classes-fold{fold}.npz"
    if not path.exists():
        import gw_ldp as table1

        settings = SimpleNamespace(alpha=TABLE1_ALPHA, rounds=40, epochs=2, workers=2)
        with _RecordUploads() as rec:
            table1.fold_run(name, fold, "gin", float("inf"), settings, **DEFAULT_KEYS)
        EMBEDDINGS.mkdir(parents=True, exist_ok=True)
        np.savez(path, h=np.concatenate(rec.h), sizes=[len(h) for h in rec.h], y=rec.y, split=rec.split)
    z = np.load(path)
    return {"h": np.split(z["h"], np.cumsum(z["sizes"])[:-1]), "y": z["y"], "split": z["split"]}


def gw_h_accuracy(name: str, folds: int, pairs: int) -> dict:
    """GW_H(GIN) folds with Table 1's settings: the default's matrix on each fold's embeddings (CPU s,
    1 worker), its SVC accuracy, and the three solvers' CPU time on a sample of pairs of fold 0's graphs
    (POT and cg on the exactly merged spaces, the default on its own)."""
    accs, cpus, timing = [], [], None
    for fold in range(folds):
        emb = fold_embeddings(name, fold)
        spaces = [gw_ldp.embedding_space(h, features=True, decimals=MATRIX_MERGE_DECIMALS) for h in emb["h"]]
        stats: dict = {}

        def matrix() -> None:
            t0 = time.process_time()
            with threadpool_limits(limits=1):
                stats["d"] = gw_ldp.gw_matrix(spaces, 1, MATRIX_CG_ITERATIONS, stats, alpha=TABLE1_ALPHA)
            cpus.append(time.process_time() - t0)

        if timing is None:
            exact = [gw_ldp.embedding_space(h, features=True) for h in emb["h"]]
            timing = compare(exact, TABLE1_ALPHA, pair_sample(len(exact), pairs), spaces, halfway=matrix)
            timing.update(solved_pairs=solved_pairs(exact, TABLE1_ALPHA), default_solved_pairs=stats["solved_pairs"],
                          default_matrix_cpu_s=cpus[0], points_mean=float(np.mean([len(s[1]) for s in exact])),
                          default_points_mean=float(np.mean([len(s[1]) for s in spaces])))
        else:
            matrix()
        accs.append(gw_ldp.svc_select(stats["d"], emb["y"], emb["split"])["test_acc"])
        print(f"  {name} GW_H(GIN) fold {fold}: SVC {accs[-1]:.3f}, matrix {cpus[-1]:.1f} CPU s", flush=True)
    return {"accs": accs, "matrix_cpu_s": cpus, "timing": timing, "measured_by": MEASURED_BY}


def part_accuracy(args, result: dict) -> None:
    acc = result.setdefault("accuracy", {})
    for name in args.datasets:
        acc[f"{name}/GW_A"] = gw_a_accuracy(name, args.folds)
        print(f"  {name} GW_A by default: SVC {acc[f'{name}/GW_A']['accs']}, matrix "
              f"{acc[f'{name}/GW_A']['matrix_s']:.1f} s", flush=True)
        save(result)


def part_gw_h(args, result: dict) -> None:
    acc = result.setdefault("accuracy", {})
    for name in args.datasets:
        acc[f"{name}/GW_H(GIN)"] = gw_h_accuracy(name, args.folds, args.pairs)
        save(result)


def save(result: dict) -> None:
    JSON_PATH.write_text(json.dumps(result, indent=1) + "\n")


def _sampled(result: dict) -> dict:
    """Every sampled-pairs timing: the ``pairs`` part's and those of the ``gw-h`` part's fold 0."""
    sampled = dict(result.get("pairs", {}))
    for key, acc in result.get("accuracy", {}).items():
        if acc.get("timing"):
            sampled[key] = acc["timing"]
    return sampled


def timing_rows(result: dict) -> list[list[str]]:
    """Per (dataset, matrix): CPU ms per pair of each arm, the ratio, the whole matrix extrapolated."""
    rows = []
    for key, r in _sampled(result).items():
        name, matrix = key.split("/")
        pot_s = r["pot_ms_per_pair"] * r["solved_pairs"] / 2e3
        fast_s = r.get("default_matrix_cpu_s", 0.0) / 2 or r["default_ms_per_pair"] * r["solved_pairs"] / 2e3
        rows.append([name, matrix, f"{r['solved_pairs']:,} / {r.get('default_solved_pairs', r['solved_pairs']):,}",
                     str(r["pairs"]), " / ".join(f"{r[f'{arm}_ms_per_pair']:.2f}" for arm in ARMS),
                     f"x{r['pot_over_default']:.1f}", f"{pot_s:,.0f} / {fast_s:,.0f}", f"**x{pot_s / fast_s:.1f}**",
                     f"{r['default_spearman']:.3f}" if "default_spearman" in r else "-"])
    return rows


def accuracy_rows(result: dict, today: dict) -> list[list[str]]:
    """Per (dataset, matrix): SVC accuracy on the same folds (0-2, and all run), converged and by default."""
    rows = []
    for key, acc in result.get("accuracy", {}).items():
        name, matrix = key.split("/")
        cells = [name, matrix]
        for folds in (min(3, len(acc["accs"])), len(acc["accs"])):
            before = 100 * float(np.mean(today[key]["accs"][:folds]))
            after = 100 * float(np.mean(acc["accs"][:folds]))
            cells += [f"0-{folds - 1}", f"{before:.1f} / {after:.1f} ({after - before:+.1f})"]
        secs = acc["matrix_s"] if "matrix_s" in acc else float(np.median(acc["matrix_cpu_s"]))
        rows.append(cells + [f"{secs:.0f} " + ("wall, 2 workers" if "matrix_s" in acc else "CPU, 1 worker")])
    return rows


def provenance(result: dict) -> str:
    """Which accuracy rows (and the time rows sampled with them) this script measured, and which it did not."""
    keys = result.get("accuracy", {})
    ours = [k.replace("/", " ") for k, a in keys.items() if a.get("measured_by") == MEASURED_BY]
    others = {k.replace("/", " "): a for k, a in keys.items() if a.get("measured_by") != MEASURED_BY}
    text = f"Measured by `python {MEASURED_BY},gw-h`: {', '.join(ours) or 'none'}."
    if others:
        timed = [k for k, a in others.items() if a.get("timing")]
        text += (f" Entered from separate runs, not measured by this script: {', '.join(others)}"
                 + (f" (and the time table's {', '.join(timed)} row)" if timed else "") + ".")
    return text


def render(result: dict) -> str:
    today = table1_today()
    loads = [x for r in _sampled(result).values() for x in r.get("load", [])]
    load = f"load {min(loads):.0f}-{max(loads):.0f}" if loads else "load 10-16"
    out = [pages.paragraph(
        f"A GW matrix solves each pair by POT's conditional gradient (square loss; fused with alpha 0.5 where the "
        f"spaces carry features). By default (`gw-ldp.gw-max-iter` = {MATRIX_CG_ITERATIONS}) each pair's iteration "
        f"stops after {MATRIX_CG_ITERATIONS} linear programs; `gw-ldp.gw-max-iter=10000` runs it to convergence, "
        "where the project's solver (`gw-solver=cg`) gives POT's values bit for bit and `gw-solver=pot` calls POT. "
        "The stopped value is the objective at a coupling of the same iteration, so it is never below the converged "
        "one. Class-score embedding spaces (GW_H, `gw-ldp.embedding=classes`, as in Table 1) are built from the rows "
        f"rounded to {MATRIX_MERGE_DECIMALS} decimals by default (`gw-ldp.merge-decimals`), equal rows merged with "
        "their weights added (hidden-layer rows merge only where equal: their coarse merge is not measured): "
        "a 2-class softmax row then takes one of 101 points, so a graph has at most 101 points, not one per node; "
        f"`gw-ldp.merge-decimals={gw_ldp.EXACT_MERGE_DECIMALS}` merges only equal rows (the exact space, Table 1's). "
        "The default matrix differs from POT's, and is the same for any number of workers. CPU seconds of the three "
        f"solvers on the same pairs, one pair at a time, one after the other, on one BLAS thread; the machine was "
        f"shared ({load} on 2 cores), so ratios are the figure to read. The matrix seconds are extrapolations (ms "
        "per pair x solved pairs / 2 workers), except the GW_H(GIN) default's: its whole matrix's CPU seconds on "
        "one worker / 2, timed between the two halves of the sampled pairs. The matrix solves pairs of spaces of "
        "equal sizes in stacks (the same values as one pair at a time, bit for bit), which a graph collection's "
        "many small spaces of few sizes make cheaper than the per-pair figure says. Merged rows make more graphs' spaces equal, and equal spaces are solved once, so a "
        "GW_H matrix solves fewer pairs by default: its matrix ratio is the target's figure.")]
    out += ["## Time", pages.table(
        ["dataset", "matrix", "solved pairs: exact / default", "sampled pairs",
         "CPU ms per pair: POT / cg converged / default", "POT / default, per pair",
         "matrix s, 2 workers: POT / default", "POT / default, matrix", "Spearman, default vs converged"],
        timing_rows(result))]
    out += ["## SVC accuracy", pages.paragraph(
        "Table 1's protocol (`python benchmarks/gw_ldp.py`): ten-fold 7:2:1 splits, (C, gamma) on the validation "
        "graphs. Converged = Table 1's figures (POT); default = the same folds with the default solver (GW_A: "
        "the whole matrix here; GW_H(GIN): the default's matrix on the class-score embeddings of federated runs "
        "with Table 1's settings). The default's matrix seconds were measured on the shared machine (GW_A: "
        "wall, 2 workers; GW_H(GIN): CPU, 1 worker, median over folds): read the ratios above, not these. "
        + provenance(result)), pages.table(
        ["dataset", "matrix", "folds", "SVC %: converged / default (difference)", "folds",
         "SVC %: converged / default (difference)", "default matrix s, shared machine"],
        accuracy_rows(result, today))]
    m = result.get("mutag_matrix")
    if m:
        out.append(pages.paragraph(
            f"Workers: MUTAG's first 100 graphs, GW_A by default, 1 worker {m['workers1_s']:.1f} s and 2 workers "
            f"{m['workers2_s']:.1f} s (wall): the two matrices are {'equal' if m['workers2_equal'] else 'NOT equal'}"
            f", symmetric with a zero diagonal: {m['symmetric_zero_diagonal']}."))
    return "\n\n".join(out)


def main() -> int:
    ap = ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="pairs,matrix", type=list_arg(choices=("pairs", "matrix", "accuracy", "gw-h")))
    ap.add_argument("--datasets", default=",".join(DATASETS), type=list_arg(choices=DATASETS))
    ap.add_argument("--pairs", type=int, default=500, help="sampled pairs per dataset and matrix")
    ap.add_argument("--folds", type=int, default=3, help="parts accuracy, gw-h: Table 1 folds 0..folds-1")
    ap.add_argument("--report", action="store_true", help="only re-render docs/results/gw-solver.md from the JSON")
    args = ap.parse_args()
    result = json.loads(JSON_PATH.read_text()) if JSON_PATH.exists() else {}
    if not args.report:
        parts = {"pairs": part_pairs, "matrix": part_matrix, "accuracy": part_accuracy, "gw-h": part_gw_h}
        for name in args.parts:
            parts[name](args, result)
            save(result)
    print(pages.write_page("gw-solver", "The GW matrix's solver", render(result), REGENERATE))
    return 0


if __name__ == "__main__":
    raise SystemExit(run_script(main))
