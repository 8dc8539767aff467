"""A Flower ``Grid`` that hands each message straight to a ClientApp.

It runs the very same ServerApp and ClientApp code as ``flwr run`` and
``run_simulation``, without the engine: ``push_messages`` calls
``client_app(message, context)`` for the destination node (one persistent
``Context`` per node, so ``context.state`` carries over between steps) and
``pull_messages`` returns the replies. Message contents are serialised and
parsed on the way in and out, as on the wire, so a client can neither share
objects with the server nor send something Flower could not transmit.
Used by the tests and by benchmark suites, where starting Ray for every
experiment would dominate the run time.

The nodes run one after another, so the wall time of a round is the sum of
their work. Each node's share (parse, handle, serialise the reply) is kept
per message; ``take_client_seconds`` hands them to the session, which
derives the round's time with the nodes side by side (the slowest node).
"""

from __future__ import annotations

import secrets
import time
from typing import Iterable
from uuid import uuid4

from flwr.app import Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.serde import recorddict_from_proto, recorddict_to_proto
from flwr.serverapp import Grid
from flwr.supercore.task_identity import TaskIdentity

SERVER_NODE_ID = 1
FIRST_CLIENT_NODE_ID = 1001


def _wire_copy(content: RecordDict) -> RecordDict:
    return recorddict_from_proto(recorddict_to_proto(content))


class InProcessGrid(Grid):
    """``num_nodes`` in-process SuperNodes running ``client_app``.

    ``node_configs`` optionally gives each node its node-config (default:
    ``partition-id`` i of ``num-partitions``, as in simulation). With
    ``record`` every message pushed and every reply pulled is kept in
    ``pushed`` / ``pulled``, so tests can check what went over the wire. Its run id is random
    (62 bits, as a SuperLink's is random; the 63rd is set so the id, and every message, has one size): a party's outputs and ledger rows are kept apart by run id,
    which a count restarting in every process would repeat.
    """

    def __init__(self, client_app: ClientApp, num_nodes: int, node_configs=None, record: bool = False) -> None:
        self.client_app = client_app
        self.record = record
        self.pushed: list[Message] = []
        self.pulled: list[Message] = []
        # the top bit set keeps the run id's varint length, and so every message's size, fixed
        self.run_id = secrets.randbits(62) | 1 << 62
        configs = node_configs or [
            {"partition-id": i, "num-partitions": num_nodes} for i in range(num_nodes)
        ]
        self.contexts = {
            FIRST_CLIENT_NODE_ID + i: Context(
                run_id=self.run_id, node_id=FIRST_CLIENT_NODE_ID + i, node_config=dict(cfg),
                state=RecordDict(), run_config={},
            )
            for i, cfg in enumerate(configs)
        }
        self.dropped: set[int] = set()  # disconnected: gone from get_node_ids, never answer
        self.silent: set[int] = set()  # connected but never answer (hung client)
        self.ignore_next: dict[int, int] = {}  # node -> messages to drop before answering again
        self._replies: dict[str, Message] = {}
        self._client_seconds: list[float] = []
        TaskIdentity.run_id = self.run_id
        TaskIdentity.node_id = SERVER_NODE_ID
        TaskIdentity.task_id = self.run_id

    # Grid interface ------------------------------------------------------------
    def set_run(self, run) -> None:  # the in-process grid has a single run
        raise NotImplementedError("InProcessGrid runs one run; create a new grid instead")

    @property
    def run(self):
        raise NotImplementedError("InProcessGrid has no SuperLink run record")

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None) -> Message:
        return Message(content, dst_node_id=dst_node_id, message_type=message_type, group_id=group_id, ttl=ttl)

    def get_node_ids(self) -> Iterable[int]:
        return [n for n in self.contexts if n not in self.dropped]

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        for message in messages:
            if self.record:
                self.pushed.append(message)
            message_id = uuid4().hex
            message.metadata.__dict__["_message_id"] = message_id
            ids.append(message_id)
            node = message.metadata.dst_node_id
            if node in self.dropped or node in self.silent or node not in self.contexts:
                continue
            if self.ignore_next.get(node, 0) > 0:  # a message lost on the way
                self.ignore_next[node] -= 1
                continue
            started = time.perf_counter()
            inbound = Message(metadata=message.metadata, content=_wire_copy(message.content))
            try:
                reply = self.client_app(inbound, self.contexts[node])
                if reply.has_content():
                    reply = Message(metadata=reply.metadata, content=_wire_copy(reply.content))
            except Exception as err:  # the engine turns client exceptions into error replies
                reply = Message(Error(code=0, reason=f"{type(err).__name__}: {err}"), reply_to=message)
            self._client_seconds.append(time.perf_counter() - started)
            reply.metadata.__dict__["_message_id"] = uuid4().hex
            self._replies[message_id] = reply
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        replies = [self._replies.pop(i) for i in list(message_ids) if i in self._replies]
        if self.record:
            self.pulled.extend(replies)
        return replies

    def send_and_receive(self, messages, *, timeout=None) -> Iterable[Message]:
        return self.pull_messages(self.push_messages(messages))

    # Timing ----------------------------------------------------------------------
    def take_client_seconds(self) -> list[float]:
        """Seconds each node spent on the messages pushed since the last call
        (parsing the message, the ClientApp, serialising the reply)."""
        seconds, self._client_seconds = self._client_seconds, []
        return seconds
