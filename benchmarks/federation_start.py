"""Where a local deployment's start goes: every process, when it is launched, when it is ready.

    python benchmarks/federation_start.py [--size embedded|20000] [--supernodes 4] [--label NAME]
                                          [--checkout DIR] [--log FILE] [--report]

One ``python -m deploy local`` run (``--size embedded``: ``fedkmeans`` on the embedded karate
graph; ``--size N``: ``fedspectral-plus`` exact on the N-node planted partition of
:func:`deployment_scale.settings`) in a process of its own, the code of ``--checkout`` (default
this one; give a clone of an older commit to compare), stopped once the first message of the run
has reached a SuperNode (the first round). While it starts, a watcher in that process records
each step of ``deploy.__main__`` and ``deploy.federation.LocalFederation`` (start, end), each
process of the federation (SuperLink, gateway, registration, SuperNodes, SuperExecs, fork
servers, the ServerApp) as it appears (launched: its creation time) with its CPU seconds until
the first round, and when each logs that it is ready. One JSON row per run is appended to
``benchmarks/results/federation_start.json`` (``--log``: to another file instead); ``--report``
renders the start section of ``docs/results/deployment.md`` from it, through
``benchmarks/deployment.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

HERE = Path(__file__).resolve().parent
RESULTS = "federation_start.json"
MEASURE = "python benchmarks/federation_start.py"
WATCH_S = 0.02
#: (log file, line): the moment a process says it is ready, by the name the timeline gives it
READY_LINES = {"superlink": ("superlink", "Uvicorn running"),
               "superlink preloaded": ("superlink", "deploy.flower_shim: app runtime preloaded"),
               "gateway": ("gateway", "Fleet gateway: serving")}
FIRST_MESSAGE = "fedgraph-timing pulled"


class FirstRound(Exception):
    """The first message reached a SuperNode: the start is measured."""


def kind_of(cmdline: list[str], parent_kind: str) -> str:
    """What a process of the federation is, from its command line (a fork: its parent's kind)."""
    text = " ".join(cmdline)
    for marker, kind in (("superlink-superexec", "superlink's superexec"), ("flower_shim superexec", "superexec"),
                         ("flower_shim superlink", "superlink"), ("flower_shim supernode", "supernode"),
                         ("flower-superlink", "superlink"), ("flower-supernode", "supernode"),
                         ("flower-superexec", "superexec"), ("deploy gateway", "gateway"),
                         ("deploy.gateway", "gateway"), ("deploy.registration", "registration"),
                         ("forkserver", "fork server"), ("resource_tracker", "resource tracker"), ("flwr run", "flwr run"), ("flwr-serverapp", "serverapp")):
        if marker in text:
            return kind
    if "/flwr" in text and " run " in text:
        return "flwr run"
    return f"fork of {parent_kind}"


class Watcher(threading.Thread):
    """Every :data:`WATCH_S`: the processes below this one (first seen, creation time, CPU) and
    the ready lines of the federation's logs."""

    def __init__(self, out: Path, t0: float) -> None:
        super().__init__(daemon=True)
        self.out, self.t0, self.stopped = out, t0, threading.Event()
        self.processes: dict[int, dict] = {}
        self.own_cmdline = psutil.Process().cmdline()  # a fork not yet exec'd has it
        self.ready: dict[str, float] = {}
        self.first_message: float | None = None

    def run(self) -> None:
        while not self.stopped.wait(WATCH_S):
            self.look()

    def look(self) -> None:
        me = psutil.Process()
        for proc in me.children(recursive=True):
            try:
                self._seen(proc)
            except psutil.Error:
                continue
        self._read_logs()

    def _seen(self, proc) -> None:
        entry, cmdline = self.processes.get(proc.pid), proc.cmdline()
        # seen between its fork and its exec (its parent's command line): looked at again once it has its own
        if entry is None or (cmdline and entry["cmdline"] != cmdline and entry["kind"].startswith("fork of")):
            parent = self.processes.get(proc.ppid(), {"kind": "deploy", "cmdline": self.own_cmdline})
            kind = f"fork of {parent['kind']}" if cmdline == parent["cmdline"] else kind_of(cmdline, parent["kind"])
            entry = self.processes[proc.pid] = {
                "pid": proc.pid, "kind": kind, "cmdline": cmdline,
                "launched_s": proc.create_time() - self.t0, "seen_s": time.time() - self.t0}
        if self.first_message is None:
            times = proc.cpu_times()
            entry["cpu_s"] = times.user + times.system

    def _read_logs(self) -> None:
        for path in self.out.glob("*.log"):
            text = path.read_text(errors="replace")
            name = path.stem
            now = time.time() - self.t0
            for event, (log, line) in READY_LINES.items():
                if log == name and event not in self.ready and line in text:
                    self.ready[event] = now
            if name.startswith("supernode-"):
                for event, line in ((f"{name} joined", "SuperNode ID: "),
                                    (f"{name} preloaded", "deploy.flower_shim: app runtime preloaded")):
                    if event not in self.ready and line in text:
                        self.ready[event] = now
                self._first_message(text)

    def _first_message(self, text: str) -> None:
        for line in text.splitlines():
            if line.startswith(FIRST_MESSAGE):
                pulled = float(line.split()[-1]) - self.t0
                if self.first_message is None or pulled < self.first_message:
                    self.first_message = pulled


def traced(owner, name: str, steps: list, t0: float) -> None:
    """Record each call of ``owner.name`` as a step (start, end, seconds after ``t0``)."""
    inner = getattr(owner, name)

    def call(*args, **kwargs):
        start = time.time() - t0
        try:
            return inner(*args, **kwargs)
        finally:  # a wait for a process's line is named by the process
            step = f"{name} {args[1]}" if name == "await_line" else name
            steps.append({"step": step, "start_s": start, "end_s": time.time() - t0})

    setattr(owner, name, call)


def stop_at_first_round(federation_cls, watcher: Watcher) -> None:
    """``LocalFederation.run_app`` that ends ``flwr run`` once the first message reached a SuperNode."""
    def run_app(self, app_dir, run_config, timeout=None):
        from deploy.federation import BIN, CONNECTION, run_config_arg

        cmd = self.inside("flwr", [str(BIN / "flwr"), "run", str(app_dir), CONNECTION, "--stream",
                                    "--run-config", run_config_arg(run_config)])
        proc = subprocess.Popen(cmd, env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while watcher.first_message is None and proc.poll() is None:
            time.sleep(WATCH_S)
        watcher.stopped.set()  # before the processes are stopped: their CPU is that of the start
        watcher.join()
        proc.kill()
        proc.wait()
        raise FirstRound

    federation_cls.run_app = run_app


def measure_once(size: str, supernodes: int, out: Path) -> dict:
    """One deployed run, from this process's launch (as ``python -m deploy local``'s) to the first round."""
    t0 = psutil.Process().create_time()
    os.environ["FEDGRAPH_TIMING"] = "1"  # each SuperNode logs when it pulled a message
    import deploy.__main__ as local
    from deploy import federation

    steps = [{"step": "imports", "start_s": 0.0, "end_s": time.time() - t0}]
    watcher = Watcher(out, t0)
    for name in ("stage_app", "make_all", "sign_app", "with_members"):
        traced(local, name, steps, t0)
    from fedgraphcore.data import prepare

    traced(prepare, "run", steps, t0)
    for name in ("start_federation", "start_superlink", "start_gateway", "await_line", "register", "registered",
                 "start_configured_nodes", "wait_until_ready"):
        if hasattr(federation.LocalFederation, name):  # an older checkout has some of them only
            traced(federation.LocalFederation, name, steps, t0)
    stop_at_first_round(federation.LocalFederation, watcher)
    watcher.start()
    try:
        if size == "embedded":
            local.run_local(supernodes, "fedkmeans", "karate", "auto", [], out)
        else:
            sys.path.insert(0, str(HERE))
            from deployment_scale import settings

            local.run_local(supernodes, "fedspectral-plus", "sbm", "auto", settings(int(size)), out)
    except FirstRound:
        pass
    finally:
        watcher.stopped.set()
    if watcher.first_message is None:
        raise SystemExit("error: the run ended before a message reached a SuperNode; see " + str(out))
    processes = [{k: v for k, v in p.items() if k != "cmdline"} for p in watcher.processes.values()]
    return {"steps": steps, "processes": sorted(processes, key=lambda p: p["launched_s"]),
            "ready": watcher.ready, "first_round_s": watcher.first_message,
            "federation_start_s": next(s["end_s"] for s in steps if s["step"] == "wait_until_ready")
            - next(s["start_s"] for s in steps if s["step"] == "stage_app")}


def run_arm(checkout: Path, size: str, supernodes: int, label: str) -> dict:
    """:func:`measure_once` in a process of its own running ``checkout``'s code."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="fedgraph-start-") as tmp:
        row_file = Path(tmp) / "row.json"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(checkout), os.environ.get("PYTHONPATH")]))}
        load = os.getloadavg()[0]
        subprocess.run([sys.executable, str(Path(__file__).resolve()), "--once", "--size", size, "--supernodes",
                        str(supernodes), "--out", str(Path(tmp) / "run"), "--row", str(row_file)],
                       cwd=checkout, env=env, check=True)
        row = json.loads(row_file.read_text())
    commit = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    return {"label": label, "commit": commit, "size": size, "supernodes": supernodes, "cores": os.cpu_count(),
            "load_average": f"{min(load, os.getloadavg()[0]):.1f}-{max(load, os.getloadavg()[0]):.1f}", **row}


def cpu_by_kind(row: dict) -> dict[str, tuple[int, float]]:
    """Processes and CPU seconds until the first round, by kind (forks of one kind together)."""
    kinds: dict[str, tuple[int, float]] = {}
    for proc in row["processes"]:
        count, cpu = kinds.get(proc["kind"], (0, 0.0))
        kinds[proc["kind"]] = (count + 1, cpu + proc.get("cpu_s", 0.0))
    return kinds


def federation_cpu(row: dict) -> float:
    """CPU seconds of every process of the federation until the first round."""
    return sum(cpu for _, cpu in cpu_by_kind(row).values())


def print_row(row: dict) -> None:
    print(f"{row['label']} ({row['commit']}), {row['size']}, load {row['load_average']}: federation start "
          f"{row['federation_start_s']:.1f} s, first round {row['first_round_s']:.1f} s after launch")
    for step in row["steps"]:
        print(f"  {step['step']:<24}{step['start_s']:8.2f} -> {step['end_s']:8.2f} s")
    for event, at in sorted(row["ready"].items(), key=lambda e: e[1]):
        print(f"  ready: {event:<28}{at:8.2f} s")
    for kind, (count, cpu) in cpu_by_kind(row).items():
        print(f"  {kind:<28}{count:3d} processes{cpu:8.2f} CPU s")


def median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def step_span(row: dict, *names: str) -> tuple[float, float] | None:
    """First start and last end of the steps ``names`` in ``row`` (None: none ran)."""
    spans = [(s["start_s"], s["end_s"]) for s in row["steps"] if s["step"] in names]
    return (min(a for a, _ in spans), max(b for _, b in spans)) if spans else None


def timeline(row: dict) -> list[list[str]]:
    """One line per stage and process kind: launched (first of its kind), ready (the last), CPU seconds."""
    kinds, ready = cpu_by_kind(row), row["ready"]
    launched = {}
    for proc in row["processes"]:
        launched.setdefault(proc["kind"], proc["launched_s"])
    last = {what: max((t for e, t in ready.items() if e.startswith("supernode-") and e.endswith(what)), default=None)
            for what in ("joined", "preloaded")}
    registered = step_span(row, "register", "registered")
    lines = [("`python -m deploy local` imports", 0.0, step_span(row, "imports")[1], None),
             ("data cut into shards", *step_span(row, "run"), None),
             ("certificates, keys, app signature", step_span(row, "stage_app")[0], step_span(row, "with_members")[1],
              None),
             ("SuperLink", launched.get("superlink"), ready.get("superlink"), "superlink"),
             ("gateway", launched.get("gateway"), ready.get("gateway"), "gateway"),
             ("registration of the SuperNodes' keys", launched.get("registration"),
              registered[1] if registered else None, "registration"),
             ("SuperNodes (joined)", launched.get("supernode"), last["joined"], "supernode"),
             ("their SuperExecs", launched.get("superexec"), None, "superexec"),
             ("the SuperLink's SuperExec", launched.get("superlink's superexec"), None, "superlink's superexec"),
             ("fork servers (app runtime preloaded)", launched.get("fork server"),
              max(filter(None, [last["preloaded"], ready.get("superlink preloaded")]), default=None), "fork server"),
             ("`flwr run` to the first message at a SuperNode", launched.get("flwr run"), row["first_round_s"],
              "flwr run")]

    def seconds(value):
        return "-" if value is None else f"{value:.1f}"

    return [[what, seconds(start), seconds(end), str(kinds[kind][0]) if kind in kinds else "1",
             f"{kinds[kind][1]:.1f}" if kind in kinds else "-"] for what, start, end, kind in lines]


def section(rows: list[dict]) -> str:
    """The start section of the deployment page: before and after side by side, then each label's timeline."""
    from pages import paragraph, table

    groups: dict[tuple[str, str], list[dict]] = {}
    for row in rows:
        groups.setdefault((row["size"], row["label"]), []).append(row)
    summary = [[size if size == "embedded" else f"{int(size):,} nodes", label,
                str(len(runs)), f"{median([r['federation_start_s'] for r in runs]):.1f}",
                f"{median([r['first_round_s'] for r in runs]):.1f}",
                f"{median([federation_cpu(r) for r in runs]):.1f}",
                f"{median([federation_cpu(r) / r['cores'] for r in runs]):.1f}",
                ", ".join(r["load_average"] for r in runs)] for (size, label), runs in groups.items()]
    parts = [paragraph(f"`{MEASURE} [--size 20000] --label L --checkout DIR`: one `python -m deploy local` run "
                       f"({rows[0]['supernodes']} SuperNodes; embedded: `fedkmeans` on karate; 20,000: "
                       "`fedspectral-plus` exact on the planted partition), stopped when the first message reaches "
                       "a SuperNode; the checkouts' runs alternate on this shared 2-core machine (load column). "
                       "Federation start: certificates to every SuperNode joined with its app runtime preloaded "
                       "(`run-timing.json`); first round: seconds from launch; CPU: every process of the federation "
                       "until the first round (not `deploy local` itself)."),
             table(["size", "processes launched", "runs", "federation start s (median)", "first round s (median)",
                    "federation CPU s (median)", "CPU s / cores", "load"], summary),
             paragraph("CPU s / cores: the first round's floor on an idle machine when every process runs at once "
                       "(the federation's own CPU, without `deploy local`'s imports and data cut). Where the "
                       "processes are launched one after another (SuperLink, then gateway, then the registration, "
                       "then the SuperNodes, each once the one before serves), the start is the sum of their "
                       "start-ups; where they are launched at once, each waiting at a gate (a pipe, "
                       "`deploy/gates.py`) for what it needs, it is bounded by the CPU they need together.")]
    for (size, label), runs in groups.items():
        if size == "embedded":
            parts += [paragraph(f"Timeline of one run, processes launched {label} (load {runs[-1]['load_average']}): "
                                "seconds from launch, CPU seconds until the first round."),
                      table(["stage or process", "launched s", "ready s", "processes", "CPU s"], timeline(runs[-1]))]
    return "\n\n".join(["## Starting a federation", *parts])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="embedded", help="embedded, or the planted partition's node count")
    parser.add_argument("--supernodes", type=int, default=4)
    parser.add_argument("--label", default="this checkout")
    parser.add_argument("--checkout", type=Path, default=HERE.parent, help="the code to run (a clone)")
    parser.add_argument("--log", type=Path, default=None, help="append the row here, not to the results")
    parser.add_argument("--report", action="store_true", help="only render the page from the JSON")
    parser.add_argument("--once", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--row", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.once:
        args.row.write_text(json.dumps(measure_once(args.size, args.supernodes, args.out)))
        return
    sys.path.insert(0, str(HERE))
    from pages import RESULTS_DIR, render_page_of

    if not args.report:
        row = run_arm(args.checkout.resolve(), args.size, args.supernodes, args.label)
        print_row(row)
        path = args.log or RESULTS_DIR / RESULTS
        rows = json.loads(path.read_text())["rows"] if path.exists() else []
        path.write_text(json.dumps({"rows": [*rows, row]}, indent=1) + "\n")
        print(f"written {path}")
    if args.log is None:
        render_page_of("deployment.py")


if __name__ == "__main__":
    main()
