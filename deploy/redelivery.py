"""What the Fleet gateway keeps so that a SuperNode loses no message to a lost answer.

:class:`Deliveries` delivers a pull-messages answer again to a node whose delivery never
reached it; :class:`Activations` answers a repeated activate-node as the first one was answered
(:mod:`deploy.gateway` calls both on every answer the SuperLink gives with 200, or refuses).
Plain state over request and answer bytes (Flower's protobuf messages); no I/O.
"""

from __future__ import annotations

import base64
import json
import time
from collections import OrderedDict
from dataclasses import dataclass

from flwr.proto.fleet_pb2 import (ActivateNodeRequest, PullMessagesRequest,  # pylint: disable=no-name-in-module
                                  PullMessagesResponse, PushMessagesRequest)
from flwr.proto.message_pb2 import ConfirmMessageReceivedRequest  # pylint: disable=no-name-in-module
from flwr.supercore.error import ApiErrorCode
from google.protobuf.message import DecodeError

MIB = 1 << 20
#: the Fleet calls whose answers are kept or watched here, as request targets
ACTIVATE, PULL_MESSAGES = b"/v1/fleet/activate-node", b"/v1/fleet/pull-messages"
PUSH_MESSAGES, CONFIRM = b"/v1/fleet/push-messages", b"/v1/fleet/confirm-message-received"
#: delivered messages kept for redelivery (:class:`Deliveries`): at most this many nodes' answers and
#: bytes at once (the oldest forgotten first); each message delivered again at most REDELIVERIES times
KEPT_DELIVERIES, KEPT_DELIVERY_BYTES, REDELIVERIES = 4096, 64 * MIB, 3
#: an activation answered here is repeated for the same key within this time (:class:`Activations`)
ACTIVATION_REPEAT_S = 60.0


@dataclass
class Delivery:
    """A pull-messages answer that carried message ``message_id`` to a node."""

    message_id: str
    answer: bytes
    expires: float  # wall-clock seconds: the message's created_at + ttl
    left: int = REDELIVERIES


class Deliveries:
    """Per node id, its last pull-messages answer that carried a message the node has not yet
    confirmed (confirm-message-received) or replied to (push-messages): a SuperNode handles one
    message at a time and asks for the next only once it has confirmed one, so its empty
    pull-messages while it holds an unconfirmed delivery means the delivery never reached it
    (the answer was lost on the way, or the receive failed); that pull-messages is answered with
    the kept answer instead, at most :data:`REDELIVERIES` times per message and only before the
    message expires. The SuperLink serves a message's objects until it is confirmed. Only
    answers the SuperLink gave with 200 count, and it gives 200 only to a request signed by the
    node the request names. Bounded: :data:`KEPT_DELIVERIES` answers, :data:`KEPT_DELIVERY_BYTES`."""

    def __init__(self, note, count: int = KEPT_DELIVERIES, size: int = KEPT_DELIVERY_BYTES, clock=time.time) -> None:
        self.note, self.count, self.size, self.clock = note, count, size, clock
        self.kept: OrderedDict[int, Delivery] = OrderedDict()
        self.held = 0

    def answer(self, target: bytes, request: bytes, answer: bytes) -> bytes:
        """The answer to send for the SuperLink's 200 ``answer`` to ``request`` at ``target``."""
        try:
            if target == PULL_MESSAGES:
                return self._pulled(PullMessagesRequest.FromString(request).node.node_id, answer)
            if target == CONFIRM:
                confirmed = ConfirmMessageReceivedRequest.FromString(request)
                self._settled(confirmed.node.node_id, {confirmed.message_object_id})
            elif target == PUSH_MESSAGES:
                pushed = PushMessagesRequest.FromString(request)
                self._settled(pushed.node.node_id, {m.metadata.reply_to_message_id for m in pushed.messages_list})
        except DecodeError:
            pass  # the SuperLink took it: not a request this bookkeeping knows
        return answer

    def _pulled(self, node: int, answer: bytes) -> bytes:
        messages = PullMessagesResponse.FromString(answer).messages_list
        if messages:
            metadata = messages[0].metadata
            self._keep(node, Delivery(metadata.message_id, answer, metadata.created_at + metadata.ttl))
            return answer
        kept = self.kept.get(node)
        if kept is None:
            return answer
        if kept.left == 0 or kept.expires <= self.clock():
            self._forget(node)
            return answer
        kept.left -= 1
        self.note(f"delivered message {kept.message_id[:16]} to node {node} again: its delivery was not confirmed")
        return kept.answer

    def _settled(self, node: int, message_ids: set[str]) -> None:
        if node in self.kept and self.kept[node].message_id in message_ids:
            self._forget(node)

    def _keep(self, node: int, delivery: Delivery) -> None:
        self._forget(node)
        self.kept[node] = delivery
        self.held += len(delivery.answer)
        while len(self.kept) > self.count or self.held > self.size:
            self._forget(next(iter(self.kept)))

    def _forget(self, node: int) -> None:
        if (delivery := self.kept.pop(node, None)) is not None:
            self.held -= len(delivery.answer)


class Activations:
    """activate-node answers by public key, each until the key's next other request, for at most
    :data:`ACTIVATION_REPEAT_S`: a SuperNode whose activation answer was lost asks again at once,
    and the SuperLink refuses to activate an active key (412, FLEET_NODE_ACTIVATION_FAILED; the
    SuperNode then exits). That refusal, for a key activated here and silent since, is answered
    with the first activation's answer. A key that has sent anything since (its heartbeats start
    at once) is refused as the SuperLink says. Bounded: :data:`KEPT_DELIVERIES` keys."""

    def __init__(self, note, count: int = KEPT_DELIVERIES, clock=time.monotonic) -> None:
        self.note, self.count, self.clock = note, count, clock
        self.kept: OrderedDict[bytes, tuple[float, bytes]] = OrderedDict()

    def answer(self, target: bytes, key_header: bytes | None, request: bytes, status: int,
               answer: bytes) -> tuple[int, bytes] | None:
        """The answer (status, body) to send instead of the SuperLink's, or None: the SuperLink's."""
        if target != ACTIVATE:
            if status == 200 and key_header is not None:
                self.kept.pop(key_header, None)
            return None
        try:
            key = base64.b64encode(ActivateNodeRequest.FromString(request).public_key)
        except DecodeError:
            return None
        if status == 200:
            self.kept.pop(key, None)
            self.kept[key] = (self.clock(), answer)
            while len(self.kept) > self.count:
                self.kept.popitem(last=False)
            return None
        kept = self.kept.get(key)
        if kept is None or self.clock() - kept[0] > ACTIVATION_REPEAT_S or not _activation_refused(status, answer):
            return None
        self.note("answered a repeated activate-node with its first answer (the SuperLink refuses an active key)")
        return 200, kept[1]


def _activation_refused(status: int, answer: bytes) -> bool:
    try:
        return status == 412 and json.loads(answer).get("code") == ApiErrorCode.FLEET_NODE_ACTIVATION_FAILED
    except (ValueError, AttributeError):
        return False
