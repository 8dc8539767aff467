"""Run-config validation, the registry, pyproject defaults and CLI errors."""

from __future__ import annotations

import subprocess
import sys
import tomllib

import pytest

from app import registry
from app.config import ConfigError, Param, Schema
from conftest import REPO


def test_defaults_validate_and_resolve_auto_partitioner():
    config = registry.validate({})
    strategy = registry.get(config["strategy"]).strategy
    assert config["partitioner"] == strategy.partitioners[0]
    assert set(config.as_dict()) == set(registry.schema().params)


@pytest.mark.parametrize(
    "raw, fragments",
    [
        ({"strategy": "kmeanz"}, ["'kmeanz'", "valid choices", "fedkmeans"]),
        ({"dataset": "coraa"}, ["'coraa'", "valid choices", "cora"]),
        ({"no-such-key": 1}, ["'no-such-key'", "valid keys", "num-rounds"]),
        ({"num-rounds": 0}, ["0", "'num-rounds'", "out of range", "[1, inf"]),
        ({"num-clients": 5000}, ["5000", "'num-clients'", "valid range", "1024"]),
        ({"seed": "abc"}, ["'abc'", "'seed'", "integer"]),
        ({"seed": 1.5}, ["1.5", "'seed'", "integer"]),
        ({"seed": 2**32}, ["4294967296", "'seed'", "valid range: [0, 4294967295]"]),  # scikit-learn's limit
        ({"reference": "maybe"}, ["'maybe'", "'reference'", "true, false"]),
        ({"timeout": "soon"}, ["'soon'", "'timeout'", "number"]),
        ({"partitioner": "edge"}, ["'edge'", "fedkmeans", "valid choices", "node-random"]),
        # NaN passes every comparison, so it gets past a range check unless refused as such
        ({"gw-ldp.alpha": "nan"}, ["nan", "'gw-ldp.alpha'", "valid: a finite number in [0, 1]"]),
        ({"gw-ldp.lr": float("nan")}, ["nan", "'gw-ldp.lr'", "valid: a finite number in [1e-09, 10]"]),
        ({"gw-ldp.dp-noise": "inf"}, ["inf", "'gw-ldp.dp-noise'", "valid: a finite number in [1e-09, inf)"]),
        ({"timeout": "inf"}, ["inf", "'timeout'", "valid: a finite number in [0.001, inf)"]),
        ({"gw-ldp.epsilon": "nan"}, ["nan", "'gw-ldp.epsilon'", "valid: a number in [0, inf]"]),
        ({"gw-ldp.epsilon": "-inf"}, ["-inf", "'gw-ldp.epsilon'", "valid: a number in [0, inf]"]),
    ],
)
def test_bad_values_give_one_line_naming_value_and_choices(raw, fragments):
    with pytest.raises(ConfigError) as err:
        registry.validate(raw)
    message = str(err.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message


def test_values_are_coerced_to_declared_types():
    config = registry.validate({"seed": "7", "timeout": 3, "reference": "false", "num-rounds": 5.0})
    assert config["seed"] == 7 and isinstance(config["seed"], int)
    assert config["timeout"] == 3.0 and isinstance(config["timeout"], float)
    assert config["reference"] is False
    assert config["num-rounds"] == 5


def test_inf_is_valid_only_where_declared():
    # gw-ldp.epsilon = inf is documented (no LDP noise); every other float must be finite
    infinite = [p.key for p in registry.schema().params.values() if p.infinite]
    assert infinite == ["gw-ldp.epsilon"] and "inf = no LDP" in registry.schema().params["gw-ldp.epsilon"].help
    assert registry.validate({"gw-ldp.epsilon": "inf"})["gw-ldp.epsilon"] == float("inf")
    assert registry.validate({"gw-ldp.epsilon": 1e5})["gw-ldp.epsilon"] == 1e5
    with pytest.raises(ConfigError, match=r"^invalid value inf for 'x'; valid: a finite number in \(-inf, inf\)$"):
        Param("x", float, 0.0, "").coerce("inf")


def test_schema_rejects_duplicate_keys():
    schema = Schema()
    schema.add([Param("a", int, 1, "")])
    with pytest.raises(ValueError, match="declared twice"):
        schema.add([Param("a", int, 2, "")])


def test_registry_round_trip():
    assert registry.STRATEGIES
    for name, entry in registry.STRATEGIES.items():
        assert registry.get(name) is entry
        assert entry.strategy.name == name
        assert entry.strategy.partitioners
        for action in entry.client.actions:
            assert action.isidentifier()
            assert hasattr(entry.client, f"on_{action}")
        for param in entry.strategy.params:
            assert param.key.startswith(name + ".")
    with pytest.raises(ConfigError, match="unknown strategy 'x'; valid choices"):
        registry.get("x")


def test_pyproject_run_config_equals_schema_defaults():
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    table = pyproject["tool"]["flwr"]["app"]["config"]
    flat = {}

    def walk(prefix, node):
        for key, value in node.items():
            full = f"{prefix}.{key}" if prefix else key
            if isinstance(value, dict):
                walk(full, value)
            else:
                flat[full] = value

    walk("", table)
    assert flat == registry.schema().defaults()


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--strategy", "nope"], "invalid value 'nope' for 'strategy'; valid choices: fedkmeans"),
        (["--set", "bogus=1"], "unknown config key 'bogus'"),
        (["--set", "seed=-1"], "value -1 for 'seed' is out of range"),
        (["--engine", "warp"], "unknown engine 'warp'"),
        (["--set", "seed"], "invalid --set 'seed'"),
    ],
)
def test_cli_bad_input_exits_2_with_one_line(args, fragment, tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "app.run", "--out", str(tmp_path / "r"), *args],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2
    lines = [l for l in proc.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and fragment in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "r").exists()
