"""Deployed vs simulated runs: wall time, rounds, messages, bytes, and where a deployed round goes.

    python benchmarks/deployment.py [--strategy all|NAME ...] [--nodes 5] [--set KEY=VALUE ...] [--report]
    python benchmarks/deployment.py --netns --latency-ms 50 [--strategy ...]

For each strategy (``all``: the eight, each on its representative dataset in
:data:`CASES`), runs the experiment (1) on a local TLS deployment (SuperLink,
Fleet gateway and authenticated SuperNodes as processes, one shard file each;
``deploy.local``, with ``deploy.flower_shim`` unless ``FEDGRAPH_FLOWER_SHIM=0``)
and (2) through ``run_simulation`` with the same config and seed, checks that
both give the same labels, and prints one table: the simulation's wall time,
the deployed run's (``flwr run``, on a federation whose SuperNodes are ready,
as an organisation's long-lived ones are) and their ratio, the time to start
the federation, rounds, messages, bytes, identical labels. Both runs skip the
centralised reference (``reference=false``).

The deployed run sets ``FEDGRAPH_TIMING=1``: every SuperNode logs when it
pulled each message and pushed its reply, and every ClientApp process when it
started, began and finished importing the app and left the handler. The
second table splits the deployed rounds (after the handshake) into those
stages, as medians over every node and round: SuperNode pick-up (server send
to SuperNode pull done), ClientApp start (send to ClientApp process start),
Flower runtime (process start to the handler, less the app's imports:
connect, pull the message, install the app bundle), app imports (timed here,
a fresh process importing the ClientApp module; none for a ClientApp forked
from the process that loaded the bundle), compute (the
handler), reply (handler return to the SuperNode's push done), server pick-up
(last push to the server's receipt); and the CPU seconds of one ClientApp
process (what a message costs its node, however busy the machine). Writes
benchmarks/results/deployment.json (with ``FEDGRAPH_FLOWER_SHIM=0``:
deployment_plain.json) and renders the page docs/results/deployment.md from
them; ``--report``: only the page.

``--netns --latency-ms MS`` (root): each strategy deployed with the SuperLink host and
every SuperNode in a network namespace of its own (:mod:`deploy.netns`), every
SuperNode's link delayed MS each way (:mod:`deploy.faults`); its rounds, wall time
and median round against the in-process run's labels, in deployment_netns.json
and a section of the page.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

from app.run import run_experiment  # noqa: E402
from deploy.__main__ import RUN_TIMING, run_local  # noqa: E402
from deploy.flower_shim import SETTING, TIMING, TIMING_SETTING, enabled  # noqa: E402
from deploy.netns import check_options  # noqa: E402
from pages import RESULTS_DIR, figure, image_path, paragraph, read_results, table, write_page  # noqa: E402

MEASURE = "python benchmarks/deployment.py"
#: the page's names of :data:`STAGES`
STAGE_NAMES = {"supernode_pickup": "SuperNode pick-up", "clientapp_start": "ClientApp start",
               "flower_runtime": "Flower runtime", "app_imports": "app imports", "compute": "compute",
               "reply": "reply", "server_pickup": "server pick-up", "clientapp_cpu": "CPU per ClientApp"}
RATIO_TARGET = 3.0
NO_REFERENCE = "reference=false"
ROUND_TARGET_S = 1.0

#: strategy -> (its representative dataset, run-config settings)
CASES = {
    "fedkmeans": ("cora", []),
    "kcagc": ("cora", []),
    "kcagc-basic": ("cora", []),
    "fedspectral": ("email-eu-core", []),
    "fedspectral-plus": ("ego-facebook", ["partition.overlap=0.4", "num-clusters=10"]),
    "fedsc": ("iris", []),
    # its LDP noise is drawn from the OS's entropy on purpose (no seed repeats it): without noise the
    # deployed and simulated labels can be compared
    "gw-ldp": ("mutag", ["gw-ldp.epsilon=inf"]),
    "fedavg-dmon": ("cora", []),
}
STAGES = ("supernode_pickup", "clientapp_start", "flower_runtime", "app_imports", "compute", "reply",
          "server_pickup", "clientapp_cpu")
_CLIENTAPP = re.compile(rf"{TIMING} clientapp (\S+) started=(\S+) entered=(\S+) left=(\S+) cpu=(\S+)")
_NODE = re.compile(rf"{TIMING} (pulled|pushed) (\S+)")


def node_messages(log: str) -> list[dict]:
    """Per message a node handled, in order: its action and the times of its stages."""
    events = {"pulled": [], "pushed": []}
    for kind, at in _NODE.findall(log):
        events[kind].append(float(at))
    apps = [dict(zip(("action", "started", "entered", "left", "cpu"), (a, *map(float, rest))))
            for a, *rest in _CLIENTAPP.findall(log)]
    return [{**app, "pulled": pulled, "pushed": pushed}
            for app, pulled, pushed in zip(apps, events["pulled"], events["pushed"])]


def app_import_s() -> float:
    """Seconds a fresh process takes to import the ClientApp module (best of three), what a
    ClientApp that is not forked from a process holding the app pays before its handler runs."""
    code = "import time; t = time.perf_counter(); import app.client_app; print(time.perf_counter() - t)"
    return min(float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                    cwd=REPO).stdout) for _ in range(3))


def round_stages(rounds: list[dict], logs: list[str], imports: float = 0.0) -> dict[str, list[float]]:
    """Seconds of each stage (:data:`STAGES`) for every node and round of ``rounds``
    (result.json ``timing.per_round``), matched to each node's messages by action, in order.
    ``imports``: the app's import seconds of each ClientApp (:func:`app_import_s`; 0 where the
    shim forks each ClientApp from a process that imported the app)."""
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
            stages["flower_runtime"].append(message["entered"] - message["started"] - imports)
            stages["app_imports"].append(imports)
            stages["compute"].append(message["left"] - message["entered"])
            stages["reply"].append(message["pushed"] - message["left"])
            stages["clientapp_cpu"].append(message["cpu"])
            pushes.setdefault(position, []).append(message["pushed"])
            position += 1
    for position, pushed in pushes.items():
        r = rounds[position]
        stages["server_pickup"].append(r["sent_at"] + r["seconds"] - max(pushed))
    return stages


def run_case(strategy: str, dataset: str, sets: list[str], nodes: int, work: Path) -> dict:
    sets = [*sets, NO_REFERENCE]
    load_start = os.getloadavg()[0]
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
    stages = round_stages(rounds, logs, 0.0 if enabled() else app_import_s())
    run = json.loads((work / "deployed" / RUN_TIMING).read_text())
    return {
        "strategy": strategy, "dataset": dataset, "sets": sets, "nodes": nodes, "same_labels": same,
        "simulation_s": simulated_wall, "deployed_s": run["flwr_run_s"], "ratio": run["flwr_run_s"] / simulated_wall,
        "federation_start_s": run["federation_start_s"], "deployed_total_s": deployed_wall,
        "deployed_protocol_s": deployed["timing"]["protocol_s"], "simulated_protocol_s": simulated["timing"]["protocol_s"],
        "rounds": deployed["timing"]["rounds"], "simulated_rounds": simulated["timing"]["rounds"],
        "messages": deployed["communication"]["messages"],
        "simulated_messages": simulated["communication"]["messages"],
        "bytes": deployed["communication"]["bytes_up"] + deployed["communication"]["bytes_down"],
        "median_round_s": float(np.median([r["seconds"] for r in rounds])) if rounds else None,
        "simulated_median_round_s": float(np.median(simulated["timing"]["per_round_s"] or [np.nan])),
        "median_stage_s": {k: float(np.median(v)) for k, v in stages.items() if v},
        "load_average": f"{min(load_start, os.getloadavg()[0]):.0f}-{max(load_start, os.getloadavg()[0]):.0f}",
    }


def round_verdict(cases: list[dict]) -> str:
    """Which strategies meet :data:`ROUND_TARGET_S`, and the median round and handler time of the others."""
    met = [c for c in cases if c["median_round_s"] is not None and c["median_round_s"] <= ROUND_TARGET_S]
    missed = [c for c in cases if c not in met]
    if not missed:
        return "met"
    said = ("met by " + ", ".join(f"`{c['strategy']}`" for c in met) + "; " if met else "") + "not met by "
    return said + ", ".join(f"`{c['strategy']}` ({c['median_round_s']:.2f} s, its handler "
                            f"{c['median_stage_s'].get('compute', float('nan')):.2f} s)" for c in missed)


def print_tables(cases: list[dict]) -> None:
    print(f"{'strategy':<18}{'dataset':<15}{'sim s':>8}{'deployed s':>12}{'ratio':>7}{'start s':>9}{'rounds':>8}"
          f"{'messages':>10}{'bytes':>12}{'labels':>8}{'median round s':>16}")
    for c in cases:
        print(f"{c['strategy']:<18}{c['dataset']:<15}{c['simulation_s']:>8.1f}{c['deployed_s']:>12.1f}"
              f"{c['ratio']:>7.2f}{c['federation_start_s']:>9.1f}{c['rounds']:>8}{c['messages']:>10}{c['bytes']:>12}"
              f"{'same' if c['same_labels'] else 'DIFFER':>8}{c['median_round_s'] or 0:>16.3f}")
    print("\nmedian seconds per stage of a deployed round (every node and round after the handshake):")
    print(f"{'strategy':<18}" + "".join(f"{s:>18}" for s in STAGES))
    for c in cases:
        print(f"{c['strategy']:<18}" + "".join(f"{c['median_stage_s'].get(s, float('nan')):>18.3f}" for s in STAGES))


def stage_rows(cases: list[dict]) -> tuple[list[str], list[list[str]]]:
    """The stage table's header and rows: median seconds of each stage any case has."""
    stages = [k for k in STAGES if any(k in c["median_stage_s"] for c in cases)]
    rows = [[f"`{c['strategy']}`", *(f"{c['median_stage_s'][k]:.2f}" if k in c["median_stage_s"] else "-"
                                     for k in stages)] for c in cases]
    return ["strategy", *(STAGE_NAMES[k] for k in stages)], rows


def plain_section() -> list[str]:
    """The cases measured with plain Flower (``FEDGRAPH_FLOWER_SHIM=0``), beside the shim's, if any."""
    plain_path = RESULTS_DIR / "deployment_plain.json"
    if not plain_path.exists():
        return []
    plain = {c["strategy"]: c for c in json.loads(plain_path.read_text())["cases"]}
    shim = {c["strategy"]: c for c in read_results("deployment.json", MEASURE)["cases"]}
    rows = [[f"`{name}`", flower, f"{c['deployed_s']:.1f}", f"{c['median_round_s']:.2f}",
             f"{c['median_stage_s'].get('clientapp_cpu', float('nan')):.2f}", c.get("load_average", "-")]
            for name in plain if name in shim for flower, c in (("plain", plain[name]), ("shim", shim[name]))]
    return ["## Plain Flower and the shim",
            paragraph(f"`FEDGRAPH_FLOWER_SHIM=0 {MEASURE} --strategy ...` runs the same deployment with plain "
                      "`flower-superlink` and `flower-supernode` (deployment_plain.json)."),
            table(["strategy", "SuperNodes", "deployed s", "median round s", "CPU per ClientApp s", "load"], rows)]


def page() -> Path:
    """docs/results/deployment.md from deployment.json (and deployment_plain.json)."""
    import plots

    report = read_results("deployment.json", MEASURE)
    cases = in_order(report["cases"])
    wall = [[f"`{c['strategy']}`", c["dataset"], f"{c['simulation_s']:.1f}", f"{c['deployed_s']:.1f}",
             f"{c['ratio']:.2f}", f"{c['federation_start_s']:.1f}", "yes" if c["same_labels"] else "no",
             c.get("load_average", "-")] for c in cases]
    traffic = [[f"`{c['strategy']}`", str(c["rounds"]), str(c["messages"]), f"{c['bytes']:,}",
                f"{c['median_round_s']:.2f}", f"{c['simulated_median_round_s']:.2f}"] for c in cases]
    bars = plots.plot_grouped_bars([c["strategy"] for c in cases],
                                   {"simulation": [c["simulation_s"] for c in cases],
                                    "deployed run": [c["deployed_s"] for c in cases]},
                                   image_path("deployment_wall.png"), ylabel="seconds",
                                   title=f"Deployed vs simulated, {report['nodes']} clients")
    missing = [s for s in CASES if s not in {c["strategy"] for c in cases}]
    ratios, medians = [c["ratio"] for c in cases], [c["median_round_s"] for c in cases]
    shim = "with `deploy.flower_shim`" if report["flower_shim"] else "plain Flower"
    body = "\n\n".join([
        paragraph(f"`{MEASURE}`: every strategy on its representative dataset, {report['nodes']} clients, default "
                  "settings except " + "; ".join(f"`{c['strategy']}`: " + ", ".join(f"`{x}`" for x in own)
                                                 for c in cases if (own := [x for x in c["sets"] if x != NO_REFERENCE]))
                  + " (`gw-ldp` draws its LDP noise from the operating system's entropy, so only its noiseless "
                  "runs can repeat each other's labels), `reference=false` in both engines. Deployed: `python -m deploy local`, a TLS "
                  "SuperLink with SuperNode authentication behind the Fleet gateway and "
                  f"{report['nodes']} SuperNodes ({shim}) as separate processes on loopback, each loading only its "
                  "own shard file; simulated: `run_simulation` with the same config and seed. Simulation s: "
                  "`run_simulation` end to end (its engine starts for every run). Deployed s: `flwr run` end to "
                  "end (the app bundle submitted, installed on every node, the run, the result written) on a "
                  "federation whose SuperNodes are up, as an organisation's are between runs; federation start s: "
                  "certificates, app signing, SuperLink, gateway and SuperNodes up to that point, once per "
                  "federation. The load column is the shared 2-core machine's load average during the case."),
        "## Wall time and traffic",
        table(["strategy", "dataset", "simulation s", "deployed s", "ratio", "federation start s", "same labels",
               "load"], wall),
        figure(bars, "seconds per run, simulated and deployed"),
        table(["strategy", "rounds", "messages", "bytes", "median deployed round s", "median simulated round s"],
              traffic),
        paragraph(f"Targets: a deployed run at most {RATIO_TARGET:g}x the simulated one: "
                  + ("met" if max(ratios) <= RATIO_TARGET else f"not met (ratios {min(ratios):.2f}-{max(ratios):.2f})")
                  + f"; a median deployed round of at most {ROUND_TARGET_S:g} s: " + round_verdict(cases)
                  + "; identical labels: " + ("met" if all(c["same_labels"] for c in cases) else "not met") + "."
                  + (f" Not measured: {', '.join(missing)}. To measure them: "
                     f"`{MEASURE} --strategy {' '.join(missing)}`." if missing else "")),
        "## Where a deployed round goes",
        paragraph("Medians over every node and round after the handshake, seconds. The stages of one node's "
                  "message overlap: the ClientApp process starts before the SuperNode's pull returns, and waits "
                  "inside Flower's runtime for the message to land. SuperNode pick-up = server send to the "
                  "SuperNode's pull done; ClientApp start = send to the ClientApp process's start; Flower runtime "
                  "= process start to the handler, less app imports (Flower's runtime connects, pulls the message "
                  "and installs the app bundle); app imports (a fresh process importing the ClientApp module; none for "
                  "a ClientApp forked from the process that "
                  "loaded the bundle); compute = the handler; reply = handler return to the SuperNode's push done; "
                  "server pick-up = the last node's push to the server's receipt; CPU per ClientApp = what one "
                  "message costs its node, however busy the machine."),
        table(*stage_rows(cases)),
        paragraph("What is left of a round is mostly the HTTPS hops SuperNode -> gateway -> SuperLink -> "
                  "ServerApp: a message and each of its parts (records, arrays) is one request per hop, and the "
                  "federation's processes (SuperLink, gateway, 5 SuperNodes with their SuperExecs, the ServerApp "
                  "and one ClientApp per node and message) share 2 cores."),
        *plain_section(),
        *netns_section(),
        *start_section(),
    ])
    return write_page("deployment", "Deployment vs simulation", body, "python benchmarks/deployment.py --report")


NETNS_RESULTS = "deployment_netns.json"


def run_netns_case(strategy: str, dataset: str, sets: list[str], nodes: int, work: Path, latency_ms: float) -> dict:
    """``strategy`` deployed across network namespaces, ``latency_ms`` each way on every SuperNode's
    link: rounds, seconds, and whether its labels are the in-process run's."""
    sets = [*sets, NO_REFERENCE]
    path = run_local(nodes, strategy, dataset, "auto", sets, work / "deployed", netns=True, latency_ms=latency_ms)
    deployed = json.loads(path.read_text())
    run_experiment(strategy, dataset, nodes, {"partitioner": "auto", **dict(s.split("=", 1) for s in sets)},
                   work / "inprocess")
    run = json.loads((work / "deployed" / RUN_TIMING).read_text())
    return {"strategy": strategy, "dataset": dataset, "sets": sets, "nodes": nodes, "latency_ms": latency_ms,
            "same_labels": bool(np.array_equal(np.load(path.parent / "labels.npy"),
                                               np.load(work / "inprocess" / "labels.npy"))),
            "rounds": deployed["timing"]["rounds"], "deployed_s": run["flwr_run_s"],
            "federation_start_s": run["federation_start_s"],
            "median_round_s": float(np.median([r["seconds"] for r in deployed["timing"]["per_round"]])),
            "load_average": f"{os.getloadavg()[0]:.0f}"}


def netns_main(strategies: list[str], args) -> None:
    """``--netns``: :func:`run_netns_case` per strategy, rows kept in deployment_netns.json (the other
    strategies' rows too, when measured with the same latency and node count)."""
    check_options(True, args.latency_ms)
    out = RESULTS_DIR / NETNS_RESULTS
    earlier = json.loads(out.read_text()) if out.exists() else {}
    same_setup = (earlier.get("latency_ms"), earlier.get("nodes")) == (args.latency_ms, args.nodes)
    cases = [c for c in earlier.get("cases", []) if same_setup and c["strategy"] not in strategies]
    work = Path(tempfile.mkdtemp(prefix="deploy-netns-bench-"))
    for strategy in strategies:
        dataset, sets = CASES[strategy]
        c = run_netns_case(strategy, dataset, [*sets, *args.set], args.nodes, work / strategy, args.latency_ms)
        print(f"{strategy}: {c['rounds']} rounds, flwr run {c['deployed_s']:.1f} s, median round "
              f"{c['median_round_s']:.2f} s at {args.latency_ms:g} ms, labels {'same' if c['same_labels'] else 'DIFFER'}")
        cases.append(c)
        out.write_text(json.dumps({"latency_ms": args.latency_ms, "nodes": args.nodes, "cases": cases}, indent=2) + "\n")
    print(f"written {out}")


def in_order(cases: list[dict]) -> list[dict]:
    """``cases`` in :data:`CASES` order (a strategy measured again keeps its place)."""
    return sorted(cases, key=lambda c: list(CASES).index(c["strategy"]))


def own_sets(case: dict) -> str:
    """The settings a case set beyond ``reference=false`` (``-``: the defaults)."""
    return ", ".join(f"`{x}`" for x in case["sets"] if x != NO_REFERENCE) or "-"


def start_section() -> list[str]:
    """Where a federation's start goes (``benchmarks/federation_start.py``), if measured."""
    import federation_start

    path = RESULTS_DIR / federation_start.RESULTS
    return [federation_start.section(json.loads(path.read_text())["rows"])] if path.exists() else []


def same_settings(case: dict, loopback: dict[str, dict]) -> bool:
    """Whether the loopback run of ``case``'s strategy was measured with the same settings."""
    other = loopback.get(case["strategy"])
    return other is not None and sorted(other["sets"]) == sorted(case["sets"])


def netns_section() -> list[str]:
    """The cases measured across network namespaces behind a delay, if any, beside the loopback ones."""
    path = RESULTS_DIR / NETNS_RESULTS
    if not path.exists():
        return []
    report = json.loads(path.read_text())
    loopback = {c["strategy"]: c for c in read_results("deployment.json", MEASURE)["cases"]}
    rows = [[f"`{c['strategy']}`", c["dataset"], own_sets(c), str(c["rounds"]), f"{c['deployed_s']:.1f}",
             f"{c['median_round_s']:.2f}",
             f"{loopback[c['strategy']]['median_round_s']:.2f}" if same_settings(c, loopback) else "-",
             "yes" if c["same_labels"] else "no", c["load_average"]] for c in in_order(report["cases"])]
    return ["## Separate hosts behind a delay",
            paragraph(f"`{MEASURE} --netns --latency-ms {report['latency_ms']:g}`: the SuperLink host and each of "
                      f"{report['nodes']} SuperNodes in a network namespace of its own (`deploy/netns.py`), every "
                      f"SuperNode's link to the gateway delayed {report['latency_ms']:g} ms each way by a TCP relay "
                      "(`deploy/faults.py`), TLS end to end; labels compared with the in-process run's; the loopback "
                      "round where the loopback run had the same settings."),
            table(["strategy", "dataset", "settings", "rounds", "deployed s", "median round s",
                   "median round s on loopback", "same labels", "load"], rows)]


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
    parser.add_argument("--report", action="store_true", help="only render the page from the JSON files")
    parser.add_argument("--netns", action="store_true", help="hosts in network namespaces of their own (root)")
    parser.add_argument("--latency-ms", type=float, default=0.0, help="with --netns: delay each way per SuperNode link")
    args = parser.parse_args()
    if args.report:
        print(f"written {page()}")
        return
    if args.netns:
        netns_main(list(CASES) if "all" in args.strategy else args.strategy, args)
        return
    os.environ[TIMING_SETTING] = "1"
    work = Path(tempfile.mkdtemp(prefix="deploy-bench-"))
    strategies = list(CASES) if "all" in args.strategy else args.strategy
    out = RESULTS_DIR / ("deployment.json" if enabled() else "deployment_plain.json")
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
    print(f"written {out} ({SETTING}={'on' if enabled() else 'off'}) and {page()}")


if __name__ == "__main__":
    main()
