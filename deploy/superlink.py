"""Your own local SuperLink for ``flwr run .``: ``python -m deploy superlink start|status|stop``.

``flwr run .`` without a federation address submits to the local SuperLink on
``127.0.0.1:$FLWR_LOCAL_SUPERLINK_HTTP_API_PORT`` (39091), and starts one there when
nothing answers, giving it 15 s: on a busy machine it needs longer, ``flwr run`` kills it
half-way, and the killed SuperLink can leave its state database half-written, so that
every later start fails with ``table ... already exists``. This module starts the same
SuperLink (Flower's command, with runtime dependency installation off) and waits for it
as long as it takes, reacting to events: its health endpoint answering, or its process
ending. ``flwr run`` then finds it running.

Everything is the user's own: the SuperLink of ``$FLWR_HOME`` (default ``~/.flwr``),
its files in ``$FLWR_HOME/local-superlink`` (``state.db``, ``superlink.log``,
``superlink.pid``), and a process of this user whose command line names that
``state.db``. ``stop`` ends only that process and its children, never another user's
SuperLink on the same host. ``start`` recovers from a broken state: a PID file of a
process that is gone (or is not this SuperLink) is removed, and a ``state.db`` that
Flower's schema migration cannot bring up to date (tried on a copy, as the SuperLink
does at start) is moved aside to ``state.db.broken-<time>``.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from fedgraphcore.errors import FedGraphError

BIN = Path(sys.executable).parent
PORT_VARIABLE = "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT"
START_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 60.0
PROBE_INTERVAL_S = 0.2


class SuperLinkError(FedGraphError, RuntimeError):
    """The local SuperLink cannot be started or stopped (one line)."""


class Local:
    """The files and port of the local SuperLink of one ``FLWR_HOME``."""

    def __init__(self, home: Path, port: int) -> None:
        self.home, self.port = Path(home), int(port)
        self.dir = self.home / "local-superlink"
        self.database, self.log, self.pid_file = (self.dir / name for name in
                                                  ("state.db", "superlink.log", "superlink.pid"))

    @classmethod
    def of_environment(cls) -> "Local":
        """``$FLWR_HOME`` and the port as ``flwr run`` reads them."""
        from flwr.cli.constant import LOCAL_SUPERLINK_HTTP_API_PORT
        from flwr.supercore.utils import get_flwr_home

        return cls(get_flwr_home().expanduser().resolve(), int(os.environ.get(PORT_VARIABLE,
                                                                              LOCAL_SUPERLINK_HTTP_API_PORT)))

    def command(self) -> list[str]:
        """Flower's own local SuperLink command (``flwr run``'s), with runtime dependency
        installation off: the SuperLink runs the app in this environment."""
        return [str(BIN / "flower-superlink"), "--insecure", "--simulation", "--isolation", "subprocess",
                "--host", "127.0.0.1", "--port", str(self.port), "--database", str(self.database),
                "--log-file", str(self.log), "--log-rotation-interval-hours", "24",
                "--log-rotation-backup-count", "7", "--disable-runtime-dependency-installation"]

    def is_ours(self, proc: psutil.Process) -> bool:
        """``proc`` is a SuperLink of this user on this FLWR_HOME's state.db."""
        try:
            cmd = proc.cmdline()
            mine = proc.uids().real == os.getuid()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            return False
        database = [b for a, b in zip(cmd, cmd[1:]) if a == "--database"]
        return (mine and any(Path(a).name == "flower-superlink" for a in cmd[:2])
                and database == [str(self.database)])

    def running(self) -> psutil.Process | None:
        """This FLWR_HOME's SuperLink: the one in the PID file, else one ``flwr run`` started."""
        pid = self._pid_from_file()
        if pid is not None and psutil.pid_exists(pid):
            proc = psutil.Process(pid)
            if self.is_ours(proc):
                return proc
        for proc in psutil.process_iter():
            if self.is_ours(proc):
                return proc
        return None

    def _pid_from_file(self) -> int | None:
        try:
            return int(self.pid_file.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def healthy(self) -> bool:
        """The SuperLink's health endpoint answers (Flower's own readiness probe)."""
        import httpx

        try:
            return httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=0.4).is_success
        except httpx.HTTPError:
            return False


def database_problem(database: Path) -> str | None:
    """Why the SuperLink would fail to open ``database``, or None: Flower's schema migration,
    which the SuperLink runs at start, tried on a copy (a half-written schema fails there
    with ``table ... already exists``)."""
    if not database.exists():
        return None
    from sqlalchemy import create_engine
    from flwr.supercore.state.alembic.utils import run_migrations

    with tempfile.TemporaryDirectory() as scratch:
        copy = Path(scratch) / "state.db"
        try:
            source = sqlite3.connect(database)
            try:
                target = sqlite3.connect(copy)
                source.backup(target)  # includes what the write-ahead log holds
                target.close()
            finally:
                source.close()
            engine = create_engine(f"sqlite:///{copy}")
            try:
                run_migrations(engine)
            finally:
                engine.dispose()
        except (Exception, SystemExit) as err:  # Flower exits on a schema it does not know
            lines = str(err).strip().splitlines()
            return f"{type(err).__name__}: {lines[0] if lines else ''}"
    return None


def _move_aside(database: Path) -> Path:
    """Rename ``database`` and its -wal/-shm files to ``<name>.broken-<time>``; the new name."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    kept = database.with_name(f"{database.name}.broken-{stamp}")
    for suffix in ("", "-wal", "-shm"):
        part = database.with_name(database.name + suffix)
        if part.exists():
            shutil.move(part, kept.with_name(kept.name + suffix))
    return kept


def _environment() -> dict[str, str]:
    """The SuperLink's environment: this one, with the app's data root made absolute (Flower
    runs an installed copy of the app, where the repository's default does not apply)."""
    from fedgraphcore.data.datasets import ENV_DATA_ROOT, resolve_data_root

    env = {**os.environ, "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1", "FLWR_DISABLE_UPDATE_CHECK": "1",
           "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    root = resolve_data_root()
    if root is not None:
        env[ENV_DATA_ROOT] = str(root)
    return env


def _port_taken(port: int) -> bool:
    import socket

    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def start(local: Local, timeout: float = START_TIMEOUT_S, say=print) -> psutil.Process:
    """Start this FLWR_HOME's SuperLink unless it runs; wait until it answers. Returns its process."""
    proc = local.running()
    if proc is None:
        if local.pid_file.exists():
            local.pid_file.unlink()
            say(f"removed a stale PID file {local.pid_file} (its process is gone or is not this SuperLink)")
        if _port_taken(local.port):
            raise SuperLinkError(f"port {local.port} is taken by another process (another user's SuperLink?), "
                                 f"which flwr run would use; valid: {PORT_VARIABLE}=<a free port> for this "
                                 "command and for flwr run")
        problem = database_problem(local.database)
        if problem is not None:
            kept = _move_aside(local.database)
            say(f"moved the unusable {local.database} ({problem}) to {kept}; the SuperLink starts with a new one")
        proc = _spawn(local)
    _wait_ready(local, proc, timeout)
    return proc


def _spawn(local: Local) -> psutil.Process:
    local.dir.mkdir(parents=True, exist_ok=True)
    with open(local.log, "ab") as log:  # what it prints before its own logging starts goes there too
        popen = subprocess.Popen(local.command(), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                 env=_environment(), start_new_session=True)
    tmp = local.pid_file.with_suffix(".pid.tmp")
    tmp.write_text(f"{popen.pid}\n")
    tmp.replace(local.pid_file)
    return psutil.Process(popen.pid)


def _wait_ready(local: Local, proc: psutil.Process, timeout: float) -> None:
    """Until the SuperLink answers; SuperLinkError when its process ends first or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while not local.healthy():
        try:
            proc.wait(PROBE_INTERVAL_S)  # returns at once when it ends
        except psutil.TimeoutExpired:
            pass
        else:
            local.pid_file.unlink(missing_ok=True)
            raise SuperLinkError(f"the SuperLink exited during start-up; see {local.log}")
        if time.monotonic() > deadline:
            raise SuperLinkError(f"the SuperLink (pid {proc.pid}) does not answer after {timeout:g} s; see "
                                 f"{local.log}; wait longer (--timeout) or stop it (python -m deploy superlink stop)")


def stop(local: Local, timeout: float = STOP_TIMEOUT_S) -> int | None:
    """End this FLWR_HOME's SuperLink and its children (SIGTERM, SIGKILL after ``timeout``);
    its pid, or None when none was running. No other process is signalled."""
    proc = local.running()
    local.pid_file.unlink(missing_ok=True)
    if proc is None:
        return None
    try:
        family = [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return proc.pid
    for member in family:
        try:
            member.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(family, timeout=timeout)
    for member in alive:
        try:
            member.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=timeout)
    return proc.pid


def status(local: Local) -> str:
    """One line: whether this FLWR_HOME's SuperLink runs and answers, with its files."""
    proc = local.running()
    where = f"FLWR_HOME={local.home}, port {local.port}, log {local.log}"
    if proc is not None:
        state = "running and ready" if local.healthy() else "running, not ready yet"
        return f"local SuperLink {state}: pid {proc.pid}, {where}"
    if _port_taken(local.port):
        return f"no local SuperLink of this FLWR_HOME runs, but port {local.port} is taken by another process; {where}"
    return f"no local SuperLink runs; {where}"


def main(command: str, timeout: float | None = None) -> int:
    local = Local.of_environment()
    try:
        if command == "start":
            started = time.monotonic()
            proc = start(local, START_TIMEOUT_S if timeout is None else timeout)
            print(f"local SuperLink ready after {time.monotonic() - started:.1f} s: pid {proc.pid}, 127.0.0.1:"
                  f"{local.port}, FLWR_HOME={local.home}, log {local.log}")
        elif command == "stop":
            pid = stop(local, STOP_TIMEOUT_S if timeout is None else timeout)
            print(f"stopped the local SuperLink (pid {pid})" if pid else
                  f"no local SuperLink of FLWR_HOME={local.home} was running")
        else:
            line = status(local)
            print(line)
            return 0 if line.startswith("local SuperLink running") else 1
    except SuperLinkError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0
