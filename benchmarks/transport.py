"""Per-round latency of the fast transport vs Flower's ``send_and_receive``.

Four clients echo a tiny payload. Both polling modes run in the same Flower
run, alternating round by round, (1) in-process under ``run_simulation`` and
(2) under ``flwr run`` against a local SuperLink (simulation runtime). The
first round (engine warm-up) is reported apart from the steady state.

    python benchmarks/transport.py [--rounds 20]

Prints a table and writes benchmarks/results/transport.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
APP_DIR = HERE / "transport_app"
sys.path.insert(0, str(APP_DIR))


def in_process(rounds: int, clients: int) -> dict:
    from flwr.simulation import run_simulation

    import echo_app

    out = Path(tempfile.mkdtemp()) / "transport.json"
    server = echo_app.ServerApp()

    @server.main()
    def main(grid, context):
        out.write_text(json.dumps(echo_app.run(grid, rounds, clients)))

    start = time.perf_counter()
    run_simulation(server, echo_app.client, num_supernodes=clients,
                   backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}})
    report = json.loads(out.read_text())
    report["wall_s"] = time.perf_counter() - start
    return report


def under_flwr_run(rounds: int, clients: int) -> dict:
    """``flwr run`` with a private FLWR_HOME, so a fresh local SuperLink starts."""
    home = Path(tempfile.mkdtemp(prefix="flwr-home-"))
    out = home / "transport.json"
    env = {**os.environ, "FLWR_HOME": str(home), "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    cmd = ["flwr", "run", str(APP_DIR), "--stream",
           "--federation-config", f"num-supernodes={clients}",
           "--run-config", f"rounds={rounds} clients={clients} out='{out}'"]
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        if not out.exists():
            raise RuntimeError(f"flwr run wrote no report:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        report = json.loads(out.read_text())
        report["wall_s"] = time.perf_counter() - start
        return report
    finally:
        subprocess.run(["pkill", "-f", f"FLWR_HOME={home}"], check=False)
        subprocess.run(["pkill", "-f", "flower-superlink.*--simulation"], check=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--clients", type=int, default=4)
    args = parser.parse_args()
    results = {
        "run_simulation": in_process(args.rounds, args.clients),
        "flwr_run": under_flwr_run(args.rounds, args.clients),
    }
    print(f"{'engine':<16}{'first round s':>14}{'backoff median s':>18}{'flower median s':>17}{'speed-up':>10}")
    for engine, r in results.items():
        b, f = r["steady"]["backoff"]["median_s"], r["steady"]["flower"]["median_s"]
        print(f"{engine:<16}{r['first_round_s']:>14.3f}{b:>18.4f}{f:>17.4f}{f / b:>9.1f}x")
    out = HERE / "results" / "transport.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"written {out}")


if __name__ == "__main__":
    main()
