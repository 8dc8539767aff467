"""A member's own page: what one party of a deployment sees of its run, beside its labels.

A party that brings its own data (``dataset = 'parties'``, node config ``out-dir``) writes, when
the run's labels reach it, ``<out-dir>/run-<run id>/report.html`` beside its ``labels.csv``: its
clusters' sizes among its own items and what it sent, step by step (every array and value of
every reply its ClientApp gave, with its shape and size: its own ledger, kept in the run's
context as the replies leave). Plain HTML, no figure library: the ClientApp stays light.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
from flwr.app import ConfigRecord, Context, RecordDict

from fedgraphcore.report.page import STYLE, esc, table

SENT_STATE = "member-sent"
MEMBER_PAGE = "report.html"


def record_sent(context: Context, action: str, content: RecordDict) -> None:
    """Add what the reply ``content`` to step ``action`` carries to this member's record of the run."""
    from fedgraphcore.transport import describe

    try:
        arrays, values = describe(content)
    except Exception:  # a reply this code could not describe leaves a row saying so
        arrays, values = {"<unreadable reply>": ((), "unknown")}, {}
    rows = _sent(context)
    for name, (shape, dtype) in arrays.items():
        size = int(np.prod(shape)) * np.dtype(dtype).itemsize if dtype != "unknown" else 0
        rows.append([action, name, "x".join(map(str, shape)) or "scalar", dtype, size])
    for name, value in values.items():
        rows.append([action, name, f"{len(value)} values" if isinstance(value, list) else "scalar",
                     type(value).__name__, len(json.dumps(value, default=str))])
    context.state.config_records[SENT_STATE] = ConfigRecord({"rows": json.dumps(rows)})


def _sent(context: Context) -> list[list]:
    record = context.state.config_records.get(SENT_STATE)
    return json.loads(record["rows"]) if record is not None else []


def sent_table(rows: list[list]) -> list[tuple]:
    """One row per step and name: how often it was sent, its shape and type, its bytes in all."""
    grouped: dict[tuple[str, str], list] = {}
    for action, name, shape, dtype, size in rows:
        entry = grouped.setdefault((action, name), [action, name, set(), dtype, 0, 0])
        entry[2].add(shape)
        entry[4] += 1
        entry[5] += size
    return [(a, n, ", ".join(sorted(shapes))[:60], d, count, f"{size:,}")
            for a, n, shapes, d, count, size in grouped.values()]


def write_member_page(folder: Path, context: Context, strategy: str, labels: np.ndarray, item: str) -> Path:
    """Write ``folder/report.html`` for this member's run; its path."""
    labels = np.asarray(labels, dtype=np.int64)
    sizes = np.bincount(labels[labels >= 0]) if (labels >= 0).any() else np.zeros(0, dtype=np.int64)
    widest = max(int(sizes.max()), 1) if sizes.size else 1
    bars = [(c, f"{int(n):,}", f"<span style='display:inline-block;height:.8em;width:{200 * n / widest:.0f}px;"
                               "background:#1f77b4'></span>") for c, n in enumerate(sizes) if n]
    size_rows = "".join(f"<tr><td class=n>{c}</td><td class=n>{n}</td><td>{bar}</td></tr>" for c, n, bar in bars)
    unlabelled = int((labels < 0).sum())
    sent = sent_table(_sent(context))
    body = [f"<h1>{esc(strategy)}: this member's run</h1>",
            f"<p class=muted>run {esc(context.run_id)}, node {esc(context.node_id)}, written "
            f"{time.strftime('%Y-%m-%d %H:%M:%S')}</p>",
            f"<h2>Its clusters</h2><p>{labels.size:,} {esc(item)}s of this member"
            + (f", {unlabelled:,} without a label" if unlabelled else "") + " (labels.csv beside this page).</p>",
            f"<table><tr><th>cluster</th><th>{esc(item)}s</th><th></th></tr>{size_rows}</table>",
            "<h2>What it sent</h2><p>Every array and value of every reply this member's ClientApp gave in the run "
            "(masked uploads are ring elements the server can only sum; the run's own page says which).</p>",
            table(("step", "name", "shape", "type", "times", "bytes in all"), sent, numeric=(4, 5))
            if sent else "<p>Nothing.</p>"]
    path = Path(folder) / MEMBER_PAGE
    tmp = path.with_name(f".{MEMBER_PAGE}.tmp")
    tmp.write_text(f"<!doctype html><html lang=en><head><meta charset=utf-8><title>{esc(strategy)}: member page"
                   f"</title><style>{STYLE}</style></head><body>{''.join(body)}</body></html>\n", encoding="utf-8")
    tmp.replace(path)
    return path
