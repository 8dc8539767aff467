"""Reading a user's edge list: fedgraphcore.data.formats.read_graph on a 1,000,000-edge CSV.

    python benchmarks/data_loading.py [--edges M] [--nodes N] [--repeat R] [--report]

Writes three CSV files of M distinct undirected edges over N nodes to a temporary
directory (integer IDs; string IDs such as ``user0001234``; string IDs with a
weight column), then times ``read_graph`` on each (best of R, wall clock and this
process's CPU time) next to pandas' ``read_csv`` of the same file alone, the floor
any reader pays. Prints the figures, writes ``benchmarks/results/data_loading.json`` and renders
the page docs/results/data.md (``--report``: only the page; benchmarks/data_partition.py renders it).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness import run_script, value_arg  # noqa: E402
from fedgraphcore.data.formats import read_graph  # noqa: E402
from data_partition import JSON_PATH, page  # noqa: E402


def edges(n: int, m: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``m`` distinct undirected edges without self-loops over ``n`` nodes, in random order and direction."""
    rng = np.random.default_rng(seed)
    keys = np.empty(0, dtype=np.int64)
    while keys.size < m:
        u, v = rng.integers(0, n, 2 * m), rng.integers(0, n, 2 * m)
        lo, hi = np.minimum(u, v), np.maximum(u, v)
        keys = np.unique(np.concatenate([keys, (lo * n + hi)[lo != hi]]))
    keys = rng.permutation(keys)[:m]
    lo, hi = keys // n, keys % n
    flip = rng.random(m) < 0.5
    return np.where(flip, hi, lo), np.where(flip, lo, hi)


def write_files(directory: Path, n: int, m: int) -> dict[str, Path]:
    import pandas as pd

    src, dst = edges(n, m)
    names = np.char.add("user", np.char.zfill(np.arange(n).astype(str), 7))
    weight = np.random.default_rng(1).integers(1, 10, m)
    files = {"integer IDs": directory / "int.csv", "string IDs": directory / "str.csv",
             "string IDs + weight": directory / "weighted.csv"}
    pd.DataFrame({"source": src, "target": dst}).to_csv(files["integer IDs"], index=False)
    pd.DataFrame({"source": names[src], "target": names[dst]}).to_csv(files["string IDs"], index=False)
    pd.DataFrame({"source": names[src], "target": names[dst], "weight": weight}).to_csv(files["string IDs + weight"],
                                                                                         index=False)
    return files


def timed(fn, repeat: int) -> tuple[float, float, object]:
    """Best wall-clock and best CPU seconds of ``repeat`` calls, and the last result."""
    wall, cpu, out = float("inf"), float("inf"), None
    for _ in range(repeat):
        w, c = time.perf_counter(), time.process_time()
        out = fn()
        wall, cpu = min(wall, time.perf_counter() - w), min(cpu, time.process_time() - c)
    return wall, cpu, out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--edges", type=value_arg(int, low=1), default=1_000_000)
    ap.add_argument("--nodes", type=value_arg(int, low=2), default=100_000)
    ap.add_argument("--repeat", type=value_arg(int, low=1), default=3)
    ap.add_argument("--out", default=str(JSON_PATH.with_name("data_loading.json")),
                    help="the JSON (the page is rendered from the default one)")
    ap.add_argument("--report", action="store_true", help="only render the page from the JSON files")
    args = ap.parse_args()
    if args.report:
        print(f"wrote {page()}")
        return 0
    import pandas as pd

    rows = []
    with tempfile.TemporaryDirectory(prefix="data-loading-") as tmp:
        files = write_files(Path(tmp), args.nodes, args.edges)
        print(f"{args.edges:,} distinct edges over {args.nodes:,} nodes; best of {args.repeat}")
        for case, path in files.items():
            wall, cpu, graph = timed(lambda: read_graph(path), args.repeat)
            pd_wall, pd_cpu, _ = timed(lambda: pd.read_csv(path), args.repeat)
            assert graph.num_edges == args.edges and not graph.meta["notes"]
            rows.append({"case": case, "file_mb": round(path.stat().st_size / 2**20, 1), "read_graph_s": round(wall, 3),
                         "read_graph_cpu_s": round(cpu, 3), "pandas_read_csv_s": round(pd_wall, 3),
                         "pandas_read_csv_cpu_s": round(pd_cpu, 3), "ratio_cpu": round(cpu / pd_cpu, 2),
                         "nodes": graph.num_nodes, "edges": graph.num_edges})
            print(f"  {case:<22} {rows[-1]['file_mb']:6.1f} MB  read_graph {wall:6.2f} s (cpu {cpu:5.2f} s)   "
                  f"pandas.read_csv alone {pd_wall:5.2f} s (cpu {pd_cpu:5.2f} s)   cpu ratio {cpu / pd_cpu:4.1f}")
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "benchmark": "data_loading",
        "edges": args.edges,
        "nodes": args.nodes,
        "repeat": args.repeat,
        "machine": {
            "python": platform.python_version(),
            "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
            "load_average_1_5_15min_at_end": list(os.getloadavg()),
        },
        "peak_rss_mib": round(peak_mib),
        "timings": rows,
    }, indent=2) + "\n")
    print(f"peak RSS {peak_mib:.0f} MiB; wrote {out} (load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} "
          "CPUs: wall-clock figures include waiting for the CPU, the cpu figures do not)")
    if out.resolve() == JSON_PATH.with_name("data_loading.json"):
        print(f"wrote {page()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_script(main))
