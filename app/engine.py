"""Flower's simulation engine, run so that a failing engine ends the run instead of hanging it.

``flwr.simulation.run_simulation`` runs the ServerApp in a (non-daemon) thread and the
clients in Ray actors. When the engine fails (Ray does not start, the actor pool cannot
be built, ...) it raises, but the ServerApp thread goes on waiting for replies that no
client will send (up to ``timeout`` seconds per step, then the next step), and the
interpreter waits for that thread before it exits: the process sat idle for ten
minutes. Here:

* Ray is started before the engine, with the engine's own settings (Flower's
  ``RayBackend`` starts it; the engine then finds it running), and a start that fails is
  tried once more after ``ray.shutdown()``: a node that timed out during start-up on a
  busy machine usually starts the second time.
* The ServerApp talks to its clients through a :class:`WatchedGrid`: once the engine
  has failed, every grid call raises :class:`EngineStopped`, so the ServerApp thread
  ends at its next call instead of at its timeout; the engine's failure is raised as
  one :class:`EngineError` once that thread has ended.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Iterable

from flwr.app import Message
from flwr.serverapp import Grid, ServerApp

from app import quiet
from app.errors import FedGraphError

RAY_START_ATTEMPTS = 2
SERVER_STOP_S = 300.0  # bound on the wait for the ServerApp thread after a failure; it ends at its next grid call


def backend_config() -> dict:
    """The engine's backend: one CPU per simulated client, Ray started with Flower's defaults."""
    from flwr.supercore.constant import DEFAULT_SIMULATION_CONFIG as defaults

    return {"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
            "init_args": {"logging_level": defaults.init_args_logging_level,
                          "log_to_driver": defaults.init_args_log_to_driver, **quiet.ray_init_args()}}


class EngineError(FedGraphError, RuntimeError):
    """The simulation engine failed; the run ended without a result."""


class EngineStopped(FedGraphError, RuntimeError):
    """Raised in the ServerApp thread by a grid call once the engine has failed."""


class WatchedGrid(Grid):
    """``grid`` whose calls raise :class:`EngineStopped` once ``stopped`` is set."""

    def __init__(self, grid: Grid, stopped: threading.Event) -> None:
        self._grid = grid
        self._stopped = stopped

    def _check(self) -> None:
        if self._stopped.is_set():
            raise EngineStopped("the simulation engine stopped; no client will answer")

    def set_run(self, run) -> None:
        self._grid.set_run(run)

    @property
    def run(self):
        return self._grid.run

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None) -> Message:
        return self._grid.create_message(content, message_type, dst_node_id, group_id, ttl)

    def get_node_ids(self) -> Iterable[int]:
        self._check()
        return self._grid.get_node_ids()

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        self._check()
        return self._grid.push_messages(messages)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        self._check()
        return self._grid.pull_messages(message_ids)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        """Flower's push-then-poll, with the wait between polls ended by the engine's failure."""
        pending = {i for i in self.push_messages(messages) if i}
        interval = float(getattr(self._grid, "pull_interval", 0.1))
        deadline = None if timeout is None else time.monotonic() + timeout
        replies: list[Message] = []
        while pending and (deadline is None or time.monotonic() < deadline):
            got = list(self.pull_messages(pending))
            replies.extend(got)
            pending.difference_update(m.metadata.reply_to_message_id for m in got)
            if pending:
                self._stopped.wait(interval)
        return replies


class EngineWatch:
    """What links one ServerApp to the engine running its clients: ``stopped`` (set when the
    engine has failed) and ``server_done`` (set by the ServerApp when its main function ends)."""

    def __init__(self) -> None:
        self.stopped = threading.Event()
        self.server_done = threading.Event()

    def grid(self, grid: Grid) -> Grid:
        return WatchedGrid(grid, self.stopped)


def start_ray(config: dict) -> None:
    """Start Ray as the engine would (Flower's ``RayBackend`` with ``config``), trying once more
    after a failed start; EngineError naming the failure when both fail."""
    import ray
    from flwr.server.superlink.fleet.vce.backend.raybackend import RayBackend

    for attempt in range(1, RAY_START_ATTEMPTS + 1):
        try:
            RayBackend(config)  # starts Ray; the engine's own backend finds it running
            return
        except Exception as err:  # Ray raises bare Exceptions, e.g. "node timed out during startup"
            ray.shutdown()  # processes a failed start left behind
            if attempt == RAY_START_ATTEMPTS:
                raise EngineError(f"Ray did not start ({RAY_START_ATTEMPTS} attempts): {cause(err)}; no result "
                                  "was written; try again when the machine is less busy, or use --engine "
                                  "inprocess") from err


def cause(err: BaseException) -> str:
    """``Type: first line`` of the innermost cause of ``err``."""
    while err.__cause__ is not None or (err.__context__ is not None and not err.__suppress_context__):
        err = err.__cause__ or err.__context__
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0].rstrip('.') if lines else ''}".rstrip(": ")


def simulate(server_app_for: Callable[[EngineWatch], ServerApp], client_app, num_supernodes: int) -> None:
    """Run ``server_app_for(watch)`` and ``client_app`` on Flower's simulation engine.

    An exception of the ServerApp itself propagates as the engine raises it. A failure of
    the engine while the ServerApp still runs stops the ServerApp (see :class:`WatchedGrid`)
    and raises EngineError with the engine's reason, once the ServerApp thread has ended.
    """
    import ray
    from flwr.simulation import run_simulation

    config = backend_config()
    watch = EngineWatch()
    start_ray(config)
    try:
        run_simulation(server_app=server_app_for(watch), client_app=client_app, num_supernodes=num_supernodes,
                       backend_config=config)
    except Exception as err:
        if watch.server_done.is_set():  # the ServerApp ended first: its own error
            raise
        watch.stopped.set()
        ended = watch.server_done.wait(SERVER_STOP_S)
        raise EngineError(f"the simulation engine failed: {cause(err)}; no result was written"
                          + ("" if ended else f"; the ServerApp did not stop within {SERVER_STOP_S:g} s")) from err
    finally:
        ray.shutdown()
