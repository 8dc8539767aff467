"""Flower's app processes (ClientApps, ServerApps) started as forks of processes that imported them once.

A SuperExec started through :mod:`deploy.flower_shim` starts each ``flwr-clientapp`` (still
one process per message) as a fork of a process that has already imported Flower's ClientApp
runtime and the third-party packages in :data:`PRELOAD` (``multiprocessing``'s forkserver), and
the SuperLink's SuperExec each ``flwr-serverapp`` likewise (:data:`PRELOAD_SERVERAPP`). Once an app
bundle is installed (by the first ClientApp process of its run, Flower's ``install_from_fab``,
which checks every file's hash), the ClientApp processes of later messages with the same bundle
fork from an :class:`AppForker`: a process that loaded that installed bundle's ClientApp once,
the way Flower's loader does, and whose forks take the installed directory for a bundle whose
bytes hash to it instead of unpacking and re-checking the same bytes (``install_from_fab`` gives
the same directory for an installed bundle). A message whose bundle is not installed, or whose
forker cannot load it, starts as before.

The packages only some methods use and that take seconds to import (:data:`LEARNED`: the GNN
methods' torch, PyG and Opacus, POT) are not preloaded: a SuperNode or SuperLink that starts
imports what every method uses, nothing more. A ClientApp forked from an :class:`AppForker` tells
it, when it ends, which of them it imported (:func:`report_learned`), and the forker imports
those before it forks the next one: the first message of a GNN run on a SuperNode imports torch,
the later ones fork with it loaded. A ServerApp runs for a whole run and imports what its
strategy needs once.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import os
import select
import signal
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from fedgraphcore.quiet import plain_console
from deploy.flower_resilience import Namespace, report_task_end

#: imported once by a SuperNode's fork server, before any ClientApp process forks from it: Flower's
#: ClientApp runtime and what every method uses (not :data:`LEARNED`)
PRELOAD = ("flwr.supernode.cli.flwr_clientapp", "flwr.supernode.runtime.run_clientapp", "numpy",
           "scipy.sparse", "scipy.sparse.linalg", "scipy.linalg", "cryptography.hazmat.primitives.asymmetric.x25519",
           "cryptography.hazmat.primitives.ciphers.aead", "sklearn.cluster", "httpcore")
#: imported once by the SuperLink's fork server, before any ServerApp process forks from it (Flower's
#: ServerApp runtime and what every strategy uses; not the app, which each ServerApp loads from the
#: run's own bundle, nor :data:`LEARNED`, which a ServerApp imports once for its run)
PRELOAD_SERVERAPP = ("flwr.superlink.cli.flwr_serverapp", "flwr.superlink.grid.http_grid", "numpy", "scipy.sparse",
                     "scipy.sparse.linalg", "scipy.linalg", "scipy.optimize", "sklearn.cluster",
                     "cryptography.hazmat.primitives.asymmetric.x25519", "httpcore")
#: packages some methods use that cost seconds of CPU to import (torch, PyG and Opacus about 5 s
#: together): an :class:`AppForker` imports those of them its ClientApps imported
LEARNED = ("torch", "torch_geometric", "opacus", "ot")

#: a ClientApp process starts while its SuperNode still pulls the message from the SuperLink,
#: and Flower's runtime waits 1 s (then 2, 4, ... up to 10 s) before asking for a part of the
#: message again; here it asks again after 10 ms, doubling up to 0.1 s
FLOWER_OBJECT_POLL_S = 1
OBJECT_POLL_S = 0.01
OBJECT_POLL_CAP_S = 0.1


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
    with :func:`short_object_polls`, hash each object of its reply once (:func:`hash_reply_once`)
    and report its task's end with :func:`report_task_end`."""
    module.pull_and_inflate_object_from_tree = short_object_polls(module.pull_and_inflate_object_from_tree)
    hash_reply_once(module, importlib.import_module("flwr.supercore.inflatable.inflatable_object"))
    report_task_end(module, importlib.import_module("flwr.supercore.exit.exit"))


def hash_reply_once(module: ModuleType, inflatable: ModuleType) -> None:
    """Make ``module``'s ``push_message`` (``run_clientapp``) compute each object ID of the reply
    once. Flower's computes the reply's ID (every record deflated and hashed) outside its
    ``no_object_id_recompute`` context, then all IDs again inside it, and an array's chunks,
    made anew on every access, twice: a reply's bytes were hashed two to three times. Here the
    whole push runs in one such context, which Flower's own context inside joins
    (``inflatable``: ``flwr.supercore.inflatable.inflatable_object``)."""
    push, own_context = module.push_message, module.no_object_id_recompute

    @contextlib.contextmanager
    def joined():
        if inflatable._is_recompute_enabled():
            with own_context():
                yield
        else:  # inside the push's context: keep the IDs computed so far
            yield

    def push_message(*args, **kwargs):
        with own_context():
            return push(*args, **kwargs)

    module.no_object_id_recompute = joined
    module.push_message = push_message


def patch_serverapp(module: ModuleType, environ=os.environ) -> None:
    """Make ``module`` (``flwr.superlink.grid.http_grid``), the ServerApp's grid, poll for
    the parts of a reply with :func:`short_object_polls`, and, where its SuperLink signals the
    replies it stores (:data:`REPLY_SIGNALS_SETTING`), offer them as ``replies_stored``
    (:class:`ReplySignal`), on which :func:`fedgraphcore.transport.exchange` waits instead of polling."""
    module.pull_objects = short_object_polls(module.pull_objects)
    if REPLY_SIGNALS_SETTING in environ:
        directory = Path(environ[REPLY_SIGNALS_SETTING])

        def replies_stored(grid):
            if "_replies_stored" not in grid.__dict__ and grid._run is not None:
                grid.__dict__["_replies_stored"] = ReplySignal(directory / str(grid._run.run_id))
            return grid.__dict__.get("_replies_stored")

        module.HttpGrid.replies_stored = property(replies_stored)


#: the directory in which a ServerApp makes a FIFO named by its run ID, into which its SuperLink
#: (:func:`deploy.flower_shim.patch_superlink`) writes a byte for each reply of the run it stores
REPLY_SIGNALS_SETTING = "FEDGRAPH_REPLY_SIGNALS"


class ReplySignal:
    """The replies the SuperLink has stored for one run, counted through the FIFO at ``path``
    (made here), with :class:`app.engine.StoreSignal`'s ``mark`` and ``wait_past``: the ServerApp
    pulls once a reply is in, instead of every 2 to 50 ms (each pull an HTTP request through the
    SuperLink's middlewares)."""

    #: the FIFOs this process made (:meth:`remove_made` when its ServerApp ends)
    made: list[Path] = []

    def __init__(self, path: Path) -> None:
        if not path.exists():
            os.mkfifo(path, 0o600)
            ReplySignal.made.append(path)
        # read and write: a FIFO no writer holds open reads as ended; the SuperLink opens it per reply
        self._fd = os.open(path, os.O_RDWR | os.O_NONBLOCK)
        self._count = 0

    def _drain(self) -> None:
        while True:
            try:
                data = os.read(self._fd, 4096)
            except BlockingIOError:
                return
            self._count += len(data)

    def mark(self) -> int:
        self._drain()
        return self._count

    @classmethod
    def remove_made(cls) -> None:
        while cls.made:
            cls.made.pop().unlink(missing_ok=True)

    def wait_past(self, mark: int, timeout: float) -> bool:
        """Wait until a reply is stored after ``mark`` (True), at most ``timeout`` seconds."""
        self._drain()
        if self._count == mark:
            select.select([self._fd], [], [], timeout)
            self._drain()
        return self._count != mark


def signal_reply(directory: Path, run_id: int) -> None:
    """Tell the ServerApp of ``run_id``, if one waits in ``directory``, that a reply is stored."""
    try:
        fd = os.open(directory / str(run_id), os.O_WRONLY | os.O_NONBLOCK)
    except OSError:  # no ServerApp of this run waits (no FIFO, or nobody holds it open)
        return
    try:
        os.write(fd, b"r")
    except OSError:  # full: the ServerApp has wake-ups to read already
        pass
    finally:
        os.close(fd)


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
    """A forked ClientApp process: Flower's ``flwr-clientapp`` with ``argv``, changed by
    :func:`patch_clientapp`."""
    _silence_if(quiet)
    from flwr.supernode.cli.flwr_clientapp import flwr_clientapp
    from flwr.supernode.runtime import run_clientapp

    patch_clientapp(run_clientapp)
    sys.argv = argv
    flwr_clientapp()


def _run_serverapp(argv: list[str], quiet: bool) -> None:
    """A forked ServerApp process: Flower's ``flwr-serverapp`` with ``argv``, changed by
    :func:`patch_serverapp`."""
    _silence_if(quiet)
    from flwr.superlink.cli.flwr_serverapp import flwr_serverapp
    from flwr.superlink.grid import http_grid

    patch_serverapp(http_grid)
    sys.argv = ["flwr-serverapp", *argv]
    try:
        flwr_serverapp()
    finally:
        ReplySignal.remove_made()


def fork_serverapps(module: ModuleType, context=None):
    """Make ``module`` (``flwr.supercore.superexec.executor.subprocess_executor`` of the
    SuperLink's SuperExec) start each ``flwr-serverapp`` as a fork of a process that imported
    :data:`PRELOAD_SERVERAPP` (``multiprocessing``'s forkserver), running
    :func:`patch_serverapp`'s ServerApp; returns the multiprocessing context."""
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
    learned, reports = os.pipe()
    os.set_blocking(learned, False)
    os.set_blocking(reports, False)
    while True:
        try:
            argv, quiet = conn.recv()
        except EOFError:
            return
        import_learned(learned)
        if os.fork() == 0:
            conn.close()
            os.close(learned)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            loaded = set(sys.modules)
            _exit_after(_run_clientapp, argv, quiet, then=lambda: report_learned(reports, loaded))


def learned_modules(loaded: set[str]) -> list[str]:
    """The modules of :data:`LEARNED` packages imported since ``loaded`` (the names of
    ``sys.modules`` then), to two levels (``torch``, ``torch_geometric.nn``)."""
    return sorted({".".join(name.split(".")[:2]) for name in set(sys.modules) - loaded
                   if name.split(".")[0] in LEARNED})


def report_learned(reports: int, loaded: set[str]) -> None:
    """Write :func:`learned_modules` into the pipe ``reports`` (non-blocking) in one write of at
    most ``select.PIPE_BUF`` bytes, which the pipe keeps whole; a full pipe drops it."""
    line = b""
    for name in learned_modules(loaded):
        if len(line) + len(name) + 1 > select.PIPE_BUF:
            break
        line += name.encode() + b"\n"
    if line:
        try:
            os.write(reports, line)
        except BlockingIOError:  # the forker has not read the earlier reports yet: they name the same
            pass


def import_learned(learned: int) -> None:
    """Import every module the pipe ``learned`` (non-blocking) names; one that fails to import
    here fails in the ClientApp that needs it, with its own error."""
    data = b""
    while True:
        try:
            chunk = os.read(learned, 1 << 16)
        except BlockingIOError:
            break
        if not chunk:
            break
        data += chunk
    for name in sorted(set(data.decode(errors="replace").split())):
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - see the docstring
            pass


def _exit_after(run, *args, then=lambda: None) -> None:
    """Run a forked ClientApp, then ``then()``, and end its process with its exit code, never
    returning into the forker's loop."""
    code = 1
    try:
        run(*args)
        code = 0
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    finally:
        then()
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
