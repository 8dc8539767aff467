"""Fast message exchange with the clients, reply validation and traffic counts.

Flower's ``Grid.send_and_receive`` sleeps a fixed interval between polls (3 s
on a real SuperLink, 0.1 s in simulation), so a protocol with hundreds of short
rounds spends most of its time asleep. :func:`exchange` pushes a batch of
messages and polls with a short exponential back-off (2 ms doubling to 50 ms),
then checks every reply against its :class:`fedgraphcore.wire.ReplySpec` (:func:`reply_problem`)
before a strategy sees it. A SuperNode that failed to receive a message (its run, app
bundle or objects could not be pulled) answers with an error reply, code ``MESSAGE_UNAVAILABLE``,
whose reason starts with :data:`NOT_RECEIVED` (:mod:`deploy.flower_shim`); the
exchange rejects it with that reason, and :meth:`fedgraphcore.session.ServerSession.exchange`
sends such a message again (its ClientApp never ran).

Wire format used by every strategy (see :func:`pack` / :func:`unpack`): a
``RecordDict`` with a ``ConfigRecord`` under ``"values"`` (scalars, strings,
lists of scalars) and every numpy array of the message in one byte string
(:func:`bundle`). A bundle of at most :data:`INLINE_BUNDLE_MAX_BYTES` is the
bytes value :data:`BUNDLE_KEY` of that record; a larger one is the one Flower
``Array`` (stype :data:`BUNDLE_STYPE`) of an ``ArrayRecord`` under
``"arrays"``, which Flower splits into chunks. A deployed message travels as
one request per object (message, record dict, record, array, array chunk) on
every hop: a GNN's 40 weight tensors as arrays would cost 80 requests, an
inline bundle none beyond the message's three.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.common.constant import FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE, ErrorCode
from flwr.serverapp import Grid
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects, no_object_id_recompute

from fedgraphcore.wire import ReplySpec

ARRAYS = "arrays"
VALUES = "values"
#: the one entry of the ``"arrays"`` record, and its Flower serialisation type (:func:`bundle`)
BUNDLE = "bundle"
BUNDLE_STYPE = "fedgraph.arrays"
#: the ``"values"`` entry of a bundle sent inline, and the largest bundle sent so (Flower's array
#: chunk: no object on the wire is larger than the ones Flower makes)
BUNDLE_KEY = "fedgraph.arrays"
INLINE_BUNDLE_MAX_BYTES = FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE
#: array kinds a bundle carries: bool, signed and unsigned integers, floats, complex (no objects)
BUNDLE_KINDS = "biufc"
_HEADER_LENGTH_BYTES = 8

POLL_START_S = 0.002
POLL_MAX_S = 0.05
LIVENESS_EVERY_S = 1.0
NO_REPLY = "no reply within"
LEFT = "left the federation"
#: how the reason of a SuperNode's error reply for a message it could not receive starts (and the
#: reject it becomes): the message never reached its ClientApp, so sending it again is safe
NOT_RECEIVED = "message not received by the SuperNode"
#: times one exchange sends again the messages whose SuperNode did not receive them
NOT_RECEIVED_RESENDS = 3
#: what Flower's SuperNode means by "ClientApp stopped responding" (its error for every open message
#: of a run once one of the run's ClientApp processes sent no heartbeat for a minute)
CLIENTAPP_SILENT = ("a ClientApp process of this run on that SuperNode sent no heartbeat for 60 s: it ended "
                    "without reporting or was stopped; see the SuperNode's log")


def pack(arrays: Mapping[str, np.ndarray] | None = None, values: Mapping | None = None) -> RecordDict:
    """Build message content from numpy arrays (one :func:`bundle`) and plain values."""
    values = dict(values or {})
    if BUNDLE_KEY in values:
        raise ValueError(f"value name {BUNDLE_KEY!r} is the bundle's own; choose another")
    content = RecordDict()
    if arrays:
        blob = bundle(arrays)
        if len(blob) <= INLINE_BUNDLE_MAX_BYTES:
            values[BUNDLE_KEY] = blob
        else:
            content[ARRAYS] = ArrayRecord({BUNDLE: Array(dtype="uint8", shape=(len(blob),), stype=BUNDLE_STYPE,
                                                         data=blob)})
    if values:
        content[VALUES] = ConfigRecord(values)
    return content


def unpack(content: RecordDict) -> tuple[dict[str, np.ndarray], dict]:
    """Inverse of :func:`pack`: ``(arrays, values)`` (each array a fresh, writable copy)."""
    arrays = {}
    if _has_bundle(content):
        data, layout, start = _bundled(content)
        for name, dtype, shape in layout:
            count = int(np.prod(shape, dtype=np.int64))
            arrays[name] = np.frombuffer(data, dtype=dtype, count=count, offset=start).reshape(shape).copy()
            start += count * dtype.itemsize
    return arrays, _values(content)


def describe(content: RecordDict) -> tuple[dict[str, tuple[tuple[int, ...], str]], dict]:
    """``({name: (shape, dtype)}, values)`` of :func:`pack`-ed content, read from the
    bundle's header without decoding the data (for bookkeeping on large uploads)."""
    arrays = {}
    if _has_bundle(content):
        arrays = {name: (shape, str(dtype)) for name, dtype, shape in _bundled(content)[1]}
    return arrays, _values(content)


def bundle(arrays: Mapping[str, np.ndarray]) -> bytes:
    """Every array of ``arrays`` in one byte string: the length of a JSON header (8 bytes,
    little-endian), the header ``[[name, dtype, shape], ...]`` (numpy's dtype strings, which
    name the byte order), then each array's bytes in C order, in the header's order."""
    parts = {str(name): np.ascontiguousarray(a) for name, a in arrays.items()}
    for name, a in parts.items():
        if a.dtype.kind not in BUNDLE_KINDS:
            raise ValueError(f"array '{name}' has dtype {a.dtype}; valid: bool, integer, float or complex")
    header = json.dumps([[name, a.dtype.str, list(a.shape)] for name, a in parts.items()]).encode()
    return b"".join([len(header).to_bytes(_HEADER_LENGTH_BYTES, "little"), header,
                     *(a.tobytes() for a in parts.values())])


def _has_bundle(content: RecordDict) -> bool:
    return ARRAYS in content.array_records or BUNDLE_KEY in content.config_records.get(VALUES, {})


def _bundle_bytes(content: RecordDict) -> bytes:
    """The bytes of ``content``'s one bundle, inline or as an array; ValueError if it has two,
    or an array record holding anything else."""
    inline = content.config_records.get(VALUES, {}).get(BUNDLE_KEY)
    if ARRAYS not in content.array_records:
        if not isinstance(inline, bytes):
            raise ValueError(f"value '{BUNDLE_KEY}' is {type(inline).__name__}, expected the bundle's bytes")
        return inline
    if inline is not None:
        raise ValueError(f"two bundles: value '{BUNDLE_KEY}' and record '{ARRAYS}'")
    record = content.array_records[ARRAYS]
    if list(record) != [BUNDLE] or record[BUNDLE].stype != BUNDLE_STYPE:
        raise ValueError(f"record '{ARRAYS}' holds {sorted(record)}, expected one '{BUNDLE}' of type {BUNDLE_STYPE}")
    return record[BUNDLE].data


def _bundled(content: RecordDict) -> tuple[bytes, list[tuple[str, np.dtype, tuple[int, ...]]], int]:
    """The bytes of ``content``'s bundle, its checked layout (name, dtype, shape per array) and
    where the first array starts; ValueError naming what is wrong in a malformed one."""
    data = _bundle_bytes(content)
    length = int.from_bytes(data[:_HEADER_LENGTH_BYTES], "little")
    start = _HEADER_LENGTH_BYTES + length
    if len(data) < start:
        raise ValueError(f"bundle of {len(data)} bytes is shorter than its header ({length} bytes)")
    try:
        entries = json.loads(data[_HEADER_LENGTH_BYTES:start])
        layout = [(str(name), np.dtype(dtype), tuple(int(n) for n in shape)) for name, dtype, shape in entries]
    except (ValueError, TypeError) as err:
        raise ValueError(f"bundle header unreadable: {err}") from None
    return data, _checked_layout(layout, len(data) - start), start


def _checked_layout(layout, body: int):
    """``layout`` if its names are distinct, its dtypes numbers, its shapes non-negative and
    its arrays fill exactly ``body`` bytes; else ValueError saying which."""
    names = [name for name, _, _ in layout]
    if len(set(names)) != len(names):
        raise ValueError(f"bundle names an array twice: {sorted(n for n in set(names) if names.count(n) > 1)}")
    for name, dtype, shape in layout:
        if dtype.kind not in BUNDLE_KINDS or any(n < 0 for n in shape):
            raise ValueError(f"bundle array '{name}' has dtype {dtype} and shape {shape}")
    needed = sum(int(np.prod(shape, dtype=np.int64)) * dtype.itemsize for _, dtype, shape in layout)
    if needed != body:
        raise ValueError(f"bundle holds {body} bytes of arrays, its header describes {needed}")
    return layout


def _values(content: RecordDict) -> dict:
    values = dict(content.config_records.get(VALUES, {}))
    values.pop(BUNDLE_KEY, None)
    return values


def reply_problem(spec: ReplySpec, content: RecordDict) -> str | None:
    """Why ``content`` is not a valid reply to ``spec``, or None: only :func:`pack`'s records,
    decodable, then :meth:`ReplySpec.problem` on the decoded arrays and values."""
    # pack() makes no other record, and none of another type under these names: the ledger would not see it
    stray = sorted((set(content.array_records) - {ARRAYS}) | (set(content.config_records) - {VALUES})
                   | set(content.metric_records))
    if stray:
        return f"unexpected record '{stray[0]}'"
    try:
        declared, _ = describe(content)  # names first: no decoding of an unexpected array
        if set(declared) - set(spec.arrays):
            return spec.problem(declared, {}, {})
        arrays, values = unpack(content)
    except Exception as err:  # malformed records from a misbehaving client
        return f"malformed reply: {err}"
    return spec.problem(declared, arrays, values)


@dataclass
class CommStats:
    """Traffic counters for one run.

    Bytes are the sizes of the objects Flower deflates a message into for the
    wire (records and array chunks, content-addressed), i.e. exactly what a
    SuperLink stores and forwards, excluding gRPC framing.
    """

    bytes_up: int = 0
    bytes_down: int = 0
    messages: int = 0
    secure_aggregations: int = 0
    rounds: list[dict] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {
            "bytes_up": self.bytes_up,
            "bytes_down": self.bytes_down,
            "messages": self.messages,
            "secure_aggregations": self.secure_aggregations,
        }


def message_bytes(message: Message) -> int:
    """Size of ``message`` as Flower's object store would hold it."""
    return messages_bytes([message])


def messages_bytes(messages: Sequence[Message]) -> int:
    """The summed :func:`message_bytes` of ``messages``, every object's ID computed once: Flower
    recomputes a record's ID (its deflated bytes, hashed) on every access, so that counting one
    message with an inline bundle hashed the bundle several times over."""
    with no_object_id_recompute():
        return sum(len(obj.deflate()) for message in messages for obj in get_all_nested_objects(message).values())


@dataclass
class Exchange:
    """Outcome of one exchange: accepted reply contents, rejects and timings.
    ``refused``: (node, content) of every reply that arrived but was not accepted (it left the
    client all the same): one that failed the check, or both of two replies to one message."""

    replies: dict[int, RecordDict]
    rejected: dict[int, str]
    seconds: float
    bytes_up: int
    bytes_down: int
    refused: list[tuple[int, RecordDict]] = field(default_factory=list)
    #: node -> the privacy-policy rule by which it refused the step (:func:`refusal`)
    refusals: dict[int, str] = field(default_factory=dict)


#: the one record of a reply by which a client refuses a step under its node's privacy policy
REFUSAL = "fedgraph.refusal"
REFUSED = "refused by its node's privacy policy"


def refusal(rule: str) -> RecordDict:
    """The reply by which a client refuses a step: the policy rule that forbids it, nothing else
    (what was asked and what the policy allows stay in the party's log)."""
    return RecordDict({REFUSAL: ConfigRecord({"rule": str(rule)})})


def refused_rule(content: RecordDict) -> str | None:
    """The rule of a refusal reply (:func:`refusal`), None for any other content."""
    record = content.config_records.get(REFUSAL)
    if record is None:
        return None
    rule = record.get("rule")
    return rule if isinstance(rule, str) and rule else "<unnamed>"


def _push_and_poll(
    grid: Grid, messages: Sequence[Message], deadline: float
) -> tuple[list[Message], set[int], set[int]]:
    """Push, then pull until every reply is in or ``deadline`` passes.

    The sleep between empty polls starts at 2 ms and doubles up to 50 ms;
    any reply resets it, since the others are usually close behind. A grid that
    signals stored replies (``grid.replies_stored``, with ``mark()`` and ``wait_past(mark,
    timeout)``: Flower's simulation runtime under :func:`app.engine.pick_up_on_push`, a
    deployed ServerApp whose SuperLink signals them, :mod:`deploy.flower_shim`) is pulled
    again as soon as a reply is stored instead, and at least once a second. About
    once a second the grid's node list is checked: a destination that has
    left the federation will not answer, so it is given up at once instead
    of at the deadline. Returns the replies, the nodes that left and the
    nodes whose message the grid did not take (an empty message id; Flower's
    grid returns no ids at all for a batch it refuses as too large).
    """
    ids = list(grid.push_messages(messages))
    if len(ids) != len(messages):
        ids = [""] * len(messages)
    undelivered = {m.metadata.dst_node_id for mid, m in zip(ids, messages) if not mid}
    node_of = {mid: m.metadata.dst_node_id for mid, m in zip(ids, messages) if mid}
    pending = set(node_of)
    received: list[Message] = []
    gone: set[int] = set()
    delay = POLL_START_S
    next_liveness = time.perf_counter() + LIVENESS_EVERY_S
    signal = getattr(grid, "replies_stored", None)
    while pending:
        mark = signal.mark() if signal is not None else None
        got = list(grid.pull_messages(pending))
        received.extend(got)
        pending.difference_update(m.metadata.reply_to_message_id for m in got)
        now = time.perf_counter()
        if pending and now >= next_liveness:
            alive = set(grid.get_node_ids())
            left = {mid for mid in pending if node_of[mid] not in alive}
            gone.update(node_of[mid] for mid in left)
            pending -= left
            next_liveness = now + LIVENESS_EVERY_S
        if not pending or now > deadline:
            break
        if signal is not None:
            if not got:
                signal.wait_past(mark, min(LIVENESS_EVERY_S, max(deadline - now, 0.0)))
        elif got:
            delay = POLL_START_S
        else:
            time.sleep(delay)
            delay = min(2 * delay, POLL_MAX_S)
    return received, gone, undelivered


POLL_MODES = ("backoff", "flower")


def exchange(
    grid: Grid,
    messages: Sequence[Message],
    expect: ReplySpec | Mapping[int, ReplySpec] | None,
    timeout: float,
    stats: CommStats,
    poll: str = "backoff",
) -> Exchange:
    """Send ``messages`` and collect the replies with a back-off poll.

    ``poll="flower"`` uses Flower's own ``grid.send_and_receive`` instead
    (fixed sleep between polls), for comparison.

    Every reply is checked: an error reply, a reply that does not match
    ``expect`` (missing key, wrong shape or dtype, NaN/Inf), a node that left
    the federation, or no reply within ``timeout`` seconds puts the node in
    ``rejected`` with the reason; only
    valid replies are returned in ``replies``.
    """
    start = time.perf_counter()
    down = messages_bytes(messages)
    gone: set[int] = set()
    undelivered: set[int] = set()
    if poll == "flower":
        received = list(grid.send_and_receive(messages, timeout=timeout))
    else:
        received, gone, undelivered = _push_and_poll(grid, messages, start + timeout)
    outcome = _checked_replies(messages, received, expect)
    _name_the_silent(outcome, {m.metadata.dst_node_id for m in messages}, gone, undelivered, timeout)
    outcome.seconds = time.perf_counter() - start
    outcome.bytes_down = down
    stats.bytes_down += down
    stats.bytes_up += outcome.bytes_up
    stats.messages += len(messages) + len(received)
    return outcome


def _checked_replies(messages: Sequence[Message], received: Sequence[Message],
                     expect: ReplySpec | Mapping[int, ReplySpec] | None) -> Exchange:
    """The replies to ``messages`` checked one by one (seconds and bytes down left 0): accepted,
    rejected with the reason (an error reply, a reply that fails ``expect``, a second reply to one
    message) or ignored (one that answers no message of the exchange), and the bytes up."""
    # Attribute replies through the message they answer: an error reply the
    # SuperLink writes for an unreachable node comes from the SuperLink itself.
    node_of = {m.metadata.message_id: m.metadata.dst_node_id for m in messages}
    sent = {m.metadata.dst_node_id for m in messages}
    outcome = Exchange({}, {}, 0.0, 0, 0)
    replies, rejected, refused = outcome.replies, outcome.rejected, outcome.refused
    for reply in received:
        node = node_of.get(reply.metadata.reply_to_message_id, reply.metadata.src_node_id)
        if node not in sent:  # answers no message of this exchange: not checked, not used
            continue
        outcome.bytes_up += message_bytes(reply)
        if node in replies or node in rejected:  # one message, one reply: a second one voids both
            if node in replies:
                refused.append((node, replies.pop(node)))
            refused.append((node, reply.content))
            rejected[node] = "more than one reply to one message"
            continue
        if not reply.has_error() and (rule := refused_rule(reply.content)) is not None:  # a decision, not data
            rejected[node], outcome.refusals[node] = f"{REFUSED}, rule '{rule}'", rule
            continue
        if reply.has_error():
            rejected[node] = _error_reject(reply)
            continue
        spec = expect.get(node) if isinstance(expect, Mapping) else expect
        reason = reply_problem(spec, reply.content) if spec is not None else None
        if reason:
            rejected[node] = reason
            refused.append((node, reply.content))
        else:
            replies[node] = reply.content
    return outcome


def _error_reject(reply: Message) -> str:
    """Why an error reply is rejected: its node left (the SuperLink answers so for a node whose
    heartbeats stopped), its SuperNode did not receive the message (:data:`NOT_RECEIVED`, the
    reason as is), a ClientApp process of the run went silent (:data:`CLIENTAPP_SILENT`), or the
    client's error."""
    code, reason = reply.error.code, reply.error.reason
    if code == ErrorCode.NODE_UNAVAILABLE:
        return f"{LEFT} ({reason})"
    if code == ErrorCode.MESSAGE_UNAVAILABLE and reason.startswith(NOT_RECEIVED):
        return reason
    if code == ErrorCode.CLIENT_APP_CRASHED:
        return f"client error: {reason} ({CLIENTAPP_SILENT})"
    return f"client error: {reason}"


def _name_the_silent(outcome: Exchange, sent: set[int], gone: set[int], undelivered: set[int],
                     timeout: float) -> None:
    """Reject every node of ``sent`` without a reply, saying why: the grid did not take its
    message, it left the federation, or it did not answer within ``timeout``."""
    for node in undelivered:
        outcome.rejected[node] = "the grid did not take the message (not stored, or the batch too large)"
    for node in gone - set(outcome.replies) - set(outcome.rejected):
        outcome.rejected[node] = f"{LEFT} (SuperNode disconnected)"
    for node in sent - set(outcome.replies) - set(outcome.rejected):
        outcome.rejected[node] = f"{NO_REPLY} {timeout:g} s"
