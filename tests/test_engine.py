"""A failing simulation engine ends the run with one line and exit code 1, never a hang."""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys
import threading
import textwrap
import types
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.server.superlink.fleet.vce.backend.backend import Backend
from flwr.server.superlink.fleet.vce.metrics import VceMetrics

from fedgraphcore import transport
from app import engine
from app.client_app import build_client_app
from app.engine import EngineStopped, EngineWatch, WatchedGrid
from app.inprocess import InProcessGrid
from app.run import main, run_experiment
from app.server_app import run_server
from fedgraphcore.wire import ArraySpec, ReplySpec
from tests.conftest import REPO

HANG_GUARD_S = 900  # minutes-scale: only a hang exceeds it (Ray can need minutes to start on a busy machine)

NODE_TIMED_OUT = ("The current node timed out during startup. This could happen because some of the raylet "
                  "failed to startup or the GCS has become overloaded.")


def test_a_ray_start_that_fails_twice_ends_the_run_with_one_line(monkeypatch, capsys, tmp_path):
    """Ray's start fails as on a busy machine: tried once more, then exit 1 naming the cause."""
    import ray

    attempts = []
    engine.stop_ray()  # not one an earlier test left running

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
    engine.stop_ray()  # not one an earlier test left running

    def init_failing_once(*args, **kwargs):
        attempts.append(kwargs)
        if len(attempts) == 1:
            raise Exception(NODE_TIMED_OUT)
        return real_init(*args, **kwargs)

    monkeypatch.setattr(ray, "init", init_failing_once)
    result = run_experiment("fedkmeans", "karate", 2, {"num-rounds": 2}, tmp_path / "out", engine="simulation")
    assert len(attempts) == 2 and (tmp_path / "out" / "result.json").exists()
    assert result["num_clients"] == 2


def test_a_ray_started_for_a_run_serves_the_next_while_the_environment_is_the_same(monkeypatch):
    """Flower's backend ends Ray after every run; kept here, a second run in the process starts no
    Ray (torch's setting its own cache folder is no change), and one whose environment changed (new
    actors inherit Ray's) starts it afresh. Each Ray keeps
    its session files in a folder of its own, removed when it ends."""
    import ray
    from flwr.server.superlink.fleet.vce.backend import raybackend

    running, started = [False], []

    class Starting:
        def __init__(self, config):
            started.append(config)
            running[0] = True

    monkeypatch.setattr(raybackend, "RayBackend", Starting)
    monkeypatch.setattr(ray, "is_initialized", lambda: running[0])
    monkeypatch.setattr(ray, "shutdown", lambda: running.__setitem__(0, False))
    monkeypatch.setattr(engine._Ray, "environment", None)
    engine.start_ray({"run": 1, "init_args": {}})
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/tmp/torch-cache")  # torch's own, on PyG's first import
    engine.start_ray({"run": 2, "init_args": {}})
    assert [c["run"] for c in started] == [1] and running[0]
    first = Path(started[0]["init_args"]["_temp_dir"])
    assert first.is_dir() and first.name.startswith("fedgraph-ray-")
    monkeypatch.setenv("FEDGRAPH_DATA_ROOT", "/elsewhere")
    engine.start_ray({"run": 3, "init_args": {}})
    second = Path(started[1]["init_args"]["_temp_dir"])
    assert [c["run"] for c in started] == [1, 3] and not first.exists() and second.is_dir()
    engine.stop_ray()
    assert not running[0] and engine._Ray.environment is None and not second.exists()


def test_a_run_leaves_ray_and_its_idle_actors_to_the_next_which_tops_them_up(monkeypatch):
    """Flower's backend builds a run's pool with new actors and ends them and Ray after the run; here
    the run's idle actors are kept, the next run's pool takes them (up to its capacity) and adds new
    ones only for what is missing, and ending Ray forgets them."""
    from flwr.server.superlink.fleet.vce.backend import raybackend
    from flwr.simulation.ray_transport import ray_actor

    source = inspect.getsource(raybackend)
    assert "self.pool.terminate_all_actors()\n        ray.shutdown()" in source  # Flower's terminate
    assert "actor_type=ClientAppActor," in source and "add_actors_to_pool(self.pool.actors_capacity)" in source
    started = []

    class Actor:
        @staticmethod
        def options(**resources):
            return types.SimpleNamespace(remote=lambda: started.append(f"actor-{len(started)}") or started[-1])

    capacity = [2]
    monkeypatch.setattr(ray_actor, "ClientAppActor", Actor)
    monkeypatch.setattr(ray_actor, "pool_size_from_resources", lambda resources: capacity[0])
    monkeypatch.setattr(raybackend.RayBackend, "terminate", raybackend.RayBackend.terminate)
    monkeypatch.setattr(engine._Ray, "actors", [])
    engine.keep_ray_between_runs()
    backend = object.__new__(raybackend.RayBackend)

    backend.pool = engine.actor_pool({"num_cpus": 1}, {})
    assert backend.pool.pool == ["actor-0", "actor-1"] and backend.pool.num_actors == 2
    backend.pool.pool.pop()  # busy with a message when the run ended: not kept
    backend.terminate()
    assert engine._Ray.actors == ["actor-0"]
    backend.pool = engine.actor_pool({"num_cpus": 1}, {})
    assert backend.pool.pool == ["actor-0", "actor-2"] and backend.pool.num_actors == 2 and engine._Ray.actors == []
    backend.terminate()
    capacity[0] = 1  # a smaller cluster: one kept actor, none started
    backend.pool = engine.actor_pool({"num_cpus": 1}, {})
    assert backend.pool.pool == ["actor-0"] and len(started) == 3
    backend.terminate()
    engine.stop_ray()  # no Ray runs in this process: forgets the kept actors only
    assert engine._Ray.actors == []


VCE_API = importlib.import_module(engine.VCE_API)


class InThreadBackend(Backend):
    """Flower's backend interface, running the ClientApp in the worker's thread (Ray's actors do
    the same in processes of their own)."""

    def __init__(self) -> None:
        super().__init__({})
        self.app_fn = None

    def build(self, app_fn) -> None:
        self.app_fn = app_fn

    @property
    def num_workers(self) -> int:
        return 2

    def is_worker_idle(self) -> bool:
        return True

    def terminate(self) -> None:
        pass

    def process_message(self, message, context):
        return self.app_fn()(message=message, context=context), context


def test_the_runtimes_pick_up_is_flowers_loop_with_its_wait_replaced():
    """What :func:`app.engine.pick_up_on_push` replaces is Flower's: the runtime starts its pick-up
    thread by the module's name, which looks for each node's next message, then waits 0.1 s."""
    source = inspect.getsource(VCE_API)
    assert "target=add_messages_to_queue," in inspect.getsource(VCE_API.run_api)
    assert "state.get_message_ins(node_id=node_id, limit=1)" in source and "f_stop.wait(0.1)" in source
    assert engine.PICKUP_WAIT_S == 0.1
    assert list(inspect.signature(engine.add_messages_to_queue).parameters) == ["state", "queue", "nodes_mapping",
                                                                              "f_stop"]
    grid = inspect.getsource(importlib.import_module("flwr.superlink.grid.inmemory_grid"))
    assert "self.state.store_message_ins(msg)" in grid and "self.state.get_message_res(" in grid


def test_flowers_runtime_hands_each_message_over_when_pushed_and_the_server_pulls_each_reply_when_stored(
        monkeypatch):
    """Flower's simulation runtime (its threads, the ClientApp run in the worker's thread instead of a
    Ray actor) under :func:`app.engine.pick_up_on_push`, with both of its fallback waits an hour:
    every step completes, so each message was picked up when stored and each reply pulled when
    stored, neither on a timer."""
    from flwr.server.superlink.linkstate import LinkStateFactory
    from flwr.superlink.grid import InMemoryGrid
    from flwr.supercore.constant import FLWR_IN_MEMORY_DB_NAME
    from flwr.supercore.object_store import ObjectStoreFactory
    from flwr.supercore.run import Run
    from flwr.superlink.federation import NoOpFederationManager
    from flwr.proto.task_pb2 import Task  # pylint: disable=no-name-in-module
    from flwr.server.superlink.linkstate.in_memory_linkstate import RunRecord
    from flwr.common.constant import SUPERLINK_NODE_ID
    from flwr.supercore.constant import NOOP_FEDERATION_ID
    from flwr.supercore.task_identity import TaskIdentity

    monkeypatch.setattr(engine, "PICKUP_WAIT_S", 3600.0)
    monkeypatch.setattr(transport, "POLL_MAX_S", 3600.0)
    monkeypatch.setattr(transport, "POLL_START_S", 3600.0)
    monkeypatch.setattr(transport, "LIVENESS_EVERY_S", 3600.0)
    engine.pick_up_on_push()
    factory = LinkStateFactory(FLWR_IN_MEMORY_DB_NAME, NoOpFederationManager(), ObjectStoreFactory())
    run = Run.create_empty(run_id=7)  # registered as flwr.simulation's _main_loop does
    run.primary_task_id, run.federation_id = 8, NOOP_FEDERATION_ID
    factory.state().run_ids[run.run_id] = RunRecord(run=run)
    factory.state().task_store[run.primary_task_id] = Task(task_id=run.primary_task_id, run_id=run.run_id)
    for name, value in (("_task_id", 1), ("_run_id", run.run_id), ("_node_id", SUPERLINK_NODE_ID)):
        monkeypatch.setattr(TaskIdentity, name, value)
    nodes = VCE_API._register_nodes(2, factory)
    stores = VCE_API._register_node_info_stores(nodes, run)
    client = ClientApp()

    @client.query("echo")
    def echo(message, context):
        return Message(transport.pack({"x": transport.unpack(message.content)[0]["x"] + 1}), reply_to=message)

    stop = threading.Event()
    runtime = threading.Thread(target=VCE_API.run_api, args=(lambda: client, InThreadBackend, nodes, factory, stores,
                                                             stop, VceMetrics()), daemon=True)
    runtime.start()
    grid = InMemoryGrid(factory)
    grid.set_run(run)
    watched = EngineWatch().grid(grid)
    assert watched.replies_stored is engine.REPLIES_STORED
    spec = ReplySpec(arrays={"x": ArraySpec((3,))})
    try:
        for step in range(20):
            messages = [Message(transport.pack({"x": np.full(3, float(step))}), dst_node_id=node,
                                message_type="query.echo", group_id=str(step)) for node in nodes]
            outcome = transport.exchange(watched, messages, spec, timeout=HANG_GUARD_S, stats=transport.CommStats())
            assert outcome.rejected == {}
            assert all(np.array_equal(transport.unpack(c)[0]["x"], np.full(3, step + 1.0))
                       for c in outcome.replies.values())
    finally:
        stop.set()
        engine.MESSAGES_STORED.stored()  # the pick-up sees the stop at its next look (here: no tick to wait for)
        runtime.join(HANG_GUARD_S)
    assert not runtime.is_alive()


def test_a_grid_of_another_kind_offers_no_reply_signal():
    engine.pick_up_on_push()
    assert EngineWatch().grid(InProcessGrid(build_client_app(), 2)).replies_stored is None


def test_only_a_process_running_flowers_simulation_runtime_is_changed(monkeypatch):
    calls = []
    monkeypatch.setattr(engine, "speed_up_runtime", lambda: calls.append(1))
    monkeypatch.delitem(sys.modules, engine.VCE_API)
    engine.speed_up_runtime_in_simulation()
    assert calls == []
    monkeypatch.setitem(sys.modules, engine.VCE_API, VCE_API)
    engine.speed_up_runtime_in_simulation()
    assert calls == [1]


def test_each_ray_worker_imports_the_clientapps_modules_as_it_starts(monkeypatch):
    """Ray's setup hook names a function that exists and imports what it lists; an import that
    fails there is left to the ClientApp that needs it."""
    seen = {}
    init = engine._preloading_workers(lambda *args, **kwargs: seen.update(kwargs))
    init(runtime_env={"env_vars": {"PYTHONPATH": "x"}}, logging_level="WARNING")
    assert seen == {"runtime_env": {"env_vars": {"PYTHONPATH": "x"}, "worker_process_setup_hook": engine.PRELOAD_HOOK},
                    "logging_level": "WARNING"}
    module, _, name = engine.PRELOAD_HOOK.rpartition(".")
    assert getattr(importlib.import_module(module), name) is engine.preload_worker
    monkeypatch.setattr(engine, "WORKER_PRELOAD", ("colorsys", "no_such_module_here"))
    monkeypatch.delitem(sys.modules, "colorsys", raising=False)
    engine.preload_worker()
    assert "colorsys" in sys.modules


class FakeRef:
    """An object reference of Ray's, as far as :class:`app.engine.ShippedOnce` uses one."""

    def __init__(self, key: bytes) -> None:
        self.key = key

    def binary(self) -> bytes:
        return self.key


def test_flowers_ray_backend_ships_its_app_loader_with_every_message():
    """What :func:`app.engine.ray_backend_per_message` changes is Flower's: each message is submitted
    to an actor with the backend's ``app_fn``, which ``build`` sets, and Ray starts in ``init_ray``
    with the backend config's ``init_args``."""
    from flwr.server.superlink.fleet.vce.backend import raybackend

    source = inspect.getsource(raybackend)  # the module's: a test before may have changed the class
    assert "a.run.remote(a_fn, mssg, cid, state)" in source
    assert "(self.app_fn, message, str(partition_id), context)" in source
    assert "self.app_fn = app_fn" in source and "ray.init(" in source


def test_the_app_loader_travels_as_a_reference_and_each_actor_fetches_it_once(monkeypatch):
    import pickle

    import ray
    from ray import cloudpickle

    client = build_client_app({"strategy": "kcagc"})
    stored, fetched = {}, []

    def put(value):
        stored[b"ref-1"] = cloudpickle.dumps(value)
        return FakeRef(b"ref-1")

    def get(ref):
        fetched.append(ref.key)
        return pickle.loads(stored[ref.key])

    monkeypatch.setattr(ray, "put", put)
    monkeypatch.setattr(ray, "get", get)
    monkeypatch.setattr(engine, "SHIPPED", {})
    shipped = engine.ShippedOnce(lambda: client)
    assert shipped() is client  # the driver calls its own loader
    wire = cloudpickle.dumps(shipped)
    assert len(wire) < len(stored[b"ref-1"]) / 10  # a reference, not the ClientApp's handlers
    in_actor = [pickle.loads(wire) for _ in range(3)]  # three messages to one actor
    apps = [loader() for loader in in_actor]
    assert fetched == [b"ref-1"] and all(isinstance(a, ClientApp) for a in apps) and apps[0] is apps[2]


def test_ray_starts_passing_small_objects_inline_and_keeps_given_settings(monkeypatch):
    import ray
    from flwr.server.superlink.fleet.vce.backend.raybackend import RayBackend

    monkeypatch.setattr(RayBackend, "build", RayBackend.build)
    monkeypatch.setattr(RayBackend, "init_ray", RayBackend.init_ray)
    engine.ray_backend_per_message()
    engine.ray_backend_per_message()  # idempotent: one wrapper
    started = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kwargs: started.append(kwargs))
    backend = object.__new__(RayBackend)
    backend.init_args_key = "init_args"
    backend.init_ray({"init_args": {"num_cpus": 2, "_system_config": {"object_spilling_threshold": 0.9}}})
    backend.init_ray({})
    assert [s["_system_config"] for s in started] == [
        {"max_direct_call_object_size": engine.INLINE_OBJECT_BYTES, "object_spilling_threshold": 0.9},
        {"max_direct_call_object_size": engine.INLINE_OBJECT_BYTES}]
    assert started[0]["num_cpus"] == 2
