"""Where a deployed run's CPU goes: every process profiled, beside the in-process run.

    python benchmarks/deployment_profile.py [--nodes 200000] [--supernodes 4] [--label NAME] [--report]

One planted-partition graph (:func:`deployment_scale.settings`) clustered by ``fedspectral-plus``
exact twice with the same seed, one after the other: by ``python -m app.run --engine inprocess``
in a process of its own, and by ``python -m deploy local`` (TLS SuperLink, Fleet gateway,
authenticated SuperNodes). Every process runs in the control group of its role (the in-process
run; the SuperLink with its SuperExec and ServerApp; the gateway; each SuperNode with its
SuperExec and ClientApps; the set-up's tools), so the kernel counts each role's CPU seconds,
short-lived processes included; within a role, the long-lived processes' own (SuperNode,
SuperExec, fork server) are sampled, the forked apps' (ClientApps, the ServerApp) are the rest.
``perf record -a`` says which machine code used the CPU (the Python interpreter, OpenSSL's
hashing and TLS, copies, the kernel, numpy), ``py-spy`` which Python functions (see
``benchmarks/profiling.py`` for what each counts). Printed and written to
``benchmarks/results/deployment_profile.json``, one row per ``--label`` (default ``this
checkout``; run it in an older checkout with another label to compare), size and SuperNode
count: CPU seconds by role and process, bytes moved, CPU seconds per GB, the SuperLink host's
(SuperLink, ServerApp, gateway) MB per CPU second, the native split and the busiest Python
functions of each role. Renders the profile section of ``docs/results/transport.md`` (see
``benchmarks/transport.py``); ``--report``: only the page.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import profiling  # noqa: E402
from deployment_scale import settings  # noqa: E402
from pages import RESULTS_DIR  # noqa: E402

MEASURE = "python benchmarks/deployment_profile.py"
RESULTS = "deployment_profile.json"
PY_SPY_HZ, PERF_HZ = 20, 49
#: roles, as this script names the processes it starts (a SuperNode's is ``supernode-<i>``)
INPROCESS, SUPERLINK, GATEWAY, SET_UP = "in-process", "superlink", "gateway", "set-up"


def role_of(name: str) -> str:
    """The role of a process :class:`deploy.federation.LocalFederation` names ``name``."""
    if name.startswith("supernode-"):
        return name
    return {"superlink": SUPERLINK, "gateway": GATEWAY}.get(name, SET_UP)


class Measured:
    """One measured run: its processes in their roles' groups, counted and profiled."""

    def __init__(self, work: Path) -> None:
        if not profiling.cgroups_available():
            raise SystemExit("error: this benchmark counts CPU by control group: run it as root on cgroup v1 "
                             f"(cpuacct at {profiling.CGROUP_ROOT})")
        self.work = work
        work.mkdir(parents=True, exist_ok=True)
        self.groups = profiling.CpuGroups()
        self.census = profiling.Census(self.groups)
        self.perf = profiling.perf_record(work / "perf.data", PERF_HZ)
        self.spies: dict[str, subprocess.Popen] = {}

    def command(self, role: str, cmd: list[str]) -> list[str]:
        return self.groups.command(role, cmd)

    def watch(self, role: str, pid: int) -> None:
        self.spies[role] = profiling.py_spy(self.work / f"{role}.pyspy", PY_SPY_HZ, pid)

    def stop_recording(self) -> None:
        """End the recorders before the processes end: a process py-spy traces when it is killed
        is reaped only once py-spy lets go of it."""
        for spy in self.spies.values():
            profiling.stop(spy)
        profiling.stop(self.perf)
        self.perf = None

    def report(self) -> dict:
        """CPU by role and process kind, the native split and the busy Python functions, by role."""
        self.stop_recording()
        self.census.stop()
        cpu = self.groups.cpu_s()
        return {"cpu_s": cpu, "cpu_by_kind": self.census.by_kind(cpu),
                "native": profiling.native_split(self.work / "perf.data", self.census.pid_roles),
                "python": {role: profiling.busy_functions(self.work / f"{role}.pyspy") for role in self.spies}}

    def close(self) -> None:
        self.stop_recording()
        self.census.stop()
        self.groups.close()


def profile_inprocess(nodes: int, supernodes: int, work: Path) -> dict:
    out = work / "inprocess"
    command = [sys.executable, "-m", "app.run", "--engine", "inprocess", "--strategy", "fedspectral-plus",
               "--dataset", "sbm", "--num-clients", str(supernodes), "--out", str(out)]
    for item in settings(nodes):
        command += ["--set", item]
    measured = Measured(work)
    try:
        start = time.perf_counter()
        proc = subprocess.Popen(measured.command(INPROCESS, command), cwd=HERE.parent, stdout=subprocess.DEVNULL)
        measured.watch(INPROCESS, proc.pid)
        if proc.wait():
            raise RuntimeError(f"the in-process run failed (exit code {proc.returncode})")
        return {"wall_s": time.perf_counter() - start, **measured.report(),
                "result": json.loads((out / "result.json").read_text()), "labels": out / "labels.npy"}
    finally:
        measured.close()


def profile_deployed(nodes: int, supernodes: int, work: Path) -> dict:
    """The deployed run with each process of the federation in its role's group and profiled."""
    from deploy.__main__ import RUN_TIMING, run_local
    from deploy.federation import LocalFederation

    out, measured = work / "deployed", Measured(work)
    inside, spawn, close = LocalFederation._inside, LocalFederation._spawn, LocalFederation.close

    def grouped(self, name, cmd):
        return measured.command(role_of(name), inside(self, name, cmd))

    def watched(self, name, cmd, *args, **kwargs):
        proc = spawn(self, name, cmd, *args, **kwargs)
        if role_of(name) != SET_UP:
            measured.watch(role_of(name), proc.pid)
        return proc

    def closed(self):
        measured.stop_recording()
        close(self)

    LocalFederation._inside, LocalFederation._spawn, LocalFederation.close = grouped, watched, closed
    try:
        start = time.perf_counter()
        path = run_local(supernodes, "fedspectral-plus", "sbm", "auto", settings(nodes), out)
        return {"wall_s": time.perf_counter() - start, **measured.report(),
                "timing": json.loads((out / RUN_TIMING).read_text()), "result": json.loads(path.read_text()),
                "labels": path.parent / "labels.npy"}
    finally:
        LocalFederation._inside, LocalFederation._spawn, LocalFederation.close = inside, spawn, close
        measured.close()


def measure(nodes: int, supernodes: int, work: Path, label: str) -> dict:
    load = [os.getloadavg()[0]]
    local = profile_inprocess(nodes, supernodes, work / "inprocess-run")
    load.append(os.getloadavg()[0])
    deployed = profile_deployed(nodes, supernodes, work / "deployed-run")
    load.append(os.getloadavg()[0])
    traffic = deployed["result"]["communication"]
    gigabytes = (traffic["bytes_up"] + traffic["bytes_down"]) / 1e9
    cpu = {**local["cpu_s"], **deployed["cpu_s"]}
    deployed_cpu = sum(deployed["cpu_s"].values())
    host = cpu.get(SUPERLINK, 0.0) + cpu.get(GATEWAY, 0.0)
    return {
        "label": label, "nodes": nodes, "supernodes": supernodes, "settings": settings(nodes),
        "load_average": f"{min(load):.1f}-{max(load):.1f}", "cores": os.cpu_count(),
        "same_labels": bool(np.array_equal(np.load(deployed["labels"]), np.load(local["labels"]))),
        "gigabytes": gigabytes, "messages": traffic["messages"],
        "inprocess_protocol_s": local["result"]["timing"]["protocol_s"], "inprocess_wall_s": local["wall_s"],
        "deployed_protocol_s": deployed["result"]["timing"]["protocol_s"], "deployed_wall_s": deployed["wall_s"],
        "federation_start_s": deployed["timing"]["federation_start_s"],
        "cpu_s": cpu, "deployed_cpu_s": deployed_cpu, "cpu_ratio": deployed_cpu / cpu[INPROCESS],
        "cpu_by_kind": deployed["cpu_by_kind"],
        "superlink_host_mb_per_cpu_s": gigabytes * 1e3 / host if host else None,
        "native": {**local["native"], **deployed["native"]},
        "python": {**local["python"], **deployed["python"]},
    }


def print_row(row: dict) -> None:
    print(f"{row['label']}: {row['nodes']:,} nodes, {row['supernodes']} SuperNodes, load {row['load_average']}: "
          f"protocol {row['inprocess_protocol_s']:.1f} s in-process, {row['deployed_protocol_s']:.1f} s deployed; "
          f"end to end {row['inprocess_wall_s']:.1f} / {row['deployed_wall_s']:.1f} s (start "
          f"{row['federation_start_s']:.1f} s); {row['gigabytes']:.2f} GB; same labels: {row['same_labels']}")
    print("  CPU seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in row["cpu_s"].items())
          + f"; deployed {row['deployed_cpu_s']:.1f} (x{row['cpu_ratio']:.2f}); SuperLink host "
          f"{row['superlink_host_mb_per_cpu_s']:.0f} MB per CPU second")
    for role, kinds in row["cpu_by_kind"].items():
        print(f"    {role}: " + ", ".join(f"{k} {v:.1f}" for k, v in kinds.items()))
    for role, split in row["native"].items():
        total = max(sum(split.values()), 1)
        print(f"  {role} machine code: " + ", ".join(f"{k} {100 * n / total:.0f}%" for k, n in split.items()))
    for role, profile in row["python"].items():
        busy = max(profile["busy"], 1)
        print(f"  {role} Python ({profile['busy']} busy of {profile['samples']} samples):")
        for function, n in profile["top"]:
            print(f"      {100 * n / busy:5.1f}%  {function}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=200_000)
    parser.add_argument("--supernodes", type=int, default=4)
    parser.add_argument("--label", default="this checkout", help="the row's name (default: this checkout)")
    parser.add_argument("--keep", type=Path, default=None, help="keep the logs and raw profiles in this folder")
    parser.add_argument("--report", action="store_true", help="only render the page from the JSON file")
    args = parser.parse_args()
    if not args.report:
        work = args.keep or Path(tempfile.mkdtemp(prefix=f"profile-{args.nodes}-"))
        work.mkdir(parents=True, exist_ok=True)
        row = measure(args.nodes, args.supernodes, work, args.label)
        print_row(row)
        out = RESULTS_DIR / RESULTS
        rows = json.loads(out.read_text())["rows"] if out.exists() else []
        key = (row["label"], row["nodes"], row["supernodes"])
        rows = [r for r in rows if (r["label"], r["nodes"], r["supernodes"]) != key] + [row]
        out.write_text(json.dumps({"measure": MEASURE, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
