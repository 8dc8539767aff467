"""Figures for results: plain data in, a PNG (or any matplotlib format) out.

* :func:`plot_metric_vs_rounds` - one line per run/strategy over protocol rounds,
  optional horizontal reference lines (e.g. the centralised value).
* :func:`plot_grouped_bars` - federated vs centralised vs isolated per setting.
* :func:`plot_scaling` - log-log lines, e.g. seconds against graph size.
* :func:`embedding_2d` + :func:`plot_embedding` - 2-D coordinates of the nodes
  (t-SNE of the features, spectral coordinates of the graph, or PCA) coloured
  by one or more labellings side by side, like the kCAGC paper's Figure 3.

matplotlib runs with the non-interactive Agg backend; every function creates
the parent directory, closes its figure and returns the written path.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import scipy.sparse as sp

#: the most bars :func:`plot_grouped_bars` draws upright in a phone-wide figure
MAX_UPRIGHT_BARS = 8

__all__ = ["plot_metric_vs_rounds", "plot_grouped_bars", "plot_scaling", "embedding_2d", "plot_embedding"]


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def _wrap(text: str, width: int = 70) -> str:
    import textwrap

    return "\n".join(textwrap.wrap(text, width)) or text


def _save(fig: Any, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    _pyplot().close(fig)
    return path


def plot_metric_vs_rounds(
    series: Mapping[str, Sequence[float]],
    path: str | Path,
    metric: str = "acc",
    rounds: Mapping[str, Sequence[float]] | None = None,
    reference: Mapping[str, float] | None = None,
    title: str | None = None,
) -> Path:
    """Line plot of ``metric`` against rounds.

    ``series``: name -> values per round; ``rounds``: name -> x values (default
    1..len); ``reference``: name -> constant drawn as a dashed horizontal line.
    """
    if not series:
        raise ValueError("series is empty; nothing to plot")
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, values in series.items():
        values = np.asarray(values, dtype=float)
        xs = np.asarray(rounds[name], dtype=float) if rounds and name in rounds else np.arange(1, len(values) + 1)
        if xs.shape != values.shape:
            raise ValueError(f"length mismatch for series {name!r}: {xs.shape[0]} rounds, {values.shape[0]} values")
        ax.plot(xs, values, marker="o" if len(values) <= 30 else None, ms=3, label=name)
    for i, (name, value) in enumerate((reference or {}).items()):
        ax.axhline(float(value), ls="--", lw=1, color=f"C{(len(series) + i) % 10}", label=name)
    ax.set_xlabel("round")
    ax.set_ylabel(metric)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    if title:
        ax.set_title(_wrap(title), fontsize=10)
    return _save(fig, path)


def plot_grouped_bars(
    groups: Sequence[str],
    series: Mapping[str, Sequence[float]],
    path: str | Path,
    ylabel: str = "",
    errors: Mapping[str, Sequence[float]] | None = None,
    title: str | None = None,
) -> Path:
    """Grouped bar chart: one group per setting, one bar per series.

    E.g. ``groups=["2 clients", "4 clients"]``,
    ``series={"federated": [...], "centralised": [...], "isolated": [...]}``;
    NaN values leave a gap. ``errors``: optional error bars per series. Over
    :data:`MAX_UPRIGHT_BARS` bars the groups run down the page (horizontal
    bars), so the figure keeps a phone screen's width however many there are.
    """
    if not groups or not series:
        raise ValueError("groups and series must be non-empty")
    for name, vals in series.items():
        if len(vals) != len(groups):
            raise ValueError(f"length mismatch for series {name!r}: {len(vals)} values, {len(groups)} groups")
    plt = _pyplot()
    across = len(groups) * len(series) > MAX_UPRIGHT_BARS
    size = (6.0, 1.0 + 0.22 * len(groups) * len(series) + 0.1 * len(groups)) if across else (6.0, 4.5)
    fig, ax = plt.subplots(figsize=size)
    width = 0.8 / len(series)
    pos = np.arange(len(groups))
    for i, (name, vals) in enumerate(series.items()):
        err = None if not errors or name not in errors else np.asarray(errors[name], dtype=float)
        offset = pos + (i - (len(series) - 1) / 2) * width
        if across:
            ax.barh(offset, np.asarray(vals, dtype=float), width, xerr=err, capsize=2, label=name)
        else:
            ax.bar(offset, np.asarray(vals, dtype=float), width, yerr=err, capsize=2, label=name)
    if across:
        ax.set_yticks(pos)
        ax.set_yticklabels(groups, fontsize=8)
        ax.invert_yaxis()  # the first group on top, as in the page's table
        ax.set_xlabel(ylabel)
        ax.grid(axis="x", alpha=0.3)
    else:
        ax.set_xticks(pos)
        ax.set_xticklabels(groups, rotation=20 if len(groups) > 2 else 0, ha="right" if len(groups) > 2 else "center",
                           fontsize=8)
        ax.set_ylabel(ylabel)
        ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    if title:
        ax.set_title(_wrap(title, 60), fontsize=10)
    return _save(fig, path)


def embedding_2d(
    x: Any = None,
    adj: Any = None,
    method: str = "auto",
    seed: int = 0,
    tsne_max_nodes: int = 5000,
) -> np.ndarray:
    """2-D node coordinates (n x 2).

    * ``"tsne"``: t-SNE of the features (PCA to 50 dims first), as in the
      papers' figures; O(n log n), used up to ``tsne_max_nodes``;
    * ``"spectral"``: eigenvectors 2 and 3 of ``D^-1/2 A D^-1/2`` (the first
      is the trivial ``D^1/2 1``), rows scaled by ``D^-1/2``;
    * ``"pca"``: first two principal components of the features;
    * ``"auto"``: t-SNE if features exist and n <= ``tsne_max_nodes``, else
      spectral if a graph exists, else PCA.
    """
    methods = ("auto", "tsne", "spectral", "pca")
    if method not in methods:
        raise ValueError(f"unknown embedding method {method!r}; valid choices: {', '.join(methods)}")
    if x is None and adj is None:
        raise ValueError("embedding_2d needs features x or an adjacency adj")
    n = (x.shape[0] if x is not None else adj.shape[0])
    if method == "auto":
        method = "tsne" if x is not None and n <= tsne_max_nodes else ("spectral" if adj is not None else "pca")
    if method in ("tsne", "pca"):
        if x is None:
            raise ValueError(f"method {method!r} needs features x")
        from sklearn.decomposition import PCA, TruncatedSVD

        X = x
        if X.shape[1] > 50:
            X = TruncatedSVD(50, random_state=seed).fit_transform(X) if sp.issparse(X) else PCA(50, random_state=seed).fit_transform(np.asarray(X))
        elif sp.issparse(X):
            X = X.toarray()
        X = np.asarray(X, dtype=np.float64)
        if method == "pca":
            return PCA(2, random_state=seed).fit_transform(X) if X.shape[1] > 2 else np.pad(X, ((0, 0), (0, 2 - X.shape[1])))
        from sklearn.manifold import TSNE

        return TSNE(2, random_state=seed, init="pca", perplexity=min(30.0, max(5.0, (n - 1) / 3))).fit_transform(X)
    if adj is None:
        raise ValueError("method 'spectral' needs an adjacency adj")
    from fedgraphcore.clustering import spectral_embedding

    A = sp.csr_matrix(adj, dtype=np.float64)
    kk = min(3, n)
    U, _ = spectral_embedding(A, kk, seed)  # rows unit-normalised; un-normalise for spread
    d = np.asarray(A.sum(axis=1)).ravel()
    U = U * np.where(d > 0, 1.0 / np.sqrt(np.maximum(d, 1e-300)), 0.0)[:, None]
    return U[:, 1:3] if U.shape[1] >= 3 else np.pad(U, ((0, 0), (0, max(0, 2 - U.shape[1]))))[:, :2]


def plot_embedding(
    coords: Any,
    labelings: Mapping[str, Sequence[int]] | Sequence[int],
    path: str | Path,
    title: str | None = None,
    point_size: float = 4.0,
    align: bool = True,
) -> Path:
    """Scatter of 2-D ``coords`` coloured by cluster, one panel per labelling.

    ``labelings``: name -> labels (e.g. ``{"true": y, "AGC": ref, "kCAGC": fed}``)
    or a single label array. With ``align`` the later panels' clusters are
    renamed to their Hungarian match in the first panel, so matching clusters
    share a colour.
    """
    coords = np.asarray(coords, dtype=float)
    if coords.ndim != 2 or coords.shape[1] != 2:
        raise ValueError(f"coords must be n x 2, got shape {coords.shape}")
    if not isinstance(labelings, Mapping):
        labelings = {"clusters": labelings}
    if not labelings:
        raise ValueError("labelings is empty; nothing to plot")
    plt = _pyplot()
    m = len(labelings)
    fig, axes = plt.subplots(1, m, figsize=(4 * m, 4), squeeze=False)
    first = None
    for ax, (name, labels) in zip(axes[0], labelings.items()):
        labels = np.asarray(labels)
        if labels.shape[0] != coords.shape[0]:
            raise ValueError(f"length mismatch for {name!r}: {labels.shape[0]} labels, {coords.shape[0]} points")
        _, codes = np.unique(labels, return_inverse=True)
        if first is None:
            first = codes
        elif align:
            from fedgraphcore.metrics import hungarian_map

            mapping = hungarian_map(first, codes)
            spare = iter(range(int(first.max()) + 1, int(first.max()) + 2 + int(codes.max())))
            lut = np.array([mapping[c] if c in mapping else next(spare) for c in range(int(codes.max()) + 1)])
            codes = lut[codes]
        ax.scatter(coords[:, 0], coords[:, 1], c=codes % 20, cmap="tab20", vmin=0, vmax=19, s=point_size, linewidths=0)
        ax.set_title(name)
        ax.set_xticks([])
        ax.set_yticks([])
    if title:
        fig.suptitle(_wrap(title, 40 * m), fontsize=10)
    return _save(fig, path)


def plot_scaling(
    series: Mapping[str, tuple[Sequence[float], Sequence[float]]],
    path: str | Path,
    xlabel: str,
    ylabel: str,
    title: str | None = None,
) -> Path:
    """Log-log lines: ``series`` maps a name to (x values, y values), e.g. seconds against nodes."""
    if not series:
        raise ValueError("series is empty; nothing to plot")
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, (xs, ys) in series.items():
        if len(xs) != len(ys):
            raise ValueError(f"length mismatch for series {name!r}: {len(xs)} x values, {len(ys)} y values")
        ax.plot(np.asarray(xs, dtype=float), np.asarray(ys, dtype=float), marker="o", ms=4, label=name)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    if title:
        ax.set_title(_wrap(title), fontsize=10)
    return _save(fig, path)
