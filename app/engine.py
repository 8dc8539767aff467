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
  busy machine usually starts the second time. Ray and the run's ClientApp actors stay up
  after a run that did not fail (Flower's engine ends both after every run), and the next
  run of the process uses them again while the environment is the same: :func:`app.api.cluster`
  called again, a test suite (a run on kept actors starts no process). Each of Ray's worker
  processes imports the ClientApp's modules as it starts (:func:`preload_worker`), so a
  simulated client's first message does not wait for them.
* The ServerApp talks to its clients through a :class:`WatchedGrid`: once the engine
  has failed, every grid call raises :class:`EngineStopped`, so the ServerApp thread
  ends at its next call instead of at its timeout; the engine's failure is raised as
  one :class:`EngineError` once that thread has ended.

Flower's simulation runtime hands a pushed message to its ClientApp on a 0.1 s tick
(``vce_api.add_messages_to_queue`` looks for new messages, then waits 0.1 s), so every
step waits 50 ms on average before any client starts, and the ServerApp, polling for
the replies, waits again. :func:`pick_up_on_push` makes it event-driven within one
process: Flower's in-memory LinkState signals every message and reply it stores
(:data:`MESSAGES_STORED`, :data:`REPLIES_STORED`), the runtime's pick-up waits for the
first signal (Flower's 0.1 s stays the longest wait), and a :class:`WatchedGrid` over
Flower's in-memory grid offers the reply signal to :func:`fedgraphcore.transport.exchange`, which
then pulls as soon as a reply is stored. :func:`simulate` (``python -m app.run``,
:func:`app.api.cluster`) applies it before the engine starts; under ``flwr run`` the
simulation process applies it when it loads the ClientApp (:mod:`app.client_app`), which
Flower does before it starts the runtime's threads.

Flower's Ray backend submits each message to an actor with the ClientApp's loader, which Ray
pickles by value every time (the ClientApp with all its handlers: ~15 ms of the ServerApp's
process per message), and Ray passes any object over 100 KiB (a client's context with its
state) through its shared-memory store, ~10 ms each way. :func:`ray_backend_per_message` puts
the loader in Ray's object store once per run (:class:`ShippedOnce`) and starts Ray with
objects up to :data:`INLINE_OBJECT_BYTES` passed inline; :func:`speed_up_runtime` applies both
changes with :func:`pick_up_on_push`, where that function is applied.
"""

from __future__ import annotations

import atexit
import functools
import importlib
import os
import shutil
import sys
import tempfile
import threading
import time
from typing import Callable, Iterable

from flwr.app import Message
from flwr.serverapp import Grid, ServerApp

from fedgraphcore import quiet
from fedgraphcore.errors import FedGraphError

RAY_START_ATTEMPTS = 2
#: the longest the simulation runtime's pick-up waits for a stored message (Flower's tick)
PICKUP_WAIT_S = 0.1
#: imported by each of Ray's worker processes as it starts (:func:`preload_worker`): the ClientApp's
#: modules and what every method uses (not the GNN methods' torch: an actor imports it once)
WORKER_PRELOAD = ("app.client_app", "numpy", "scipy.sparse.linalg", "scipy.linalg", "sklearn.cluster")
PRELOAD_HOOK = "app.engine.preload_worker"
#: the module whose pick-up :func:`pick_up_on_push` replaces
VCE_API = "flwr.server.superlink.fleet.vce.vce_api"
#: Ray passes an object up to this size inline, in the task's request or reply, instead of through its
#: shared-memory object store (Ray's default is 100 KiB): a ClientApp's context and message travel
#: with every simulated message, and the store costs them ~10 ms each way
INLINE_OBJECT_BYTES = 2**20
#: variables a library sets in its own process as it loads, whatever the environment: torch's cache folder
#: (set on the first import of ``torch._dynamo``, e.g. by PyG); no reason to start Ray afresh
SELF_SET_ENV = frozenset({"TORCHINDUCTOR_CACHE_DIR"})
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


class StoreSignal:
    """Counts the messages stored in Flower's in-memory LinkState of this process and wakes
    whoever waits for the next one (:meth:`wait_past` a :meth:`mark` taken before looking)."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._count = 0

    def mark(self) -> int:
        with self._condition:
            return self._count

    def stored(self) -> None:
        with self._condition:
            self._count += 1
            self._condition.notify_all()

    def wait_past(self, mark: int, timeout: float) -> bool:
        """Wait until a message is stored after ``mark`` (True), at most ``timeout`` seconds."""
        with self._condition:
            return self._condition.wait_for(lambda: self._count != mark, timeout)


MESSAGES_STORED, REPLIES_STORED = StoreSignal(), StoreSignal()


def _signalling(store, signal: StoreSignal):
    """``store`` (a LinkState's store-message method) followed by ``signal.stored()``."""
    def stored(self, message):
        try:
            return store(self, message)
        finally:
            signal.stored()

    stored.signals = signal
    return stored


def add_messages_to_queue(state, queue, nodes_mapping, f_stop: threading.Event) -> None:
    """Flower's ``vce_api.add_messages_to_queue`` (each node's next undelivered message into the
    workers' queue until ``f_stop``), looking again as soon as a message is stored, or after
    :data:`PICKUP_WAIT_S`, instead of every 0.1 s."""
    while not f_stop.is_set():
        mark, found = MESSAGES_STORED.mark(), False
        for node_id in nodes_mapping:
            for message in state.get_message_ins(node_id=node_id, limit=1):
                queue.put(message)
                found = True
        if not found:
            MESSAGES_STORED.wait_past(mark, PICKUP_WAIT_S)


def pick_up_on_push() -> None:
    """Make Flower's simulation runtime in this process hand each message to its ClientApp when
    it is stored, and signal stored replies (module docstring). Idempotent."""
    from flwr.server.superlink.fleet.vce import vce_api
    from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState

    if vce_api.add_messages_to_queue is add_messages_to_queue:
        return
    InMemoryLinkState.store_message_ins = _signalling(InMemoryLinkState.store_message_ins, MESSAGES_STORED)
    InMemoryLinkState.store_message_res = _signalling(InMemoryLinkState.store_message_res, REPLIES_STORED)
    vce_api.add_messages_to_queue = add_messages_to_queue


class ShippedOnce:
    """The ClientApp loader of Flower's Ray backend (``RayBackend.app_fn``), shipped to each actor once.

    Flower submits every message to an actor as ``actor.run.remote(app_fn, message, cid, context)``,
    so Ray pickles ``app_fn`` with the message each time, by value: a closure holding the
    ClientApp with every handler, 20 KB and about 15 ms of the driver's CPU per message (under
    the GIL the ServerApp and the runtime's threads wait for it). This loader is put in Ray's
    object store once per run; what a message carries is its reference (:meth:`__reduce__`), and
    an actor fetches the loader at its first message and keeps it (:data:`SHIPPED`).
    """

    def __init__(self, app_fn: Callable[[], object]) -> None:
        import ray

        self.app_fn = app_fn
        self.ref = ray.put(app_fn)

    def __reduce__(self):
        return (functools.partial, (load_shipped, self.ref))

    def __call__(self):
        return self.app_fn()


#: the ClientApp loaders this process (an actor) has fetched (:class:`ShippedOnce`), by reference
SHIPPED: dict[bytes, Callable[[], object]] = {}


def load_shipped(ref):
    """The ClientApp of the loader behind ``ref``, which is fetched from Ray's object store the
    first time (in the actor's task, not while Ray unpickles its arguments)."""
    key = ref.binary()
    if key not in SHIPPED:
        import ray

        SHIPPED.clear()  # an actor kept between runs keeps the current run's loader only
        SHIPPED[key] = ray.get(ref)
    return SHIPPED[key]()


def ray_system_config(given: dict | None = None) -> dict:
    """Ray's system settings for the simulation: ``given`` with objects up to
    :data:`INLINE_OBJECT_BYTES` passed inline (Ray's default is 100 KiB)."""
    return {"max_direct_call_object_size": INLINE_OBJECT_BYTES, **(given or {})}


def ray_backend_per_message() -> None:
    """Make Flower's Ray backend in this process ship the ClientApp loader to its actors once per
    run (:class:`ShippedOnce`) instead of with every message, and start Ray with
    :func:`ray_system_config`. Idempotent."""
    from flwr.server.superlink.fleet.vce.backend.raybackend import RayBackend

    if getattr(RayBackend.build, "ships_once", False):
        return
    init_ray = RayBackend.init_ray

    def build_shipping_once(self, app_fn) -> None:
        self.pool = actor_pool(self.client_resources, self.actor_kwargs)
        self.app_fn = ShippedOnce(app_fn)

    def init_ray_inlining(self, backend_config) -> None:
        init_args = dict(backend_config.get(self.init_args_key) or {})
        init_args["_system_config"] = ray_system_config(init_args.get("_system_config"))
        init_ray(self, {**backend_config, self.init_args_key: init_args})

    build_shipping_once.ships_once = True
    RayBackend.build, RayBackend.init_ray = build_shipping_once, init_ray_inlining


def actor_pool(client_resources: dict, actor_kwargs: dict):
    """Flower's pool of ClientApp actors for a run (``RayBackend.build``'s): the actors the last run
    of this process left (:func:`keep_ray_between_runs`), topped up to the pool's capacity with new ones.
    A kept actor's process has imported the ClientApp's modules and its first message no longer waits
    for them; it keeps nothing of a run but the run's loader (:func:`load_shipped`)."""
    from flwr.simulation.ray_transport.ray_actor import BasicActorPool, ClientAppActor

    pool = BasicActorPool(actor_type=ClientAppActor, client_resources=client_resources, actor_kwargs=actor_kwargs)
    kept, _Ray.actors = _Ray.actors[:pool.actors_capacity], []
    pool.pool.extend(kept)
    pool.num_actors = len(kept)
    pool.add_actors_to_pool(pool.actors_capacity - len(kept))
    return pool


def speed_up_runtime() -> None:
    """Flower's simulation runtime in this process, at the pace of its messages:
    :func:`pick_up_on_push` and :func:`ray_backend_per_message`."""
    pick_up_on_push()
    ray_backend_per_message()


def speed_up_runtime_in_simulation() -> None:
    """:func:`speed_up_runtime` in a process that runs Flower's simulation runtime (one that has
    imported it: ``flwr run``'s simulation process loads the ClientApp before it starts the
    runtime's threads); nothing elsewhere (a SuperNode's ClientApp)."""
    if VCE_API in sys.modules:
        speed_up_runtime()


def _picks_up_on_push(grid: Grid) -> bool:
    """``grid`` is Flower's in-memory grid of a runtime changed by :func:`pick_up_on_push` (its
    LinkState signals the replies it stores)."""
    store = getattr(type(getattr(grid, "state", None)), "store_message_res", None)
    return getattr(store, "signals", None) is REPLIES_STORED


class WatchedGrid(Grid):
    """``grid`` whose calls raise :class:`EngineStopped` once ``stopped`` is set. Over Flower's
    in-memory grid of a runtime changed by :func:`pick_up_on_push`, :attr:`replies_stored` is
    the signal of stored replies, on which :func:`fedgraphcore.transport.exchange` waits; over another grid,
    that grid's own ``replies_stored`` if it has one (a deployed ServerApp's, where its SuperLink
    signals replies: :mod:`deploy.flower_shim`), else None."""

    def __init__(self, grid: Grid, stopped: threading.Event) -> None:
        self._grid = grid
        self._stopped = stopped
        self.replies_stored = REPLIES_STORED if _picks_up_on_push(grid) else getattr(grid, "replies_stored", None)

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


class _Ray:
    """The Ray this module started and keeps between runs of this process: the environment its
    processes started with (a new actor inherits Ray's, not this process's), None when none runs."""

    environment: dict | None = None
    #: the idle ClientApp actors the last run left, for the next (:func:`actor_pool`)
    actors: list = []
    #: the folder of its session files (logs, sockets), removed when it ends (Ray's default, /tmp/ray,
    #: keeps every session)
    temp_dir: str | None = None


def environment() -> dict:
    """This process's environment as a Ray started now would pass it on, less :data:`SELF_SET_ENV`."""
    return {key: value for key, value in os.environ.items() if key not in SELF_SET_ENV}


def start_ray(config: dict) -> None:
    """Start Ray as the engine would (Flower's ``RayBackend`` with ``config``), trying once more
    after a failed start; EngineError naming the failure when both fail. A Ray this function
    started for an earlier run of this process is used again when the environment is unchanged
    (ten seconds and more of start-up saved per run), else ended and started afresh."""
    import ray
    from flwr.server.superlink.fleet.vce.backend.raybackend import RayBackend

    if ray.is_initialized() and _Ray.environment == environment():
        return
    stop_ray()
    for attempt in range(1, RAY_START_ATTEMPTS + 1):
        _Ray.temp_dir = tempfile.mkdtemp(prefix="fedgraph-ray-")
        own_folder = {**config, "init_args": {**config["init_args"], "_temp_dir": _Ray.temp_dir}}
        init = ray.init
        ray.init = _preloading_workers(init)
        try:
            RayBackend(own_folder)  # starts Ray; the engine's own backend finds it running
            _Ray.environment = environment()  # Flower's start sets PYTHONPATH: after it
            return
        except Exception as err:  # Ray raises bare Exceptions, e.g. "node timed out during startup"
            stop_ray()  # processes a failed start left behind
            if attempt == RAY_START_ATTEMPTS:
                raise EngineError(f"Ray did not start ({RAY_START_ATTEMPTS} attempts): {cause(err)}; no result "
                                  "was written; try again when the machine is less busy, or use --engine "
                                  "inprocess") from err
        finally:
            ray.init = init


def _preloading_workers(init):
    """``ray.init`` (``init``) with :func:`preload_worker` as every worker process's setup hook."""
    def ray_init(*args, runtime_env=None, **kwargs):
        return init(*args, runtime_env={**(runtime_env or {}), "worker_process_setup_hook": PRELOAD_HOOK}, **kwargs)

    return ray_init


def preload_worker() -> None:
    """Import :data:`WORKER_PRELOAD` in a Ray worker process as it starts (Ray's
    ``worker_process_setup_hook``): a simulated client's first message then runs as the in-process
    engine's does, with the ClientApp's modules loaded. A module that fails to import here fails
    in the ClientApp that needs it, with its own error."""
    for name in WORKER_PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - see the docstring
            pass


def stop_ray() -> None:
    """End Ray (whoever started it), forget the one kept and remove its session files."""
    import ray

    ray.shutdown()
    _Ray.environment, _Ray.actors = None, []
    if _Ray.temp_dir is not None:
        shutil.rmtree(_Ray.temp_dir, ignore_errors=True)
        _Ray.temp_dir = None


def _stop_kept_ray() -> None:
    """At exit: end the Ray kept between runs, if any, and remove its session files."""
    if _Ray.temp_dir is not None:
        stop_ray()


atexit.register(_stop_kept_ray)


def keep_ray_between_runs() -> None:
    """Make Flower's ``RayBackend.terminate``, called at the end of every simulation (after its
    workers have ended, so no actor is busy), leave Ray and the run's idle actors running (Flower's
    ends both) for :func:`start_ray` and :func:`actor_pool` to use again; Ray ends them when the
    process exits. Idempotent."""
    from flwr.server.superlink.fleet.vce.backend.raybackend import RayBackend

    if getattr(RayBackend.terminate, "keeps_ray", False):
        return

    def terminate(self) -> None:
        if self.pool:
            _Ray.actors = list(self.pool.pool)

    terminate.keeps_ray = True
    RayBackend.terminate = terminate


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
    Ctrl-C stops the ServerApp the same way (else its thread, which the interpreter waits for,
    would wait out every step's timeout) and propagates once the thread has ended.
    """
    config = backend_config()
    from flwr.simulation import run_simulation

    watch = EngineWatch()
    speed_up_runtime()
    keep_ray_between_runs()
    start_ray(config)
    try:
        run_simulation(server_app=server_app_for(watch), client_app=client_app, num_supernodes=num_supernodes,
                       backend_config=config)
    except KeyboardInterrupt:
        quiet.mute()  # what Flower's engine threads log of the actors stopped under them says nothing more
        watch.stopped.set()
        watch.server_done.wait(SERVER_STOP_S)
        raise
    except Exception as err:
        if watch.server_done.is_set():  # the ServerApp ended first: its own error
            raise
        stop_ray()  # a failed engine: the next run starts Ray afresh
        watch.stopped.set()
        ended = watch.server_done.wait(SERVER_STOP_S)
        raise EngineError(f"the simulation engine failed: {cause(err)}; no result was written"
                          + ("" if ended else f"; the ServerApp did not stop within {SERVER_STOP_S:g} s")) from err
