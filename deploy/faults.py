"""A fault-injecting proxy: latency, resets and failed answers between two hops.

``python -m deploy faults --listen HOST:PORT --upstream HOST:PORT [--reset 0.05]
[--fail 0.05] [--latency-ms 50] [--seed 0] [--cert C --key K --ca CA]``

Without TLS options it relays TCP: every chunk arrives :attr:`Faults.latency_s`
later in each direction (a delay, not a bandwidth limit), and a share
:attr:`Faults.reset_share` of the connections is reset (TCP RST, both sides) once
a random number of bytes (under :data:`RESET_WITHIN_BYTES`) has passed.

With TLS options it is an HTTP/1.1 hop (``h11``, like :mod:`deploy.gateway`): it
presents ``--cert`` (e.g. the gateway's certificate from :mod:`deploy.pki`, which
SuperNodes trust), checks the upstream's against ``--ca``, reads each request
whole and then, by the configured shares (each half of it one way):

- ``reset_share``: resets the connection before forwarding, or forwards and
  resets instead of answering (the upstream did the work; the client does not
  know);
- ``fail_share``: answers a 5xx (502, 503 or 500 in turn) without forwarding,
  or forwards and answers the 5xx instead of the upstream's answer;
- otherwise forwards and answers what the upstream answered.

Every injected fault is one log line naming it and the endpoint
(:data:`FAULT` starts it). Bounded: at most :data:`MAX_CONNECTIONS` connections
(more are closed at once), requests and answers up to :data:`MAX_BODY` bytes,
idle connections closed after :data:`IDLE_S`. :func:`serve` runs it in an event
loop, :func:`start` as a process.
"""

from __future__ import annotations

import asyncio
import logging
import random
import signal
import socket
import ssl
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path

import h11

#: the proxy's log line once it accepts connections
READY = "fault proxy: serving"
#: how every injected fault's log line starts
FAULT = "fault:"
MAX_CONNECTIONS = 256
MAX_HEAD_BYTES = 64 * 1024
#: largest request or answer body relayed in HTTP mode (a Flower object is at most ~21 MiB)
MAX_BODY = 64 * 1024 * 1024
#: a connection (client side, or upstream) idle this long is closed; upstream connections are
#: renewed after UPSTREAM_IDLE_S, before the upstream closes them (the gateway: after 10 s)
IDLE_S, UPSTREAM_IDLE_S = 60.0, 5.0
#: a connection chosen for a reset (TCP mode) is reset after a random number of bytes below this
RESET_WITHIN_BYTES = 64 * 1024
#: the statuses of injected failures, in turn
FAIL_STATUSES = (502, 503, 500)
#: response headers not passed on (hop by hop; the length is set anew)
_HOP_HEADERS = frozenset({b"connection", b"keep-alive", b"transfer-encoding", b"te", b"upgrade",
                          b"proxy-connection", b"content-length"})
_READ_SIZE = 64 * 1024

log = logging.getLogger("deploy.faults")


@dataclass(frozen=True)
class Faults:
    """What the proxy does to the traffic it relays."""

    reset_share: float = 0.0  # share of forwarded requests (HTTP mode) or connections (TCP mode) reset
    fail_share: float = 0.0  # HTTP mode: share answered with a 5xx, without forwarding or after it
    latency_s: float = 0.0  # added one way, each direction, per hop
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("reset_share", "fail_share"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name}={value!r}: valid: a share from 0 to 1")
        if self.reset_share + self.fail_share > 1.0:
            raise ValueError(f"reset_share + fail_share = {self.reset_share + self.fail_share:g}: valid: at most 1")
        if not 0.0 <= self.latency_s <= 60.0:
            raise ValueError(f"latency_s={self.latency_s!r}: valid: 0 to 60 seconds")


@dataclass(frozen=True)
class ProxyTLS:
    """TLS on both sides: ``cert`` / ``key`` presented to clients, the upstream checked against ``ca``."""

    cert: Path
    key: Path
    ca: Path

    def server(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(str(self.cert), str(self.key))
        return context

    def client(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca))


def host_port(address: str, what: str) -> tuple[str, int]:
    """``HOST:PORT`` as (host, port); ValueError naming ``what`` otherwise."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{what} {address!r} is not HOST:PORT (e.g. 127.0.0.1:9092)")
    return host.strip("[]"), int(port)


def _framed(conn: h11.Connection, head, body: bytes) -> bytes:
    """``head`` and ``body`` as ``conn`` sends them."""
    return conn.send(head) + conn.send(h11.Data(data=body)) + conn.send(h11.EndOfMessage())


def _phrase(status: int) -> bytes:
    try:
        return HTTPStatus(status).phrase.encode()
    except ValueError:
        return b""


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close the connection with a TCP RST (SO_LINGER 0), unsent data dropped."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    writer.transport.abort()


class Proxy:
    """The proxy's state: its faults, their random draws, its connection slots."""

    def __init__(self, upstream: tuple[str, int], faults: Faults, tls: ProxyTLS | None) -> None:
        self.upstream, self.faults, self.tls = upstream, faults, tls
        self.rng = random.Random(faults.seed)
        self.server_tls = tls.server() if tls else None
        self.client_tls = tls.client() if tls else None
        self.open, self.connections, self.failures = 0, 0, 0

    async def accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.open >= MAX_CONNECTIONS:
            writer.transport.abort()
            return
        self.open += 1
        self.connections += 1
        number = self.connections
        try:
            if self.tls is None:
                await self._relay(reader, writer, number)
            else:
                await self._serve_http(reader, writer, number)
        except (OSError, asyncio.IncompleteReadError, h11.ProtocolError, TimeoutError):
            pass  # a peer went away or timed out: the connection ends
        finally:
            self.open -= 1
            writer.transport.abort()

    # -- TCP mode -------------------------------------------------------------------------------
    async def _relay(self, reader, writer, number: int) -> None:
        up_reader, up_writer = await asyncio.wait_for(asyncio.open_connection(*self.upstream), IDLE_S)
        cut = self.rng.randrange(RESET_WITHIN_BYTES) if self.rng.random() < self.faults.reset_share else None
        passed = [0]

        def counted(size: int) -> bool:
            passed[0] += size
            return cut is not None and passed[0] >= cut

        tasks = [asyncio.ensure_future(self._pipe(reader, up_writer, counted)),
                 asyncio.ensure_future(self._pipe(up_reader, writer, counted))]
        try:
            for ended in asyncio.as_completed(tasks):  # one direction may end (EOF) before the other
                if await ended:
                    log.warning("%s reset TCP connection %d after %d bytes", FAULT, number, passed[0])
                    _reset(writer)
                    _reset(up_writer)
                    return
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            up_writer.transport.abort()

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, counted) -> bool:
        """Copy ``src`` to ``dst``, each chunk :attr:`Faults.latency_s` late; True: the connection
        is to be reset (``counted`` said so), False: ``src`` ended."""
        queue: asyncio.Queue = asyncio.Queue()
        sender = asyncio.ensure_future(self._deliver(queue, dst))
        try:
            while True:
                if sender.done():  # dst failed
                    return False
                chunk = await asyncio.wait_for(src.read(_READ_SIZE), IDLE_S)
                if not chunk:
                    await queue.put((0.0, b""))
                    await sender
                    return False
                await queue.put((time.monotonic() + self.faults.latency_s, chunk))
                if counted(len(chunk)):
                    return True
        finally:
            sender.cancel()

    @staticmethod
    async def _deliver(queue: asyncio.Queue, dst: asyncio.StreamWriter) -> None:
        while True:
            due, chunk = await queue.get()
            if not chunk:
                if dst.can_write_eof():
                    dst.write_eof()
                return
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            dst.write(chunk)
            await dst.drain()

    # -- HTTP mode ------------------------------------------------------------------------------
    async def _serve_http(self, reader, writer, number: int) -> None:
        # awaited directly, before any read: the transport must not read the ClientHello as plain data
        await writer.start_tls(self.server_tls, ssl_handshake_timeout=IDLE_S)
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
        upstream = _Upstream(self.upstream, self.client_tls)
        try:
            while True:
                request, body = await _read_message(conn, reader, h11.Request)
                if request is None:
                    return
                if not await self._answer(conn, writer, upstream, request, body, number):
                    return
                if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                    return
                conn.start_next_cycle()
        finally:
            upstream.close()

    def _draw(self) -> str:
        """The fault for the next request: one of 'reset-before', 'reset-after', 'fail-before',
        'fail-after', or 'none'."""
        draw, faults = self.rng.random(), self.faults
        if draw < faults.reset_share:
            return "reset-before" if draw < faults.reset_share / 2 else "reset-after"
        draw -= faults.reset_share
        if draw < faults.fail_share:
            return "fail-before" if draw < faults.fail_share / 2 else "fail-after"
        return "none"

    async def _answer(self, conn, writer, upstream: "_Upstream", request: h11.Request, body: bytes,
                      number: int) -> bool:
        """Forward one request (or not) and answer it (or not); False: the connection is over."""
        fault, endpoint = self._draw(), request.target.decode("latin-1")[:200]
        await asyncio.sleep(self.faults.latency_s)
        if fault == "reset-before":
            log.warning("%s reset before forwarding %s (connection %d)", FAULT, endpoint, number)
            _reset(writer)
            return False
        if fault != "fail-before":
            try:
                status, headers, payload = await upstream.exchange(request, body)
            except (OSError, TimeoutError, h11.ProtocolError) as err:  # not a fault of ours: a proxy's 502
                upstream.close()
                log.warning("upstream failed on %s (connection %d): %s: %s", endpoint, number, type(err).__name__, err)
                status, headers, payload = 502, [(b"content-type", b"text/plain")], b"502 upstream failed\n"
        if fault == "reset-after":
            log.warning("%s reset after forwarding %s, its answer %d dropped (connection %d)", FAULT, endpoint,
                        status, number)
            _reset(writer)
            return False
        if fault.startswith("fail"):
            status, self.failures = FAIL_STATUSES[self.failures % len(FAIL_STATUSES)], self.failures + 1
            how = "without forwarding it" if fault == "fail-before" else "after forwarding it, its answer dropped"
            log.warning("%s answered %d to %s %s (connection %d)", FAULT, status, endpoint, how, number)
            headers, payload = [(b"content-type", b"text/plain")], f"{status} injected by the fault proxy\n".encode()
        await asyncio.sleep(self.faults.latency_s)
        head = h11.Response(status_code=status, headers=[*headers, (b"content-length", str(len(payload)).encode())],
                            reason=_phrase(status))
        writer.write(_framed(conn, head, payload))
        await asyncio.wait_for(writer.drain(), IDLE_S)
        return True


async def _read_message(conn: h11.Connection, reader: asyncio.StreamReader, kind):
    """The next request or response (``kind``) on ``conn`` and its whole body, or (None, b"")
    when the peer closed between messages; bodies over :data:`MAX_BODY` end the connection."""
    head, body = None, bytearray()
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(await asyncio.wait_for(reader.read(_READ_SIZE), IDLE_S))
        elif isinstance(event, kind):
            head = event
        elif isinstance(event, h11.Data):
            body += event.data
            if len(body) > MAX_BODY:
                raise OSError(f"a body over {MAX_BODY} bytes")
        elif isinstance(event, h11.EndOfMessage):
            return head, bytes(body)
        elif isinstance(event, h11.ConnectionClosed) and head is None:
            return None, b""
        else:
            raise OSError(f"unexpected {type(event).__name__}")


class _Upstream:
    """One HTTP/1.1 connection to the upstream, opened when needed and renewed when it has been
    idle for :data:`UPSTREAM_IDLE_S` or closed."""

    def __init__(self, address: tuple[str, int], tls: ssl.SSLContext) -> None:
        self.address, self.tls = address, tls
        self.reader = self.writer = self.conn = None
        self.used = 0.0

    async def exchange(self, request: h11.Request, body: bytes) -> tuple[int, list, bytes]:
        """The upstream's answer (status, headers, body) to ``request`` with ``body``."""
        if self.writer is None or time.monotonic() - self.used > UPSTREAM_IDLE_S or self.conn.our_state is not h11.IDLE:
            await self._connect()
        head = h11.Request(method=request.method, target=request.target,
                           headers=[(n, v) for n, v in request.headers if n not in _HOP_HEADERS]
                           + [(b"content-length", str(len(body)).encode())])
        self.writer.write(_framed(self.conn, head, body))
        await asyncio.wait_for(self.writer.drain(), IDLE_S)
        response, payload = await _read_message(self.conn, self.reader, h11.Response)
        if response is None:
            raise OSError("the upstream closed the connection before answering")
        self.used = time.monotonic()
        if self.conn.our_state is h11.DONE and self.conn.their_state is h11.DONE:
            self.conn.start_next_cycle()
        else:
            self.close()
        return response.status_code, [(n, v) for n, v in response.headers if n not in _HOP_HEADERS], payload

    async def _connect(self) -> None:
        self.close()
        host, port = self.address
        self.reader, self.writer = await asyncio.wait_for(
            asyncio.open_connection(host, port, ssl=self.tls, server_hostname=host), IDLE_S)
        self.conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD_BYTES)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.transport.abort()
            self.writer = None


async def serve(listen: tuple[str, int], upstream: tuple[str, int], faults: Faults, tls: ProxyTLS | None = None,
                ready: asyncio.Event | None = None) -> None:
    """Relay connections on ``listen`` to ``upstream`` with ``faults`` until cancelled; ``ready`` is
    set once it accepts connections."""
    proxy = Proxy(upstream, faults, tls)
    server = await asyncio.start_server(proxy.accept, *listen, reuse_address=True)
    mode = "HTTP over TLS" if tls else "TCP"
    log.info("%s %s on %s:%d -> %s:%d (%s)", READY, mode, *listen, *upstream, faults)
    if ready is not None:
        ready.set()
    async with server:
        await asyncio.Event().wait()


def command(listen: str, upstream: str, faults: Faults, tls: ProxyTLS | None = None) -> list[str]:
    """The command that runs the proxy (``python -m deploy faults ...``)."""
    host_port(listen, "listen")
    host_port(upstream, "upstream")
    cmd = [sys.executable, "-m", "deploy", "faults", "--listen", listen, "--upstream", upstream,
           "--reset", repr(faults.reset_share), "--fail", repr(faults.fail_share),
           "--latency-ms", repr(faults.latency_s * 1000), "--seed", str(faults.seed)]
    if tls is not None:
        cmd += ["--cert", str(tls.cert), "--key", str(tls.key), "--ca", str(tls.ca)]
    return cmd


def start(listen: str, upstream: str, faults: Faults, tls: ProxyTLS | None = None, log_file: Path | None = None,
          timeout: float = 60.0) -> subprocess.Popen:
    """The proxy as a process (``python -m deploy faults``), returned once it listens; its log
    (the fault lines) goes to ``log_file`` (default: a temporary file)."""
    cmd = command(listen, upstream, faults, tls)
    if log_file is None:
        log_file = Path(tempfile.mkstemp(prefix="fault-proxy-", suffix=".log")[1])
    repo = Path(__file__).resolve().parents[1]
    with open(log_file, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=repo, start_new_session=True)
    deadline = time.monotonic() + timeout
    while READY not in Path(log_file).read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            raise RuntimeError(f"the fault proxy did not start:\n{Path(log_file).read_text(errors='replace')[-2000:]}")
        time.sleep(0.05)
    return proc


def add_parser(sub) -> None:
    """The ``faults`` command's options (``python -m deploy faults``)."""
    faults = sub.add_parser("faults", help="relay connections with latency, resets and failed answers")
    faults.add_argument("--listen", required=True, metavar="HOST:PORT")
    faults.add_argument("--upstream", required=True, metavar="HOST:PORT")
    faults.add_argument("--reset", type=float, default=0.0, help="share of requests (TLS) or connections reset")
    faults.add_argument("--fail", type=float, default=0.0, help="share of requests answered 5xx (TLS only)")
    faults.add_argument("--latency-ms", type=float, default=0.0, help="milliseconds added each way")
    faults.add_argument("--seed", type=int, default=0)
    faults.add_argument("--cert", type=Path, help="certificate presented to clients (HTTP mode)")
    faults.add_argument("--key", type=Path, help="its private key")
    faults.add_argument("--ca", type=Path, help="CA certificate the upstream's is checked against")


def run(args) -> None:
    """``python -m deploy faults``: serve until SIGTERM / SIGINT."""
    given = [name for name in ("cert", "key", "ca") if getattr(args, name) is not None]
    if given and len(given) != 3:
        raise ValueError(f"--cert, --key and --ca go together (given: {', '.join('--' + g for g in given)})")
    faults = Faults(args.reset, args.fail, args.latency_ms / 1000, args.seed)
    if not given and faults.fail_share:
        raise ValueError(f"--fail {args.fail:g} needs HTTP mode (--cert, --key, --ca); valid without them: --fail 0")
    tls = ProxyTLS(args.cert, args.key, args.ca) if given else None
    listen, upstream = host_port(args.listen, "--listen"), host_port(args.upstream, "--upstream")
    logging.basicConfig(format="%(asctime)s %(message)s", level=logging.INFO, stream=sys.stdout)
    asyncio.run(_serve_until_signal(listen, upstream, faults, tls))


async def _serve_until_signal(listen, upstream, faults: Faults, tls: ProxyTLS | None) -> None:
    task = asyncio.ensure_future(serve(listen, upstream, faults, tls))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await asyncio.wait([task, asyncio.ensure_future(stop.wait())], return_when=asyncio.FIRST_COMPLETED)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
