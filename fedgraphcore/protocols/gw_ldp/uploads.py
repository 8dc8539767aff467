"""Checks of the clients' replies beyond their shapes: what an honest client can send."""

from __future__ import annotations

import math

import numpy as np

from fedgraphcore.privacy.ldp import default_m
from fedgraphcore.wire import whole_number

from .embeddings import graph_epsilon
from .wire import SPLIT_TEST, SPLIT_TRAIN, SPLIT_VAL


#: how far a float embedding row's sum may be from 1 (torch's float32 softmax, cast to float64)
SOFTMAX_ATOL = 1e-4


def describe_problem(values: dict) -> str | None:
    """What is wrong with one client's hello figures (``None``: nothing):
    ``in_dim`` and ``graphs`` are whole numbers >= 1 (a client without graphs
    refuses), ``train`` a whole number from 0 to ``graphs``."""
    counts = {name: whole_number(values[name]) for name in ("in_dim", "graphs", "train")}
    for name in ("in_dim", "graphs"):
        if counts[name] is None or counts[name] < 1:
            return f"{name}={values[name]!r}; valid: a whole number >= 1"
    if counts["train"] is None or not 0 <= counts["train"] <= counts["graphs"]:
        return f"train={values['train']!r}; valid: a whole number from 0 to its {counts['graphs']} graphs"
    return None


def embedding_upload_problem(arrays: dict, graphs: int, num_classes: int, epsilon: float) -> str | None:
    """What is wrong with one client's ``gw_embed`` upload (``None``: nothing).

    ``graphs``: how many graphs the client described; ``epsilon``: the run's
    ``gw-ldp.epsilon``. Below inf the embeddings must be Algorithm 1's codes:
    in {-1, 0, 1} with exactly ``m = default_m(graph_epsilon(n, epsilon), d)``
    non-zeros per row of a size-n graph (:func:`encode_graph`), so an unencoded
    or all-zero upload is not recorded as noised; at inf softmax rows (entries
    >= 0 summing to 1). Labels are -1 (unknown; always for test graphs) or a
    class below ``num_classes``, and the train/validation labels are the
    evaluation labels."""
    return (_layout_problem(arrays, graphs) or _embedding_problem(arrays, epsilon)
            or _label_problem(arrays, num_classes))


def _layout_problem(arrays: dict, graphs: int) -> str | None:
    """One size, id, split code and label pair per described graph; sizes >= 1 adding up to the rows."""
    sizes = arrays["sizes"].astype(np.int64)
    if sizes.shape != (graphs,):
        return f"{sizes.size} graph sizes for the {graphs} graphs it described"
    for name in ("graph_ids", "split", "labels", "eval_labels"):
        if arrays[name].shape != (graphs,):
            return f"'{name}' has shape {arrays[name].shape}, expected ({graphs},)"
    emb = arrays["embeddings"]
    # Bounding every size first keeps the sum from wrapping around int64 onto the row count.
    if (sizes < 1).any() or (sizes > len(emb)).any() or sizes.sum() != len(emb):
        return (f"graph sizes from {sizes.min()} to {sizes.max()} (each from 1 to {len(emb)} expected) "
                f"sum to {sizes.sum()} for {len(emb)} embedding rows")
    return None


def _embedding_problem(arrays: dict, epsilon: float) -> str | None:
    """Softmax rows at ``epsilon`` inf, else Algorithm 1's codes with exactly m non-zeros per row."""
    emb, sizes = arrays["embeddings"], arrays["sizes"].astype(np.int64)
    rows = np.repeat(np.arange(sizes.size), sizes)  # the graph of every embedding row
    if math.isinf(epsilon):
        sums = emb.sum(1)
        bad = ~(np.isfinite(emb).all(1) & (emb >= 0).all(1) & (np.abs(sums - 1) <= SOFTMAX_ATOL))
        if bad.any():
            row = int(np.argmax(bad))
            return (f"graph {arrays['graph_ids'][rows[row]]}: embedding row {row} is not a softmax row "
                    f"(min {emb[row].min():.4g}, sum {sums[row]:.6g}; expected entries >= 0 summing to 1)")
        return None
    if not np.isin(emb, (-1, 0, 1)).all():
        return "LDP codes outside {-1, 0, 1}"
    m = np.array([default_m(graph_epsilon(int(n), epsilon), emb.shape[1]) for n in sizes])
    bad = np.count_nonzero(emb, axis=1) != m[rows]
    if bad.any():
        row = int(np.argmax(bad))
        return (f"graph {arrays['graph_ids'][rows[row]]}: LDP code row {row} has "
                f"{np.count_nonzero(emb[row])} non-zeros, Algorithm 1 gives exactly m={m[rows[row]]}")
    return None


def _label_problem(arrays: dict, num_classes: int) -> str | None:
    """Distinct ids >= 0, split codes 0..2, labels in -1..k-1: -1 on test graphs, else the evaluation label."""
    ids, split = arrays["graph_ids"].astype(np.int64), arrays["split"].astype(np.int64)
    if (ids < 0).any() or np.unique(ids).size != ids.size:
        return "graph ids negative or repeated"
    if not np.isin(split, (SPLIT_TRAIN, SPLIT_VAL, SPLIT_TEST)).all():
        return f"split codes outside {SPLIT_TRAIN}, {SPLIT_VAL}, {SPLIT_TEST}"
    labels, truth = arrays["labels"].astype(np.int64), arrays["eval_labels"].astype(np.int64)
    for name, lab in (("labels", labels), ("eval_labels", truth)):
        if ((lab < -1) | (lab >= num_classes)).any():
            return f"'{name}' outside -1..{num_classes - 1}"
    test = split == SPLIT_TEST
    if (labels[test] != -1).any() or (labels[~test] != truth[~test]).any():
        return "labels of test graphs must be -1 and the others equal to eval_labels"
    return None
