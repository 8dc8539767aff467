"""A malicious server's hands: one member's real ClientApp, driven with messages of the server's choosing.

In a deployment the ServerApp is the operator's code, so it may send a member any message the
ClientApp accepts, in any order, any number of times, with arrays it crafts. :class:`Member` does
exactly that to one member: its real ClientApp (:func:`app.client_app.build_client_app`) behind an
in-process grid of one node, whose ``Context`` lasts for a run (:meth:`Member.new_run` starts
another, as a new ``flwr run`` would), under the member's own node config (``shard=`` and its
policy). Every reply comes back as the server would read it (:class:`Reply`); a refusal names its
rule, an error its public text.

:func:`shard_files` writes the members' shard files as ``python -m app.data.prepare`` does, so
that a member's release record and privacy ledger live beside its data across runs, as in a
deployment.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from app.client_app import build_client_app
from app.inprocess import InProcessGrid
from app.registry import STRATEGIES
from fedgraphcore.transport import pack, refused_rule, unpack

NODE = 1001


def shard_files(out: Path, clients: int, partitioner: str = "node-random", **data) -> list[Path]:
    """One shard file per member under ``out`` (sbm, ``data``: its ``sbm.*`` / ``partition.*`` keys)."""
    from fedgraphcore.data import prepare

    prepare.run(["--dataset", "sbm", "--partitioner", partitioner, "--num-clients", str(clients), "--out", str(out),
                 *sum((["--set", f"{k}={v}"] for k, v in data.items()), [])])
    return [out / f"client-{i}.npz" for i in range(clients)]


@dataclass
class Reply:
    """What the server read back: the reply's arrays and values, or the rule of a refusal, or the
    public text of an error reply."""

    arrays: dict = field(default_factory=dict)
    values: dict = field(default_factory=dict)
    refused: str | None = None
    error: str | None = None

    @property
    def answered(self) -> bool:
        return self.refused is None and self.error is None


def _trains(action: str) -> bool:
    """Whether ``action`` goes as Flower's ``train`` message type (its client marks it so)."""
    for entry in STRATEGIES.values():
        marked = entry.client.steps().get(action)
        if marked is not None:
            return marked[1]
    return False


class Member:
    """One member's ClientApp under ``node_config``, for run-configs ``raw`` (see module docstring)."""

    def __init__(self, raw: dict, node_config: dict) -> None:
        self.raw, self.node_config = dict(raw), dict(node_config)
        self.app = build_client_app(self.raw)
        self.runs = 0
        self.new_run()

    def new_run(self, raw: dict | None = None) -> "Member":
        """A new run (a fresh context, another run id), with run-config ``raw`` if given."""
        if raw is not None:
            self.raw = dict(raw)
            self.app = build_client_app(self.raw)
        self.grid = InProcessGrid(self.app, 1, [self.node_config])
        self.runs += 1
        return self

    def restart(self) -> "Member":
        """The member's node restarted within the run: the same run id, a fresh context."""
        from flwr.app import RecordDict

        self.grid.contexts[NODE].state = RecordDict()
        return self

    @property
    def client(self):
        """The member's latest client object's context state (what it keeps between steps)."""
        return self.grid.contexts[NODE].state

    def send(self, action: str, arrays: dict | None = None, values: dict | None = None) -> Reply:
        """One message of ``action`` to the member; its reply as the server reads it."""
        kind = "train" if _trains(action) else "query"
        message = self.grid.create_message(pack(arrays or None, values or None), f"{kind}.{action}", NODE, "rogue")
        (reply,) = self.grid.pull_messages(self.grid.push_messages([message]))
        if reply.has_error():
            return Reply(error=reply.error.reason)
        rule = refused_rule(reply.content)
        if rule is not None:
            return Reply(refused=rule)
        got_arrays, got_values = unpack(reply.content)
        return Reply(got_arrays, got_values)

    def features(self) -> np.ndarray:
        """The member's feature rows (what the attacks try to read)."""
        from fedgraphcore.data.shards import load_shard_file

        shard = load_shard_file(self.node_config["shard"])
        x = shard.x
        return np.asarray(x.toarray() if hasattr(x, "toarray") else x, dtype=np.float64)
