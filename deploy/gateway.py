"""The Fleet gateway: the one SuperLink port other machines reach.

Flower 1.41 / 1.42 serve the Fleet API (SuperNodes), the Control API (``flwr
run``, ``flwr ls``, ``flwr supernode register``: whoever reaches it runs apps
and registers nodes; the open-source release authenticates no user) and the
Runtime API on one HTTPS port. So the SuperLink listens on loopback only
(Flower's default ``--host 127.0.0.1``), where the operator's ``flwr`` CLI and
the ServerApp reach it, and this gateway, on the address other machines
connect to, forwards ``POST /v1/fleet/*`` and nothing else (any other path:
404, no byte reaches the SuperLink). TLS on both sides: the gateway presents
the SuperLink's certificate and checks the SuperLink's against ``ca.crt``.

Each FAB the SuperNodes download (``/v1/fleet/get-fab``) leaves with the
signatures the federation made for it (:func:`deploy.signing.verifications`),
which a SuperNode started with ``--trusted-entities`` checks before running
anything; an unsigned FAB leaves without any and is refused there.

``python -m deploy gateway --listen 0.0.0.0:9092 --superlink 127.0.0.1:9091
--ca pki/ca.crt --cert pki/superlink.crt --key pki/superlink.key
--signatures pki/signatures``
"""

from __future__ import annotations

import ssl
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
from flwr.proto.fab_pb2 import GetFabResponse  # pylint: disable=no-name-in-module
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from deploy.signing import verifications

FLEET_PREFIX = "/v1/fleet/"
GET_FAB = "/v1/fleet/get-fab"
#: hop-by-hop headers and those the gateway's own response recomputes
_NOT_FORWARDED = {"host", "connection", "keep-alive", "transfer-encoding", "content-length", "content-encoding",
                  "upgrade", "te", "trailer", "proxy-authorization", "proxy-authenticate"}


def signed_fab(body: bytes, signatures: Path) -> bytes:
    """A ``GetFabResponse`` with the federation's verification records for its FAB set
    (any records it came with are replaced: only the federation's signatures count)."""
    response = GetFabResponse()
    response.ParseFromString(body)
    response.fab.verifications.clear()
    response.fab.verifications.update(verifications(signatures, response.fab.hash_str))
    return response.SerializeToString()


def create_app(superlink: str, ca_cert: Path, signatures: Path) -> Starlette:
    """The gateway as an ASGI app forwarding the Fleet API to ``superlink`` (host:port, HTTPS)."""
    client_holder: dict[str, httpx.AsyncClient] = {}

    @asynccontextmanager
    async def lifespan(app):
        context = ssl.create_default_context(cafile=str(ca_cert))
        async with httpx.AsyncClient(base_url=f"https://{superlink}", verify=context, timeout=None) as client:
            client_holder["client"] = client
            yield

    async def forward(request: Request) -> Response:
        path = request.url.path
        if request.method != "POST" or not path.startswith(FLEET_PREFIX):
            return PlainTextResponse("not found: this address serves the Fleet API only\n", status_code=404)
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _NOT_FORWARDED]
        upstream = await client_holder["client"].post(path, params=request.query_params, headers=headers,
                                                      content=await request.body())
        body = upstream.content
        if path == GET_FAB and upstream.status_code == 200:
            body = signed_fab(body, signatures)
        return Response(body, status_code=upstream.status_code,
                        headers={k: v for k, v in upstream.headers.items() if k.lower() not in _NOT_FORWARDED})

    return Starlette(routes=[Route("/{path:path}", forward, methods=["GET", "POST", "PUT", "DELETE", "PATCH"])],
                     lifespan=lifespan)


def serve(listen: str, superlink: str, ca_cert: Path, cert: Path, key: Path, signatures: Path) -> None:
    """Run the gateway on ``listen`` (host:port) until stopped."""
    import uvicorn

    host, _, port = listen.rpartition(":")
    uvicorn.run(create_app(superlink, ca_cert, signatures), host=host.strip("[]"), port=int(port),
                ssl_certfile=str(cert), ssl_keyfile=str(key), log_level="info", access_log=False)
