"""Where a deployed run's CPU goes: every process profiled, beside the in-process run.

    python benchmarks/deployment_profile.py [--nodes 200000] [--supernodes 4] [--rate 20] [--report]

One planted-partition graph (:func:`deployment_scale.settings`) clustered by
``fedspectral-plus`` exact twice with the same seed, one after the other: by
``python -m app.run --engine inprocess`` in a process of its own, and by
``python -m deploy local`` (TLS SuperLink, Fleet gateway, authenticated
SuperNodes). Each process this script starts runs in a control group of its own
role (the in-process run; the SuperLink with its SuperExec and ServerApp; the
gateway; each SuperNode with its SuperExec and ClientApps; the ``flwr`` CLI and
the set-up's tools), whose CPU seconds the kernel counts, the processes that came
and went included (cgroup v1 ``cpuacct``, as root; elsewhere sampled with psutil,
and a process's last half second is lost). ``py-spy`` samples every process at
``--rate`` Hz (CPU only, not idle threads). Printed and written to
``benchmarks/results/deployment_profile.json`` (one row per size and SuperNode count):
the CPU seconds of each role, the bytes the run moved, CPU seconds per GB, the
SuperLink host's MB per CPU second (SuperLink, ServerApp and gateway), and each
role's busiest functions (own samples, and the share of its samples under each
stage of Flower's transport: serialisation, object hashing, HTTP, TLS, ...).
Renders the profile section of ``docs/results/transport.md`` (``benchmarks/transport.py``
renders the rest of the page); ``--report``: only that.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from deployment_scale import settings  # noqa: E402
from pages import RESULTS_DIR  # noqa: E402

MEASURE = "python benchmarks/deployment_profile.py"
RESULTS = "deployment_profile.json"
CGROUP_ROOT = Path("/sys/fs/cgroup/cpuacct")
RATE_HZ = 20
#: roles, as this script names the processes it starts (a SuperNode's is ``supernode-<i>``)
INPROCESS, SUPERLINK, GATEWAY, SET_UP = "in-process", "superlink", "gateway", "set-up"
#: Flower's transport, stage by stage: a frame (``function (file:line)``) whose text matches a
#: pattern counts its samples to that stage (the first match from the innermost frame out)
STAGES = (
    ("TLS", r"\(ssl\.py|SSLObject|_ssl|sslproto\.py"),
    ("object ID hashing", r"get_object_id|_get_object_id|hashlib|sha256"),
    ("object store", r"object_store\.py|in_memory_object_store|objectstore"),
    ("protobuf (de)serialisation", r"_to_proto|_from_proto|SerializeToString|ParseFromString|serde\.py|"
                                   r"deflate|inflate|protobuf/internal|message_pb2|translation\.py"),
    ("HTTP (h11, httpx, httpcore, starlette, uvicorn)", r"h11/|httpx/|httpcore/|starlette/|uvicorn/|anyio/"),
    ("asyncio event loop", r"asyncio/"),
    ("numpy / scipy (the method)", r"numpy/|scipy/|sklearn/|app/protocols|strategies/|clients/"),
    ("imports", r"<frozen importlib|_call_with_frames_removed"),
)


def cgroups_available() -> bool:
    """The kernel's per-group CPU accounting can be used: cgroup v1 ``cpuacct``, writable."""
    return os.access(CGROUP_ROOT, os.W_OK) and (CGROUP_ROOT / "cpuacct.usage").exists()


class CpuGroups:
    """One cpuacct control group per role under a group of this run's own; a process started with
    :meth:`command` enters its role's group before it runs, and everything it starts stays there."""

    def __init__(self) -> None:
        self.base = CGROUP_ROOT / f"fedgraph-profile-{os.getpid()}"
        self.base.mkdir()
        self.roles: list[str] = []

    def group(self, role: str) -> Path:
        path = self.base / role
        if not path.exists():
            path.mkdir()
            self.roles.append(role)
        return path

    def command(self, role: str, cmd: list[str]) -> list[str]:
        """``cmd`` run inside ``role``'s group (a shell writes its own pid there, then becomes ``cmd``)."""
        procs = self.group(role) / "cgroup.procs"
        return ["/bin/sh", "-c", f'echo $$ > {procs} && exec "$@"', "sh", *cmd]

    def cpu_s(self) -> dict[str, float]:
        return {role: int((self.base / role / "cpuacct.usage").read_text()) / 1e9 for role in self.roles}

    def close(self) -> None:
        """Remove the groups, moving what still runs in them (a process not yet reaped) to the root."""
        for role in self.roles:
            group = self.base / role
            for _ in range(50):
                for pid in (group / "cgroup.procs").read_text().split():
                    try:
                        (CGROUP_ROOT / "cgroup.procs").write_text(pid)
                    except OSError:  # gone meanwhile
                        pass
                try:
                    group.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)
        self.base.rmdir()


def role_of(name: str) -> str:
    """The role of a process :class:`deploy.federation.LocalFederation` names ``name``."""
    if name.startswith("supernode-"):
        return name
    return {"superlink": SUPERLINK, "gateway": GATEWAY}.get(name, SET_UP)


def py_spy(out: Path, rate: int, pid: int) -> subprocess.Popen:
    """``py-spy record`` of ``pid`` and every process below it, CPU samples only, raw stacks."""
    exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    return subprocess.Popen([exe, "record", "--subprocesses", "--rate", str(rate), "--format", "raw",
                             "--output", str(out), "--pid", str(pid)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def read_profile(path: Path) -> list[tuple[list[str], int]]:
    """py-spy's raw stacks of ``path``: (frames of the innermost process, outermost first; samples)."""
    stacks = []
    if not path.exists():
        return stacks
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        inner = max((i for i, f in enumerate(frames) if f.startswith("process ")), default=-1)
        stacks.append(([f for f in frames[inner + 1:] if not f.startswith("thread ")], int(count)))
    return stacks


def _function(frame: str) -> str:
    """``function (path/to/file.py:line)`` as ``function (package/file.py)``: the last two path parts."""
    match = re.match(r"(.*) \((.*):\d+\)$", frame)
    if not match:
        return frame
    parts = match.group(2).split("/")
    return f"{match.group(1)} ({'/'.join(parts[-2:])})"


def stage_of(frames: list[str]) -> str:
    """The transport stage (:data:`STAGES`) of a sample: the innermost frame matching one."""
    for frame in reversed(frames):
        for stage, pattern in STAGES:
            if re.search(pattern, frame):
                return stage
    return "other Python"


def summarise(stacks: list[tuple[list[str], int]], top: int = 8) -> dict:
    """Samples, the busiest functions by own samples, and the samples of each stage."""
    own, stages, total = collections.Counter(), collections.Counter(), 0
    for frames, count in stacks:
        total += count
        own[_function(frames[-1]) if frames else "?"] += count
        stages[stage_of(frames)] += count
    return {"samples": total, "top": own.most_common(top), "stages": dict(stages.most_common())}


class Profiled:
    """The processes of one measurement: each in its role's control group (when available) and
    under its own py-spy; ``cpu_s()`` by role, ``profiles()`` by role once they have ended."""

    def __init__(self, work: Path, rate: int) -> None:
        self.work, self.rate = work, rate
        self.groups = CpuGroups() if cgroups_available() else None
        self.spies: dict[str, subprocess.Popen] = {}

    def command(self, role: str, cmd: list[str]) -> list[str]:
        return self.groups.command(role, cmd) if self.groups else cmd

    def watch(self, role: str, pid: int) -> None:
        self.spies[role] = py_spy(self.work / f"{role}.pyspy", self.rate, pid)

    def cpu_s(self) -> dict[str, float]:
        return self.groups.cpu_s() if self.groups else {}

    def stop_spies(self) -> None:
        """End every py-spy (it writes its samples on SIGINT) before its processes are killed: a
        process py-spy is tracing when it is killed is reaped only once py-spy lets go of it."""
        for spy in self.spies.values():
            if spy.poll() is None:
                spy.send_signal(signal.SIGINT)
        for spy in self.spies.values():
            spy.wait()

    def profiles(self) -> dict[str, dict]:
        self.stop_spies()
        return {role: summarise(read_profile(self.work / f"{role}.pyspy")) for role in self.spies}

    def close(self) -> None:
        if self.groups:
            self.groups.close()


def profile_inprocess(nodes: int, supernodes: int, work: Path, rate: int) -> dict:
    out = work / "inprocess"
    command = [sys.executable, "-m", "app.run", "--engine", "inprocess", "--strategy", "fedspectral-plus",
               "--dataset", "sbm", "--num-clients", str(supernodes), "--out", str(out)]
    for item in settings(nodes):
        command += ["--set", item]
    profiled = Profiled(work, rate)
    try:
        start = time.perf_counter()
        proc = subprocess.Popen(profiled.command(INPROCESS, command), cwd=HERE.parent, stdout=subprocess.DEVNULL)
        profiled.watch(INPROCESS, proc.pid)
        if proc.wait():
            raise RuntimeError(f"the in-process run failed (exit code {proc.returncode})")
        wall = time.perf_counter() - start
        cpu = profiled.cpu_s()
        return {"wall_s": wall, "cpu_s": cpu, "profiles": profiled.profiles(),
                "result": json.loads((out / "result.json").read_text())}
    finally:
        profiled.close()


def profile_deployed(nodes: int, supernodes: int, work: Path, rate: int) -> dict:
    """The deployed run with each process of the federation in its role's group and under py-spy."""
    from deploy.__main__ import RUN_TIMING, run_local
    from deploy.federation import LocalFederation

    out, profiled = work / "deployed", Profiled(work, rate)
    inside, spawn, close = LocalFederation._inside, LocalFederation._spawn, LocalFederation.close

    def grouped(self, name, cmd):
        return profiled.command(role_of(name), inside(self, name, cmd))

    def watched(self, name, cmd, *args, **kwargs):
        proc = spawn(self, name, cmd, *args, **kwargs)
        if role_of(name) != SET_UP:
            profiled.watch(role_of(name), proc.pid)
        return proc

    def closed(self):
        profiled.stop_spies()
        close(self)

    LocalFederation._inside, LocalFederation._spawn, LocalFederation.close = grouped, watched, closed
    try:
        start = time.perf_counter()
        path = run_local(supernodes, "fedspectral-plus", "sbm", "auto", settings(nodes), out)
        wall = time.perf_counter() - start
        cpu = profiled.cpu_s()
        return {"wall_s": wall, "cpu_s": cpu, "profiles": profiled.profiles(),
                "timing": json.loads((out / RUN_TIMING).read_text()), "result": json.loads(path.read_text()),
                "labels": path.parent / "labels.npy"}
    finally:
        LocalFederation._inside, LocalFederation._spawn, LocalFederation.close = inside, spawn, close
        profiled.close()


def measure(nodes: int, supernodes: int, rate: int, work: Path) -> dict:
    load = [os.getloadavg()[0]]
    local = profile_inprocess(nodes, supernodes, work / "inprocess-run", rate)
    load.append(os.getloadavg()[0])
    deployed = profile_deployed(nodes, supernodes, work / "deployed-run", rate)
    load.append(os.getloadavg()[0])
    traffic = deployed["result"]["communication"]
    gigabytes = (traffic["bytes_up"] + traffic["bytes_down"]) / 1e9
    same = bool(np.array_equal(np.load(deployed["labels"]), np.load(work / "inprocess-run" / "inprocess" / "labels.npy")))
    cpu = {**local["cpu_s"], **deployed["cpu_s"]}
    host = sum(cpu.get(role, 0.0) for role in (SUPERLINK, GATEWAY))
    deployed_cpu = sum(v for k, v in deployed["cpu_s"].items())
    return {
        "nodes": nodes, "supernodes": supernodes, "rate_hz": rate, "settings": settings(nodes),
        "load_average": f"{min(load):.1f}-{max(load):.1f}", "cpu_counted_by": "cgroup" if cpu else "none",
        "same_labels": same, "gigabytes": gigabytes, "messages": traffic["messages"],
        "inprocess_protocol_s": local["result"]["timing"]["protocol_s"], "inprocess_wall_s": local["wall_s"],
        "deployed_protocol_s": deployed["result"]["timing"]["protocol_s"], "deployed_wall_s": deployed["wall_s"],
        "federation_start_s": deployed["timing"]["federation_start_s"],
        "cpu_s": cpu, "deployed_cpu_s": deployed_cpu,
        "cpu_ratio": deployed_cpu / cpu[INPROCESS] if cpu.get(INPROCESS) else None,
        "cpu_s_per_gb": {role: seconds / gigabytes for role, seconds in cpu.items()},
        "superlink_host_mb_per_cpu_s": gigabytes * 1e3 / host if host else None,
        "profiles": {**local["profiles"], **deployed["profiles"]},
    }


def print_row(row: dict) -> None:
    print(f"{row['nodes']:,} nodes, {row['supernodes']} SuperNodes, load {row['load_average']}: protocol "
          f"{row['inprocess_protocol_s']:.1f} s in-process, {row['deployed_protocol_s']:.1f} s deployed; end to end "
          f"{row['inprocess_wall_s']:.1f} / {row['deployed_wall_s']:.1f} s (start {row['federation_start_s']:.1f} s); "
          f"{row['gigabytes']:.2f} GB; same labels: {row['same_labels']}")
    print("  CPU seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in row["cpu_s"].items())
          + f"; deployed {row['deployed_cpu_s']:.1f}" + (f" (x{row['cpu_ratio']:.2f})" if row["cpu_ratio"] else ""))
    if row["superlink_host_mb_per_cpu_s"]:
        print(f"  SuperLink host: {row['superlink_host_mb_per_cpu_s']:.0f} MB per CPU second")
    for role, profile in row["profiles"].items():
        total = max(profile["samples"], 1)
        print(f"  {role}: {profile['samples']} samples; " + ", ".join(
            f"{stage} {100 * n / total:.0f}%" for stage, n in profile["stages"].items()))
        for function, n in profile["top"]:
            print(f"      {100 * n / total:5.1f}%  {function}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=200_000)
    parser.add_argument("--supernodes", type=int, default=4)
    parser.add_argument("--rate", type=int, default=RATE_HZ, help=f"py-spy samples a second (default {RATE_HZ})")
    parser.add_argument("--keep", type=Path, default=None, help="keep the logs and raw profiles in this folder")
    parser.add_argument("--report", action="store_true", help="only render the page from the JSON file")
    args = parser.parse_args()
    if not args.report:
        work = args.keep or Path(tempfile.mkdtemp(prefix=f"profile-{args.nodes}-"))
        work.mkdir(parents=True, exist_ok=True)
        row = measure(args.nodes, args.supernodes, args.rate, work)
        print_row(row)
        out = RESULTS_DIR / RESULTS
        rows = json.loads(out.read_text())["rows"] if out.exists() else []
        rows = [r for r in rows if (r["nodes"], r["supernodes"]) != (row["nodes"], row["supernodes"])] + [row]
        out.write_text(json.dumps({"measure": MEASURE, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
