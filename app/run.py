"""Run one experiment in-process: ``python -m app.run --strategy NAME ...``.

The same ServerApp and ClientApp as ``flwr run`` run under Flower's
simulation engine (``flwr.simulation.run_simulation``, default) or on the
in-process grid (``--engine inprocess``: no Ray start-up, same code path).
The ServerApp logs a summary table and writes ``OUT/result.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Mapping

from app import registry
from app.config import ConfigError
from app.privacy.secagg import SecAggError
from app.result import RESULT_FILE, default_out_dir
from app.transport import ProtocolError

ENGINES = ("simulation", "inprocess")
DEFAULT_NUM_CLIENTS = 4


def run_experiment(
    strategy: str,
    dataset: str,
    num_clients: int,
    overrides: Mapping[str, Any] | None = None,
    out_dir: str | Path | None = None,
    engine: str = "inprocess",
) -> dict:
    """Run one experiment and return its result dict (also in ``out_dir``)."""
    if engine not in ENGINES:
        raise ConfigError(f"unknown engine {engine!r}; valid choices: " + ", ".join(ENGINES))
    raw = {**dict(overrides or {}), "strategy": strategy, "dataset": dataset, "num-clients": num_clients}
    config = registry.validate(raw)  # fail before any engine starts
    raw["out-dir"] = str(Path(out_dir or config["out-dir"] or default_out_dir(strategy, dataset)).resolve())
    if engine == "inprocess":
        from app.client_app import build_client_app
        from app.inprocess import InProcessGrid
        from app.server_app import run_server

        return run_server(InProcessGrid(build_client_app(raw), num_clients), raw)

    from flwr.simulation import run_simulation

    from app.client_app import build_client_app
    from app.server_app import build_server_app

    path = Path(raw["out-dir"]) / RESULT_FILE
    path.unlink(missing_ok=True)
    run_simulation(
        server_app=build_server_app(raw),
        client_app=build_client_app(raw),
        num_supernodes=num_clients,
        backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}},
    )
    if not path.exists():
        raise ProtocolError(f"the simulation finished without writing {path}; see the log above")
    result = json.loads(path.read_text())
    result["path"] = str(path)
    return result


def _parse_set(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"invalid --set {item!r}; expected key=value")
        out[key.strip()] = value.strip()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m app.run", description=__doc__.splitlines()[0])
    parser.add_argument("--strategy", default=None, help="one of: " + ", ".join(registry.STRATEGIES))
    parser.add_argument("--dataset", default=None)
    parser.add_argument("--num-clients", type=int, default=None)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="any run-config key, e.g. --set seed=3 (repeatable)")
    parser.add_argument("--out", default=None, help="directory for result.json")
    parser.add_argument("--engine", default="simulation", help="simulation (Flower, default) or inprocess")
    args = parser.parse_args(argv)
    try:
        overrides = _parse_set(args.set)
        defaults = registry.schema().defaults()
        strategy = args.strategy or overrides.pop("strategy", defaults["strategy"])
        dataset = args.dataset or overrides.pop("dataset", defaults["dataset"])
        num_clients = args.num_clients or int(overrides.pop("num-clients", 0)) or DEFAULT_NUM_CLIENTS
        result = run_experiment(strategy, dataset, num_clients, overrides, args.out, args.engine)
    except (ConfigError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except (ProtocolError, SecAggError) as err:  # the run stopped (a client refused or vanished): no result
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(f"result: {result['path']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
