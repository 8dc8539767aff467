"""A fuzzing malicious server: accepted messages in any order, repeated, with crafted arrays of valid shape.

For one strategy, :func:`vocabulary` records what an honest server sends member 0 in a run (the
real ServerApp on an in-process grid): every message the member's ClientApp accepts, with its
step, arrays and values. :func:`fuzz` then drives a fresh member's real ClientApp
(:class:`rogue_server.Member`, one context a sequence) with seeded sequences of those messages:
hello first, then any order, any one sent again at once, each float array either as recorded or crafted with its
shape kept (:data:`CRAFTS`: random, a grid on one axis, one-hot rows, one row repeated, scaled by
1e3). Everything the member answers is recorded as the server reads it in a
:class:`malicious_server.Capture` (requests and reply arrays; ring arrays kept apart as masked),
and :func:`malicious_server.leaks` and :func:`malicious_server.counted_statistics` search it for
the member's rows, as for a whole run.

:class:`Outcome` says what the server got: the rows found, the smallest statistic's row count,
the releases answered per step (a request answered again with its first reply counts once) and
the refusals by rule, and the label bits it read of each row (in all, and the most in one run).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from app.client_app import build_client_app
from app.inprocess import FIRST_CLIENT_NODE_ID, InProcessGrid
from fedgraphcore.privacy.policy import MIN_ROWS
from app.registry import STRATEGIES
from app.server_app import run_server
from fedgraphcore.transport import unpack
from fedgraphcore.wire import HELLO, SECAGG_PEER
from clients.base import request_digest
from malicious_server import Capture, Read, Request, counted_statistics, leaks
from rogue_server import Member, Reply

CRAFTS = ("as-recorded", "random", "grid", "one-hot", "one-row", "scaled")
CLIENTS = 3


def node_config(policy: dict, i: int = 0) -> dict:
    return {"partition-id": i, "num-partitions": CLIENTS, **{f"privacy.all.{k}": v for k, v in policy.items()}}


def vocabulary(raw: dict, policy: dict, out) -> list[tuple[str, dict, dict]]:
    """(step, arrays, values) of every message an honest run of ``raw`` sends member 0."""
    grid = InProcessGrid(build_client_app(raw), CLIENTS, [node_config(policy, i) for i in range(CLIENTS)],
                         record=True)
    try:
        run_server(grid, {**raw, "out-dir": str(out)})
    except Exception:  # a refused or stopped honest run: the messages it sent are the vocabulary all the same
        pass
    words = []
    for message in grid.pushed:
        if message.metadata.dst_node_id == FIRST_CLIENT_NODE_ID:
            arrays, values = unpack(message.content)
            words.append((message.metadata.message_type.split(".", 1)[1], arrays, values))
    return words


def craft(array: np.ndarray, how: str, rng: np.random.Generator) -> np.ndarray:
    """``array`` with its shape and dtype, its values crafted ``how`` (float arrays only)."""
    a = np.asarray(array)
    if how == "as-recorded" or a.dtype.kind != "f" or a.size == 0:
        return a
    scale = float(np.abs(a).max()) or 1.0
    flat = a.reshape(a.shape[0], -1) if a.ndim else a.reshape(1, 1)
    if how == "random":
        out = rng.normal(size=flat.shape) * scale
    elif how == "grid":
        out = np.zeros(flat.shape)
        out[:, 0] = np.linspace(-3 * scale, 3 * scale, flat.shape[0])
    elif how == "one-hot":
        out = np.zeros(flat.shape)
        out[np.arange(flat.shape[0]), np.arange(flat.shape[0]) % flat.shape[1]] = scale
    elif how == "one-row":
        out = np.repeat(flat[:1], flat.shape[0], axis=0)
    else:
        out = flat * 1e3
    return out.reshape(a.shape).astype(a.dtype)


@dataclass
class Outcome:
    """What a fuzzing server got from one strategy (see module docstring)."""

    found: list[str] = field(default_factory=list)
    fewest_rows: int | None = None
    answered: Counter = field(default_factory=Counter)
    refused: Counter = field(default_factory=Counter)
    label_bits: float = 0.0
    most_label_bits: float = 0.0  # in one run
    messages: int = 0
    requests: set = field(default_factory=set)  # (step, request digest) answered: a release each


def fuzz(raw: dict, policy: dict, words: list, sequences: int, length: int, seed: int, monkeypatch) -> Outcome:
    """``sequences`` seeded sequences of ``length`` messages from ``words`` against member 0 (see module
    docstring), every reply searched for its rows."""
    rng, outcome = np.random.default_rng(seed), Outcome()
    capture = Capture().install(monkeypatch)
    k = int(raw.get("num-clusters", 0))
    hello = next(w for w in words if w[0] == HELLO)
    for _ in range(sequences):
        member, last, bits = Member(raw, node_config(policy)), None, outcome.label_bits
        outcome.requests.clear()  # a new run: its releases are its own
        own = _read(capture, member, *hello, outcome, k).values.get("public_key")  # before hello all is refused
        for _ in range(length - 1):
            if last is not None and rng.random() < 0.2:
                step, arrays, values = last  # the same request again at once
            else:
                step, arrays, values = words[rng.integers(len(words))]
                arrays = {n: craft(a, CRAFTS[rng.integers(len(CRAFTS))], rng) for n, a in arrays.items()}
                if own is not None and f"{SECAGG_PEER}0" in values:  # relay the member's own key back to it
                    values = {**values, f"{SECAGG_PEER}0": own}
            last = (step, arrays, values)
            _read(capture, member, step, arrays, values, outcome, k)
        outcome.most_label_bits = max(outcome.most_label_bits, outcome.label_bits - bits)
    outcome.found = [str(leak) for leak in leaks(capture, k)]
    counted = [count for read, count in counted_statistics(capture, k) if read.kind != "masked"]
    outcome.fewest_rows = min(counted) if counted else None
    return outcome


def _read(capture: Capture, member: Member, step: str, arrays: dict, values: dict, outcome: Outcome,
          k: int) -> Reply:
    """Send one message, and record the request and what came back as the server reads it."""
    node = FIRST_CLIENT_NODE_ID
    capture.requests.append(Request(step, node, arrays, values, capture._next()))
    capture.step = step
    reply = member.send(step, arrays, values)
    outcome.messages += 1
    if not reply.answered:
        outcome.refused[reply.refused or "error"] += 1
        return reply
    digest = bytes(request_digest(arrays, values)).hex()
    if (step, digest) in outcome.requests:
        return reply  # the first reply again: nothing new for the server
    outcome.requests.add((step, digest))
    outcome.answered[step] += 1
    for name, array in reply.arrays.items():
        masked = np.asarray(array).dtype.kind == "u" and name not in ("sealed", "tags")
        capture.reads.append(Read(step, node, name, array, "masked" if masked else "clear", capture._next()))
        if name == "labels" and step in STRATEGIES[member.raw["strategy"]].client.label_steps and np.size(array):
            outcome.label_bits += float(np.log2(max(int(np.asarray(array).max()) + 1, k, 2)))
    return reply


def rows_floor(policy: dict) -> int:
    """The least rows a statistic may sum under ``policy``."""
    return int(policy.get("min-rows", MIN_ROWS))
