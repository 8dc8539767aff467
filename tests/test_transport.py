"""The fast transport: reply validation, rejects, byte counting, back-off."""

from __future__ import annotations

import re

import numpy as np
import pytest
from flwr.app import Message, RecordDict
from flwr.clientapp import ClientApp

from app.config import RunConfig
from app import registry
from app.inprocess import InProcessGrid
from app.session import ServerSession
from app.transport import (ArraySpec, CommStats, ProtocolError, ReplySpec, ValueSpec, exchange, message_bytes,
                           pack, unpack)

N = 50


def make_client_app(bad: dict[int, str]) -> ClientApp:
    """Answers ``query.block`` with an N x 3 block; partition ids in ``bad`` misbehave."""
    app = ClientApp()

    @app.query("hello")
    def hello(message, context):
        pid = context.node_config["partition-id"]
        values = {"partition_id": pid, "num_partitions": context.node_config["num-partitions"]}
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
        return Message(pack({"block": out}, {"count": N}), reply_to=message)

    return app


SPEC = ReplySpec(arrays={"block": ArraySpec((N, 3))}, values=("count",))


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
    (ValueSpec(whole=True, low=1), 0, r"expected numbers in \[1, None\]"),
    (ValueSpec(low=-0.5, high=1.0), 1.5, r"expected numbers in \[-0.5, 1.0\]"),
    (ValueSpec(length=2), [0.1, 0.2], None),
    (ValueSpec(length=2), [0.1], "expected a list of 2 numbers"),
    (ValueSpec(length=2), 0.1, "expected a list of 2 numbers"),
    (ValueSpec(length=2), [0.1, float("nan")], "expected finite numbers"),
])
def test_numbers_in_reply_values_are_checked(spec, value, reason):
    got = ReplySpec(numbers={"x": spec}).check(pack(values={"x": value}))
    assert got is None if reason is None else re.search(reason, got)
    assert ReplySpec(numbers={"y": spec}).check(pack(values={"x": value})) == "missing value 'y'"


def test_arrays_of_the_same_items_must_agree_in_length():
    spec = ReplySpec(arrays={"ids": ArraySpec((None,), kind="iu"), "labels": ArraySpec((None,), kind="iu")},
                     same_length=("ids", "labels"))
    ids = np.arange(5)
    assert spec.check(pack({"ids": ids, "labels": ids % 2})) is None
    assert spec.check(pack({"ids": ids, "labels": ids[:4] % 2})) == (
        "arrays of the same items differ in length: 'ids' 5, 'labels' 4")


def test_silent_node_times_out_and_is_reported():
    session = session_for(make_client_app({}))
    session.timeout = 0.5
    session.grid.silent.add(session.node_ids[1])
    with pytest.raises(ProtocolError, match="client 1 .*no reply within 0.5 s"):
        session.broadcast("block", pack({"v": np.zeros((N, 3))}), SPEC)


def test_disconnected_node_is_given_up_before_the_timeout():
    session = session_for(make_client_app({}))
    session.timeout = 60
    session.grid.dropped.add(session.node_ids[2])
    with pytest.raises(ProtocolError, match="client 2 .*left the federation"):
        session.broadcast("block", pack({"v": np.zeros((N, 3))}), SPEC)
    assert session.stats.rounds[-1]["seconds"] < 30  # well before the 60 s timeout


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


def test_message_bytes_grows_by_exactly_the_extra_payload():
    small = Message(pack({"a": np.arange(1000.0)}), dst_node_id=5, message_type="query.x", group_id="1")
    large = Message(pack({"a": np.arange(3000.0)}), dst_node_id=5, message_type="query.x", group_id="1")
    extra = message_bytes(large) - message_bytes(small)
    assert 2000 * 8 <= extra <= 2000 * 8 + 8  # payload plus a longer length prefix


def test_uploads_reach_the_ledger_with_shapes():
    session = session_for(make_client_app({}))
    session.broadcast("block", pack({"v": np.zeros((N, 3))}), SPEC)
    uploads = session.ledger.to_dict()["uploads"]
    blocks = [u for u in uploads if u["action"] == "block" and u["name"] == "block"]
    assert sorted(u["client"] for u in blocks) == [0, 1, 2, 3]
    assert all(u["shape"] == [N, 3] and not u["masked"] for u in blocks)


def test_handshake_refuses_inconsistent_partitions():
    app = make_client_app({})
    grid = InProcessGrid(app, 2, node_configs=[{"partition-id": 0, "num-partitions": 2},
                                               {"partition-id": 0, "num-partitions": 2}])
    session = ServerSession(grid, registry.validate({"num-clients": 2, "timeout": 5}))
    with pytest.raises(ProtocolError, match=r"partition ids \[0, 0\] are not 0..1"):
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
