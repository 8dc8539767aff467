"""The figures of a run's page, drawn with matplotlib (Agg) as PNG bytes.

Static images, not an interactive library: the page must open anywhere offline, from a file
attached to an e-mail as well as from the run's folder, and stay small for a graph of any size;
a PNG of a capped drawing is a few tens of kB whatever the data, and needs no script to show
(docs/running.md says more). Each function takes plain arrays and returns the image's bytes.

Colours: the federated clusters take the colours of matplotlib's ``tab10`` (``tab20`` past ten) in order; another
labelling drawn beside them (the centralised method's, the ground truth) is matched to them
first (Hungarian matching on their overlap), so that a cluster and its counterpart share a
colour. Items without a label (-1) are grey.
"""

from __future__ import annotations

import io
from typing import Mapping, Sequence

import numpy as np

DPI = 80
GREY = (0.75, 0.75, 0.75, 1.0)
#: method figures drawn at most, one panel each, above the message rounds' panel
MAX_SERIES = 2


def pyplot():
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def png(fig) -> bytes:
    """``fig`` as PNG bytes; the figure is closed. Margins are set by the caller (a tight bounding
    box would draw the figure twice)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI)
    pyplot().close(fig)
    return buffer.getvalue()


def matched(reference: np.ndarray, other: np.ndarray) -> np.ndarray:
    """``other`` renumbered so that each of its clusters takes the number of the ``reference``
    cluster it overlaps most (Hungarian matching); unmatched ones take numbers after them, -1 stays."""
    from scipy.optimize import linear_sum_assignment

    other = np.asarray(other, dtype=np.int64)
    known = (reference >= 0) & (other >= 0)
    if not known.any():
        return other
    k_ref, k_other = int(reference.max()) + 1, int(other.max()) + 1
    table = np.bincount(other[known] * k_ref + reference[known], minlength=k_other * k_ref).reshape(k_other, k_ref)
    rows, cols = linear_sum_assignment(table, maximize=True)
    lut = np.full(k_other, -1, dtype=np.int64)
    lut[rows] = cols
    spare = np.flatnonzero(lut < 0)
    lut[spare] = k_ref + np.arange(spare.size)
    return np.where(other >= 0, lut[np.clip(other, 0, None)], -1)


def colours(labels: np.ndarray) -> np.ndarray:
    """An RGBA row per label: ``tab10`` by cluster number up to 10 clusters, else ``tab20`` (repeating
    past 20), grey for -1."""
    plt = pyplot()
    palette = np.asarray(plt.get_cmap("tab10" if labels.size == 0 or labels.max() < 10 else "tab20").colors)
    out = np.empty((labels.size, 4))
    out[:, :3] = palette[np.clip(labels, 0, None) % len(palette)]
    out[:, 3] = 1.0
    out[labels < 0] = GREY
    return out


def clusters(xy: np.ndarray, labellings: Mapping[str, np.ndarray], edges: np.ndarray | None = None,
             point_size: float = 12.0) -> bytes:
    """One panel per labelling (name -> labels of the drawn items), the items at ``xy``, with
    ``edges`` (pairs of item positions) as grey lines under them."""
    from matplotlib.collections import LineCollection

    plt = pyplot()
    fig, axes = plt.subplots(1, len(labellings), figsize=(3.6 * len(labellings), 3.6), squeeze=False)
    for ax, (name, labels) in zip(axes[0], labellings.items()):
        if edges is not None and edges.size:
            ax.add_collection(LineCollection(xy[edges], colors=[(0.6, 0.6, 0.6, 0.35)], linewidths=0.5, zorder=1))
        ax.scatter(xy[:, 0], xy[:, 1], c=colours(labels), s=point_size, linewidths=0, zorder=2)
        ax.set_title(name, fontsize=10)
        ax.axis("off")
        ax.autoscale_view()
    fig.subplots_adjust(left=0.01, right=0.99, bottom=0.01, top=0.9, wspace=0.04)
    return png(fig)


def cluster_graph(weights: np.ndarray, sizes: np.ndarray) -> bytes:
    """The clusters as nodes on a circle (area by size, colour as in :func:`clusters`), an edge
    between two clusters as thick as their share of the edge weight between clusters; each
    node says its size and the share of its edge weight that stays inside it."""
    plt = pyplot()
    k = weights.shape[0]
    angle = 2 * np.pi * np.arange(k) / max(k, 1)
    xy = np.column_stack([np.cos(angle), np.sin(angle)]) if k > 1 else np.zeros((1, 2))
    between = np.triu(weights, 1)
    fig, ax = plt.subplots(figsize=(4.8, 4.8))
    top = between.max() if between.size and between.max() > 0 else 1.0
    for i, j in zip(*np.nonzero(between)):
        ax.plot(xy[[i, j], 0], xy[[i, j], 1], color="0.5", alpha=0.6, lw=0.5 + 6 * between[i, j] / top, zorder=1)
    area = 100 + 1900 * np.sqrt(sizes / max(sizes.max(), 1))
    ax.scatter(xy[:, 0], xy[:, 1], s=area, c=colours(np.arange(k)), zorder=2, edgecolors="white")
    touching = weights.sum(axis=0) + weights.sum(axis=1)  # a cluster's edges: inside counted twice
    for c in range(k):
        inside = 2 * weights[c, c] / touching[c] if touching[c] else 0.0
        ax.annotate(f"{c}: {int(sizes[c]):,}\n{inside:.0%} inside", xy[c], fontsize=7, ha="center", va="center",
                    zorder=3)
    ax.set_xlim(-1.5, 1.5)
    ax.set_ylim(-1.5, 1.5)
    ax.set_aspect("equal")
    ax.axis("off")
    fig.subplots_adjust(left=0, right=1, bottom=0, top=1)
    return png(fig)


def rounds(series: Mapping[str, Sequence[tuple[float, float]]], steps: Sequence[str], seconds: Sequence[float],
           megabytes: Sequence[float]) -> bytes:
    """The method's own figures (name -> (round, value) points; a round number that falls starts a
    new line: another solve or restart), one panel each, then every message round's seconds
    (bars, coloured by step) and megabytes (a line, right axis)."""
    from matplotlib.ticker import MaxNLocator

    plt = pyplot()
    panels = len(series) + 1
    fig, axes = plt.subplots(panels, 1, figsize=(6.4, 0.4 + 1.8 * panels), squeeze=False)
    for ax, (name, points) in zip(axes[:, 0], series.items()):
        for line in _runs(points):
            ax.plot(*np.asarray(line).T, color="C0", marker="o" if len(points) <= 40 else None, ms=3)
        ax.set_ylabel(name, fontsize=8)
        ax.set_xlabel("round", fontsize=8, labelpad=1)
    names = list(dict.fromkeys(steps))
    x = np.arange(1, len(steps) + 1)
    bottom = axes[-1, 0]
    bottom.bar(x, seconds, color=[f"C{names.index(s) % 10}" for s in steps], width=1.0 if len(steps) > 60 else 0.8)
    bottom.set_ylabel("seconds (bars)", fontsize=8)
    bottom.set_xlabel("message round (a step sent to the clients)", fontsize=8, labelpad=1)
    traffic = bottom.twinx()
    traffic.plot(x, megabytes, color="black", lw=1, marker="." if len(steps) <= 40 else None)
    traffic.set_ylabel("MB up + down (line)", fontsize=8)
    handles = [plt.Rectangle((0, 0), 1, 1, color=f"C{i % 10}") for i in range(len(names))]
    bottom.legend(handles, names, fontsize=7, loc="upper left", ncol=min(len(names), 3), framealpha=0.6)
    for ax in [*axes[:, 0], traffic]:
        ax.xaxis.set_major_locator(MaxNLocator(8, integer=True))
        ax.yaxis.set_major_locator(MaxNLocator(4))
        ax.tick_params(labelsize=7)
    fig.subplots_adjust(left=0.12, right=0.88, top=0.97, bottom=0.5 / (0.4 + 1.8 * panels) + 0.04, hspace=0.55)
    return png(fig)


def _runs(points: Sequence[tuple[float, float]]) -> list[list[tuple[float, float]]]:
    """``points`` cut where the round number falls (a new solve or restart counts its rounds anew)."""
    lines: list[list[tuple[float, float]]] = []
    for point in points:
        if not lines or point[0] <= lines[-1][-1][0]:
            lines.append([])
        lines[-1].append(point)
    return lines
