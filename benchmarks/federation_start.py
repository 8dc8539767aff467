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
        self.ready: dict[str, float] = {}
        self.first_message: float | None = None

    def run(self) -> None:
        while not self.stopped.wait(WATCH_S):
            self.look()

    def look(self) -> None:
        import psutil

        me = psutil.Process()
        for proc in me.children(recursive=True):
            try:
                self._seen(proc)
            except psutil.Error:
                continue
        self._read_logs()

    def _seen(self, proc) -> None:
        entry = self.processes.get(proc.pid)
        if entry is None:
            parent = self.processes.get(proc.ppid(), {"kind": "deploy", "cmdline": []})
            cmdline = proc.cmdline()
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
        watcher.look()
        proc.kill()
        proc.wait()
        raise FirstRound

    federation_cls.run_app = run_app


def measure_once(size: str, supernodes: int, out: Path) -> dict:
    """One deployed run, from this process's launch (as ``python -m deploy local``'s) to the first round."""
    import psutil

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


def print_row(row: dict) -> None:
    print(f"{row['label']} ({row['commit']}), {row['size']}, load {row['load_average']}: federation start "
          f"{row['federation_start_s']:.1f} s, first round {row['first_round_s']:.1f} s after launch")
    for step in row["steps"]:
        print(f"  {step['step']:<24}{step['start_s']:8.2f} -> {step['end_s']:8.2f} s")
    for event, at in sorted(row["ready"].items(), key=lambda e: e[1]):
        print(f"  ready: {event:<28}{at:8.2f} s")
    for kind, (count, cpu) in cpu_by_kind(row).items():
        print(f"  {kind:<28}{count:3d} processes{cpu:8.2f} CPU s")


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
