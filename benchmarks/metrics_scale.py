"""Metrics at scale: every metric of fedgraphcore.metrics on a 1,000,000-node graph.

    python benchmarks/metrics_scale.py [--nodes N] [--edges M] [--clusters K] [--report]

Builds a random graph with N nodes and about M undirected edges (70 % local,
30 % uniform), ground truth with K classes and a prediction that agrees on
~80 % of the nodes, then times each metric (best of 3). Prints the figures,
writes ``benchmarks/results/metrics_scale.json`` and renders the page
docs/results/metrics.md from it (``--report``: only the page).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np
import scipy.sparse as sp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fedgraphcore import metrics as M  # noqa: E402
from pages import RESULTS_DIR, figure, image_path, paragraph, read_results, table, write_page  # noqa: E402

JSON_PATH = RESULTS_DIR / "metrics_scale.json"
MEASURE = "python benchmarks/metrics_scale.py"
SKLEARN_SHORT = {"sklearn adjusted_rand_score": "ari", "sklearn normalized_mutual_info_score": "nmi"}


def build(n: int, m: int, k: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, k, n)
    pred = np.where(rng.random(n) < 0.8, y, rng.integers(0, k, n)) * 7 + 1000  # arbitrary ints
    rows = rng.integers(0, n, m)
    local = rng.random(m) < 0.7
    cols = np.where(local, rows + rng.integers(1, 100, m), rng.integers(0, n, m)) % n
    keep = rows != cols
    A = sp.csr_matrix((np.ones(int(keep.sum())), (rows[keep], cols[keep])), shape=(n, n))
    A = (A + A.T).tocsr()
    A.data[:] = 1.0
    return y, pred, A


def timed(fn, repeat: int = 3):
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1_000_000)
    ap.add_argument("--edges", type=int, default=5_000_000, help="undirected edges drawn (before dedup)")
    ap.add_argument("--clusters", type=int, default=50)
    ap.add_argument("--out", default=str(JSON_PATH), help="the JSON (the page is rendered from the default one)")
    ap.add_argument("--report", action="store_true", help="only render the page from the JSON")
    args = ap.parse_args(argv)
    if args.report:
        print(f"wrote {page()}")
        return 0
    t0 = time.perf_counter()
    y, pred, A = build(args.nodes, args.edges, args.clusters)
    build_s = time.perf_counter() - t0
    print(f"graph: {args.nodes:,} nodes, {A.nnz // 2:,} undirected edges, {args.clusters} classes "
          f"(built in {build_s:.2f} s)")
    cases = {
        "accuracy": lambda: M.accuracy(y, pred),
        "macro_f1": lambda: M.macro_f1(y, pred),
        "nmi": lambda: M.nmi(y, pred),
        "ari": lambda: M.ari(y, pred),
        "cluster_similarity": lambda: M.cluster_similarity(y, pred),
        "pairwise_prf": lambda: M.pairwise_prf(y, pred),
        "agreement": lambda: M.agreement(y, pred),
        "modularity": lambda: M.modularity(A, pred),
        "conductance": lambda: M.conductance(A, pred),
        "evaluate (all label + graph metrics)": lambda: M.evaluate(pred, y_true=y, adj=A),
    }
    rows = []
    for name, fn in cases.items():
        secs, value = timed(fn)
        rows.append({"metric": name, "seconds": round(secs, 4), "value": value})
        shown = value if not isinstance(value, float) else round(value, 6)
        print(f"  {name:<40} {secs:8.3f} s   {shown}")
    tracemalloc.start()
    M.evaluate(pred, y_true=y, adj=A)
    M.agreement(y, pred)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    total = sum(r["seconds"] for r in rows if r["metric"] not in ("evaluate (all label + graph metrics)",))
    print(f"  sum of individual metrics: {total:.3f} s; peak extra memory (evaluate + agreement) "
          f"{peak / 2**20:.0f} MiB (an N x N float matrix would need {args.nodes**2 * 8 / 2**40:.1f} TiB)")
    try:  # reference timings of scikit-learn on the same labels
        from sklearn import metrics as skm

        sk = {
            "sklearn adjusted_rand_score": timed(lambda: skm.adjusted_rand_score(y, pred), 1)[0],
            "sklearn normalized_mutual_info_score": timed(lambda: skm.normalized_mutual_info_score(y, pred), 1)[0],
        }
        for k, v in sk.items():
            print(f"  {k:<40} {v:8.3f} s")
    except Exception:  # pragma: no cover
        sk = {}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "benchmark": "metrics_scale",
        "nodes": args.nodes,
        "undirected_edges": int(A.nnz // 2),
        "clusters": args.clusters,
        "build_s": round(build_s, 3),
        "machine": {
            "python": platform.python_version(),
            "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
            "load_average_1_5_15min_at_end": list(os.getloadavg()),
        },
        "timings": rows,
        "sum_individual_s": round(total, 4),
        "peak_memory_mib": round(peak / 2**20, 1),
        "sklearn_s": {k: round(v, 4) for k, v in sk.items()},
    }, indent=2, default=float) + "\n")
    print(f"wrote {out} (load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs: timings are wall-clock)")
    if out.resolve() == JSON_PATH:
        print(f"wrote {page()}")
    return 0


def page() -> Path:
    """docs/results/metrics.md from metrics_scale.json."""
    import plots

    res = read_results("metrics_scale.json", MEASURE)
    rows = [[f"`{t['metric']}`" if " " not in t["metric"] else t["metric"], f"{t['seconds']:.3f}"]
            for t in res["timings"]]
    rows += [[name.replace("sklearn ", "scikit-learn `") + "` (same labels)", f"{secs:.3f}"]
             for name, secs in res["sklearn_s"].items()]
    names = [t["metric"].split(" ")[0] for t in res["timings"]] + [f"{SKLEARN_SHORT.get(n, n)} (scikit-learn)"
                                                                   for n in res["sklearn_s"]]
    seconds = [t["seconds"] for t in res["timings"]] + list(res["sklearn_s"].values())
    bars = plots.plot_grouped_bars(names, {"seconds": seconds}, image_path("metrics_scale.png"),
                                   ylabel="seconds (best of 3)",
                                   title=f"Metrics on {res['nodes']:,} nodes, {res['undirected_edges']:,} edges")
    load = res["machine"]["load_average_1_5_15min_at_end"][0]
    body = "\n\n".join([
        paragraph(f"`{MEASURE}`: a random graph of {res['nodes']:,} nodes and {res['undirected_edges']:,} undirected "
                  f"edges (70% local, 30% uniform), a ground truth of {res['clusters']} classes and a prediction "
                  "that agrees with it on about 80% of the nodes; each metric of `fedgraphcore.metrics` timed, best of 3, "
                  f"wall clock at load average {load:.0f} on {res['machine']['cpus']} CPUs."),
        table(["metric", "seconds"], rows),
        figure(bars, "seconds per metric on a 1,000,000-node graph"),
        paragraph(f"Peak extra memory of `evaluate` and `agreement`: {res['peak_memory_mib']:.0f} MiB; no metric "
                  "builds an N x N matrix (one of float64 would need "
                  f"{res['nodes'] ** 2 * 8 / 2 ** 40:.1f} TiB). The label metrics work on the contingency table of "
                  "the two labelings, the graph metrics on the sparse adjacency. The time of each centralised "
                  "reference is part of every run's `result.json` (`reference.time_s`) and of the method pages."),
    ])
    return write_page("metrics", "Metrics at scale", body, "python benchmarks/metrics_scale.py --report")


if __name__ == "__main__":
    raise SystemExit(main())
