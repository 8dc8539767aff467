"""The Fleet gateway: the one SuperLink port other machines reach.

Flower 1.42 serves the Fleet API (SuperNodes), the Control API (``flwr
run``, ``flwr ls``, ``flwr supernode register``: whoever reaches it runs apps
and registers nodes; the open-source release authenticates no user) and the
Runtime API on one HTTPS port. So the SuperLink listens on loopback only
(Flower's default ``--host 127.0.0.1``), where the operator's ``flwr`` CLI and
the ServerApp reach it, and this gateway, on the address other machines
connect to, forwards exactly the requests an authenticated SuperNode of Flower
1.42 sends (:data:`FLEET_ENDPOINTS`, ``flwr.supernode.fleet_http_client``) and
nothing else. TLS on both sides: the gateway presents the SuperLink's
certificate and checks the SuperLink's against ``ca.crt``.

What is forwarded: ``POST`` whose raw request target is byte for byte one of
:data:`FLEET_ENDPOINTS` (no decoding, no normalisation: ``/v1/fleet/../x``,
``%2e``, ``//``, a query string or an absolute-form target is simply not in the
table), over HTTP/1.1, with ``Content-Type: application/protobuf`` and a
``Content-Length`` within the endpoint's limit (what Flower itself sends at most);
the SuperLink receives that constant target, Flower's own ``flwr-*`` headers and
the body, nothing else. Everything else is answered here with a 4xx and the
connection closed, before any byte reaches the SuperLink: 404 (any other
target), 405 (any other method), 400 (malformed request, other HTTP version,
repeated Flower header), 411 (no ``Content-Length``, or ``Transfer-Encoding``),
413 (body over the limit: answered on the announced length, the body is never
read), 415 (other Content-Type), 431 (request head over 16 KiB).

Failures, so that no message is lost to a transient one:

- a SuperLink that cannot be reached (down, refused, reset) is tried once more
  on a new connection, then answered 502 (504 on a timeout), which a SuperNode
  retries (``flwr.supercore.retry.http_retry``) until the SuperLink is back. A
  connection to the SuperLink unused for :data:`UPSTREAM_KEEPALIVE_S` is closed
  here, before the SuperLink does under a request (:data:`deploy.flower_shim.SUPERLINK_KEEPALIVE_S`);
- a message whose pull-messages answer never reached its SuperNode is delivered
  again (:class:`deploy.redelivery.Deliveries`: the SuperLink would not send
  it twice); an activate-node repeated because its answer was lost gets the
  first answer (:class:`deploy.redelivery.Activations`).

The SuperLink takes other repeats as they are; a repeated push-object, and a
push-messages repeated after the ServerApp took the reply, the SuperNode settles
(:func:`deploy.flower_resilience.push_until_stored`). The SuperLink's answers
pass unchanged otherwise, limited in size per endpoint (over it: 502).

Each FAB the SuperNodes download (``/v1/fleet/get-fab``) leaves with the signatures the
federation made for it (:func:`deploy.signing.verifications`), which a SuperNode started with
``--trusted-entities`` checks before running anything; an unsigned FAB is refused there.

Resource bounds, against a stranger who opens connections and sends little or
nothing (a client is an IPv4 address or an IPv6 /64; :mod:`deploy.gateway_limits`):

- connections: at most :data:`MAX_CONNECTIONS` (128) open, counted from the TCP
  accept, before TLS (a TLS connection holds asyncio's 256 KiB buffer), and at
  most :data:`MAX_CLIENT_CONNECTIONS` (16) from one client that no 200 has
  answered yet (``--shared-address ADDRESS=N``: N times that for ADDRESS only).
  A connection on which the SuperLink answered 200 is a registered SuperNode's:
  it counts against no address and is never taken back. With every slot held,
  a newcomer takes the slot of the oldest unanswered connection of the address
  holding the most, when that holds more than one beyond the newcomer's;
  otherwise it is closed unanswered. An address starts at most 4 TLS handshakes a
  second (a burst of 16; ``--shared-address``: N times that): others are closed
  before TLS, which costs next to nothing. TLS must be set up within
  :data:`HANDSHAKE_TIMEOUT_S` (5 s), each request head must arrive within
  :data:`HEAD_TIMEOUT_S` (10 s). What closed connections leave in reference
  cycles is collected every :data:`COLLECT_EVERY` (128) closes, so memory
  stays bounded by the slots, not by how many connections come and go.
- bodies: up to :data:`SMALL` (16 KiB, every request but push-messages and
  push-object) bounded by the connection slots alone, so that heartbeats and
  pulls never wait on bodies. Larger ones only from a registered SuperNode (its
  signed request headers verify under a key the SuperLink has answered 200,
  :class:`deploy.gateway_limits.Members`), counted as their bytes arrive: at
  most :data:`CLIENT_BODY_BUDGET` (16 MiB) by one node (it pushes two 6 MiB
  objects at once), :data:`BODY_BUDGET` (64 MiB; ``--nodes N``: N nodes' worth)
  in all; anyone else, or beyond: 503 ``busy; try again``, which a SuperNode
  retries (no counter in it). A body must arrive whole within
  ``BODY_GRACE_S + length / MIN_BODY_RATE`` (10 s plus 64 KiB/s of its announced
  length) of its head, a deadline set once, and without a pause of
  :data:`BODY_STALL_S` (10 s); an answer is sent at that rate too.
- answers: the SuperLink's error details (its JSON) reach a registered SuperNode
  only; others get the status and its phrase, as with the gateway's own 502 / 504.
- log: at most :data:`~deploy.gateway_limits.LOG_LINES` lines a minute, one per refused or failed
  request, each one line of at most :data:`~deploy.gateway_limits.LOG_LINE_CHARS` printable
  characters (client bytes escaped), never a traceback.

``python -m deploy gateway --listen 0.0.0.0:9092 --superlink 127.0.0.1:9091 --ca pki/ca.crt
--cert pki/superlink.crt --key pki/superlink.key --signatures pki/signatures --nodes 3``
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import ssl
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path

import h11
import httpx
from flwr.common.constant import FAB_MAX_SIZE, FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE, TIMESTAMP_HEADER
from flwr.proto.fab_pb2 import GetFabResponse  # pylint: disable=no-name-in-module
from flwr.supercore.constant import (FLEET_HTTP_PUBLIC_KEY_HEADER, FLEET_HTTP_SIGNATURE_HEADER,
                                     FLWR_COMPONENT_NAME_METADATA_KEY, FLWR_PACKAGE_NAME_METADATA_KEY,
                                     FLWR_PACKAGE_VERSION_METADATA_KEY, VERSION_INCOMPATIBILITY_MESSAGE_METADATA_KEY)
from flwr.supercore.protobuf.constants import PROTOBUF_MEDIA_TYPE
from google.protobuf.message import DecodeError

from deploy.gateway_limits import HANDSHAKES_PER_S, Arrivals, LogBudget, Members, Quota, Slot, Slots, client_of
from deploy.redelivery import ACTIVATE, CONFIRM, PULL_MESSAGES, PUSH_MESSAGES, Activations, Deliveries
from deploy.signing import verifications
from deploy.upstream import UpstreamTransport

#: the gateway's log line once it accepts connections
READY = "Fleet gateway: serving"
KIB, MIB = 1 << 10, 1 << 20
#: a request naming a node, run, message or object; an answer carrying ids or a run
SMALL = 16 * KIB
#: one message's metadata and object tree (push-messages; pull-messages answers one message)
MESSAGES = MIB
#: one object: at most one of Flower's array chunks (or an inline bundle of that size,
#: :data:`fedgraphcore.transport.INLINE_BUNDLE_MAX_BYTES`) and the other values of its record
OBJECT = FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE + MIB


@dataclass(frozen=True)
class Endpoint:
    """Largest request body a SuperNode sends to an endpoint and largest answer forwarded (bytes)."""

    request_limit: int
    response_limit: int


GET_FAB = b"/v1/fleet/get-fab"
#: The Fleet API calls of an authenticated Flower 1.42 SuperNode (``FleetHttpClient``) as request
#: targets, byte for byte; ``register-node`` / ``unregister-node`` are sent only by SuperNodes without
#: a registered key, which a SuperLink with ``--enable-supernode-auth`` refuses anyway.
FLEET_ENDPOINTS: dict[bytes, Endpoint] = {
    ACTIVATE: Endpoint(SMALL, SMALL),
    b"/v1/fleet/deactivate-node": Endpoint(SMALL, SMALL),
    b"/v1/fleet/send-node-heartbeat": Endpoint(SMALL, SMALL),
    PULL_MESSAGES: Endpoint(SMALL, MESSAGES),
    PUSH_MESSAGES: Endpoint(MESSAGES, MESSAGES),
    b"/v1/fleet/get-run": Endpoint(SMALL, MIB),
    GET_FAB: Endpoint(SMALL, FAB_MAX_SIZE + MIB),
    b"/v1/fleet/push-object": Endpoint(OBJECT, SMALL),
    b"/v1/fleet/pull-object": Endpoint(SMALL, OBJECT),
    CONFIRM: Endpoint(SMALL, SMALL),
}
PROTOBUF = PROTOBUF_MEDIA_TYPE.encode()
#: request headers forwarded besides the body's type and length: node authentication and Flower's version
FORWARDED_REQUEST_HEADERS = frozenset(name.encode() for name in (
    FLEET_HTTP_PUBLIC_KEY_HEADER, FLEET_HTTP_SIGNATURE_HEADER, TIMESTAMP_HEADER, FLWR_PACKAGE_NAME_METADATA_KEY,
    FLWR_PACKAGE_VERSION_METADATA_KEY, FLWR_COMPONENT_NAME_METADATA_KEY))
#: answer headers forwarded (a SuperNode reads the version refusal)
FORWARDED_RESPONSE_HEADERS = frozenset({"content-type", VERSION_INCOMPATIBILITY_MESSAGE_METADATA_KEY})

MAX_CONNECTIONS = 128
#: from one client (an IPv4 address, an IPv6 /64): a SuperNode keeps a few connections open
MAX_CLIENT_CONNECTIONS = 16
#: connections closed between two full garbage collections: a closed connection can leave its TLS
#: layer (256 KiB) in reference cycles (through exception tracebacks) that only a full collection
#: frees, and Python's own schedule runs one only after thousands of connections
COLLECT_EVERY = MAX_CONNECTIONS
MAX_HEAD_BYTES = 16 * KIB
HANDSHAKE_TIMEOUT_S = 5.0
HEAD_TIMEOUT_S = 10.0
#: a body or an answer may take BODY_GRACE_S plus its size at MIN_BODY_RATE (bytes a second); a body
#: pausing BODY_STALL_S is cut off
BODY_GRACE_S, MIN_BODY_RATE, BODY_STALL_S = 10.0, 64 * KIB, 10.0
BODY_BUDGET = 64 * MIB
#: a SuperNode pushes at most two objects at once (flwr's FLWR_PRIVATE_MAX_CONCURRENT_OBJ_PUSHES)
CLIENT_BODY_BUDGET = 16 * MIB
#: the most SuperNodes ``--nodes`` budgets bodies for (each :data:`CLIENT_BODY_BUDGET`)
MOST_NODES = 64
#: the SuperNode's own client waits 30 s for an answer (flwr.supercore.protobuf.client)
UPSTREAM_TIMEOUT_S = 30.0
#: an unused SuperLink connection is closed here after this, before the SuperLink does (a new one: 2 TLS handshakes)
UPSTREAM_KEEPALIVE_S = 60.0
#: after a refusal, what the client may still be sending is read and dropped (so that it sees the
#: answer rather than a reset connection), up to this much
LINGER_BYTES, LINGER_S = MIB, 2.0
#: ... after a body not taken (503 busy): a SuperNode that reads no answer retries on the reset too
BUSY_LINGER_BYTES = 64 * KIB
_READ_SIZE = 64 * KIB
#: failures of a forward that a SuperNode retries itself: the gateway tries once more first
_TRANSPORT_RETRIED = (httpx.ConnectError, httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError)

log = logging.getLogger("deploy.gateway")


def signed_fab(body: bytes, signatures: Path) -> bytes:
    """A ``GetFabResponse`` with the federation's verification records for its FAB set
    (any records it came with are replaced: only the federation's signatures count)."""
    response = GetFabResponse()
    response.ParseFromString(body)
    response.fab.verifications.clear()
    response.fab.verifications.update(verifications(signatures, response.fab.hash_str))
    return response.SerializeToString()


def refusal(request: h11.Request) -> tuple[int, str] | None:
    """Why ``request`` is not forwarded (status and reason), or None: it is one a SuperNode sends."""
    if request.http_version != b"1.1":
        return 400, "HTTP/1.1 only"
    endpoint = FLEET_ENDPOINTS.get(request.target)
    if endpoint is None:
        return 404, "not a Fleet API endpoint; this address serves the Fleet API only"
    if request.method != b"POST":
        return 405, "POST only"
    values: dict[bytes, list[bytes]] = {}
    for name, value in request.headers:
        values.setdefault(name, []).append(value)
    if b"transfer-encoding" in values or b"content-length" not in values:
        return 411, "a body with Content-Length only"
    if values.get(b"content-type") != [PROTOBUF]:
        return 415, f"Content-Type: {PROTOBUF_MEDIA_TYPE} only"
    if any(len(values.get(name, ())) > 1 for name in FORWARDED_REQUEST_HEADERS):
        return 400, "a Flower header given twice"
    if int(values[b"content-length"][0]) > endpoint.request_limit:
        return 413, f"a body over {endpoint.request_limit} bytes (the most a SuperNode sends here)"
    return None


class _ResponseTooLarge(Exception):
    """The SuperLink's answer is larger than the endpoint's limit."""


class _BodiesFull(Exception):
    """The request bodies held (by everyone, or by this client) are at their budget."""


#: the answer to a request whose body the gateway does not take now (no registered node's, or its
#: node's budget held): nothing of the gateway's state, which the sender could measure itself against
BUSY = "busy; try again"


def _said(status: int) -> bytes:
    """An answer's body that says its status and nothing else (the SuperLink's or the gateway's
    details go to registered SuperNodes, or to the log)."""
    return f"{status} {HTTPStatus(status).phrase}\n".encode()


class _BodyTooSlow(Exception):
    """A request body arrived slower than :data:`MIN_BODY_RATE`."""


def transfer_s(size: int) -> float:
    """Seconds allowed to move ``size`` bytes of a body or an answer."""
    return BODY_GRACE_S + size / MIN_BODY_RATE


def body_deadline(start: float, last: float, length: int) -> float:
    """When a body announced ``length`` bytes long, its head read at ``start``, its latest bytes at
    ``last``, is cut off unless whole: :func:`transfer_s` of its announced length after its head
    (what it sent does not extend it), and :data:`BODY_STALL_S` after its latest bytes (a body sent
    but for its last byte holds its budget no longer than that)."""
    return min(start + transfer_s(length), last + BODY_STALL_S)


async def _read_limited(response: httpx.Response, limit: int) -> bytes:
    declared = response.headers.get("content-length")
    if declared is not None and int(declared) > limit:
        raise _ResponseTooLarge(f"{declared} bytes announced, at most {limit}")
    body = bytearray()
    async for chunk in response.aiter_raw():
        body += chunk
        if len(body) > limit:
            raise _ResponseTooLarge(f"over {limit} bytes")
    return bytes(body)


def _head(status: int, headers: list[tuple[bytes, bytes]], body: bytes, close: bool) -> h11.Response:
    headers = [(b"content-length", str(len(body)).encode()), *headers]
    if close:
        headers.append((b"connection", b"close"))
    return h11.Response(status_code=status, headers=headers, reason=HTTPStatus(status).phrase.encode())


class FleetGateway:
    """Forwards SuperNodes' Fleet API requests to the SuperLink ``superlink`` (host:port, HTTPS,
    certificate checked against ``ca_cert``), speaking TLS with ``tls`` to its clients;
    :meth:`accept` takes a new TCP connection."""

    def __init__(self, superlink: str, ca_cert: Path, signatures: Path, tls: ssl.SSLContext, *,
                 max_connections: int = MAX_CONNECTIONS, max_client_connections: int = MAX_CLIENT_CONNECTIONS,
                 body_budget: int = BODY_BUDGET, client_body_budget: int = CLIENT_BODY_BUDGET,
                 shared: dict[str, int] | None = None) -> None:
        self.urls = {target: f"https://{superlink}{target.decode('ascii')}" for target in FLEET_ENDPOINTS}
        self.signatures, self.tls = Path(signatures), tls
        self.client = httpx.AsyncClient(
            transport=UpstreamTransport(ssl.create_default_context(cafile=str(ca_cert)), httpx.Limits(
                max_connections=max_connections, keepalive_expiry=UPSTREAM_KEEPALIVE_S)),
            timeout=UPSTREAM_TIMEOUT_S, follow_redirects=False, trust_env=False)  # trust_env: no proxy from the environment
        self.connections = Slots(max_connections, max_client_connections, shared)
        self.arrivals = Arrivals(max_client_connections, shared=shared)
        self.bodies = Quota(body_budget, client_body_budget, "bytes of request bodies")  # by registered node
        self.members = Members()
        self.tasks: set[asyncio.Task] = set()
        self.closed = 0
        self.note = LogBudget()
        self.deliveries, self.activations = Deliveries(self.note), Activations(self.note)

    def accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """A new TCP connection (``asyncio.start_server``'s callback, called as it is made): counted
        against the connection limits, or closed unanswered at once; then served by :meth:`handle`
        in a task of its own."""
        peer = (writer.get_extra_info("peername") or ("?",))[0]
        client = client_of(peer)
        if not self.arrivals.admit(client):
            self.note(f"closed a connection from {peer}: over {HANDSHAKES_PER_S:g} new connections a second")
            writer.transport.abort()
            return
        slot, full = self.connections.take(client, writer.transport.abort)
        if slot is None:
            self.note(f"closed a connection from {peer}: {full}")
            writer.transport.abort()
            return
        task = asyncio.get_running_loop().create_task(self.handle(reader, writer, peer, slot))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: str, slot: Slot) -> None:
        """Serve one connection, holding ``slot``, until it closes or fails; then give back its slot."""
        try:
            # Before anything is read: this task's first step is queued as the connection is made,
            # before the event loop first polls the socket, so it runs before the transport's first
            # read; start_tls stops reading until TLS is in place, so no byte is read as plain text.
            await writer.start_tls(self.tls, ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S)
        except OSError:  # no TLS, too slow, or gone: start_tls closed the connection
            self._closed(slot)
            return
        try:
            await self._serve_requests(reader, writer, peer, slot)
        finally:
            await self._close(writer)
            self._closed(slot)

    def _closed(self, slot: Slot) -> None:
        self.connections.give_back(slot)
        self.closed += 1
        if self.closed % COLLECT_EVERY == 0:
            gc.collect()

    async def _serve_requests(self, reader, writer, peer: str, slot: Slot) -> None:
        conn, served = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES), 0
        try:
            while await self._exchange(conn, reader, writer, peer, slot):
                conn.start_next_cycle()
                served += 1
        except _BodyTooSlow:
            self.note(f"closed a connection from {peer}: a body slower than {MIN_BODY_RATE // KIB} KiB/s")
        except TimeoutError:
            idle = served and conn.their_state is h11.IDLE and not conn.trailing_data[0]
            if not idle:  # a kept-alive connection left unused is closed without a note
                self.note(f"closed a connection from {peer}: no request (or answer taken) within the time allowed")
        except (OSError, h11.ProtocolError):
            pass  # the client went away: nobody to answer
        except Exception as err:  # pylint: disable=broad-except
            self.note(f"closed a connection from {peer}: {type(err).__name__}: {err}")

    @staticmethod
    async def _close(writer: asyncio.StreamWriter) -> None:
        """Close (TLS: close_notify first); a client that takes nothing for LINGER_S is cut off."""
        writer.close()
        try:
            async with asyncio.timeout(LINGER_S):
                await writer.wait_closed()
        except Exception:  # pylint: disable=broad-except  # late, reset: cut off below either way
            pass
        writer.transport.abort()

    async def _exchange(self, conn: h11.Connection, reader, writer, peer: str, slot: Slot) -> bool:
        """One request: refused, or forwarded and the SuperLink's answer sent back. True: the
        connection stays open for the next request."""
        try:
            request = await self._read_head(conn, reader)
        except h11.RemoteProtocolError as err:
            status = 431 if err.error_status_hint == 431 else 400
            await self._refuse(conn, reader, writer, status, f"malformed request ({err})", b"", peer)
            return False
        if request is None:
            return False
        if problem := refusal(request):
            await self._refuse(conn, reader, writer, *problem, request.target, peer, request.method)
            return False
        headers = dict(request.headers)
        length = int(headers[b"content-length"])
        holder = self.members.member(headers) if length > SMALL else None  # a larger body: a registered node's
        try:
            if length > SMALL and holder is None:
                raise _BodiesFull("a body over 16 KiB from no registered SuperNode")
            body = await self._read_body(conn, reader, holder, length)
        except _BodiesFull as full:
            await self._refuse(conn, reader, writer, 503, f"busy ({full})", request.target, peer, request.method,
                               answer=BUSY, linger=BUSY_LINGER_BYTES)
            return False
        try:
            status, reply_headers, payload = await self._forward(request, body, peer)
        finally:
            if holder is not None:
                self.bodies.give_back(holder, len(body))
        if status == 200:  # the SuperLink authenticated the node: its key and this connection are a member's
            self.members.learn(headers)
            self.connections.prove(slot)
        elif self.members.member(headers) is None:  # error details for registered SuperNodes only
            reply_headers, payload = [(b"content-type", b"text/plain; charset=utf-8")], _said(status)
        await self._send(conn, writer, _head(status, reply_headers, payload, close=False), payload)
        return conn.our_state is h11.DONE and conn.their_state is h11.DONE

    @staticmethod
    async def _read_head(conn: h11.Connection, reader) -> h11.Request | None:
        """The next request head. h11 holds at most MAX_HEAD_BYTES + 1 bytes of it (bodies are read
        no further than their length), so a longer head is incomplete there and refused 431 in
        whatever chunks it arrives."""
        held = len(conn.trailing_data[0])
        async with asyncio.timeout(HEAD_TIMEOUT_S):
            while (event := conn.next_event()) is h11.NEED_DATA:
                data = await reader.read(max(1, MAX_HEAD_BYTES + 1 - held))
                held += len(data)
                conn.receive_data(data)
        return event if isinstance(event, h11.Request) else None

    async def _read_body(self, conn: h11.Connection, reader, holder: bytes | None, length: int) -> bytes:
        """The body, exactly Content-Length bytes (h11 holds the request to it); a registered node's
        (``holder``: its key) each byte counted against the body budgets as it arrives (the caller
        gives them back once the body is forwarded; here, if it is not read whole). Raises
        _BodiesFull beyond a budget, _BodyTooSlow past :func:`body_deadline`."""
        received = bytearray()
        clock = asyncio.get_running_loop().time
        start = clock()
        try:
            async with asyncio.timeout_at(body_deadline(start, start, length)) as deadline:
                while not isinstance(event := conn.next_event(), h11.EndOfMessage):
                    if event is h11.NEED_DATA:  # h11 has passed on all it holds of the body
                        conn.receive_data(await reader.read(max(1, min(_READ_SIZE, length - len(received)))))
                    elif isinstance(event, h11.Data):
                        if holder is not None and (full := self.bodies.take(holder, len(event.data))):
                            raise _BodiesFull(full)
                        received += event.data
                        deadline.reschedule(body_deadline(start, clock(), length))
                    else:
                        raise ConnectionResetError("the client closed the connection mid-request")
        except BaseException as err:
            if holder is not None:
                self.bodies.give_back(holder, len(received))
            if isinstance(err, TimeoutError):
                raise _BodyTooSlow(f"{len(received)} bytes") from err
            raise
        return bytes(received)

    async def _refuse(self, conn, reader, writer, status: int, reason: str, target: bytes, peer: str,
                      method: bytes = b"", answer: str | None = None, linger: int = LINGER_BYTES) -> None:
        """Answer ``status`` with the reason (``answer`` instead, where the reason is for the log
        only), close the connection: the rest of what the client sent (an unread body, a smuggled
        request) is never read as a request."""
        self.note(f"refused {status} {method.decode('latin-1')} {target[:100]!r} from {peer}: {reason}")
        said = reason if answer is None else answer
        body = b"" if method == b"HEAD" else f"{status} {HTTPStatus(status).phrase}: {said}\n".encode()
        headers = [(b"content-type", b"text/plain; charset=utf-8")] + ([(b"allow", b"POST")] if status == 405 else [])
        try:
            await self._send(conn, writer, _head(status, headers, body, close=True), body)
        except h11.LocalProtocolError:
            return  # h11 cannot frame an answer to this request: closing is the answer
        await self._linger(reader, linger)

    @staticmethod
    async def _send(conn: h11.Connection, writer, head: h11.Response, body: bytes) -> None:
        data = conn.send(head) + (conn.send(h11.Data(data=body)) if body else b"") + conn.send(h11.EndOfMessage())
        writer.write(data)
        async with asyncio.timeout(transfer_s(len(data))):
            await writer.drain()

    @staticmethod
    async def _linger(reader, most: int) -> None:
        """Read and drop up to ``most`` bytes for up to :data:`LINGER_S`: a connection closed with
        unread data is reset, and the reset can destroy the answer before the client reads it."""
        dropped = 0
        try:
            async with asyncio.timeout(LINGER_S):
                while dropped < most and (chunk := await reader.read(_READ_SIZE)):
                    dropped += len(chunk)
        except TimeoutError:
            pass

    async def _forward(self, request: h11.Request, body: bytes, peer: str) -> tuple[int, list, bytes]:
        """The SuperLink's answer to ``body`` at the endpoint ``request.target`` (a constant from the
        table, not the client's bytes), or the gateway's 502 / 504 when there is none."""
        headers = [(b"content-type", PROTOBUF), (b"accept", PROTOBUF), (b"accept-encoding", b"identity")]
        headers += [(name, value) for name, value in request.headers if name in FORWARDED_REQUEST_HEADERS]
        upstream = self.client.build_request("POST", self.urls[request.target], headers=headers, content=body)
        try:
            status, reply_headers, payload = await self._send_upstream(upstream, request.target)
            if request.target == GET_FAB and status == 200:
                payload = signed_fab(payload, self.signatures)
            return self._settled(request, body, status, reply_headers, payload)
        except httpx.TimeoutException as err:
            status, why = 504, f"no answer from the SuperLink within {UPSTREAM_TIMEOUT_S:g} s ({type(err).__name__})"
        except (httpx.TransportError, _ResponseTooLarge, DecodeError) as err:
            status, why = 502, f"the SuperLink could not be reached or answered badly ({type(err).__name__}: {err})"
        self.note(f"answered {status} to {request.target.decode('ascii')} from {peer}: {why}")
        return status, [(b"content-type", b"text/plain; charset=utf-8")], _said(status)

    def _settled(self, request: h11.Request, body: bytes, status: int, headers: list,
                 payload: bytes) -> tuple[int, list, bytes]:
        """The answer to send for the SuperLink's: a delivery repeated (:class:`Deliveries`), an
        activation repeated (:class:`Activations`), or the SuperLink's own."""
        key = dict(request.headers).get(FLEET_HTTP_PUBLIC_KEY_HEADER.encode())
        if repeated := self.activations.answer(request.target, key, body, status, payload):
            return repeated[0], [(b"content-type", PROTOBUF)], repeated[1]
        if status == 200:
            payload = self.deliveries.answer(request.target, body, payload)
        return status, headers, payload

    async def _send_upstream(self, upstream: httpx.Request, target: bytes) -> tuple[int, list, bytes]:
        """Status, forwarded headers and body of the SuperLink's answer; a failed connection is tried
        once more (a new one: the pool drops a failed connection)."""
        for attempt in (1, 2):
            try:
                response = await self.client.send(upstream, stream=True)
                try:
                    payload = await _read_limited(response, FLEET_ENDPOINTS[target].response_limit)
                finally:
                    await response.aclose()
                headers = [(name.encode(), value.encode()) for name, value in response.headers.items()
                           if name in FORWARDED_RESPONSE_HEADERS]
                return response.status_code, headers, payload
            except _TRANSPORT_RETRIED:
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        await self.client.aclose()


def _host_port(address: str, what: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536 or any(c in host for c in "/?#@\\ "):
        raise SystemExit(f"error: {what} {address!r} is not HOST:PORT (e.g. 127.0.0.1:9091)")
    return host.strip("[]"), int(port)


def _server_tls(cert: Path, key: Path) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(str(cert), str(key))
    return context


def federation_limits(nodes: int = 1, shared: list[str] = ()) -> dict:
    """The bounds for a federation of ``nodes`` SuperNodes, ``shared`` ``ADDRESS=N`` for an address N
    of them share (one machine, a NAT): registered nodes' bodies budgeted for ``nodes`` pushing at
    once (at least :data:`BODY_BUDGET`), and that address's unproven connections N times one's."""
    most = MAX_CONNECTIONS // MAX_CLIENT_CONNECTIONS
    if not 1 <= nodes <= MOST_NODES:
        raise SystemExit(f"error: --nodes {nodes}; valid: 1 to {MOST_NODES}")
    by_address = {}
    for item in shared:
        address, _, count = item.rpartition("=")
        if not address or not count.isdigit() or not 1 <= int(count) <= most:
            raise SystemExit(f"error: --shared-address {item!r}; valid: ADDRESS=N, N from 1 to {most}")
        by_address[client_of(address)] = int(count)
    return {"body_budget": max(BODY_BUDGET, nodes * CLIENT_BODY_BUDGET), "shared": by_address}


# asyncio with the h11 parser (httpx's), not uvicorn: uvicorn puts no deadline on a request head
async def _serve(listen: tuple[str, int], superlink: str, ca_cert: Path, signatures: Path,
                 tls: ssl.SSLContext, limits: dict[str, int]) -> None:
    gateway = FleetGateway(superlink, ca_cert, signatures, tls, **limits)
    gc.collect()
    gc.freeze()  # what is loaded by now (Flower, httpx) lives on: collections skip it, and cost little
    loop = asyncio.get_running_loop()
    # asyncio's own reports (e.g. a TLS transport torn down mid-write) as budgeted one-liners
    loop.set_exception_handler(lambda _, context: gateway.note(f"connection error: {context.get('message')}"))
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    # plain TCP: a connection is counted before TLS is set up on it (FleetGateway.handle)
    server = await asyncio.start_server(gateway.accept, *listen, reuse_address=True)
    log.info("%s the Fleet API of %s on https://%s:%d", READY, superlink, *listen)
    async with server:
        await stop.wait()
    await gateway.aclose()


def serve(listen: str, superlink: str, ca_cert: Path, cert: Path, key: Path, signatures: Path,
          nodes: int = 1, shared: list[str] = ()) -> None:
    """Run the gateway on ``listen`` (host:port) until SIGTERM / SIGINT; ``nodes``, ``shared``:
    :func:`federation_limits`."""
    _host_port(superlink, "--superlink")
    limits = federation_limits(nodes, list(shared))
    logging.basicConfig(format="%(asctime)s %(message)s", level=logging.WARNING)  # httpx's per-request lines: no
    log.setLevel(logging.INFO)
    asyncio.run(_serve(_host_port(listen, "--listen"), superlink, ca_cert, signatures, _server_tls(cert, key), limits))
