"""The GW matrix's solver: POT's conditional gradient without its per-call cost gives POT's values
bit for bit (graphs' shortest paths have integer distances, so the linear programs tie often:
any other arithmetic would take other vertices there and reach other local optima)."""

from __future__ import annotations

import numpy as np
import ot
import pytest
import scipy.sparse as sp
from threadpoolctl import threadpool_limits

from fedgraphcore.protocols import gw_ldp
from fedgraphcore.protocols.gw_ldp.solver import MATRIX_CG_ITERATIONS, cg_discrepancy


def random_graph(rng: np.random.Generator, n: int) -> sp.csr_matrix:
    """A connected graph: a random tree plus a few chords."""
    rows = [(int(rng.integers(i)), i) for i in range(1, n)]
    rows += [tuple(rng.choice(n, 2, replace=False)) for _ in range(n // 4)]
    a = sp.coo_matrix((np.ones(len(rows)), tuple(np.array(rows).T)), shape=(n, n)).tocsr()
    return ((a + a.T) > 0).astype(np.float64)


@pytest.mark.parametrize("alpha", [1.0, 0.5])
def test_the_conditional_gradient_gives_pots_values_bit_for_bit(alpha):
    rng = np.random.default_rng(3)
    with threadpool_limits(limits=1):
        for _ in range(15):
            n, m = (int(v) for v in rng.integers(6, 30, size=2))
            c1, c2 = (gw_ldp.shortest_path_matrix(random_graph(rng, k)) for k in (n, m))
            p, q = np.full(n, 1 / n), rng.dirichlet(np.ones(m))
            if alpha < 1:
                x1, x2 = np.eye(3)[rng.integers(3, size=n)], np.eye(3)[rng.integers(3, size=m)]
                cost = ot.dist(x1, x2)
                pot = ot.gromov.fused_gromov_wasserstein2(cost, c1, c2, p, q, "square_loss", symmetric=True,
                                                          alpha=alpha, max_iter=10_000)
                assert gw_ldp.gw_pair(c1, c2, p, q, x1=x1, x2=x2, alpha=alpha) == float(pot)
            else:
                pot = ot.gromov.gromov_wasserstein2(c1, c2, p, q, "square_loss", symmetric=True, max_iter=10_000)
                assert cg_discrepancy(c1, c2, p, q) == float(pot)
                assert gw_ldp.gw_pair(c1, c2, p, q, solver="pot") == float(pot)


def test_a_capped_iteration_is_pots_capped_iteration_and_bounds_the_converged_value():
    rng = np.random.default_rng(4)
    with threadpool_limits(limits=1):
        for _ in range(8):
            c1, c2 = (gw_ldp.shortest_path_matrix(random_graph(rng, int(k))) for k in rng.integers(8, 30, size=2))
            converged = gw_ldp.gw_pair(c1, c2)
            for cap in (1, MATRIX_CG_ITERATIONS):
                capped = ot.gromov.gromov_wasserstein2(c1, c2, symmetric=True, max_iter=cap)
                assert gw_ldp.gw_pair(c1, c2, max_iter=cap) == pytest.approx(float(capped), rel=1e-12)
                assert gw_ldp.gw_pair(c1, c2, max_iter=cap) >= converged


@pytest.mark.parametrize("alpha", [1.0, 0.5])
def test_a_matrix_solving_equal_sizes_in_stacks_gives_each_pairs_own_values_bit_for_bit(alpha):
    rng = np.random.default_rng(7)
    if alpha < 1:  # merged class-score spaces of few sizes, one of a single point
        spaces = [gw_ldp.embedding_space(rng.dirichlet(np.ones(2), int(n)), features=True, decimals=1)
                  for n in rng.integers(2, 9, 13)] + [gw_ldp.embedding_space(np.full((4, 2), 0.5), features=True)]
    else:  # shortest paths: integer distances, where the linear programs tie
        spaces = [gw_ldp.shortest_path_matrix(random_graph(rng, int(n))) for n in rng.choice([6, 7, 9], 14)]
    items = [s if isinstance(s, tuple) else (s, np.full(len(s), 1 / len(s)), None) for s in spaces]
    assert len({len(s[1]) for s in items}) < 8  # stacks of several pairs
    with threadpool_limits(limits=1):
        for cap in (MATRIX_CG_ITERATIONS, 10_000):
            d = gw_ldp.gw_matrix(spaces, workers=1, max_iter=cap, alpha=alpha)
            assert all(d[i, j] == gw_ldp.gw_pair(a[0], b[0], a[1], b[1], cap, a[2], b[2], alpha)
                       for i, a in enumerate(items) for j, b in enumerate(items) if i < j)


def test_the_run_config_defaults_to_the_capped_matrix_and_an_unknown_solver_is_refused():
    defaults = {p.key: p.default for p in gw_ldp.GWLDPConfig.params()}
    assert defaults["gw-ldp.gw-max-iter"] == MATRIX_CG_ITERATIONS
    assert defaults["gw-ldp.merge-decimals"] == gw_ldp.AUTO_MERGE_DECIMALS
    assert gw_ldp.merge_decimals(gw_ldp.AUTO_MERGE_DECIMALS, "classes") == gw_ldp.MATRIX_MERGE_DECIMALS
    assert gw_ldp.merge_decimals(gw_ldp.AUTO_MERGE_DECIMALS, "hidden") == gw_ldp.EXACT_MERGE_DECIMALS
    assert gw_ldp.merge_decimals(3, "hidden") == 3
    rng = np.random.default_rng(4)
    c1, c2 = (gw_ldp.shortest_path_matrix(random_graph(rng, k)) for k in (12, 15))
    with pytest.raises(ValueError, match="unknown GW solver 'sinkhorn'; valid choices: cg, pot"):
        gw_ldp.gw_pair(c1, c2, solver="sinkhorn")


def test_coarser_merge_decimals_put_the_rows_on_a_grid_whose_weights_add_up():
    rng = np.random.default_rng(6)
    h = rng.dirichlet(np.ones(2), size=150)  # 2-class softmax rows: a segment
    rows, w = gw_ldp.merge_duplicates(h, 2)
    assert len(rows) <= 101 and w.sum() == pytest.approx(1.0) and np.array_equal(rows, np.round(rows, 2))
    cell = np.round(h, 2)
    assert all(w[k] * 150 == pytest.approx(np.all(cell == rows[k], axis=1).sum()) for k in range(len(rows)))
    # LDP codes are on every grid: the merge stays exact
    codes = rng.integers(-1, 2, size=(50, 4)).astype(np.float64)
    for decimals in (0, gw_ldp.EXACT_MERGE_DECIMALS):
        assert np.array_equal(gw_ldp.merge_duplicates(codes, decimals)[0], np.unique(codes, axis=0))
    # the coarse space approximates the exact one: fused GW between them far below a different graph's
    exact, coarse = (gw_ldp.embedding_space(h, features=True, decimals=d) for d in (gw_ldp.EXACT_MERGE_DECIMALS, 2))
    other = gw_ldp.embedding_space(rng.dirichlet([1.0, 4.0], size=100), features=True)
    near = gw_ldp.gw_pair(exact[0], coarse[0], exact[1], coarse[1], x1=exact[2], x2=coarse[2], alpha=0.5)
    far = gw_ldp.gw_pair(exact[0], other[0], exact[1], other[1], x1=exact[2], x2=other[2], alpha=0.5)
    assert near < 0.01 * far
