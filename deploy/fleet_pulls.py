"""A SuperNode's pull answered as soon as a message for it is stored, not at its next poll.

Flower's SuperLink answers a Fleet ``pull-messages`` request at once, empty when no message waits
for the node, and Flower's SuperNode asks again 3 s later (through :mod:`deploy.flower_shim`: after
a back-off that starts at 50 ms). Every empty pull is a signed HTTP request that costs the
SuperNode, the gateway and the SuperLink CPU. Through the shim a SuperLink holds a pull that found
nothing for up to :data:`HOLD_S`, until its LinkState stores a message for that node
(``store_message_ins``), then looks again: a message reaches an idle node when it is stored, and an
idle node asks about once per :data:`HOLD_S`. The SuperNode's back-off counts the time its pull was
held (:class:`deploy.flower_shim.PollClock`), so against a SuperLink that answers at once it polls
as before.

What a pull returns is Flower's handler's answer, looked up again after the wait: the node's
authentication (checked before the handler runs), the gateway's allow-list and the messages
themselves are untouched. A held pull holds one of the SuperLink's worker threads: at most
:data:`HELD_AT_ONCE` are held at a time, and one per node (a node that sends many pulls at once
takes no other node's slot); others are answered at once as Flower does.
"""

from __future__ import annotations

import collections
import functools
import threading
from types import ModuleType

#: seconds an empty pull waits for a message to its node: Flower's SuperNode idle wait (3 s), well
#: under the gateway's upstream timeout and Flower's client timeout (30 s each)
HOLD_S = 3.0
#: pulls held at once (each holds one of the SuperLink's worker threads; its pool has 40)
HELD_AT_ONCE = 16


class Arrivals:
    """A count of the messages stored for each node, and a wait for it to change."""

    def __init__(self, held_at_once: int = HELD_AT_ONCE) -> None:
        self._changed = threading.Condition()
        self._stored: collections.Counter[int] = collections.Counter()
        self._held_at_once = held_at_once
        self._holding: set[int] = set()  # the nodes whose pull waits

    def stored(self, node_id: int) -> None:
        with self._changed:
            self._stored[node_id] += 1
            self._changed.notify_all()

    def mark(self, node_id: int) -> int:
        with self._changed:
            return self._stored[node_id]

    def wait_past(self, node_id: int, mark: int, timeout: float) -> bool:
        """Whether a message for ``node_id`` was stored after :meth:`mark` gave ``mark``, waiting
        up to ``timeout`` seconds for one; without waiting when ``held_at_once`` pulls wait, or
        one of the same node does (a SuperNode sends one pull at a time: more at once would only
        take the slots of others)."""
        with self._changed:
            if node_id in self._holding or len(self._holding) >= self._held_at_once:
                return self._stored[node_id] != mark
            self._holding.add(node_id)
            try:
                return self._changed.wait_for(lambda: self._stored[node_id] != mark, timeout)
            finally:
                self._holding.discard(node_id)


def hold_empty_pulls(handlers: ModuleType, states: tuple[type, ...], arrivals: Arrivals | None = None,
                     hold_s: float = HOLD_S) -> Arrivals:
    """Make ``handlers`` (``flwr.superlink.servicer.fleet.fleet_handlers``) hold a pull that finds
    no message until one of ``states`` (LinkState classes) stores one for the node, or ``hold_s``."""
    arrivals = arrivals or Arrivals()
    pull = handlers.pull_messages

    @functools.wraps(pull)
    def pull_messages(request, state, store):
        node_id = request.node.node_id
        mark = arrivals.mark(node_id)  # before looking: a message stored meanwhile ends the wait at once
        response = pull(request=request, state=state, store=store)
        if not response.messages_list and arrivals.wait_past(node_id, mark, hold_s):
            response = pull(request=request, state=state, store=store)
        return response

    handlers.pull_messages = pull_messages
    for state in states:
        state.store_message_ins = _counting(state.store_message_ins, arrivals)
    return arrivals


def _counting(store, arrivals: Arrivals):
    """A LinkState's ``store_message_ins`` (``store``) that counts each stored message for its node."""
    @functools.wraps(store)
    def store_message_ins(self, message):
        stored = store(self, message)
        if stored is not None:
            arrivals.stored(message.metadata.dst_node_id)
        return stored

    return store_message_ins
