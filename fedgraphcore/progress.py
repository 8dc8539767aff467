"""Progress of a run, round by round: the rounds done of the rounds expected, elapsed time, the
step under way, the round's figures by name (each strategy names its own: inertia, objective,
loss, ...; :data:`FIGURES` says what each means) and the bytes exchanged so far.

A strategy that stops once a measure (a residual, a centre shift) reaches its tolerance knows
only an upper bound on its rounds: the line then reads ``round 7/~25 (at most 2000)``, the
expected count extrapolated from the measure's recent rate of decrease
(:func:`expected_rounds`), or ``round 7 (at most 2000)`` while the measure is not falling; a
strategy that knows no bound worth showing reports ``round 7``.

On a terminal it is a live progress bar (the ``rich`` library), with each figure's meaning printed
above it the first time the figure shows; anywhere else (a log file, a pipe, the ServerApp under
``flwr run``, whose output Flower streams to ``flwr run --stream`` and to ``flwr log``) plain log
lines: each figure's meaning once, the first round, then at most one line every
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

from fedgraphcore import quiet

LOG_EVERY_S = 2.0
#: What each figure a strategy reports per round means (the progress line and the run's page say it),
#: in the order the page prefers to draw them.
FIGURES = {
    "inertia": "the k-means objective: the summed squared distance of every row to its cluster's centre. Plain Lloyd "
               "rounds never raise it; fedkmeans sums it over the rows the clients sent this round: a client whose "
               "privacy audit holds a cluster back (withheld rows) or sends its last statistics again leaves rows "
               "out or counts them at older centres, so the sum can rise when they come in",
    "withheld": "rows whose cluster a client's privacy audit held back this round (too few rows, or a row the "
                "sums would pin down); they join once their cluster passes",
    "shift": "the largest distance a centre moved this round; the run stops once it is at most the tolerance",
    "residual": "the eigensolver's largest relative residual of the top Ritz pairs; the run stops at its tolerance",
    "ritz_k": "the k-th largest Ritz value: the eigenvalue estimate that sets the gap the clusters need",
    "basis": "the width of the eigensolver's Krylov basis",
    "subspace_change": "the distance between the leading eigenvector subspaces of two consecutive rounds; small "
                       "once the power iteration has settled",
    "objective": "fedsc's factorisation objective summed over the clients; lower is a closer kernel fit",
    "loss": "the model's training loss, averaged over the clients",
    "val_modularity": "the modularity of the model's clusters on held-out edges; the round with the highest is kept",
    "intra": "kcagc (exact): the pooled intra-cluster distance of the graph-filtered features at the filter order "
             "tried; AGC raises the order until it rises, and keeps the order before",
    "order": "the graph filter order tried (AGC's adaptive order search)",
    "clients": "the clients whose local labels were merged",
}
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


def rounds_text(done: int, total: int | None, expected: int | None = None, capped: bool = False) -> str:
    """``round 3/20``; with ``capped`` (``total`` is only an upper bound) ``round 3/~9 (at most
    20)`` or, with no expected count, ``round 3 (at most 20)``; ``round 3`` without a ``total``."""
    if total is None:
        return f"round {done}" if expected is None else f"round {done}/~{max(expected, done)}"
    if not capped:
        return f"round {done}/{total}"
    if expected is None:
        return f"round {done} (at most {total})"
    return f"round {done}/~{max(expected, done)} (at most {total})"


def figures_text(headline: dict) -> str:
    """``inertia 1523.4 | withheld 3``; a value of None is left out."""
    return " | ".join(f"{name} {value:.6g}" for name, value in headline.items() if value is not None)


def progress_line(done: int, total: int | None, seconds: float, traffic: int, headline: dict,
                  expected: int | None = None, capped: bool = False, step: str = "") -> str:
    """``round 3/20 | kmeans_step | 1.2 s | inertia 1523.4 | 0.52 MB``; a headline value of None is
    left out (``expected``, ``capped``: see :func:`rounds_text`; ``step``: the step under way)."""
    parts = [rounds_text(done, total, expected, capped)] + ([step] if step else []) + [f"{seconds:.1f} s"]
    parts += [text] if (text := figures_text(headline)) else []
    parts.append(f"{traffic / 1e6:.3g} MB")
    return " | ".join(parts)


class Progress:
    """Reports rounds to ``stream`` (default: standard error): a live bar if it is a terminal, else log lines."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)()) and not quiet.silent()
        self.started = time.perf_counter()
        self.step_name = ""
        self._explained: set[str] = set()
        self._bar = None  # the live bar (rich), on a terminal from the first round to close()
        self._logged_at: float | None = None
        self._pending: str | None = None  # the newest line not yet logged

    def step(self, action: str) -> None:
        """The step ``action`` is under way (shown on the bar and in the next line)."""
        self.step_name = action
        if self._bar is not None:
            self._bar.update(self._task, description=action)

    def round(self, done: int, total: int | None, traffic: int, converging: Convergence | None = None,
              capped: bool = False, **headline: float | None) -> None:
        """Round ``done`` of ``total`` is over; ``traffic``: bytes up and down so far. With
        ``capped`` or ``converging`` (the measure the run stops on) ``total`` is an upper bound;
        None: no bound worth showing."""
        now = time.perf_counter()
        expected = None
        if converging is not None:
            expected = expected_rounds(done, converging.measures, converging.tol, total or done)
        capped = capped or converging is not None
        self._explain(headline)
        if self.tty:
            self._draw(done, total, expected, capped, traffic, headline)
            return
        self._pending = progress_line(done, total, now - self.started, traffic, headline, expected, capped,
                                      self.step_name)
        if self._logged_at is None or now - self._logged_at >= LOG_EVERY_S:
            self._log(now)

    def _explain(self, headline: dict) -> None:
        """Each figure's meaning, the first time it shows."""
        for name in headline:
            if name in FIGURES and name not in self._explained:
                self._explained.add(name)
                text = f"{name}: {FIGURES[name]}"
                if self.tty:
                    self._live().console.print(text, style="dim", highlight=False)
                else:
                    log(INFO, "%s", text)

    def _live(self):
        """The live bar (started on first use): step, bar, rounds, elapsed, figures, traffic."""
        if self._bar is None:
            from rich.console import Console
            from rich.progress import BarColumn, Progress as Bar, TextColumn, TimeElapsedColumn

            self._bar = Bar(TextColumn("{task.description}"), BarColumn(bar_width=24),
                            TextColumn("{task.fields[rounds]}"), TimeElapsedColumn(), TextColumn("{task.fields[figures]}"),
                            TextColumn("{task.fields[traffic]}"), console=Console(file=self.stream),
                            refresh_per_second=4, redirect_stdout=False, redirect_stderr=False)
            self._task = self._bar.add_task(self.step_name, total=None, rounds="", figures="", traffic="")
            self._bar.start()
        return self._bar

    def _draw(self, done: int, total: int | None, expected: int | None, capped: bool, traffic: int,
              headline: dict) -> None:
        goal = expected if expected is not None else (None if capped else total)
        self._live().update(self._task, completed=done, total=max(goal, done) if goal else None,
                            description=self.step_name, rounds=rounds_text(done, total, expected, capped),
                            figures=figures_text(headline), traffic=f"{traffic / 1e6:.3g} MB")

    def close(self) -> None:
        """End the progress report: the bar stops (its last state stays), the log gets the last round."""
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
        if self._pending is not None:
            self._log(time.perf_counter())

    def _log(self, now: float) -> None:
        log(INFO, "%s", self._pending)
        self._logged_at, self._pending = now, None
