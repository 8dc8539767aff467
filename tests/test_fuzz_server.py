"""A fuzzing malicious server finds no member row in any strategy (tests/fuzz_server.py).

For every strategy, the messages an honest run sends member 0 are replayed to a fresh member in
seeded random order, repeated, with crafted arrays of the recorded shapes; whatever the member
answers is searched for its rows as in tests/test_malicious_server.py. Under the default node
policy none may be found, no statistic may sum fewer than ``min-rows`` of its rows, and at most
one label reply a run may come back. fedsc and fedspectral-plus keep their built-in ``min-rows``
of 1 (docs/security.md: their papers' noise-free row images run by default): they are fuzzed
noised under the default policy, and noise-free under a node asking ``min-rows = 5``.

The default suite runs a few short sequences per strategy; ``-m slow`` and
``benchmarks/malicious_server.py`` run a bigger campaign.
"""

from __future__ import annotations

import pytest

from fuzz_server import fuzz, rows_floor, vocabulary

SBM = {"dataset": "sbm", "sbm.nodes": 60, "sbm.features": 8, "sbm.blocks": 3, "sbm.p-in": 0.3, "sbm.p-out": 0.02,
       "reference": False, "num-clients": 3, "seed": 1, "num-clusters": 3}
ROWS_PROTECTED = {"min-rows": 5}
KCAGC = {"sbm.features": 12, "kcagc.mode": "paper", "kcagc.embedding": "projection-unit", "kcagc.restarts": 1,
         "kcagc.iterations": 2, "kcagc.local-restarts": 1}
LABEL_STEPS = {"fedkmeans": "kmeans_assign", "fedavg-dmon": "dmon_assign", "fedspectral": "fedspectral_local",
               "kcagc": "kcagc_local", "kcagc-basic": "kcagc_local"}

#: (case, strategy, run-config, node policy)
CASES = [
    # filter-order 0: the Lloyd steps; the default filter-order 4 (its boundary set-up and hops first) is slow
    ("fedkmeans-filter0", "fedkmeans", {"num-rounds": 3, "fedkmeans.filter-order": 0}, {}),
    pytest.param("fedkmeans-filter4", "fedkmeans", {"num-rounds": 3, "fedkmeans.filter-order": 4}, {},
                 marks=pytest.mark.slow),
    pytest.param("fedkmeans-secure-filter0", "fedkmeans", {"num-rounds": 3, "fedkmeans.secure": True,
                                                           "fedkmeans.filter-order": 0}, {},
                 marks=pytest.mark.slow),  # masked sums: tests/test_malicious_server.py runs them in the default set
    ("kcagc", "kcagc", KCAGC, {}),
    pytest.param("kcagc-basic", "kcagc-basic", KCAGC, {}, marks=pytest.mark.slow),  # kcagc's client, fewer steps
    ("fedspectral", "fedspectral", {}, {}),
    ("fedspectral-plus-noised", "fedspectral-plus", {"fedspectral-plus.mode": "paper", "fedspectral-plus.rounds": 2,
                                                     "fedspectral-plus.noise-multiplier": 1.0}, {}),
    ("fedspectral-plus-min-rows", "fedspectral-plus", {"fedspectral-plus.block": 60}, ROWS_PROTECTED),
    ("fedsc-dp", "fedsc", {"fedsc.landmarks": 20, "fedsc.sigma": 3.0, "fedsc.dp-epsilon": 8.0, "num-rounds": 2}, {}),
    ("fedsc-min-rows", "fedsc", {"fedsc.landmarks": 60, "num-rounds": 2}, ROWS_PROTECTED),
    ("fedavg-dmon", "fedavg-dmon", {"num-rounds": 2, "fedavg-dmon.local-epochs": 1, "fedavg-dmon.hidden": 4,
                                    "partition.boundary": False}, {}),
    ("gw-ldp", "gw-ldp", {"partitioner": "khop", "khop.hops": 1, "khop.centres": 12, "gw-ldp.model": "gin",
                          "num-rounds": 1, "gw-ldp.local-epochs": 1, "gw-ldp.epsilon": "inf", "gw-ldp.svc": False},
     {}),
]


def campaign(case, strategy, keys, policy, sequences, length, monkeypatch, tmp_path):
    raw = {**SBM, "strategy": strategy, **keys}
    words = vocabulary(raw, policy, tmp_path / "honest")
    assert words, f"{case}: the honest run sent member 0 nothing"
    return fuzz(raw, policy, words, sequences, length, seed=0, monkeypatch=monkeypatch)


def check(outcome, strategy, policy, sequences):
    assert not outcome.found, "the server read member rows:\n  " + "\n  ".join(outcome.found)
    assert outcome.fewest_rows is None or outcome.fewest_rows >= rows_floor(policy)
    label = LABEL_STEPS.get(strategy)
    assert label is None or outcome.answered[label] <= sequences  # one label reply a run


def plain(cases) -> list[tuple]:
    """The cases as (case, strategy, run-config, policy) tuples, marks left off."""
    return [tuple(c.values) if hasattr(c, "values") else c for c in cases]


def ids(cases) -> list[str]:
    return [c[0] for c in plain(cases)]


@pytest.mark.parametrize("case, strategy, keys, policy", CASES, ids=ids(CASES))
def test_a_fuzzing_server_finds_no_member_row(case, strategy, keys, policy, monkeypatch, tmp_path):
    outcome = campaign(case, strategy, keys, policy, 2, 10, monkeypatch, tmp_path)
    check(outcome, strategy, policy, 2)
    assert outcome.messages == 20 and sum(outcome.answered.values()) > 0


@pytest.mark.slow
@pytest.mark.parametrize("case, strategy, keys, policy", plain(CASES), ids=ids(CASES))
def test_a_longer_fuzzing_campaign_finds_no_member_row(case, strategy, keys, policy, monkeypatch, tmp_path):
    outcome = campaign(case, strategy, keys, policy, 12, 30, monkeypatch, tmp_path)
    check(outcome, strategy, policy, 12)


def test_the_fuzzer_finds_rows_where_the_defence_is_off(monkeypatch, tmp_path):
    """The harness finds what it is meant to find: a node that allows statistics of one row
    (``min-rows = 1``) sends its rows as hello centres when the run asks for one cluster a row."""
    outcome = campaign("fedkmeans", "fedkmeans", {"num-clusters": 20, "num-rounds": 2}, {"min-rows": 1}, 1, 4,
                       monkeypatch, tmp_path)
    assert any("hello/centres" in leak for leak in outcome.found), outcome.found
