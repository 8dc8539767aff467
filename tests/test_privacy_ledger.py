"""Privacy ledger: aggregation of uploads, JSON shape, composition, call-time epsilon."""

import json
import math

import numpy as np
from opacus.accountants import RDPAccountant

from fedgraphcore.privacy.ledger import GUARANTEE_NONE, GUARANTEE_SECAGG, PrivacyLedger


def test_uploads_aggregated_with_count():
    led = PrivacyLedger()
    for _ in range(5000):
        led.add_upload("query.embed", 3, "emb", (100, 16), "int8", noised=True)
    led.add_upload("query.embed", 4, "emb", (90, 16), "int8", noised=True)
    led.add_upload("query.sum", np.int64(3), "partial", np.zeros((7, 2)).shape, "uint64", masked=True)
    ups = led.to_dict()["uploads"]
    assert len(ups) == 3
    row = next(u for u in ups if u["client"] == 3 and u["name"] == "emb")
    assert row["count"] == 5000 and row["shape"] == [100, 16] and row["noised"] and not row["masked"]
    masked = next(u for u in ups if u["name"] == "partial")
    assert masked["masked"] and masked["shape"] == [7, 2]


def test_no_dp_mechanism_gives_none():
    led = PrivacyLedger()
    led.add_mechanism("secagg", "per-client partial sums", {"scale": 2**20, "bound": 1e3}, GUARANTEE_SECAGG)
    led.add_mechanism("fedsc-noise", "Z_p", {"ratio": 0.1}, GUARANTEE_NONE)
    d = led.to_dict()
    assert d["epsilon"] is None and d["delta"] is None
    assert all(m["epsilon"] == "none" for m in d["mechanisms"])
    json.dumps(d, allow_nan=False)


def test_composition_and_call_time_epsilon():
    led = PrivacyLedger()
    acc = RDPAccountant()
    led.add_mechanism("dp-sgd", "local model updates", {"delta": 1e-5, "noise_multiplier": 1.0}, "(epsilon, delta)-DP", acc)
    led.add_mechanism("ldp-fixed", "labels", {"epsilon": 1.5}, "epsilon-LDP")
    assert led.to_dict()["epsilon"] == 1.5
    acc.step(noise_multiplier=1.0, sample_rate=0.1)
    e1 = led.to_dict()["epsilon"]
    acc.step(noise_multiplier=1.0, sample_rate=0.1)
    d = led.to_dict()
    assert d["epsilon"] > e1 > 1.5
    assert math.isclose(d["epsilon"], acc.get_epsilon(delta=1e-5) + 1.5)
    assert math.isclose(d["delta"], 1e-5)
    # re-registering a name replaces the entry
    led.add_mechanism("ldp-fixed", "labels", {"epsilon": 0.5}, "epsilon-LDP")
    assert len(led.to_dict()["mechanisms"]) == 2
    assert math.isclose(led.to_dict()["epsilon"], acc.get_epsilon(delta=1e-5) + 0.5)


def test_callable_accountant_and_json_safety():
    led = PrivacyLedger()
    led.add_mechanism("custom", "x", {"arr": np.arange(3), "inf": float("inf")}, "(epsilon, delta)-DP", lambda: (0.7, 1e-6))
    d = led.to_dict()
    s = json.dumps(d, allow_nan=False)
    assert d["epsilon"] == 0.7 and d["delta"] == 1e-6
    assert '"inf"' in s and d["mechanisms"][0]["params"]["arr"] == [0, 1, 2]
