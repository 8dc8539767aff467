"""A run's console holds the app's own lines; what Flower, Ray and torch print that a user
cannot act on is left out unless verbose (``python -m app.run -v``).

Left out around the simulation engine (:func:`simulation_engine`):

* Flower's notice that ``flwr.simulation.run_simulation`` is deprecated. Flower 1.41 and 1.42
  offer no supported in-process replacement: the supported way is ``flwr run`` against a
  SuperLink (docs/running.md), whose simulation runtime calls the same engine;
* Ray's FutureWarning about a future default for GPU-visibility variables (no GPU is used);
* everything the Ray actors print (``log_to_driver``): torch's ``torch.jit.script``
  deprecation (PyG calls it on import), once per actor, and Flower's "Manually terminating
  ClientAppActor" at shutdown. A client prints nothing of its own but a failed step (its whole
  error, logger ``fedgraph.party``; :mod:`fedgraphcore.disclosure`); the server receives its public part
  as an error reply and stops the run with one line naming the client.
"""

from __future__ import annotations

import logging
import sys
import warnings
from contextlib import contextmanager
from typing import Iterator

from flwr.common.logger import FLOWER_LOGGER
from flwr.supercore.logger import update_console_handler

FLOWER_NOTICES = ("DEPRECATED FEATURE: The `run_simulation` function is deprecated",)
RAY_WARNINGS = ("Tip: In future versions of Ray, Ray will no longer override accelerator",)

_verbose = False
_silent = False


def set_verbose(verbose: bool) -> None:
    """Show everything (True) or only the app's own lines (False, the default); and Flower's log
    lines plain: coloured only on a terminal (a log file gets no escape codes), none empty."""
    global _verbose
    _verbose = verbose
    plain_console()


class _DropEmpty(logging.Filter):
    """Drops Flower's empty log lines (``INFO :`` with nothing after it, its spacing between messages)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return bool(record.getMessage().strip())


_DROP_EMPTY = _DropEmpty()


def plain_console(stream=None) -> None:
    """Flower's console lines in this process: coloured only when ``stream`` (default: standard
    error, where Flower's handler writes) is a terminal; empty lines left out."""
    stream = sys.stderr if stream is None else stream
    update_console_handler(colored=bool(getattr(stream, "isatty", lambda: False)()))
    for handler in FLOWER_LOGGER.handlers:  # on the handler: it also sees the records of flwr.* loggers
        handler.removeFilter(_DROP_EMPTY)
        handler.addFilter(_DROP_EMPTY)


def verbose() -> bool:
    return _verbose


def mute() -> None:
    """From now on this process logs nothing through Flower's logger (Ctrl-C: the engine's threads
    report every actor stopped under them, a traceback each; the run says it was interrupted)."""
    FLOWER_LOGGER.setLevel(logging.CRITICAL + 1)


def silent() -> bool:
    """Whether this process's runs show nothing (:func:`silenced`): no progress, no summary."""
    return _silent


@contextmanager
def silenced(on: bool = True) -> Iterator[None]:
    """Within it (``on``), a run shows no progress and logs no summary: Flower's logger and the
    app's party logger let warnings and errors through only. ``app.cluster(..., quiet=True)``."""
    global _silent
    if not on:
        yield
        return
    loggers = [FLOWER_LOGGER, logging.getLogger("fedgraph")]
    levels = [lg.level for lg in loggers]
    before, _silent = _silent, True
    for lg in loggers:
        lg.setLevel(max(lg.getEffectiveLevel(), logging.WARNING))
    try:
        yield
    finally:
        _silent = before
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


class _DropNotices(logging.Filter):
    """Drops Flower log records that start with one of ``FLOWER_NOTICES``."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(FLOWER_NOTICES)


def ray_init_args() -> dict:
    """``init_args`` of the simulation backend: the actors' output stays in the actors unless verbose."""
    return {} if _verbose else {"log_to_driver": False}


@contextmanager
def simulation_engine() -> Iterator[None]:
    """Around ``run_simulation``: Flower's deprecation notice and Ray's FutureWarning left out
    unless verbose."""
    if _verbose:
        yield
        return
    notices = _DropNotices()
    FLOWER_LOGGER.addFilter(notices)
    try:
        with warnings.catch_warnings():
            for message in RAY_WARNINGS:
                warnings.filterwarnings("ignore", message=message, category=FutureWarning)
            yield
    finally:
        FLOWER_LOGGER.removeFilter(notices)
