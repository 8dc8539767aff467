"""Gaussian mechanism: clipping, noise scale, Opacus accounting, noise-ratio rule."""

import json
import math

import numpy as np
import pytest
from opacus.accountants import PRVAccountant, RDPAccountant
from opacus.accountants.utils import get_noise_multiplier

from fedgraphcore.privacy.gaussian import (
    GaussianMechanism,
    calibrate_noise_multiplier,
    clip_l2,
    noise_ratio_perturb,
    record_noise_ratio,
)
from fedgraphcore.privacy.ledger import PrivacyLedger

# Opacus internals: log(0) in the PRV code at sample_rate=1; RDP "largest alpha" hint
pytestmark = [
    pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:Optimal order is the largest alpha:UserWarning"),
]


def test_clip_whole_array_and_per_row():
    rng = np.random.default_rng(0)
    a = rng.normal(0, 10, (50, 8))
    c, n = clip_l2(a, 3.0)
    assert n == 1 and math.isclose(np.linalg.norm(c), 3.0)
    assert np.allclose(c / np.linalg.norm(c), a / np.linalg.norm(a))
    r, n = clip_l2(a, 3.0, per_row=True)
    assert n == 50 and np.allclose(np.linalg.norm(r, axis=1), 3.0)
    small = a * 1e-3
    r2, n2 = clip_l2(small, 3.0, per_row=True)
    assert n2 == 0 and np.array_equal(r2, small)


def test_noise_scale():
    mech = GaussianMechanism(clip=2.0, noise_multiplier=1.5)
    z = np.zeros((200, 500))
    out = mech.apply(z, rng=1)
    assert abs(out.std() - 3.0) < 0.03 and abs(out.mean()) < 0.02
    assert mech.steps == 1 and mech.sigma == 3.0 and mech.sensitivity == 4.0


def test_epsilon_grows_with_rounds_and_shrinks_with_noise():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(10, 4))
    for kind in ("rdp", "prv"):
        mech = GaussianMechanism(clip=1.0, noise_multiplier=2.0, delta=1e-5, accountant=kind)
        assert mech.epsilon() == 0.0
        eps = []
        for _ in range(3):
            for _ in range(5):
                mech.apply(x, rng)
            eps.append(mech.epsilon())
        assert eps[0] < eps[1] < eps[2], (kind, eps)
        by_noise = []
        for nm in (1.0, 2.0, 4.0):
            m = GaussianMechanism(clip=1.0, noise_multiplier=nm, delta=1e-5, accountant=kind)
            m.step(10)
            by_noise.append(m.epsilon())
        assert by_noise[0] > by_noise[1] > by_noise[2], (kind, by_noise)


@pytest.mark.parametrize("kind", ["rdp", "prv"])
def test_matches_opacus_directly(kind):
    steps, delta = 12, 1e-5
    # add/remove adjacency with subsampling: exactly Opacus' SGM
    mech = GaussianMechanism(clip=0.7, noise_multiplier=1.1, sample_rate=0.05, delta=delta, accountant=kind, adjacency="remove")
    direct = RDPAccountant() if kind == "rdp" else PRVAccountant()
    for _ in range(steps):
        mech.apply(np.ones(5), rng=0)
        direct.step(noise_multiplier=1.1, sample_rate=0.05)
    assert math.isclose(mech.epsilon(), direct.get_epsilon(delta=delta), rel_tol=1e-9)
    # replace adjacency: sensitivity 2*clip -> Opacus with noise_multiplier / 2
    mech_r = GaussianMechanism(clip=0.7, noise_multiplier=3.0, delta=delta, accountant=kind)
    direct_r = RDPAccountant() if kind == "rdp" else PRVAccountant()
    for _ in range(steps):
        mech_r.apply(np.ones(5), rng=0)
        direct_r.step(noise_multiplier=1.5, sample_rate=1.0)
    assert math.isclose(mech_r.epsilon(), direct_r.get_epsilon(delta=delta), rel_tol=1e-9)
    # and differs from the (wrong) add/remove accounting of the same noise
    wrong = RDPAccountant() if kind == "rdp" else PRVAccountant()
    for _ in range(steps):
        wrong.step(noise_multiplier=3.0, sample_rate=1.0)
    assert mech_r.epsilon() > 1.5 * wrong.get_epsilon(delta=delta)


def test_calibration():
    target, delta, steps = 2.0, 1e-5, 20
    nm = calibrate_noise_multiplier(target, delta, steps, sample_rate=1.0, adjacency="replace")
    base = get_noise_multiplier(target_epsilon=target, target_delta=delta, sample_rate=1.0, steps=steps, accountant="rdp", epsilon_tolerance=0.01)
    assert math.isclose(nm, 2 * base)
    mech = GaussianMechanism(clip=1.0, noise_multiplier=nm, delta=delta)
    mech.step(steps)
    assert target - 0.05 <= mech.epsilon() <= target + 1e-9
    nm_r = calibrate_noise_multiplier(target, delta, steps, sample_rate=0.1, adjacency="remove")
    m2 = GaussianMechanism(clip=1.0, noise_multiplier=nm_r, sample_rate=0.1, delta=delta, adjacency="remove")
    m2.step(steps)
    assert target - 0.05 <= m2.epsilon() <= target + 1e-9
    # a budget below what any noise multiplier Opacus searches reaches: one line naming it, not Opacus' bare error
    from fedgraphcore.config import ConfigError

    with pytest.raises(ConfigError, match=r"a target epsilon of 0.05 at delta 5e-06 over 20 release\(s\) is too "
                                          r"small for the accountant to calibrate noise .*valid: a larger epsilon"):
        calibrate_noise_multiplier(0.05, 5e-6, 20)


def test_invalid_parameters():
    with pytest.raises(ValueError, match="adjacency='replace' requires sample_rate=1"):
        GaussianMechanism(clip=1.0, noise_multiplier=1.0, sample_rate=0.5)  # replace + subsampling
    with pytest.raises(ValueError, match="clip must be finite and > 0, got 0.0"):
        GaussianMechanism(clip=0.0, noise_multiplier=1.0)
    with pytest.raises(ValueError, match="accountant must be 'rdp' or 'prv', got 'gdp-x'"):
        GaussianMechanism(clip=1.0, noise_multiplier=1.0, accountant="gdp-x")
    with pytest.raises(ValueError, match="clip_l2: non-finite value in input"):
        clip_l2(np.array([np.inf]), 1.0)


def test_noise_ratio_and_ledger():
    rng = np.random.default_rng(5)
    a = rng.normal(3.0, 2.0, (400, 250))
    out = noise_ratio_perturb(a, 0.1, rng)
    assert abs((out - a).std() - 0.1 * a.std()) < 0.005
    led = PrivacyLedger()
    record_noise_ratio(led, "fedsc:Z", "client factor Z_p each round", 0.1)
    mech = GaussianMechanism(clip=1.0, noise_multiplier=2.0, delta=1e-5)
    mech.record(led, "gaussian:C", "client coefficients C_p")
    d0 = led.to_dict()
    assert d0["epsilon"] == 0.0
    for _ in range(4):
        mech.apply(np.ones(3), rng)
    d = led.to_dict()
    json.dumps(d, allow_nan=False)
    by = {m["name"]: m for m in d["mechanisms"]}
    assert by["fedsc:Z"]["epsilon"] == "none" and by["fedsc:Z"]["guarantee"].startswith("none")
    assert math.isclose(by["gaussian:C"]["epsilon"], mech.epsilon())
    assert math.isclose(d["epsilon"], mech.epsilon()) and d["delta"] == 1e-5
    assert "fedsc:Z" in d["overall_note"]
