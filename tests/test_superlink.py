"""``python -m deploy superlink``: the user's own local SuperLink, recovered from a broken state."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from deploy.federation import free_port
from deploy.superlink import Local, database_problem, stop
from tests.conftest import REPO

HANG_GUARD_S = 600


def half_written_database(path: Path) -> None:
    """The state a SuperLink killed while creating its schema leaves: Flower's own migration,
    run in a process that dies right after it created table ``task``."""
    script = textwrap.dedent("""
        import os, sys
        from sqlalchemy import create_engine, event
        from flwr.supercore.state.alembic import utils

        engine = create_engine("sqlite:///" + sys.argv[1])

        @event.listens_for(engine, "after_cursor_execute")
        def die(conn, cursor, statement, *args):
            if statement.lstrip().upper().startswith("CREATE TABLE TASK "):
                os._exit(9)

        with engine.connect() as connection:  # the connection the migration uses, so `die` sees it
            utils._run_migration_workflow(engine, connection)
    """)
    proc = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True,
                          timeout=HANG_GUARD_S)
    assert proc.returncode == 9, proc.stderr


def fake_superlink(tmp_path: Path, name: str, database: Path) -> subprocess.Popen:
    """A process whose command line is a SuperLink's on ``database`` (it only sleeps), as
    ``pkill -f 'flower-superlink --insecure --simulation'`` would match it."""
    script = tmp_path / name / "flower-superlink"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text("import time\ntime.sleep(600)\n")
    return subprocess.Popen([sys.executable, str(script), "--insecure", "--simulation", "--database", str(database)])


def test_a_half_written_database_is_found_unusable(tmp_path):
    broken = tmp_path / "state.db"
    half_written_database(broken)
    assert database_problem(broken).endswith("table node already exists")
    (tmp_path / "text.db").write_text("not a database\n")
    assert "not a database" in database_problem(tmp_path / "text.db")
    assert database_problem(tmp_path / "absent.db") is None


def test_stop_ends_only_the_superlink_of_its_own_flwr_home(tmp_path):
    local = Local(tmp_path / "home", free_port())
    local.dir.mkdir(parents=True)
    own = fake_superlink(tmp_path, "own", local.database)
    other = fake_superlink(tmp_path, "other", tmp_path / "other-home" / "local-superlink" / "state.db")
    try:
        local.pid_file.write_text(f"{other.pid}\n")  # a stale PID file naming another's process
        assert local.running().pid == own.pid  # found by its command line, not by the PID file
        assert stop(local, timeout=HANG_GUARD_S) == own.pid
        assert own.wait(HANG_GUARD_S) is not None
        assert other.poll() is None and psutil.Process(other.pid).is_running()
        assert not local.pid_file.exists()
        assert stop(local) is None  # nothing of its own left to stop
        assert other.poll() is None
    finally:
        for proc in (own, other):
            proc.kill()
            proc.wait(HANG_GUARD_S)


def superlink_cli(action: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "deploy", "superlink", action], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=HANG_GUARD_S)


@pytest.mark.deployment
@pytest.mark.slow
def test_start_recovers_from_a_half_written_database_and_a_stale_pid_file(tmp_path):
    home = tmp_path / "home"
    env = {**os.environ, "FLWR_HOME": str(home), "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(free_port())}
    local = Local(home, int(env["FLWR_LOCAL_SUPERLINK_HTTP_API_PORT"]))
    local.dir.mkdir(parents=True)
    half_written_database(local.database)
    other = fake_superlink(tmp_path, "other", tmp_path / "other-home" / "local-superlink" / "state.db")
    local.pid_file.write_text(f"{other.pid}\n")
    try:
        started = superlink_cli("start", env)
        assert started.returncode == 0, started.stderr + local.log.read_text(errors="replace")[-3000:]
        assert f"removed a stale PID file {local.pid_file}" in started.stdout
        assert "table node already exists" in started.stdout and "state.db.broken-" in started.stdout
        assert len(list(local.dir.glob("state.db.broken-*"))) == 1
        pid = int(local.pid_file.read_text())
        status = superlink_cli("status", env)
        assert status.returncode == 0 and status.stdout.startswith(f"local SuperLink running and ready: pid {pid}")
        assert superlink_cli("stop", env).stdout.strip() == f"stopped the local SuperLink (pid {pid})"
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        assert other.poll() is None  # the stale PID file's process was not touched
        assert database_problem(local.database) is None  # the SuperLink made a complete new one
        assert superlink_cli("status", env).returncode == 1
    finally:
        superlink_cli("stop", env)
        other.kill()
        other.wait(HANG_GUARD_S)
