"""The Fleet gateway attacked from the network, as deployed: the real gateway process over TLS
in front of a recording SuperLink stand-in, spoken to byte-exact over raw TLS sockets.

What a stranger holding ``ca.crt`` may reach is exactly the Fleet endpoints a SuperNode of
Flower 1.42 calls (byte-identical request targets); every path-confusion, framing or method
trick is refused with a 4xx before a single byte reaches the SuperLink. A stranger holding
connections, announcing bodies it never sends or sending them slowly does not keep a SuperNode
at another address from being served. Attackers connect from other loopback addresses
(:data:`ATTACKER`, ``127.0.0.2`` ...) than the SuperNode (``127.0.0.1``)."""

from __future__ import annotations

import base64
import http.client
import os
import socket
import ssl
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from socketserver import ThreadingTCPServer

import pytest
from flwr.proto.fab_pb2 import GetFabResponse  # pylint: disable=no-name-in-module

from conftest import HANG_GUARD_S, wait_until
from deploy.federation import REPO, free_port
from deploy.gateway import (BODY_BUDGET, CLIENT_BODY_BUDGET, FLEET_ENDPOINTS, MAX_CLIENT_CONNECTIONS, MAX_CONNECTIONS,
                            READY, SMALL, federation_limits)
from deploy.gateway_limits import LOG_LINE_CHARS, LOG_LINES, LOG_WINDOW_S, LogBudget
from deploy.pki import make_all
from deploy.signing import VERIFIED_ENTRY, make_signing_key, sign_fab, verifications

SIGNED_FAB = b"the federation's app bundle"


@dataclass(frozen=True)
class Received:
    """One request as the SuperLink stand-in read it off the wire."""

    request_line: bytes
    headers: tuple[tuple[str, str], ...]
    body: bytes


class _Recorder(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: "_TLSServer"

    def setup(self) -> None:
        self.server.live.add(self.request)
        super().setup()

    def finish(self) -> None:
        self.server.live.discard(self.request)
        super().finish()

    def parse_request(self) -> bool:
        ok = super().parse_request()
        self._record_line = self.raw_requestline.rstrip(b"\r\n")
        if not ok:  # whatever reached the SuperLink counts, parseable or not
            self.server.received.append(Received(self._record_line, (), b""))
        return ok

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        self.server.received.append(Received(self._record_line, tuple(self.headers.items()), body))
        status, payload = self.server.answer(self.path.encode("latin-1"))
        self.send_response(status)
        self.send_header("Content-Type", "application/protobuf")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_POST = do_GET = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_HEAD = do_TRACE = do_CONNECT = _answer

    def log_message(self, *args) -> None:
        pass


class _TLSServer(ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True

    def __init__(self, port: int, context: ssl.SSLContext, stand_in: "RecordingSuperLink") -> None:
        self.context, self.live = context, set()
        self.received, self.answer = stand_in.received, stand_in.answer
        super().__init__(("127.0.0.1", port), _Recorder)

    def get_request(self):
        sock, address = super().get_request()
        return self.context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), address


class RecordingSuperLink:
    """A TLS HTTP/1.1 server on loopback standing in for the SuperLink: records every request it
    receives (request line, headers, body) and answers 200 (``get-fab``: a ``GetFabResponse`` for
    :data:`SIGNED_FAB`); :meth:`stop` closes it and every open connection, :meth:`start` serves
    again on the same port."""

    def __init__(self, pki: Path) -> None:
        self.port = free_port()
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.load_cert_chain(pki / "superlink.crt", pki / "superlink.key")
        self.received: list[Received] = []
        self.status = 200
        self.body: bytes | None = None  # instead of the usual answer
        #: the public keys (header values) it answers; None: every request, with a key or not
        self.registered: set[str] | None = None
        self._server: _TLSServer | None = None

    def answer(self, target: bytes) -> tuple[int, bytes]:
        if self.registered is not None and not self._authenticated(dict(self.received[-1].headers)):
            return 401, b'{"detail":"Invalid SuperNode authentication"}'
        if self.body is not None:
            return self.status, self.body
        if target == b"/v1/fleet/get-fab":
            response = GetFabResponse()
            response.fab.hash_str = fab_hash(SIGNED_FAB)
            response.fab.content = SIGNED_FAB
            response.fab.verifications.update({"fpk_forged": "{}", VERIFIED_ENTRY: "Valid"})
            return self.status, response.SerializeToString()
        return self.status, b"answer to " + target

    def _authenticated(self, headers) -> bool:
        """As the SuperLink checks a request: a registered key that signed the request's timestamp."""
        from flwr.supercore.primitives.asymmetric import bytes_to_public_key, verify_signature

        key, stamp, signature = (headers.get(h) for h in ("flwr-public-key", "flwr-timestamp", "flwr-signature"))
        if key not in self.registered or not stamp or not signature:
            return False
        return verify_signature(bytes_to_public_key(base64.b64decode(key)), stamp.encode(), base64.b64decode(signature))

    def start(self) -> None:
        self._server = _TLSServer(self.port, self.context, self)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        for sock in list(self._server.live):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()


def fab_hash(content: bytes) -> str:
    import hashlib

    return hashlib.sha256(content).hexdigest()


@dataclass
class Gateway:
    port: int
    ca: Path
    log: Path
    proc: subprocess.Popen
    pki: Path


#: the tests' own client address (their SuperNode, and the prober of the 4xx tests) opens many
#: connections in quick succession: the gateway takes it for eight SuperNodes sharing it
TESTS_ADDRESS = ("--shared-address", "127.0.0.1=8")


def start_gateway(tmp: Path, pki: Path, superlink_port: int, *options: str) -> Gateway:
    """The gateway as ``python -m deploy gateway`` runs it (with ``options``, by default
    :data:`TESTS_ADDRESS`), logging to ``tmp/gateway.log``."""
    options = options or TESTS_ADDRESS
    port, log = free_port(), tmp / "gateway.log"
    cmd = [sys.executable, "-m", "deploy", "gateway", "--listen", f"127.0.0.1:{port}",
           "--superlink", f"127.0.0.1:{superlink_port}", "--ca", str(pki / "ca.crt"),
           "--cert", str(pki / "superlink.crt"), "--key", str(pki / "superlink.key"),
           "--signatures", str(pki / "signatures"), *options]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
    wait_until(lambda: READY in log.read_text() or proc.poll() is not None, "the gateway to start")
    assert proc.poll() is None, log.read_text()
    return Gateway(port, pki / "ca.crt", log, proc, pki)


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    """PKI with a signed FAB, the recording SuperLink stand-in and the gateway in front of it."""
    tmp = tmp_path_factory.mktemp("gateway")
    pki = tmp / "pki"
    make_all(pki, 1)
    key, _ = make_signing_key(tmp / "signer")
    sign_fab(SIGNED_FAB, key, pki / "signatures")
    upstream = RecordingSuperLink(pki)
    upstream.start()
    gateway = start_gateway(tmp, pki, upstream.port)
    yield gateway, upstream, pki
    gateway.proc.kill()
    gateway.proc.wait()
    upstream.stop()


# -- a client that sends exactly the bytes it is given -----------------------------------------
@dataclass
class Answer:
    status: int | None  # None: the connection closed without an answer
    headers: dict
    body: bytes


#: where attacks come from (a SuperNode's requests come from 127.0.0.1)
ATTACKER = "127.0.0.2"


def attacker(i: int) -> str:
    """The ``i``-th attacker address (another machine each)."""
    return f"127.0.0.{2 + i}"


def tcp(gateway: Gateway, source: str = "127.0.0.1") -> socket.socket:
    return socket.create_connection(("127.0.0.1", gateway.port), timeout=HANG_GUARD_S, source_address=(source, 0))


def connect(gateway: Gateway, source: str = "127.0.0.1") -> ssl.SSLSocket:
    context = ssl.create_default_context(cafile=str(gateway.ca))
    return context.wrap_socket(tcp(gateway, source), server_hostname="127.0.0.1")


def try_connect(gateway: Gateway, source: str) -> ssl.SSLSocket | None:
    """A TLS connection from ``source``, or None: the gateway closed it before the handshake."""
    try:
        return connect(gateway, source)
    except (ConnectionError, ssl.SSLError):
        return None


def read_answer(sock: ssl.SSLSocket, method: str = "POST") -> Answer:
    response = http.client.HTTPResponse(sock, method=method)
    try:
        response.begin()
    except (http.client.RemoteDisconnected, ConnectionError, ssl.SSLError):
        return Answer(None, {}, b"")
    return Answer(response.status, {k.lower(): v for k, v in response.getheaders()}, response.read())


def exchange(gateway: Gateway, raw: bytes, answers: int = 1, method: str = "POST") -> list[Answer]:
    """Send ``raw`` byte-exact on one connection and read up to ``answers`` responses."""
    with connect(gateway) as sock:
        try:
            sock.sendall(raw)
        except (ConnectionError, ssl.SSLError):
            pass  # refused mid-send: the answer, if any, is already on its way
        out = []
        for _ in range(answers):
            out.append(read_answer(sock, method))
            if out[-1].status is None:
                break
        return out


def request(target: bytes, *, method: bytes = b"POST", body: bytes = b"\x08\x07",
            headers: list[bytes] | None = None, version: bytes = b"HTTP/1.1", port: int = 0) -> bytes:
    """A request as Flower's SuperNode sends it, with the given parts replaced."""
    if headers is None:
        headers = [b"Host: 127.0.0.1:%d" % port, b"Content-Type: application/protobuf",
                   b"Accept: application/protobuf", b"Content-Length: %d" % len(body)]
    return method + b" " + target + b" " + version + b"\r\n" + b"".join(h + b"\r\n" for h in headers) + b"\r\n" + body


CONTROL = b"/control/list-runs"
#: request targets a SuperNode never sends: path confusion aimed at the Control API, and any
#: other spelling of a Fleet endpoint
ATTACK_TARGETS = [
    b"/v1/fleet/.." + CONTROL, b"/v1/fleet/%2e%2e" + CONTROL, b"/v1/fleet/%2E%2E" + CONTROL,
    b"/v1/fleet/.%2e" + CONTROL, b"/v1/fleet/%2e." + CONTROL, b"/v1/fleet/%2e%2e/%2e%2e/v1" + CONTROL,
    b"/v1/fleet%2f..%2fcontrol%2flist-runs", b"/v1/fleet/..%2fcontrol/list-runs", b"/v1/fleet/..%2F..%2Fv1" + CONTROL,
    b"/v1/fleet/..%5ccontrol/list-runs", b"/v1/fleet/..\\control/list-runs", b"/v1/fleet\\..\\control\\list-runs",
    b"//v1/fleet/get-fab", b"/v1/fleet//get-fab", b"/v1//fleet/get-fab", b"/v1/fleet/.//..//control/list-runs",
    b"/v1/fleet/./get-fab", b"/v1/./fleet/get-fab", b"/./v1/fleet/get-fab",
    b"/v1/fleet/get-fab;x=1", b"/v1/fleet/..;/control/list-runs", b"/v1/fleet;/../control/list-runs",
    b"/v1/fleet/get-fab%00", b"/v1/fleet/%00/../control/list-runs", b"/v1/fleet/%u002e%u002e" + CONTROL,
    b"/v1/fleet/%c0%ae%c0%ae" + CONTROL, b"/v1/fleet/%252e%252e" + CONTROL, b"/v1/fleet/%25%32%65%25%32%65" + CONTROL,
    b"/v1/fleet/get%2dfab", b"/v1/fleet/get-fa%62", b"/v1/fleet/create-node/..", b"/v1/fleet/get-fab/..",
    b"/v1/fleet/x/../get-fab", b"/v1/fleet/get-fab/", b"/v1/fleet/", b"/v1/fleet", b"/", b"/V1/FLEET/GET-FAB",
    b"/v1/fleet/Get-Fab", b"/v1/fleet/get-fab?", b"/v1/fleet/get-fab?x=1", b"/v1/fleet/../control/list-runs?",
    b"/v1/fleet/get-fab#x", b"/v1/fleet/register-node", b"/v1/fleet/unregister-node", b"/v1" + CONTROL,
    b"/v1/control/start-run", b"/docs", b"/openapi.json", b"*", b"127.0.0.1:9091",
    b"https://127.0.0.1:9091/v1/fleet/get-fab", b"http://127.0.0.1/v1/fleet/../control/list-runs",
    b"/v1/fleet/get-fab\x00", b"/v1/fleet/get-fab\xc0\xae",
]
METHODS = [b"GET", b"PUT", b"DELETE", b"PATCH", b"OPTIONS", b"CONNECT", b"TRACE", b"HEAD", b"post", b"PROPFIND"]


def _head(answer: Answer) -> str:
    return f"{answer.status} {answer.body[:120]!r}"


def refused(gateway: Gateway, upstream: RecordingSuperLink, raw: bytes, answers: int = 1) -> list[Answer]:
    """Send an attack; nothing may reach the SuperLink (every answer came after the gateway's decision)."""
    before = len(upstream.received)
    out = exchange(gateway, raw, answers)
    assert upstream.received[before:] == [], (raw[:200], [_head(a) for a in out])
    return out


def test_every_fleet_endpoint_arrives_byte_identical(federation):
    gateway, upstream, pki = federation
    for target in FLEET_ENDPOINTS:
        body = b"\x08\x2a" + target  # any bytes: the gateway does not parse requests
        before = len(upstream.received)
        [answer] = exchange(gateway, request(target, body=body, port=gateway.port))
        assert answer.status == 200, (target, _head(answer))
        [received] = upstream.received[before:]
        assert received.request_line == b"POST " + target + b" HTTP/1.1" and received.body == body
        assert answer.headers["content-type"] == "application/protobuf"
        if target != b"/v1/fleet/get-fab":
            assert answer.body == b"answer to " + target


def test_a_fab_leaves_with_the_federations_signatures_only(federation):
    gateway, upstream, pki = federation
    [answer] = exchange(gateway, request(b"/v1/fleet/get-fab", port=gateway.port))
    response = GetFabResponse()
    response.ParseFromString(answer.body)
    assert response.fab.content == SIGNED_FAB
    assert dict(response.fab.verifications) == verifications(pki / "signatures", fab_hash(SIGNED_FAB))


def test_only_flowers_own_headers_reach_the_superlink(federation):
    gateway, upstream, _ = federation
    flower = [b"flwr-public-key: cGs=", b"flwr-signature: c2ln", b"flwr-timestamp: 2026-01-01T00:00:00+00:00",
              b"flwr-package-name: flwr", b"flwr-package-version: 1.42.0", b"flwr-component-name: SuperNode"]
    extra = [b"X-Forwarded-For: 127.0.0.1", b"X-Original-URL: /v1/control/list-runs", b"Authorization: Bearer x",
             b"Cookie: a=b", b"flwr-task-token: t", b"Connection: keep-alive, flwr-public-key"]
    head = [b"Host: 127.0.0.1", b"Content-Type: application/protobuf", b"Accept: application/protobuf",
            b"Content-Length: 2"]
    before = len(upstream.received)
    [answer] = exchange(gateway, request(b"/v1/fleet/get-run", headers=head + flower + extra))
    assert answer.status == 200, _head(answer)
    [received] = upstream.received[before:]
    names = {name.lower() for name, _ in received.headers}
    assert {"flwr-public-key", "flwr-signature", "flwr-timestamp", "flwr-package-name", "flwr-package-version",
            "flwr-component-name", "content-type", "accept"} <= names
    assert not names & {"x-forwarded-for", "x-original-url", "authorization", "cookie", "flwr-task-token"}


@pytest.mark.parametrize("target", ATTACK_TARGETS, ids=lambda t: t.decode("latin-1"))
def test_a_target_a_supernode_never_sends_is_refused(federation, target):
    gateway, upstream, _ = federation
    [answer] = refused(gateway, upstream, request(target, port=gateway.port))
    malformed = b"\x00" in target or b"\xc0" in target  # not a request target at all
    assert answer.status == (400 if malformed else 404), _head(answer)


@pytest.mark.parametrize("method", METHODS, ids=bytes.decode)
def test_another_method_is_refused(federation, method):
    gateway, upstream, _ = federation
    [answer] = refused(gateway, upstream, request(b"/v1/fleet/get-fab", method=method, port=gateway.port))
    assert answer.status == 405 and answer.headers["allow"] == "POST", _head(answer)
    [answer] = refused(gateway, upstream, request(b"/v1/fleet/../control/list-runs", method=method, port=gateway.port))
    assert answer.status == 404, _head(answer)


LEGIT_HEAD = [b"Host: 127.0.0.1", b"Accept: application/protobuf"]
PROTOBUF_TYPE = b"Content-Type: application/protobuf"


class SuperNode:
    """A registered SuperNode's requests, signed as Flower's SuperNode signs them
    (``flwr.supernode.node_auth_http_interceptor``: its public key, a timestamp and its ECDSA
    signature over the timestamp), with the key ``pki/supernode-<i>``."""

    def __init__(self, pki: Path, index: int = 0) -> None:
        from cryptography.hazmat.primitives.serialization import load_ssh_private_key
        from flwr.supercore.primitives.asymmetric import public_key_to_bytes

        self.key = load_ssh_private_key((pki / f"supernode-{index}").read_bytes(), None)
        self.public = base64.b64encode(public_key_to_bytes(self.key.public_key()))

    def headers(self, forged: bool = False) -> list[bytes]:
        from flwr.supercore.date import now
        from flwr.supercore.primitives.asymmetric import sign_message

        stamp = now().isoformat().encode()
        signature = sign_message(self.key, b"another time" if forged else stamp)
        return [b"flwr-public-key: " + self.public, b"flwr-timestamp: " + stamp,
                b"flwr-signature: " + base64.b64encode(signature)]

    def request(self, target: bytes, body: bytes = b"\x08\x07", forged: bool = False) -> bytes:
        return request(target, body=body, headers=LEGIT_HEAD + [PROTOBUF_TYPE, b"Content-Length: %d" % len(body)]
                       + self.headers(forged))

    def joined(self, gateway: Gateway) -> "SuperNode":
        """After a heartbeat the SuperLink answered 200: the gateway knows the node's key."""
        [answer] = exchange(gateway, self.request(b"/v1/fleet/send-node-heartbeat"))
        assert answer.status == 200, _head(answer)
        return self
SMUGGLED = b"0\r\n\r\n" + request(b"/v1" + CONTROL)
#: requests to a Fleet endpoint framed unlike Flower's, and the answer each gets
FRAMING_ATTACKS = {
    "HTTP/1.0": (request(b"/v1/fleet/get-fab", version=b"HTTP/1.0"), 400),
    "HTTP/0.9": (b"POST /v1/fleet/get-fab\r\n\r\n", 400),
    "HTTP/2 preface": (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 400),
    "no content type": (request(b"/v1/fleet/get-run", headers=LEGIT_HEAD + [b"Content-Length: 2"]), 415),
    "json": (request(b"/v1/fleet/get-run", headers=LEGIT_HEAD + [b"Content-Type: application/json",
                                                                b"Content-Length: 2"]), 415),
    "form": (request(b"/v1/fleet/get-run", headers=LEGIT_HEAD + [b"Content-Type: application/x-www-form-urlencoded",
                                                                b"Content-Length: 2"]), 415),
    "protobuf with parameters": (request(b"/v1/fleet/get-run", headers=LEGIT_HEAD + [
        b"Content-Type: application/protobuf; charset=x", b"Content-Length: 2"]), 415),
    "two content types": (request(b"/v1/fleet/get-run", headers=LEGIT_HEAD + [
        PROTOBUF_TYPE, b"Content-Type: text/plain", b"Content-Length: 2"]), 415),
    "no content length": (request(b"/v1/fleet/get-run", body=b"", headers=LEGIT_HEAD + [PROTOBUF_TYPE]), 411),
    "chunked": (request(b"/v1/fleet/get-run", body=b"2\r\n\x08\x07\r\n0\r\n\r\n", headers=LEGIT_HEAD + [
        PROTOBUF_TYPE, b"Transfer-Encoding: chunked"]), 411),
    "two content lengths": (request(b"/v1/fleet/get-run", headers=LEGIT_HEAD + [
        PROTOBUF_TYPE, b"Content-Length: 2", b"Content-Length: 40"]), 400),
    "CL.TE smuggling": (request(b"/v1/fleet/get-run", body=SMUGGLED, headers=LEGIT_HEAD + [
        PROTOBUF_TYPE, b"Content-Length: %d" % len(SMUGGLED), b"Transfer-Encoding: chunked"]), 411),
    "TE.CL smuggling": (request(b"/v1/fleet/get-run", body=b"5\r\n\x08\x07xyz\r\n0\r\n\r\n", headers=LEGIT_HEAD + [
        PROTOBUF_TYPE, b"Transfer-Encoding: chunked", b"Content-Length: 3"]), 411),
    "obfuscated TE": (request(b"/v1/fleet/get-run", body=b"0\r\n\r\n", headers=LEGIT_HEAD + [
        PROTOBUF_TYPE, b"Transfer-Encoding : chunked", b"Content-Length: 5"]), 400),
    "TE list": (request(b"/v1/fleet/get-run", body=b"0\r\n\r\n", headers=LEGIT_HEAD + [
        PROTOBUF_TYPE, b"Transfer-Encoding: chunked, identity"]), 400),
    "negative length": (request(b"/v1/fleet/get-run", headers=LEGIT_HEAD + [
        PROTOBUF_TYPE, b"Content-Length: -2"]), 400),
    "huge header": (request(b"/v1/fleet/get-run", headers=LEGIT_HEAD + [
        PROTOBUF_TYPE, b"Content-Length: 2", b"X-Pad: " + b"a" * 200_000]), 431),
    "many headers": (request(b"/v1/fleet/get-run", headers=LEGIT_HEAD + [
        PROTOBUF_TYPE, b"Content-Length: 2"] + [b"X-%d: a" % i for i in range(5000)]), 431),
    "a Flower header twice": (request(b"/v1/fleet/get-run", headers=LEGIT_HEAD + [
        PROTOBUF_TYPE, b"Content-Length: 2", b"flwr-public-key: YQ==", b"flwr-public-key: Yg=="]), 400),
    "no host": (request(b"/v1/fleet/get-run", headers=[PROTOBUF_TYPE, b"Content-Length: 2"]), 400),
    "bare LF": (b"POST /v1/fleet/../control/list-runs HTTP/1.1\nHost: x\nContent-Length: 0\n\n", 404),
    "space in target": (b"POST /v1/fleet/get-fab /../control/list-runs HTTP/1.1\r\nHost: x\r\n\r\n", 400),
    "tab in target": (b"POST /v1/fleet/..\t/control/list-runs HTTP/1.1\r\nHost: x\r\n\r\n", 400),
    "not HTTP": (b"\x16\x03\x01\x00\xa5garbage\r\n\r\n", 400),
}


@pytest.mark.parametrize("name", FRAMING_ATTACKS)
def test_a_request_framed_unlike_flowers_is_refused(federation, name):
    gateway, upstream, _ = federation
    raw, status = FRAMING_ATTACKS[name]
    [answer] = refused(gateway, upstream, raw)
    assert answer.status == status, (name, _head(answer))


def test_a_folded_header_is_unfolded_and_only_flowers_headers_pass(federation):
    """obs-fold (a header line continued on the next): h11 joins the lines; the result is one header
    value like any other (here one the gateway does not forward)."""
    gateway, upstream, _ = federation
    raw = request(b"/v1/fleet/get-run", headers=LEGIT_HEAD + [PROTOBUF_TYPE, b"Content-Length: 2", b"X-A: a",
                                                              b" Content-Length: 40"])
    [answer] = exchange(gateway, raw)
    assert answer.status == 200 and upstream.received[-1].body == b"\x08\x07", _head(answer)
    assert "x-a" not in {name.lower() for name, _ in upstream.received[-1].headers}


def test_a_request_smuggled_behind_a_legitimate_one_is_refused(federation):
    """Content-Length shorter than what follows: the rest is a second request on the connection,
    refused like any other; the first arrives with exactly its declared body."""
    gateway, upstream, _ = federation
    smuggled = request(b"/v1/fleet/../control/list-runs", port=gateway.port)
    raw = request(b"/v1/fleet/get-run", body=b"\x08\x07" + smuggled, port=gateway.port).replace(
        b"Content-Length: %d" % (len(smuggled) + 2), b"Content-Length: 2")
    before = len(upstream.received)
    first, second = exchange(gateway, raw, answers=2)
    assert first.status == 200 and second.status == 404, (_head(first), _head(second))
    [received] = upstream.received[before:]
    assert received.request_line == b"POST /v1/fleet/get-run HTTP/1.1" and received.body == b"\x08\x07"


def test_a_body_shorter_than_announced_reaches_nothing(federation):
    """The client announces 100 bytes, sends 10 and hangs up: nothing is forwarded."""
    gateway, upstream, _ = federation
    raw = request(b"/v1/fleet/get-run", body=b"\x08" * 10, port=gateway.port).replace(
        b"Content-Length: 10", b"Content-Length: 100")
    before = len(upstream.received)
    with connect(gateway) as sock:
        sock.sendall(raw)
    assert exchange(gateway, request(b"/v1/fleet/get-run", port=gateway.port))[0].status == 200
    assert [r.request_line for r in upstream.received[before:]] == [b"POST /v1/fleet/get-run HTTP/1.1"]


def test_an_oversized_body_is_refused_before_it_is_sent(federation):
    """413 on the announced length alone: 1.5 GiB announced to get-fab, 64 KiB sent, the answer is
    there while the client has sent almost nothing; each endpoint's limit + 1 byte likewise."""
    gateway, upstream, _ = federation
    head = request(b"/v1/fleet/get-fab", body=b"", port=gateway.port).replace(
        b"Content-Length: 0", b"Content-Length: %d" % (3 << 29))
    with connect(gateway) as sock:
        sock.sendall(head + b"\0" * 65536)
        answer = read_answer(sock)
    assert answer.status == 413, _head(answer)
    for target, endpoint in FLEET_ENDPOINTS.items():
        raw = request(target, body=b"", port=gateway.port).replace(
            b"Content-Length: 0", b"Content-Length: %d" % (endpoint.request_limit + 1))
        assert refused(gateway, upstream, raw)[0].status == 413, target
    chunked = request(b"/v1/fleet/push-object", body=b"", headers=LEGIT_HEAD + [
        b"Content-Type: application/protobuf", b"Transfer-Encoding: chunked"])
    [answer] = refused(gateway, upstream, chunked + b"40000000\r\n" + b"\0" * 65536)
    assert answer.status == 411, _head(answer)


def test_a_body_within_the_limit_arrives_whole(federation):
    gateway, upstream, pki = federation
    limit = FLEET_ENDPOINTS[b"/v1/fleet/push-object"].request_limit
    body = bytes(range(256)) * (limit // 256)
    node = SuperNode(pki).joined(gateway)
    before = len(upstream.received)
    [answer] = exchange(gateway, node.request(b"/v1/fleet/push-object", body=body))
    assert answer.status == 200, _head(answer)
    assert upstream.received[before].body == body


@pytest.fixture
def stoppable(tmp_path):
    pki = tmp_path / "pki"
    make_all(pki, 2)
    upstream = RecordingSuperLink(pki)
    upstream.start()
    gateway = start_gateway(tmp_path, pki, upstream.port)
    yield gateway, upstream
    gateway.proc.kill()
    gateway.proc.wait()
    upstream.stop()


def test_a_superlink_away_is_answered_so_that_supernodes_retry_and_back_is_reached_again(stoppable):
    """Flower's SuperNode retries 502/503/504 and gives up on any other error status: with the
    SuperLink gone the gateway answers one of those; once the SuperLink is back (on a new
    connection: the kept-alive one died with it) requests reach it again."""
    from flwr.supercore.retry.http_retry import _RETRYABLE_STATUS_CODES

    gateway, upstream = stoppable
    get_run = request(b"/v1/fleet/get-run", port=gateway.port)
    assert exchange(gateway, get_run)[0].status == 200
    upstream.stop()
    with connect(gateway) as sock:  # one client connection across the outage, as a SuperNode's pool keeps it
        for _ in range(2):
            sock.sendall(get_run)
            answer = read_answer(sock)
            assert answer.status in _RETRYABLE_STATUS_CODES, _head(answer)
        upstream.start()
        sock.sendall(get_run)
        assert read_answer(sock).status == 200
    upstream.stop()  # the SuperLink restarts between two requests: the gateway's kept-alive connection is dead
    upstream.start()
    assert exchange(gateway, get_run)[0].status == 200
    upstream.status = 503
    assert exchange(gateway, get_run)[0].status == 503  # the SuperLink's own answers pass unchanged
    log = gateway.log.read_text()
    assert "Traceback" not in log and log.count("SuperLink") >= 2, log


def test_a_superlink_answer_over_the_endpoints_limit_or_an_unreadable_fab_is_a_bad_gateway(stoppable):
    gateway, upstream = stoppable
    upstream.body = b"x" * (FLEET_ENDPOINTS[b"/v1/fleet/send-node-heartbeat"].response_limit + 1)
    assert exchange(gateway, request(b"/v1/fleet/send-node-heartbeat", port=gateway.port))[0].status == 502
    upstream.body = b"\xff\xff not a GetFabResponse"
    assert exchange(gateway, request(b"/v1/fleet/get-fab", port=gateway.port))[0].status == 502


def _closed_by_peer(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except (ConnectionError, ssl.SSLError):
        return True


@pytest.mark.integration
def test_slow_and_surplus_connections_are_closed_and_the_log_stays_short(stoppable):
    """More TLS connections than the gateway takes, from more addresses than it takes at once, and
    TCP connections that never start TLS, all silent: the gateway holds no more than its slots (a
    newcomer takes the slot of the largest holder's oldest), each is closed when its TLS handshake
    or request head is late or its slot taken; then a SuperNode's request is served. Clients
    hanging up at any point leave no trace but budgeted one-line notes: never a traceback."""
    gateway, upstream = stoppable
    started, files = time.monotonic(), _gateway_files(gateway)
    addresses = MAX_CONNECTIONS // MAX_CLIENT_CONNECTIONS + 2
    with connect(gateway, ATTACKER) as slow:  # TLS done, half a request head, then nothing
        slow.sendall(b"POST /v1/fleet/get-run HTTP/1.1\r\nHost: x\r\n")
        tried = [try_connect(gateway, attacker(i % addresses)) for i in range(MAX_CONNECTIONS + 40)]
        held = [sock for sock in tried if sock is not None]
        held += [tcp(gateway, attacker(i % addresses)) for i in range(40)]
        try:
            # a connection whose slot was taken is closed once the gateway's loop comes round to it
            wait_until(lambda: _gateway_files(gateway) <= files + MAX_CONNECTIONS + 4, "the gateway to hold its slots")
            assert all(_closed_by_peer(sock) for sock in held)
        finally:
            for sock in held:
                sock.close()
        assert read_answer(slow).status is None
    bursts = MAX_CONNECTIONS // MAX_CLIENT_CONNECTIONS - 1  # addresses: never all the slots
    for i in range(300):  # clients that hang up mid-handshake, mid-head, mid-body
        with tcp(gateway, attacker(i % bursts)) as sock:
            try:
                sock.sendall(b"\x16\x03\x01\x02\x00\x01")
            except ConnectionError:
                pass  # closed before TLS: its address is at its limit for the moment
    for cut in (20, 200):
        for i in range(50):
            sock = try_connect(gateway, attacker(i % bursts))
            if sock is not None:
                with sock:
                    sock.sendall(request(b"/v1/fleet/push-object", body=b"\0" * 400, port=gateway.port)[:cut])
    assert exchange(gateway, request(b"/v1/fleet/get-run", port=gateway.port))[0].status == 200
    windows = (time.monotonic() - started) // LOG_WINDOW_S + 1
    lines = gateway.log.read_text().splitlines()
    assert "Traceback" not in gateway.log.read_text()
    assert len(lines) <= 1 + windows * (LOG_LINES + 1), lines


PUSH_OBJECT, PUSH_MESSAGES, GET_RUN = b"/v1/fleet/push-object", b"/v1/fleet/push-messages", b"/v1/fleet/get-run"


def _head_only(target: bytes, length: int) -> bytes:
    """A request head announcing a ``length``-byte body, none of which is sent."""
    return request(target, body=b"", headers=LEGIT_HEAD + [PROTOBUF_TYPE, b"Content-Length: %d" % length])


def _push_full_object(gateway: Gateway) -> Answer:
    """A registered SuperNode (at 127.0.0.1) pushing an object of the largest size it sends."""
    body = b"\x07" * FLEET_ENDPOINTS[PUSH_OBJECT].request_limit
    [answer] = exchange(gateway, SuperNode(gateway.pki).request(PUSH_OBJECT, body=body))
    return answer


def _hold_body(gateway: Gateway, source: str) -> ssl.SSLSocket | None:
    """The body-holding attack on one connection from ``source``: a head announcing the largest
    push-object, then all of its body but the last byte at once (None: closed before TLS)."""
    sock = try_connect(gateway, source)
    if sock is not None:
        limit = FLEET_ENDPOINTS[PUSH_OBJECT].request_limit
        try:
            sock.sendall(_head_only(PUSH_OBJECT, limit) + b"\0" * (limit - 1))
        except (ConnectionError, ssl.SSLError, OSError):
            pass  # refused mid-body
    return sock


#: the options ``deploy local`` starts its gateway with for three SuperNodes on 127.0.0.1
LOCAL_FEDERATION = ("--nodes", "3", "--shared-address", "127.0.0.1=3")


@pytest.mark.integration
def test_strangers_holding_bodies_stall_no_supernode(tmp_path):
    """Bodies held from two addresses against a local federation's gateway (127.0.0.1 shared by
    its three SuperNodes), as many connections as each address may open: a head announcing the
    largest push-object, all of the body but its last byte at once (eight addresses against a whole
    deployed run: ``test_deployment.py`` under ``-m slow`` and ``benchmarks/gateway_attack.py``). A
    body over 16 KiB is a registered SuperNode's alone: each is answered 503 with no counter in it
    and holds nothing; a SuperNode's heartbeat and its largest push are answered 200 meanwhile
    (unless stopped, two of these addresses held the 64 MiB budget, every SuperNode request was
    answered 503, and the run failed)."""
    pki = tmp_path / "pki"
    make_all(pki, 1)
    upstream = RecordingSuperLink(pki)
    upstream.start()
    gateway = start_gateway(tmp_path, pki, upstream.port, *LOCAL_FEDERATION)
    try:
        node = SuperNode(gateway.pki).joined(gateway)
        with ThreadPoolExecutor(32) as pool:
            tried = list(pool.map(lambda i: _hold_body(gateway, attacker(i % 2)), range(2 * MAX_CLIENT_CONNECTIONS)))
        held = [sock for sock in tried if sock is not None]
        try:
            assert exchange(gateway, node.request(b"/v1/fleet/send-node-heartbeat"))[0].status == 200
            assert _push_full_object(gateway).status == 200
            answers = [read_answer(sock) for sock in held]
        finally:
            for sock in held:
                sock.close()
    finally:
        gateway.proc.kill()
        gateway.proc.wait()
        upstream.stop()
    assert {a.status for a in answers} <= {503, None}, {a.status for a in answers}
    assert {a.body for a in answers} <= {b"503 Service Unavailable: busy; try again\n", b""}
    assert {dict(r.headers).get("flwr-public-key") for r in upstream.received} == {node.public.decode()}


@pytest.mark.integration
def test_a_stranger_gets_neither_a_registered_nodes_body_budget_nor_the_superlinks_details(stoppable):
    """A stranger sending a registered node's public key with a signature of its own making, or its
    own key pair the SuperLink answers 401: its larger bodies are answered 503 unread. The
    SuperLink's JSON error details go to a registered SuperNode; a stranger, with no key, its own,
    or a copied one, gets the status and its phrase (they said what the SuperLink parsed)."""
    gateway, upstream = stoppable
    node = SuperNode(gateway.pki).joined(gateway)
    upstream.registered = {node.public.decode()}
    stranger = SuperNode(gateway.pki, 1)
    assert exchange(gateway, stranger.request(b"/v1/fleet/send-node-heartbeat"))[0].status == 401
    body = b"\x07" * (SMALL + 1)
    before = len(upstream.received)
    for raw in (node.request(PUSH_OBJECT, body, forged=True), stranger.request(PUSH_OBJECT, body)):
        assert exchange(gateway, raw)[0].status == 503
    assert upstream.received[before:] == []
    assert exchange(gateway, node.request(PUSH_OBJECT, body))[0].status == 200
    detail = b'{"code":2004,"detail":"Failed to activate SuperNode."}'
    for raw in (request(GET_RUN, port=gateway.port), stranger.request(GET_RUN), node.request(GET_RUN, forged=True)):
        [answer] = exchange(gateway, raw)
        assert (answer.status, answer.body) == (401, b"401 Unauthorized\n"), _head(answer)
    upstream.status, upstream.body = 412, detail
    [answer] = exchange(gateway, node.request(b"/v1/fleet/activate-node"))
    assert (answer.status, answer.body) == (412, detail), _head(answer)


def test_a_body_stalling_after_a_burst_holds_its_budget_no_longer_than_a_pause():
    """The deadline of a body is set once by its announced length, and a pause of BODY_STALL_S ends
    it: the largest push-object sent but for its last byte at once is cut off BODY_STALL_S later,
    not after the seconds its received bytes would buy at the least rate."""
    from deploy.gateway import BODY_GRACE_S, BODY_STALL_S, MIN_BODY_RATE, body_deadline

    limit = FLEET_ENDPOINTS[PUSH_OBJECT].request_limit
    assert body_deadline(0.0, 0.0, limit) == BODY_STALL_S  # a head and nothing else
    assert body_deadline(0.0, 0.1, limit) == 0.1 + BODY_STALL_S < BODY_GRACE_S + (limit - 1) / MIN_BODY_RATE
    whole = BODY_GRACE_S + limit / MIN_BODY_RATE
    assert body_deadline(0.0, whole - 1, limit) == whole  # a steady trickle: the whole body's time, no more


@pytest.mark.integration
def test_one_address_holding_connections_leaves_the_rest_to_others(stoppable):
    """MAX_CONNECTIONS connections from one address, each with a complete request head and its body
    held back: the address gets MAX_CLIENT_CONNECTIONS of them (the rest are closed before TLS), a
    SuperNode at another address is served, the held ones are cut off unanswered."""
    gateway, _ = stoppable
    tried = [try_connect(gateway, ATTACKER) for _ in range(MAX_CONNECTIONS)]
    held = [sock for sock in tried if sock is not None]
    try:
        assert len(held) == MAX_CLIENT_CONNECTIONS
        for sock in held:
            sock.sendall(_head_only(GET_RUN, FLEET_ENDPOINTS[GET_RUN].request_limit))
        assert exchange(gateway, request(GET_RUN, port=gateway.port))[0].status == 200
        assert [read_answer(sock).status for sock in held] == [None] * len(held)
    finally:
        for sock in held:
            sock.close()


def _gateway_files(gateway: Gateway) -> int:
    return len(os.listdir(f"/proc/{gateway.proc.pid}/fd"))


def _gateway_memory(gateway: Gateway) -> int:
    """The gateway process's resident memory, bytes."""
    status = Path(f"/proc/{gateway.proc.pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmRSS:")).split()[1]) * 1024


def _served(gateway: Gateway) -> bool:
    """A SuperNode's request (from 127.0.0.1) is answered 200."""
    try:
        return exchange(gateway, request(GET_RUN, port=gateway.port))[0].status == 200
    except (ConnectionError, ssl.SSLError):
        return False  # closed before TLS: every slot taken


@pytest.mark.integration
def test_tcp_connections_without_tls_take_slots_and_bounded_memory(stoppable):
    """TCP connections that never start TLS. 500 from one address take MAX_CLIENT_CONNECTIONS slots
    and a SuperNode at another address is served. 200 from many addresses, eight times over, take
    at most MAX_CONNECTIONS: the gateway's open files stay bounded by its slots, and its memory by
    what they hold (a TLS connection holds asyncio's 256 KiB buffer; a closed one's is freed, not
    left to pile up); once they go, a SuperNode is served again."""
    gateway, _ = stoppable
    assert _served(gateway)  # the SuperLink connection is open
    files, memory = _gateway_files(gateway), _gateway_memory(gateway)
    slack = 4  # the SuperNode's connection still closing, a second SuperLink connection
    silent = [tcp(gateway, ATTACKER) for _ in range(500)]
    try:
        assert _served(gateway)
        assert _gateway_files(gateway) <= files + MAX_CLIENT_CONNECTIONS + slack
    finally:
        for sock in silent:
            sock.close()
    addresses = 2 * MAX_CONNECTIONS // MAX_CLIENT_CONNECTIONS
    for _ in range(8):
        silent = [tcp(gateway, attacker(1 + i % addresses)) for i in range(200)]
        try:
            probe = try_connect(gateway, attacker(1 + addresses))  # accepted after all the others
            if probe is not None:
                probe.close()
            assert _gateway_files(gateway) <= files + MAX_CONNECTIONS + slack
        finally:
            for sock in silent:
                sock.close()
        wait_until(lambda: _served(gateway), "a SuperNode to be served again")
    assert _gateway_memory(gateway) - memory <= MAX_CONNECTIONS * 1024 * 1024


def test_client_text_in_the_log_is_escaped_and_cut_short(stoppable):
    """A 15 KB header line of control bytes: h11 quotes it in its error, the log line is one line of
    at most LOG_LINE_CHARS after the timestamp."""
    gateway, _ = stoppable
    raw = request(GET_RUN, headers=LEGIT_HEAD + [PROTOBUF_TYPE, b"Content-Length: 2", b"\x01" * 15000])
    assert exchange(gateway, raw)[0].status == 400
    wait_until(lambda: "malformed request" in gateway.log.read_text(), "the refusal to be noted")
    lines = gateway.log.read_text().splitlines()
    assert all(len(line) <= len("2026-01-01 00:00:00,000 ") + LOG_LINE_CHARS for line in lines), lines


def test_the_log_budget_keeps_a_burst_to_its_lines_and_counts_the_rest(caplog):
    now = [0.0]
    note = LogBudget(lines=3, window_s=60.0, clock=lambda: now[0])
    with caplog.at_level("WARNING", logger="deploy.gateway"):
        for i in range(10):
            note(f"refused {i}")
        now[0] = 61.0
        note("refused later")
    assert [r.getMessage() for r in caplog.records] == ["refused 0", "refused 1", "refused 2",
                                                        "7 more lines left out in 61 s", "refused later"]


def test_a_log_line_is_one_printable_line_of_bounded_length(caplog):
    note = LogBudget()
    with caplog.at_level("WARNING", logger="deploy.gateway"):
        note("from the client: a\nb\x1b[2J\u2028c")
        note("x" * 100_000)
    first, second = [r.getMessage() for r in caplog.records]
    assert first == "from the client: a\\nb\\x1b[2J\\u2028c"
    assert len(second) == LOG_LINE_CHARS and second.endswith("...")


@pytest.mark.deployment
@pytest.mark.slow
def test_a_supernode_behind_the_gateway_reconnects_to_a_restarted_superlink(tmp_path):
    """A real SuperLink (its state in the federation's database file, so that it knows the node
    again after a restart), the gateway and one authenticated SuperNode: the SuperLink is killed
    and started again on the same port; the SuperNode, answered 502 meanwhile, keeps retrying and
    reconnects."""
    from deploy.federation import LocalFederation

    pki = tmp_path / "pki"
    make_all(pki, 1)
    with LocalFederation(tmp_path / "fed", pki, state_file=True) as federation:
        federation.start_superlink()
        federation.start_gateway(pki / "signatures")
        federation.start_configured_nodes(["partition-id=0"])
        federation.wait_until_ready(["supernode-0"])
        federation.kill("superlink")
        wait_until(lambda: "Connection attempt failed, retrying" in federation.log("supernode-0"),
                   "the SuperNode to retry")
        federation.start_superlink()
        wait_until(lambda: "Connection successful after" in federation.log("supernode-0")
                   or "supernode-0" in federation.ended(), "the SuperNode to reconnect")
        log = federation.log("supernode-0")
        assert "supernode-0" not in federation.ended(), log[-3000:]
    assert "Giving up reconnection" not in log, log[-3000:]
    assert "Traceback" not in federation.log("gateway")


def test_a_shared_address_lifts_its_own_connection_limit_and_no_other():
    """``--shared-address 127.0.0.1=4`` (four SuperNodes on one machine): that address may hold four
    times one's unanswered connections, any other address one's; registered nodes' bodies are
    budgeted for ``--nodes`` of them."""
    from deploy.gateway_limits import Slots

    limits = federation_limits(4, ["127.0.0.1=4"])
    assert limits == {"body_budget": 4 * CLIENT_BODY_BUDGET, "shared": {"127.0.0.1": 4}}
    slots = Slots(MAX_CONNECTIONS, MAX_CLIENT_CONNECTIONS, limits["shared"])
    assert (slots.limit("127.0.0.1"), slots.limit(ATTACKER)) == (4 * MAX_CLIENT_CONNECTIONS, MAX_CLIENT_CONNECTIONS)
    assert federation_limits(1)["body_budget"] == BODY_BUDGET
    for bad in (["127.0.0.1"], ["127.0.0.1=0"], ["=2"], [f"127.0.0.1={MAX_CONNECTIONS // MAX_CLIENT_CONNECTIONS + 1}"]):
        with pytest.raises(SystemExit, match="--shared-address .*; valid: ADDRESS=N, N from 1 to 8"):
            federation_limits(1, bad)
    with pytest.raises(SystemExit, match="--nodes 0; valid: 1 to"):
        federation_limits(0)


def test_addresses_filling_every_slot_give_one_up_to_a_newcomer_and_never_a_proven_one():
    """Eight addresses holding sixteen connections each (every slot): a newcomer from another address
    takes the oldest of the first largest holder's; an address as full as the others gets none, nor
    does one one short of the largest. A proven connection (a 200 answered on it) counts against
    no address and is never taken."""
    from deploy.gateway_limits import Slots

    slots, cut = Slots(MAX_CONNECTIONS, MAX_CLIENT_CONNECTIONS), []
    held = {a: [slots.take(attacker(a), lambda a=a, i=i: cut.append((a, i)))[0] for i in range(16)] for a in range(8)}
    assert slots.held == MAX_CONNECTIONS
    node, why = slots.take("127.0.0.1", lambda: cut.append("node"))
    assert node is not None and cut == [(0, 0)]
    assert slots.take(attacker(0), lambda: None) == (None, f"{MAX_CONNECTIONS} connections held (at most 128)")
    slots.prove(node)
    assert "127.0.0.1" not in slots.unproven and slots.held == MAX_CONNECTIONS
    for _ in range(200):  # newcomers from a ninth address: each takes one more from the largest holders
        slots.take(attacker(8), lambda: None)
    assert "node" not in cut and node.held
    assert max(len(v) for v in slots.unproven.values()) - min(len(v) for v in slots.unproven.values()) <= 1
    assert held[0][0].held is False


@pytest.mark.integration
def test_eight_addresses_holding_every_connection_leave_a_supernode_served(stoppable):
    """Eight addresses open sixteen TLS connections each and send nothing: every slot is held. A
    SuperNode connecting then takes the slot of one of them and is served (unless stopped, it was
    closed before TLS until their heads were late, 10 s, again and again)."""
    gateway, _ = stoppable
    with ThreadPoolExecutor(32) as pool:
        tried = list(pool.map(lambda i: try_connect(gateway, attacker(i % 8)), range(MAX_CONNECTIONS)))
    held = [sock for sock in tried if sock is not None]
    try:
        assert len(held) == MAX_CONNECTIONS
        assert _served(gateway)
    finally:
        for sock in held:
            sock.close()


def test_an_address_starts_a_burst_of_handshakes_then_four_a_second():
    """Addresses reconnecting as soon as they are answered: each gets its connection limit's worth at
    once, then HANDSHAKES_PER_S a second; a shared address N times that; the others' are untouched."""
    from deploy.gateway_limits import HANDSHAKES_PER_S, Arrivals

    now = [0.0]
    arrivals = Arrivals(MAX_CLIENT_CONNECTIONS, shared={"127.0.0.1": 3}, clock=lambda: now[0])
    assert sum(arrivals.admit(ATTACKER) for _ in range(100)) == MAX_CLIENT_CONNECTIONS
    assert sum(arrivals.admit("127.0.0.1") for _ in range(100)) == 3 * MAX_CLIENT_CONNECTIONS
    now[0] = 10.0
    assert sum(arrivals.admit(ATTACKER) for _ in range(100)) == MAX_CLIENT_CONNECTIONS  # refilled, no more
    now[0] += 1.0
    assert sum(arrivals.admit(ATTACKER) for _ in range(100)) == HANDSHAKES_PER_S
    assert arrivals.admit(attacker(1))
