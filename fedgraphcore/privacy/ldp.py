"""Multi-bit local-DP encoder for embeddings (GW-LDP paper, Algorithm 1).

Per-row form (LPGNN's multi-bit mechanism, extended by the GW-LDP paper), see
``shared/papers/NOTES.md``.  For a row ``x`` in ``[alpha, beta]^d`` and budget
``epsilon``:

* ``m = max(1, min(d, floor(epsilon / 2.18)))`` unless given;
* sample ``m`` of the ``d`` coordinates uniformly without replacement
  (independently per row; the choice does not depend on the data);
* each sampled value becomes ``+1`` with probability
  ``P(+1) = 1/(e^(eps/m)+1) + (x-alpha)/(beta-alpha) * (e^(eps/m)-1)/(e^(eps/m)+1)``
  and ``-1`` otherwise; the other ``d - m`` coordinates are ``0``.

Each sampled coordinate is an ``eps/m``-LDP randomised response; the ``m``
coordinates compose to ``epsilon``-LDP **per row**: for any two rows ``x, x'``
and any output ``t``, ``P(t|x) <= e^epsilon P(t|x')``.  *What leaves the
client:* the int8 matrix ``t`` in ``{-1, 0, +1}`` (same shape as the input).
*What the server learns:* ``t`` only; the guarantee protects each row (one
node's embedding) separately, so releasing ``k`` rows that depend on the same
individual costs up to ``k * epsilon`` for that individual, and re-encoding
the same rows ``r`` times costs ``r * epsilon`` (tracked by
:class:`LDPAccountant`).

Unbiased estimate (server side):
``x' = d (beta-alpha) / (2m) * (e^(eps/m)+1)/(e^(eps/m)-1) * t + (alpha+beta)/2``
with ``E[x'] = x`` for every coordinate of the (clipped) input.

Inputs outside ``[alpha, beta]`` are clipped to the range first and counted
(``stats["clipped"]``); the estimate is then unbiased for the clipped value.

``epsilon = inf`` means no noise: :func:`multibit_encode` returns the input
unchanged (as float64, still clipped to ``[alpha, beta]``) and
:func:`multibit_estimate` returns its input unchanged.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = [
    "default_m",
    "multibit_encode",
    "multibit_estimate",
    "multibit_probabilities",
    "LDPAccountant",
    "record_ldp",
]

_M_DIVISOR = 2.18


def default_m(epsilon: float, d: int) -> int:
    """``max(1, min(d, floor(epsilon / 2.18)))`` (per NOTES.md)."""
    if math.isinf(epsilon):
        return int(d)
    return int(max(1, min(int(d), math.floor(float(epsilon) / _M_DIVISOR))))


def _check(epsilon: float, alpha: float, beta: float) -> None:
    if not (epsilon > 0):
        raise ValueError(f"LDP epsilon must be > 0 (or inf), got {epsilon}")
    if not (np.isfinite(alpha) and np.isfinite(beta) and beta > alpha):
        raise ValueError(f"LDP range needs finite alpha < beta, got [{alpha}, {beta}]")


def multibit_probabilities(x, epsilon: float, alpha: float, beta: float, m: int) -> np.ndarray:
    """P(+1) for sampled values ``x`` (already in [alpha, beta]).

    ``1/(e+1) + r (e-1)/(e+1)`` with ``e = e^(eps/m)`` equals ``1/2 + (r - 1/2) tanh(eps/(2m))``;
    the tanh form does not overflow at a huge epsilon (``exp`` does past ~709)."""
    r = (np.asarray(x, dtype=np.float64) - alpha) / (beta - alpha)
    return 0.5 + (r - 0.5) * math.tanh(float(epsilon) / (2.0 * m))


def multibit_encode(x, epsilon: float, alpha: float, beta: float, m: int | None = None, rng=None):
    """Encode rows of ``x`` (last axis = d) with the multi-bit mechanism.

    Returns ``(t, stats)``: ``t`` int8 in {-1, 0, +1} with the shape of ``x``
    (float64 copy of the clipped input if ``epsilon`` is inf), and ``stats``
    with ``epsilon, m, d, rows, alpha, beta, clipped, clipped_low,
    clipped_high, values`` (counts of input values outside the range).
    """
    x = np.asarray(x, dtype=np.float64)
    epsilon = float(epsilon)
    _check(epsilon, alpha, beta)
    if x.ndim == 0:
        raise ValueError("multibit_encode: input must have at least one axis (last axis = d)")
    if x.size and not np.all(np.isfinite(x)):
        raise ValueError("multibit_encode: non-finite value in input")
    d = x.shape[-1]
    rows = int(x.size // d) if d else 0
    xc = np.clip(x, alpha, beta)
    if m is None:
        m = default_m(epsilon, d)
    m = int(m)
    if not (1 <= m <= d):
        raise ValueError(f"multibit_encode: m must be in [1, d={d}], got {m}")
    stats = _multibit_stats(x, epsilon, alpha, beta, m, rows)
    if math.isinf(epsilon):
        stats["no_noise"] = True
        return xc, stats
    t = _multibit_bits(xc.reshape(rows, d), epsilon, alpha, beta, m, np.random.default_rng(rng))
    return t.reshape(x.shape), stats


def _multibit_stats(x: np.ndarray, epsilon: float, alpha: float, beta: float, m: int, rows: int) -> dict:
    """The ``stats`` of :func:`multibit_encode`: its parameters and the input values clipped below and above."""
    low = int(np.count_nonzero(x < alpha))
    high = int(np.count_nonzero(x > beta))
    return {
        "epsilon": epsilon,
        "m": m,
        "d": int(x.shape[-1]),
        "rows": rows,
        "alpha": float(alpha),
        "beta": float(beta),
        "values": int(x.size),
        "clipped": low + high,
        "clipped_low": low,
        "clipped_high": high,
    }


def _multibit_bits(X: np.ndarray, epsilon: float, alpha: float, beta: float, m: int,
                   rng: np.random.Generator) -> np.ndarray:
    """The multi-bit code of the clipped rows ``X`` (rows x d): ``m`` random columns per row get a
    +-1 bit (+1 with :func:`multibit_probabilities`), the others 0."""
    rows, d = X.shape
    if m == d:
        cols = np.broadcast_to(np.arange(d), (rows, d))
    else:
        cols = np.argpartition(rng.random((rows, d)), m - 1, axis=1)[:, :m]
    ridx = np.arange(rows)[:, None]
    p = multibit_probabilities(X[ridx, cols], epsilon, alpha, beta, m)
    bits = np.where(rng.random(p.shape) < p, 1, -1).astype(np.int8)
    t = np.zeros((rows, d), dtype=np.int8)
    t[ridx, cols] = bits
    return t


def multibit_estimate(t, epsilon: float, alpha: float, beta: float, m: int | None = None) -> np.ndarray:
    """Unbiased estimate of the (clipped) input from encoded ``t`` (last axis = d)."""
    t = np.asarray(t)
    epsilon = float(epsilon)
    _check(epsilon, alpha, beta)
    if math.isinf(epsilon):
        return t.astype(np.float64)
    d = t.shape[-1]
    m = default_m(epsilon, d) if m is None else int(m)
    if not 1 <= m <= d:
        raise ValueError(f"multibit_estimate: m must be in [1, d={d}], got {m}")
    # (e+1)/(e-1) with e = e^(eps/m) is 1/tanh(eps/(2m)), which does not overflow at a huge epsilon
    c = d * (beta - alpha) / (2.0 * m) / math.tanh(epsilon / (2.0 * m))
    return c * t.astype(np.float64) + (alpha + beta) / 2.0


class LDPAccountant:
    """Sequential composition of epsilon-LDP releases of the same rows (delta = 0).

    ``step()`` once per release of the protected rows; ``epsilon()`` is the sum.
    """

    delta = 0.0

    def __init__(self, epsilon_per_release: float):
        epsilon = float(epsilon_per_release)
        if not epsilon > 0:  # NaN fails this too
            raise ValueError(f"LDPAccountant: epsilon per release must be > 0 (or inf), got {epsilon_per_release}")
        self.epsilon_per_release = epsilon
        self.releases = 0

    def step(self, n: int = 1) -> None:
        if int(n) != n or n < 0:
            raise ValueError(f"LDPAccountant.step: n must be a whole number >= 0, got {n}")
        self.releases += int(n)

    def epsilon(self) -> float:
        return self.epsilon_per_release * self.releases


def record_ldp(
    ledger,
    name: str,
    protects: str,
    epsilon: float,
    alpha: float,
    beta: float,
    d: int,
    m: int | None = None,
    accountant: LDPAccountant | None = None,
    stats: dict | None = None,
) -> LDPAccountant:
    """Register the multi-bit encoder in a :class:`~fedgraphcore.privacy.ledger.PrivacyLedger`.

    Returns the accountant (create once, ``step()`` per release; if none is
    given a new one with one release is created).  With ``epsilon = inf`` the
    mechanism is recorded with guarantee "none: no noise (epsilon = inf)".
    """
    epsilon = float(epsilon)
    _check(epsilon, alpha, beta)
    m = default_m(epsilon, d) if m is None else int(m)
    params = {"epsilon_per_row": epsilon, "m": m, "d": int(d), "alpha": float(alpha), "beta": float(beta)}
    if stats is not None:
        params["clipped"] = int(stats.get("clipped", 0))
        params["values"] = int(stats.get("values", 0))
    if math.isinf(epsilon):
        ledger.add_mechanism(name, protects, params, "none: no noise (epsilon = inf)", None)
        return accountant or LDPAccountant(epsilon)
    if accountant is None:
        accountant = LDPAccountant(epsilon)
        accountant.step()
    ledger.add_mechanism(
        name,
        protects,
        params,
        "epsilon-LDP per row (multi-bit encoder, GW-LDP Alg. 1); epsilon composes over releases",
        accountant,
    )
    return accountant
