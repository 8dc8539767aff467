"""Deployed ``fedspectral-plus`` exact at 200,000 and 1,000,000 nodes, beside the in-process engine.

    python benchmarks/deployment_scale.py [--sizes 200000 1000000] [--supernodes 4] [--report]

For each size, one planted-partition graph (8 blocks, mean degree 20: 16 inside
the node's block, 4 across; edge split over the SuperNodes, the strategy's own)
is clustered twice with the same run-config and seed: (1) by ``python -m app.run
--engine inprocess`` in a process of its own, (2) by ``python -m deploy local``
(TLS SuperLink, Fleet gateway, authenticated SuperNodes, one shard file each).
Neither runs the centralised reference. Printed and written to
``benchmarks/results/deployment_scale.json`` (a size measured again replaces its row; the others
are kept): protocol seconds of each and their
ratio (target :data:`PROTOCOL_TARGET`), end-to-end seconds (the deployed one with
the federation's start; target :data:`END_TO_END_TARGET`), rounds, bytes moved,
whether the labels are identical, and each process's peak memory (proportional set size)
(sampled every :data:`SAMPLE_S` s: in-process; SuperLink, ServerApp, gateway, each
SuperNode with its ClientApp processes). The machine's load average is kept
beside each row: the figures mean little on a busy machine. Renders
``docs/results/deployment-scale.md``; ``--report``: only the page.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import psutil

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from pages import RESULTS_DIR, paragraph, read_results, table, write_page  # noqa: E402

MEASURE = "python benchmarks/deployment_scale.py"
RESULTS = "deployment_scale.json"
PROTOCOL_TARGET, END_TO_END_TARGET = 1.3, 1.6
SAMPLE_S = 0.5
BLOCKS, DEGREE_IN, DEGREE_OUT = 8, 16.0, 4.0
GIB = 1 << 30
#: what a process this script started runs: the first of these words in its command line; every
#: process below it (ServerApps under the SuperLink, ClientApps under their SuperNode, forked or not)
#: counts with it
ROLES = ("superlink", "gateway", "supernode")


def settings(nodes: int) -> list[str]:
    """The run-config of one size: :data:`BLOCKS` equal blocks, expected degree
    :data:`DEGREE_IN` inside a node's block and :data:`DEGREE_OUT` to the others."""
    size = nodes // BLOCKS
    return [f"sbm.nodes={nodes}", f"sbm.blocks={BLOCKS}", f"sbm.p-in={DEGREE_IN / size:.6g}",
            f"sbm.p-out={DEGREE_OUT / (nodes - size):.6g}", f"num-clusters={BLOCKS}", "sbm.features=0",
            "reference=false"]


def role(process: psutil.Process) -> str:
    """``superlink``, ``gateway``, ``supernode-<pid>`` or ``other`` (the ``flwr`` CLI, the in-process run)."""
    try:  # the program and its arguments, not its options (a SuperNode's --superlink names the SuperLink)
        words = [w for arg in process.cmdline() if not arg.startswith("-") for w in re.split(r"[-_./ ]", arg)]
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return "other"
    if "register" in words or "registration" in words:  # the set-up's key registration, not a SuperNode
        return "other"
    kind = next((word for word in words if word in ROLES), "other")  # the program's own name comes first
    return f"supernode-{process.pid}" if kind == "supernode" else kind


class PeakMemory:
    """Peak proportional set size (resident memory, a page shared by n processes counted 1/n in
    each: forked ClientApps share the preloaded libraries) of the processes this one started, each
    with every process below it (the largest sum at one sample: the SuperLink with its ServerApp,
    a SuperNode with its ClientApps), the largest single process of each, and the CPU seconds
    each used, as last sampled (where the machine's work went)."""

    def __init__(self) -> None:
        self.peaks: dict[str, int] = {}
        self.largest: dict[str, int] = {}
        self._cpu: dict[int, tuple[str, float]] = {}  # pid -> (role, CPU seconds so far)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> "PeakMemory":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        me = psutil.Process()
        while not self._stop.wait(SAMPLE_S):
            now: dict[str, int] = {}
            for top in me.children():
                key = role(top)
                for process in [top, *self._below(top)]:
                    try:
                        rss, cpu = process.memory_full_info().pss, process.cpu_times()
                    except psutil.NoSuchProcess:
                        continue
                    now[key] = now.get(key, 0) + rss
                    self.largest[key] = max(self.largest.get(key, 0), rss)
                    self._cpu[process.pid] = (key, cpu.user + cpu.system)
            for key, rss in now.items():
                self.peaks[key] = max(self.peaks.get(key, 0), rss)

    @staticmethod
    def _below(process: psutil.Process) -> list[psutil.Process]:
        try:
            return process.children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    @property
    def cpu_s(self) -> dict[str, float]:
        """CPU seconds by role (a process's last sample: what it used in its last half second is left out)."""
        total: dict[str, float] = {}
        for key, seconds in self._cpu.values():
            total[key] = total.get(key, 0.0) + seconds
        return total


def by_supernode(peaks: dict[str, int]) -> dict[str, int]:
    """``peaks`` with SuperNodes named 0, 1, ... in process-id order (the order they started)."""
    nodes = sorted((k for k in peaks if k.startswith("supernode-")), key=lambda k: int(k.split("-")[1]))
    named = {k: v for k, v in peaks.items() if not k.startswith("supernode-")}
    named.update({f"supernode {i}": peaks[k] for i, k in enumerate(nodes)})
    return named


def run_inprocess(nodes: int, supernodes: int, out: Path) -> dict:
    command = [sys.executable, "-m", "app.run", "--engine", "inprocess", "--strategy", "fedspectral-plus",
               "--dataset", "sbm", "--num-clients", str(supernodes), "--out", str(out)]
    for item in settings(nodes):
        command += ["--set", item]
    start = time.perf_counter()
    with PeakMemory() as memory:
        subprocess.run(command, check=True, cwd=HERE.parent, stdout=subprocess.DEVNULL)
    return {"wall_s": time.perf_counter() - start, "result": json.loads((out / "result.json").read_text()),
            "peak_rss": {"in-process": max(memory.peaks.values(), default=0)},
            "cpu_s": {"in-process": sum(memory.cpu_s.values())}}


def run_deployed(nodes: int, supernodes: int, out: Path) -> dict:
    """The deployed run, its memory and CPU; ``error``: why it wrote no result (the ServerApp's
    error line), None when it did."""
    from deploy.__main__ import RUN_TIMING, run_local
    start = time.perf_counter()
    path, error = None, None
    with PeakMemory() as memory:
        try:
            path = run_local(supernodes, "fedspectral-plus", "sbm", "auto", settings(nodes), out)
        except RuntimeError as err:  # no result: the row says why rather than the benchmark stopping
            log = out / "flwr-run.log"
            lines = log.read_text(errors="replace").splitlines() if log.exists() else []
            error = next((line.split("error: ", 1)[1] for line in reversed(lines) if "error: " in line), str(err))
    timing = json.loads((out / RUN_TIMING).read_text()) if (out / RUN_TIMING).exists() else {}
    return {"wall_s": time.perf_counter() - start, "error": error,
            "result": json.loads(path.read_text()) if path else None,
            "federation_start_s": timing.get("federation_start_s"), "flwr_run_s": timing.get("flwr_run_s"),
            "peak_rss": by_supernode(memory.peaks), "largest_rss": by_supernode(memory.largest),
            "cpu_s": by_supernode(memory.cpu_s), "labels": path.parent / "labels.npy" if path else None}


def measure(nodes: int, supernodes: int, work: Path) -> dict:
    load = [os.getloadavg()[0]]
    local = run_inprocess(nodes, supernodes, work / "inprocess")
    load.append(os.getloadavg()[0])
    deployed = run_deployed(nodes, supernodes, work / "deployed")
    load.append(os.getloadavg()[0])
    lt = local["result"]["timing"]
    row = {
        "nodes": nodes, "supernodes": supernodes, "settings": settings(nodes), "deployed_error": deployed["error"],
        "inprocess_rounds": lt["rounds"], "inprocess_protocol_s": lt["protocol_s"],
        "inprocess_wall_s": local["wall_s"],
        "inprocess_median_round_s": float(np.median(lt["per_round_s"] or [np.nan])),
        "federation_start_s": deployed["federation_start_s"], "deployed_wall_s": deployed["wall_s"],
        "peak_rss_gib": {k: v / GIB for k, v in {**local["peak_rss"], **deployed["peak_rss"]}.items()},
        "largest_process_gib": {k: v / GIB for k, v in deployed["largest_rss"].items()},
        "cpu_s": {**local["cpu_s"], **deployed["cpu_s"]},
        "load_average": f"{min(load):.1f}-{max(load):.1f}",
    }
    if deployed["result"] is None:
        return row
    dt, traffic = deployed["result"]["timing"], deployed["result"]["communication"]
    same = bool(np.array_equal(np.load(deployed["labels"]), np.load(work / "inprocess" / "labels.npy")))
    return {**row, "same_labels": same, "rounds": dt["rounds"], "deployed_protocol_s": dt["protocol_s"],
            "protocol_ratio": dt["protocol_s"] / lt["protocol_s"],
            "end_to_end_ratio": deployed["wall_s"] / local["wall_s"],
            "median_round_s": float(np.median([r["seconds"] for r in dt["per_round"]])),
            "gigabytes": (traffic["bytes_up"] + traffic["bytes_down"]) / 1e9, "messages": traffic["messages"]}


def print_row(row: dict) -> None:
    if row.get("deployed_error"):
        print(f"{row['nodes']:>9,} nodes: protocol {row['inprocess_protocol_s']:.1f} s in-process; the deployed run "
              f"wrote no result: {row['deployed_error']}")
    else:
        print(f"{row['nodes']:>9,} nodes: protocol {row['inprocess_protocol_s']:.1f} s in-process, "
              f"{row['deployed_protocol_s']:.1f} s deployed (x{row['protocol_ratio']:.2f}); end to end "
              f"{row['inprocess_wall_s']:.1f} / {row['deployed_wall_s']:.1f} s (x{row['end_to_end_ratio']:.2f}, "
              f"start {row['federation_start_s']:.1f} s); {row['rounds']} rounds, {row['gigabytes']:.2f} GB; "
              f"same labels: {row['same_labels']}; load {row['load_average']}")
    print("  peak memory (GiB): " + ", ".join(f"{k} {v:.2f}" for k, v in row["peak_rss_gib"].items()))
    print("  largest process (GiB): " + ", ".join(f"{k} {v:.2f}" for k, v in row["largest_process_gib"].items()))
    print("  CPU seconds: " + ", ".join(f"{k} {v:.0f}" for k, v in row["cpu_s"].items()))


def cpu_floor(row: dict) -> str:
    """What the CPU seconds say of the ratio: on ``os.cpu_count()`` cores the deployed protocol cannot
    take less than its CPU seconds over the cores, the in-process one runs its clients one by one."""
    deployed = sum(v for k, v in row["cpu_s"].items() if k != "in-process")
    local, cores = row["cpu_s"]["in-process"], os.cpu_count() or 1
    return (f"{row['nodes']:,} nodes: the deployed run used {deployed:.0f} CPU seconds, {deployed / local:.1f} times "
            f"the in-process run's {local:.0f} (TLS on two hops, protobuf and the object store for every block, "
            f"both ways); on this machine's {cores} cores it cannot take less than {deployed / cores:.0f} s, "
            f"{deployed / cores / row['inprocess_wall_s']:.1f} times the in-process run's wall time.")


def page() -> Path:
    rows = read_results(RESULTS, MEASURE)["rows"]
    header = ["nodes", "SuperNodes", "rounds", "protocol in-process (s)", "deployed (s)", "ratio",
              "end to end (s)", "ratio", "GB", "same labels", "load"]
    done = [r for r in rows if not r.get("deployed_error")]
    body = [[f"{r['nodes']:,}", str(r["supernodes"]), str(r["rounds"]), f"{r['inprocess_protocol_s']:.1f}",
             f"{r['deployed_protocol_s']:.1f}", f"{r['protocol_ratio']:.2f}",
             f"{r['inprocess_wall_s']:.0f} / {r['deployed_wall_s']:.0f}", f"{r['end_to_end_ratio']:.2f}",
             f"{r['gigabytes']:.2f}", "yes" if r["same_labels"] else "no", r["load_average"]] for r in done]
    failed = [f"{r['nodes']:,} nodes: in-process protocol {r['inprocess_protocol_s']:.0f} s in "
              f"{r['inprocess_rounds']} rounds; the deployed run wrote no result: {r['deployed_error']}"
              for r in rows if r.get("deployed_error")]
    roles = sorted({k for r in rows for k in r["peak_rss_gib"]})
    memory = [[f"{r['nodes']:,}", *(f"{r['peak_rss_gib'].get(k, 0):.2f}" for k in roles)] for r in rows]
    largest = [[f"{r['nodes']:,}", *(f"{r['largest_process_gib'][k]:.2f}" if k in r["largest_process_gib"] else "-"
                                     for k in roles)] for r in rows]
    cpu = [[f"{r['nodes']:,}", *(f"{r['cpu_s'].get(k, 0):.0f}" for k in roles)] for r in rows]
    text = "\n\n".join([
        paragraph("`fedspectral-plus` exact (the default) on planted partitions of 8 blocks, mean degree 20, "
                  "edge split, run by the in-process engine and by a local TLS deployment (SuperLink, Fleet "
                  f"gateway, authenticated SuperNodes) with the same seed. Targets: deployed / in-process "
                  f"protocol time <= {PROTOCOL_TARGET}, end to end (with the federation's start) <= "
                  f"{END_TO_END_TARGET}; the deployed run completes within the machine's 24 GB."),
        table(header, body),
        *(paragraph(line) for line in failed),
        paragraph("Peak memory (GiB, proportional set size: a page n processes share counts 1/n in each) of each "
        "process with the processes it started (the SuperLink with its ServerApp, a SuperNode with its "
        "ClientApps), the sum at one sample. Each group peaks at its own moment: the columns do not add up "
        "to the machine's peak."),
        table(["nodes", *roles], memory),
        "The largest single process of each (GiB):",
        table(["nodes", *roles], largest),
        "CPU seconds by process (where the deployed run's work goes):",
        table(["nodes", *roles], cpu),
        *(paragraph(cpu_floor(r)) for r in done),
    ])
    return write_page("deployment-scale", "Deployed runs at scale", text, MEASURE)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[200_000, 1_000_000])
    parser.add_argument("--supernodes", type=int, default=4)
    parser.add_argument("--report", action="store_true", help="only render the page from the JSON file")
    args = parser.parse_args()
    if not args.report:
        out = RESULTS_DIR / RESULTS
        rows = json.loads(out.read_text())["rows"] if out.exists() else []  # other sizes' rows are kept
        for nodes in args.sizes:
            row = measure(nodes, args.supernodes, Path(tempfile.mkdtemp(prefix=f"scale-{nodes}-")))
            rows = sorted([r for r in rows if (r["nodes"], r["supernodes"]) != (nodes, args.supernodes)] + [row],
                          key=lambda r: (r["nodes"], r["supernodes"]))
            print_row(row)
            out.write_text(json.dumps({"measure": MEASURE, "rows": rows}, indent=2) + "\n")
    print(f"written {page()}")


if __name__ == "__main__":
    main()
