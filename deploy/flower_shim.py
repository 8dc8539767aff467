"""Flower's own SuperNode and SuperExec with shorter waits on one machine.

``python -m deploy.flower_shim supernode ARGS`` runs ``flower-supernode ARGS``
(Flower's entry point, unchanged arguments) after these changes to the module
``flwr.supernode.start_client_internal`` of the pinned Flower (1.42):

* its main loop sleeps 3 s after every pull that found no message; here such
  a sleep lasts :data:`IDLE_FRACTION` of the time since the last message, at
  least :data:`FIRST_IDLE_POLL_S` and at most Flower's 3 s (a message that
  comes t seconds after the last one waits about t / 16 longer; an idle
  SuperNode polls every 3 s);
* while a ClientApp runs it checks for the reply (and then for each of the
  reply's objects) every 0.5 s; here every :data:`REPLY_POLL_S`.

Both go through the module's ``time`` name, replaced by a :class:`PollClock`
that maps Flower's two waits onto these and passes any other sleep through.
The SuperExec it starts becomes ``python -m deploy.flower_shim superexec``:
Flower's ``flower-superexec``, whose subprocess executor starts each
``flwr-clientapp`` (still one process per message) as a fork of a process that
has already imported Flower's ClientApp runtime and the third-party packages
in :data:`PRELOAD` (``multiprocessing``'s forkserver). The app's own code is
never preloaded: every ClientApp process loads it from the app bundle, as
Flower's own ClientApp processes do. With ``FEDGRAPH_TIMING=1`` each message also leaves two ``fedgraph-timing``
lines in the SuperNode's log (wall-clock seconds when it was pulled and its
reply pushed), which ``benchmarks/deployment.py`` reads.

``deploy.federation`` starts SuperNodes this way unless the environment sets
``FEDGRAPH_FLOWER_SHIM=0`` (then: plain ``flower-supernode``). No Flower code is
copied; ``tests/test_flower_shim.py`` checks that the names and waits patched
here are those of the installed Flower.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import time
from types import ModuleType

#: the environment variable that switches the shim off ("0")
SETTING = "FEDGRAPH_FLOWER_SHIM"
#: the waits Flower hard-codes in flwr.supernode.start_client_internal
FLOWER_IDLE_POLL_S = 3
FLOWER_REPLY_POLL_S = 0.5
FIRST_IDLE_POLL_S = 0.02
IDLE_FRACTION = 1 / 8
REPLY_POLL_S = 0.01
#: imported once by the fork server, before any ClientApp process forks from it (the GNN methods'
#: torch, PyG and Opacus cost about 5 s of CPU to import: once per SuperNode, not once per message)
PRELOAD = ("flwr.supernode.cli.flwr_clientapp", "flwr.supernode.runtime.run_clientapp", "numpy",
           "scipy.sparse", "scipy.sparse.linalg", "scipy.linalg", "cryptography.hazmat.primitives.asymmetric.x25519",
           "cryptography.hazmat.primitives.ciphers.aead", "sklearn.cluster", "torch", "torch_geometric.nn", "opacus")
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
    pull, push, popen = module._pull_and_store_message, module._push_messages, module.subprocess.Popen

    def pull_and_store_message(*args, **kwargs):
        run_id = pull(*args, **kwargs)
        if run_id is not None:
            clock.active()
            _timing("pulled")
        return run_id

    def push_messages(*args, **kwargs):
        push(*args, **kwargs)
        clock.active()
        _timing("pushed")

    def start_superexec(command, *args, **kwargs):
        if command and command[0] == "flower-superexec":
            command = [sys.executable, "-m", "deploy.flower_shim", "superexec", *command[1:]]
        return popen(command, *args, **kwargs)

    module.time = clock
    module._pull_and_store_message = pull_and_store_message
    module._push_messages = push_messages
    module.subprocess = _Namespace(subprocess, Popen=start_superexec)
    return clock


class _Namespace:
    """A module with some names replaced."""

    def __init__(self, module: ModuleType, **replaced) -> None:
        self._module = module
        self.__dict__.update(replaced)

    def __getattr__(self, name: str):
        return getattr(self._module, name)


def _run_clientapp(argv: list[str], quiet: bool) -> None:
    """A forked ClientApp process: Flower's ``flwr-clientapp`` with ``argv``."""
    if quiet:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
    from flwr.supernode.cli.flwr_clientapp import flwr_clientapp

    sys.argv = argv
    flwr_clientapp()


def patch_executor(module: ModuleType, context=None):
    """Make ``module`` (``flwr.supercore.superexec.executor.subprocess_executor``) start
    ``flwr-clientapp`` as a fork of a preloaded process; returns the multiprocessing context."""
    import multiprocessing

    ctx = context or multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(list(PRELOAD))
    popen = module.subprocess.Popen

    def start(args, *rest, **kwargs):
        if not args or args[0] != "flwr-clientapp":
            return popen(args, *rest, **kwargs)
        multiprocessing.active_children()  # reaps the finished ones
        process = ctx.Process(target=_run_clientapp, args=(list(args), kwargs.get("stdout") == subprocess.DEVNULL),
                              daemon=False)
        process.start()
        return process

    module.subprocess = _Namespace(subprocess, Popen=start)
    return ctx


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("supernode", "superexec"):
        print("usage: python -m deploy.flower_shim supernode|superexec [Flower's arguments]", file=sys.stderr)
        return 2
    role, sys.argv = argv[0], [f"flower-{argv[0]}", *argv[1:]]
    if role == "supernode":
        from flwr.supernode.cli import flower_supernode

        patch_supernode(importlib.import_module("flwr.supernode.start_client_internal"))
        flower_supernode()
    else:
        from flwr.supercore.cli import flower_superexec

        patch_executor(importlib.import_module("flwr.supercore.superexec.executor.subprocess_executor"))
        importlib.import_module("multiprocessing.forkserver").ensure_running()  # preloads before the first message
        flower_superexec()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
