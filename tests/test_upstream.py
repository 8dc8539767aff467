"""The gateway's asyncio network backend for httpx: the errors httpx maps (and the gateway retries
or answers 502/504 on) and the idle-connection check keep httpcore's meaning."""

import asyncio

import httpcore
import pytest

from deploy.upstream import AsyncioBackend


async def _silent_server(behaviour):
    server = await asyncio.start_server(behaviour, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


def test_a_read_past_its_timeout_is_a_read_timeout_and_a_closed_peer_an_end_of_stream():
    async def scenario():
        closing = asyncio.Event()

        async def behaviour(reader, writer):
            await closing.wait()
            writer.close()

        server, port = await _silent_server(behaviour)
        async with server:
            stream = await AsyncioBackend().connect_tcp("127.0.0.1", port, timeout=None)
            with pytest.raises(httpcore.ReadTimeout):
                await stream.read(1024, timeout=0)
            assert not stream.get_extra_info("is_readable")
            closing.set()
            assert await stream.read(1024, timeout=None) == b""
            assert stream.get_extra_info("is_readable")  # an idle connection the peer closed is dropped
            await stream.aclose()

    asyncio.run(scenario())


def test_nothing_listening_is_a_connect_error():
    async def scenario():
        server, port = await _silent_server(lambda r, w: None)
        server.close()
        await server.wait_closed()
        with pytest.raises(httpcore.ConnectError):
            await AsyncioBackend().connect_tcp("127.0.0.1", port, timeout=None)

    asyncio.run(scenario())
