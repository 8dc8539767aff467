"""Federated Lloyd k-means over clients holding disjoint rows.

Each round the server broadcasts the centres ``M`` (k x f); client ``c``
answers with its per-cluster sums ``S_c[j] = sum_{i in c, a(i)=j} x_i`` and
counts ``n_c[j]``; the server sets ``M[j] = sum_c S_c[j] / sum_c n_c[j]``
(an empty cluster keeps its centre). With one client this is exactly Lloyd's
algorithm on the pooled rows.

Initialisation (one extra round, as in k-FED): every client runs k-means++ on
its own rows and uploads its local centres with their sizes; the server runs
weighted k-means on the union of local centres.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from app.config import ConfigView
from app.graph_filters import filtered_features
from app.wire import ArraySpec, ReplySpec

# -- wire: the protocol's steps and what a valid reply holds ------------------------------
KMEANS_STEP = "kmeans_step"
KMEANS_ASSIGN = "kmeans_assign"

#: the arrays a client adds to its hello reply: its local k-means++ centres and their sizes
INIT_REPLY = ReplySpec(arrays={"centres": ArraySpec((None, None)), "counts": ArraySpec((None,), low=0)},
                       same_length=("centres", "counts"))


def step_reply(size: int, secure: bool) -> ReplySpec:
    """``stats``: sums, counts and inertia in one vector of ``size``; masked integers when ``secure``."""
    return ReplySpec(arrays={"stats": ArraySpec((size,), kind="u" if secure else "f", masked=secure)})


def assign_reply(k: int) -> ReplySpec:
    """The client's row ids and their labels in ``0..k-1``."""
    return ReplySpec(arrays={"node_ids": ArraySpec((None,), kind="iu", low=0, unique=True),
                             "labels": ArraySpec((None,), kind="iu", low=0, high=k)},
                     same_length=("node_ids", "labels"))


@dataclass(frozen=True)
class FedKMeansConfig(ConfigView):
    """The ``fedkmeans.*`` keys (declared in :class:`strategies.fedkmeans.FedKMeans`)."""

    prefix: ClassVar[str] = "fedkmeans"
    filter_order: int
    tol: float
    secure: bool


def local_features(x, adj, filter_order: int) -> np.ndarray:
    """A client's rows: its features, AGC-filtered ``filter_order`` times over its own subgraph."""
    return filtered_features(x, adj, filter_order)


def assign(x: np.ndarray, centres: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Nearest centre of each row and the squared distance to it."""
    d2 = (
        (x * x).sum(1)[:, None]
        - 2.0 * x @ centres.T
        + (centres * centres).sum(1)[None, :]
    )
    labels = d2.argmin(1)
    return labels, np.maximum(d2[np.arange(len(x)), labels], 0.0)


def lloyd_statistics(x: np.ndarray, centres: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """Client step: per-cluster sums (k x f), counts (k,) and inertia."""
    k = len(centres)
    labels, d2 = assign(x, centres)
    counts = np.bincount(labels, minlength=k).astype(np.float64)
    sums = np.zeros_like(centres, dtype=np.float64)
    np.add.at(sums, labels, x)
    return sums, counts, float(d2.sum())


def statistics_bound(rows: int, value_bound: float) -> float:
    """The largest |entry| of the statistics of a client with ``rows`` rows: each entry is a sum
    over its rows of one row's value (a feature, 1 for the count, a squared distance), each at most
    ``value_bound`` (and the count's 1), so the bound grows with the rows and holds at every size."""
    return max(int(rows), 1) * max(float(value_bound), 1.0)


def join_statistics(sums: np.ndarray, counts: np.ndarray, inertia: float) -> np.ndarray:
    """One vector ``[sums.ravel(), counts, inertia]``: summing these over
    clients sums each part, so it can go through one (secure) sum."""
    return np.concatenate([sums.ravel(), counts, [inertia]])


def split_statistics(stats: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, float]:
    """Inverse of :func:`join_statistics`."""
    f = (len(stats) - k - 1) // k
    return stats[: k * f].reshape(k, f), stats[k * f : k * f + k], float(stats[-1])


def update_centres(centres: np.ndarray, sums: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Server step: new centres from summed statistics; empty clusters stay put."""
    new = centres.copy()
    nonempty = counts > 0
    new[nonempty] = sums[nonempty] / counts[nonempty, None]
    return new


def local_seeds(x: np.ndarray, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Client init: k-means++ centres of the local rows and their sizes."""
    # imported here: a deployed ClientApp process, started for every message, imports this module
    from sklearn.cluster import KMeans

    k_local = min(k, len(x))
    km = KMeans(k_local, init="k-means++", n_init=1, random_state=seed).fit(x)
    return km.cluster_centers_, np.bincount(km.labels_, minlength=k_local).astype(np.float64)


def merge_seeds(centres: np.ndarray, weights: np.ndarray, k: int, seed: int) -> np.ndarray:
    """Server init: weighted k-means++ / Lloyd on the union of local centres."""
    if len(centres) < k:
        raise ValueError(f"only {len(centres)} local centres for k={k}; need at least k rows in total")
    from sklearn.cluster import KMeans

    km = KMeans(k, init="k-means++", n_init=10, random_state=seed)
    return km.fit(centres, sample_weight=weights).cluster_centers_
