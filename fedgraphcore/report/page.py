"""A run's page: one self-contained HTML file (styles inline, figures as ``data:`` PNGs, no script).

:func:`render` lays out, top to bottom: the run in one header (method, data, split, parties,
verdict, quality, time, traffic, privacy), the clusters drawn, the federated clusters against the
centralised method's and the ground truth (contingency heatmaps), the rounds (the method's own
figures with what they mean, seconds and bytes per message round, who dropped), the privacy
ledger, the notes and the run's settings.
"""

from __future__ import annotations

import base64
import html
from typing import Iterable, Mapping, Sequence

import numpy as np

from fedgraphcore.progress import FIGURES
from fedgraphcore.report import figures
from fedgraphcore.report.view import View
from fedgraphcore.result import privacy_lines

STYLE = """
body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;max-width:1100px;margin:1.5em auto;
padding:0 1em;color:#222;line-height:1.45}
h1{font-size:1.5em;margin-bottom:.2em}h2{font-size:1.15em;margin-top:1.8em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.6em 0;font-size:.9em}td,th{border:1px solid #ddd;padding:.25em .6em;
text-align:left;vertical-align:top}th{background:#f4f4f4}td.n{text-align:right;font-variant-numeric:tabular-nums}
figure{margin:.8em 0}figure img{max-width:100%;height:auto}figcaption{font-size:.85em;color:#555}
.verdict{font-weight:600}.muted{color:#666;font-size:.9em}code{background:#f4f4f4;padding:0 .2em}
details summary{cursor:pointer}.row{display:flex;flex-wrap:wrap;gap:1.5em;align-items:flex-start}
table.heat td{min-width:2.5em}
"""
#: the quality metrics shown beside each other, in this order
QUALITY = ("acc", "nmi", "ari", "f1", "modularity", "conductance")
#: history keys that number a round rather than measure it
NOT_FIGURES = ("round", "level", "job", "iteration", "seed", "losses")
#: rows and columns of a contingency table at most (the largest clusters; the rest summed)
MAX_CELLS = 30


def esc(value) -> str:
    return html.escape(str(value), quote=True)


def image(data: bytes, alt: str, caption: str) -> str:
    """A figure with its PNG inline and a caption."""
    source = "data:image/png;base64," + base64.b64encode(data).decode()
    return f'<figure><img src="{source}" alt="{esc(alt)}"><figcaption>{esc(caption)}</figcaption></figure>'


def table(head: Sequence[str], rows: Iterable[Sequence], numeric: Sequence[int] = ()) -> str:
    """An HTML table (``numeric``: the columns aligned right)."""
    cells = "".join(f"<th>{esc(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f'<td{" class=n" if i in numeric else ""}>{esc(v)}</td>'
                                    for i, v in enumerate(row)) + "</tr>" for row in rows)
    return f"<table><tr>{cells}</tr>{body}</table>"


def number(value, digits: int = 4) -> str:
    return f"{value:.{digits}f}" if isinstance(value, (int, float)) and not isinstance(value, bool) else "-"


def megabytes(count: float) -> str:
    return f"{count / 1e6:.3f} MB"


# --------------------------------------------------------------------------- the header


def header(result: dict, view: View, summary: str) -> str:
    """The run in one table: what ran on what, how good, how costly, how private."""
    quality = result.get("quality") or {}
    reference = result.get("reference") or {}
    timing, comm = result["timing"], result["communication"]
    dropped = comm.get("dropped") or []
    rows = [
        ("method", f"{result['strategy']}: {summary}" if summary else result["strategy"]),
        ("centralised counterpart", reference.get("method") or "none"),
        ("data", data_line(result, view)),
        ("split", f"partitioner '{result['config'].get('partitioner')}' over {result['num_clients']} clients"),
        ("parties", f"{result['num_clients']} took part" + (f"; {len(dropped)} dropped" if dropped else
                                                            "; none dropped")),
        ("verdict", verdict_line(quality)),
        ("quality", quality_line(result)),
        ("time", f"{timing['total_s']:.2f} s in all; protocol {timing['protocol_s']:.2f} s in {timing['rounds']} "
                 "message rounds"),
        ("traffic", f"{megabytes(comm['bytes_down'])} down, {megabytes(comm['bytes_up'])} up, {comm['messages']} "
                    f"messages, {comm['secure_aggregations']} secure aggregations"),
        ("privacy", "; ".join(line.removeprefix("privacy: ") for line in privacy_lines(result.get("privacy", {})))),
    ]
    body = "".join(f'<tr><th>{esc(k)}</th><td{" class=verdict" if k == "verdict" else ""}>{esc(v)}</td></tr>'
                   for k, v in rows)
    return f"<table>{body}</table>"


def data_line(result: dict, view: View) -> str:
    meta = view.meta
    parts = [f"'{result.get('dataset_name') or result['dataset']}'"]
    for key, word in (("items", "items"), ("edges", "edges"), ("features", "feature columns"),
                      ("classes", "classes in the ground truth")):
        if meta.get(key) is not None:
            parts.append(f"{meta[key]:,} {word}")
    return ", ".join(parts)


def verdict_line(quality: Mapping) -> str:
    """The verdict with what it compares: the federated clusters with the method's own centralised
    version, not with the ground truth."""
    summary = quality.get("summary")
    if not summary:
        return "not assessed"
    return (f"{summary} (the verdict compares the federated clusters with the same method run centrally on the "
            "pooled data, not with the ground truth: see quality)")


def quality_line(result: dict) -> str:
    """Quality against the ground truth (or, without one, the graph's modularity and conductance),
    federated beside centralised."""
    metrics, reference = result.get("metrics") or {}, result.get("reference") or {}
    shown = [m for m in QUALITY[:4] if m in metrics] or [m for m in QUALITY[4:] if m in metrics]
    if not shown:
        return "no ground truth and no graph to score against"
    against = "against the ground truth" if shown[0] in QUALITY[:4] else "of the graph (no ground truth)"
    cells = ", ".join(f"{m.upper() if len(m) <= 3 else m} {number(metrics[m], 3)}"
                      + (f" (centralised {number(reference[m], 3)})" if m in reference else "") for m in shown)
    return f"{cells} {against}"


# --------------------------------------------------------------------------- clusters and agreement


def labellings(labels: np.ndarray, reference: np.ndarray | None, truth: np.ndarray | None,
               items: np.ndarray) -> dict[str, np.ndarray]:
    """The labellings drawn, each for the drawn ``items``, matched to the federated clusters' colours."""
    out = {"federated": labels[items]}
    if reference is not None:
        out["centralised"] = figures.matched(labels, reference)[items]
    if truth is not None and (truth >= 0).any():
        out["ground truth"] = figures.matched(labels, truth)[items]
    return out


def clusters_section(view: View, labels: np.ndarray, reference: np.ndarray | None) -> str:
    """The clusters drawn as the view allows, with what is drawn and what is left out."""
    if view.kind == "none":
        return f"<p class=muted>Nothing drawn: {esc(view.meta.get('why', 'no data to draw'))}.</p>"
    drawn = labellings(labels, reference, view.truth, view.sample)
    parts = [image(figures.clusters(view.xy, drawn, view.edges if view.kind == "graph" else None,
                                    point_size=18 if view.sample.size <= 300 else 6),
                   "the clusters drawn", view.meta.get("layout", "") + "; colours matched between panels")]
    if view.kind == "sample" and view.cluster_edges is not None and view.cluster_edges.size:
        sizes = np.bincount(labels[labels >= 0], minlength=view.cluster_edges.shape[0])
        parts.append(image(figures.cluster_graph(view.cluster_edges, sizes), "the cluster-level graph",
                           "the federated clusters as nodes (size: items), edges between clusters as thick as "
                           "their edge weight; the share of each cluster's edge weight that stays inside it"))
    return "".join(parts)


def agreement_section(labels: np.ndarray, reference: np.ndarray | None, truth: np.ndarray | None,
                      class_names: Sequence[str] | None) -> str:
    """Contingency tables shaded like heatmaps: federated against centralised, federated and
    centralised against the truth."""
    pairs = []
    if reference is not None:
        pairs.append((labels, reference, "federated", "centralised", None,
                      "federated against centralised: where the two clusterings agree (diagonal) and differ"))
    if truth is not None and (truth >= 0).any():
        pairs.append((labels, truth, "federated", "true class", class_names, "federated against the ground truth"))
        if reference is not None:
            pairs.append((reference, truth, "centralised", "true class", class_names,
                          "the centralised method against the ground truth"))
    if not pairs:
        return "<p class=muted>No centralised labels and no ground truth to compare with.</p>"
    tables = "".join(f"<figure>{contingency(a, b, ra, cb, names)}<figcaption>{esc(caption)}</figcaption></figure>"
                     for a, b, ra, cb, names, caption in pairs)
    return (f"<div class=row>{tables}</div><p class=muted>Items per (row, column) pair; the shade is the share of "
            "the row. Columns are matched to rows (most overlap), so agreement lies on the diagonal.</p>")


def contingency_counts(rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """How many items have each (row label, column label) pair, items without a label left out."""
    known = (rows >= 0) & (cols >= 0)
    r, c = rows[known], cols[known]
    shape = (int(r.max()) + 1 if r.size else 1, int(c.max()) + 1 if c.size else 1)
    return np.bincount(r * shape[1] + c, minlength=shape[0] * shape[1]).reshape(shape)


def column_order(table: np.ndarray) -> np.ndarray:
    """Columns matched to rows (Hungarian, maximum overlap) first, in row order, the others after."""
    from scipy.optimize import linear_sum_assignment

    rows, cols = linear_sum_assignment(table, maximize=True)
    first = cols[np.argsort(rows)]
    return np.concatenate([first, np.setdiff1d(np.arange(table.shape[1]), first)])


def capped(table: np.ndarray, names: list[str], axis: int) -> tuple[np.ndarray, list[str]]:
    """``table`` with its :data:`MAX_CELLS` - 1 largest rows (``axis`` 0) or columns, the rest summed."""
    if table.shape[axis] <= MAX_CELLS:
        return table, names
    order = np.argsort(-table.sum(axis=1 - axis), kind="stable")
    keep, rest = np.sort(order[:MAX_CELLS - 1]), order[MAX_CELLS - 1:]
    other = np.take(table, rest, axis=axis).sum(axis=axis, keepdims=True)
    return (np.concatenate([np.take(table, keep, axis=axis), other], axis=axis),
            [names[i] for i in keep] + [f"{rest.size} more"])


def contingency(rows: np.ndarray, cols: np.ndarray, row_name: str, col_name: str,
                col_names: Sequence[str] | None = None) -> str:
    """The contingency table of two labellings as an HTML table shaded by the share of each row."""
    table = contingency_counts(rows, cols)
    order = column_order(table)
    heads = [str(col_names[i]) if col_names is not None and i < len(col_names) else str(i) for i in order]
    table, row_heads = capped(table[:, order], [str(i) for i in range(table.shape[0])], 0)
    table, heads = capped(table, heads, 1)
    shares = table / np.maximum(table.sum(axis=1, keepdims=True), 1)
    head = (f"<tr><th>{esc(row_name)} \\ {esc(col_name)}</th>" + "".join(f"<th>{esc(h)}</th>" for h in heads)
            + "</tr>")
    body = "".join(f"<tr><th>{esc(name)}</th>" + "".join(
        f'<td class=n style="background:rgba(31,119,180,{share:.2f});color:{"#fff" if share > 0.6 else "#222"}">'
        f"{count:,}</td>" for count, share in zip(counts, row)) + "</tr>"
        for name, counts, row in zip(row_heads, table, shares))
    return f"<table class=heat>{head}{body}</table>"


# --------------------------------------------------------------------------- rounds


def history_series(history: Sequence[Mapping]) -> dict[str, list[tuple[float, float]]]:
    """The method's numeric figures as (round, value) points (at most ``figures.MAX_SERIES``, those
    :data:`FIGURES` explains first); a record without a round number counts one after the last."""
    found: dict[str, list[tuple[float, float]]] = {}
    for i, record in enumerate(history):
        at = record.get("round", i + 1)
        for key, value in record.items():
            if key not in NOT_FIGURES and isinstance(value, (int, float)) and not isinstance(value, bool):
                found.setdefault(key, []).append((float(at), float(value)))
    order = list(FIGURES) + list(found)
    names = sorted(found, key=order.index)
    return {name: found[name] for name in names[:figures.MAX_SERIES] if len(found[name]) > 1}


def rounds_section(result: dict) -> str:
    """The method's figures by round with their meaning, the seconds and bytes of every message
    round, and the clients dropped, rejected or back."""
    per_round = result["timing"].get("per_round") or []
    series = history_series(result.get("history") or [])
    parts = []
    if per_round or series:
        parts.append(image(figures.rounds(series, [r["action"] for r in per_round], [r["seconds"] for r in per_round],
                                          [(r["bytes_up"] + r["bytes_down"]) / 1e6 for r in per_round]),
                           "the rounds", "the method's own figures by round; then every message round's seconds "
                                         "and megabytes, coloured by step"))
    meanings = [(name, FIGURES.get(name, "the method's own figure (see its strategy page)")) for name in series]
    if meanings:
        parts.append(table(("figure", "what it is"), meanings))
    parts.append(clients_table(result["communication"]))
    return "".join(parts)


def clients_table(comm: Mapping) -> str:
    """Who dropped, whose reply was rejected, who came back; a sentence when nobody."""
    rows = [("dropped", d.get("client", "-"), d.get("round", "-"), d.get("action", "-"), d.get("reason", ""))
            for d in comm.get("dropped") or []]
    rows += [("rejected", r.get("node", "-"), r.get("round", "-"), r.get("action", "-"), r.get("reason", ""))
             for r in comm.get("rejected") or []]
    rows += [("came back", r.get("client", "-"), r.get("round", "-"), "", f"left in round {r.get('left_round')}")
             for r in comm.get("rejoined") or []]
    if not rows:
        return "<p>Every client answered every step: none dropped, none rejected.</p>"
    return table(("what", "client (or node)", "round", "step", "why"), rows)


# --------------------------------------------------------------------------- privacy


def ledger_rows(uploads: Sequence[Mapping]) -> list[tuple]:
    """One row per step and name: how many clients sent it, its shape, how often, masked, noised."""
    grouped: dict[tuple, dict] = {}
    for u in uploads:
        row = grouped.setdefault((u["action"], u["name"]), {"clients": set(), "shapes": set(), "count": 0,
                                                           "masked": u["masked"], "noised": u["noised"],
                                                           "rejected": 0})
        row["clients"].add(u["client"])
        row["shapes"].add("x".join(map(str, u["shape"])) or "scalar")
        row["count"] += int(u.get("count", 1))
        row["rejected"] += bool(u.get("rejected"))
    return [(action, name, len(r["clients"]), ", ".join(sorted(r["shapes"])[:3]), r["count"],
             "yes" if r["masked"] else "no", "yes" if r["noised"] else "no",
             "in clear" if not (r["masked"] or r["noised"]) else "protected")
            for (action, name), r in grouped.items()]


def privacy_section(privacy: Mapping) -> str:
    """The guarantee in words, the mechanisms and every upload (the ledger), grouped by step and name."""
    parts = ["<ul>" + "".join(f"<li>{esc(line.removeprefix('privacy: '))}</li>" for line in privacy_lines(privacy))
             + "</ul>"]
    mechanisms = privacy.get("mechanisms") or []
    if mechanisms:
        parts.append(table(("mechanism", "protects", "guarantee", "epsilon", "delta"),
                           [(m["name"], m["protects"], m["guarantee"], m["epsilon"], m["delta"]) for m in mechanisms]))
    if privacy.get("overall_note"):
        parts.append(f"<p class=muted>{esc(privacy['overall_note'])}</p>")
    uploads = privacy.get("uploads") or []
    if uploads:
        parts.append(table(("step", "name", "clients", "shape", "uploads", "masked", "noised", "so"),
                           ledger_rows(uploads), numeric=(2, 4)))
    return "".join(parts)


# --------------------------------------------------------------------------- the page


def notes_section(result: dict) -> str:
    quality = result.get("quality") or {}
    notes = [*quality.get("notes", []), *result.get("notes", [])]
    paper = quality.get("paper")
    if paper:
        notes.append(f"paper: {paper['source']}: {paper['reports']}; this run's {paper['metric']}: "
                     f"{number(paper['run'])}")
    if quality.get("rule"):
        notes.append(f"verdict rule: {quality['rule']}")
    return "<ul>" + "".join(f"<li>{esc(n)}</li>" for n in notes) + "</ul>"


def settings_section(config: Mapping) -> str:
    rows = [(key, value) for key, value in config.items()]
    return f"<details><summary>{len(rows)} run-config keys</summary>{table(('key', 'value'), rows)}</details>"


def render(result: dict, labels: np.ndarray, reference: np.ndarray | None, view: View, summary: str) -> str:
    """The whole page of one run (``summary``: the strategy's one-line description)."""
    title = f"{result['strategy']} on {result.get('dataset_name') or result['dataset']}"
    class_names = view.meta.get("class_names")
    sections = [
        ("The run", header(result, view, summary)),
        ("The clusters", clusters_section(view, labels, reference)),
        ("Federated, centralised and the truth", agreement_section(labels, reference, view.truth, class_names)),
        ("Rounds", rounds_section(result)),
        ("Privacy ledger: what left each client", privacy_section(result.get("privacy") or {})),
        ("Notes", notes_section(result)),
        ("Settings", settings_section(result.get("config") or {})),
    ]
    body = "".join(f"<h2>{esc(name)}</h2>{content}" for name, content in sections)
    return (f"<!doctype html><html lang=en><head><meta charset=utf-8><meta name=viewport "
            f"content='width=device-width,initial-scale=1'><title>{esc(title)}</title><style>{STYLE}</style>"
            f"</head><body><h1>{esc(title)}</h1><p class=muted>{esc(result.get('path', ''))}</p>{body}"
            "<p class=muted>Written by <code>python -m app.report RUN_DIR</code> from the run's folder "
            "(result.json, labels.npy, reference_labels.npy, report-data.npz); run it again to rewrite this page."
            "</p></body></html>\n")
