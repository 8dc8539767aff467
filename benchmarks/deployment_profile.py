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
import collections
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
from pages import RESULTS_DIR, render_page_of  # noqa: E402

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
        (self.work / "pid-roles.json").write_text(json.dumps(self.census.pid_roles))
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
    inside, spawn, close = LocalFederation.inside, LocalFederation.spawn, LocalFederation.close

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

    LocalFederation.inside, LocalFederation.spawn, LocalFederation.close = grouped, watched, closed
    try:
        start = time.perf_counter()
        path = run_local(supernodes, "fedspectral-plus", "sbm", "auto", settings(nodes), out)
        return {"wall_s": time.perf_counter() - start, **measured.report(),
                "timing": json.loads((out / RUN_TIMING).read_text()), "result": json.loads(path.read_text()),
                "labels": path.parent / "labels.npy"}
    finally:
        LocalFederation.inside, LocalFederation.spawn, LocalFederation.close = inside, spawn, close
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
    render_page_of("transport.py")  # its page holds this section


if __name__ == "__main__":
    main()


def _supernodes(values: dict[str, float]) -> float:
    return sum(v for k, v in values.items() if k.startswith("supernode-"))


def _groups(row: dict) -> dict[str, float]:
    """CPU seconds of the role groups a page shows: SuperNodes summed."""
    cpu = row["cpu_s"]
    return {"in-process run": cpu[INPROCESS], "SuperLink with its ServerApp": cpu.get(SUPERLINK, 0.0),
            "gateway": cpu.get(GATEWAY, 0.0), f"{row['supernodes']} SuperNodes with their ClientApps": _supernodes(cpu),
            "set-up (keys, registration)": cpu.get(SET_UP, 0.0), "deployed, all processes": row["deployed_cpu_s"],
            "deployed, less the ServerApp's and ClientApps' own": row["deployed_cpu_s"] - _apps(row)}


def _apps(row: dict) -> float:
    """CPU seconds of the forked apps (the ServerApp, the ClientApps): the protocol's own work."""
    return sum(kinds.get("forked apps", 0.0) for role, kinds in row["cpu_by_kind"].items() if role != SET_UP)


def _kinds(row: dict) -> list[tuple[str, float]]:
    """CPU seconds by process: the SuperLink's, the gateway's and the SuperNodes' (summed)."""
    kinds = row["cpu_by_kind"]
    link, nodes = kinds.get(SUPERLINK, {}), collections.Counter()
    for role, values in kinds.items():
        if role.startswith("supernode-"):
            nodes.update({("SuperNode" if k == role else k): v for k, v in values.items()})
    names = {"superlink": "SuperLink (its HTTP server)", "SuperExec": "its SuperExec", "fork server": "its fork server",
             "forked apps": "the ServerApp", "resource tracker": "its resource tracker"}
    out = [(f"SuperLink host: {names.get(k, k)}", v) for k, v in link.items()]
    out += [("SuperLink host: gateway", row["cpu_s"].get(GATEWAY, 0.0))]
    node_names = {"SuperNode": "SuperNodes", "SuperExec": "their SuperExecs", "fork server": "their fork servers",
                  "forked apps": "the ClientApps", "resource tracker": "their resource trackers"}
    out += [(f"SuperNodes: {node_names.get(k, k)}", v) for k, v in nodes.items()]
    return out


def _native_table(row: dict) -> tuple[list[str], list[list[str]]]:
    native = row["native"]
    merged: dict[str, collections.Counter] = {}
    for role, split in native.items():
        name = "SuperNodes" if role.startswith("supernode-") else role
        merged.setdefault(name, collections.Counter()).update(split)
    columns = [name for name, _ in profiling.NATIVE] + ["other native code"]
    body = []
    for name, counter in merged.items():
        total = max(sum(counter.values()), 1)
        body.append([name, f"{total:,}", *(f"{100 * counter.get(c, 0) / total:.0f}" for c in columns)])
    return ["role", "samples", *columns], body


def section(rows: list[dict]) -> str:
    """The transport page's section on where a deployed run's CPU goes (markdown)."""
    from pages import paragraph, table

    if not rows:
        return ""
    size = max(r["nodes"] for r in rows)
    rows = [r for r in rows if r["nodes"] == size]
    labels = [r["label"] for r in rows]
    groups = {label: _groups(r) for label, r in zip(labels, rows)}
    cpu_rows = [[name, *(f"{groups[label][name]:.0f}" for label in labels),
                 *(f"{groups[label][name] / r['gigabytes']:.1f}" for label, r in zip(labels, rows))]
                for name in groups[labels[-1]]]
    head = ["CPU seconds", *labels, *(f"per GB, {label}" for label in labels)]
    summary = [[label, f"{r['inprocess_protocol_s']:.0f} / {r['deployed_protocol_s']:.0f}",
                f"{r['deployed_protocol_s'] / r['inprocess_protocol_s']:.2f}",
                f"{r['deployed_wall_s'] / r['inprocess_wall_s']:.2f}", f"{r['cpu_ratio']:.2f}",
                f"{r['superlink_host_mb_per_cpu_s']:.0f}", f"{r['federation_start_s']:.0f}", r["load_average"],
                "yes" if r["same_labels"] else "no"] for label, r in zip(labels, rows)]
    last = rows[-1]
    header, native_rows = _native_table(last)
    python = []
    for role, profile in last["python"].items():
        if role.startswith("supernode-") and role != "supernode-0":
            continue
        busy = max(profile["busy"], 1)
        python.append([role, "; ".join(f"{f.split(' (')[0]} {100 * n / busy:.0f}%" for f, n in profile["top"][:5])])
    return "\n\n".join([
        "## Where a deployed run's CPU goes",
        paragraph(f"`{MEASURE}`: `fedspectral-plus` exact on the {size:,}-node planted partition, "
                  f"{last['supernodes']} SuperNodes, {last['gigabytes']:.2f} GB moved in {last['messages']} messages, "
                  "run in-process and deployed (TLS SuperLink, Fleet gateway, authenticated SuperNodes) one after "
                  "the other on this machine's "
                  f"{last['cores']} cores. Each process runs in the control group of its role, so the kernel counts "
                  "its CPU seconds, the short-lived ClientApps included. The columns are checkouts measured with the "
                  "same command; the load average (other users of the machine) is beside each. CPU seconds grow "
                  "with the load (caches, frequency): compare the rows of one checkout with each other, and the "
                  "deployed run less the apps' own work (what the transport costs) across checkouts."),
        table(["checkout", "protocol s in-process / deployed", "ratio", "end to end ratio", "CPU ratio",
               "SuperLink host MB per CPU s", "federation start s", "load", "same labels"], summary),
        table(head, cpu_rows),
        paragraph(f"By process ({labels[-1]}): the long-lived processes' own CPU seconds (sampled every "
                  f"{profiling.CENSUS_S} s), the ClientApps' and the ServerApp's the rest of their group's."),
        table(["process", "CPU s"], [[name, f"{v:.1f}"] for name, v in _kinds(last)]),
        paragraph(f"Which machine code ran (`perf record -a` at {PERF_HZ} Hz, on-CPU samples only, % of each "
                  "role's samples): the Python interpreter is per-request and per-object work; OpenSSL (hashing, "
                  "TLS), the C library (copies) and the kernel (sockets) grow with the bytes."),
        table(header, native_rows),
        paragraph("The busiest Python functions (py-spy, own samples, % of each role's samples whose innermost "
                  "line is not a wait):"),
        table(["role", "functions"], python),
    ])
