"""The SuperLink's per-request changes through the runtime shim: Flower's middlewares as plain
ASGI answer as Flower's do, and an empty Fleet pull is held until a message for its node is stored."""

from __future__ import annotations

import importlib
import inspect
import threading
import time
import types

import pytest
from starlette.responses import Response

from conftest import HANG_GUARD_S
from deploy import flower_shim
from deploy.fleet_pulls import HOLD_S, Arrivals, hold_empty_pulls
from deploy.plain_asgi import Direct, ProtobufTranslated, patch_supernode_app, plain_asgi

MAIN = importlib.import_module("flwr.superlink.main")
HANDLERS = importlib.import_module("flwr.superlink.servicer.fleet.fleet_handlers")


def test_every_middleware_of_flowers_superlink_is_made_plain_asgi():
    from starlette.middleware.base import BaseHTTPMiddleware

    flowers = MAIN._get_middleware()
    plain = plain_asgi(flowers)
    assert len(plain) == len(flowers) == 8
    assert not any(issubclass(layer.cls, BaseHTTPMiddleware) for layer in plain)
    for layer, flower in zip(plain, flowers):
        if layer.cls is Direct:  # Flower's dispatch kept: it answers call_next's response or raises
            source = inspect.getsource(flower.kwargs.get("dispatch") or flower.cls.dispatch)
            assert "return await call_next(request)" in source or "return response" in source
            assert ".headers" not in source.split("call_next(request)")[-1]
    assert "middleware=_get_middleware()" in inspect.getsource(MAIN.create_app)


def answers(client) -> list[tuple]:
    from flwr.proto.control_pb2 import ListRunsRequest  # pylint: disable=no-name-in-module
    from flwr.proto.fleet_pb2 import PullMessagesRequest  # pylint: disable=no-name-in-module

    protobuf = {"content-type": "application/protobuf"}
    requests = [("/v1/control/list-runs", ListRunsRequest().SerializeToString(), protobuf),
                ("/v1/control/list-runs", b"x", {"content-type": "text/plain"}),  # 415, Flower's JSON error
                ("/v1/control/list-runs", b"\xff\xff", protobuf),  # 400: not protobuf
                ("/v1/fleet/pull-messages", PullMessagesRequest().SerializeToString(), protobuf),  # 401: unsigned
                ("/v1/control/get-login-details", b"", protobuf),  # a sensitive route: not to be cached
                ("/v1/nowhere", b"", protobuf)]
    out = []
    for path, body, headers in requests:
        response = client.post(path, content=body, headers=headers)
        content = response.content if "list-runs" not in path or response.status_code != 200 else b"runs"
        out.append((path, response.status_code, response.headers.get("content-type"),
                    response.headers.get("cache-control"), response.headers.get("pragma"), content))
    return out


def test_the_plain_asgi_superlink_answers_every_kind_of_request_as_flowers(tmp_path, monkeypatch):
    from fastapi.testclient import TestClient

    monkeypatch.setenv("FLWR_HOME", str(tmp_path))
    with TestClient(MAIN.create_app()) as client:
        flowers = answers(client)
    flower_list = MAIN._get_middleware
    monkeypatch.setattr(MAIN, "_get_middleware", lambda: plain_asgi(flower_list()))
    with TestClient(MAIN.create_app()) as client:
        assert answers(client) == flowers
    assert [a[1] for a in flowers] == [200, 415, 400, 401, 200, 404] and flowers[4][3:5] == ("no-store", "no-cache")


class Store:
    """A LinkState class holding messages by destination node."""
    waiting: dict[int, list] = {}

    def store_message_ins(self, message):
        Store.waiting.setdefault(message.metadata.dst_node_id, []).append(message)
        return "stored"


def pull_request(node_id):
    return types.SimpleNamespace(node=types.SimpleNamespace(node_id=node_id))


def message(node_id):
    return types.SimpleNamespace(metadata=types.SimpleNamespace(dst_node_id=node_id))


@pytest.fixture
def handlers():
    Store.waiting = {}
    calls = []

    def pull_messages(request, state, store):
        calls.append(request.node.node_id)
        return types.SimpleNamespace(messages_list=Store.waiting.pop(request.node.node_id, []))

    module = types.SimpleNamespace(pull_messages=pull_messages, calls=calls)
    state = type("State", (Store,), {})
    hold_empty_pulls(module, (state,), Arrivals(held_at_once=1), hold_s=HANG_GUARD_S)
    return module, state


def test_an_empty_pull_is_answered_when_a_message_for_its_node_is_stored(handlers):
    module, state = handlers
    answered = []
    puller = threading.Thread(target=lambda: answered.append(module.pull_messages(pull_request(1), None, None)))
    puller.start()
    while not module.calls:
        time.sleep(0.001)
    state().store_message_ins(message(2))  # another node's message: the pull keeps waiting
    state().store_message_ins(message(1))
    puller.join(HANG_GUARD_S)
    assert [len(a.messages_list) for a in answered] == [1] and module.calls == [1, 1]
    assert len(module.pull_messages(pull_request(2), None, None).messages_list) == 1  # waiting already: at once


def test_a_pull_is_held_no_longer_than_its_limit_and_no_more_pulls_than_the_slots_are_held(handlers):
    module, _ = handlers
    arrivals = Arrivals(held_at_once=1)
    assert not arrivals.wait_past(1, arrivals.mark(1), 0.0)  # nothing stored: the limit ends the wait
    taken = threading.Event()
    holder = threading.Thread(target=lambda: (taken.set(), arrivals.wait_past(1, arrivals.mark(1), HANG_GUARD_S)))
    holder.start()
    taken.wait(HANG_GUARD_S)
    while not arrivals._holding:  # the holder has its slot
        time.sleep(0.001)
    assert not arrivals.wait_past(2, arrivals.mark(2), HANG_GUARD_S)  # no slot: answered at once
    arrivals.stored(1)
    holder.join(HANG_GUARD_S)
    assert not holder.is_alive()


def test_the_idle_wait_after_a_held_pull_is_shortened_by_the_time_it_was_held():
    waits = []
    clock = flower_shim.PollClock(waits.append, lambda: 100.0)
    clock.last_message = 100.0 - 1000  # idle long: Flower's 3 s
    clock.pulled(2.0)
    clock.sleep(flower_shim.FLOWER_IDLE_POLL_S)
    clock.pulled(HOLD_S)
    clock.sleep(flower_shim.FLOWER_IDLE_POLL_S)
    assert waits == [1.0, 0.0]


def test_the_pull_handler_and_the_stores_held_are_flowers():
    source = inspect.getsource(importlib.import_module("flwr.superlink.routers.fleet.router").fleet_pull_messages)
    assert "fleet_handlers.pull_messages(" in source  # looked up at each call: the held one
    assert "state.get_message_ins(node_id=node_id, limit=1)" in inspect.getsource(HANDLERS.pull_messages)
    for state in flower_shim.link_states():
        assert inspect.signature(state.store_message_ins).parameters.keys() == {"self", "message"}


def test_a_supernodes_runtime_api_answers_as_flowers_with_plain_asgi_middlewares(tmp_path, monkeypatch):
    from fastapi.testclient import TestClient
    from starlette.middleware.base import BaseHTTPMiddleware

    monkeypatch.setenv("FLWR_HOME", str(tmp_path))
    main = types.SimpleNamespace(create_app=importlib.import_module("flwr.supernode.main").create_app)
    requests = [("/v1/runtime/acquire-task", b"x", {"content-type": "text/plain"}),
                ("/v1/runtime/acquire-task", b"\xff\xff", {"content-type": "application/protobuf"}),
                ("/v1/nowhere", b"", {})]

    def answered(app):
        with TestClient(app, raise_server_exceptions=False) as client:
            return [(r.status_code, r.content) for r in (client.post(p, content=b, headers=h) for p, b, h in requests)]

    flowers = answered(main.create_app())
    patch_supernode_app(main)
    app = main.create_app()
    assert [layer.cls for layer in app.user_middleware] == [Direct, ProtobufTranslated]
    assert not any(issubclass(layer.cls, BaseHTTPMiddleware) for layer in app.user_middleware)
    assert answered(app) == flowers and [status for status, _ in flowers] == [415, 400, 404]


def test_a_supernode_looks_for_its_clientapps_reply_when_something_is_stored():
    """Flower's wait for a reply (0.5 s) ends when the SuperNode stores a message or an object,
    at the latest after REPLY_POLL_S; the stores are Flower's."""
    slept = []
    clock = flower_shim.PollClock(slept.append, stored=threading.Event())

    class Store:
        def put(self, object_id, content):
            return object_id

    flower_shim.set_when_stored(clock.stored, [(Store, "put")])
    assert Store().put("a", b"") == "a" and clock.stored.is_set()
    start = time.monotonic()
    clock.sleep(flower_shim.FLOWER_REPLY_POLL_S)  # something was stored: no wait
    assert time.monotonic() - start < HANG_GUARD_S and not clock.stored.is_set() and slept == []
    waker = threading.Timer(0.01, Store().put, ("b", b""))
    waker.start()
    clock.sleep(flower_shim.FLOWER_REPLY_POLL_S)
    waker.join()
    for store, method in flower_shim.node_stores():
        assert callable(getattr(store, method))
    push = inspect.getsource(importlib.import_module("flwr.supernode.start_client_internal")._push_messages)
    assert push.count(f"time.sleep({flower_shim.FLOWER_REPLY_POLL_S})") == 2  # the reply, then its objects


def test_an_extensions_own_dispatch_keeps_what_it_does_with_the_answer():
    """Only Flower's error translator runs as :class:`Direct`: an extension's middleware that sets
    headers on, or reads, call_next's answer stays as Flower gives it."""
    from fastapi.testclient import TestClient
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.middleware.base import BaseHTTPMiddleware
    from starlette.routing import Route

    async def checked(request, call_next):
        response = await call_next(request)
        response.headers["x-checked"] = str(response.status_code)
        return response

    layers = plain_asgi([Middleware(BaseHTTPMiddleware, dispatch=checked)])
    app = Starlette(routes=[Route("/", lambda request: Response(status_code=418))], middleware=layers)
    with TestClient(app) as client:
        assert client.get("/").headers.get("x-checked") == "418"
    assert [layer.cls for layer in plain_asgi(MAIN._get_middleware())].count(Direct) == 6


def test_one_node_holds_one_pull_at_a_time_and_leaves_the_other_slots_to_other_nodes():
    """A node that sends many pulls at once (from many connections) gets one held: the others are
    answered at once, and every other slot stays free for other nodes' pulls."""
    arrivals, held = Arrivals(held_at_once=2), {}

    def hold(name, node_id, waiting):
        def wait():
            held[name] = arrivals.wait_past(node_id, arrivals.mark(node_id), HANG_GUARD_S)
        thread = threading.Thread(target=wait)
        thread.start()
        while thread.is_alive() and len(arrivals._changed._waiters) < waiting:  # held, or answered
            time.sleep(0.001)
        return thread

    pulls = [hold("first", 1, 1), hold("again", 1, 2), hold("another node's", 2, 2)]
    arrivals.stored(1)
    arrivals.stored(2)
    for pull in pulls:
        pull.join(HANG_GUARD_S)
    assert held == {"first": True, "again": False, "another node's": True}
