"""What the server does with the GW matrix: SVC classification and clustering of the graphs.

SVC on the precomputed kernel ``exp(-gamma D)`` with C and gamma picked on the
validation split or by cross-validation (:func:`svc_select`); clustering of the
graphs by spectral clustering of that affinity or k-medoids on ``D``
(:func:`cluster_gw`).
"""

from __future__ import annotations

import numpy as np

from .wire import CLUSTERINGS, SELECTIONS, SPLIT_TEST, SPLIT_TRAIN, SPLIT_VAL


CV_FOLDS = 5
C_GRID = tuple(10.0**e for e in range(-7, 8))
GAMMA_GRID = tuple(2.0**e for e in range(-10, 11))


def normalise(dist: np.ndarray) -> np.ndarray:
    """``D / median`` of the off-diagonal entries (the gamma grid is then
    relative to a typical distance; a pure rescaling, same for all sources)."""
    off = dist[~np.eye(len(dist), dtype=bool)]
    med = float(np.median(off)) if off.size else 0.0
    return dist / med if med > 0 else dist.copy()


def svc_problem(y: np.ndarray, split: np.ndarray, selection: str) -> str | None:
    """Why :func:`svc_select` cannot run on these labels and splits (``None``: it can).
    Labels -1 (unknown) do not count."""
    if selection not in SELECTIONS:
        return f"selection={selection!r}; valid choices: {', '.join(SELECTIONS)}"
    known = y >= 0
    if np.unique(y[known & (split == SPLIT_TRAIN)]).size < 2:
        return "the training split has fewer than 2 classes"
    if selection == "validation" and not (known & (split == SPLIT_VAL)).any():
        return "no labelled validation graphs to pick C and gamma on; use selection='cv'"
    if selection == "cv":
        counts = np.unique(y[known & (split != SPLIT_TEST)], return_counts=True)[1]
        if counts.min() < CV_FOLDS:
            return (f"too few train/validation graphs per class ({counts.min()}) for {CV_FOLDS}-fold "
                    "cross-validation; use selection='validation'")
    return None


def svc_select(dist: np.ndarray, y: np.ndarray, split: np.ndarray, selection: str = "validation",
               c_grid=C_GRID, gamma_grid=GAMMA_GRID) -> dict:
    """SVC with precomputed kernel ``exp(-gamma D)``, (C, gamma) picked without the test graphs.

    ``selection="validation"`` (the paper's 7:2:1 protocol): fit on the train
    split for every (C, gamma), keep the best validation accuracy (ties: first
    in grid order). ``"cv"``: keep the best mean accuracy of a stratified
    5-fold cross-validation over the train and validation graphs together
    (less noisy than one small validation split), then refit on all of them.
    Reports the chosen model's test accuracy and predictions for every item.

    ``test_acc_grid_max`` is the best test accuracy over the whole grid (models
    fitted on the train split): what a protocol that picks (C, gamma) on the
    test graphs would report. It is an optimistic bound, never an estimate,
    kept to show how much of a published figure such a choice could explain.

    Items with label -1 (unknown) take part in no fit, selection or score; the
    model still predicts them."""
    from sklearn.svm import SVC

    problem = svc_problem(y, split, selection)
    if problem:
        raise ValueError(f"svc_select: {problem}")
    tr, va, te = (np.flatnonzero((split == s) & (y >= 0)) for s in (SPLIT_TRAIN, SPLIT_VAL, SPLIT_TEST))
    d = normalise(dist)
    (score, c, gamma, model), tests = _grid_search(d, y, tr, va, te, selection, c_grid, gamma_grid)
    k = np.exp(-gamma * d)
    fit_on = tr
    if selection == "cv":  # the chosen (C, gamma) refitted on every train and validation graph
        fit_on = np.concatenate([tr, va])
        model = SVC(C=c, kernel="precomputed").fit(k[np.ix_(fit_on, fit_on)], y[fit_on])
    pred = model.predict(k[:, fit_on])
    test = float((pred[te] == y[te]).mean()) if te.size else float("nan")
    return {"C": c, "gamma": gamma, "selection": selection, "val_acc": score, "test_acc": test,
            "test_acc_grid_max": max(tests, default=float("nan")), "predictions": pred.astype(np.int64)}


def _grid_search(d: np.ndarray, y: np.ndarray, tr: np.ndarray, va: np.ndarray, te: np.ndarray, selection: str,
                 c_grid, gamma_grid) -> tuple[tuple, list[float]]:
    """``(score, C, gamma, model fitted on tr)`` of the best (C, gamma) by :func:`svc_select`'s
    ``selection`` (the first in grid order on ties), and the test accuracy of every grid point."""
    from sklearn.model_selection import StratifiedKFold
    from sklearn.svm import SVC

    pool = np.concatenate([tr, va])
    folds = []
    if selection == "cv":
        folds = list(StratifiedKFold(CV_FOLDS, shuffle=True, random_state=0).split(pool, y[pool]))
    best, tests = None, []
    for gamma in gamma_grid:
        k = np.exp(-gamma * d)
        for c in c_grid:
            model = SVC(C=c, kernel="precomputed").fit(k[np.ix_(tr, tr)], y[tr])
            if te.size:
                tests.append(float((model.predict(k[np.ix_(te, tr)]) == y[te]).mean()))
            if selection == "validation":
                score = float((model.predict(k[np.ix_(va, tr)]) == y[va]).mean()) if va.size else 0.0
            else:
                score = float(np.mean([
                    (SVC(C=c, kernel="precomputed").fit(k[np.ix_(pool[a], pool[a])], y[pool[a]])
                     .predict(k[np.ix_(pool[b], pool[a])]) == y[pool[b]]).mean() for a, b in folds]))
            if best is None or score > best[0]:
                best = (score, c, gamma, model)
    return best, tests


def kmedoids(dist: np.ndarray, k: int, seed: int, n_init: int = 10, max_iter: int = 100) -> np.ndarray:
    """Alternating k-medoids (Voronoi iteration) on a distance matrix, k-means++
    style seeding, best of ``n_init`` by total distance to the medoids."""
    n = len(dist)
    rng = np.random.default_rng(seed)
    best_cost, best = np.inf, None
    for _ in range(n_init):
        med = [int(rng.integers(n))]
        for _ in range(1, k):
            dmin = dist[:, med].min(1) ** 2
            med.append(int(rng.choice(n, p=dmin / dmin.sum())) if dmin.sum() > 0 else int(rng.integers(n)))
        med = np.array(med)
        for _ in range(max_iter):
            labels = dist[:, med].argmin(1)
            new = med.copy()
            for j in range(k):
                members = np.flatnonzero(labels == j)
                if members.size:
                    new[j] = members[dist[np.ix_(members, members)].sum(1).argmin()]
            if np.array_equal(new, med):
                break
            med = new
        labels = dist[:, med].argmin(1)
        cost = dist[np.arange(n), med[labels]].sum()
        if cost < best_cost:
            best_cost, best = cost, labels
    return best.astype(np.int64)


def cluster_gw(dist: np.ndarray, k: int, method: str, seed: int) -> np.ndarray:
    """Cluster items from their GW matrix: spectral clustering of the
    affinity ``exp(-D / median(D))`` (zero diagonal) or k-medoids on ``D``."""
    if method not in CLUSTERINGS:
        raise ValueError(f"unknown clustering {method!r}; valid choices: " + ", ".join(CLUSTERINGS))
    if method == "kmedoids":
        return kmedoids(dist, k, seed)
    from fedgraphcore.clustering import spectral_affinity

    aff = np.exp(-normalise(dist))
    np.fill_diagonal(aff, 0.0)
    return spectral_affinity(aff, k, seed)
