"""Secure aggregation at scale: the largest SBM each secure strategy runs on at default settings.

    python benchmarks/secure_scale.py [--sizes 1000,10000,100000] [--clients 2] [--cap-s 300]
        [--strategies fedkmeans,...]

For each strategy with secure aggregation switched on (kcagc and kcagc-basic always mask with
several clients) and each size, one in-process run on a sparse SBM (4 blocks, mean degree about 10,
16 features) with every other setting at its default and no centralised reference. A size is
"ok" when the run writes its result, else its error line is kept; each run is its own process,
stopped after ``--cap-s`` seconds (the shared machine is not burnt on one method), and the sizes
of a strategy stop at its first failure. Prints one line per run and writes ``benchmarks/results/secure_scale.json``
with the largest size each strategy handled.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


SECURE = {
    "fedkmeans": {"fedkmeans.secure": True},
    "fedspectral-plus": {"fedspectral-plus.secure": True},
    "fedsc": {"fedsc.secure": True},
    "fedavg-dmon": {"fedavg-dmon.secure": True},
    "kcagc": {},
    "kcagc-basic": {},
}
MEAN_DEGREE = 10.0
BLOCKS = 4


def sbm_settings(nodes: int) -> dict:
    """A sparse SBM of ``nodes`` nodes: about ``MEAN_DEGREE`` neighbours, 80% inside the block."""
    block = nodes / BLOCKS
    return {"sbm.nodes": nodes, "sbm.blocks": BLOCKS, "sbm.p-in": min(1.0, 0.8 * MEAN_DEGREE / block),
            "sbm.p-out": min(1.0, 0.2 * MEAN_DEGREE / (nodes - block))}


def run_one(strategy: str, nodes: int, clients: int, cap_s: float) -> dict:
    """One run of ``python -m app.run`` (in-process engine) in its own process, stopped after ``cap_s``."""
    settings = {**sbm_settings(nodes), **SECURE[strategy], "reference": False}
    sets = sum((["--set", f"{k}={v}"] for k, v in settings.items()), [])
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "app.run", "--strategy", strategy, "--dataset", "sbm", "--num-clients",
               str(clients), "--engine", "inprocess", "--out", str(Path(out) / "run"), *sets]
        try:
            proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=cap_s)
        except subprocess.TimeoutExpired:
            outcome = {"ok": False, "error": f"over {cap_s:g} s (stopped)"}
        else:
            result = Path(out) / "run" / "result.json"
            if result.exists():
                done = json.loads(result.read_text())
                outcome = {"ok": True, "ari": done["metrics"].get("ari"),
                           "secure_aggregations": done["communication"]["secure_aggregations"]}
            else:
                lines = [line for line in (proc.stderr + proc.stdout).splitlines() if line.startswith("error:")]
                outcome = {"ok": False, "error": lines[-1] if lines else (proc.stderr or proc.stdout)[-300:]}
    return {"strategy": strategy, "nodes": nodes, "clients": clients, "seconds": time.perf_counter() - started,
            **outcome}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,10000,100000", help="SBM node counts, ascending, comma-separated")
    ap.add_argument("--clients", type=int, default=2)
    ap.add_argument("--cap-s", type=float, default=300.0, help="a run is stopped (and counts as failed) after this")
    ap.add_argument("--strategies", default=",".join(SECURE))
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "secure_scale.json"))
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    runs, largest = [], {}

    def write() -> None:  # after every run: a stopped benchmark keeps what it measured
        Path(args.out).write_text(json.dumps({"sizes": sizes, "clients": args.clients, "cap_s": args.cap_s,
                                              "mean_degree": MEAN_DEGREE, "blocks": BLOCKS, "largest": largest,
                                              "runs": runs, "machine": platform.platform()}, indent=1) + "\n")

    for strategy in args.strategies.split(","):
        largest[strategy] = None
        for nodes in sizes:
            run = run_one(strategy, nodes, args.clients, args.cap_s)
            runs.append(run)
            print(f"{strategy:17s} {nodes:>9d} nodes  {run['seconds']:8.1f} s  "
                  + (f"ok, ari {run['ari']:.3f}" if run["ok"] else run["error"][:200]), flush=True)
            if run["ok"]:
                largest[strategy] = nodes
            write()
            if not run["ok"]:
                break
    print("largest SBM handled at default settings: "
          + ", ".join(f"{s} {n if n is not None else 'none'}" for s, n in largest.items()))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
