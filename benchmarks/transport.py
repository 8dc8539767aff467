"""Per-round latency of the fast transport vs Flower's ``send_and_receive``.

Four clients echo a tiny payload. Both polling modes run in the same Flower
run, alternating round by round, (1) in-process under ``run_simulation`` and
(2) under ``flwr run`` against a local SuperLink (simulation runtime). The
first round (engine warm-up) is reported apart from the steady state.

    python benchmarks/transport.py [--rounds 20] [--report]

Prints a table, writes benchmarks/results/transport.json and renders the page
docs/results/transport.md from it (``--report``: only the page, from the JSON).
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

import deployment_profile  # noqa: E402
import flower_costs  # noqa: E402
import simulation_steps  # noqa: E402
from pages import RESULTS_DIR, figure, image_path, paragraph, read_results, table, write_page  # noqa: E402

ENGINES = {"run_simulation": "`run_simulation` (in-process)",
           "flwr_run": "`flwr run`, local SuperLink (simulation runtime)"}
MODES = {"backoff": "back-off poll", "flower": "`send_and_receive`"}
TARGET_S = 0.15
MEASURE = "python benchmarks/transport.py --rounds 20"


def in_process(rounds: int, clients: int) -> dict:
    from flwr.simulation import run_simulation

    import echo_app
    from app.engine import speed_up_runtime

    speed_up_runtime()  # as app.engine.simulate does
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
    """``flwr run`` against a local SuperLink of a private FLWR_HOME on a free port (started with
    ``deploy.superlink``, as ``flwr run`` would start it, and stopped after: that process only)."""
    from deploy.federation import free_port
    from deploy.superlink import PORT_VARIABLE, Local, start, stop

    home = Path(tempfile.mkdtemp(prefix="flwr-home-"))
    out, port = home / "transport.json", free_port()
    env = {**os.environ, "FLWR_HOME": str(home), "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
           PORT_VARIABLE: str(port), "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    cmd = ["flwr", "run", str(APP_DIR), "--stream",
           "--federation-config", f"num-supernodes={clients}",
           "--run-config", f"rounds={rounds} clients={clients} out='{out}'"]
    local = Local(home, port)
    os.environ.update(FLWR_HOME=str(home), **{PORT_VARIABLE: str(port)})  # the SuperLink's environment too
    start(local)
    started = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        if not out.exists():
            raise RuntimeError(f"flwr run wrote no report:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        report = json.loads(out.read_text())
        report["wall_s"] = time.perf_counter() - started
        return report
    finally:
        stop(local)


def page() -> Path:
    """docs/results/transport.md from benchmarks/results/transport.json."""
    import plots

    results = read_results("transport.json", MEASURE)
    rows = [[ENGINES[e], f"{r['first_round_s']:.1f}",
             *(f"{r['steady'][m]['median_s']:.3f} / {r['steady'][m]['mean_s']:.3f}" for m in MODES)]
            for e, r in results.items() if e in ENGINES]
    worst = max(r["steady"][m]["median_s"] for e, r in results.items() if e in ENGINES for m in MODES)
    bars = plots.plot_grouped_bars([e.replace("_", " ") for e in results if e in ENGINES],
                                   {MODES[m].strip("`"): [r["steady"][m]["median_s"] for e, r in results.items()
                                                         if e in ENGINES] for m in MODES},
                                   image_path("transport_rounds.png"), ylabel="median round (s)",
                                   title="Steady-state round, 4 clients, tiny payload")
    rounds = next(iter(results.values()))["steady"]["backoff"]["rounds"]
    clients = next(iter(results.values()))["clients"]
    body = "\n\n".join([
        paragraph(f"`{MEASURE}`: {clients} clients echo an 8-float payload. The fast back-off poll "
                  "(`fedgraphcore.transport`, 2 ms doubling to 50 ms) and Flower's `Grid.send_and_receive` alternate "
                  f"round by round in the same Flower run, {rounds} rounds each; the first round (engine "
                  "warm-up) is shown apart. Seconds" + (f", flwr {results['flwr']}" if "flwr" in results else "")
                  + "."),
        table(["engine", "first round", "back-off median / mean", "`send_and_receive` median / mean"], rows),
        figure(bars, "median steady-state round per engine and polling mode"),
        paragraph(f"Target: a steady-state round under {TARGET_S} s: "
                  + ("met" if worst < TARGET_S else "not met") + f" (slowest median {worst:.3f} s). "
                  "The back-off poll pulls a reply when the runtime stores it, and the runtime hands each "
                  "message to its ClientApp when it is stored (`app.engine.pick_up_on_push`; Flower's runtime "
                  "looks every 0.1 s, `vce_api.add_messages_to_queue`); Flower's `send_and_receive` polls "
                  "every 0.1 s (`InMemoryGrid.pull_interval`), so its rounds stay near 0.1 s. The first round "
                  "includes starting Ray's actors. A deployed round (SuperLink, SuperNodes as processes) is "
                  "measured on the [deployment](deployment.md) page."),
    ])
    steps = RESULTS_DIR / simulation_steps.RESULTS
    if steps.exists():
        body += "\n\n" + simulation_steps.section(json.loads(steps.read_text()))
    profile = RESULTS_DIR / deployment_profile.RESULTS
    if profile.exists():
        body += "\n\n" + deployment_profile.section(json.loads(profile.read_text())["rows"])
    costs = RESULTS_DIR / flower_costs.RESULTS
    if costs.exists():
        body += "\n\n" + flower_costs.section(json.loads(costs.read_text()))
    return write_page("transport", "Transport: round latency and where a deployed run's CPU goes", body,
                      "python benchmarks/transport.py --report")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--report", action="store_true", help="only render the page from the JSON")
    args = parser.parse_args()
    if args.report:
        print(f"written {page()}")
        return
    import flwr

    results = {
        "run_simulation": in_process(args.rounds, args.clients),
        "flwr_run": under_flwr_run(args.rounds, args.clients),
        "flwr": flwr.__version__,
    }
    print(f"{'engine':<16}{'first round s':>14}{'backoff median s':>18}{'flower median s':>17}{'speed-up':>10}")
    for engine in ENGINES:
        r = results[engine]
        b, f = r["steady"]["backoff"]["median_s"], r["steady"]["flower"]["median_s"]
        print(f"{engine:<16}{r['first_round_s']:>14.3f}{b:>18.4f}{f:>17.4f}{f / b:>9.1f}x")
    out = HERE / "results" / "transport.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"written {out} and {page()}")


if __name__ == "__main__":
    main()
