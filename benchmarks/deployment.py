"""Deployed vs simulated runs: wall time, rounds, messages, bytes, and where a deployed round goes.

    python benchmarks/deployment.py [--strategy all|NAME ...] [--nodes 5] [--set KEY=VALUE ...]

For each strategy (``all``: the eight, each on its representative dataset in
:data:`CASES`), runs the experiment (1) on a local TLS deployment (SuperLink,
Fleet gateway and authenticated SuperNodes as processes, one shard file each;
``deploy.local``, with ``deploy.flower_shim`` unless ``FEDGRAPH_FLOWER_SHIM=0``)
and (2) through ``run_simulation`` with the same config and seed, checks that
both give the same labels, and prints one table: simulation and deployed wall
time, their ratio, rounds, messages, bytes, identical labels. Both runs skip
the centralised reference (``reference=false``).

The deployed run sets ``FEDGRAPH_TIMING=1``: every SuperNode logs when it
pulled each message and pushed its reply, and every ClientApp process when it
started, began and finished importing the app and left the handler. The
second table splits the deployed rounds (after the handshake) into those
stages, as medians over every node and round: SuperNode pick-up (server send
to SuperNode pull done), ClientApp start (send to ClientApp process start),
Flower runtime (process start to the app's import: connect, pull the message,
unpack the app bundle), app imports, compute (the handler), reply (handler
return to the SuperNode's push done), server pick-up (last push to the
server's receipt); and the CPU seconds of one ClientApp process (what a
message costs its node, however busy the machine). Writes
benchmarks/results/deployment.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from app.run import run_experiment  # noqa: E402
from deploy.__main__ import run_local  # noqa: E402
from deploy.flower_shim import SETTING, TIMING, TIMING_SETTING, enabled  # noqa: E402

#: strategy -> (its representative dataset, run-config settings)
CASES = {
    "fedkmeans": ("cora", []),
    "kcagc": ("cora", []),
    "kcagc-basic": ("cora", []),
    "fedspectral": ("email-eu-core", []),
    "fedspectral-plus": ("ego-facebook", ["partition.overlap=0.4", "num-clusters=10"]),
    "fedsc": ("iris", []),
    "gw-ldp": ("mutag", []),
    "fedavg-dmon": ("cora", []),
}
STAGES = ("supernode_pickup", "clientapp_start", "flower_runtime", "app_imports", "compute", "reply",
          "server_pickup", "clientapp_cpu")
_CLIENTAPP = re.compile(rf"{TIMING} clientapp (\S+) started=(\S+) loading=(\S+) loaded=(\S+) entered=(\S+) "
                        r"left=(\S+) cpu=(\S+)")
_NODE = re.compile(rf"{TIMING} (pulled|pushed) (\S+)")


def node_messages(log: str) -> list[dict]:
    """Per message a node handled, in order: its action and the times of its stages."""
    events = {"pulled": [], "pushed": []}
    for kind, at in _NODE.findall(log):
        events[kind].append(float(at))
    apps = [dict(zip(("action", "started", "loading", "loaded", "entered", "left", "cpu"), (a, *map(float, rest))))
            for a, *rest in _CLIENTAPP.findall(log)]
    return [{**app, "pulled": pulled, "pushed": pushed}
            for app, pulled, pushed in zip(apps, events["pulled"], events["pushed"])]


def round_stages(rounds: list[dict], logs: list[str]) -> dict[str, list[float]]:
    """Seconds of each stage (:data:`STAGES`) for every node and round of ``rounds``
    (result.json ``timing.per_round``), matched to each node's messages by action, in order."""
    stages = {name: [] for name in STAGES}
    pushes: dict[int, list[float]] = {}
    for log in logs:
        position = 0
        for message in node_messages(log):
            later = [i for i in range(position, len(rounds)) if rounds[i]["action"] == message["action"]]
            if not later:  # a setup step (hello, key exchange): not one of ``rounds``
                continue
            position = later[0]
            sent = rounds[position]["sent_at"]
            stages["supernode_pickup"].append(message["pulled"] - sent)
            stages["clientapp_start"].append(message["started"] - sent)
            stages["flower_runtime"].append(message["loading"] - message["started"])
            stages["app_imports"].append(message["loaded"] - message["loading"])
            stages["compute"].append(message["left"] - message["loaded"])
            stages["reply"].append(message["pushed"] - message["left"])
            stages["clientapp_cpu"].append(message["cpu"])
            pushes.setdefault(position, []).append(message["pushed"])
            position += 1
    for position, pushed in pushes.items():
        r = rounds[position]
        stages["server_pickup"].append(r["sent_at"] + r["seconds"] - max(pushed))
    return stages


def run_case(strategy: str, dataset: str, sets: list[str], nodes: int, work: Path) -> dict:
    sets = [*sets, "reference=false"]
    start = time.perf_counter()
    path = run_local(nodes, strategy, dataset, "auto", sets, work / "deployed")
    deployed_wall = time.perf_counter() - start
    deployed = json.loads(path.read_text())
    logs = [p.read_text(errors="replace") for p in sorted((work / "deployed").glob("supernode-*.log"))]

    overrides = {"partitioner": "auto"}
    overrides.update(item.split("=", 1) for item in sets)
    start = time.perf_counter()
    simulated = run_experiment(strategy, dataset, nodes, overrides, work / "simulated", engine="simulation")
    simulated_wall = time.perf_counter() - start

    same = bool(np.array_equal(np.load(path.parent / "labels.npy"), np.load(work / "simulated" / "labels.npy")))
    rounds = deployed["timing"]["per_round"]
    stages = round_stages(rounds, logs)
    return {
        "strategy": strategy, "dataset": dataset, "sets": sets, "nodes": nodes, "same_labels": same,
        "simulation_s": simulated_wall, "deployed_s": deployed_wall, "ratio": deployed_wall / simulated_wall,
        "deployed_protocol_s": deployed["timing"]["protocol_s"], "simulated_protocol_s": simulated["timing"]["protocol_s"],
        "rounds": deployed["timing"]["rounds"], "simulated_rounds": simulated["timing"]["rounds"],
        "messages": deployed["communication"]["messages"],
        "simulated_messages": simulated["communication"]["messages"],
        "bytes": deployed["communication"]["bytes_up"] + deployed["communication"]["bytes_down"],
        "median_round_s": float(np.median([r["seconds"] for r in rounds])) if rounds else None,
        "simulated_median_round_s": float(np.median(simulated["timing"]["per_round_s"] or [np.nan])),
        "median_stage_s": {k: float(np.median(v)) for k, v in stages.items() if v},
    }


def print_tables(cases: list[dict]) -> None:
    print(f"{'strategy':<18}{'dataset':<15}{'sim s':>8}{'deployed s':>12}{'ratio':>7}{'rounds':>8}"
          f"{'messages':>10}{'bytes':>12}{'labels':>8}{'median round s':>16}")
    for c in cases:
        print(f"{c['strategy']:<18}{c['dataset']:<15}{c['simulation_s']:>8.1f}{c['deployed_s']:>12.1f}"
              f"{c['ratio']:>7.2f}{c['rounds']:>8}{c['messages']:>10}{c['bytes']:>12}"
              f"{'same' if c['same_labels'] else 'DIFFER':>8}{c['median_round_s'] or 0:>16.3f}")
    print("\nmedian seconds per stage of a deployed round (every node and round after the handshake):")
    print(f"{'strategy':<18}" + "".join(f"{s:>18}" for s in STAGES))
    for c in cases:
        print(f"{c['strategy']:<18}" + "".join(f"{c['median_stage_s'].get(s, float('nan')):>18.3f}" for s in STAGES))


def markdown_tables(cases: list[dict]) -> str:
    """The two tables of :func:`print_tables` in Markdown (for benchmarks/RESULTS.md)."""
    lines = ["| strategy | dataset | simulation s | deployed s | ratio | rounds | messages | bytes | identical labels "
             "| median deployed round s |", "|---|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| `{c['strategy']}` | {c['dataset']} | {c['simulation_s']:.1f} | {c['deployed_s']:.1f} | "
              f"{c['ratio']:.2f} | {c['rounds']} | {c['messages']} | {c['bytes']:,} | "
              f"{'yes' if c['same_labels'] else 'no'} | {c['median_round_s'] or 0:.2f} |" for c in cases]
    stages = [s for s in STAGES if any(s in c["median_stage_s"] for c in cases)]
    lines += ["", "| strategy | " + " | ".join(s.replace("_", " ") for s in stages) + " |",
              "|---|" + "---|" * len(stages)]
    lines += [f"| `{c['strategy']}` | " + " | ".join(f"{c['median_stage_s'][s]:.2f}" if s in c["median_stage_s"]
                                                   else "" for s in stages) + " |" for c in cases]
    return "\n".join(lines)


def kept_cases(out: Path, strategies: list[str], args) -> list[dict]:
    """The rows of ``out`` for strategies this run does not measure, where ``out`` was written with the
    same node count, shim setting and extra settings (re-running one strategy keeps the others')."""
    if not out.exists():
        return []
    earlier = json.loads(out.read_text())
    if (earlier.get("nodes"), earlier.get("flower_shim"), earlier.get("sets", [])) != (args.nodes, enabled(), args.set):
        return []
    return [c for c in earlier.get("cases", []) if c["strategy"] not in strategies]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategy", nargs="+", default=["all"], choices=["all", *CASES])
    parser.add_argument("--nodes", type=int, default=5)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="added to every case's settings")
    args = parser.parse_args()
    os.environ[TIMING_SETTING] = "1"
    work = Path(tempfile.mkdtemp(prefix="deploy-bench-"))
    strategies = list(CASES) if "all" in args.strategy else args.strategy
    out = HERE / "results" / "deployment.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    cases = []
    for strategy in strategies:
        dataset, sets = CASES[strategy]
        cases.append(run_case(strategy, dataset, [*sets, *args.set], args.nodes, work / strategy))
        print_tables(cases[-1:])
        report = {"flower_shim": enabled(), "nodes": args.nodes, "sets": args.set, "cases": kept_cases(out, strategies, args) + cases}
        out.write_text(json.dumps(report, indent=2) + "\n")  # after every case: a partial run keeps its rows
    print()
    print_tables(cases)
    print()
    print(markdown_tables(cases))
    print(f"written {out} ({SETTING}={'on' if enabled() else 'off'})")


if __name__ == "__main__":
    main()
