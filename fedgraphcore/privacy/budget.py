"""A node's privacy ledger: every release of a protected upload, over runs and restarts.

One JSON object per line, appended and never rewritten (no pickle: reading it
runs no code)::

    {"time": "2026-05-01T10:00:00+00:00", "run": 7, "strategy": "fedsc", "action": "fedsc_round",
     "request": "<sha256 of the request>", "noise_multiplier": 0.61}

``noise_multiplier`` is the release's Gaussian noise std divided by its L2
sensitivity (the multiplier an RDP accountant is stepped with), ``null`` for
an un-noised release (epsilon infinite). The file lives where the node config
says (``privacy-ledger``) or beside the node's data (:func:`fedgraphcore.privacy.policy.ledger_path`);
without either (simulation), the run context keeps the lines, which then last
one run. Appends hold an exclusive ``flock`` on the file, so two runs of one
node cannot both spend the last of a budget.

:func:`composed_epsilon` composes the recorded releases of a strategy with
Opacus' RDP accountant (each release a Gaussian mechanism with sample rate 1);
the node's policy (:mod:`fedgraphcore.privacy.policy`) refuses a release that would take
it above the node's ``epsilon``.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import math
import os
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np
from flwr.app import Array, ArrayRecord, RecordDict

from fedgraphcore.config import ConfigError

STATE_RECORD = "privacy-ledger"
FIELDS = ("time", "run", "strategy", "action", "request", "noise_multiplier")


def composed_epsilon(multipliers: Iterable[float | None], delta: float) -> float:
    """Epsilon at ``delta`` of the releases with these noise multipliers (None: un-noised,
    infinite), composed with Opacus' RDP accountant; 0 for no release."""
    counts = Counter(multipliers)
    if None in counts:
        return math.inf
    if not counts:
        return 0.0
    from opacus.accountants import RDPAccountant

    accountant = RDPAccountant()
    accountant.history = [(float(z), 1.0, int(n)) for z, n in counts.items()]
    return float(accountant.get_epsilon(delta=float(delta)))


def _check(record, where: str) -> dict:
    if not isinstance(record, dict) or set(record) != set(FIELDS):
        raise ConfigError(f"{where}: not a privacy ledger record; expected the fields {', '.join(FIELDS)}")
    z = record["noise_multiplier"]
    if z is not None and not (isinstance(z, (int, float)) and not isinstance(z, bool) and z > 0 and math.isfinite(z)):
        raise ConfigError(f"{where}: noise_multiplier {z!r}; valid: a finite number > 0, or null")
    return record


class JsonLines:
    """Records appended to a JSON-lines file under an exclusive ``flock``, never rewritten, each
    checked when read (``check(record, where)``); or, without a ``path``, kept in the run context's
    ``state`` (record ``state_record``), for one run. ``kind`` names them in errors."""

    kind = "record"
    state_record = ""

    def __init__(self, path: Path | None, state: RecordDict) -> None:
        self.path = None if path is None else Path(path)
        self.state = state

    def check(self, record, where: str) -> dict:
        return record

    def where(self) -> str:
        return str(self.path) if self.path is not None else "the run context (no ledger file)"

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the file's exclusive lock (reading and appending in between are atomic)."""
        if self.path is None:
            yield
            return
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with open(self.path, "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _lines(self) -> list[str]:
        if self.path is None:
            if self.state_record not in self.state.array_records:
                return []
            return self.state.array_records[self.state_record]["lines"].numpy().tobytes().decode().splitlines()
        try:
            return self.path.read_text().splitlines()
        except FileNotFoundError:
            return []

    def records(self) -> list[dict]:
        """Every record, checked (a line that is not a record stops with its file and line)."""
        out = []
        for number, line in enumerate(self._lines(), start=1):
            where = f"{self.kind} {self.where()}, line {number}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise ConfigError(f"{where}, column {err.colno}: {err.msg}") from None
            out.append(self.check(record, where))
        return out

    def _append(self, record: dict) -> None:
        line = json.dumps(record, allow_nan=False) + "\n"
        if self.path is None:
            kept = self.state.array_records.get(self.state_record)
            data = (kept["lines"].numpy().tobytes() if kept is not None else b"") + line.encode()
            self.state[self.state_record] = ArrayRecord({"lines": Array(np.frombuffer(data, dtype=np.uint8))})
            return
        with open(self.path, "a") as handle:
            handle.write(line)
            handle.flush()
            os.fsync(handle.fileno())


class NodeLedger(JsonLines):
    """The ledger of one node: a JSON-lines file, or the run context's state (``path`` None)."""

    kind = "privacy ledger"
    state_record = STATE_RECORD

    def check(self, record, where: str) -> dict:
        return _check(record, where)

    def append(self, run: int, strategy: str, action: str, request: str, noise_multiplier: float | None) -> None:
        self._append({"time": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "run": int(run),
                      "strategy": strategy, "action": action, "request": request,
                      "noise_multiplier": None if noise_multiplier is None else float(noise_multiplier)})
