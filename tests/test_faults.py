"""No message lost to a transient failure: the fault proxy itself, the gateway's redelivery and
repeated activations, the SuperNode shim's handling of failures Flower gives up on, the
ServerApp sending again a message its SuperNode did not receive, and a deployed run through the
fault proxy."""

from __future__ import annotations

import asyncio
import errno
import http.client
import json
import re
import socket
import ssl
import threading
import time
import types
from contextlib import contextmanager

import numpy as np
import pytest
from flwr.app import Error, Message, RecordDict
from flwr.common import Metadata
from flwr.common.constant import ErrorCode, SubStatus
from flwr.proto.fleet_pb2 import (ActivateNodeRequest, ActivateNodeResponse,  # pylint: disable=no-name-in-module
                                  PullMessagesRequest, PullMessagesResponse, PushMessagesRequest)
from flwr.proto.message_pb2 import ConfirmMessageReceivedRequest, ObjectTree  # pylint: disable=no-name-in-module
from flwr.supercore.constant import FLEET_HTTP_PUBLIC_KEY_HEADER
from flwr.supercore.inflatable.inflatable_utils import ObjectPullError, ObjectPushError, ObjectUnavailableError

from app import registry
from app.inprocess import InProcessGrid
from fedgraphcore.session import ServerSession
from fedgraphcore.transport import NOT_RECEIVED, NOT_RECEIVED_RESENDS, pack
from fedgraphcore.wire import ProtocolError
from conftest import HANG_GUARD_S
from deploy import flower_resilience, flower_shim
from deploy.faults import FAULT, RESET_WITHIN_BYTES, Faults, ProxyTLS, serve
from deploy.federation import free_port
from deploy.redelivery import REDELIVERIES
from deploy.pki import make_all
from test_gateway import RecordingSuperLink, read_answer, request, start_gateway
from test_transport import SPEC, N, make_client_app


# -- the proxy ----------------------------------------------------------------------------------
@pytest.mark.parametrize("shares", [dict(reset_share=1.1), dict(fail_share=-0.1), dict(reset_share=0.6, fail_share=0.5),
                                    dict(latency_s=-1.0)])
def test_faults_out_of_range_are_refused_naming_the_value(shares):
    with pytest.raises(ValueError, match="valid:"):
        Faults(**shares)


@contextmanager
def running_proxy(upstream_port: int, faults: Faults, tls: ProxyTLS | None = None):
    """The proxy in an event loop of its own (a thread), on a free loopback port; stopped on exit."""
    port, ready, loop = free_port(), threading.Event(), asyncio.new_event_loop()
    started = asyncio.Event()

    async def main():
        task = asyncio.ensure_future(serve(("127.0.0.1", port), ("127.0.0.1", upstream_port), faults, tls, started))
        await started.wait()
        ready.set()
        await task

    runner = loop.create_task(main())
    thread = threading.Thread(target=lambda: loop.run_until_complete(asyncio.gather(runner, return_exceptions=True)),
                              daemon=True)
    thread.start()
    assert ready.wait(HANG_GUARD_S)
    try:
        yield port
    finally:
        loop.call_soon_threadsafe(runner.cancel)
        thread.join(HANG_GUARD_S)
        loop.close()


@contextmanager
def echo_server():
    """A TCP server on loopback that sends back whatever it receives."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(HANG_GUARD_S)

    def serve_one(conn):
        with conn:
            try:
                while data := conn.recv(65536):
                    conn.sendall(data)
            except ConnectionError:  # the proxy reset it
                pass

    def accept():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=serve_one, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield server.getsockname()[1]
    finally:
        server.close()


def _echo(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=HANG_GUARD_S) as sock:
        sock.sendall(data)
        try:
            sock.shutdown(socket.SHUT_WR)
        except OSError as error:  # a reset that came before the shutdown
            if error.errno != errno.ENOTCONN:
                raise
            raise ConnectionResetError(errno.ECONNRESET, "reset before the write side closed") from error
        got = bytearray()
        while chunk := sock.recv(65536):
            got += chunk
        return bytes(got)


def test_tcp_mode_relays_every_byte_each_way_late_by_the_latency():
    data = bytes(range(256)) * 4096  # 1 MiB: many chunks, each delayed, none held back for the others
    with echo_server() as upstream, running_proxy(upstream, Faults(latency_s=0.05)) as port:
        start = time.monotonic()
        assert _echo(port, b"ping") == b"ping"
        assert time.monotonic() - start >= 2 * 0.05  # once each way
        assert _echo(port, data) == data


def test_tcp_mode_resets_the_share_of_connections_at_a_random_point(caplog):
    data = b"x" * (2 * RESET_WITHIN_BYTES)
    with echo_server() as upstream, running_proxy(upstream, Faults(reset_share=1.0, seed=3)) as port:
        for _ in range(3):
            with pytest.raises(ConnectionError):
                got = _echo(port, data)
                assert len(got) < len(data)  # a reset can also show as an early end
                raise ConnectionResetError
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith(FAULT)]
    assert len(lines) == 3 and all(re.fullmatch(rf"{FAULT} reset TCP connection \d+ after \d+ bytes", line)
                                   for line in lines), lines
    with echo_server() as upstream, running_proxy(upstream, Faults(reset_share=0.0)) as port:
        assert _echo(port, data) == data


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    path = tmp_path_factory.mktemp("faults") / "pki"
    make_all(path, 1)
    return path


def _https(port: int, pki, target: str, body: bytes) -> tuple[int | None, bytes]:
    """One POST through a new TLS connection: (status, body), or (None, b"") when it was reset."""
    context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=HANG_GUARD_S)
    try:
        conn.request("POST", target, body=body, headers={"Content-Type": "application/protobuf"})
        response = conn.getresponse()
        return response.status, response.read()
    except (ConnectionError, http.client.RemoteDisconnected, ssl.SSLError):
        return None, b""
    finally:
        conn.close()


def _tls(pki) -> ProxyTLS:
    return ProxyTLS(pki / "superlink.crt", pki / "superlink.key", pki / "ca.crt")


@pytest.mark.parametrize("faults", [Faults(reset_share=1.0, seed=1), Faults(fail_share=1.0, seed=2),
                                    Faults(reset_share=0.3, fail_share=0.3, seed=4)])
def test_http_mode_injects_each_fault_as_logged_and_the_upstream_saw_exactly_the_forwarded(pki, faults, caplog):
    """Each request is reset before or after forwarding, failed before or after, or passed; the
    upstream received exactly the requests logged as forwarded, each byte-identical."""
    upstream = RecordingSuperLink(pki)
    upstream.start()
    try:
        with running_proxy(upstream.port, faults, _tls(pki)) as port:
            answers = [_https(port, pki, f"/v1/fleet/pull-object-{i}", b"body %d" % i) for i in range(30)]
    finally:
        upstream.stop()
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith(FAULT)]
    resets = [a for a in answers if a[0] is None]
    failed = [a for a in answers if a[0] in (500, 502, 503)]
    passed = [a for a in answers if a[0] == 200]
    assert len(lines) == len(resets) + len(failed) and len(passed) + len(lines) == 30, lines
    assert {a[0] for a in failed} <= {500, 502, 503}
    if faults.fail_share == 1.0:
        assert {a[0] for a in failed} == {500, 502, 503}
    forwarded = sum("after forwarding" in line for line in lines) + len(passed)
    assert len(upstream.received) == forwarded
    assert all(r.body.startswith(b"body ") for r in upstream.received)
    assert all(body == b"answer to /v1/fleet/pull-object-%d" % i for i, (status, body) in enumerate(answers)
               if status == 200)
    for line in lines:
        assert re.fullmatch(rf"{FAULT} (reset before forwarding|reset after forwarding|answered 50[023] to) "
                            r"/v1/fleet/pull-object-\d+.*\(connection \d+\)", line), line


# -- the gateway: a delivery that never arrived, an activation repeated ---------------------
#: a key whose requests the stand-in refuses, as Flower's SuperLink refuses a request naming a node
#: whose key did not sign it
IMPOSTOR = "aW1wb3N0b3I="


class FleetStandIn(RecordingSuperLink):
    """The SuperLink as the gateway sees it for one node: pull-messages answers each queued
    message once (then nothing, as Flower's SuperLink marks it delivered); activate-node answers
    200 the first time per key, then 412 FLEET_NODE_ACTIVATION_FAILED (the key is active)."""

    def __init__(self, pki):
        super().__init__(pki)
        self.queued: list[bytes] = []
        self.active: set[bytes] = set()

    def answer(self, target: bytes) -> tuple[int, bytes]:
        body = self.received[-1].body
        headers = {name.lower(): value for name, value in self.received[-1].headers}
        if headers.get(FLEET_HTTP_PUBLIC_KEY_HEADER.lower()) == IMPOSTOR:  # its key is not the node's
            return 401, b'{"detail": "Invalid SuperNode authentication"}'
        if target == b"/v1/fleet/pull-messages":
            return 200, self.queued.pop(0) if self.queued else PullMessagesResponse().SerializeToString()
        if target == b"/v1/fleet/activate-node":
            key = ActivateNodeRequest.FromString(body).public_key
            if key in self.active:
                return 412, json.dumps({"code": 2004, "detail": "Failed to activate SuperNode."}).encode()
            self.active.add(key)
            return 200, ActivateNodeResponse(node_id=77).SerializeToString()
        return 200, b""


def _message(message_id: str, ttl: float = 600.0) -> bytes:
    response = PullMessagesResponse()
    metadata = response.messages_list.add().metadata
    metadata.message_id, metadata.created_at, metadata.ttl = message_id, time.time(), ttl
    return response.SerializeToString()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, pki):
    """The gateway in front of :class:`FleetStandIn`, one for the module: each test its own node ids."""
    upstream = FleetStandIn(pki)
    upstream.start()
    gateway = start_gateway(tmp_path_factory.mktemp("fleet"), pki, upstream.port)
    yield gateway, upstream
    gateway.proc.kill()
    gateway.proc.wait()
    upstream.stop()


def _call(gateway, target: bytes, body: bytes, key: bytes = b"a2V5") -> tuple[int, bytes]:
    raw = request(target, body=body, port=gateway.port)
    head, rest = raw.split(b"\r\n\r\n", 1)
    raw = head + b"\r\n" + FLEET_HTTP_PUBLIC_KEY_HEADER.encode() + b": " + key + b"\r\n\r\n" + rest
    context = ssl.create_default_context(cafile=str(gateway.ca))
    with context.wrap_socket(socket.create_connection(("127.0.0.1", gateway.port), timeout=HANG_GUARD_S),
                             server_hostname="127.0.0.1") as sock:
        sock.sendall(raw)
        answer = read_answer(sock)
    return answer.status, answer.body


def _pull(gateway, node: int) -> list[str]:
    status, body = _call(gateway, b"/v1/fleet/pull-messages", PullMessagesRequest(node={"node_id": node})
                         .SerializeToString())
    assert status == 200
    return [m.metadata.message_id for m in PullMessagesResponse.FromString(body).messages_list]


def test_a_delivery_never_confirmed_is_delivered_again_until_confirmed(fleet):
    gateway, upstream = fleet
    upstream.queued = [_message("m1")]
    assert _pull(gateway, 7) == ["m1"]  # its answer lost on the way: the SuperNode asks again
    assert _pull(gateway, 8) == []  # another node's delivery is not its own
    as_node_7 = PullMessagesRequest(node={"node_id": 7}).SerializeToString()
    assert _call(gateway, b"/v1/fleet/pull-messages", as_node_7, IMPOSTOR.encode()) == (
        401, b"401 Unauthorized\n")  # only the SuperLink's 200 is answered from memory; its details: a member's
    assert _pull(gateway, 7) == ["m1"]
    confirm = ConfirmMessageReceivedRequest(node={"node_id": 7}, message_object_id="m1").SerializeToString()
    assert _call(gateway, b"/v1/fleet/confirm-message-received", confirm)[0] == 200
    assert _pull(gateway, 7) == []
    upstream.queued = [_message("m2")]
    assert _pull(gateway, 7) == ["m2"]
    reply = PushMessagesRequest(node={"node_id": 7})
    reply.messages_list.add().metadata.reply_to_message_id = "m2"  # the SuperNode's error reply, say
    assert _call(gateway, b"/v1/fleet/push-messages", reply.SerializeToString())[0] == 200
    assert _pull(gateway, 7) == []
    assert "delivered message m1 to node 7 again" in gateway.log.read_text()


def test_a_delivery_is_repeated_a_bounded_number_of_times_and_never_after_it_expires(fleet):
    gateway, upstream = fleet
    upstream.queued = [_message("m3")]
    assert [_pull(gateway, 9) for _ in range(REDELIVERIES + 3)] == [["m3"]] * (REDELIVERIES + 1) + [[]] * 2
    upstream.queued = [_message("m4", ttl=-1.0)]  # already expired
    assert _pull(gateway, 10) == ["m4"] and _pull(gateway, 10) == []


def test_an_activation_repeated_gets_its_first_answer_until_the_key_sends_anything_else(fleet):
    gateway, upstream = fleet
    activate = ActivateNodeRequest(public_key=b"key", heartbeat_interval=30).SerializeToString()
    first = _call(gateway, b"/v1/fleet/activate-node", activate, b"a2V5")
    assert first[0] == 200 and ActivateNodeResponse.FromString(first[1]).node_id == 77
    assert _call(gateway, b"/v1/fleet/activate-node", activate, b"a2V5") == first  # its answer was lost
    other = ActivateNodeRequest(public_key=b"another", heartbeat_interval=30).SerializeToString()
    assert _call(gateway, b"/v1/fleet/activate-node", other, b"YW5vdGhlcg==")[0] == 200
    _call(gateway, b"/v1/fleet/send-node-heartbeat", b"", b"a2V5")  # the node runs: a second instance is refused
    assert _call(gateway, b"/v1/fleet/activate-node", activate, b"a2V5")[0] == 412


# -- the SuperNode shim -----------------------------------------------------------------------
def _pulled_message(message_id: str = "m-in") -> Message:
    return Message(metadata=Metadata(run_id=11, message_id=message_id, src_node_id=1, dst_node_id=3,
                                     reply_to_message_id="", group_id="1", created_at=time.time(), ttl=600.0,
                                     message_type="query.step"), content=RecordDict())


def _fake_supernode(flower_pull):
    """Flower's SuperNode module as the shim sees it: ``_pull_and_store_message`` is ``flower_pull``,
    ``_insert_message`` records what it is given."""
    module = types.SimpleNamespace(inserted=[])
    module._pull_and_store_message = flower_pull
    module._insert_message = lambda message, state, store: module.inserted.append(message)
    return module


def _pull_kwargs(message: Message | None, confirm=lambda run_id, message_id: None):
    finished = []
    state = types.SimpleNamespace(finish_task=lambda *a, **kw: finished.append(kw))
    return dict(state=state, object_store=None, receive=lambda: (message, None) if message else None,
                confirm_message_received=confirm), finished


def test_a_message_whose_objects_fail_is_answered_not_received_with_the_cause():
    def flower_pull(**kw):  # Flower's own path: objects failed, message dropped, task failed
        kw["receive"]()
        kw["state"].finish_task(5, sub_status=SubStatus.FAILED, details="Pulling message objects failed: 500")
        return None

    module = _fake_supernode(flower_pull)
    kwargs, finished = _pull_kwargs(_pulled_message())
    assert flower_resilience.answer_what_is_not_received(module)(**kwargs) == 11  # the loop pushes the reply
    [reply] = module.inserted
    assert reply.error.code == ErrorCode.MESSAGE_UNAVAILABLE and reply.metadata.reply_to_message_id == "m-in"
    assert reply.error.reason == f"{NOT_RECEIVED}: Pulling message objects failed: 500"
    assert finished == [{"sub_status": SubStatus.FAILED, "details": "Pulling message objects failed: 500"}]


def test_a_run_or_bundle_that_fails_is_answered_and_a_failed_pull_or_confirm_is_not_fatal():
    def get_run_fails(**kw):
        kw["receive"]()
        raise RuntimeError("Server error '500 Internal Server Error' for url '/v1/fleet/get-run'\nmore")

    module = _fake_supernode(get_run_fails)
    assert flower_resilience.answer_what_is_not_received(module)(**_pull_kwargs(_pulled_message())[0]) == 11
    assert module.inserted[0].error.reason == (f"{NOT_RECEIVED}: RuntimeError: Server error '500 Internal Server "
                                              "Error' for url '/v1/fleet/get-run'")

    def receive_fails():
        raise RuntimeError("500 on pull-messages")

    module = _fake_supernode(lambda **kw: kw["receive"]())
    kwargs, _ = _pull_kwargs(None)
    assert flower_resilience.answer_what_is_not_received(module)(**{**kwargs, "receive": receive_fails}) is None

    def confirm_fails(run_id, message_id):
        raise RuntimeError("500 on confirm")

    def processed(**kw):
        message, _ = kw["receive"]()
        kw["confirm_message_received"](11, message.metadata.message_id)
        return 11

    module = _fake_supernode(processed)
    assert flower_resilience.answer_what_is_not_received(module)(**_pull_kwargs(_pulled_message(), confirm_fails)[0]) == 11
    assert module.inserted == []  # processed as received


class FakeLink:
    """The SuperLink's side of a reply's push: push-messages opens a push session awaiting the
    objects it lacks (replacing an older one), or, once the reply is ``taken`` (the ServerApp
    pulled its metadata, which deletes the message), lists nothing and opens none; push-object
    stores an object awaited in the given session (with no session id: in whichever awaits it),
    else answers stored=false; pull-object answers a stored object, ObjectUnavailableError for
    an awaited one, ObjectPullError otherwise. ``lost`` objects are stored but their answer lost
    (Flower's retry then sees stored=false), ``failing`` ones answered 500 once before arriving."""

    def __init__(self, objects, lost=(), failing=()):
        self.objects, self.lost, self.failing = list(objects), set(lost), set(failing)
        self.stored, self.sessions, self.log, self.taken = set(), {}, [], False

    def send(self, message, tree, runtime):
        self.log.append(("push-messages",))
        if self.taken:
            return set(), "empty"
        session = f"s{len(self.log)}"
        self.sessions = {session: {o for o in self.objects if o not in self.stored}}
        return set(self.sessions[session]), session

    def push_object(self, run_id, session, object_id, content):
        self.log.append(("push-object", session, object_id))
        if object_id in self.failing:
            self.failing.discard(object_id)
            raise RuntimeError("Server error '500 Internal Server Error' for url '/v1/fleet/push-object'")
        if not session:
            session = next((s for s, awaited in self.sessions.items() if object_id in awaited), "")
        if object_id not in self.sessions.get(session, ()):
            raise ObjectPushError(object_id, run_id, session)
        self.sessions[session].discard(object_id)
        self.stored.add(object_id)
        if object_id in self.lost:
            self.lost.discard(object_id)
            self.push_object(run_id, session, object_id, content)

    def pull_object(self, run_id, object_id):
        if object_id in self.stored:
            return b"content"
        if object_id in self.objects:
            raise ObjectUnavailableError(object_id)
        raise ObjectPullError(object_id, "the object could not be found.")


#: a reply: its message object "m" and the objects under it
REPLY = ObjectTree(object_id="m", children=[ObjectTree(object_id="a"), ObjectTree(object_id="b")])


def _flower_push(**kw):
    """Flower's ``_push_messages``: push-messages, then each object it lacks (any failure logged,
    the reply dropped)."""
    missing, session = kw["send"](types.SimpleNamespace(metadata=types.SimpleNamespace(run_id=11)), REPLY, 0.1)
    try:
        for object_id in sorted(missing):
            kw["push_object"](11, session, object_id, b"content")
    except Exception as err:  # pylint: disable=broad-except
        kw["failed"].append(err)


def _push(link: FakeLink, push_object=None) -> list:
    failed = []
    flower_resilience.push_until_stored(_flower_push, link.pull_object)(
        send=link.send, push_object=push_object or link.push_object, failed=failed)
    return failed


def test_an_object_stored_whose_answer_was_lost_is_found_held_by_the_superlink():
    link = FakeLink(["a", "b", "m"], lost={"b"})
    assert _push(link) == [] and link.stored == {"a", "b", "m"}
    assert link.log.count(("push-messages",)) == 1  # asking for b settled it


def test_an_object_refused_and_still_awaited_is_pushed_again_under_a_new_session():
    link, refusals = FakeLink(["a", "b", "m"]), iter([True])

    def session_expired_once(run_id, session, object_id, content):
        if object_id == "a" and next(refusals, False):
            raise ObjectPushError(object_id, run_id, session)
        link.push_object(run_id, session, object_id, content)

    assert _push(link, session_expired_once) == [] and link.stored == {"a", "b", "m"}
    # a refused under s1: the message pushed again opens s2, under which a, and the rest, are pushed
    assert link.log == [("push-messages",), ("push-messages",), ("push-object", "s2", "a"), ("push-object", "s2", "b"),
                        ("push-object", "s2", "m")]


def test_a_reply_taken_before_its_first_answer_arrived_has_its_objects_pushed_without_a_session():
    """push-messages reached the SuperLink, its answer was lost, the ServerApp took the reply's
    metadata: the repeat lists nothing, and the objects awaited in the first session are pushed."""
    link = FakeLink(["a", "b", "m"])
    link.send(None, None, None)  # the first push-messages, its answer lost
    link.taken = True
    assert _push(link) == [] and link.stored == {"a", "b", "m"}
    assert {entry[1] for entry in link.log if entry[0] == "push-object"} == {""}


def test_a_push_failing_after_the_reply_was_taken_is_pushed_again():
    link = FakeLink(["a", "b", "m"], failing={"a"})
    pushes = link.push_object

    def taken_once_pushed(*args):
        link.taken = True  # the ServerApp took the metadata as soon as push-messages stored it
        return pushes(*args)

    assert _push(link, taken_once_pushed) == [] and link.stored == {"a", "b", "m"}


def test_a_push_that_keeps_failing_is_given_up_after_its_attempts():
    link = FakeLink(["a", "b", "m"])

    def always_refused(run_id, session, object_id, content):
        raise ObjectPushError(object_id, run_id, session)

    failed = _push(link, always_refused)
    assert len(failed) == 1 and link.log.count(("push-messages",)) == flower_resilience.PUSH_ATTEMPTS


def test_a_heartbeat_or_activation_answered_500_is_sent_again(monkeypatch):
    """Flower's heartbeat thread ends on a status it does not retry, and its SuperNode exits on an
    activation answered so: through the shim, the heartbeat counts as failed (Flower sends it
    again), the activation is tried again; a 4xx refusal stays one."""
    import httpx

    def answered(status):
        request = httpx.Request("POST", "https://link/v1/fleet/x")
        return httpx.HTTPStatusError("x", request=request, response=httpx.Response(status, request=request))

    answers = iter([answered(500), answered(500), ActivateNodeResponse(node_id=5), answered(412)])

    class Client:
        def ActivateNode(self, request):  # pylint: disable=invalid-name
            answer = next(answers)
            if isinstance(answer, Exception):
                raise answer
            return answer

    def heartbeat_fails():
        raise answered(500)

    module = types.SimpleNamespace(HeartbeatSender=lambda fn: fn, FleetHttpClient=Client)
    monkeypatch.setattr(flower_resilience, "PUSH_RETRY_S", 0.0)
    flower_resilience.survive_error_statuses(module)
    assert module.HeartbeatSender(heartbeat_fails)() is False
    assert Client().ActivateNode(None).node_id == 5
    with pytest.raises(httpx.HTTPStatusError):
        Client().ActivateNode(None)


# -- the ServerApp sends again what was not received -------------------------------------------
class NotReceivedGrid(InProcessGrid):
    """Answers the next ``lose[node]`` messages to a node as the shim's SuperNode does for a
    message it could not receive: an error reply, MESSAGE_UNAVAILABLE, reason NOT_RECEIVED."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.lose: dict[int, int] = {}
        self.sent: list[int] = []

    def push_messages(self, messages):
        messages = list(messages)
        self.sent += [m.metadata.dst_node_id for m in messages]
        lost = [m for m in messages if self.lose.get(m.metadata.dst_node_id, 0) > 0]
        ids = list(super().push_messages([m for m in messages if m not in lost]))
        for message in lost:
            self.lose[message.metadata.dst_node_id] -= 1
            message.metadata.__dict__["_message_id"] = f"lost-{len(self.sent)}-{message.metadata.dst_node_id}"
            reply = Message(Error(ErrorCode.MESSAGE_UNAVAILABLE, f"{NOT_RECEIVED}: pull-object answered 500"),
                            reply_to=message)
            reply.metadata.__dict__["_message_id"] = f"reply-{message.metadata.message_id}"
            self._replies[message.metadata.message_id] = reply
        by_message = dict(zip([m for m in messages if m not in lost], ids))
        return [by_message.get(m, m.metadata.message_id) for m in messages]


def test_a_message_its_supernode_did_not_receive_is_sent_again_at_once():
    grid = NotReceivedGrid(make_client_app({}), 3)
    session = ServerSession(grid, registry.validate({"num-clients": 3, "timeout": HANG_GUARD_S}))
    session.connect()
    node = session.node_ids[1]
    grid.lose[node], grid.sent = 2, []
    replies = session.broadcast("block", pack({"v": np.zeros((N, 3))}), SPEC)
    assert sorted(replies) == sorted(session.node_ids) and session.rejects == []
    assert sorted(grid.sent) == sorted(session.node_ids + [node, node])  # sent twice more, only to it
    assert session.stats.rounds[-1]["seconds"] < HANG_GUARD_S


def test_a_message_never_received_stops_the_run_naming_the_cause_not_at_the_timeout():
    grid = NotReceivedGrid(make_client_app({}), 3)
    session = ServerSession(grid, registry.validate({"num-clients": 3, "timeout": HANG_GUARD_S}))
    session.connect()
    grid.lose[session.node_ids[2]] = NOT_RECEIVED_RESENDS + 1
    with pytest.raises(ProtocolError, match=rf"client 2 .*: {NOT_RECEIVED}: pull-object answered 500"):
        session.broadcast("block", pack({"v": np.zeros((N, 3))}), SPEC)
    assert session.stats.rounds[-1]["seconds"] < HANG_GUARD_S


# -- deployed: SuperNodes -> fault proxy -> gateway -> SuperLink -------------------------------
@pytest.mark.deployment
@pytest.mark.slow
def test_a_deployed_run_through_resets_and_failures_loses_no_message(tmp_path):
    """fedkmeans with secure aggregation, 3 SuperNodes behind the fault proxy (requests reset
    before and after forwarding, answered 5xx before and after, 6% each): the run finishes with
    the labels of the in-process run, no client rejected or dropped, and every injected fault one
    line of the proxy's log."""
    from app.run import run_experiment
    from conftest import REPO, RUN_GUARD_S
    from deploy.federation import LocalFederation
    from test_deployment import SMALL_SBM, _small_federation_files

    out = tmp_path / "run"
    sets = {"fedkmeans.secure": True, "num-rounds": 3}
    config = _small_federation_files(out, 3, "node-random", "fedkmeans", sets)
    (out / "pki" / "signatures").mkdir()
    names = [f"supernode-{i}" for i in range(3)]
    with LocalFederation(out / "fed", out / "pki") as federation:
        federation.start_superlink()
        federation.start_gateway(out / "pki" / "signatures", nodes=3)  # all three behind the proxy's address
        federation.start_fault_proxy(Faults(reset_share=0.06, fail_share=0.06, seed=5))
        federation.start_nodes([out / "shards" / f"client-{i}.npz" for i in range(3)])
        federation.wait_until_ready(names)
        proc = federation.run_app(REPO, config, timeout=RUN_GUARD_S)
        logs = {name: federation.log(name) for name in [*names, "faults", "gateway"]}
    report = (proc.stdout + proc.stderr)[-3000:] + "".join(f"\n--- {n}:\n{t[-1500:]}" for n, t in logs.items())
    result = out / "result" / "result.json"
    assert result.exists(), report
    communication = json.loads(result.read_text())["communication"]
    assert communication["rejected"] == [] and communication["dropped"] == [], report
    overrides = {"partitioner": "node-random", **dict(s.split("=", 1) for s in SMALL_SBM), **sets}
    run_experiment("fedkmeans", "sbm", 3, overrides, tmp_path / "inprocess")
    assert np.array_equal(np.load(out / "result" / "labels.npy"), np.load(tmp_path / "inprocess" / "labels.npy"))
    faults = [line for line in logs["faults"].splitlines() if FAULT in line]
    assert len(faults) >= 10, report  # the run met faults of every kind
    for kind in ("reset before forwarding", "reset after forwarding", "without forwarding", "after forwarding it"):
        assert any(kind in line for line in faults), (kind, report)
    assert "Traceback" not in logs["gateway"], report
    assert all("Failed to send message" not in logs[name] for name in names), report
