"""Flower's own SuperNode and SuperExec with shorter waits on one machine.

``python -m deploy.flower_shim supernode ARGS`` runs ``flower-supernode ARGS``
(Flower's entry point, unchanged arguments) after these changes to the module
``flwr.supernode.start_client_internal`` of the pinned Flower (1.42):

* its main loop sleeps 3 s after every pull that found no message; here such
  a sleep lasts :data:`IDLE_FRACTION` of the time since the last message, at
  least :data:`FIRST_IDLE_POLL_S` and at most Flower's 3 s (a message that
  comes t seconds after the last one waits about t / 8 longer; an idle
  SuperNode polls every 3 s);
* while a ClientApp runs it checks for the reply (and then for each of the
  reply's objects) every 0.5 s; here every :data:`REPLY_POLL_S`;
* a ClientApp process asks for a part of its message that its SuperNode does
  not hold yet again after 1 s (doubling up to 10 s); here after
  :data:`OBJECT_POLL_S` (doubling up to :data:`OBJECT_POLL_CAP_S`).

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
whose subprocess executor starts each
``flwr-clientapp`` (still one process per message) as a fork of a process that
has already imported Flower's ClientApp runtime and the third-party packages
in :data:`PRELOAD` (``multiprocessing``'s forkserver). Once an app bundle is
installed (by the first ClientApp process of its run, Flower's
``install_from_fab``, which checks every file's hash), the ClientApp
processes of later messages with the same bundle fork from an
:class:`AppForker`: a process that loaded that installed bundle's ClientApp
once, the way Flower's loader does, and whose forks take the installed
directory for a bundle whose bytes hash to it instead of unpacking and
re-checking the same bytes (``install_from_fab`` gives the same directory for
an installed bundle). A message whose bundle is not installed, or whose
forker cannot load it, starts as before. With ``FEDGRAPH_TIMING=1`` each message also leaves two ``fedgraph-timing``
lines in the SuperNode's log (wall-clock seconds when it was pulled and its
reply pushed), which ``benchmarks/deployment.py`` reads.

``deploy.federation`` starts SuperNodes this way unless the environment sets
``FEDGRAPH_FLOWER_SHIM=0`` (then: plain ``flower-supernode``). No Flower code is
copied; ``tests/test_flower_shim.py`` checks that the names and waits patched
here are those of the installed Flower.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.metadata
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

from app.quiet import plain_console
from deploy.app_versions import enforce as enforce_app_versions
from deploy.flower_resilience import (Namespace, answer_what_is_not_received, push_until_stored, report_task_end,
                                      survive_error_statuses)

#: the environment variable that switches the shim off ("0")
SETTING = "FEDGRAPH_FLOWER_SHIM"
#: the waits Flower hard-codes in flwr.supernode.start_client_internal
FLOWER_IDLE_POLL_S = 3
FLOWER_REPLY_POLL_S = 0.5
FIRST_IDLE_POLL_S = 0.05
IDLE_FRACTION = 1 / 4
REPLY_POLL_S = 0.01
#: a ClientApp process starts while its SuperNode still pulls the message from the SuperLink,
#: and Flower's runtime waits 1 s (then 2, 4, ... up to 10 s) before asking for a part of the
#: message again; here it asks again after 10 ms, doubling up to 0.1 s
FLOWER_OBJECT_POLL_S = 1
OBJECT_POLL_S = 0.01
OBJECT_POLL_CAP_S = 0.1
#: a SuperNode started through the shim tells its SuperExec that a message's task exists by writing
#: a byte into a pipe (its read end's descriptor in this environment variable); the SuperExec asks
#: for tasks at once then, else every TASK_POLL_S (Flower's default interval) in case a byte is lost
TASK_PIPE_SETTING = "FEDGRAPH_TASK_PIPE"
TASK_POLL_SETTING = "FLWR_SUPEREXEC_TASK_POLL_INTERVAL"
TASK_POLL_S = 1.0
#: imported once by the fork server, before any ClientApp process forks from it (the GNN methods'
#: torch, PyG and Opacus cost about 5 s of CPU to import: once per SuperNode, not once per message)
PRELOAD = ("flwr.supernode.cli.flwr_clientapp", "flwr.supernode.runtime.run_clientapp", "numpy",
           "scipy.sparse", "scipy.sparse.linalg", "scipy.linalg", "cryptography.hazmat.primitives.asymmetric.x25519",
           "cryptography.hazmat.primitives.ciphers.aead", "sklearn.cluster", "torch", "torch_geometric.nn", "opacus",
           "httpcore")
#: imported once by the SuperLink's fork server, before any ServerApp process forks from it (Flower's
#: ServerApp runtime and the third-party packages the strategies use; not the app, which each
#: ServerApp loads from the run's own bundle)
PRELOAD_SERVERAPP = ("flwr.superlink.cli.flwr_serverapp", "flwr.superlink.grid.http_grid", "numpy", "scipy.sparse",
                     "scipy.sparse.linalg", "scipy.linalg", "scipy.optimize", "sklearn.cluster",
                     "cryptography.hazmat.primitives.asymmetric.x25519", "torch", "torch_geometric.nn", "ot", "httpcore")
#: with this environment variable set to 1, the SuperNode and the ClientApp log when each
#: message passed each stage (lines starting with TIMING)
TIMING_SETTING = "FEDGRAPH_TIMING"
TIMING = "fedgraph-timing"


def enabled(environ=os.environ) -> bool:
    return environ.get(SETTING, "1") != "0"


class PollClock:
    """Stands in for the ``time`` module inside Flower's SuperNode loop: Flower's idle wait
    (3 s) is :func:`idle_poll_s` of the time since the last message; its reply wait (0.5 s)
    is :data:`REPLY_POLL_S`; everything else is the ``time`` module's."""

    def __init__(self, sleep=time.sleep, clock=time.monotonic) -> None:
        self._sleep, self._clock = sleep, clock
        self.last_message = clock()  # a SuperNode that just started polls soon

    def active(self) -> None:
        """A message came or a reply left: poll soon again."""
        self.last_message = self._clock()

    def sleep(self, seconds: float) -> None:
        if seconds == FLOWER_IDLE_POLL_S:
            self._sleep(idle_poll_s(self._clock() - self.last_message))
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
    clock = PollClock()
    fleet = {}  # the connection's pull-object, which Flower's loop hands to the pull only
    pull = answer_what_is_not_received(module)
    push = push_until_stored(module._push_messages, lambda run_id, object_id: fleet["pull_object"](run_id, object_id))

    def pull_and_store_message(*args, **kwargs):
        fleet["pull_object"] = kwargs["pull_object"]
        run_id = pull(*args, **kwargs)
        if run_id is not None:
            clock.active()
            _timing("pulled")
        return run_id

    def push_messages(*args, **kwargs):
        push(*args, **kwargs)
        clock.active()
        _timing("pushed")

    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    pull_objects = short_object_polls(module.pull_objects)

    def pull_objects_once_the_superexec_knows(*args, **kwargs):
        # Flower calls this right after creating the message's task: the ClientApp starts while it runs
        try:
            os.write(write_end, b"t")
        except BlockingIOError:  # the pipe is full of wake-ups the SuperExec has not read yet
            pass
        return pull_objects(*args, **kwargs)

    module.time = clock
    module.pull_objects = pull_objects_once_the_superexec_knows
    module._pull_and_store_message = pull_and_store_message
    module._push_messages = push_messages
    _through_shim(module, "flower-superexec", "superexec", pass_fds=(read_end,),
                  env={**os.environ, TASK_PIPE_SETTING: str(read_end), TASK_POLL_SETTING: str(TASK_POLL_S)})
    return clock


def _quiet(popen_kwargs) -> bool:
    """Whether Flower started the process with its output thrown away."""
    return popen_kwargs.get("stdout") == subprocess.DEVNULL


def _forked(context, run, argv: list[str], popen_kwargs):
    """``run(argv, quiet)`` in a process forked by ``context``'s fork server, started the way
    Flower asked in ``popen_kwargs`` (quiet or not). Flower keeps no handle on it."""
    import multiprocessing

    multiprocessing.active_children()  # reaps the finished ones
    process = context.Process(target=run, args=(argv, _quiet(popen_kwargs)), daemon=False)
    process.start()
    return process


def _silence_if(quiet: bool) -> None:
    """A forked process's stdout and stderr to /dev/null when Flower started it ``quiet``; Flower's
    lines plain (its fork server, a fresh interpreter, set them up coloured)."""
    plain_console()
    if quiet:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)


def _run_clientapp(argv: list[str], quiet: bool) -> None:
    """A forked ClientApp process: Flower's ``flwr-clientapp`` with ``argv``."""
    _silence_if(quiet)
    from flwr.supernode.cli.flwr_clientapp import flwr_clientapp
    from flwr.supernode.runtime import run_clientapp

    patch_clientapp(run_clientapp)
    sys.argv = argv
    flwr_clientapp()


def _run_serverapp(argv: list[str], quiet: bool) -> None:
    """A forked ServerApp process: this shim's ``serverapp`` role with ``argv`` (Flower's
    ``flwr-serverapp`` arguments)."""
    _silence_if(quiet)
    main(["serverapp", *argv])


def fork_serverapps(module: ModuleType, context=None):
    """Make ``module`` (``flwr.supercore.superexec.executor.subprocess_executor`` of the
    SuperLink's SuperExec) start each ``flwr-serverapp`` as a fork of a process that imported
    :data:`PRELOAD_SERVERAPP` (``multiprocessing``'s forkserver), running :func:`patch_serverapp`'s
    ServerApp; returns the multiprocessing context."""
    import multiprocessing

    ctx = context or multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(list(PRELOAD_SERVERAPP))
    popen = module.subprocess.Popen

    def start(args, *rest, **kwargs):
        if not args or args[0] != "flwr-serverapp":
            return popen(args, *rest, **kwargs)
        return _forked(ctx, _run_serverapp, list(args[1:]), kwargs)

    module.subprocess = Namespace(subprocess, Popen=start)
    return ctx


def short_object_polls(pull):
    """Flower's ``pull`` (``pull_objects`` or ``pull_and_inflate_object_from_tree``) asking
    again for a message part not there yet after :data:`OBJECT_POLL_S` seconds, doubling up
    to :data:`OBJECT_POLL_CAP_S`, instead of after Flower's 1 s; for as long as Flower waits
    (``PULL_MAX_TIME``), not for Flower's count of tries, which at these shorter waits would
    end after about 50 s (a large reply still being pushed)."""
    return functools.partial(pull, initial_backoff=OBJECT_POLL_S, backoff_cap=OBJECT_POLL_CAP_S,
                             max_tries_per_object=None)


def patch_clientapp(module: ModuleType) -> None:
    """Make ``module`` (``flwr.supernode.runtime.run_clientapp``) poll for its message's parts
    with :func:`short_object_polls` and report its task's end with :func:`report_task_end`."""
    module.pull_and_inflate_object_from_tree = short_object_polls(module.pull_and_inflate_object_from_tree)
    report_task_end(module, importlib.import_module("flwr.supercore.exit.exit"))


def installed_app_dir(fab_hash: str | None) -> Path | None:
    """The directory Flower installed the app bundle ``fab_hash`` into, if it did
    (``$FLWR_HOME/apps/<publisher>.<name>.<version>.<hash prefix>``, one match)."""
    if not fab_hash:
        return None
    from flwr.common.config import get_flwr_home
    from flwr.common.constant import FAB_CONFIG_FILE, FAB_HASH_TRUNCATION

    found = [path for path in (get_flwr_home() / "apps").glob(f"*.{fab_hash[:FAB_HASH_TRUNCATION]}")
             if (path / FAB_CONFIG_FILE).is_file()]
    return found[0] if len(found) == 1 else None


def install_known_fab(fab_hash: str, app_dir: Path, install):
    """Flower's ``install_from_fab`` (``install``), except that the bundle whose bytes hash to
    ``fab_hash`` gives ``app_dir``, where it is installed, without being unpacked again."""

    def install_from_fab(fab_file, *args, **kwargs):
        if isinstance(fab_file, bytes) and hashlib.sha256(fab_file).hexdigest() == fab_hash:
            return app_dir
        return install(fab_file, *args, **kwargs)

    return install_from_fab


READY = "ready"
#: app bundles whose forker a SuperExec keeps
KEPT_FORKERS = 2


def _serve_app(fab_hash: str, app_dir: str, conn) -> None:
    """An :class:`AppForker`'s process: load the installed bundle's ClientApp as Flower's
    loader does, say :data:`READY` (or why not), then fork one ClientApp per ``(argv, quiet)``
    received, until the SuperExec closes the pipe."""
    try:
        from flwr.clientapp.client_app import LoadClientAppError
        from flwr.common.config import get_project_config
        from flwr.supercore.object_ref import load_app
        from flwr.supernode.runtime import run_clientapp

        reference = get_project_config(app_dir)["tool"]["flwr"]["app"]["components"]["clientapp"]
        load_app(reference, LoadClientAppError, app_dir)
        run_clientapp.install_from_fab = install_known_fab(fab_hash, Path(app_dir), run_clientapp.install_from_fab)
    except Exception as error:  # noqa: BLE001 - the SuperExec falls back to a cold start and logs why
        conn.send(f"{type(error).__name__}: {error}")
        return
    conn.send(READY)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the finished ClientApps
    while True:
        try:
            argv, quiet = conn.recv()
        except EOFError:
            return
        if os.fork() == 0:
            conn.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            _exit_after(_run_clientapp, argv, quiet)


def _exit_after(run, *args) -> None:
    """Run a forked ClientApp and end its process with its exit code, never returning into
    the forker's loop."""
    code = 1
    try:
        run(*args)
        code = 0
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


class AppForker:
    """A process that loaded one installed app bundle's ClientApp and forks a ClientApp
    process per message from it (:func:`_serve_app`)."""

    def __init__(self, context, fab_hash: str, app_dir: Path) -> None:
        self._conn, child = context.Pipe()
        self.process = context.Process(target=_serve_app, args=(fab_hash, str(app_dir), child), daemon=True)
        self.process.start()
        child.close()
        try:
            answer = self._conn.recv()
        except EOFError:
            answer = "its process ended before it loaded the app"
        self.problem = None if answer == READY else answer

    def close(self) -> None:
        """End the forker (its ClientApps run on); it ends itself when its pipe closes."""
        self._conn.close()
        self.process.join()

    def submit(self, argv: list[str], quiet: bool) -> bool:
        """Start a ClientApp for ``argv``; False if this forker is gone."""
        if self.problem is not None or not self.process.is_alive():
            return False
        try:
            self._conn.send((argv, quiet))
        except OSError:
            return False
        return True


class AppForkers:
    """One :class:`AppForker` per installed app bundle (by hash), the :data:`KEPT_FORKERS` most
    recently started: a long-lived SuperNode sees a new bundle with every app version."""

    def __init__(self, context) -> None:
        self._context, self._forkers = context, {}

    def _start(self, fab_hash: str, app_dir: Path) -> AppForker:
        """A forker for ``fab_hash``, the oldest beyond :data:`KEPT_FORKERS` closed."""
        self._forkers.pop(fab_hash, None)
        while len(self._forkers) >= KEPT_FORKERS:
            self._forkers.pop(next(iter(self._forkers))).close()
        forker = self._forkers[fab_hash] = AppForker(self._context, fab_hash, app_dir)
        return forker

    def submit(self, fab_hash: str | None, argv: list[str], quiet: bool) -> bool:
        """Start a ClientApp for ``argv`` from the forker of ``fab_hash``; False if the
        bundle is not installed yet or cannot be loaded (the caller starts it cold)."""
        forker = self._forkers.get(fab_hash)
        if forker is None or (forker.problem is None and not forker.process.is_alive()):
            app_dir = installed_app_dir(fab_hash)
            if app_dir is None:
                return False
            forker = self._start(fab_hash, app_dir)
            if forker.problem is not None:
                print(f"deploy.flower_shim: app bundle {fab_hash[:8]} starts every ClientApp cold: {forker.problem}",
                      file=sys.stderr, flush=True)
        return forker.submit(argv, quiet)


def patch_executor(module: ModuleType, context=None):
    """Make ``module`` (``flwr.supercore.superexec.executor.subprocess_executor``) start
    ``flwr-clientapp`` as a fork of a preloaded process, the app bundle's
    :class:`AppForker` once the bundle is installed; returns the multiprocessing context."""
    import multiprocessing

    ctx = context or multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(list(PRELOAD))
    popen, launch, forkers = module.subprocess.Popen, module.SubprocessExecutor.launch, AppForkers(ctx)
    launching = {}

    def launch_task(self, spec):
        launching["fab_hash"] = spec.fab_hash
        try:
            return launch(self, spec)
        finally:
            launching.clear()

    def start(args, *rest, **kwargs):
        if not args or args[0] != "flwr-clientapp":
            return popen(args, *rest, **kwargs)
        if forkers.submit(launching.get("fab_hash"), list(args), _quiet(kwargs)):
            return None  # Flower keeps no handle on a ClientApp process
        return _forked(ctx, _run_clientapp, list(args), kwargs)

    module.subprocess = Namespace(subprocess, Popen=start)
    module.SubprocessExecutor.launch = launch_task
    return ctx


#: the line a SuperExec started through this shim prints once its fork server holds :data:`PRELOAD`
#: (a SuperNode's) or :data:`PRELOAD_SERVERAPP` (the SuperLink's)
PRELOADED = "deploy.flower_shim: app runtime preloaded"


def _nothing() -> None:
    """A process that only shows the fork server is up."""


def wait_until_preloaded(context) -> None:
    """Start the fork server of ``context`` and wait until it has imported its preloaded modules
    (a first fork returns only then), so the first message or run does not wait for them; print
    :data:`PRELOADED`."""
    process = context.Process(target=_nothing)
    process.start()
    process.join()
    print(PRELOADED, file=sys.stderr, flush=True)


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
    end its wait between task polls as soon as its SuperNode writes into the pipe named by
    :data:`TASK_PIPE_SETTING`; without that setting, or once the SuperNode closed the pipe,
    it waits as Flower does."""
    if TASK_PIPE_SETTING not in environ:
        return
    read_end = int(environ[TASK_PIPE_SETTING])
    os.set_inheritable(read_end, False)  # not the ClientApps' to read

    def sleep(seconds: float) -> None:
        if select.select([read_end], [], [], seconds)[0]:
            if not os.read(read_end, 4096):  # the SuperNode is gone: Flower's own wait from now on
                module.time = time

    module.time = Namespace(time, sleep=sleep)


def patch_superlink(module: ModuleType) -> None:
    """Make ``module`` (``flwr.superlink.cli.flower_superlink``) start its SuperExec through
    this shim (role ``superlink-superexec``), which forks each ServerApp (:func:`fork_serverapps`)."""
    _through_shim(module, "flower-superexec", "superlink-superexec")


def patch_serverapp(module: ModuleType) -> None:
    """Make ``module`` (``flwr.superlink.grid.http_grid``), the ServerApp's grid, poll for
    the parts of a reply with :func:`short_object_polls`."""
    module.pull_objects = short_object_polls(module.pull_objects)


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
    elif role == "superlink-superexec":
        wait_until_preloaded(fork_serverapps(module("flwr.supercore.superexec.executor.subprocess_executor")))
    elif role == "serverapp":
        patch_serverapp(module("flwr.superlink.grid.http_grid"))
    elif role == "supernode":
        patch_supernode(module("flwr.supernode.start_client_internal"))
        survive_error_statuses(module("flwr.supernode.fleet_http_connection"))
        enforce_app_versions(module("flwr.supernode.cli.flower_supernode"), module("flwr.supernode.start_client_internal"))
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
