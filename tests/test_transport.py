"""The fast transport: reply validation, rejects, byte counting, back-off."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from flwr.app import Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import ErrorCode

from fedgraphcore import transport
from app import registry
from app.inprocess import InProcessGrid
from fedgraphcore.session import ServerSession
from fedgraphcore.wire import ArraySpec, ProtocolError, ReplySpec, ValueSpec
from fedgraphcore.transport import (BUNDLE, BUNDLE_KEY, BUNDLE_STYPE, INLINE_BUNDLE_MAX_BYTES, message_bytes, messages_bytes,
                           pack, reply_problem, unpack)
from conftest import HANG_GUARD_S

N = 50


def make_client_app(bad: dict[int, str]) -> ClientApp:
    """Answers ``query.block`` with an N x 3 block; partition ids in ``bad`` misbehave."""
    app = ClientApp()

    @app.query("hello")
    def hello(message, context):
        pid = context.node_config["partition-id"]
        values = {"partition_id": pid, "num_partitions": context.node_config["num-partitions"], "num_rows": N,
                  "num_graphs": 0, "num_edges": 0, "num_isolated": N, "shard_cut": "",
                  "dataset": "sbm", "partitioner": "node-random"}
        return Message(pack(values=values), reply_to=message)

    @app.query("block")
    def block(message, context):
        pid = context.node_config["partition-id"]
        arrays, _ = unpack(message.content)
        out = np.full((N, 3), float(pid)) + arrays["v"]
        kind = bad.get(pid)
        if kind == "nan":
            out[3, 1] = np.nan
        if kind == "inf":
            out[0, 0] = np.inf
        if kind == "shape":
            out = out[:, :2]
        if kind == "dtype":
            out = out.astype(np.int64)
        if kind == "raise":
            raise RuntimeError("disk on fire")
        if kind == "missing":
            return Message(pack(values={"count": 1}), reply_to=message)
        if kind == "missing-value":
            return Message(pack({"block": out}), reply_to=message)
        if kind == "nan-value":
            return Message(pack({"block": out}, {"count": float("nan")}), reply_to=message)
        if kind == "nan-in-list":
            return Message(pack({"block": out}, {"count": [1.0, float("nan")]}), reply_to=message)
        if kind == "extra-array":  # FedAvg over every array would average it in
            return Message(pack({"block": out, "w.extra": np.zeros(2_000_000)}, {"count": N}), reply_to=message)
        if kind == "extra-value":
            return Message(pack({"block": out}, {"count": N, "note": "hi"}), reply_to=message)
        if kind == "extra-record":  # beside 'arrays' and 'values': the ledger would not list it
            from flwr.app import MetricRecord

            content = pack({"block": out}, {"count": N})
            content["private"] = MetricRecord({"acc": 0.9})
            return Message(content, reply_to=message)
        if kind == "record-of-another-type":  # an ArrayRecord under the name of the values: describe() skips it
            from flwr.app import Array, ArrayRecord

            content = pack({"block": out})
            content["values"] = ArrayRecord({"hidden": Array(np.zeros(1000))})
            return Message(content, reply_to=message)
        if kind == "inline-not-bytes":
            from flwr.app import ConfigRecord

            return Message(RecordDict({"values": ConfigRecord({"count": N, BUNDLE_KEY: "block"})}), reply_to=message)
        if kind == "two-bundles":  # one inline, one as an array: which would the ledger list?
            from flwr.app import Array, ArrayRecord

            content = pack({"block": out}, {"count": N})
            data = content["values"][BUNDLE_KEY]
            content["arrays"] = ArrayRecord({BUNDLE: Array(dtype="uint8", shape=(len(data),), stype=BUNDLE_STYPE,
                                                           data=data)})
            return Message(content, reply_to=message)
        if kind in BUNDLES:  # a bundle that lies about its arrays, or arrays outside a bundle
            from flwr.app import Array, ArrayRecord

            data = BUNDLES[kind](out)
            fake = (Array(out) if data is None else
                    Array(dtype="uint8", shape=(len(data),), stype=BUNDLE_STYPE, data=data))
            name = "block" if data is None else BUNDLE
            return Message(RecordDict({"arrays": ArrayRecord({name: fake}),
                                       "values": pack(values={"count": N})["values"]}), reply_to=message)
        return Message(pack({"block": out}, {"count": N}), reply_to=message)

    return app


SPEC = ReplySpec(arrays={"block": ArraySpec((N, 3))}, values=("count",))


def lying_bundle(entries, body: bytes) -> bytes:
    header = json.dumps(entries).encode()
    return len(header).to_bytes(8, "little") + header + body


#: malformed bundles of a client's block (None: the block as a Flower array of its own)
BUNDLES = {
    "header-too-small": lambda out: lying_bundle([["block", "|i1", [1]]], out.tobytes()),
    "header-too-long": lambda out: (1_000_000).to_bytes(8, "little") + out.tobytes(),
    "header-garbage": lambda out: (4).to_bytes(8, "little") + b"\xff{[x" + out.tobytes(),
    "header-objects": lambda out: lying_bundle([["block", "|O", [50, 3]]], out.tobytes()),
    "header-twice": lambda out: lying_bundle([["block", "<f8", [50, 3]], ["block", "<f8", [0]]], out.tobytes()),
    "one-array-per-entry": lambda out: None,
}


def session_for(app, num_nodes=4, **config) -> ServerSession:
    grid = InProcessGrid(app, num_nodes)
    session = ServerSession(grid, registry.validate({"num-clients": num_nodes, "timeout": 5, **config}))
    session.connect()
    return session


def test_valid_replies_pass_and_clients_are_ordered_by_partition():
    session = session_for(make_client_app({}))
    assert [c.partition_id for c in session.clients] == [0, 1, 2, 3]
    replies = session.broadcast("block", pack({"v": np.zeros((N, 3))}), SPEC)
    for node, content in replies.items():
        arrays, values = unpack(content)
        assert np.all(arrays["block"] == session.partition_of(node))
        assert values["count"] == N
    assert session.rejects == []


@pytest.mark.parametrize(
    "kind, reason",
    [
        ("nan", "contains NaN or Inf"),
        ("inf", "contains NaN or Inf"),
        ("shape", "shape (50, 2), expected (50, 3)"),
        ("dtype", "dtype int64, expected kind 'f'"),
        ("missing", "missing array 'block'"),
        ("missing-value", "missing value 'count'"),
        ("nan-value", "value 'count' is nan"),
        ("nan-in-list", "value 'count' is [1.0, nan]"),
        ("raise", "client error: RuntimeError: disk on fire"),
        ("extra-array", "unexpected array 'w.extra'"),
        ("extra-value", "unexpected value 'note'"),
        ("extra-record", "unexpected record 'private'"),
        ("record-of-another-type", "unexpected record 'values'"),
        ("header-too-small", "bundle holds 1200 bytes of arrays, its header describes 1"),
        ("header-too-long", "is shorter than its header (1000000 bytes)"),
        ("header-garbage", "bundle header unreadable"),
        ("header-objects", "bundle array 'block' has dtype object and shape (50, 3)"),
        ("header-twice", "bundle names an array twice: ['block']"),
        ("one-array-per-entry", "record 'arrays' holds ['block'], expected one 'bundle' of type fedgraph.arrays"),
        ("inline-not-bytes", "value 'fedgraph.arrays' is str, expected the bundle's bytes"),
        ("two-bundles", "two bundles: value 'fedgraph.arrays' and record 'arrays'"),
    ],
)
def test_malformed_reply_is_rejected_and_reported(kind, reason):
    session = session_for(make_client_app({2: kind}))
    content = pack({"v": np.zeros((N, 3))})
    with pytest.raises(ProtocolError, match="step 'block' rejected 1 client"):
        session.broadcast("block", content, SPEC)
    assert session.rejects[-1]["reason"].endswith(reason) or reason in session.rejects[-1]["reason"]
    # tolerant steps go on with the valid replies only
    replies = session.broadcast("block", content, SPEC, require_all=False)
    assert sorted(session.partition_of(n) for n in replies) == [0, 1, 3]
    assert len(session.rejects) == 2


@pytest.mark.parametrize(
    "spec, array, reason",
    [
        (ArraySpec(kind="iu", low=0), np.array([3, -1, 2]), "array 'a' has values in [-1, 3], expected >= 0"),
        (ArraySpec(kind="iu", low=0, high=4), np.array([0, 4]), "array 'a' has values in [0, 4], expected [0, 4)"),
        (ArraySpec(kind="iu", unique=True), np.array([5, 1, 5, 5]), "array 'a' repeats entries (2 duplicates)"),
        (ArraySpec(kind="f", high=1.0), np.array([0.5, 1.0]), "array 'a' has values in [0.5, 1.0], expected [-inf, 1.0)"),
    ],
)
def test_value_range_and_repeats_are_checked(spec, array, reason):
    assert spec.check("a", array) == reason
    assert spec.check("a", array[:0]) is None  # an empty upload has no bad entry
    inside = np.array([0, 1, 3]) if spec.kind == "iu" else np.array([0.5, 0.75])
    assert spec.check("a", inside) is None


@pytest.mark.parametrize("spec, value, reason", [
    (ValueSpec(whole=True, low=1), 3, None),
    (ValueSpec(whole=True, low=1), 3.0, None),  # a whole float, e.g. from a JSON config record
    (ValueSpec(whole=True, low=1), 2.5, "expected whole numbers"),
    (ValueSpec(whole=True, low=1), True, "expected whole numbers"),
    (ValueSpec(whole=True, low=1), "7", "expected whole numbers"),
    (ValueSpec(whole=True, low=1), 0, r"expected numbers >= 1$"),
    (ValueSpec(low=-0.5, high=1.0), 1.5, r"expected numbers in \[-0.5, 1.0\]"),
    (ValueSpec(length=2), [0.1, 0.2], None),
    (ValueSpec(length=2), [0.1], "expected a list of 2 numbers"),
    (ValueSpec(length=2), 0.1, "expected a list of 2 numbers"),
    (ValueSpec(length=2), [0.1, float("nan")], "expected finite numbers"),
])
def test_numbers_in_reply_values_are_checked(spec, value, reason):
    got = reply_problem(ReplySpec(numbers={"x": spec}), pack(values={"x": value}))
    assert got is None if reason is None else re.search(reason, got)
    assert reply_problem(ReplySpec(numbers={"y": spec}), pack(values={"x": value})) == "missing value 'y'"


def test_arrays_of_the_same_items_must_agree_in_length():
    spec = ReplySpec(arrays={"ids": ArraySpec((None,), kind="iu"), "labels": ArraySpec((None,), kind="iu")},
                     same_length=("ids", "labels"))
    ids = np.arange(5)
    assert reply_problem(spec, pack({"ids": ids, "labels": ids % 2})) is None
    assert reply_problem(spec, pack({"ids": ids, "labels": ids[:4] % 2})) == (
        "arrays of the same items differ in length: 'ids' 5, 'labels' 4")


def test_silent_node_times_out_and_is_reported():
    session = session_for(make_client_app({}))
    session.timeout = 0.5
    session.grid.silent.add(session.node_ids[1])
    with pytest.raises(ProtocolError, match="client 1 .*no reply within 0.5 s"):
        session.broadcast("block", pack({"v": np.zeros((N, 3))}), SPEC)


def test_disconnected_node_is_given_up_before_the_timeout():
    session = session_for(make_client_app({}))
    session.timeout = HANG_GUARD_S
    session.grid.dropped.add(session.node_ids[2])
    with pytest.raises(ProtocolError, match="client 2 .*left the federation"):
        session.broadcast("block", pack({"v": np.zeros((N, 3))}), SPEC)
    assert session.stats.rounds[-1]["seconds"] < HANG_GUARD_S  # given up, not timed out ("no reply within")


class UnavailableGrid(InProcessGrid):
    """Answers every message to node ``gone`` as Flower's SuperLink does once the node's
    heartbeats stopped: an error reply, code NODE_UNAVAILABLE."""

    gone = None
    error = (ErrorCode.NODE_UNAVAILABLE, "Node Unavailable")

    def push_messages(self, messages):
        from uuid import uuid4

        from flwr.app import Error

        messages = list(messages)
        ids = super().push_messages(messages)
        for message_id, message in zip(ids, messages):
            if message.metadata.dst_node_id == self.gone:
                code, reason = self.error
                reply = Message(Error(code=code, reason=reason), reply_to=message)
                reply.metadata.__dict__["_message_id"] = uuid4().hex
                self._replies[message_id] = reply
        return ids


def test_a_node_the_superlink_reports_unavailable_has_left_the_federation():
    grid = UnavailableGrid(make_client_app({}), 4)
    session = ServerSession(grid, registry.validate({"num-clients": 4, "timeout": HANG_GUARD_S}))
    session.connect()
    grid.gone = session.node_ids[1]
    grid.silent.add(grid.gone)
    with pytest.raises(ProtocolError, match=r"client 1 .*left the federation \(Node Unavailable\)"):
        session.broadcast("block", pack({"v": np.zeros((N, 3))}), SPEC)


def test_a_clientapp_gone_silent_is_named_with_what_flowers_error_means():
    """Flower's SuperNode answers "ClientApp stopped responding" (CLIENT_APP_CRASHED) for every open
    message of a run once one ClientApp process of the run sent no heartbeat for a minute."""
    grid = UnavailableGrid(make_client_app({}), 3)
    grid.error = (ErrorCode.CLIENT_APP_CRASHED, "ClientApp stopped responding.")
    session = ServerSession(grid, registry.validate({"num-clients": 3, "timeout": HANG_GUARD_S}))
    session.connect()
    grid.gone = session.node_ids[2]
    grid.silent.add(grid.gone)
    with pytest.raises(ProtocolError) as raised:
        session.broadcast("block", pack({"v": np.zeros((N, 3))}), SPEC)
    assert f"client error: ClientApp stopped responding. ({transport.CLIENTAPP_SILENT})" in str(raised.value)


class TamperingGrid(InProcessGrid):
    """In-process grid that adds one forged reply to the first pull with replies: a second reply
    to an answered message (``duplicate``), or a reply to a message never sent from a node never
    asked (``stray``); or that refuses to take the messages of nodes in ``refused``."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.forge, self.refused = None, set()

    def push_messages(self, messages):
        messages = list(messages)
        ids = list(super().push_messages(messages))
        return ["" if m.metadata.dst_node_id in self.refused else i for i, m in zip(ids, messages)]

    def pull_messages(self, message_ids):
        got = list(super().pull_messages(message_ids))
        if got and self.forge:
            forged = Message(pack({"block": np.full((N, 3), 7.0)}, {"count": N}),
                             reply_to=Message(RecordDict(), dst_node_id=0, message_type="query.block"))
            first = got[0].metadata
            answers, sender = ((first.reply_to_message_id, first.src_node_id) if self.forge == "duplicate"
                               else ("a message of another round", 4242))
            forged.metadata.__dict__.update(_reply_to_message_id=answers, _src_node_id=sender)
            got.append(forged)
            self.forge = None
        return got


@pytest.mark.parametrize("forge", ["duplicate", "stray"])
def test_a_second_reply_voids_the_first_and_a_stray_reply_is_ignored(forge):
    grid = TamperingGrid(make_client_app({}), 3)
    session = ServerSession(grid, registry.validate({"num-clients": 3, "timeout": 5}))
    session.connect()
    grid.forge = forge
    replies = session.broadcast("block", pack({"v": np.zeros((N, 3))}), SPEC, require_all=False)
    if forge == "stray":  # from node 4242, never asked: not checked, not used
        assert sorted(replies) == session.node_ids and session.rejects == []
    else:  # one message, one reply
        assert len(replies) == 2 and [r["reason"] for r in session.rejects] == ["more than one reply to one message"]
        # both replies left the client: the ledger lists both, flagged rejected
        [row] = [u for u in session.ledger.to_dict()["uploads"] if u["name"] == "block" and u["rejected"]]
        assert row["count"] == 2 and row["client"] == session.partition_of(session.rejects[0]["node"])
    assert all(np.all(unpack(c)[0]["block"] == session.partition_of(n)) for n, c in replies.items())


def test_a_message_the_grid_does_not_take_is_reported_at_once_not_at_the_timeout():
    grid = TamperingGrid(make_client_app({}), 3)
    session = ServerSession(grid, registry.validate({"num-clients": 3, "timeout": HANG_GUARD_S}))
    session.connect()
    grid.refused.add(session.node_ids[1])
    with pytest.raises(ProtocolError, match=r"client 1 .*the grid did not take the message"):
        session.broadcast("block", pack({"v": np.zeros((N, 3))}), SPEC)
    assert session.stats.rounds[-1]["seconds"] < HANG_GUARD_S  # reported, not timed out ("no reply within")


def test_an_error_reply_counts_its_bytes():
    def error_app(size):
        app = make_client_app({})

        @app.query("fail")
        def fail(message, context):
            raise RuntimeError("x" * size)

        return app

    ups = []
    for size in (10, 100_010):
        session = session_for(error_app(size), num_nodes=2)
        with pytest.raises(ProtocolError):
            session.broadcast("fail", pack(values={"k": 1}), SPEC)
        ups.append(session.stats.bytes_up)
    assert ups[1] - ups[0] >= 2 * 100_000  # both clients' error texts


def test_tolerant_step_drops_the_client_and_stops_below_min_clients():
    session = session_for(make_client_app({}), **{"min-clients": 3})
    content = pack({"v": np.zeros((N, 3))})
    session.grid.dropped.add(session.node_ids[0])
    replies = session.broadcast("block", content, SPEC, require_all=False)
    assert sorted(session.partition_of(n) for n in replies) == [1, 2, 3]
    assert [d["client"] for d in session.dropped.values()] == [0]
    assert len(session.node_ids) == 3  # the dropped client gets no more messages
    replies = session.broadcast("block", content, SPEC, require_all=False)
    assert len(replies) == 3 and len(session.rejects) == 1
    session.grid.dropped.add(session.node_ids[0])
    with pytest.raises(ProtocolError, match="2 client\\(s\\) left, below min-clients=3"):
        session.broadcast("block", content, SPEC, require_all=False)


def test_bytes_add_up_and_scale_with_payload():
    session = session_for(make_client_app({}))
    before = (session.stats.bytes_down, session.stats.bytes_up, session.stats.messages)
    session.broadcast("block", pack({"v": np.zeros((N, 3))}), SPEC)
    last = session.stats.rounds[-1]
    assert session.stats.bytes_down - before[0] == last["bytes_down"]
    assert session.stats.bytes_up - before[1] == last["bytes_up"]
    assert session.stats.messages - before[2] == 8
    payload = N * 3 * 8
    # down: 4 copies of the N x 3 float64 array; up: 4 blocks of the same size
    assert 4 * payload < last["bytes_down"] < 4 * payload + 4 * 2000
    assert 4 * payload < last["bytes_up"] < 4 * payload + 4 * 2000
    assert sum(r["bytes_up"] for r in session.stats.rounds) == session.stats.bytes_up
    assert sum(r["bytes_down"] for r in session.stats.rounds) == session.stats.bytes_down


def objects_of(content: RecordDict) -> list[str]:
    from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects

    return sorted(type(o).__name__ for o in get_all_nested_objects(content).values())


def test_a_small_bundle_travels_inside_the_values_record_a_large_one_as_flower_array_chunks():
    small = {"a": np.arange(12.0).reshape(3, 4), "ids": np.arange(5, dtype=np.int32)}
    content = pack(small, {"round": 3})
    assert objects_of(content) == ["ConfigRecord", "RecordDict"]  # one request per hop beside the message
    large = {"a": np.arange(INLINE_BUNDLE_MAX_BYTES // 8 + 1, dtype=np.float64)}
    chunked = pack(large, {"round": 3})
    assert set(chunked.array_records) == {"arrays"} and BUNDLE_KEY not in chunked["values"]
    assert objects_of(chunked).count("ArrayChunk") == 2  # Flower's own chunking, no object above its chunk size
    for arrays, packed in [(small, content), (large, chunked)]:
        got, values = unpack(packed)
        assert values == {"round": 3}  # the bundle is not one of the values
        assert sorted(got) == sorted(arrays) and all(np.array_equal(got[k], arrays[k]) for k in arrays)
        assert all(got[k].dtype == arrays[k].dtype for k in arrays)


def test_a_value_named_like_the_bundle_is_refused():
    with pytest.raises(ValueError, match="value name 'fedgraph.arrays' is the bundle's own; choose another"):
        pack({"a": np.zeros(2)}, {BUNDLE_KEY: b"x"})


def test_message_bytes_grows_by_exactly_the_extra_payload():
    small = Message(pack({"a": np.arange(1000.0)}), dst_node_id=5, message_type="query.x", group_id="1")
    large = Message(pack({"a": np.arange(3000.0)}), dst_node_id=5, message_type="query.x", group_id="1")
    extra = message_bytes(large) - message_bytes(small)
    assert 2000 * 8 <= extra <= 2000 * 8 + 8  # payload plus a longer length prefix


@pytest.mark.parametrize("rows", [1000, INLINE_BUNDLE_MAX_BYTES // 8 + 1000])  # inline, and an array in chunks
def test_message_bytes_are_what_flowers_objects_deflate_to(rows):
    """The count is Flower's own: each distinct object of the message deflated, once; a batch of
    messages sharing their content counts it once per message."""
    from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects

    content = pack({"a": np.arange(rows, dtype=np.float64)})
    messages = [Message(content, dst_node_id=n, message_type="query.x", group_id="1") for n in (5, 6)]
    flowers = [sum(len(obj.deflate()) for obj in get_all_nested_objects(m).values()) for m in messages]
    assert [message_bytes(m) for m in messages] == flowers
    assert messages_bytes(messages) == sum(flowers) > 2 * rows * 8


def test_uploads_reach_the_ledger_with_shapes():
    session = session_for(make_client_app({}))
    session.broadcast("block", pack({"v": np.zeros((N, 3))}), SPEC)
    uploads = session.ledger.to_dict()["uploads"]
    blocks = [u for u in uploads if u["action"] == "block" and u["name"] == "block"]
    assert sorted(u["client"] for u in blocks) == [0, 1, 2, 3]
    assert all(u["shape"] == [N, 3] and not u["masked"] for u in blocks)


def test_a_refused_reply_still_reaches_the_ledger_flagged_rejected():
    """A refused reply left its client all the same: the ledger lists it (before: no row at all)."""
    session = session_for(make_client_app({2: "shape", 3: "nan-in-list"}))
    session.broadcast("block", pack({"v": np.zeros((N, 3))}), SPEC, require_all=False)
    rows = [u for u in session.ledger.to_dict()["uploads"] if u["action"] == "block"]
    accepted = sorted((u["client"], u["name"], tuple(u["shape"])) for u in rows if not u["rejected"])
    assert accepted == [(0, "block", (N, 3)), (0, "count", ()), (1, "block", (N, 3)), (1, "count", ())]
    refused = sorted((u["client"], u["name"], tuple(u["shape"])) for u in rows if u["rejected"])
    assert refused == [(2, "block", (N, 2)), (2, "count", ()), (3, "block", (N, 3)), (3, "count", (2,))]
    assert not any(u["masked"] or u["noised"] for u in rows if u["rejected"])


def test_handshake_refuses_inconsistent_partitions():
    app = make_client_app({})
    grid = InProcessGrid(app, 2, node_configs=[{"partition-id": 0, "num-partitions": 2},
                                               {"partition-id": 0, "num-partitions": 2}])
    session = ServerSession(grid, registry.validate({"num-clients": 2, "timeout": 5}))
    with pytest.raises(ProtocolError, match=r"partition ids \[0, 0\] are not 0..1"):
        session.connect()


@pytest.mark.parametrize("field, value, reason", [
    ("partition_id", 1.7, "value 'partition_id' is 1.7, expected whole numbers"),
    ("num_rows", -5, r"value 'num_rows' is -5, expected numbers >= 0"),
    ("num_rows", None, "missing value 'num_rows'"),
])
def test_handshake_refuses_malformed_counts(field, value, reason):
    """Every strategy sizes its checks by the announced rows (strategies.base.announced_rows)."""
    app = ClientApp()

    @app.query("hello")
    def hello(message, context):
        values = {"partition_id": context.node_config["partition-id"], "num_partitions": 2, "num_rows": N,
                  "num_graphs": 0, "num_edges": 0, "num_isolated": N, "shard_cut": "",
                  "dataset": "sbm", "partitioner": "node-random"}
        if context.node_config["partition-id"] == 1:
            values[field] = value
            values = {k: v for k, v in values.items() if v is not None}
        return Message(pack(values=values), reply_to=message)

    session = ServerSession(InProcessGrid(app, 2), registry.validate({"num-clients": 2, "timeout": 5}))
    with pytest.raises(ProtocolError, match=rf"step 'hello' rejected 1 client\(s\): .*{reason}"):
        session.connect()


def test_a_lost_message_is_retried_when_retries_allow():
    content = pack({"v": np.zeros((N, 3))})
    session = session_for(make_client_app({}), retries=1)
    session.timeout = 0.5
    session.grid.ignore_next[session.node_ids[2]] = 1
    replies = session.broadcast("block", content, SPEC)
    assert len(replies) == 4 and session.rejects == []
    session.grid.ignore_next[session.node_ids[2]] = 2  # lost twice: one retry is not enough
    with pytest.raises(ProtocolError, match="client 2 .*no reply within 0.5 s"):
        session.broadcast("block", content, SPEC)


def test_a_reply_refused_when_asked_again_reaches_the_ledger(monkeypatch):
    """A client silent at first, then malformed when asked again: its upload is in the ledger."""
    from fedgraphcore.session import ClientInfo
    from fedgraphcore.transport import NO_REPLY, Exchange

    session = ServerSession(None, registry.validate({"num-clients": 2, "retries": 1}))
    session.clients = [ClientInfo(10, 0, {"num_rows": 5}), ClientInfo(11, 1, {"num_rows": 5})]
    session._order = {10: 0, 11: 1}
    spec = ReplySpec(arrays={"x": ArraySpec((3,))})
    good, bad = pack({"x": np.zeros(3)}), pack({"x": np.zeros(4)})
    answers = iter([Exchange({10: good}, {11: f"{NO_REPLY} 1 s"}, 0.0, 0, 0),
                    Exchange({}, {11: "array 'x' has shape (4,), expected (3,)"}, 0.0, 0, 0, refused=[(11, bad)])])
    monkeypatch.setattr(session, "_send", lambda *args: next(answers))
    session.exchange("step", {10: good, 11: good}, spec, require_all=False)
    rows = sorted((u["client"], tuple(u["shape"]), u["rejected"]) for u in session.ledger.to_dict()["uploads"])
    assert rows == [(0, (3,), False), (1, (4,), True)]
