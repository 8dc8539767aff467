"""Multi-bit LDP encoder: e^epsilon ratio bound (Monte Carlo), unbiasedness, clipping."""

import math

import numpy as np
import pytest

from fedgraphcore.privacy.ldp import (
    LDPAccountant,
    default_m,
    multibit_encode,
    multibit_estimate,
    multibit_probabilities,
    record_ldp,
)
from fedgraphcore.privacy.ledger import PrivacyLedger


def test_default_m():
    assert default_m(1.0, 16) == 1
    assert default_m(2.17, 16) == 1
    assert default_m(4.36, 16) == 2
    assert default_m(10.0, 3) == 3
    assert default_m(100.0, 7) == 7


def _outcome_codes(t):
    t = t.reshape(t.shape[0], -1).astype(np.int64) + 1  # {0,1,2}
    return (t * (3 ** np.arange(t.shape[1]))).sum(axis=1)


@pytest.mark.parametrize("eps,d,alpha,beta", [(1.0, 3, 0.0, 1.0), (4.4, 2, -2.0, 3.0), (7.0, 3, 0.0, 1.0)])
def test_ratio_bound_extreme_inputs(eps, d, alpha, beta):
    """Empirical P(t | row=alpha) / P(t | row=beta) over all outputs t stays within e^eps."""
    N = 300_000
    rng = np.random.default_rng(1)
    m = default_m(eps, d)
    ta, _ = multibit_encode(np.full((N, d), alpha), eps, alpha, beta, rng=rng)
    tb, _ = multibit_encode(np.full((N, d), beta), eps, alpha, beta, rng=rng)
    ca = np.bincount(_outcome_codes(ta), minlength=3**d)
    cb = np.bincount(_outcome_codes(tb), minlength=3**d)
    assert set(np.flatnonzero(ca)) == set(np.flatnonzero(cb))  # same support
    nz = ca > 0
    ratio = np.maximum(ca[nz] / cb[nz], cb[nz] / ca[nz])
    # tolerance: 5 standard errors of the log-ratio of the rarest outcome
    tol = 5 * math.sqrt(1 / ca[nz].min() + 1 / cb[nz].min())
    bound = math.exp(eps)
    assert ratio.max() <= bound * math.exp(tol), (ratio.max(), bound)
    # the bound is attained (mechanism is not trivially over-noised): all-(+1) vs all-(-1)
    assert ratio.max() >= bound * math.exp(-tol)
    # exactly m non-zeros per row, values in {-1, 0, 1}
    assert np.all((ta != 0).sum(axis=1) == m)
    assert set(np.unique(ta)) <= {-1, 0, 1}


def test_ratio_bound_would_catch_wrong_budget():
    """Negative control: encoding with eps/m replaced by eps (m=2) breaks the bound."""
    eps, d = 4.4, 2
    N = 200_000
    rng = np.random.default_rng(2)
    # eps * 2 overall == per-coordinate eps: what a bug ignoring m would produce
    ta, _ = multibit_encode(np.zeros((N, d)), 2 * eps, 0.0, 1.0, m=2, rng=rng)
    tb, _ = multibit_encode(np.ones((N, d)), 2 * eps, 0.0, 1.0, m=2, rng=rng)
    ca = np.bincount(_outcome_codes(ta), minlength=9)
    cb = np.bincount(_outcome_codes(tb), minlength=9)
    nz = (ca > 0) & (cb > 0)
    assert np.max(np.maximum(ca[nz] / cb[nz], cb[nz] / ca[nz])) > 2 * math.exp(eps)


@pytest.mark.parametrize("eps,m", [(1.0, None), (6.0, None), (6.0, 4)])
def test_estimate_is_unbiased(eps, m):
    rng = np.random.default_rng(3)
    alpha, beta = -1.0, 2.0
    rows, d, reps = 10, 8, 20_000
    x = rng.uniform(alpha, beta, (rows, d))
    X = np.tile(x, (reps, 1))
    t, stats = multibit_encode(X, eps, alpha, beta, m=m, rng=rng)
    assert stats["clipped"] == 0
    est = multibit_estimate(t, eps, alpha, beta, m=stats["m"]).reshape(reps, rows, d)
    mean = est.mean(axis=0)
    se = est.std(axis=0).max() / math.sqrt(reps)
    assert np.max(np.abs(mean - x)) < 5 * se
    assert np.abs(mean - x).mean() < 1.5 * se  # typical error ~ 0.8 se
    # wrong m in the estimate is biased (test can fail)
    if stats["m"] > 1:
        wrong = multibit_estimate(t, eps, alpha, beta, m=stats["m"] - 1).reshape(reps, rows, d).mean(axis=0)
        assert np.max(np.abs(wrong - x)) > 5 * se


def test_clipping_counted_and_estimate_targets_clipped_value():
    rng = np.random.default_rng(4)
    x = np.array([[-0.5, 0.2, 1.7, 0.9]])
    t, stats = multibit_encode(np.tile(x, (50_000, 1)), 3.0, 0.0, 1.0, rng=rng)
    assert stats["clipped_low"] == 50_000 and stats["clipped_high"] == 50_000 and stats["clipped"] == 100_000
    mean = multibit_estimate(t, 3.0, 0.0, 1.0).mean(axis=0)
    assert np.allclose(mean, np.clip(x[0], 0, 1), atol=0.08)


def test_infinite_epsilon_means_no_noise():
    x = np.random.default_rng(0).uniform(0, 1, (5, 4))
    t, stats = multibit_encode(x, math.inf, 0.0, 1.0)
    assert np.array_equal(t, x) and stats["no_noise"]
    assert np.array_equal(multibit_estimate(t, math.inf, 0.0, 1.0), x)


def test_tanh_form_equals_algorithm_1_and_does_not_overflow():
    x = np.linspace(-1.0, 2.0, 13)
    for eps, m in ((0.01, 1), (1.0, 1), (4.4, 2), (30.0, 3), (600.0, 1)):
        e = math.exp(eps / m)  # Algorithm 1 as written: 1/(e+1) + r (e-1)/(e+1), r = (x-alpha)/(beta-alpha)
        r = (x + 1.0) / 3.0
        assert np.allclose(multibit_probabilities(x, eps, -1.0, 2.0, m), 1 / (e + 1) + r * (e - 1) / (e + 1),
                           rtol=1e-12, atol=1e-15)
        t = np.array([1, 0, -1, 0])
        c = 4 * 3.0 / (2 * m) * (e + 1) / (e - 1)  # d (beta-alpha) / (2m) (e+1)/(e-1)
        assert np.allclose(multibit_estimate(t, eps, -1.0, 2.0, m), c * t + 0.5, rtol=1e-12)
    # epsilon 1e5 (math.exp(1e5) overflows): no noise left, P(+1) = r, so 0 -> -1 and 1 -> +1 always
    x = np.tile([0.0, 1.0, 0.0, 1.0], (500, 1))
    t, stats = multibit_encode(x, 1e5, 0.0, 1.0, rng=0)
    assert stats["m"] == 4 and np.array_equal(t, 2 * x.astype(np.int8) - 1)
    assert np.allclose(multibit_estimate(t, 1e5, 0.0, 1.0).mean(0), x[0])


def test_input_validation():
    with pytest.raises(ValueError, match=r"epsilon must be > 0 \(or inf\), got 0.0"):
        multibit_encode(np.zeros((2, 3)), 0.0, 0.0, 1.0)
    with pytest.raises(ValueError, match=r"finite alpha < beta, got \[1.0, 1.0\]"):
        multibit_encode(np.zeros((2, 3)), 1.0, 1.0, 1.0)
    with pytest.raises(ValueError, match=r"m must be in \[1, d=3\], got 4"):
        multibit_encode(np.zeros((2, 3)), 1.0, 0.0, 1.0, m=4)
    with pytest.raises(ValueError, match="non-finite value in input"):
        multibit_encode(np.array([[np.nan, 0, 0]]), 1.0, 0.0, 1.0)
    for m in (0, 4):  # the estimate's scale divides by m: m = 0 or m > d would be wrong, not an error
        with pytest.raises(ValueError, match=rf"multibit_estimate: m must be in \[1, d=3\], got {m}"):
            multibit_estimate(np.zeros((2, 3)), 1.0, 0.0, 1.0, m=m)
    for bad in (-1.0, float("nan"), 0.0):  # a negative or NaN budget would reach the ledger's total
        with pytest.raises(ValueError, match=r"epsilon per release must be > 0 \(or inf\)"):
            LDPAccountant(bad)
        with pytest.raises(ValueError, match=r"LDP epsilon must be > 0 \(or inf\)"):
            record_ldp(PrivacyLedger(), "ldp", "rows", bad, 0.0, 1.0, d=3, accountant=LDPAccountant(1.0))
    for n in (-3, 1.5):
        with pytest.raises(ValueError, match=rf"n must be a whole number >= 0, got {n}"):
            LDPAccountant(1.0).step(n)


def test_ledger_entry_composes():
    led = PrivacyLedger()
    acc = LDPAccountant(2.0)
    record_ldp(led, "ldp:embeddings", "node embeddings", 2.0, 0.0, 1.0, d=16, accountant=acc)
    assert led.to_dict()["epsilon"] == 0.0
    acc.step()
    acc.step()
    out = led.to_dict()
    assert out["epsilon"] == 4.0 and out["mechanisms"][0]["epsilon"] == 4.0
    assert out["mechanisms"][0]["params"]["m"] == 1
