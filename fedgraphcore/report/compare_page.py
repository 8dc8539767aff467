"""The page of a comparison (:mod:`app.comparison`): one table of the methods, a figure of quality
beside agreement, and a link to every run's own page. Self-contained like a run's page."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import numpy as np

from fedgraphcore.report import figures
from fedgraphcore.report.page import STYLE, esc, image, table

QUALITY = ("acc", "nmi", "ari", "modularity")


def quality_figure(rows: Sequence[dict]) -> bytes | None:
    """Grouped bars: each run's quality figures and its agreement with its centralised version."""
    ran = [r for r in rows if r["status"] == "ran"]
    names = [m for m in QUALITY if any(m in r for r in ran)] + ["agreement"]
    if not ran:
        return None
    plt = figures.pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 0.7 + 0.16 * len(ran) * len(names)))
    height = 0.8 / len(names)
    for i, metric in enumerate(names):
        values = [r.get(metric) if isinstance(r.get(metric), (int, float)) else np.nan for r in ran]
        ax.barh(np.arange(len(ran)) + (i - (len(names) - 1) / 2) * height, values, height,
                label="agreement ARI (vs its centralised)" if metric == "agreement" else metric.upper())
    ax.set_yticks(range(len(ran)), [r["strategy"] for r in ran], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(min(0.0, np.nanmin([r.get("modularity", 0) or 0 for r in ran])), 1.0)
    ax.legend(fontsize=7, loc="lower right", framealpha=0.7)
    ax.tick_params(labelsize=7)
    fig.subplots_adjust(left=0.22, right=0.98, top=0.97, bottom=0.08)
    return figures.png(fig)


def render(dataset: str, rows: Sequence[dict], out: Path) -> str:
    """The whole page; links to each run's page relative to ``out`` (the page's folder)."""
    ran = [r for r in rows if r["status"] == "ran"]
    head = ("strategy", "split", "quality", "agreement ARI", "verdict", "seconds", "MB", "privacy", "page")
    body = []
    for r in ran:
        link = os.path.relpath(r["report"], out) if r.get("report") else None
        body.append("<tr>" + "".join(f"<td>{esc(v)}</td>" for v in (
            r["strategy"], r["partitioner"], r["quality"], _number(r.get("agreement")), r.get("verdict") or "-",
            _number(r["time_s"], 2), _number(r["megabytes"], 3), r["privacy"]))
            + (f'<td><a href="{esc(link)}">report</a></td>' if link else "<td>-</td>") + "</tr>")
    parts = [f"<h1>Methods compared on {esc(dataset)}</h1>",
             "<p>Quality is measured against the ground truth (ACC, NMI, ARI) or, without one, as the graph's "
             "modularity. Agreement ARI compares each federated clustering with the same method run centrally on "
             "the pooled data: 1 means the federation changed nothing, whatever the quality.</p>",
             "<table><tr>" + "".join(f"<th>{esc(h)}</th>" for h in head) + "</tr>" + "".join(body) + "</table>"]
    drawn = quality_figure(rows)
    if drawn is not None:
        parts.append(image(drawn, "quality and agreement by method", "quality figures and agreement with the "
                                                                      "centralised version, per method"))
    others = [(r["strategy"], r["status"], r["reason"]) for r in rows if r["status"] != "ran"]
    if others:
        parts += ["<h2>Not run</h2>", table(("strategy", "why not", "detail"), others)]
    return (f"<!doctype html><html lang=en><head><meta charset=utf-8><meta name=viewport "
            f"content='width=device-width,initial-scale=1'><title>compare: {esc(dataset)}</title>"
            f"<style>{STYLE}</style></head><body>{''.join(parts)}</body></html>\n")


def _number(value, digits: int = 3) -> str:
    return f"{value:.{digits}f}" if isinstance(value, (int, float)) else "-"
