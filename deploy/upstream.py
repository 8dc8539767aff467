"""The gateway's HTTPS client to the SuperLink on asyncio's own streams.

httpx's default network backend (anyio's ``TLSStream``) decrypts one TLS record (16 KiB) per read,
so a 5 MB answer passes through httpcore, anyio and their cancel scopes some 320 times. asyncio's
TLS transport decrypts everything the socket holds (up to 256 KiB) per wake-up into the
connection's :class:`asyncio.StreamReader`, which httpcore then reads in its 64 KiB steps: the same
bytes in a quarter of the Python passes. httpx (its pool, keep-alive, timeouts and exceptions)
stays as it is; only the bytes move on another backend.
"""

from __future__ import annotations

import asyncio
import ssl
import typing

import httpcore
import httpx

#: asyncio's TLS transport hands over up to 256 KiB at a time; the reader pauses the socket only
#: beyond twice this (a SuperLink answer is at most one object, a few MB)
READER_LIMIT = 512 * 1024


def _mapped(timeout_error: type[Exception], other: type[Exception]) -> dict:
    return {TimeoutError: timeout_error, ssl.SSLError: other, OSError: other,
            asyncio.IncompleteReadError: other}


class _Raising:
    """Re-raises an exception of a mapped type as httpcore's (what httpx maps to its own)."""

    def __init__(self, mapping: dict) -> None:
        self.mapping = mapping

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, err, tb) -> bool:
        for source, target in self.mapping.items():
            if kind is not None and issubclass(kind, source):
                raise target(str(err) or kind.__name__) from err
        return False


class AsyncioStream(httpcore.AsyncNetworkStream):
    """One TCP (or TLS) connection as an asyncio reader/writer pair."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        with _Raising(_mapped(httpcore.ReadTimeout, httpcore.ReadError)):
            async with asyncio.timeout(timeout):
                return await self.reader.read(max_bytes)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        with _Raising(_mapped(httpcore.WriteTimeout, httpcore.WriteError)):
            async with asyncio.timeout(timeout):
                self.writer.write(buffer)
                await self.writer.drain()

    async def aclose(self) -> None:
        self.writer.transport.abort()

    async def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
                        timeout: float | None = None) -> AsyncioStream:
        try:
            with _Raising(_mapped(httpcore.ConnectTimeout, httpcore.ConnectError)):
                async with asyncio.timeout(timeout):
                    await self.writer.start_tls(ssl_context, server_hostname=server_hostname)
        except BaseException:
            await self.aclose()
            raise
        return self

    def get_extra_info(self, info: str) -> typing.Any:
        if info == "ssl_object":
            return self.writer.get_extra_info("ssl_object")
        if info == "client_addr":
            return self.writer.get_extra_info("sockname")
        if info == "server_addr":
            return self.writer.get_extra_info("peername")
        if info == "socket":
            return self.writer.get_extra_info("socket")
        if info == "is_readable":  # an idle connection the SuperLink closed is not reused (the loop reads its EOF)
            return self.reader.at_eof() or self.writer.transport.is_closing()
        return None


class AsyncioBackend(httpcore.AsyncNetworkBackend):
    """httpcore's network backend on :func:`asyncio.open_connection` (TCP_NODELAY, as httpcore's)."""

    async def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                          local_address: str | None = None, socket_options=None) -> AsyncioStream:
        with _Raising(_mapped(httpcore.ConnectTimeout, httpcore.ConnectError)):
            async with asyncio.timeout(timeout):
                reader, writer = await asyncio.open_connection(
                    host, port, limit=READER_LIMIT, local_addr=(local_address, 0) if local_address else None)
        for option in socket_options or ():
            writer.get_extra_info("socket").setsockopt(*option)
        return AsyncioStream(reader, writer)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class UpstreamTransport(httpx.AsyncHTTPTransport):
    """httpx's HTTP/1.1 transport (no proxy, no retries of its own) on :class:`AsyncioBackend`."""

    def __init__(self, verify: ssl.SSLContext, limits: httpx.Limits) -> None:
        super().__init__(verify=verify, limits=limits, trust_env=False)
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=verify, max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry, network_backend=AsyncioBackend())
