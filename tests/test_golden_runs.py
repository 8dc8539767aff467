"""Every strategy on a small dataset, seed 0: the labels.csv bytes (their sha256) and the figures of
result.json (quality, reference, communication, privacy) equal the ones stored in
``golden_runs.json``. A change that moves code and means no change of behaviour keeps them.

Each run sets every run-config key it reads explicitly (``golden_runs.json`` holds the whole config
of each run), so a later change of a default does not change the run. Where a change of behaviour is
meant, regenerate the file and say so in the commit::

    GOLDEN_RUNS_WRITE=1 .venv/bin/python -m pytest -q tests/test_golden_runs.py
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path

import pytest

from app import registry
from app.run import run_experiment

STORED = Path(__file__).with_name("golden_runs.json")

#: name -> (strategy, dataset, clients, the keys set for a small, fast run); every other key the run
#: reads is pinned at its value when the expectations were written (``golden_runs.json``).
RUNS = {
    "fedkmeans": ("fedkmeans", "iris", 2, {"num-rounds": 3, "fedkmeans.restarts": 2}),
    "gw-ldp": ("gw-ldp", "karate", 2, {"partitioner": "khop", "khop.hops": 1, "khop.centres": 8, "num-rounds": 1,
                                       "gw-ldp.model": "gcn", "gw-ldp.norm-statistics": "pooled", "gw-ldp.svc": False}),
    "fedspectral": ("fedspectral", "karate", 2, {}),
    "fedspectral-plus": ("fedspectral-plus", "karate", 2, {}),
    "fedavg-dmon": ("fedavg-dmon", "karate", 2, {"num-rounds": 2, "fedavg-dmon.local-epochs": 2}),
    "fedsc": ("fedsc", "circles", 2, {"circles.samples": 200}),
    "kcagc": ("kcagc", "karate", 2, {"kcagc.filter-order": 2, "kcagc.restarts": 2}),
    "kcagc-basic": ("kcagc-basic", "karate", 2, {"kcagc.filter-order": 2, "kcagc.iterations": 3,
                                                 "kcagc.restarts": 2}),
}
#: The sections of result.json whose numbers a run's behaviour fixes (not its timing).
SECTIONS = ("metrics", "reference", "communication", "privacy")
#: Leaves that measure time, not behaviour.
TIMED = ("time_s", "seconds", "_s")


def pinned_config(strategy: str, dataset: str, clients: int, overrides: dict) -> dict:
    """Every key the run reads, at the value it has now (the schema's defaults and ``overrides``)."""
    raw = {**overrides, "strategy": strategy, "dataset": dataset, "num-clients": clients, "seed": 0,
           "privacy.noise-seed": 0, "report": False, "out-dir": ""}
    config = registry.validate(raw)
    return {key: config[key] for key in registry.keys_read(config)}


def untimed_text(record: dict) -> str:
    """A record as text without its timing: the key that orders a list of records."""
    return json.dumps({k: v for k, v in record.items() if not str(k).endswith(TIMED)}, sort_keys=True, default=str)


def figures(result: dict) -> dict:
    """``section.path -> number`` of every number in the behaviour's sections of ``result``; a list of
    records (the privacy ledger's uploads) in a fixed order, not in the order the clients' replies came."""
    out: dict = {}

    def walk(prefix: str, value) -> None:
        if isinstance(value, dict):
            for key, sub in value.items():
                if not str(key).endswith(TIMED):
                    walk(f"{prefix}.{key}", sub)
        elif isinstance(value, list):
            if value and all(isinstance(sub, dict) for sub in value):
                value = sorted(value, key=untimed_text)
            for i, sub in enumerate(value):
                walk(f"{prefix}[{i}]", sub)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[prefix] = value

    for section in SECTIONS:
        walk(section, result.get(section, {}))
    return out


def outcome(name: str, config: dict, out_dir: Path) -> dict:
    strategy, dataset, clients, _ = RUNS[name]
    run_config = {k: v for k, v in config.items() if k not in ("strategy", "dataset", "num-clients")}
    result = run_experiment(strategy, dataset, clients, run_config, out_dir)
    labels = (Path(result["path"]).parent / "labels.csv").read_bytes()
    return {"labels_sha256": hashlib.sha256(labels).hexdigest(), "figures": figures(result)}


def same(a, b) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12) or (math.isnan(a) and math.isnan(b))
    return a == b


@pytest.mark.skipif(not os.environ.get("GOLDEN_RUNS_WRITE"), reason="writes the expectations (GOLDEN_RUNS_WRITE=1)")
def test_write_the_expectations(tmp_path):
    stored = {}
    for name, (strategy, dataset, clients, overrides) in RUNS.items():
        config = pinned_config(strategy, dataset, clients, overrides)
        stored[name] = {"config": config, **outcome(name, config, tmp_path / name)}
    STORED.write_text(json.dumps(stored, indent=1, sort_keys=True) + "\n")


@pytest.mark.parametrize("name", list(RUNS))
def test_a_run_writes_the_stored_labels_and_figures(name, tmp_path):
    expected = json.loads(STORED.read_text())[name]
    got = outcome(name, expected["config"], tmp_path / "out")
    assert got["labels_sha256"] == expected["labels_sha256"], f"{name}: labels.csv differs"
    figures_expected = expected["figures"]
    assert set(got["figures"]) == set(figures_expected), (
        f"{name}: figures {sorted(set(got['figures']) ^ set(figures_expected))} appear or vanish")
    differ = {key: (figures_expected[key], value) for key, value in got["figures"].items()
              if not same(value, figures_expected[key])}
    assert not differ, f"{name}: figures differ (stored, now): {differ}"
