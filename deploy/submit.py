"""``python -m deploy run``: submit a run, follow it to its end, and say whether it produced a result.

``flwr run`` exits 0 once the SuperLink has accepted a run, whatever becomes of it: an app
the SuperNodes refuse (none of the keys they trust signed it), a node's privacy-policy
refusal, a SuperNode that left, a run someone stopped. This command submits the run with
``flwr run APP [--federation F] --run-config ... --format json`` (which gives the run id),
follows the ServerApp's log with ``flwr log RUN_ID --stream`` (shown as it comes; the
SuperLink ends the stream when the run has finished), reads the run's status with ``flwr ls
--run-id RUN_ID --format json``, saves the log as ``OUT_DIR/run-<id>.log`` and looks for
``OUT_DIR/result.json``, where the ServerApp writes the result of a run that got that far.
It exits 0 only for a run that finished ``completed`` with a result; otherwise it prints one
line naming why and exits with the code of the cause:

====  =================================================================================
code  the run
====  =================================================================================
0     finished completed; ``result.json`` is in the run-config's ``out-dir``
2     was not submitted: bad arguments or run-config (an ``out-dir`` that is not absolute,
      or holds a ``result.json`` already)
3     was not submitted: the SuperLink could not be reached or refused it
4     failed: the SuperNodes refused the app (no key they trust signed this bundle)
5     failed: a node's privacy policy refused a step (the rule is named)
6     failed: a SuperNode was lost (left the federation, no reply within ``timeout``,
      too few connected; the node is named)
7     failed for another reason (the ServerApp's error is printed)
8     was stopped (``flwr stop``) before it finished
9     finished completed, but no ``result.json`` is in ``out-dir``
10    unknown: the SuperLink stopped answering (or ending the log stream early) before the
      run finished
11    unknown: still running after ``--timeout`` seconds (it goes on; ``flwr stop RUN_ID``)
====  =================================================================================

The run-config must name an absolute ``out-dir`` (the ServerApp runs on the SuperLink host,
where this command runs too: the Control API listens on loopback only). ``APP`` defaults to
the installed app (:func:`deploy.bundle.stage_app`), the bundle ``python -m deploy sign``
signs by default. ``--connection NAME``: a SuperLink connection of ``$FLWR_HOME/config.toml``
(default: its ``default``)::

    python -m deploy run --connection mylink --run-config "strategy='kcagc' dataset='cora'
        partitioner='vertical' num-clients=3 eval-file='/abs/eval.npz' out-dir='/abs/results/kcagc'"
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from fedgraphcore.errors import FedGraphError
from fedgraphcore.transport import LEFT, NO_REPLY
from deploy.superlink import BIN

#: exit codes by cause (see the module docstring)
COMPLETED, BAD_INPUT, NOT_SUBMITTED, APP_REFUSED, POLICY_REFUSED, NODE_LOST, FAILED, STOPPED, NO_RESULT, \
    SUPERLINK_LOST, STILL_RUNNING = 0, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11
#: what a SuperNode with trusted entities replies to every message of an app it cannot verify
#: (Flower's ``FAB_VERIFICATION_ERROR``; a test checks it against the pinned Flower)
FAB_REFUSED = "The FAB could not be verified."
#: how the ServerApp names a privacy-policy refusal (:class:`fedgraphcore.session.PrivacyRefused`)
POLICY_MARKER = "refused by the privacy policy of"
#: how the ServerApp names a client it lost (:mod:`fedgraphcore.transport`, :mod:`fedgraphcore.session`, secure aggregation)
LOST_MARKERS = (LEFT, NO_REPLY, "SuperNodes connected within timeout",
                "below min-clients", "secure aggregation aborted: missing upload")
#: Flower's prefix of a failed ServerApp's status details
_EXCEPTION_PREFIX = "ServerApp failed with exception: "
#: times the log stream is opened again when it ends before the run has finished
STREAM_ATTEMPTS = 3


class NotSubmitted(FedGraphError):
    """The run was not submitted (``code``, the exit code: :data:`BAD_INPUT` or :data:`NOT_SUBMITTED`)."""

    exit_code = BAD_INPUT

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = self.exit_code = code


@dataclass(frozen=True)
class RunState:
    """One run as ``flwr ls --run-id N --format json`` shows it."""

    run_id: int
    status: str  # pending, starting, running, finished:completed|failed|stopped
    details: str

    @property
    def finished(self) -> bool:
        return self.status.startswith("finished")


def parse_ls(stdout: str, run_id: int) -> RunState:
    """The run ``run_id`` in the output of ``flwr ls --run-id RUN_ID --format json``."""
    runs = {int(r["run-id"]): r for r in _json_object(stdout).get("runs", [])}
    if run_id not in runs:
        raise ValueError(f"flwr ls does not list run {run_id}: {stdout.strip()[:500]}")
    run = runs[run_id]
    details = run.get("status-details", "")
    return RunState(run_id, run["status"], "" if details == "N/A" else details)


def _json_object(stdout: str) -> dict:
    """The JSON object Flower's ``--format json`` prints (whatever precedes it is skipped)."""
    start = stdout.find("{")
    if start < 0:
        raise ValueError(f"no JSON in the output: {stdout.strip()[:500]!r}")
    return json.JSONDecoder().raw_decode(stdout[start:])[0]


def verdict(state: RunState, result: Path) -> tuple[int, str]:
    """The exit code and one line for a run in ``state`` whose result belongs at ``result``."""
    details = " ".join(state.details.removeprefix(_EXCEPTION_PREFIX).split())
    where = f"run {state.run_id}"
    if state.status == "finished:completed":
        if result.is_file():
            return COMPLETED, f"{where} completed: result {result}"
        return NO_RESULT, f"{where} completed but wrote no result: {result} does not exist"
    if state.status == "finished:stopped":
        return STOPPED, f"{where} was stopped before it finished (flwr stop){': ' + details if details else ''}"
    if not state.finished:
        return SUPERLINK_LOST, f"{where} is {state.status}, not finished"
    if FAB_REFUSED in details:
        return APP_REFUSED, (f"{where} failed: the SuperNodes refused the app: no key they trust signed this bundle "
                             f"(python -m deploy sign); {details}")
    if POLICY_MARKER in details:
        rules = ", ".join(dict.fromkeys(re.findall(r"rule '([^']+)'", details))) or "?"
        return POLICY_REFUSED, f"{where} failed: a node's privacy policy refused it (rule {rules}): {details}"
    if any(marker in details for marker in LOST_MARKERS):
        return NODE_LOST, f"{where} failed: a SuperNode was lost: {details}"
    return FAILED, f"{where} failed: {details or 'no reason given (see the log)'}"


def flwr_command(positional: list[str], connection: str | None, options: list[str] = ()) -> list[str]:
    """``flwr POSITIONAL [CONNECTION] OPTIONS`` with the ``flwr`` of this environment."""
    return [str(BIN / "flwr"), *positional, *([connection] if connection else []), *options]


def checked_out_dir(run_config: list[str]) -> Path:
    """The run-config's ``out-dir`` once the run-config (``flwr run --run-config`` texts) passes the
    app's checks; NotSubmitted(BAD_INPUT) naming the problem otherwise."""
    from flwr.common.config import parse_config_args

    from app import registry
    from fedgraphcore.config import ConfigError
    from fedgraphcore.result import check_out_dir

    try:
        values = parse_config_args(run_config)
        registry.validate(values)
        out_dir = Path(str(values.get("out-dir", "")))
        if not values.get("out-dir") or not out_dir.is_absolute():
            raise ConfigError(f"out-dir {str(values.get('out-dir', ''))!r}; valid: an absolute path, where the "
                              "ServerApp writes result.json (out-dir='/abs/path')")
        check_out_dir(out_dir)
    except (ConfigError, ValueError) as err:
        raise NotSubmitted(BAD_INPUT, f"run-config: {' '.join(str(err).split())}") from None
    return out_dir


def submit(app: Path, connection: str | None, run_config: list[str], federation: str | None) -> int:
    """Submit the app in ``app`` with ``flwr run``; its run id. NotSubmitted(NOT_SUBMITTED) with
    Flower's message when the SuperLink cannot be reached or refuses the run."""
    options = ["--format", "json", *(o for text in run_config for o in ("--run-config", text)),
               *(["--federation", federation] if federation else [])]
    done = subprocess.run(flwr_command(["run", str(app)], connection, options), capture_output=True, text=True)
    try:
        reply = _json_object(done.stdout)
    except ValueError:
        reply = {}
    if done.returncode != 0 or not reply.get("success") or not reply.get("run-id"):
        message = reply.get("error-message") or done.stderr or done.stdout or f"exit code {done.returncode}"
        raise NotSubmitted(NOT_SUBMITTED, f"flwr run did not submit the run: {' '.join(message.split())}")
    return int(reply["run-id"])


def read_state(run_id: int, connection: str | None) -> RunState | None:
    """The run's state from ``flwr ls``; None when the SuperLink does not answer."""
    done = subprocess.run(flwr_command(["ls"], connection, ["--run-id", str(run_id), "--format", "json"]),
                          capture_output=True, text=True)
    try:
        return parse_ls(done.stdout, run_id)
    except (ValueError, KeyError, TypeError):
        return None


def stream_log(run_id: int, connection: str | None, echo, skip: int, timeout: float | None) -> tuple[str, bool]:
    """The run's log from ``flwr log RUN_ID --stream``, which ends once the run has finished
    (or the SuperLink went away); what lies beyond its first ``skip`` characters is passed to
    ``echo`` as it comes. Also whether ``timeout`` seconds passed first (the stream is then ended)."""
    proc = subprocess.Popen(flwr_command(["log", str(run_id)], connection, ["--stream"]), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    expired = threading.Event()

    def expire() -> None:
        expired.set()
        proc.kill()

    timer = threading.Timer(max(timeout, 0.0), expire) if timeout is not None else None
    if timer is not None:
        timer.start()
    text: list[str] = []
    try:
        for line in proc.stdout:
            seen = sum(map(len, text))
            text.append(line)
            if seen + len(line) > skip:
                echo(line[max(skip - seen, 0):])
    except BaseException:
        proc.kill()
        raise
    finally:
        if timer is not None:
            timer.cancel()
        proc.wait()
    return "".join(text), expired.is_set()


def follow(run_id: int, connection: str | None, echo, timeout: float | None) -> tuple[RunState | None, str, bool]:
    """Follow the run until it has finished: its last state (None: the SuperLink stopped answering),
    its log, and whether ``timeout`` passed first. A stream that ends before the run has finished is
    opened again (it starts from the beginning; what was shown is not shown again)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    log, state = "", None
    for _ in range(STREAM_ATTEMPTS):
        left = None if deadline is None else deadline - time.monotonic()
        text, timed_out = stream_log(run_id, connection, echo, len(log), left)
        log = max(log, text, key=len)
        state = read_state(run_id, connection)
        if timed_out or state is None or state.finished:
            return state, log, timed_out
    return state, log, False


@contextmanager
def app_folder(app: Path | None):
    """``app`` (it must hold a pyproject.toml), or the installed app staged in a temporary folder."""
    if app is not None:
        if not (Path(app) / "pyproject.toml").is_file():
            raise NotSubmitted(BAD_INPUT, f"app {str(app)!r} holds no pyproject.toml; valid: a Flower app folder, "
                                          "or none for the installed app")
        yield Path(app)
        return
    from deploy.bundle import stage_app

    with tempfile.TemporaryDirectory(prefix="fedgraph-app-") as tmp:
        yield stage_app(Path(tmp))


def run(app: Path | None, connection: str | None, run_config: list[str], federation: str | None = None,
        timeout: float | None = None, echo=None) -> int:
    """Submit, follow and judge one run (see the module docstring); the exit code. The run's log
    goes to ``echo`` as it comes (default: stdout) and to ``OUT_DIR/run-<id>.log``; the verdict is
    one line, on stdout for a result, else ``error: ...`` on stderr."""
    echo = echo or (lambda text: print(text, end="", flush=True))
    try:
        out_dir = checked_out_dir(run_config)
        with app_folder(app) as folder:
            run_id = submit(folder, connection, run_config, federation)
    except NotSubmitted as err:
        print(f"error: {err}", file=sys.stderr)
        return err.code
    print(f"run {run_id} submitted; following it until it has finished", flush=True)
    try:
        state, log, timed_out = follow(run_id, connection, echo, timeout)
    except KeyboardInterrupt:
        print(f"stopped following run {run_id}; it goes on (flwr stop {run_id} stops it)", file=sys.stderr)
        return 130
    saved = _save_log(out_dir, run_id, log)
    if timed_out and not (state and state.finished):
        code, line = STILL_RUNNING, f"run {run_id} still runs after {timeout:g} s (flwr stop {run_id} stops it)"
    elif state is None:
        code, line = SUPERLINK_LOST, f"run {run_id}: the SuperLink stopped answering before the run finished"
    else:
        from fedgraphcore.result import RESULT_FILE

        code, line = verdict(state, out_dir / RESULT_FILE)
    line += f" (log: {saved})" if saved else ""
    print(line if code == COMPLETED else f"error: {line}", file=sys.stdout if code == COMPLETED else sys.stderr)
    return code


def _save_log(out_dir: Path, run_id: int, log: str) -> Path | None:
    """``log`` as ``out_dir/run-<id>.log``, a file this call creates (O_EXCL, O_NOFOLLOW: the out-dir
    may be shared, and nothing planted there is written through); None when it cannot be created."""
    path = out_dir / f"run-{run_id}.log"
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
        with os.fdopen(fd, "w") as f:
            f.write(log)
    except OSError:
        return None
    return path
