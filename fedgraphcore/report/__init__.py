"""A page per run: ``report.html`` beside every ``result.json``.

When a run ends the server keeps what the page draws of the data (:mod:`fedgraphcore.report.view`,
``report-data.npz``) and writes the page (:mod:`fedgraphcore.report.page`) from the run's folder alone:
``result.json``, ``labels.npy``, ``reference_labels.npy`` (the centralised method's labels, where
it ran) and the view. ``python -m app.report RUN_DIR`` writes it again from the same files::

    python -m app.report results/fedkmeans-sbm-20250101-120000

A deployed party with its own data writes a page of its own beside its labels
(:mod:`fedgraphcore.report.member`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from fedgraphcore.errors import FedGraphError
from fedgraphcore.report.view import VIEW_FILE, View, build_view
from fedgraphcore.result import LABELS_FILE, REFERENCE_LABELS_FILE, REPORT_FILE, RESULT_FILE

__all__ = ["REPORT_FILE", "REFERENCE_LABELS_FILE", "VIEW_FILE", "build_view", "write_report", "main"]


class ReportError(FedGraphError):
    """A folder the page cannot be written from (no result.json, a file missing or unreadable)."""

    exit_code = 2


def _labels(run: Path, name: str, required: bool) -> np.ndarray | None:
    path = run / name
    if not path.exists():
        if required:
            raise ReportError(f"{str(run)!r} holds no {name}; valid: the folder of a finished run (result.json, "
                              f"labels.npy)")
        return None
    try:
        return np.load(path, allow_pickle=False).astype(np.int64)
    except (ValueError, OSError) as err:
        raise ReportError(f"{str(path)!r} cannot be read ({err}); valid: the labels file the run wrote") from None


def _result(run: Path) -> dict:
    path = run / RESULT_FILE
    if not path.is_file():
        raise ReportError(f"{str(run)!r} holds no result.json; valid: the folder of a finished run")
    try:
        return json.loads(path.read_text())
    except (ValueError, OSError) as err:
        raise ReportError(f"{str(path)!r} cannot be read ({err}); valid: the result.json a run wrote") from None


def write_report(run_dir: str | Path, summary: str = "") -> Path:
    """Write ``RUN_DIR/report.html`` from the run's files (replacing an older page); its path.
    ``summary``: the strategy's one-line description (the entry points read it from the registry)."""
    from fedgraphcore.report.page import render

    run = Path(run_dir).resolve()
    result = _result(run)
    labels = _labels(run, LABELS_FILE, required=True)
    reference = _labels(run, REFERENCE_LABELS_FILE, required=False)
    view = View.load(run / VIEW_FILE) if (run / VIEW_FILE).exists() else View("none", meta={
        "why": f"{VIEW_FILE} is missing from the run's folder"})
    result.setdefault("path", str(run / RESULT_FILE))
    text = render(result, labels, reference, view, summary)
    path = run / REPORT_FILE
    tmp = run / f".{REPORT_FILE}.tmp"
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return path


def main(argv: list[str] | None = None, summaries: dict[str, str] | None = None) -> int:
    """``python -m app.report RUN_DIR [RUN_DIR ...]``: write each run's page again; print its path.
    ``summaries``: each strategy's one-line description (:mod:`app.report.__main__` gives the registry's)."""
    args = sys.argv[1:] if argv is None else argv
    if not args or any(a in ("-h", "--help") for a in args):
        print("usage: python -m app.report RUN_DIR [RUN_DIR ...]\n\n" + (__doc__ or "").split("\n\n")[1])
        return 0 if args else 2
    try:
        for run in args:
            strategy = _result(Path(run).resolve()).get("strategy", "") if Path(run).is_dir() else ""
            print(f"report: {write_report(run, (summaries or {}).get(strategy, ''))}")
    except FedGraphError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
    return 0
