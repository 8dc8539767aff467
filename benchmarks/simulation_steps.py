"""A simulated run's steps against the in-process engine's, and where a simulated message's time goes.

    python benchmarks/simulation_steps.py --once {simulation,inprocess} --label L --log FILE
    python benchmarks/simulation_steps.py --trace --label L --log FILE
    python benchmarks/simulation_steps.py --collect FILE      # or --report: the page from the JSON

The run is :data:`RUN`: ``kcagc`` paper mode on Cora, 2 parties. ``--once`` runs it once with the
checkout of the working directory (``python -m app.run``, this interpreter) and appends its
protocol seconds and step seconds to ``FILE`` as one JSON line: a timing harness alternates the
engines and checkouts (one command per arm), then ``--collect`` writes the medians, the pairwise
ratios and ``benchmarks/results/simulation_steps.json``, and renders the transport page.

``--trace`` runs the simulation once with every hop of a message through Flower's simulation
runtime timed (wall clock; CPU of the thread where the hop runs in one thread): the ServerApp
storing it, the runtime's pick-up, Ray pickling the task (``actor.run.remote(app_fn, message,
cid, context)``), the hop to the actor, the ClientApp, the reply and context back, the reply
stored. Its per-hop medians over the messages after the first step go into ``FILE`` too.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from pages import RESULTS_DIR, paragraph, render_page_of, table  # noqa: E402

RESULTS = "simulation_steps.json"
RUN = ("--strategy", "kcagc", "--dataset", "cora", "--num-clients", "2", "--set", "kcagc.mode=paper",
       "--set", "report=false")
ENGINES = ("simulation", "inprocess")
TRACE_DIR = "FEDGRAPH_SIMULATION_TRACE"
#: a message's hops (:func:`hops`), in order
HOPS = {"push": "the ServerApp stores it (Flower's LinkState)",
        "pick_up": "the runtime hands it to a worker thread",
        "submit": "Ray pickles the task: loader, message, context (ServerApp's process)",
        "submit_cpu": "  of which CPU",
        "to_actor": "to the actor: Ray's transfer, unpickling",
        "clientapp": "the ClientApp's handler (in the actor)",
        "clientapp_cpu": "  of which CPU",
        "back": "reply and context back, unpickled",
        "store": "the reply stored in the LinkState",
        "total": "message stored to reply stored"}


def once(engine: str) -> dict:
    """One run of :data:`RUN` on ``engine`` with the working directory's checkout."""
    out = Path(tempfile.mkdtemp(prefix="simulation-steps-")) / "out"
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "app.run", "--engine", engine, *RUN, "--out", str(out)], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    timing = json.loads((out / "result.json").read_text())["timing"]
    return {"engine": engine, "wall_s": time.perf_counter() - start, "protocol_s": timing["protocol_s"],
            "steps_s": timing["per_round_s"], "load": os.getloadavg()[0]}


def _log(kind: str, **fields) -> None:
    """One event of a traced run, in this process's own file of the trace folder."""
    with _LOCK, open(Path(os.environ[TRACE_DIR]) / f"{os.getpid()}.jsonl", "a") as f:
        f.write(json.dumps({"k": kind, "t": time.time(), "th": threading.current_thread().name, **fields}) + "\n")


_LOCK = threading.Lock()


def _timed(cls, name: str, kind: str, fields=lambda *a, **k: {}) -> None:
    """``cls.name`` logging its start, end and thread CPU as event ``kind``."""
    original = getattr(cls, name)

    @functools.wraps(original)
    def timed(*args, **kwargs):
        t0, c0 = time.time(), time.thread_time()
        try:
            return original(*args, **kwargs)
        finally:
            _log(kind, t0=t0, cpu=time.thread_time() - c0, **fields(*args, **kwargs))

    setattr(cls, name, timed)


def _ids(message) -> dict:
    return {"mid": message.metadata.message_id, "reply_to": message.metadata.reply_to_message_id}


def worker_hook() -> None:
    """Ray's setup hook in a traced run: the project's own, then the actor's ClientApp timed
    (and under :data:`RESIDENT` the actor's side of :func:`resident_contexts`)."""
    import app.engine
    from flwr.clientapp.client_app import ClientApp
    from flwr.simulation.ray_transport.ray_actor import VirtualClientEngineActor

    app.engine.preload_worker()
    if os.environ.get(RESIDENT) == "1":
        _keep_contexts(VirtualClientEngineActor)
    _timed(VirtualClientEngineActor, "run", "actor", lambda self, fn, message, cid, context: _ids(message))
    _timed(ClientApp, "__call__", "clientapp", lambda self, message, context: _ids(message))


#: with this variable 1, a traced run keeps each node's context in its actor (:func:`resident_contexts`)
RESIDENT = "FEDGRAPH_RESIDENT_CONTEXTS"


def _keep_contexts(actor_class) -> None:
    """The actor keeps the context of the first message of each node (``cid``) and answers with
    the context's state left out; later messages' (stateless) contexts are ignored."""
    from flwr.app import Context, RecordDict

    run, kept = actor_class.run, {}

    def run_keeping(self, app_fn, message, cid, context):
        context = kept.setdefault(cid, context)
        cid, reply, context = run(self, app_fn, message, cid, context)
        return cid, reply, Context(context.run_id, context.node_id, context.node_config, RecordDict(),
                                   context.run_config)

    actor_class.run = run_keeping


def resident_contexts() -> None:
    """A local patch of Flower's simulation runtime, for the measurement only: each node's messages
    go to one actor (``BasicActorPool.submit``, as many actors as nodes), which keeps the node's
    context (:func:`_keep_contexts`), so a context crosses to an actor once per run, not twice per
    message."""
    from flwr.simulation.ray_transport.ray_actor import BasicActorPool

    os.environ[RESIDENT] = "1"
    submit = BasicActorPool.submit

    def submit_to_the_nodes_actor(self, actor_fn, job):
        owner = getattr(self, "owners", {}).get(job[2])
        if owner in self.pool:  # the node's actor, idle: first in line
            self.pool.remove(owner)
            self.pool.append(owner)
        future = submit(self, actor_fn, job)
        self.owners = {**getattr(self, "owners", {}), job[2]: self._future_to_actor[future]}
        return future

    BasicActorPool.submit = submit_to_the_nodes_actor


def trace(resident: bool = False) -> dict:
    """One simulated run of :data:`RUN` with every hop timed (module docstring): per-hop medians
    (ms) over the messages after the first step, and the run's step seconds (``resident``: under
    :func:`resident_contexts`)."""
    import app.engine
    from flwr.server.superlink.fleet.vce.backend.raybackend import RayBackend
    from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState
    from flwr.simulation.ray_transport.ray_actor import BasicActorPool

    from app.run import main

    folder = tempfile.mkdtemp(prefix="simulation-trace-")
    os.environ[TRACE_DIR] = folder
    os.environ["PYTHONPATH"] = os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])
    app.engine.PRELOAD_HOOK = f"{Path(__file__).stem}.worker_hook"
    if resident:
        resident_contexts()
    _timed(InMemoryLinkState, "store_message_ins", "store_ins", lambda self, m: _ids(m))
    _timed(InMemoryLinkState, "store_message_res", "store_res", lambda self, m: _ids(m))
    _timed(RayBackend, "process_message", "process", lambda self, m, c: _ids(m))
    _timed(BasicActorPool, "submit", "submit", lambda self, fn, job: _ids(job[1]))
    _timed(BasicActorPool, "fetch_result_and_return_actor_to_pool", "fetch")
    out = Path(folder) / "out"
    if main(["--engine", "simulation", *RUN, "--out", str(out)]) != 0:
        raise RuntimeError("the traced run failed")
    result = json.loads((out / "result.json").read_text())
    steps, acc = result["timing"]["per_round_s"], result["metrics"]["acc"]
    events = [json.loads(line) for f in Path(folder).glob("*.jsonl") for line in f.read_text().splitlines()]
    return {"hops_ms": hops(events, first_step_messages=4), "steps_s": steps, "acc": acc,
            "resident": resident, "load": os.getloadavg()[0]}


def hops(events: list[dict], first_step_messages: int) -> dict:
    """Median milliseconds of each hop (:data:`HOPS`) over the messages after the first
    ``first_step_messages`` (the handshake and the first step: imports, local clustering)."""
    by_message: dict[str, dict] = {}
    for e in events:
        if e["k"] in ("store_ins", "process", "submit", "actor", "clientapp"):
            by_message.setdefault(e["mid"], {})[e["k"]] = e
    replies = {e["reply_to"]: e for e in events if e["k"] == "store_res"}
    fetches = [e for e in events if e["k"] == "fetch"]
    rows = []
    for mid, m in sorted(by_message.items(), key=lambda kv: kv[1].get("store_ins", {"t0": 0})["t0"]):
        if len(m) < 5 or mid not in replies:
            continue
        p, s, a, c, r = m["process"], m["submit"], m["actor"], m["clientapp"], replies[mid]
        fetch = next(f for f in fetches if f["th"] == p["th"] and p["t0"] <= f["t0"] <= p["t"])
        rows.append({"push": m["store_ins"]["t"] - m["store_ins"]["t0"], "pick_up": p["t0"] - m["store_ins"]["t"],
                     "submit": s["t"] - s["t0"], "submit_cpu": s["cpu"], "to_actor": c["t0"] - s["t"],
                     "clientapp": c["t"] - c["t0"], "clientapp_cpu": c["cpu"], "back": fetch["t"] - c["t"],
                     "store": r["t"] - fetch["t"], "total": r["t"] - m["store_ins"]["t0"]})
    later = rows[first_step_messages:]
    return {hop: 1e3 * statistics.median(row[hop] for row in later) for hop in HOPS} | {"messages": len(later)}


def later_step_ms(run: dict) -> float:
    """The median step after the first, ms."""
    return 1e3 * statistics.median(run["steps_s"][1:])


def collect(lines: list[dict]) -> dict:
    """Medians per checkout and engine, and the simulated-to-in-process ratios of runs taken in turn."""
    checkouts: dict[str, dict] = {}
    for line in lines:
        entry = checkouts.setdefault(line["label"], {"runs": {e: [] for e in ENGINES}, "traces": []})
        (entry["traces"] if "hops_ms" in line else entry["runs"][line["engine"]]).append(line)
    for entry in checkouts.values():
        traces = entry.pop("traces")
        entry["trace"] = {"runs": len(traces), "load": statistics.median(t["load"] for t in traces),
                          "hops_ms": {hop: statistics.median(t["hops_ms"][hop] for t in traces) for hop in HOPS}
                          } if traces else None
        runs = entry["runs"]
        entry["median"] = {e: {"protocol_s": statistics.median(r["protocol_s"] for r in runs[e]),
                               "first_step_s": statistics.median(r["steps_s"][0] for r in runs[e]),
                               "later_step_ms": statistics.median(later_step_ms(r) for r in runs[e]),
                               "load": statistics.median(r["load"] for r in runs[e])}
                           for e in ENGINES if runs[e]}
        pairs = list(zip(runs["simulation"], runs["inprocess"]))
        entry["step_ratio"] = statistics.median(later_step_ms(s) / later_step_ms(i) for s, i in pairs) if pairs else None
        entry["pairs"] = len(pairs)
    return checkouts


def section(result: dict) -> str:
    """The transport page's section on a simulated run's steps (markdown)."""
    checkouts = result["checkouts"]
    labels = list(checkouts)
    rows = [[label, f"{e}", f"{m['protocol_s']:.2f}", f"{m['first_step_s']:.2f}", f"{m['later_step_ms']:.0f}",
             f"{m['load']:.1f}"] for label in labels for e, m in checkouts[label]["median"].items()]
    ratios = [[label, f"{checkouts[label]['step_ratio']:.1f}", str(checkouts[label]["pairs"])] for label in labels
              if checkouts[label]["step_ratio"] is not None]
    traced = [label for label in labels if checkouts[label]["trace"]]
    hop_rows = [[text, *(f"{checkouts[label]['trace']['hops_ms'][hop]:.1f}" for label in traced)]
                for hop, text in HOPS.items()]
    hop_rows.append(["traced runs (load)", *(f"{checkouts[label]['trace']['runs']} ({checkouts[label]['trace']['load']:.0f})"
                                             for label in traced)])
    return "\n\n".join([
        "## A simulated run's steps",
        paragraph(f"`python -m app.run --engine ENGINE {' '.join(RUN)}`, each engine and checkout in turn "
                  f"(`{result['measure']}`), on this machine's 2 cores shared with other users (load beside each). "
                  "Medians over the runs: protocol seconds, the first step (the clients' local clustering; "
                  "in-process it also imports their libraries, which a Ray worker imports as it starts), and "
                  "the median step after the first."),
        table(["checkout", "engine", "protocol s", "first step s", "later step ms", "load"], rows),
        paragraph("Simulated step over in-process step, runs taken in turn (median of the pairs' ratios; "
                  "target 2):"),
        table(["checkout", "later step ratio", "pairs"], ratios),
        paragraph("Where a simulated message's time goes (`python benchmarks/simulation_steps.py --trace`: "
                  "median ms over the messages after the first step, median over the traced runs; wall clock, "
                  "so waits for a busy CPU count, and the CPU rows are the steadier figures):"),
        table(["hop", *traced], hop_rows),
        paragraph("Flower's Ray backend submits every message as `actor.run.remote(app_fn, message, cid, "
                  "context)` (`flwr/server/superlink/fleet/vce/backend/raybackend.py`, `process_message`). Ray "
                  "pickled `app_fn`, a closure over the ClientApp with all its handlers (20 KB), by value each "
                  "time, and passed the context (with the client's state, 190 KB here) through its "
                  "shared-memory object store, which costs ~10 ms each way below 1 MB. The runtime shim "
                  "(`app.engine.ray_backend_per_message`) puts the loader in Ray's object store once per run "
                  "(each actor fetches it at its first message) and starts Ray with objects up to 1 MiB passed "
                  "inline."),
        paragraph("What only Flower can cut: the context's round trip. Flower keeps every node's context in "
                  "the ServerApp's process (`vce_api.py`, `worker`: `DeprecatedRunInfoStore`), ships it to "
                  "whichever actor is idle with each message and takes it back with the reply "
                  "(`flwr/simulation/ray_transport/ray_actor.py`, `VirtualClientEngineActor.run`): twice the "
                  "client's state per message, however little changed. The `resident` column is a local patch "
                  "(`--trace --resident-contexts`, for the measurement only): each node's messages go to one "
                  "actor, which keeps the node's context, so it crosses once per run. Proposal: actors that "
                  "keep the contexts of the nodes they serve (a context moves only when its node moves to "
                  "another actor), and the ClientApp loader given to an actor when it is created, not with "
                  "each message."),
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--once", choices=ENGINES)
    parser.add_argument("--trace", action="store_true")
    parser.add_argument("--resident-contexts", action="store_true", help="--trace under a local patch of Flower's "
                        "runtime: each node's context kept in its actor")
    parser.add_argument("--label", default="checkout")
    parser.add_argument("--log", type=Path)
    parser.add_argument("--collect", type=Path, help="a log of --once and --trace lines")
    parser.add_argument("--measure", default="python benchmarks/simulation_steps.py --once ENGINE, alternated")
    parser.add_argument("--report", action="store_true", help="only render the page from the JSON file")
    args = parser.parse_args()
    if args.once or args.trace:
        line = {"label": args.label, **(trace(args.resident_contexts) if args.trace else once(args.once))}
        with open(args.log, "a") as log:
            log.write(json.dumps(line) + "\n")
        print(json.dumps(line))
        return
    if args.collect:
        lines = [json.loads(line) for line in args.collect.read_text().splitlines() if line.strip()]
        result = {"measure": args.measure, "checkouts": collect(lines), "lines": lines}
        (RESULTS_DIR / RESULTS).write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps({k: {x: v[x] for x in ("median", "step_ratio")} for k, v in result["checkouts"].items()},
                         indent=2))
    render_page_of("transport.py")  # its page holds this section


if __name__ == "__main__":
    main()
