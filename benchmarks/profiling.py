"""CPU accounting and profiles of a process tree, by role: the instruments of ``deployment_profile.py``.

* :class:`CpuGroups`: one control group per role (cgroup v1 ``cpuacct``, as root): the kernel
  counts the CPU seconds of every process of a role, the ones that came and went included.
* :class:`Census`: every :data:`CENSUS_S` seconds, the processes of each group, what each is
  (:func:`kind`: a SuperNode, its SuperExec, a fork server, the processes forked below one) and
  the CPU seconds each has used: the long-lived ones' CPU; for the forked ones (a ClientApp per
  message), what the group's total leaves.
* ``perf record -a`` (:func:`perf_record`): which machine code ran, sampled only while a thread
  is on a CPU, whatever the load (:func:`native_split`: the Python interpreter, OpenSSL's hashing
  and TLS, memory copies, the kernel, numpy and BLAS, ...).
* ``py-spy`` (:func:`py_spy`): which Python functions ran. Its samples are of runnable threads:
  on a loaded machine a thread waiting for a CPU counts, and some waits do (a thread woken by a
  timeout); :func:`busy_functions` leaves out every sample whose innermost line is a wait
  (:data:`WAITS`), and its shares are of the rest.
"""

from __future__ import annotations

import collections
import linecache
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

CGROUP_ROOT = Path("/sys/fs/cgroup/cpuacct")
CENSUS_S = 0.25
#: a Python line that waits (a sample whose innermost line is one is idle, not CPU)
WAITS = re.compile(r"(?<![A-Za-z0-9])_*(sleep|wait|wait_for|select|poll|recv|recv_into|read|readinto|recv_bytes|get|"
                   r"acquire|join|accept|readline|run_until_complete|run_forever|run_once)\(")
#: machine code by library (the first pattern matching the library's file name)
NATIVE = (
    ("Python interpreter", r"libpython|python3\.\d+$"),
    ("OpenSSL: hashing, TLS", r"libcrypto|libssl|_hashlib|_ssl\."),
    ("C library: copies, allocation", r"libc\.so|libc-|ld-linux"),
    ("kernel: sockets, pages", r"kernel|vmlinux|\[k\]"),
    ("numpy, scipy, BLAS", r"openblas|_multiarray|scipy|_umath|lapack|numpy"),
    ("protobuf", r"upb|_message\.|protobuf"),
    ("event loop, HTTP parser (uvloop, httptools)", r"uvloop|loop\.cpython|httptools|parser\.cpython"),
    ("cryptography (signatures)", r"_rust|cryptography"),
)


def cgroups_available() -> bool:
    """The kernel's per-group CPU accounting can be used: cgroup v1 ``cpuacct``, writable."""
    return os.access(CGROUP_ROOT, os.W_OK) and (CGROUP_ROOT / "cpuacct.usage").exists()


class CpuGroups:
    """One cpuacct control group per role under a group of this process's own; a process
    started with :meth:`command` enters its role's group before it runs, and everything it
    starts stays there."""

    def __init__(self) -> None:
        self.base = CGROUP_ROOT / f"fedgraph-profile-{os.getpid()}"
        self.base.mkdir(exist_ok=True)
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

    def pids(self, role: str) -> list[int]:
        try:
            return [int(p) for p in (self.base / role / "cgroup.procs").read_text().split()]
        except OSError:
            return []

    def cpu_s(self) -> dict[str, float]:
        return {role: int((self.base / role / "cpuacct.usage").read_text()) / 1e9 for role in self.roles}

    def close(self) -> None:
        """Remove the groups, moving what still runs in them (a process not reaped yet) to the root."""
        for role in self.roles:
            group = self.base / role
            for _ in range(50):
                for pid in self.pids(role):
                    try:
                        (CGROUP_ROOT / "cgroup.procs").write_text(str(pid))
                    except OSError:  # gone meanwhile
                        pass
                try:
                    group.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)
        try:
            self.base.rmdir()
        except OSError:
            pass


def kind(process: psutil.Process, role: str) -> str:
    """What ``process`` of ``role`` is: the role's own process, its SuperExec, a fork server (with
    what it preloads), a process forked below a fork server (ClientApps, a ServerApp, an app
    forker), Flower's resource tracker, or the shell that started it."""
    try:
        cmd = " ".join(process.cmdline())
        parent = process.parent()
        parent_cmd = " ".join(parent.cmdline()) if parent else ""
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return "gone"
    if "multiprocessing.forkserver" in cmd:
        return "forked apps" if "multiprocessing.forkserver" in parent_cmd else "fork server"
    if "multiprocessing.resource_tracker" in cmd:
        return "resource tracker"
    if "superexec" in cmd:
        return "SuperExec"
    return "forked apps" if "multiprocessing.forkserver" in parent_cmd or "forkserver" in parent_cmd else role


class Census:
    """Every :data:`CENSUS_S` s, each group's processes: who each is (:func:`kind`) and its CPU
    seconds so far; ``pid_roles`` maps every pid ever seen to its role (for ``perf``)."""

    def __init__(self, groups: CpuGroups) -> None:
        self.groups = groups
        self.pid_roles: dict[int, str] = {}
        self._cpu: dict[int, tuple[str, str, float]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(CENSUS_S):
            for role in list(self.groups.roles):
                for pid in self.groups.pids(role):
                    self.pid_roles[pid] = role
                    try:
                        process = psutil.Process(pid)
                        known = self._cpu.get(pid)
                        times = process.cpu_times()
                        name = known[1] if known else kind(process, role)
                    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                        continue
                    self._cpu[pid] = (role, name, times.user + times.system)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def by_kind(self, totals: dict[str, float]) -> dict[str, dict[str, float]]:
        """CPU seconds by role and kind; what a role's ``totals`` leaves beyond its long-lived
        processes' last samples goes to its forked apps (their last fraction of a second included)."""
        out: dict[str, dict[str, float]] = collections.defaultdict(dict)
        for role, name, seconds in self._cpu.values():
            if name not in ("forked apps", "gone"):
                out[role][name] = out[role].get(name, 0.0) + seconds
        for role, total in totals.items():
            rest = total - sum(out[role].values())
            if rest > 0.05:
                out[role]["forked apps"] = rest
        return dict(out)


def perf_record(out: Path, rate: int) -> subprocess.Popen | None:
    """``perf record -a`` (every CPU, as root) into ``out``, or None where perf cannot."""
    exe = shutil.which("perf")
    if exe is None or os.geteuid() != 0:
        return None
    return subprocess.Popen([exe, "record", "-a", "-F", str(rate), "-o", str(out)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def stop(process: subprocess.Popen | None) -> None:
    """End a recorder (perf, py-spy write their samples on SIGINT) and wait for it."""
    if process is not None:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
        process.wait()


def _library(dso: str) -> str:
    for name, pattern in NATIVE:
        if re.search(pattern, dso):
            return name
    return "other native code"


def native_split(data: Path, pid_roles: dict[int, str]) -> dict[str, dict[str, int]]:
    """``perf`` samples of ``data`` by role (through ``pid_roles``) and library group (:data:`NATIVE`)."""
    if not data.exists():
        return {}
    script = subprocess.run(["perf", "script", "-i", str(data), "-F", "pid,ip,dso"], capture_output=True, text=True)
    split: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for line in script.stdout.splitlines():  # "  PID  IP (library path)"
        parts = line.split(None, 2)
        if len(parts) < 2 or not parts[0].isdigit():
            continue
        role = pid_roles.get(int(parts[0]))
        if role is not None:
            split[role][_library(parts[2] if len(parts) > 2 else "")] += 1
    return {role: dict(counter.most_common()) for role, counter in split.items()}


def py_spy(out: Path, rate: int, pid: int) -> subprocess.Popen:
    """``py-spy record`` of ``pid`` and every process below it, raw stacks."""
    exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    return subprocess.Popen([exe, "record", "--subprocesses", "--rate", str(rate), "--format", "raw",
                             "--output", str(out), "--pid", str(pid)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def _source_line(frame: str) -> str:
    """The source line of a py-spy frame ``function (path/file.py:line)``, looked up on ``sys.path``."""
    match = re.match(r".* \((.*):(\d+)\)$", frame)
    if not match:
        return ""
    for root in ["", *sys.path]:
        line = linecache.getline(os.path.join(root, match.group(1)), int(match.group(2)))
        if line:
            return line.strip()
    return ""


def _function(frame: str) -> str:
    """``function (path/to/file.py:line)`` as ``function (package/file.py)``."""
    match = re.match(r"(.*) \((.*):\d+\)$", frame)
    if not match:
        return frame
    return f"{match.group(1)} ({'/'.join(match.group(2).split('/')[-2:])})"


def busy_functions(path: Path, top: int = 8) -> dict:
    """The busy samples of a py-spy raw file (innermost line not a wait: :data:`WAITS`), the
    functions with the most own samples among them, and their share of all samples."""
    own, lines, total, busy = collections.Counter(), {}, 0, 0
    if path.exists():
        for line in path.read_text(errors="replace").splitlines():
            stack, _, count = line.rpartition(" ")
            frames = [f for f in stack.split(";") if not f.startswith(("thread ", "process "))]
            total += int(count)
            if not frames:
                continue
            if frames[-1] not in lines:
                lines[frames[-1]] = bool(WAITS.search(_source_line(frames[-1])))
            if not lines[frames[-1]]:
                busy += int(count)
                own[_function(frames[-1])] += int(count)
    return {"samples": total, "busy": busy, "top": own.most_common(top)}
