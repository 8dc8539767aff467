"""Fast message exchange with the clients, reply validation and traffic counts.

Flower's ``Grid.send_and_receive`` sleeps a fixed interval between polls (3 s
on a real SuperLink, 0.1 s in simulation), so a protocol with hundreds of short
rounds spends most of its time asleep. :func:`exchange` pushes a batch of
messages and polls with a short exponential back-off (2 ms doubling to 50 ms),
then checks every reply against a :class:`ReplySpec` before a strategy sees it.

Wire format used by every strategy (see :func:`pack` / :func:`unpack`): a
``RecordDict`` with an ``ArrayRecord`` under ``"arrays"`` (numpy arrays) and a
``ConfigRecord`` under ``"values"`` (scalars, strings, lists of scalars).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects

ARRAYS = "arrays"
VALUES = "values"

POLL_START_S = 0.002
POLL_MAX_S = 0.05
LIVENESS_EVERY_S = 1.0
NO_REPLY = "no reply within"


class ProtocolError(RuntimeError):
    """A protocol step cannot continue (e.g. too few valid replies)."""


def pack(arrays: Mapping[str, np.ndarray] | None = None, values: Mapping | None = None) -> RecordDict:
    """Build message content from numpy arrays and plain values."""
    content = RecordDict()
    if arrays:
        content[ARRAYS] = ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in arrays.items()})
    if values:
        content[VALUES] = ConfigRecord(dict(values))
    return content


def unpack(content: RecordDict) -> tuple[dict[str, np.ndarray], dict]:
    """Inverse of :func:`pack`: ``(arrays, values)``."""
    arrays = {}
    if ARRAYS in content.array_records:
        arrays = {k: v.numpy() for k, v in content.array_records[ARRAYS].items()}
    return arrays, _values(content)


def describe(content: RecordDict) -> tuple[dict[str, tuple[tuple[int, ...], str]], dict]:
    """``({name: (shape, dtype)}, values)`` of :func:`pack`-ed content, read from the
    array metadata without decoding the data (for bookkeeping on large uploads)."""
    arrays = {}
    if ARRAYS in content.array_records:
        arrays = {k: (tuple(v.shape), str(v.dtype)) for k, v in content.array_records[ARRAYS].items()}
    return arrays, _values(content)


def _values(content: RecordDict) -> dict:
    return dict(content.config_records[VALUES]) if VALUES in content.config_records else {}


@dataclass(frozen=True)
class ArraySpec:
    """Expected array: shape (``None`` = any size on that axis) and dtype kind.

    ``kind`` is a numpy dtype-kind string of accepted kinds, e.g. ``"f"`` for
    floats, ``"iu"`` for integers. Floating arrays must be finite unless
    ``finite`` is False. ``low`` / ``high`` bound the entries (``low <= x <
    high``; e.g. node ids, labels of k clusters), ``unique`` forbids repeats
    (ids). ``masked`` / ``noised`` say whether the client uploads it under
    secure aggregation / with added noise (for the ledger).
    """

    shape: tuple[int | None, ...] | None = None
    kind: str = "f"
    finite: bool = True
    low: float | None = None
    high: float | None = None
    unique: bool = False
    masked: bool = False
    noised: bool = False

    def check(self, name: str, array: np.ndarray) -> str | None:
        """Return why ``array`` does not match, or None."""
        if array.dtype.kind not in self.kind:
            return f"array '{name}' has dtype {array.dtype}, expected kind '{self.kind}'"
        if self.shape is not None:
            ok = array.ndim == len(self.shape) and all(
                want is None or want == got for want, got in zip(self.shape, array.shape)
            )
            if not ok:
                return f"array '{name}' has shape {tuple(array.shape)}, expected {self.shape}"
        if self.finite and array.dtype.kind in "fc" and not np.isfinite(array).all():
            return f"array '{name}' contains NaN or Inf"
        if array.size and (self.low is not None or self.high is not None):
            lo, hi = array.min(), array.max()
            if (self.low is not None and lo < self.low) or (self.high is not None and hi >= self.high):
                return (f"array '{name}' has values in [{lo}, {hi}], expected "
                        f"{self._range()}")
        repeats = array.size - np.unique(array).size if self.unique else 0
        if repeats:
            return f"array '{name}' repeats entries ({repeats} duplicates)"
        return None

    def _range(self) -> str:
        low = "-inf" if self.low is None else self.low
        return f"[{low}, {self.high})" if self.high is not None else f">= {low}"


def whole_number(raw) -> int | None:
    """``raw`` as an int if it is a whole number (an int, or a float without a
    fraction), else None: bools, strings, fractions, NaN and inf are not."""
    if isinstance(raw, (bool, np.bool_)):
        return None
    if isinstance(raw, (int, np.integer)):
        return int(raw)
    return int(raw) if isinstance(raw, (float, np.floating)) and np.isfinite(raw) and raw.is_integer() else None


@dataclass(frozen=True)
class ValueSpec:
    """Expected number in a reply's values: finite (a whole number if ``whole``),
    ``low <= x <= high``; with ``length``, a list of exactly that many such numbers."""

    whole: bool = False
    low: float | None = None
    high: float | None = None
    length: int | None = None

    def check(self, name: str, value) -> str | None:
        """Return why ``value`` does not match, or None."""
        if self.length is not None:
            if not isinstance(value, list) or len(value) != self.length:
                return f"value '{name}' is {value!r}, expected a list of {self.length} numbers"
            items = value
        else:
            items = [value]
        for v in items:
            number = not isinstance(v, (bool, np.bool_)) and isinstance(v, (int, float, np.integer, np.floating))
            if not number or not np.isfinite(v) or (self.whole and whole_number(v) is None):
                return f"value '{name}' is {value!r}, expected {'whole' if self.whole else 'finite'} numbers"
            if (self.low is not None and v < self.low) or (self.high is not None and v > self.high):
                return f"value '{name}' is {value!r}, expected numbers {self._range()}"
        return None

    def _range(self) -> str:
        if self.high is None:
            return f">= {self.low}"
        return f"<= {self.high}" if self.low is None else f"in [{self.low}, {self.high}]"


@dataclass(frozen=True)
class ReplySpec:
    """What a valid reply must contain: named arrays and named values, and nothing else.

    ``same_length``: names of arrays that describe the same items (e.g. node
    ids and their labels), whose first axes must agree. ``optional``: values
    a reply may carry or leave out, checked when present. Any other array or
    value is refused: it would be recorded as an upload, and code that walks
    every array (FedAvg) would average it in.
    """

    arrays: Mapping[str, ArraySpec] = field(default_factory=dict)
    values: Sequence[str] = ()
    same_length: Sequence[str] = ()
    numbers: Mapping[str, ValueSpec] = field(default_factory=dict)
    optional: Mapping[str, ValueSpec] = field(default_factory=dict)

    def check(self, content: RecordDict) -> str | None:
        """Return why ``content`` is not a valid reply, or None."""
        # pack() makes no other record, and none of another type under these names: the ledger would not see it
        stray = sorted((set(content.array_records) - {ARRAYS}) | (set(content.config_records) - {VALUES})
                       | set(content.metric_records))
        if stray:
            return f"unexpected record '{stray[0]}'"
        try:
            names, values = describe(content)  # names first: no decoding of an unexpected array
            extra = sorted(set(names) - set(self.arrays))
            if extra:
                return f"unexpected array '{extra[0]}'"
            arrays, values = unpack(content)
        except Exception as err:  # malformed records from a misbehaving client
            return f"malformed reply: {err}"
        for name, (shape, dtype) in names.items():  # the bookkeeping reads the declared metadata
            if arrays[name].shape != shape or str(arrays[name].dtype) != dtype:
                return (f"array '{name}' declares {dtype} {shape} but holds {arrays[name].dtype} "
                        f"{arrays[name].shape}")
        reason = _first_problem(self.arrays, arrays, "array")
        if reason:
            return reason
        lengths = {name: arrays[name].shape[0] if arrays[name].ndim else 1
                   for name in self.same_length if name in arrays}
        if len(set(lengths.values())) > 1:
            return "arrays of the same items differ in length: " + ", ".join(
                f"'{name}' {size}" for name, size in lengths.items())
        for name in self.values:
            if name not in values:
                return f"missing value '{name}'"
            value = values[name]
            items = value if isinstance(value, list) else [value]
            if any(isinstance(v, float) and not np.isfinite(v) for v in items):
                return f"value '{name}' is {value}"
        reason = _first_problem({**self.numbers, **{n: v for n, v in self.optional.items() if n in values}},
                                values, "value")
        extra = sorted(set(values) - set(self.values) - set(self.numbers) - set(self.optional))
        return reason or (f"unexpected value '{extra[0]}'" if extra else None)


def _first_problem(specs: Mapping, found: Mapping, what: str) -> str | None:
    """Why the first of ``specs`` (name -> ArraySpec / ValueSpec) is missing from ``found``
    or does not match, or None."""
    for name, spec in specs.items():
        if name not in found:
            return f"missing {what} '{name}'"
        reason = spec.check(name, found[name])
        if reason:
            return reason
    return None


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
    return sum(len(obj.deflate()) for obj in get_all_nested_objects(message).values())


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


def _push_and_poll(
    grid: Grid, messages: Sequence[Message], deadline: float
) -> tuple[list[Message], set[int], set[int]]:
    """Push, then pull until every reply is in or ``deadline`` passes.

    The sleep between empty polls starts at 2 ms and doubles up to 50 ms;
    any reply resets it, since the others are usually close behind. About
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
    while pending:
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
        if got:
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
    down = sum(message_bytes(m) for m in messages)
    sent = {m.metadata.dst_node_id for m in messages}
    gone: set[int] = set()
    undelivered: set[int] = set()
    if poll == "flower":
        received = list(grid.send_and_receive(messages, timeout=timeout))
    else:
        received, gone, undelivered = _push_and_poll(grid, messages, start + timeout)

    # Attribute replies through the message they answer: an error reply the
    # SuperLink writes for an unreachable node comes from the SuperLink itself.
    node_of = {m.metadata.message_id: m.metadata.dst_node_id for m in messages}
    replies: dict[int, RecordDict] = {}
    rejected: dict[int, str] = {}
    refused: list[tuple[int, RecordDict]] = []
    up = 0
    for reply in received:
        node = node_of.get(reply.metadata.reply_to_message_id, reply.metadata.src_node_id)
        if node not in sent:  # answers no message of this exchange: not checked, not used
            continue
        up += message_bytes(reply)
        if node in replies or node in rejected:  # one message, one reply: a second one voids both
            if node in replies:
                refused.append((node, replies.pop(node)))
            refused.append((node, reply.content))
            rejected[node] = "more than one reply to one message"
            continue
        if reply.has_error():
            rejected[node] = f"client error: {reply.error.reason}"
            continue
        spec = expect.get(node) if isinstance(expect, Mapping) else expect
        reason = spec.check(reply.content) if spec is not None else None
        if reason:
            rejected[node] = reason
            refused.append((node, reply.content))
        else:
            replies[node] = reply.content
    for node in undelivered:
        rejected[node] = "the grid did not take the message (not stored, or the batch too large)"
    for node in gone - set(replies) - set(rejected):
        rejected[node] = "left the federation (SuperNode disconnected)"
    for node in sent - set(replies) - set(rejected):
        rejected[node] = f"{NO_REPLY} {timeout:g} s"

    seconds = time.perf_counter() - start
    stats.bytes_down += down
    stats.bytes_up += up
    stats.messages += len(messages) + len(received)
    return Exchange(replies, rejected, seconds, up, down, refused)
