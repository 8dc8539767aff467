"""Flower's HTTP middlewares as plain ASGI: the same checks, without a task per layer.

Flower 1.42's SuperLink (``flwr.superlink.main._get_middleware``) wraps every request, Fleet and
runtime API ones included, in eight Starlette ``BaseHTTPMiddleware`` layers, and a SuperNode's
runtime API (``flwr.supernode.main.create_app``: its SuperExec's and ClientApps' requests) in two.
Each such layer runs the rest of the stack in a task of its own and hands the response back
through a memory stream: ``benchmarks/flower_costs.py`` measured about 3 ms of the SuperLink's CPU
per request for them. :func:`plain_asgi` maps Flower's list onto plain ASGI middlewares that make
the same checks:

* :class:`Direct` runs a middleware's own ``dispatch`` (Flower's code: node authentication,
  Control API authentication, the licence check, both event logs, the error translation) with a
  ``call_next`` that runs the rest of the stack on the connection itself. It is for middlewares
  whose ``dispatch`` returns ``call_next``'s response as it is, or a response of its own made
  before the rest of the stack answers (an error);
* :class:`NoStoreSensitive` adds Flower's no-cache headers to the sensitive Control API answers;
* :class:`ProtobufTranslated` parses the protobuf request and answers the handler's protobuf
  result with the same static methods and the same rules as ``ProtobufTranslationMiddleware``.

A middleware this module does not know (an extension's, or one a later Flower adds, a plain
``BaseHTTPMiddleware`` whose ``dispatch`` is not Flower's error translator too) stays as Flower
gives it: its ``dispatch`` may read or change ``call_next``'s answer.
"""

from __future__ import annotations

import functools

from starlette.datastructures import MutableHeaders
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class _Sent(Response):
    """What ``call_next`` gives a :class:`Direct` dispatch: the answer already went out."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        return None


class Direct:
    """Flower's ``BaseHTTPMiddleware`` ``flower`` (its ``dispatch``, or ``dispatch`` given) run
    in this layer, the rest of the stack answering on the connection itself."""

    def __init__(self, app: ASGIApp, flower: type[BaseHTTPMiddleware], **kwargs) -> None:
        self.app = app
        self.dispatch = flower(app, **kwargs).dispatch_func

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        async def call_next(_request: Request) -> Response:
            await self.app(scope, receive, tracked)
            return _Sent()

        response = await self.dispatch(Request(scope, receive), call_next)
        if not started:  # an answer of the dispatch's own (an error translated after a failure)
            await response(scope, receive, send)


class NoStoreSensitive:
    """``ControlSensitiveResponseMiddleware``: Flower's no-cache headers on the answers of the
    routes Flower names sensitive."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        from flwr.superlink.routers.control.middlewares import _is_control_sensitive_route

        if scope["type"] != "http" or not _is_control_sensitive_route(Request(scope)):
            await self.app(scope, receive, send)
            return

        async def no_store(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                headers["Cache-Control"] = "no-store"
                headers["Pragma"] = "no-cache"
            await send(message)

        await self.app(scope, receive, no_store)


class _Held:
    """The rest of the stack's answer, held back: its start (status, headers) and body."""

    def __init__(self) -> None:
        self.messages: list[Message] = []

    async def send(self, message: Message) -> None:
        self.messages.append(message)

    @property
    def status(self) -> int:
        return self.messages[0]["status"]

    @property
    def headers(self) -> list[tuple[bytes, bytes]]:
        return list(self.messages[0].get("headers", []))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        for message in self.messages:
            await send(message)


def _replaying(body: bytes, receive: Receive) -> Receive:
    """``receive`` whose first message is the whole ``body``, already read."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def replay() -> Message:
        return pending.pop() if pending else await receive()

    return replay


class ProtobufTranslated:
    """``ProtobufTranslationMiddleware``: a protobuf route's request parsed into the request's
    state, its handler's result (in the state) answered as protobuf."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        from flwr.supercore.protobuf.translation import PROTOBUF_REQUEST_TYPES, ProtobufTranslationMiddleware as Flower

        request = Request(scope, receive) if scope["type"] == "http" else None
        request_type = PROTOBUF_REQUEST_TYPES.get((request.method, request.url.path)) if request else None
        if request_type is None:
            await self.app(scope, receive, send)
            return
        Flower._check_request_media_type(request)
        body = await request.body()
        request.state.protobuf_request = Flower._parse_request(body, request_type)
        held = _Held()
        await self.app(scope, _replaying(body, receive), held.send)
        response = self.translated(request, held)
        await response(scope, receive, send)

    @staticmethod
    def translated(request: Request, held: _Held):
        """The answer Flower's ``dispatch`` makes of the handler's (``held``)."""
        from flwr.supercore.error import ApiErrorCode, FlowerError
        from flwr.supercore.protobuf.streaming import get_protobuf_stream_context
        from flwr.supercore.protobuf.translation import ProtobufTranslationMiddleware as Flower

        if held.status >= 400:
            content_type = dict(held.headers).get(b"content-type", b"").decode("latin-1")
            media_type = content_type.partition(";")[0].strip().lower()
            if media_type == "application/json" or media_type.endswith("+json"):
                return held
            raise FlowerError(ApiErrorCode.INVALID_PROTOBUF_RESPONSE, "Protobuf route returned a non-JSON HTTP error "
                              f"response with Content-Type {content_type!r}.")
        if not hasattr(request.state, "protobuf_response"):
            raise FlowerError(ApiErrorCode.INVALID_PROTOBUF_RESPONSE,
                              "Protobuf response missing from request state after handler completed.")
        response = Flower._response_for(request.state.protobuf_response, get_protobuf_stream_context(request))
        del request.state.protobuf_response
        response.status_code = held.status
        response.headers.raw.extend(h for h in held.headers if h[0] not in (b"content-length", b"content-type"))
        return response


def plain_asgi(middleware: list[Middleware]) -> list[Middleware]:
    """Flower's ``middleware`` list, each layer this module knows made plain ASGI."""
    from flwr.superlink.routers.control.middlewares import (ControlAuthenticationMiddleware, ControlEventLogMiddleware,
                                                            ControlLicenseMiddleware, ControlSensitiveResponseMiddleware)
    from flwr.superlink.routers.fleet.middlewares import FleetEventLogMiddleware
    from flwr.superlink.routers.fleet.node_auth import NodeAuthMiddleware
    from flwr.supercore.error import http_error_translator
    from flwr.supercore.protobuf.translation import ProtobufTranslationMiddleware

    direct = {ControlAuthenticationMiddleware, ControlEventLogMiddleware, ControlLicenseMiddleware, NodeAuthMiddleware,
              FleetEventLogMiddleware}
    plain = {ControlSensitiveResponseMiddleware: NoStoreSensitive, ProtobufTranslationMiddleware: ProtobufTranslated}
    out = []
    for layer in middleware:
        # a plain BaseHTTPMiddleware runs the dispatch it is given: Flower's error translator is known,
        # another's (an extension's) may use call_next's answer
        translator = layer.cls is BaseHTTPMiddleware and layer.kwargs.get("dispatch") is http_error_translator
        if layer.cls in direct or translator:
            out.append(Middleware(Direct, *layer.args, flower=layer.cls, **layer.kwargs))
        else:
            out.append(Middleware(plain[layer.cls], *layer.args, **layer.kwargs) if layer.cls in plain else layer)
    return out


def patch_superlink_app(main) -> None:
    """Make ``main`` (``flwr.superlink.main``) build its app with :func:`plain_asgi` middlewares."""
    flowers = main._get_middleware
    main._get_middleware = lambda: plain_asgi(flowers())


def patch_supernode_app(main) -> None:
    """Make ``main`` (``flwr.supernode.main``) build its runtime API app with :func:`plain_asgi`
    middlewares."""
    create_app = main.create_app

    @functools.wraps(create_app)
    def create_plain_app(*args, **kwargs):
        app = create_app(*args, **kwargs)
        app.user_middleware[:] = plain_asgi(app.user_middleware)
        return app

    main.create_app = create_plain_app
