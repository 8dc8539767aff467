"""Per-round latency and total time: real deployment vs simulation, same run.

    python benchmarks/deployment.py [--strategy fedspectral-plus] [--dataset ego-facebook]
        [--partitioner edge] [--nodes 5] [--set KEY=VALUE ...]

Runs the experiment (1) on a local TLS deployment (SuperLink + authenticated
SuperNodes as processes, one shard file each; ``deploy.LocalFederation``) and
(2) through ``run_simulation`` with the same config and seed, checks that both
give the same labels, and prints protocol time, per-round latency and total
wall time for each. Writes benchmarks/results/deployment.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from app.run import run_experiment  # noqa: E402
from deploy.__main__ import run_local  # noqa: E402


def summarise(result: dict, wall_s: float) -> dict:
    rounds = result["timing"]["per_round_s"]
    return {
        "wall_s": wall_s,
        "protocol_s": result["timing"]["protocol_s"],
        "rounds": len(rounds),
        "first_round_s": rounds[0] if rounds else None,
        "median_round_s": float(np.median(rounds)) if rounds else None,
        "handshake_s": result["timing"].get("handshake_s"),
        "metrics": result["metrics"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategy", default="fedspectral-plus")
    parser.add_argument("--dataset", default="ego-facebook")
    parser.add_argument("--partitioner", default="edge")
    parser.add_argument("--nodes", type=int, default=5)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="deploy-bench-"))

    start = time.perf_counter()
    path = run_local(args.nodes, args.strategy, args.dataset, args.partitioner, args.set, work / "deployed")
    deployed = json.loads(path.read_text())
    deployed_wall = time.perf_counter() - start

    overrides = {"partitioner": args.partitioner, "reference": False}
    overrides.update(item.split("=", 1) for item in args.set)
    start = time.perf_counter()
    simulated = run_experiment(args.strategy, args.dataset, args.nodes, overrides, work / "simulated",
                               engine="simulation")
    simulated_wall = time.perf_counter() - start

    same = bool(np.array_equal(np.load(path.parent / "labels.npy"), np.load(work / "simulated" / "labels.npy")))
    report = {
        "strategy": args.strategy, "dataset": args.dataset, "nodes": args.nodes, "sets": args.set,
        "same_labels": same,
        "deployment": summarise(deployed, deployed_wall),
        "simulation": summarise(simulated, simulated_wall),
    }
    print(f"{args.strategy} on {args.dataset}, {args.nodes} nodes; identical labels: {same}")
    print(f"{'engine':<12}{'wall s':>9}{'protocol s':>12}{'rounds':>8}{'median round s':>16}")
    for engine in ("deployment", "simulation"):
        r = report[engine]
        print(f"{engine:<12}{r['wall_s']:>9.1f}{r['protocol_s']:>12.2f}{r['rounds']:>8}{r['median_round_s']:>16.3f}")
    out = HERE / "results" / "deployment.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"written {out}")


if __name__ == "__main__":
    main()
