"""Clustering metrics, vectorised through the (sparse) contingency table.

Every function takes plain label arrays (any integers, not necessarily
``0..k-1``) or a scipy sparse adjacency, works in O(N + nnz + k_a * k_b) time
and memory (never an N x N matrix), and returns Python floats.

Notation: ``a`` = reference / ground-truth labels, ``b`` = predicted /
candidate labels, N = number of items, ``n_ij`` = contingency table (items in
class i of ``a`` and cluster j of ``b``), ``a_i = sum_j n_ij`` and
``b_j = sum_i n_ij`` its marginals, ``C(x, 2) = x (x - 1) / 2``.

Metric definitions (see ``shared/papers/NOTES.md``):

* ACC: the one-to-one map clusters -> classes maximising ``sum n_{i, pi(i)}``
  (Hungarian algorithm, ``scipy.optimize.linear_sum_assignment``, rectangular
  tables allowed), then ``ACC = sum_i n_{i, pi(i)} / N``. Items in clusters
  left unmatched (more clusters than classes) count as errors.
* macro-F1: on the same matching, class i gets
  ``F1_i = 2 n_{i, pi(i)} / (a_i + b_{pi(i)})`` (0 if unmatched) and
  ``F1 = mean_i F1_i`` over the classes of ``y_true``. This equals
  ``sklearn.metrics.f1_score(y_true, mapped, labels=classes, average="macro")``.
* NMI: ``I(a; b) / ((H(a) + H(b)) / 2)`` (scikit-learn's default arithmetic
  normalisation, natural log; both labellings constant -> 1).
* ARI: Hubert-Arabie adjusted Rand index in scikit-learn's pair-confusion
  form, computed with exact Python integers.
* modularity: ``Q = (1/2m) sum_ij (A_ij - d_i d_j / 2m) [c_i = c_j]``
  ``= sum_c [ w_c / 2m - (vol_c / 2m)^2 ]`` with ``2m = sum_ij A_ij``,
  ``w_c = sum_{i,j in c} A_ij`` and ``vol_c = sum_{i in c} d_i``. For a
  non-symmetric A the directed form (out-degree x in-degree) is used.
* conductance (DMoN convention, Tsitsulin et al. code): total cut weight over
  total volume, ``sum_{c_i != c_j} A_ij / sum_ij A_ij`` (lower is better).
* cluster_similarity: FedSpectral's Algorithm 5, see :func:`cluster_similarity`.
* pairwise precision / recall / F1 over unordered item pairs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp
from scipy.optimize import linear_sum_assignment

__all__ = [
    "Contingency",
    "contingency",
    "accuracy",
    "macro_f1",
    "hungarian_map",
    "nmi",
    "ari",
    "modularity",
    "conductance",
    "cluster_similarity",
    "pairwise_prf",
    "agreement",
    "evaluate",
    "reference_metrics",
    "LABEL_METRICS",
    "GRAPH_METRICS",
]

LABEL_METRICS = ("acc", "nmi", "ari", "f1")
GRAPH_METRICS = ("modularity", "conductance")

# Largest dense contingency table built for the Hungarian matching (cells).
_MAX_DENSE_CELLS = 25_000_000


# ---------------------------------------------------------------------------
# input handling
# ---------------------------------------------------------------------------
def _as_labels(x: Any, name: str) -> np.ndarray:
    """Return ``x`` as a 1-D int64 array or raise a one-line ValueError."""
    arr = np.asarray(x)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D label array, got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError(f"{name} is empty; need at least one label")
    if arr.dtype.kind in "iub":
        return arr.astype(np.int64, copy=False)
    if arr.dtype.kind == "f":
        if not np.all(np.isfinite(arr)) or not np.all(arr == np.round(arr)):
            raise ValueError(f"{name} must hold integer labels, got non-integer floats")
        return arr.astype(np.int64)
    raise ValueError(f"{name} must hold integer labels, got dtype {arr.dtype}")


def _pair(a: Any, b: Any, na: str = "y_true", nb: str = "y_pred") -> tuple[np.ndarray, np.ndarray]:
    a = _as_labels(a, na)
    b = _as_labels(b, nb)
    if a.shape[0] != b.shape[0]:
        raise ValueError(f"length mismatch: {na} has {a.shape[0]} labels, {nb} has {b.shape[0]}")
    return a, b


def _encode(labels: np.ndarray) -> tuple[np.ndarray, int]:
    """Map arbitrary int labels to codes ``0..k-1`` (order of the sorted values)."""
    n = labels.shape[0]
    lo, hi = int(labels.min()), int(labels.max())
    if hi - lo <= 4 * n + 1024:  # dense range: O(N) with bincount instead of a sort
        shifted = labels - lo
        present = np.bincount(shifted, minlength=hi - lo + 1) > 0
        remap = np.cumsum(present) - 1
        return remap[shifted].astype(np.int64, copy=False), int(present.sum())
    uniq, codes = np.unique(labels, return_inverse=True)
    return codes.astype(np.int64, copy=False), int(uniq.shape[0])


@dataclass
class Contingency:
    """Sparse contingency table of two labellings.

    ``rows, cols, counts``: the nonzero cells ``n_ij``; ``a`` / ``b``: the row
    (first labelling) and column (second labelling) sums; ``n`` = N.
    """

    rows: np.ndarray
    cols: np.ndarray
    counts: np.ndarray
    a: np.ndarray
    b: np.ndarray
    n: int

    @property
    def shape(self) -> tuple[int, int]:
        return self.a.shape[0], self.b.shape[0]

    def dense(self) -> np.ndarray:
        ka, kb = self.shape
        if ka * kb > _MAX_DENSE_CELLS:
            raise ValueError(
                f"contingency table {ka} x {kb} is too large for Hungarian matching "
                f"(limit {_MAX_DENSE_CELLS} cells); reduce the number of clusters"
            )
        out = np.zeros((ka, kb), dtype=np.int64)
        out[self.rows, self.cols] = self.counts
        return out


def contingency(a: Any, b: Any) -> Contingency:
    """Sparse contingency table of labellings ``a`` (rows) and ``b`` (columns)."""
    a, b = _pair(a, b, "labels_a", "labels_b")
    ca, ka = _encode(a)
    cb, kb = _encode(b)
    key = ca * kb + cb
    if ka * kb <= 4 * a.shape[0] + 1024:
        cnt = np.bincount(key, minlength=ka * kb)
        nz = np.flatnonzero(cnt)
        counts = cnt[nz]
    else:
        nz, counts = np.unique(key, return_counts=True)
    rows, cols = np.divmod(nz, kb)
    return Contingency(
        rows=rows,
        cols=cols,
        counts=counts.astype(np.int64),
        a=np.bincount(ca, minlength=ka).astype(np.int64),
        b=np.bincount(cb, minlength=kb).astype(np.int64),
        n=int(a.shape[0]),
    )


def _sumsq(x: np.ndarray) -> int:
    """Exact ``sum x_i^2`` as a Python int (x holds counts <= N)."""
    x = x.astype(np.int64)
    return int(np.dot(x, x))  # counts <= 1e9, squares sum < 2^63 for N < 3e9


# ---------------------------------------------------------------------------
# label metrics
# ---------------------------------------------------------------------------
def hungarian_map(y_true: Any, y_pred: Any) -> dict[int, int]:
    """Optimal one-to-one map predicted cluster -> class (Hungarian, maximum overlap).

    Rectangular tables are allowed; clusters left unmatched are absent from the map.
    """
    y_true, y_pred = _pair(y_true, y_pred)
    ct = contingency(y_true, y_pred)
    r, c = linear_sum_assignment(ct.dense(), maximize=True)
    classes = np.unique(y_true)
    clusters = np.unique(y_pred)
    return {int(clusters[j]): int(classes[i]) for i, j in zip(r, c)}


def _matched(ct: Contingency) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    dense = ct.dense()
    r, c = linear_sum_assignment(dense, maximize=True)
    return r, c, dense[r, c]


def accuracy(y_true: Any, y_pred: Any) -> float:
    """Clustering accuracy after Hungarian matching: ``max_pi sum_i n_{i,pi(i)} / N``."""
    y_true, y_pred = _pair(y_true, y_pred)
    ct = contingency(y_true, y_pred)
    _, _, hits = _matched(ct)
    return float(hits.sum() / ct.n)


def macro_f1(y_true: Any, y_pred: Any) -> float:
    """Macro-F1 over the classes of ``y_true`` after Hungarian matching.

    ``F1_i = 2 n_{i,pi(i)} / (a_i + b_{pi(i)})`` for a matched class i, 0 for an
    unmatched one; the result is the mean over all classes.
    """
    y_true, y_pred = _pair(y_true, y_pred)
    ct = contingency(y_true, y_pred)
    r, c, hits = _matched(ct)
    f1 = np.zeros(ct.shape[0])
    f1[r] = 2.0 * hits / (ct.a[r] + ct.b[c])
    return float(f1.mean())


def nmi(y_true: Any, y_pred: Any) -> float:
    """Normalised mutual information, arithmetic normalisation (scikit-learn's default).

    ``I = sum_ij (n_ij/N) log(N n_ij / (a_i b_j))``, ``H(a) = -sum_i (a_i/N) log(a_i/N)``,
    ``NMI = I / ((H(a) + H(b)) / 2)``; 1 when both labellings are constant.
    """
    y_true, y_pred = _pair(y_true, y_pred)
    return _nmi(contingency(y_true, y_pred))


def _entropy(counts: np.ndarray, n: int) -> float:
    """``-sum_i (c_i/n) log(c_i/n)``, in scikit-learn's order of operations."""
    c = counts[counts > 0].astype(np.float64)
    return float(-np.sum((c / n) * (np.log(c) - np.log(n))))


def _nmi(ct: Contingency) -> float:
    ka, kb = ct.shape
    if ka == kb == 1:
        return 1.0
    if ka == 1 or kb == 1:
        return 0.0
    n = float(ct.n)
    nij = ct.counts.astype(np.float64)
    outer = ct.a[ct.rows].astype(np.int64) * ct.b[ct.cols].astype(np.int64)
    p_ij = nij / n
    log_outer = -np.log(outer.astype(np.float64)) + 2.0 * np.log(n)
    mi = p_ij * (np.log(nij) - np.log(n)) + p_ij * log_outer
    mi = np.where(np.abs(mi) < np.finfo(np.float64).eps, 0.0, mi)
    mi = float(np.clip(mi.sum(), 0.0, None))
    if mi == 0.0:
        return 0.0
    denom = 0.5 * (_entropy(ct.a, ct.n) + _entropy(ct.b, ct.n))
    return float(mi / denom)


def _pair_confusion(ct: Contingency) -> tuple[int, int, int, int]:
    """Ordered-pair confusion (tn, fp, fn, tp) exactly as scikit-learn's."""
    n = ct.n
    s = _sumsq(ct.counts)
    tp = s - n
    fp = _sumsq(ct.b) - s  # same cluster in b, different class in a
    fn = _sumsq(ct.a) - s  # same class in a, split by b
    tn = n * n - fp - fn - s
    return tn, fp, fn, tp


def ari(y_true: Any, y_pred: Any) -> float:
    """Adjusted Rand index (equal to ``sklearn.metrics.adjusted_rand_score``).

    ``ARI = 2 (tp tn - fn fp) / ((tp + fn)(fn + tn) + (tp + fp)(fp + tn))`` on the
    ordered pair-confusion counts; 1 when the two labellings induce the same pairs.
    """
    y_true, y_pred = _pair(y_true, y_pred)
    return _ari(contingency(y_true, y_pred))


def _ari(ct: Contingency) -> float:
    tn, fp, fn, tp = _pair_confusion(ct)
    if fn == 0 and fp == 0:
        return 1.0
    return float(2.0 * (tp * tn - fn * fp) / ((tp + fn) * (fn + tn) + (tp + fp) * (fp + tn)))


def cluster_similarity(reference: Any, candidate: Any) -> float:
    """FedSpectral's clusterSimilarity (Algorithm 5 of its paper), vectorised.

    The paper's loop over all ordered pairs (i, j), including i == j::

        misMatch = #{(i, j): reference[i] == reference[j] and candidate[i] != candidate[j]}
        clusterSimilarity = 1 - misMatch / N^2

    With the contingency table (rows = reference, columns = candidate) the
    number of ordered pairs kept together by the reference is ``sum_i a_i^2``
    and kept together by both is ``sum_ij n_ij^2``, so
    ``misMatch = sum_i a_i^2 - sum_ij n_ij^2 = 2 (sum_i C(a_i,2) - sum_ij C(n_ij,2))``.

    Asymmetric by design: it only penalises pairs the reference keeps together
    and the candidate splits. Merging never costs anything, so a candidate
    with a single giant cluster scores 1.0 (100%) against any reference. Always
    report it next to a symmetric agreement (ARI / NMI, see :func:`agreement`).
    """
    reference, candidate = _pair(reference, candidate, "reference", "candidate")
    ct = contingency(reference, candidate)
    return _cluster_similarity(ct)


def _cluster_similarity(ct: Contingency) -> float:
    mismatch = _sumsq(ct.a) - _sumsq(ct.counts)
    return float(1.0 - mismatch / (ct.n * ct.n))


def pairwise_prf(y_true: Any, y_pred: Any) -> tuple[float, float, float]:
    """Pairwise precision, recall and F1 over unordered item pairs.

    ``TP = sum_ij C(n_ij, 2)`` (pairs together in both), precision = TP /
    ``sum_j C(b_j, 2)`` (pairs the prediction puts together), recall = TP /
    ``sum_i C(a_i, 2)`` (pairs the truth puts together), F1 their harmonic
    mean. A side with no pairs at all (all singletons) has nothing to get
    wrong: its precision (resp. recall) is 1.0; F1 is 0.0 when p + r == 0.
    """
    y_true, y_pred = _pair(y_true, y_pred)
    ct = contingency(y_true, y_pred)
    n = ct.n
    tp = (_sumsq(ct.counts) - n) // 2
    pred_pairs = (_sumsq(ct.b) - n) // 2
    true_pairs = (_sumsq(ct.a) - n) // 2
    p = tp / pred_pairs if pred_pairs > 0 else 1.0
    r = tp / true_pairs if true_pairs > 0 else 1.0
    f = 2 * p * r / (p + r) if p + r > 0 else 0.0
    return float(p), float(r), float(f)


def agreement(reference: Any, candidate: Any) -> dict[str, float]:
    """Agreement of a candidate (federated) labelling with a reference (centralised) one.

    Returns ``{"ari", "nmi", "cluster_similarity"}``; ARI and NMI are symmetric,
    cluster_similarity is FedSpectral's one-sided score (reference = centralised).
    """
    reference, candidate = _pair(reference, candidate, "reference", "candidate")
    ct = contingency(reference, candidate)
    return {"ari": _ari(ct), "nmi": _nmi(ct), "cluster_similarity": _cluster_similarity(ct)}


# ---------------------------------------------------------------------------
# graph metrics
# ---------------------------------------------------------------------------
def _graph(adj: Any, labels: Any) -> tuple[sp.csr_matrix, np.ndarray, int]:
    if not sp.issparse(adj):
        arr = np.asarray(adj)
        if arr.ndim != 2:
            raise ValueError(f"adjacency must be a 2-D (sparse) matrix, got shape {arr.shape}")
        adj = sp.csr_matrix(arr)
    n0, n1 = adj.shape
    if n0 != n1:
        raise ValueError(f"adjacency must be square, got shape {adj.shape}")
    labels = _as_labels(labels, "labels")
    if labels.shape[0] != n0:
        raise ValueError(f"length mismatch: adjacency has {n0} nodes, labels has {labels.shape[0]}")
    codes, k = _encode(labels)
    csr = adj if isinstance(adj, sp.csr_matrix) or getattr(adj, "format", "") == "csr" else sp.csr_matrix(adj)
    if csr.nnz == 0 or float(csr.data.sum()) == 0.0:
        raise ValueError("adjacency has no edges; graph metrics need a non-empty graph")
    return csr, codes, k


def _graph_metrics(adj: Any, labels: Any) -> tuple[float, float]:
    """(modularity, conductance) from one pass over the stored entries.

    Only the intra-cluster weight needs the entries (one gather and compare);
    cluster volumes come from the n-sized degree vectors.
    """
    A, codes, k = _graph(adj, labels)
    data = A.data.astype(np.float64, copy=False)
    deg_out = np.asarray(A.sum(axis=1), dtype=np.float64).ravel()
    deg_in = np.asarray(A.sum(axis=0), dtype=np.float64).ravel()
    total = float(deg_out.sum())
    row_codes = np.repeat(codes, np.diff(A.indptr))
    w_in = float(np.dot(data, row_codes == codes[A.indices]))
    vol_out = np.bincount(codes, weights=deg_out, minlength=k)
    vol_in = np.bincount(codes, weights=deg_in, minlength=k)
    q = w_in / total - float(np.dot(vol_out, vol_in)) / (total * total)
    return float(q), float((total - w_in) / total)


def modularity(adj: Any, labels: Any) -> float:
    """Newman modularity ``Q = sum_c [ w_c / 2m - (vol_c / 2m)^2 ]``.

    ``2m = sum_ij A_ij`` (each undirected edge counted in both directions),
    ``w_c = sum_{i,j in c} A_ij``, ``vol_c = sum_{i in c} d_i``; weights are used.
    For a directed (non-symmetric) A: ``Q = sum_c [w_c / M - out_c in_c / M^2]``
    with ``M = sum A`` (networkx's directed convention). Equals
    ``networkx.community.modularity`` on graphs without self-loops.
    """
    return _graph_metrics(adj, labels)[0]


def conductance(adj: Any, labels: Any) -> float:
    """Conductance in the DMoN convention: ``sum_{c_i != c_j} A_ij / sum_ij A_ij``.

    Total cut weight over total volume summed over all clusters (the DMoN
    authors' ``metrics.conductance``); 0 = no edge leaves its cluster.
    """
    return _graph_metrics(adj, labels)[1]


# ---------------------------------------------------------------------------
# bundles
# ---------------------------------------------------------------------------
def evaluate(labels: Any, y_true: Any = None, adj: Any = None) -> dict[str, float]:
    """All metrics that apply to ``labels``.

    * with ``y_true``: ``acc, nmi, ari, f1`` on the nodes whose ``y_true`` is not -1
      (skipped if no node is labelled);
    * with a non-empty ``adj``: ``modularity, conductance`` on all nodes.
    """
    labels = _as_labels(labels, "labels")
    out: dict[str, float] = {}
    if y_true is not None:
        y = _as_labels(y_true, "y_true")
        if y.shape[0] != labels.shape[0]:
            raise ValueError(
                f"length mismatch: labels has {labels.shape[0]} entries, y_true has {y.shape[0]}"
            )
        keep = y != -1
        if keep.any():
            yk, lk = y[keep], labels[keep]
            ct = contingency(yk, lk)
            r, c, hits = _matched(ct)
            f1 = np.zeros(ct.shape[0])
            f1[r] = 2.0 * hits / (ct.a[r] + ct.b[c])
            out["acc"] = float(hits.sum() / ct.n)
            out["nmi"] = _nmi(ct)
            out["ari"] = _ari(ct)
            out["f1"] = float(f1.mean())
    if adj is not None:
        weight = float(abs(adj).sum()) if sp.issparse(adj) else float(np.abs(np.asarray(adj)).sum())
        if weight > 0:
            out["modularity"], out["conductance"] = _graph_metrics(adj, labels)
    return out


def reference_metrics(
    reference: Any, labels: Any, y_true: Any = None, adj: Any = None
) -> dict[str, Any]:
    """The ``reference`` block of result.json.

    ``evaluate(reference, y_true, adj)`` (the centralised run's own metrics) plus
    ``"agreement": agreement(reference, labels)`` (federated vs centralised).
    """
    out: dict[str, Any] = evaluate(reference, y_true=y_true, adj=adj)
    out["agreement"] = agreement(reference, labels)
    return out
