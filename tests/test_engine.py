"""A failing simulation engine ends the run with one line and exit code 1, never a hang."""

from __future__ import annotations

import subprocess
import sys
import threading
import textwrap

import pytest
from flwr.app import RecordDict

from app.client_app import build_client_app
from app.engine import EngineStopped, WatchedGrid
from app.inprocess import InProcessGrid
from app.run import main, run_experiment
from app.server_app import run_server
from tests.conftest import REPO

HANG_GUARD_S = 900  # minutes-scale: only a hang exceeds it (Ray can need minutes to start on a busy machine)

NODE_TIMED_OUT = ("The current node timed out during startup. This could happen because some of the raylet "
                  "failed to startup or the GCS has become overloaded.")


def test_a_ray_start_that_fails_twice_ends_the_run_with_one_line(monkeypatch, capsys, tmp_path):
    """Ray's start fails as on a busy machine: tried once more, then exit 1 naming the cause."""
    import ray

    attempts = []

    def failing_init(*args, **kwargs):
        attempts.append(kwargs)
        raise Exception(NODE_TIMED_OUT)

    monkeypatch.setattr(ray, "init", failing_init)
    out = tmp_path / "out"
    code = main(["--strategy", "fedkmeans", "--dataset", "karate", "--num-clients", "2", "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(attempts) == 2
    assert err[-1] == ("error: Ray did not start (2 attempts): Exception: " + NODE_TIMED_OUT.rstrip(".") + "; no result "
                       "was written; try again when the machine is less busy, or use --engine inprocess")
    assert not (out / "result.json").exists()


def test_a_server_waiting_on_a_stopped_engine_ends_at_once(tmp_path):
    """The ServerApp waits for replies no client will send (timeout 3600 s); the engine's failure
    ends that wait: run_server raises EngineStopped instead of waiting out the timeout."""
    raw = {"strategy": "fedkmeans", "dataset": "karate", "num-clients": 2, "timeout": 3600.0,
           "out-dir": str(tmp_path / "out")}
    inner = InProcessGrid(build_client_app(raw), 2)
    inner.silent.update(inner.contexts)  # connected, never answering: a dead engine's nodes
    stopped = threading.Event()
    raised = []

    def serve():
        try:
            run_server(WatchedGrid(inner, stopped), raw)
        except Exception as err:  # noqa: BLE001 - the test inspects it
            raised.append(err)

    server = threading.Thread(target=serve)
    server.start()
    stopped.set()
    server.join(HANG_GUARD_S)
    assert not server.is_alive()
    assert [type(e) for e in raised] == [EngineStopped]
    assert not (tmp_path / "out" / "result.json").exists()


def test_flowers_poll_ends_when_the_engine_stops():
    """``transport=flower`` waits in the grid's send_and_receive: the engine's failure ends it too."""
    raw = {"strategy": "fedkmeans", "dataset": "karate", "num-clients": 1}
    inner = InProcessGrid(build_client_app(raw), 1)
    inner.silent.update(inner.contexts)
    stopped = threading.Event()
    grid = WatchedGrid(inner, stopped)
    message = grid.create_message(RecordDict(), "query.x", next(iter(inner.contexts)), "g")
    threading.Timer(0.1, stopped.set).start()
    with pytest.raises(EngineStopped):
        grid.send_and_receive([message], timeout=HANG_GUARD_S)


@pytest.mark.simulation
@pytest.mark.slow
def test_an_engine_that_fails_after_the_server_started_ends_the_process(tmp_path):
    """Ray starts, the engine's actor pool fails: the process must not idle until the ServerApp
    thread's step timeout (here 3600 s, beyond the hang guard), but exit 1 with the engine's reason."""
    script = textwrap.dedent("""
        import sys
        from flwr.server.superlink.fleet.vce.backend import raybackend

        def build(self, app_fn):
            raise RuntimeError("injected: the actor pool could not be built")

        raybackend.RayBackend.build = build
        from app.run import main
        sys.exit(main(sys.argv[1:]))
    """)
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-c", script, "--strategy", "fedkmeans", "--dataset", "karate",
                           "--num-clients", "2", "--set", "timeout=3600", "--out", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        "error: the simulation engine failed: RuntimeError: injected: the actor pool could not be built; "
        "no result was written")
    assert not (out / "result.json").exists()


@pytest.mark.simulation
@pytest.mark.slow
def test_a_ray_start_that_fails_once_is_retried_and_the_run_completes(monkeypatch, tmp_path):
    import ray

    real_init, attempts = ray.init, []

    def init_failing_once(*args, **kwargs):
        attempts.append(kwargs)
        if len(attempts) == 1:
            raise Exception(NODE_TIMED_OUT)
        return real_init(*args, **kwargs)

    monkeypatch.setattr(ray, "init", init_failing_once)
    result = run_experiment("fedkmeans", "karate", 2, {"num-rounds": 2}, tmp_path / "out", engine="simulation")
    assert len(attempts) == 2 and (tmp_path / "out" / "result.json").exists()
    assert result["num_clients"] == 2
