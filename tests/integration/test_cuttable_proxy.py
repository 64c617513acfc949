"""The CuttableProxy the chaos tests and ``shardq soak`` cut Postgres (and replication) with:
while cut, a new connection is refused, not accepted and then closed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from shardq.coordinator.tools.faults import CuttableProxy


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(1024):
        writer.write(data)
        await writer.drain()
    writer.close()


@pytest.fixture
async def proxy() -> AsyncIterator[CuttableProxy]:
    server = await asyncio.start_server(_echo, "127.0.0.1", 0)
    p = CuttableProxy("127.0.0.1", server.sockets[0].getsockname()[1])
    await p.start()
    try:
        yield p
    finally:
        await p.stop()
        server.close()
        await server.wait_closed()


async def _round_trip(port: int) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"ping")
        await writer.drain()
        return await reader.readexactly(4)
    finally:
        writer.close()


async def test_a_cut_proxy_refuses_new_connections_until_restored(proxy: CuttableProxy) -> None:
    assert await _round_trip(proxy.port) == b"ping"
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    writer.write(b"ab")
    assert await reader.readexactly(2) == b"ab"

    proxy.cut()
    # The open connection is dropped...
    assert await reader.read(1024) == b""
    writer.close()
    # ...and a new one is refused outright: no connect succeeds while the cut lasts.
    for _ in range(3):
        with pytest.raises(ConnectionRefusedError):
            await asyncio.open_connection("127.0.0.1", proxy.port)

    proxy.restore()  # on the same port, at once (a connect now waits in the backlog)
    assert await _round_trip(proxy.port) == b"ping"
    proxy.cut()
    proxy.restore()
    proxy.restore()  # a second restore is harmless
    assert await _round_trip(proxy.port) == b"ping"


async def test_a_connection_accepted_before_a_cut_is_not_forwarded_after_it(
    proxy: CuttableProxy,
) -> None:
    """A client whose connect the proxy accepted just before the cut, while it was still
    connecting upstream, gets no forwarding once the cut is made."""
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    proxy.cut()  # the proxy's accept task may not even have run yet
    writer.write(b"x")
    with pytest.raises((ConnectionResetError, asyncio.IncompleteReadError)):
        await reader.readexactly(1)
    writer.close()
