"""Echo app for the transport benchmark (see benchmarks/transport.py).

One warm-up round, then ``rounds`` rounds for each polling mode, alternating
(back-off poll of ``fedgraphcore.transport`` vs Flower's ``Grid.send_and_receive``), so
both see the same engine state. Writes the timings as JSON to ``out``.
"""

from __future__ import annotations

import json
import time

import numpy as np
from flwr.app import Context, Message
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from app.engine import EngineWatch, speed_up_runtime_in_simulation
from fedgraphcore.transport import CommStats, exchange, pack, unpack
from fedgraphcore.wire import ArraySpec, ReplySpec

SPEC = ReplySpec(arrays={"x": ArraySpec((8,))})

server = ServerApp()
client = ClientApp()
speed_up_runtime_in_simulation()  # under flwr run: as the project's ClientApp does (app.client_app)


@client.query("echo")
def echo(message: Message, context: Context) -> Message:
    arrays, _ = unpack(message.content)
    return Message(pack({"x": arrays["x"] + 1.0}), reply_to=message)


def one_round(grid: Grid, nodes: list[int], mode: str, stats: CommStats, round_: int) -> float:
    messages = [Message(pack({"x": np.zeros(8)}), dst_node_id=n, message_type="query.echo",
                        group_id=str(round_)) for n in nodes]
    result = exchange(grid, messages, SPEC, timeout=120.0, stats=stats, poll=mode)
    if len(result.replies) != len(nodes):
        raise RuntimeError(f"{mode}: {len(result.replies)} of {len(nodes)} replies: {result.rejected}")
    return result.seconds


def run(grid: Grid, rounds: int, clients: int) -> dict:
    grid = EngineWatch().grid(grid)  # as the project's ServerApp does: replies pulled when stored
    while len(list(grid.get_node_ids())) < clients:
        time.sleep(0.05)
    nodes = sorted(grid.get_node_ids())[:clients]
    stats = CommStats()
    first = one_round(grid, nodes, "backoff", stats, 0)
    per_mode: dict[str, list[float]] = {"backoff": [], "flower": []}
    for r in range(rounds):
        for mode in ("backoff", "flower") if r % 2 == 0 else ("flower", "backoff"):
            per_mode[mode].append(one_round(grid, nodes, mode, stats, r + 1))
    return {
        "clients": clients,
        "first_round_s": first,
        "steady": {
            mode: {"mean_s": float(np.mean(t)), "median_s": float(np.median(t)),
                   "p95_s": float(np.percentile(t, 95)), "rounds": len(t)}
            for mode, t in per_mode.items()
        },
    }


@server.main()
def main(grid: Grid, context: Context) -> None:
    report = run(grid, int(context.run_config["rounds"]), int(context.run_config["clients"]))
    with open(str(context.run_config["out"]), "w") as f:
        json.dump(report, f, indent=2)
