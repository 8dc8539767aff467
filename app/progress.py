"""Progress of a run, round by round: ``round i/N``, elapsed time, the round's headline value
(each strategy names its own: inertia, objective, loss, ...) and the bytes exchanged so far.

On a terminal it is one line that updates in place; anywhere else (a log file, a pipe, the
ServerApp under ``flwr run``, whose output Flower streams to ``flwr run --stream`` and to
``flwr log``) plain log lines: the first round, then at most one line every
:data:`LOG_EVERY_S` seconds, and the last round reported when the run ends.
"""

from __future__ import annotations

import sys
import time
from logging import INFO
from typing import TextIO

from flwr.common.logger import log

LOG_EVERY_S = 2.0


def progress_line(done: int, total: int, seconds: float, traffic: int, headline: dict) -> str:
    """``round 3/20 | 1.2 s | inertia 1523.4 | 0.52 MB``; a headline value of None is left out."""
    parts = [f"round {done}/{total}", f"{seconds:.1f} s"]
    parts += [f"{name} {value:.6g}" for name, value in headline.items() if value is not None]
    parts.append(f"{traffic / 1e6:.3g} MB")
    return " | ".join(parts)


class Progress:
    """Reports rounds to ``stream`` (default: standard error) if it is a terminal, else to the log."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.started = time.perf_counter()
        self._logged_at: float | None = None
        self._pending: str | None = None  # the newest line not yet shown (log) / not ended by a newline (tty)

    def round(self, done: int, total: int, traffic: int, **headline: float | None) -> None:
        """Round ``done`` of at most ``total`` is over; ``traffic``: bytes up and down so far."""
        now = time.perf_counter()
        self._pending = progress_line(done, total, now - self.started, traffic, headline)
        if self.tty:
            self.stream.write("\r" + self._pending + "\x1b[K")
            self.stream.flush()
        elif self._logged_at is None or now - self._logged_at >= LOG_EVERY_S:
            self._log(now)

    def close(self) -> None:
        """End the progress report: the terminal line gets its newline, the log the last round."""
        if self._pending is None:
            return
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()
            self._pending = None
        else:
            self._log(time.perf_counter())

    def _log(self, now: float) -> None:
        log(INFO, "%s", self._pending)
        self._logged_at, self._pending = now, None
