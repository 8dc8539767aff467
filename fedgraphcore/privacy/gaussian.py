"""Clipped Gaussian mechanism with Opacus accounting, and the FedSC noise-ratio rule.

:class:`GaussianMechanism` clips an array in L2 norm (the whole array, or each
row) to ``clip`` and adds i.i.d. ``N(0, (noise_multiplier * clip)^2)`` noise.
Every :meth:`GaussianMechanism.apply` is one release, recorded with an Opacus
accountant (``RDPAccountant`` or ``PRVAccountant``), so :meth:`epsilon` gives
the (epsilon, delta) spent after any number of rounds.

Sensitivity and the protected unit (exact statement):

* ``per_row=False``: the protected unit is the whole array (e.g. one client's
  entire upload, client-level DP).  ``per_row=True``: one row (e.g. one
  sample / one node's feature row), assuming an individual affects one row
  only; for graph data where a node influences its neighbours' rows the
  guarantee is per row, not per node.
* ``adjacency="replace"`` (default): neighbouring inputs differ by replacing
  the unit with any other unit; after clipping the L2 sensitivity is
  ``2 * clip``; the server may see the individual noised upload.  The
  accountant is stepped with the effective noise multiplier
  ``noise_multiplier / 2``.  Requires ``sample_rate == 1`` (Opacus' subsampled
  analysis is for add/remove).
* ``adjacency="remove"``: neighbouring inputs differ by adding/removing the
  unit (its contribution becomes zero); sensitivity ``clip``, accountant
  stepped with ``noise_multiplier`` and ``sample_rate`` (Poisson sampling of
  units, Opacus' Sampled Gaussian Mechanism).  This is the standard
  DP-SGD/DP-FedAvg setting (e.g. the noised vectors are summed).

*What leaves the client:* the noised array only.  *What the server learns:*
the noised array; (epsilon, delta) bounds what it reveals about the unit.

:func:`noise_ratio_perturb` is the papers' uncalibrated rule
``M + ratio * std(M) * N(0, 1)`` (FedSC).  It is **not** a DP guarantee (no
clipping, data-dependent scale); :func:`record_noise_ratio` puts it in the
ledger as "none: heuristic noise ratio, no formal guarantee".
"""

from __future__ import annotations

import math
import warnings

import numpy as np

__all__ = [
    "GaussianMechanism",
    "clip_l2",
    "noise_ratio_perturb",
    "record_noise_ratio",
    "calibrate_noise_multiplier",
    "make_accountant",
]

_NOISE_RATIO_GUARANTEE = "none: heuristic noise ratio, no formal guarantee"


def make_accountant(kind: str):
    """Fresh Opacus accountant: ``"rdp"`` or ``"prv"``."""
    from opacus.accountants import PRVAccountant, RDPAccountant

    kind = str(kind).lower()
    if kind == "rdp":
        return RDPAccountant()
    if kind == "prv":
        return PRVAccountant()
    raise ValueError(f"accountant must be 'rdp' or 'prv', got {kind!r}")


def clip_l2(array, clip: float, per_row: bool = False) -> tuple[np.ndarray, int]:
    """Scale the array (or each row, last axis = features) to L2 norm <= clip.

    Returns ``(clipped, n_clipped)`` (number of arrays/rows that were scaled).
    """
    a = np.asarray(array, dtype=np.float64)
    if not np.all(np.isfinite(a)):
        raise ValueError("clip_l2: non-finite value in input")
    if per_row:
        if a.ndim == 0:
            raise ValueError("clip_l2: per_row needs at least one axis")
        rows = a.reshape(-1, a.shape[-1]) if a.ndim > 1 else a.reshape(1, -1)
        norms = np.linalg.norm(rows, axis=1)
        factor = np.minimum(1.0, clip / np.maximum(norms, 1e-300))
        return (rows * factor[:, None]).reshape(a.shape), int(np.count_nonzero(norms > clip))
    norm = float(np.linalg.norm(a))
    if norm > clip:
        return a * (clip / norm), 1
    return a.copy(), 0


class GaussianMechanism:
    """L2 clip + calibrated Gaussian noise; each ``apply`` is one accounted release."""

    def __init__(
        self,
        clip: float,
        noise_multiplier: float,
        sample_rate: float = 1.0,
        delta: float = 1e-5,
        accountant: str = "rdp",
        per_row: bool = False,
        adjacency: str = "replace",
    ):
        if not (clip > 0 and math.isfinite(clip)):
            raise ValueError(f"GaussianMechanism: clip must be finite and > 0, got {clip}")
        if not (noise_multiplier > 0 and math.isfinite(noise_multiplier)):
            raise ValueError(f"GaussianMechanism: noise_multiplier must be finite and > 0, got {noise_multiplier}")
        if not (0 < sample_rate <= 1):
            raise ValueError(f"GaussianMechanism: sample_rate must be in (0, 1], got {sample_rate}")
        if not (0 < delta < 1):
            raise ValueError(f"GaussianMechanism: delta must be in (0, 1), got {delta}")
        if adjacency not in ("replace", "remove"):
            raise ValueError(f"GaussianMechanism: adjacency must be 'replace' or 'remove', got {adjacency!r}")
        if adjacency == "replace" and sample_rate != 1.0:
            raise ValueError("GaussianMechanism: adjacency='replace' requires sample_rate=1 (use 'remove' for subsampling)")
        self.clip = float(clip)
        self.noise_multiplier = float(noise_multiplier)
        self.sample_rate = float(sample_rate)
        self.delta = float(delta)
        self.accountant_kind = str(accountant).lower()
        self.per_row = bool(per_row)
        self.adjacency = adjacency
        self.accountant = make_accountant(self.accountant_kind)
        self.steps = 0
        self.clipped = 0

    @property
    def sensitivity(self) -> float:
        """L2 sensitivity of the clipped release under the chosen adjacency."""
        return self.clip * (2.0 if self.adjacency == "replace" else 1.0)

    @property
    def sigma(self) -> float:
        """Standard deviation of the added noise (= noise_multiplier * clip)."""
        return self.noise_multiplier * self.clip

    @property
    def effective_noise_multiplier(self) -> float:
        """sigma / sensitivity: the multiplier the accountant is stepped with."""
        return self.sigma / self.sensitivity

    def apply(self, array, rng=None) -> np.ndarray:
        """Clip, add N(0, sigma^2) to every entry, record one release; returns float64."""
        rng = np.random.default_rng(rng)
        a, n_clipped = clip_l2(array, self.clip, self.per_row)
        out = a + rng.normal(0.0, self.sigma, size=a.shape)
        self.step()
        self.clipped += n_clipped
        return out

    def step(self, n: int = 1) -> None:
        """Record ``n`` releases without applying (e.g. noise added elsewhere)."""
        for _ in range(int(n)):
            self.accountant.step(noise_multiplier=self.effective_noise_multiplier, sample_rate=self.sample_rate)
        self.steps += int(n)

    def epsilon(self, delta: float | None = None) -> float:
        """Epsilon spent so far at ``delta`` (default: the mechanism's delta); 0 before any release."""
        if self.steps == 0:
            return 0.0
        with warnings.catch_warnings():
            # Opacus' PRV code takes log(0) for sample_rate = 1 (harmless, handled by np.where)
            warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"opacus\.accountants")
            return float(self.accountant.get_epsilon(delta=self.delta if delta is None else float(delta)))

    def params(self) -> dict:
        return {
            "clip": self.clip,
            "noise_multiplier": self.noise_multiplier,
            "sigma": self.sigma,
            "sample_rate": self.sample_rate,
            "delta": self.delta,
            "accountant": self.accountant_kind,
            "per_row": self.per_row,
            "adjacency": self.adjacency,
            "sensitivity": self.sensitivity,
            "steps": self.steps,
            "clipped": self.clipped,
        }

    def record(self, ledger, name: str, protects: str, unit: str | None = None) -> None:
        """Register in a PrivacyLedger (epsilon is read from this object at to_dict time).

        ``unit``: what one neighbouring change is (default: a row with ``per_row``,
        else the whole array). Call again after the last release to refresh
        ``steps``/``clipped`` in params.
        """
        unit = unit or ("row" if self.per_row else "array")
        ledger.add_mechanism(
            name,
            protects,
            self.params(),
            f"(epsilon, delta)-DP per {unit} ({self.adjacency} adjacency, Opacus {self.accountant_kind.upper()} accountant)",
            self,
        )


CLIENT_LEVEL = "client (its whole model update)"  # the unit of client-level DP-FedAvg


def noise_ratio_perturb(array, ratio: float, rng=None) -> np.ndarray:
    """FedSC rule: ``M + ratio * std(M) * N(0, 1)``. No formal privacy guarantee."""
    rng = np.random.default_rng(rng)
    a = np.asarray(array, dtype=np.float64)
    if ratio < 0:
        raise ValueError(f"noise ratio must be >= 0, got {ratio}")
    return a + float(ratio) * float(np.std(a)) * rng.standard_normal(a.shape)


def record_noise_ratio(ledger, name: str, protects: str, ratio: float, **extra) -> None:
    """Register the noise-ratio perturbation as carrying no formal guarantee."""
    params = {"ratio": float(ratio), "rule": "M + ratio * std(M) * N(0,1)"}
    params.update(extra)
    ledger.add_mechanism(name, protects, params, _NOISE_RATIO_GUARANTEE, None)


def calibrate_noise_multiplier(
    target_epsilon: float,
    delta: float,
    steps: int,
    sample_rate: float = 1.0,
    accountant: str = "rdp",
    adjacency: str = "replace",
    epsilon_tolerance: float = 0.01,
) -> float:
    """Noise multiplier (in units of ``clip``) reaching ``target_epsilon`` after ``steps`` releases.

    Wraps ``opacus.accountants.utils.get_noise_multiplier`` (add/remove
    adjacency); for ``adjacency="replace"`` the result is doubled (sensitivity
    ``2*clip``), matching :class:`GaussianMechanism`.
    """
    from opacus.accountants.utils import get_noise_multiplier

    if adjacency not in ("replace", "remove"):
        raise ValueError(f"adjacency must be 'replace' or 'remove', got {adjacency!r}")
    try:
        nm = get_noise_multiplier(
            target_epsilon=float(target_epsilon),
            target_delta=float(delta),
            sample_rate=float(sample_rate),
            steps=int(steps),
            accountant=str(accountant).lower(),
            epsilon_tolerance=float(epsilon_tolerance),
        )
    except ValueError as err:  # Opacus: "The privacy budget is too low." (its search for sigma gives up)
        from fedgraphcore.config import ConfigError

        raise ConfigError(f"a target epsilon of {target_epsilon:g} at delta {delta:g} over {steps} release(s) is "
                          f"too small for the accountant to calibrate noise ({err}); valid: a larger epsilon or "
                          "delta, or fewer rounds") from None
    return float(nm) * (2.0 if adjacency == "replace" else 1.0)
