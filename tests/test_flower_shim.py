"""deploy.flower_shim against the pinned Flower: the names and waits it patches are Flower's,
its clock maps them as documented, and a ClientApp forked from the preloaded server is Flower's."""

from __future__ import annotations

import hashlib
import importlib
import inspect
import multiprocessing
import os
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import pytest

from conftest import HANG_GUARD_S
from deploy import app_processes, flower_resilience, flower_shim, gates
from deploy.federation import BIN, flower_command

SUPERNODE = importlib.import_module("flwr.supernode.start_client_internal")
EXECUTOR = importlib.import_module("flwr.supercore.superexec.executor.subprocess_executor")
CLIENTAPP = importlib.import_module("flwr.supernode.runtime.run_clientapp")
SUPERLINK = importlib.import_module("flwr.superlink.cli.flower_superlink")
GRID = importlib.import_module("flwr.superlink.grid.http_grid")
RUN_SUPEREXEC = importlib.import_module("flwr.supercore.superexec.run_superexec")


def test_the_patched_names_and_waits_are_the_pinned_flowers():
    assert SUPERNODE.time is time and SUPERNODE.subprocess is subprocess
    loop = inspect.getsource(SUPERNODE.start_client_internal)
    assert f"time.sleep({flower_shim.FLOWER_IDLE_POLL_S})" in loop  # the idle wait after an empty pull
    assert "_pull_and_store_message(" in loop and "_push_messages(" in loop
    assert 'command = ["flower-superexec"]' in loop and "subprocess.Popen(command)" in loop
    # a gated SuperNode has started its SuperExec when it waits to join
    assert loop.index("subprocess.Popen(command)") < loop.index("with _init_connection(")
    assert f"time.sleep({flower_shim.FLOWER_REPLY_POLL_S})" in inspect.getsource(SUPERNODE._push_messages)
    assert inspect.signature(SUPERNODE._pull_and_store_message).return_annotation in ("int | None", int | None)
    assert EXECUTOR.subprocess is subprocess
    assert "subprocess.Popen(args)" in inspect.getsource(EXECUTOR.SubprocessExecutor.launch)
    # the SuperExec's wait between task polls, and the SuperNode's task made before its parts are pulled
    assert RUN_SUPEREXEC.time is time and RUN_SUPEREXEC._TASK_POLL_INTERVAL_ENV == flower_shim.TASK_POLL_SETTING
    assert "time.sleep(task_poll_interval)" in inspect.getsource(RUN_SUPEREXEC.run_superexec)
    assert RUN_SUPEREXEC._DEFAULT_TASK_POLL_INTERVAL_SECONDS == flower_shim.FLOWER_TASK_POLL_S
    pull = inspect.getsource(SUPERNODE._pull_and_store_message)
    assert pull.index("state.create_task(") < pull.index("state.store_message(") < pull.index("pull_objects(")
    from flwr.supercore.constant import PULL_INITIAL_BACKOFF, TASK_TYPE_TO_COMMAND, TaskType

    assert TASK_TYPE_TO_COMMAND[TaskType.CLIENT_APP] == "flwr-clientapp"
    assert TASK_TYPE_TO_COMMAND[TaskType.SERVER_APP] == "flwr-serverapp"
    assert "fab_hash" in inspect.signature(EXECUTOR.ExecutionSpec).parameters
    for name in app_processes.PRELOAD:
        importlib.import_module(name)
    # Flower's wait for a message part not there yet, called without its own backoff arguments
    assert PULL_INITIAL_BACKOFF == app_processes.FLOWER_OBJECT_POLL_S
    assert "pull_objects(\n                obj_ids_to_pull,\n                pull_object_fn=" in inspect.getsource(
        SUPERNODE._pull_and_store_message)
    assert "backoff" not in inspect.getsource(GRID.HttpGrid.pull_messages)
    assert "pull_and_inflate_object_from_tree(\n        object_tree," in inspect.getsource(CLIENTAPP.pull_task_input)
    assert "backoff" not in inspect.getsource(CLIENTAPP.pull_task_input)
    assert "install_from_fab(fab.content, skip_prompt=True)" in inspect.getsource(CLIENTAPP.run_clientapp)
    assert SUPERLINK.subprocess is subprocess and "subprocess.Popen(command," in inspect.getsource(SUPERLINK)
    assert SUPERLINK._get_superexec_command("127.0.0.1:1", None, None, 7, False)[0] == "flower-superexec"


class FakeTime:
    def __init__(self):
        self.now, self.slept = 100.0, []

    def sleep(self, seconds):
        self.slept.append(seconds)
        self.now += seconds

    def clock(self):
        return self.now


def test_the_idle_wait_grows_with_the_time_since_the_last_message_up_to_flowers():
    fake = FakeTime()
    clock = flower_shim.PollClock(fake.sleep, fake.clock)
    for _ in range(60):
        clock.sleep(3)
    waits = fake.slept
    assert waits[0] == flower_shim.FIRST_IDLE_POLL_S
    assert all(b >= a for a, b in zip(waits, waits[1:])) and waits[-1] == 3.0
    assert waits[10] == pytest.approx(flower_shim.IDLE_FRACTION * sum(waits[:10]))
    fake.slept.clear()
    clock.active()
    clock.sleep(3)
    clock.sleep(0.5)
    clock.sleep(0.25)  # any other wait is the caller's own
    assert fake.slept == [flower_shim.FIRST_IDLE_POLL_S, flower_shim.REPLY_POLL_S, 0.25]
    assert clock.monotonic is time.monotonic


#: the arguments Flower's loop passes to ``_pull_and_store_message`` that the shim wraps
PULL = dict(receive=lambda: None, confirm_message_received=lambda run_id, message_id: None,
            pull_object=lambda run_id, object_id: b"", state=types.SimpleNamespace(finish_task=lambda *a, **kw: None),
            object_store=None)


def test_the_failure_paths_the_shim_handles_are_the_pinned_flowers():
    """The names and calls :func:`flower_resilience.answer_what_is_not_received`,
    :func:`flower_resilience.push_until_stored` and :func:`flower_resilience.survive_error_statuses` wrap."""
    connection = importlib.import_module("flwr.supernode.fleet_http_connection")
    assert "pull_object=pull_object," in inspect.getsource(SUPERNODE.start_client_internal)  # the push asks with it
    pull = inspect.getsource(SUPERNODE._pull_and_store_message)
    assert "if (recv := receive()) is None:" in pull and "confirm_message_received(run_id, message." in pull
    assert "state.finish_task(\n                task_id,\n                sub_status=SubStatus.FAILED," in pull
    assert "_insert_message(reply, state, object_store)" in pull  # Flower's own error reply, for a bundle
    assert list(inspect.signature(SUPERNODE._insert_message).parameters) == ["msg", "state", "store"]
    push = inspect.getsource(SUPERNODE._push_messages)
    assert "send(message, object_tree, clientapp_runtime)" in push
    assert "push_object_fn=partial(push_object, run_id, session_id)" in push
    assert "except Exception as err:" in push  # a failed push drops the reply
    http = inspect.getsource(connection.http_request_response)
    assert "HeartbeatSender(send_node_heartbeat)" in http and "client.ActivateNode," in http
    assert ("if exc.response.status_code in (502, 503, 504):\n                    return False\n"
            "                raise") in http
    assert hasattr(connection.FleetHttpClient, "ActivateNode")


def fake_supernode(pulled):
    module = types.ModuleType("fake_supernode")
    module.calls = []
    module.time = time
    module._pull_and_store_message = lambda **kw: pulled.pop(0)
    module._push_messages = lambda **kw: module.calls.append("push")
    module.pull_objects = lambda ids, fn, **kw: kw
    module.started_with = []
    module.subprocess = types.SimpleNamespace(
        Popen=lambda command, **kw: module.calls.append(command) or module.started_with.append(kw), DEVNULL=-3)
    return module


def test_patched_supernode_polls_soon_after_a_message_and_starts_the_shims_superexec():
    module = fake_supernode([None, 7])
    clock = flower_shim.patch_supernode(module)
    assert isinstance(module.time, flower_shim.PollClock) and module.time is clock
    clock.last_message = -1e9
    assert module._pull_and_store_message(**PULL) is None and clock.last_message == -1e9
    assert module._pull_and_store_message(**PULL) == 7 and time.monotonic() - clock.last_message < HANG_GUARD_S
    module._push_messages(send=None, push_object=None)
    module.subprocess.Popen(["flower-superexec", "--insecure", "--runtime-api-address", "127.0.0.1:9094"])
    module.subprocess.Popen(["something-else", "--x"])
    assert module.calls == ["push", [sys.executable, "-m", "deploy.flower_shim", "superexec", "--insecure",
                                     "--runtime-api-address", "127.0.0.1:9094"], ["something-else", "--x"]]
    assert module.subprocess.DEVNULL == -3  # the rest of the module is unchanged
    assert module.pull_objects([], None)["initial_backoff"] == app_processes.OBJECT_POLL_S
    superexec = module.started_with[0]
    assert superexec["env"][flower_shim.TASK_POLL_SETTING] == str(flower_shim.TASK_POLL_S)
    assert superexec["pass_fds"] == (int(superexec["env"][flower_shim.TASK_PIPE_SETTING]),)
    assert module.started_with[1] == {}


def test_a_gated_supernode_joins_once_its_gate_is_opened_or_its_starter_is_gone():
    for let_go in ("open", "starter gone"):
        module, joined = types.ModuleType("fake_supernode"), []
        module._init_connection = lambda *args, **kwargs: joined.append(args)
        gate, environ = gates.Gate(), {}
        environ.update(gate.environ())
        flower_shim.join_after_gate(module, environ)
        assert environ == {} and not os.get_inheritable(gate.read_end)  # its SuperExec does not hold the gate
        joining = threading.Thread(target=module._init_connection, args=("fleet",))
        joining.start()
        joining.join(0.05)
        assert joining.is_alive() and joined == []  # waits at the gate, however long
        if let_go == "open":
            gate.open()
        else:
            os.close(gate.write_end)
        joining.join(HANG_GUARD_S)
        assert joined == [("fleet",)]
        module._init_connection("again")  # a reconnection does not wait again
        assert joined == [("fleet",), ("again",)]
    plain = types.ModuleType("fake_supernode")
    plain._init_connection = connect = object()
    flower_shim.join_after_gate(plain, {})
    assert plain._init_connection is connect  # no gate: Flower's own


def test_a_superexec_asks_for_a_task_as_soon_as_its_supernode_has_one():
    supernode = fake_supernode([])
    flower_shim.patch_supernode(supernode)
    supernode.subprocess.Popen(["flower-superexec"])
    superexec = types.ModuleType("fake_run_superexec")
    superexec.time = time
    flower_shim.wake_on_tasks(superexec, supernode.started_with[0]["env"])
    supernode.pull_objects([], None)  # Flower creates the task, then pulls the message's parts
    start = time.monotonic()
    superexec.time.sleep(HANG_GUARD_S)
    assert time.monotonic() - start < HANG_GUARD_S  # woken, not timed out
    assert superexec.time.monotonic is time.monotonic
    supernode.pull_objects([], None)
    supernode.pull_objects([], None)  # two tasks made before the SuperExec reads: it asks twice at once
    superexec.time.sleep(HANG_GUARD_S)
    superexec.time.sleep(HANG_GUARD_S)
    assert time.monotonic() - start < HANG_GUARD_S
    for _ in range(100_000):  # wake-ups nobody reads (more than a pipe holds) do not block the SuperNode
        supernode.pull_objects([], None)
    superexec.time.sleep(HANG_GUARD_S)  # read together: at most WAKES_AT_ONCE more asks at once
    for _ in range(flower_shim.WAKES_AT_ONCE):
        superexec.time.sleep(HANG_GUARD_S)


def test_a_superexec_waits_as_flower_does_without_its_supernodes_pipe_or_once_it_is_closed():
    superexec = types.ModuleType("fake_run_superexec")
    superexec.time = time
    flower_shim.wake_on_tasks(superexec, {})
    assert superexec.time is time
    read_end, write_end = os.pipe()
    flower_shim.wake_on_tasks(superexec, {flower_shim.TASK_PIPE_SETTING: str(read_end)})
    assert superexec.time is not time and not os.get_inheritable(read_end)
    os.close(write_end)  # the SuperNode is gone
    superexec.time.sleep(HANG_GUARD_S)
    assert superexec.time is time
    os.close(read_end)


class FakeExecutor:
    def launch(self, spec):
        return spec.fab_hash


def fake_executor():
    module = types.ModuleType("fake_executor")
    module.subprocess = subprocess
    module.SubprocessExecutor = type("SubprocessExecutor", (FakeExecutor,), {})
    return module


def assert_forks_flowers_entry_point(module, command: str) -> None:
    """``module``'s patched ``Popen`` runs Flower's ``command`` in a fork (its argparse: help exits 0,
    an unknown option 2) and any other command as a plain subprocess."""
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    helped = module.subprocess.Popen([command, "--help"], **quiet)
    refused = module.subprocess.Popen([command, "--no-such-option"], **quiet)
    for process in (helped, refused):
        process.join(HANG_GUARD_S)
    assert (helped.exitcode, refused.exitcode) == (0, 2)
    other = module.subprocess.Popen([sys.executable, "-c", "pass"])
    assert isinstance(other, subprocess.Popen) and other.wait(HANG_GUARD_S) == 0


@pytest.mark.deployment
def test_a_forked_clientapp_runs_flowers_flwr_clientapp_entry_point():
    module = fake_executor()
    app_processes.patch_executor(module)
    assert module.SubprocessExecutor().launch(types.SimpleNamespace(fab_hash="ab12")) == "ab12"
    assert_forks_flowers_entry_point(module, "flwr-clientapp")


def test_the_setting_switches_the_shim_off():
    assert flower_command("supernode", {}) == [sys.executable, "-m", "deploy.flower_shim", "supernode"]
    assert flower_command("supernode", {flower_shim.SETTING: "0"}) == [str(BIN / "flower-supernode")]
    assert flower_command("superlink", {}) == [sys.executable, "-m", "deploy.flower_shim", "superlink"]
    assert flower_command("superlink", {flower_shim.SETTING: "0"}) == [str(BIN / "flower-superlink")]
    assert flower_shim.main(["bogus"]) == 2


def test_the_superlink_starts_its_superexec_through_the_shim_and_wakes_it_when_a_run_is_created(tmp_path, monkeypatch):
    monkeypatch.setenv("FLWR_HOME", str(tmp_path))
    started = []
    module = types.SimpleNamespace(subprocess=types.SimpleNamespace(Popen=lambda *a, **kw: started.append((a, kw))),
                                   uvicorn=types.SimpleNamespace(run=lambda **kwargs: kwargs))

    class State:
        def create_run(self, name):
            return f"run {name}"

        def store_message_res(self, message):
            return None

    flower_shim.patch_superlink(module, (State,))
    module.subprocess.Popen(["flower-superexec", "--insecure"], start_new_session=True)
    module.subprocess.Popen(["other"])
    shim = [sys.executable, "-m", "deploy.flower_shim"]
    (args, kwargs), other = started
    assert args == ([*shim, "superlink-superexec", "--insecure"],) and other == ((["other"],), {})
    assert kwargs["start_new_session"] and kwargs["env"][flower_shim.TASK_POLL_SETTING] == str(flower_shim.TASK_POLL_S)
    read_end = int(kwargs["env"][flower_shim.TASK_PIPE_SETTING])
    assert kwargs["pass_fds"] == (read_end,)
    os.set_blocking(read_end, False)
    with pytest.raises(BlockingIOError):
        os.read(read_end, 16)  # nothing yet
    assert State().create_run("x") == "run x"
    assert os.read(read_end, 16) == b"t"  # the SuperExec's wait ends
    # an idle connection kept longer than its clients keep it: they close it, never the SuperLink under them
    assert module.uvicorn.run(port=1) == {"port": 1, "timeout_keep_alive": flower_shim.SUPERLINK_KEEPALIVE_S}
    from deploy.gateway import UPSTREAM_KEEPALIVE_S

    assert UPSTREAM_KEEPALIVE_S < flower_shim.SUPERLINK_KEEPALIVE_S
    source = inspect.getsource(SUPERLINK._run_superlink_http_api)
    assert SUPERLINK.uvicorn.run is not None and "uvicorn.run(" in source and "timeout_keep_alive" not in source
    from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState
    from flwr.server.superlink.linkstate.sql_linkstate import SqlLinkState

    for state in (InMemoryLinkState, SqlLinkState):  # Flower's run, its primary (ServerApp) task made with it
        assert "primary_task_id" in inspect.getsource(state.create_run)


@pytest.mark.deployment
def test_a_forked_serverapp_runs_flowers_flwr_serverapp_entry_point():
    module = fake_executor()
    app_processes.fork_serverapps(module, multiprocessing.get_context("spawn"))
    assert_forks_flowers_entry_point(module, "flwr-serverapp")
    for name in app_processes.PRELOAD_SERVERAPP:
        importlib.import_module(name)


def test_a_message_part_not_there_yet_is_asked_for_again_soon():
    calls = []
    pull = app_processes.short_object_polls(lambda ids, fn, **kw: calls.append(kw))
    pull(["a"], None)
    assert calls == [{"initial_backoff": app_processes.OBJECT_POLL_S, "backoff_cap": app_processes.OBJECT_POLL_CAP_S,
                      "max_tries_per_object": None}]  # Flower's time limit stays; its count of tries would not
    grid = types.SimpleNamespace(pull_objects=lambda ids, fn, **kw: kw)
    app_processes.patch_serverapp(grid)
    assert grid.pull_objects([], None)["initial_backoff"] == app_processes.OBJECT_POLL_S < 1


def test_a_serverapp_hears_of_each_reply_its_superlink_stores_for_its_run(tmp_path, monkeypatch):
    """The SuperLink signals every reply its LinkState stores to the FIFO of the reply's run; the
    ServerApp's grid waits on it instead of polling; a run without a FIFO is nobody's concern."""
    monkeypatch.setenv("FLWR_HOME", str(tmp_path))
    module = types.SimpleNamespace(subprocess=types.SimpleNamespace(Popen=lambda *a, **kw: kw),
                                   uvicorn=types.SimpleNamespace(run=print))

    class State:
        def create_run(self, name):
            return name

        def store_message_res(self, message):
            return None if message.metadata.run_id == 0 else "stored"

    flower_shim.patch_superlink(module, (State,))
    environ = module.subprocess.Popen(["flower-superexec"])["env"]  # what the SuperExec, its ServerApps get
    directory = Path(environ[app_processes.REPLY_SIGNALS_SETTING])
    assert directory.parent == tmp_path / "reply-signals" and directory.stat().st_mode & 0o777 == 0o700
    http_grid = types.SimpleNamespace(pull_objects=print, HttpGrid=type("HttpGrid", (), {"_run": None}))
    app_processes.patch_serverapp(http_grid, environ)
    grid = http_grid.HttpGrid()
    assert grid.replies_stored is None  # before Flower sets the run
    grid._run = types.SimpleNamespace(run_id=7)
    signal = grid.replies_stored
    assert signal is grid.replies_stored and (directory / "7").is_fifo()

    def reply(run_id):
        return types.SimpleNamespace(metadata=types.SimpleNamespace(run_id=run_id))

    mark = signal.mark()
    for other in (8, 0):  # another run's reply; a reply the LinkState did not store
        State().store_message_res(reply(other))
        assert not signal.wait_past(mark, 0)
    assert State().store_message_res(reply(7)) == "stored"
    assert signal.wait_past(mark, HANG_GUARD_S) and not signal.wait_past(signal.mark(), 0)
    app_processes.ReplySignal.remove_made()
    assert not (directory / "7").exists()
    State().store_message_res(reply(7))  # its ServerApp gone: nothing to tell


def install_toy_app(home, fab_hash):
    """An app Flower would have installed under ``home`` for ``fab_hash``: its module records
    the pid of every process that imports it."""
    app_dir = home / "apps" / f"someone.toy.1.0.0.{fab_hash[:8]}"
    app_dir.mkdir(parents=True)
    (app_dir / "pyproject.toml").write_text(
        '[project]\nname = "toy"\nversion = "1.0.0"\n[tool.flwr.app]\npublisher = "someone"\n'
        '[tool.flwr.app.components]\nserverapp = "toyapp:app"\nclientapp = "toyapp:app"\n')
    (app_dir / "toyapp.py").write_text(
        "import os\nfrom pathlib import Path\nfrom flwr.clientapp import ClientApp\n"
        "with open(Path(__file__).with_name('imported-by'), 'a') as f:\n    f.write(f'{os.getpid()}\\n')\n"
        "app = ClientApp()\n")
    return app_dir


def test_the_installed_bundle_is_found_by_its_hash_and_not_unpacked_again(tmp_path, monkeypatch):
    monkeypatch.setenv("FLWR_HOME", str(tmp_path))
    content = b"the bundle's bytes"
    fab_hash = hashlib.sha256(content).hexdigest()
    assert app_processes.installed_app_dir(fab_hash) is None and app_processes.installed_app_dir(None) is None
    app_dir = install_toy_app(tmp_path, fab_hash)
    assert app_processes.installed_app_dir(fab_hash) == app_dir
    installs = []
    install = app_processes.install_known_fab(fab_hash, app_dir, lambda fab, **kw: installs.append(fab) or "flower's")
    assert install(content, skip_prompt=True) == app_dir and installs == []
    assert install(b"another bundle", skip_prompt=True) == "flower's" and installs == [b"another bundle"]
    (tmp_path / "apps" / f"someone.other.2.0.0.{fab_hash[:8]}").mkdir()
    (tmp_path / "apps" / f"someone.other.2.0.0.{fab_hash[:8]}" / "pyproject.toml").write_text("")
    assert app_processes.installed_app_dir(fab_hash) is None  # two bundles share the prefix: ask Flower


@pytest.mark.deployment
def test_clientapps_of_an_installed_bundle_fork_from_one_process_that_loaded_it(tmp_path, monkeypatch, capfd):
    monkeypatch.setenv("FLWR_HOME", str(tmp_path))
    fab_hash = hashlib.sha256(b"toy").hexdigest()
    forkers = app_processes.AppForkers(multiprocessing.get_context("spawn"))  # its stdout: this test's
    assert not forkers.submit(fab_hash, ["flwr-clientapp", "--help"], False)  # not installed: a cold start
    app_dir = install_toy_app(tmp_path, fab_hash)
    for _ in range(2):
        assert forkers.submit(fab_hash, ["flwr-clientapp", "--help"], False)
    printed = ""
    deadline = time.monotonic() + HANG_GUARD_S
    while printed.count("usage: flwr-clientapp") < 2 and time.monotonic() < deadline:
        printed += capfd.readouterr().out
        time.sleep(0.05)
    assert printed.count("usage: flwr-clientapp") == 2  # Flower's entry point ran in both forks
    importers = (app_dir / "imported-by").read_text().split()
    assert len(importers) == 1 and int(importers[0]) != os.getpid()  # loaded once, by the forker


@pytest.mark.deployment
def test_a_bundle_the_forker_cannot_load_starts_cold(tmp_path, monkeypatch, capfd):
    monkeypatch.setenv("FLWR_HOME", str(tmp_path))
    fab_hash = hashlib.sha256(b"broken").hexdigest()
    app_dir = install_toy_app(tmp_path, fab_hash)
    (app_dir / "toyapp.py").write_text("raise ImportError('no such thing')\n")
    forkers = app_processes.AppForkers(multiprocessing.get_context("spawn"))  # its stdout: this test's
    assert not forkers.submit(fab_hash, ["flwr-clientapp", "--help"], False)
    assert "starts every ClientApp cold: ImportError: no such thing" in capfd.readouterr().err
    assert not forkers.submit(fab_hash, ["flwr-clientapp", "--help"], False)  # and is not loaded again


def test_a_forker_imports_the_slow_packages_its_clientapps_imported(monkeypatch):
    """A ClientApp reports the modules of the packages in LEARNED it imported (two levels), the
    forker imports them before its next fork; nothing else is reported."""
    monkeypatch.setattr(app_processes, "LEARNED", ("xml",))  # a package standing in for torch
    for name in [n for n in sys.modules if n == "xml" or n.startswith("xml.")]:
        monkeypatch.delitem(sys.modules, name)
    learned, reports = os.pipe()
    os.set_blocking(learned, False)
    os.set_blocking(reports, False)
    loaded = set(sys.modules)
    importlib.import_module("xml.dom.minidom")
    importlib.import_module("colorsys")
    assert app_processes.learned_modules(loaded) == ["xml", "xml.dom"]
    app_processes.report_learned(reports, loaded)
    app_processes.report_learned(reports, loaded)  # a second ClientApp: the same names
    for name in [n for n in sys.modules if n == "xml" or n.startswith("xml.")]:
        monkeypatch.delitem(sys.modules, name)
    app_processes.import_learned(learned)
    assert "xml.dom" in sys.modules and "xml.dom.minidom" not in sys.modules
    app_processes.import_learned(learned)  # nothing more to read: returns at once
    os.close(learned)
    os.close(reports)


def test_what_is_preloaded_leaves_the_slow_packages_to_the_runs_that_import_them():
    for preload in (app_processes.PRELOAD, app_processes.PRELOAD_SERVERAPP):
        assert not {name.split(".")[0] for name in preload} & set(app_processes.LEARNED)


@pytest.mark.parametrize("rows", [600_000, 1_600_000])  # an inline bundle (4.8 MB), an array in chunks (12.8 MB)
def test_a_clientapp_hashes_each_byte_of_its_reply_once(monkeypatch, rows):
    """Flower's push_message hashes a reply's bytes two to three times; changed, once, and every
    object the SuperNode asks for is pushed with the content Flower's own push sends."""
    import numpy as np
    from flwr.app import Message
    from flwr.supercore.inflatable import inflatable_object
    from flwr.supercore.task_identity import TaskIdentity

    from fedgraphcore.transport import pack

    for name in ("_run_id", "_node_id", "_task_id"):
        monkeypatch.setattr(TaskIdentity, name, 1)
    hashed, real = [], inflatable_object.get_object_id
    monkeypatch.setattr(inflatable_object, "get_object_id", lambda content: hashed.append(len(content)) or real(content))

    def push_with(module):
        pushed = {}
        client = types.SimpleNamespace(PushObject=None, PushMessages=lambda request: types.SimpleNamespace(
            session_id="s", objects_to_push=[tree.object_id for tree in
                                             inflatable_object.iterate_object_tree(request.message_object_trees[0])]))
        monkeypatch.setattr(module, "make_push_object_fn_protobuf",
                            lambda *args, **kwargs: lambda object_id, content: pushed.update({object_id: content}))
        request = Message(pack({}), dst_node_id=2, message_type="query.x", group_id="1")
        reply = Message(pack({"x": np.arange(rows, dtype=np.float64)}), reply_to=request)
        hashed.clear()
        module.push_message(client, reply, types.SimpleNamespace(node_id=2, run_id=1))
        return pushed, sum(hashed)

    flowers, flowers_hashed = push_with(CLIENTAPP)
    for name in ("push_message", "no_object_id_recompute"):  # Flower's again after the test
        monkeypatch.setattr(CLIENTAPP, name, getattr(CLIENTAPP, name))
    app_processes.hash_reply_once(CLIENTAPP, inflatable_object)
    ours, ours_hashed = push_with(CLIENTAPP)
    def records(pushed):  # the message object itself differs (each reply is made at its own time)
        return {k: v for k, v in pushed.items() if not v.startswith(b"Message ")}

    assert records(ours) == records(flowers) and len(records(ours)) >= 2 and len(ours) == len(flowers)
    assert ours_hashed < rows * 8 * 1.01 < 1.9 * rows * 8 < flowers_hashed


def test_the_superexec_says_when_its_fork_server_is_ready(capfd):
    app_processes.wait_until_preloaded(multiprocessing.get_context("spawn"))
    assert capfd.readouterr().err.endswith(app_processes.PRELOADED + "\n")


@pytest.mark.deployment
def test_a_superexec_keeps_the_forkers_of_its_latest_bundles_only(tmp_path, monkeypatch):
    monkeypatch.setenv("FLWR_HOME", str(tmp_path))
    monkeypatch.setattr(app_processes, "KEPT_FORKERS", 2)
    hashes = [hashlib.sha256(b"version %d" % v).hexdigest() for v in range(3)]
    for fab_hash in hashes:
        install_toy_app(tmp_path, fab_hash)
    forkers = app_processes.AppForkers(multiprocessing.get_context("spawn"))
    started = []
    for fab_hash in hashes:
        assert forkers.submit(fab_hash, ["flwr-clientapp", "--help"], True)
        started.append(forkers._forkers[fab_hash].process)
    assert list(forkers._forkers) == hashes[1:]
    assert started[0].exitcode == 0 and started[1].is_alive() and started[2].is_alive()


class Replaced(Exception):
    """What the test's ``os.execv`` raises: the process would have become plain Flower here."""


def plain_flower_runs(monkeypatch, version: str):
    monkeypatch.setattr(flower_shim.importlib.metadata, "version", lambda name: version)
    calls = []

    def execv(path, args):
        calls.append((path, args))
        raise Replaced

    monkeypatch.setattr(flower_shim.os, "execv", execv)
    return calls


def test_another_flower_release_runs_plain_flower_saying_so_in_one_line(monkeypatch, capsys):
    """A member's node must keep running when its Flower is not the one patched here."""
    calls = plain_flower_runs(monkeypatch, "1.43.0")
    with pytest.raises(Replaced):
        flower_shim.main(["supernode", "--insecure", "--superlink", "127.0.0.1:9092"])
    path, args = calls[0]
    assert path.endswith("/flower-supernode") and args == ["flower-supernode", "--insecure", "--superlink",
                                                           "127.0.0.1:9092"]
    assert capsys.readouterr().err == ("deploy.flower_shim: Flower 1.43.0 is installed, these changes are made for "
                                       "1.42.x; running plain flower-supernode\n")


def test_a_patched_name_missing_from_flower_runs_plain_flower_naming_it(monkeypatch, capsys):
    calls = plain_flower_runs(monkeypatch, "1.42.9")

    def renamed(module):
        raise AttributeError("module 'flwr.supernode.start_client_internal' has no attribute '_push_messages'")

    monkeypatch.setattr(flower_shim, "patch_supernode", renamed)
    with pytest.raises(Replaced):
        flower_shim.main(["supernode"])
    assert calls[0][1] == ["flower-supernode"]
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "lacks what is patched here (AttributeError: " in err and "_push_messages" in err


def test_a_clientapp_reports_its_task_end_once_flower_kills_it_after_5_s():
    """What :func:`flower_resilience.report_task_end` changes is the pinned Flower's: the end is
    reported once, by ``push_task_output`` in the exit handler, under a 5 s force-exit timer, and a
    task whose token expires fails every open message of its run with "ClientApp stopped responding"."""
    exit_module = importlib.import_module("flwr.supercore.exit.exit")
    nodestate = importlib.import_module("flwr.supernode.nodestate.in_memory_nodestate")
    run = inspect.getsource(CLIENTAPP.run_clientapp)
    assert "retry_invoker.max_tries = 1" in run and "push_task_output(\n            client=client," in run
    assert list(inspect.signature(CLIENTAPP.push_task_output).parameters) == ["client", "context", "sub_status",
                                                                              "details"]
    assert CLIENTAPP.PushTaskOutputRequest and CLIENTAPP.context_to_proto
    assert exit_module.FORCE_EXIT_TIMEOUT_SECONDS == 5
    assert "time.sleep(FORCE_EXIT_TIMEOUT_SECONDS)" in inspect.getsource(exit_module.flwr_exit)
    expired = inspect.getsource(nodestate.InMemoryNodeState._on_task_tokens_expired)
    assert "self._store_error_replies(client_run_ids, CLIENT_APP_CRASHED_ERROR)" in expired


class SlowSuperNode:
    """A Runtime API client whose PushTaskOutput fails ``failures`` times, then is stored."""

    def __init__(self, failures: int, error: Exception):
        self.failures, self.error, self.stored = failures, error, []

    def PushTaskOutput(self, request):  # noqa: N802 - Flower's name
        if self.failures:
            self.failures -= 1
            raise self.error
        self.stored.append(request)


def _task_end_module(monkeypatch):
    from flwr.supercore.exit import exit as flower_exit

    module = types.SimpleNamespace(PushTaskOutputRequest=CLIENTAPP.PushTaskOutputRequest,
                                   context_to_proto=CLIENTAPP.context_to_proto, push_task_output=None)
    exit_module = types.SimpleNamespace(FORCE_EXIT_TIMEOUT_SECONDS=flower_exit.FORCE_EXIT_TIMEOUT_SECONDS)
    monkeypatch.setattr(flower_resilience.time, "sleep", lambda s: None)
    flower_resilience.report_task_end(module, exit_module)
    return module, exit_module


def test_a_task_end_the_supernode_is_slow_to_take_is_reported_again_within_the_heartbeat_patience(
        monkeypatch, capsys):
    import httpx

    module, exit_module = _task_end_module(monkeypatch)
    from flwr.common.constant import HEARTBEAT_DEFAULT_INTERVAL, HEARTBEAT_PATIENCE

    assert exit_module.FORCE_EXIT_TIMEOUT_SECONDS == HEARTBEAT_PATIENCE * HEARTBEAT_DEFAULT_INTERVAL
    supernode = SlowSuperNode(2, httpx.ReadTimeout("timed out"))
    module.push_task_output(supernode, None, "completed", "")
    assert [r.sub_status for r in supernode.stored] == ["completed"]
    lines = capsys.readouterr().err.splitlines()
    assert lines == [f"deploy.flower_shim: push-task-output failed (ReadTimeout: timed out); attempt {n} of "
                     f"{flower_resilience.TASK_END_ATTEMPTS}" for n in (2, 3)]


def test_a_task_end_never_taken_is_named_in_one_line_and_anything_but_a_transport_error_raises(
        monkeypatch, capsys):
    import httpx

    module, _ = _task_end_module(monkeypatch)
    never = SlowSuperNode(flower_resilience.TASK_END_ATTEMPTS, httpx.ConnectError("refused"))
    module.push_task_output(never, None, "completed", "")
    assert never.stored == [] and capsys.readouterr().err.splitlines()[-1] == (
        "deploy.flower_shim: the task's end was not reported (ConnectError: refused); its SuperNode counts it crashed")
    with pytest.raises(ValueError, match="bad request"):
        module.push_task_output(SlowSuperNode(1, ValueError("bad request")), None, "completed", "")


def _status_error(code: int):
    import httpx

    request = httpx.Request("POST", "https://link/v1/fleet/activate-node")
    return httpx.HTTPStatusError(f"{code}", request=request, response=httpx.Response(code, request=request))


def test_an_activation_answered_5xx_is_tried_again_and_any_other_status_ends_it_at_once(monkeypatch, capsys):
    answers = []

    class Client:
        def ActivateNode(self, request):  # noqa: N802 - Flower's name
            answer = answers.pop(0)
            if isinstance(answer, Exception):
                raise answer
            return answer

    module = types.SimpleNamespace(HeartbeatSender=lambda fn: fn, FleetHttpClient=Client)
    monkeypatch.setattr(flower_resilience.time, "sleep", lambda s: None)
    flower_resilience.survive_error_statuses(module)
    answers[:] = [_status_error(500), _status_error(503), "activated"]
    assert Client().ActivateNode("request") == "activated"
    assert capsys.readouterr().err.splitlines() == [
        f"deploy.flower_shim: activate-node answered {code}; attempt {n} of {flower_resilience.ACTIVATE_ATTEMPTS}"
        for code, n in ((500, 2), (503, 3))]
    answers[:] = [_status_error(412), "activated"]
    with pytest.raises(Exception, match="412"):
        Client().ActivateNode("request")
    assert answers == ["activated"] and capsys.readouterr().err == ""
