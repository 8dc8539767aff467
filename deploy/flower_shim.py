"""Flower's own SuperNode and SuperExec with shorter waits on one machine.

``python -m deploy.flower_shim supernode ARGS`` runs ``flower-supernode ARGS``
(Flower's entry point, unchanged arguments) after these changes to the module
``flwr.supernode.start_client_internal`` of the pinned Flower (1.42):

* its main loop sleeps 3 s after every pull that found no message; here such
  a sleep lasts :data:`IDLE_FRACTION` of the time since the last message, at
  least :data:`FIRST_IDLE_POLL_S` and at most Flower's 3 s (a message that
  comes t seconds after the last one waits about t / 8 longer; an idle
  SuperNode polls every 3 s), less the time the pull itself took: a SuperLink
  started through this shim holds a pull that finds nothing until a message for
  the node is stored (:mod:`deploy.fleet_pulls`), so the message is answered
  when it is stored and the next pull follows at once;
* while a ClientApp runs it checks for the reply (and then for each of the
  reply's objects) every 0.5 s; here when its state stores a message or its
  object store an object, and at the latest after :data:`REPLY_POLL_S`;
* a ClientApp process asks for a part of its message that its SuperNode does
  not hold yet again after 1 s (doubling up to 10 s); here after
  :data:`deploy.app_processes.OBJECT_POLL_S` (doubling up to 0.1 s).

A message is not lost to a failure Flower's own retries give up on: see
:mod:`deploy.flower_resilience`. The SuperNode runs only the app versions its trust file
allows: see :mod:`deploy.app_versions`.

The idle and reply waits go through the module's ``time`` name, replaced by a :class:`PollClock`
that maps Flower's two waits onto these and passes any other sleep through.
The SuperExec it starts becomes ``python -m deploy.flower_shim superexec``:
Flower's ``flower-superexec``, which asks its SuperNode for tasks as soon as
the SuperNode has made one (the SuperNode writes a byte into a pipe the
SuperExec waits on; Flower polls every 1 s, and each poll is an HTTP request
that costs both processes CPU) and otherwise every :data:`TASK_POLL_S`, and
which starts each ``flwr-clientapp`` as a fork of a process that imported it
once (:mod:`deploy.app_processes`). With ``FEDGRAPH_TIMING=1`` each message
also leaves two ``fedgraph-timing`` lines in the SuperNode's log (wall-clock
seconds when it was pulled and its reply pushed), which
``benchmarks/deployment.py`` reads.

``python -m deploy.flower_shim superlink ARGS`` runs ``flower-superlink ARGS``
whose SuperExec (``superlink-superexec``) asks for a run's ServerApp task as
soon as the SuperLink has created the run (:func:`patch_superlink`) and forks
each ServerApp from a process that imported its runtime once; its Fleet API holds
an empty pull until a message for the node is stored (:mod:`deploy.fleet_pulls`).

``deploy.federation`` starts SuperNodes and the SuperLink this way unless the
environment sets ``FEDGRAPH_FLOWER_SHIM=0`` (then: plain ``flower-supernode``,
``flower-superlink``). No Flower code is
copied; ``tests/test_flower_shim.py`` checks that the names and waits patched
here are those of the installed Flower.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import os
import select
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import ModuleType

from fedgraphcore.quiet import plain_console
from deploy.app_processes import (REPLY_SIGNALS_SETTING, fork_serverapps, patch_executor, patch_serverapp,
                                   short_object_polls, signal_reply, wait_until_preloaded)
from deploy import gates
from deploy.app_versions import enforce as enforce_app_versions
from deploy.fleet_pulls import hold_empty_pulls
from deploy.plain_asgi import patch_superlink_app, patch_supernode_app
from deploy.flower_resilience import Namespace, answer_what_is_not_received, push_until_stored, survive_error_statuses

#: the environment variable that switches the shim off ("0")
SETTING = "FEDGRAPH_FLOWER_SHIM"
#: the waits Flower hard-codes in flwr.supernode.start_client_internal
FLOWER_IDLE_POLL_S = 3
FLOWER_REPLY_POLL_S = 0.5
FIRST_IDLE_POLL_S = 0.05
IDLE_FRACTION = 1 / 4
REPLY_POLL_S = 0.1
#: a SuperNode started through the shim tells its SuperExec that a message's task exists by writing
#: a byte into a pipe (its read end's descriptor in this environment variable); the SuperExec asks
#: for tasks at once then, once per byte, and otherwise every TASK_POLL_S (Flower asks every
#: FLOWER_TASK_POLL_S; each ask is an HTTP request that costs the SuperExec and its SuperNode CPU)
TASK_PIPE_SETTING = "FEDGRAPH_TASK_PIPE"
TASK_POLL_SETTING = "FLWR_SUPEREXEC_TASK_POLL_INTERVAL"
FLOWER_TASK_POLL_S = 1.0
TASK_POLL_S = 10.0
#: wake-ups a SuperExec answers with an ask each when it reads them together
WAKES_AT_ONCE = 16
#: seconds the SuperLink keeps an idle HTTP connection open (uvicorn's ``timeout_keep_alive``): longer
#: than its clients keep one (the gateway :data:`deploy.gateway.UPSTREAM_KEEPALIVE_S`, httpx 5 s), so
#: that a client never sends on a connection the SuperLink is closing
SUPERLINK_KEEPALIVE_S = 75
#: with this environment variable set to 1, the SuperNode and the ClientApp log when each
#: message passed each stage (lines starting with TIMING)
TIMING_SETTING = "FEDGRAPH_TIMING"
TIMING = "fedgraph-timing"


def enabled(environ=os.environ) -> bool:
    return environ.get(SETTING, "1") != "0"


class PollClock:
    """Stands in for the ``time`` module inside Flower's SuperNode loop: Flower's idle wait
    (3 s) is :func:`idle_poll_s` of the time since the last message; its reply wait (0.5 s)
    lasts until ``stored`` is set (something was stored), at most :data:`REPLY_POLL_S`;
    everything else is the ``time`` module's."""

    def __init__(self, sleep=time.sleep, clock=time.monotonic, stored: threading.Event | None = None) -> None:
        self._sleep, self._clock, self.stored = sleep, clock, stored
        self.last_message = clock()  # a SuperNode that just started polls soon
        self.pulled_for = 0.0

    def active(self) -> None:
        """A message came or a reply left: poll soon again."""
        self.last_message = self._clock()

    def pulled(self, seconds: float) -> None:
        """The last pull took ``seconds`` (a SuperLink holds an empty one, :mod:`deploy.fleet_pulls`):
        the next idle wait is that much shorter."""
        self.pulled_for = seconds

    def sleep(self, seconds: float) -> None:
        if seconds == FLOWER_IDLE_POLL_S:
            self._sleep(max(idle_poll_s(self._clock() - self.last_message) - self.pulled_for, 0.0))
        elif seconds == FLOWER_REPLY_POLL_S and self.stored is not None:
            if self.stored.wait(REPLY_POLL_S):  # cleared once woken: the caller looks again after this
                self.stored.clear()
        elif seconds == FLOWER_REPLY_POLL_S:
            self._sleep(REPLY_POLL_S)
        else:
            self._sleep(seconds)

    def __getattr__(self, name: str):
        return getattr(time, name)


def idle_poll_s(idle_for: float) -> float:
    """The wait before the next pull, ``idle_for`` seconds after the last message."""
    return min(max(IDLE_FRACTION * idle_for, FIRST_IDLE_POLL_S), float(FLOWER_IDLE_POLL_S))


def _timing(event: str) -> None:
    if os.environ.get(TIMING_SETTING) == "1":
        print(f"{TIMING} {event} {time.time():.6f}", file=sys.stderr, flush=True)


def patch_supernode(module: ModuleType) -> PollClock:
    """Apply the SuperNode changes (module docstring) to ``module``
    (``flwr.supernode.start_client_internal``); returns its clock."""
    clock = PollClock(stored=threading.Event())
    fleet = {}  # the connection's pull-object, which Flower's loop hands to the pull only
    pull = answer_what_is_not_received(module)
    push = push_until_stored(module._push_messages, lambda run_id, object_id: fleet["pull_object"](run_id, object_id))

    def pull_and_store_message(*args, **kwargs):
        fleet["pull_object"] = kwargs["pull_object"]
        start = time.monotonic()
        run_id = pull(*args, **kwargs)
        clock.pulled(time.monotonic() - start)
        if run_id is not None:
            clock.active()
            _timing("pulled")
        return run_id

    def push_messages(*args, **kwargs):
        push(*args, **kwargs)
        clock.active()
        _timing("pushed")

    tasks = TaskPipe()
    pull_objects = short_object_polls(module.pull_objects)

    def pull_objects_once_the_superexec_knows(*args, **kwargs):
        # Flower calls this right after creating the message's task: the ClientApp starts while it runs
        tasks.wake()
        return pull_objects(*args, **kwargs)

    module.time = clock
    module.pull_objects = pull_objects_once_the_superexec_knows
    module._pull_and_store_message = pull_and_store_message
    module._push_messages = push_messages
    tasks.start_superexec(module, "superexec")
    return clock


class TaskPipe:
    """The pipe by which a SuperNode or the SuperLink tells the SuperExec it starts that a task
    exists (:func:`wake_on_tasks`)."""

    def __init__(self) -> None:
        self.read_end, self.write_end = os.pipe()
        os.set_blocking(self.write_end, False)

    def wake(self) -> None:
        try:
            os.write(self.write_end, b"t")
        except BlockingIOError:  # the pipe is full of wake-ups the SuperExec has not read yet
            pass

    def start_superexec(self, module: ModuleType, role: str, **environ: str) -> None:
        """Make ``module`` start its SuperExec through this shim as ``role``, reading this pipe,
        asking for tasks every :data:`TASK_POLL_S` besides, ``environ`` added to its environment."""
        _through_shim(module, "flower-superexec", role, pass_fds=(self.read_end,),
                      env={**os.environ, TASK_PIPE_SETTING: str(self.read_end), TASK_POLL_SETTING: str(TASK_POLL_S),
                           **environ})


def join_after_gate(module: ModuleType, environ=os.environ) -> None:
    """Make ``module`` (``flwr.supernode.start_client_internal``) open its connection to the Fleet
    API (``_init_connection``, after Flower has started the runtime API and the SuperExec) only once
    the SuperNode's gate (:mod:`deploy.gates`) is opened; without a gate, at once, as Flower does.
    Only the SuperNode holds the gate (not its SuperExec or ClientApps)."""
    init_connection = module._init_connection
    gate = gates.taken(environ)
    if gate is None:
        return

    def init_connection_once_open(*args, **kwargs):
        nonlocal gate
        gates.pass_through(gate)
        gate = None
        return init_connection(*args, **kwargs)

    module._init_connection = init_connection_once_open


def command(role: str) -> list[str]:
    """The command that runs Flower's ``role`` (:data:`ROLES`) through this shim."""
    return [sys.executable, "-m", "deploy.flower_shim", role]


def _through_shim(module: ModuleType, flower_command: str, role: str, **popen_kwargs) -> None:
    """Make ``module`` start ``flower_command`` as :func:`command` ``(role)`` (same arguments,
    and ``popen_kwargs`` added) through its ``subprocess.Popen``."""
    popen = module.subprocess.Popen

    def start(args, *rest, **kwargs):
        if args and args[0] == flower_command:
            args, kwargs = [*command(role), *args[1:]], {**kwargs, **popen_kwargs}
        return popen(args, *rest, **kwargs)

    module.subprocess = Namespace(subprocess, Popen=start)


def wake_on_tasks(module: ModuleType, environ=os.environ) -> None:
    """Make ``module`` (``flwr.supercore.superexec.run_superexec``), a SuperExec's main loop,
    end its wait between task polls as soon as its SuperNode (or SuperLink) writes into the pipe
    named by :data:`TASK_PIPE_SETTING`, and ask once per byte written (up to
    :data:`WAKES_AT_ONCE` read together); without that setting, or once the writer closed the
    pipe, it waits as Flower does."""
    if TASK_PIPE_SETTING not in environ:
        return
    read_end = int(environ[TASK_PIPE_SETTING])
    os.set_inheritable(read_end, False)  # not the ClientApps' to read

    owed = 0  # wake-ups read together beyond the first: one more ask each, at once

    def sleep(seconds: float) -> None:
        nonlocal owed
        if owed:
            owed -= 1
        elif select.select([read_end], [], [], seconds)[0]:
            woken = os.read(read_end, 4096)
            if not woken:  # the writer is gone: Flower's own wait from now on
                module.time = time
            owed = min(len(woken) - 1, WAKES_AT_ONCE) if woken else 0

    module.time = Namespace(time, sleep=sleep)


def patch_superlink(module: ModuleType, states: tuple[type, ...] | None = None) -> None:
    """Make ``module`` (``flwr.superlink.cli.flower_superlink``) start its SuperExec through
    this shim (role ``superlink-superexec``), which forks each ServerApp (:func:`fork_serverapps`)
    and asks for a run's ServerApp task as soon as the SuperLink's LinkState (each class of
    ``states``, default Flower's in-memory and SQL ones) has created the run (Flower's SuperExec
    asks every 1 s, and every 0.1 s in :mod:`deploy.federation`: each an HTTP request through the
    SuperLink's middlewares); tells a run's ServerApp each time the LinkState stores a reply of
    the run (:class:`deploy.app_processes.ReplySignal`; Flower's ServerApp polls for replies); and
    keeps an idle connection open :data:`SUPERLINK_KEEPALIVE_S` (uvicorn's 5 s: the gateway
    reconnected, with a TLS handshake on both sides, for most of a SuperNode's polls)."""
    states = link_states() if states is None else states
    tasks, signals = TaskPipe(), reply_signals_dir()
    module.uvicorn = Namespace(module.uvicorn, run=functools.partial(module.uvicorn.run,
                                                                     timeout_keep_alive=SUPERLINK_KEEPALIVE_S))
    for state in states:
        state.create_run = _then(state.create_run, tasks.wake)
        state.store_message_res = _signalling_replies(state.store_message_res, signals)
    tasks.start_superexec(module, "superlink-superexec", **{REPLY_SIGNALS_SETTING: str(signals)})


def set_when_stored(stored: threading.Event, stores: list[tuple[type, str]] | None = None) -> None:
    """Set ``stored`` each time a SuperNode stores what its ClientApp sends (``stores``: class and
    method; default :func:`node_stores`)."""
    for store, method in node_stores() if stores is None else stores:
        setattr(store, method, _then(getattr(store, method), stored.set))


def node_stores() -> list[tuple[type, str]]:
    """Where a SuperNode stores what its ClientApp sends: its state's messages, its objects."""
    from flwr.supercore.object_store.in_memory_object_store import InMemoryObjectStore
    from flwr.supercore.object_store.sql_object_store import SqlObjectStore
    from flwr.supernode.nodestate.in_memory_nodestate import InMemoryNodeState

    return [(InMemoryNodeState, "store_message"), (InMemoryObjectStore, "put"), (SqlObjectStore, "put")]


def link_states() -> tuple[type, ...]:
    """Flower's LinkState classes: in memory and SQL."""
    from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState
    from flwr.server.superlink.linkstate.sql_linkstate import SqlLinkState

    return InMemoryLinkState, SqlLinkState


def reply_signals_dir() -> Path:
    """This SuperLink's directory of its ServerApps' reply FIFOs (:class:`ReplySignal`), only
    its owner's: ``$FLWR_HOME/reply-signals/<pid>``."""
    from flwr.common.config import get_flwr_home

    directory = get_flwr_home() / "reply-signals" / str(os.getpid())
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    return directory


def _signalling_replies(store, directory: Path):
    """A LinkState's ``store_message_res`` (``store``) that signals each stored reply to its
    run's ServerApp (:func:`signal_reply`)."""
    @functools.wraps(store)
    def store_message_res(self, message):
        stored = store(self, message)
        if stored is not None:
            signal_reply(directory, message.metadata.run_id)
        return stored

    return store_message_res


def _then(method, after):
    """``method`` followed by ``after()``."""
    @functools.wraps(method)
    def call(*args, **kwargs):
        result = method(*args, **kwargs)
        after()
        return result

    return call


ROLES = ("supernode", "superexec", "superlink", "superlink-superexec", "serverapp")
#: the Flower release whose private names this module patches (``flwr`` version prefix)
PINNED_FLOWER = "1.42."
#: each role's Flower command (what runs, patched or plain)
COMMANDS = {"supernode": "flower-supernode", "superexec": "flower-superexec", "superlink": "flower-superlink",
            "superlink-superexec": "flower-superexec", "serverapp": "flwr-serverapp"}


def _patch(role: str) -> None:
    """Apply ``role``'s changes to the imported Flower modules."""
    module = importlib.import_module
    if role == "superlink":
        patch_superlink(module("flwr.superlink.cli.flower_superlink"))
        hold_empty_pulls(module("flwr.superlink.servicer.fleet.fleet_handlers"), link_states())
        patch_superlink_app(module("flwr.superlink.main"))
    elif role == "superlink-superexec":
        wait_until_preloaded(fork_serverapps(module("flwr.supercore.superexec.executor.subprocess_executor")))
        wake_on_tasks(module("flwr.supercore.superexec.run_superexec"))
    elif role == "serverapp":
        patch_serverapp(module("flwr.superlink.grid.http_grid"))
    elif role == "supernode":
        set_when_stored(patch_supernode(module("flwr.supernode.start_client_internal")).stored)
        survive_error_statuses(module("flwr.supernode.fleet_http_connection"))
        patch_supernode_app(module("flwr.supernode.main"))
        enforce_app_versions(module("flwr.supernode.cli.flower_supernode"), module("flwr.supernode.start_client_internal"))
        join_after_gate(module("flwr.supernode.start_client_internal"))
    else:
        wait_until_preloaded(patch_executor(module("flwr.supercore.superexec.executor.subprocess_executor")))
        wake_on_tasks(module("flwr.supercore.superexec.run_superexec"))


def _entry_point(role: str):
    """Flower's own entry point of ``role``'s command."""
    if role == "superlink":
        from flwr.superlink.cli.flower_superlink import flower_superlink as entry
    elif role == "serverapp":
        from flwr.superlink.cli.flwr_serverapp import flwr_serverapp as entry
    elif role == "supernode":
        from flwr.supernode.cli import flower_supernode as entry
    else:
        from flwr.supercore.cli import flower_superexec as entry
    return entry


def run_plain(role: str, argv: list[str], why: str) -> None:
    """Replace this process by Flower's own ``role`` command, unpatched, saying why in one line
    (a member's node keeps running whatever Flower it has)."""
    command = COMMANDS[role]
    print(f"deploy.flower_shim: {why}; running plain {command}", file=sys.stderr, flush=True)
    gates.pass_through(gates.taken())  # plain Flower joins at once: not before the starting process lets it
    os.execv(str(Path(sys.executable).parent / command), [command, *argv])


def main(argv: list[str]) -> int:
    """Run ``argv[0]``'s Flower command with this module's changes, or plain where the installed
    Flower is not :data:`PINNED_FLOWER` or lacks a name patched here."""
    if not argv or argv[0] not in ROLES:
        print(f"usage: python -m deploy.flower_shim {'|'.join(ROLES)} [Flower's arguments]", file=sys.stderr)
        return 2
    role, rest = argv[0], argv[1:]
    installed = importlib.metadata.version("flwr")
    if not installed.startswith(PINNED_FLOWER):
        run_plain(role, rest, f"Flower {installed} is installed, these changes are made for {PINNED_FLOWER}x")
    sys.argv = [COMMANDS[role], *rest]
    plain_console()  # a log file gets Flower's lines without colour codes or empty ones
    try:
        _patch(role)
    except (AttributeError, ImportError, TypeError) as err:  # a fresh process: no change half made
        run_plain(role, rest, f"Flower {installed} lacks what is patched here ({type(err).__name__}: {err})")
    _entry_point(role)()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
