"""A run's page at scale: a 1,000,000-node run's report.html, its time beside the run's, and its size.

    python benchmarks/report_scale.py [--nodes 1000000] [--strategy fedkmeans] [--clients 4] [--report]

One in-process run of the cheapest strategy that fits a planted-partition graph (fedkmeans, on
rows with features, in its cheapest settings: :data:`CHEAPEST`) at each size, with its out-dir:
the server writes the page when the run ends (what the page draws of the data,
``report-data.npz``, then ``report.html``). The script times
that step inside the run (wall and CPU seconds, the server's ``write_run_report``) and the whole run
(``run_experiment``, data generation included), and reads the page's size. Targets: the page in
under 10% of the run's time and under 5 MB. Writes ``benchmarks/results/report_scale.json`` and
``docs/results/report.md``; ``--report`` renders the page from the JSON alone. Timings are of a
shared machine: the ratio of the page to its own run, measured side by side, is the figure.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pages import RESULTS_DIR, paragraph, read_results, table, write_page  # noqa: E402

MEASURE = "python benchmarks/report_scale.py"
RESULTS = "report_scale.json"
TIME_SHARE, MAX_BYTES = 0.10, 5_000_000
BLOCKS, DEGREE_IN, DEGREE_OUT = 8, 16.0, 4.0
#: the strategy's cheapest run: fedkmeans unfiltered, one k-means start (the page's cost is the figure)
CHEAPEST = {"fedkmeans": {"fedkmeans.filter-order": 0, "fedkmeans.restarts": 1}}


def settings(nodes: int) -> dict:
    """The run-config of one size: :data:`BLOCKS` equal blocks, expected degree :data:`DEGREE_IN`
    inside a node's block and :data:`DEGREE_OUT` to the others, 16 feature columns."""
    size = nodes // BLOCKS
    return {"sbm.nodes": nodes, "sbm.blocks": BLOCKS, "sbm.p-in": DEGREE_IN / size,
            "sbm.p-out": DEGREE_OUT / (nodes - size), "sbm.features": 16, "num-clusters": BLOCKS}


def measure(nodes: int, strategy: str, clients: int) -> dict:
    """One run with its page; the seconds of each and the page's bytes."""
    import app.server_app as server
    from app.run import run_experiment

    timed: dict = {}
    write_report = server.write_run_report

    def timing(*args, **kwargs):
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            return write_report(*args, **kwargs)
        finally:
            timed.update(page_s=time.perf_counter() - wall, page_cpu_s=time.process_time() - cpu)

    server.write_run_report = timing
    out = Path(tempfile.mkdtemp(prefix="report-scale-")) / "run"
    try:
        wall, cpu = time.perf_counter(), time.process_time()
        config = {**settings(nodes), **CHEAPEST.get(strategy, {})}
        result = run_experiment(strategy, "sbm", clients, config, out, "inprocess")
        run_s, run_cpu_s = time.perf_counter() - wall, time.process_time() - cpu
        page = out / "report.html"
        return {"nodes": nodes, "strategy": strategy, "clients": clients, "settings": config,
                "run_s": run_s, "run_cpu_s": run_cpu_s, **timed, "page_bytes": page.stat().st_size,
                "view_bytes": (out / "report-data.npz").stat().st_size, "written": bool(result.get("report")),
                "share": timed["page_s"] / run_s, "cpu_share": timed["page_cpu_s"] / run_cpu_s,
                "acc": result["metrics"].get("acc"), "agreement": result["reference"]["agreement"]["ari"]}
    finally:
        server.write_run_report = write_report
        shutil.rmtree(out.parent, ignore_errors=True)


def own_settings(row: dict) -> str:
    """The strategy's settings the run set (beyond the graph's), or ``defaults``."""
    own = [f"`{k}={v}`" for k, v in row["settings"].items() if k.startswith(f"{row['strategy']}.")]
    return ", ".join(own) or "defaults"


def render(results: dict) -> str:
    rows = [[f"{r['nodes']:,}", r["strategy"], own_settings(r), f"{r['run_s']:.1f}", f"{r['page_s']:.2f}",
             f"{100 * r['share']:.1f}%", f"{100 * r['cpu_share']:.1f}%", f"{r['page_bytes'] / 1e6:.2f} MB",
             "met" if r["share"] < TIME_SHARE and r["page_bytes"] < MAX_BYTES else "not met"]
            for r in results["rows"]]
    body = [paragraph(
        "Every run with an out-dir writes report.html beside result.json (fedgraphcore/report/). The page draws at most "
        "2,000 items of a large graph (every cluster kept) and its cluster-level graph, so its cost and size do not "
        "grow with the graph past what reading the labels and counting the edges between clusters take. Targets: "
        f"the page in under {TIME_SHARE:.0%} of the run's time and under {MAX_BYTES / 1e6:.0f} MB. Seconds are wall "
        "time on a shared 2-core machine; the share is the page's seconds over its own run's, measured side by side "
        "(CPU share: the same with CPU seconds)."),
        table(["nodes", "strategy", "settings", "run s", "page s", "page share", "CPU share", "page size", "targets"], rows),
        paragraph(f"Measured on {results.get('machine', 'this machine')}.")]
    return "\n\n".join(body)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=MEASURE, description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1_000_000])
    parser.add_argument("--strategy", default="fedkmeans")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--report", action="store_true", help="only render the page from the JSON")
    args = parser.parse_args(argv)
    if args.report:
        results = read_results(RESULTS, MEASURE)
    else:
        rows = []
        for nodes in args.nodes:
            rows.append(measure(nodes, args.strategy, args.clients))
            print(json.dumps(rows[-1]), flush=True)
        results = {"measure": MEASURE, "machine": f"{platform.machine()}, {platform.python_version()}", "rows": rows}
        (RESULTS_DIR / RESULTS).write_text(json.dumps(results, indent=1) + "\n")
    write_page("report", "A run's page at scale", render(results), MEASURE + " --report")
    for r in results["rows"]:
        print(f"{r['nodes']:,} nodes: run {r['run_s']:.1f} s, page {r['page_s']:.2f} s ({100 * r['share']:.1f}%), "
              f"{r['page_bytes'] / 1e6:.2f} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
