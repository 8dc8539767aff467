"""Progress of a run, round by round: ``round i/N``, elapsed time, the round's headline value
(each strategy names its own: inertia, objective, loss, ...) and the bytes exchanged so far.

A strategy that stops once a measure (a residual, a centre shift) reaches its tolerance knows
only an upper bound on its rounds: the line then reads ``round 7/~25 (at most 2000)``, the
expected count extrapolated from the measure's recent rate of decrease
(:func:`expected_rounds`), or ``round 7 (at most 2000)`` while the measure is not falling.

On a terminal it is one line that updates in place; anywhere else (a log file, a pipe, the
ServerApp under ``flwr run``, whose output Flower streams to ``flwr run --stream`` and to
``flwr log``) plain log lines: the first round, then at most one line every
:data:`LOG_EVERY_S` seconds, and the last round reported when the run ends.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, field
from logging import INFO
from typing import TextIO

from flwr.common.logger import log

LOG_EVERY_S = 2.0
#: rounds of a converging measure the expected count is extrapolated from
RATE_WINDOW = 4


def expected_rounds(done: int, measures: list[float], tol: float, cap: int) -> int | None:
    """Rounds a run is expected to take in all, at most ``cap``: the measure's geometric rate of
    decrease over its last :data:`RATE_WINDOW` rounds (``measures``, one per round, the newest
    last) carried on until it reaches ``tol``; None while it is not falling or unknown."""
    recent = [m for m in measures[-RATE_WINDOW:] if m is not None and m > 0 and math.isfinite(m)]
    if measures and measures[-1] is not None and measures[-1] <= tol:
        return done
    if tol <= 0 or len(recent) < 2:
        return None
    rate = (recent[-1] / recent[0]) ** (1.0 / (len(recent) - 1))
    if rate >= 1.0:
        return None
    more = math.ceil(math.log(tol / recent[-1]) / math.log(rate))
    return min(cap, done + max(more, 1))


@dataclass
class Convergence:
    """A measure a run stops on once it is at most ``tol``, and its values so far, one per round."""

    tol: float
    measures: list[float] = field(default_factory=list)


def rounds_text(done: int, total: int, expected: int | None = None, capped: bool = False) -> str:
    """``round 3/20``; with ``capped`` (``total`` is only an upper bound) ``round 3/~9 (at most
    20)`` or, with no expected count, ``round 3 (at most 20)``."""
    if not capped:
        return f"round {done}/{total}"
    if expected is None:
        return f"round {done} (at most {total})"
    return f"round {done}/~{max(expected, done)} (at most {total})"


def progress_line(done: int, total: int, seconds: float, traffic: int, headline: dict,
                  expected: int | None = None, capped: bool = False) -> str:
    """``round 3/20 | 1.2 s | inertia 1523.4 | 0.52 MB``; a headline value of None is left out
    (``expected``, ``capped``: see :func:`rounds_text`)."""
    parts = [rounds_text(done, total, expected, capped), f"{seconds:.1f} s"]
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

    def round(self, done: int, total: int, traffic: int, converging: Convergence | None = None,
              capped: bool = False, **headline: float | None) -> None:
        """Round ``done`` of ``total`` is over; ``traffic``: bytes up and down so far. With
        ``capped`` or ``converging`` (the measure the run stops on) ``total`` is an upper bound."""
        now = time.perf_counter()
        expected = None
        if converging is not None:
            expected = expected_rounds(done, converging.measures, converging.tol, total)
        self._pending = progress_line(done, total, now - self.started, traffic, headline, expected,
                                      capped or converging is not None)
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
