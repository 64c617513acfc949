"""A shard connection sends its command in the caller's own turn of the event loop
(``shardq.common.redis``), and still guards what redis-py's slower checks guard: a pooled
connection with something left to read or closed by the server is opened again, a command
over the write buffer's high-water mark goes out whole, a Redis that does not read times the
write out, and an idle connection is still health-checked."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis
from redis.exceptions import TimeoutError as RedisTimeoutError

from shardq.common.redis import ShardConnection, redis_for
from shardq.coordinator.tools.redis_server import RedisProcess


@pytest.fixture
async def client(redis_proc: RedisProcess) -> AsyncIterator[Redis]:
    r = redis_for(f"127.0.0.1:{redis_proc.port}", "")
    try:
        yield r
    finally:
        await r.aclose()


async def _connection_id(r: Redis) -> int:
    return int(await r.execute_command("CLIENT", "ID"))


async def test_the_pool_hands_out_shard_connections(client: Redis) -> None:
    await client.ping()
    (conn,) = client.connection_pool._available_connections  # type: ignore[attr-defined]
    assert isinstance(conn, ShardConnection)


async def test_a_connection_the_server_closed_is_opened_again_for_the_next_command(
    client: Redis, redis: Redis
) -> None:
    first = await _connection_id(client)
    await redis.execute_command("CLIENT", "KILL", "ID", str(first))
    await asyncio.sleep(0.1)  # the end of the stream reaches the idle connection
    assert await client.execute_command("ECHO", "after") == b"after"
    assert await _connection_id(client) != first


async def test_a_reply_left_unread_on_a_pooled_connection_is_never_read_as_the_next_ones(
    client: Redis,
) -> None:
    first = await _connection_id(client)
    pool = client.connection_pool
    conn = await pool.get_connection()
    await conn.send_command("ECHO", "stale")  # its reply is never read
    await pool.release(conn)
    await asyncio.sleep(0.1)  # the reply comes in on the idle connection
    assert await client.execute_command("ECHO", "fresh") == b"fresh"
    assert await _connection_id(client) != first


async def test_a_command_larger_than_the_write_buffer_is_sent_whole(client: Redis) -> None:
    value = os.urandom(4 << 20)  # far above the transport's high-water mark (64 KiB)
    await client.set("big", value)
    assert await client.get("big") == value
    assert await client.execute_command("ECHO", "next") == b"next"


async def test_a_write_to_a_redis_that_does_not_read_times_out(redis_proc: RedisProcess) -> None:
    r = redis_for(f"127.0.0.1:{redis_proc.port}", "")
    r.connection_pool.connection_kwargs["socket_timeout"] = 0.5
    try:
        await r.ping()
        pool = r.connection_pool
        conn = await pool.get_connection()
        transport = conn._writer.transport  # type: ignore[attr-defined]
        assert redis_proc.proc is not None
        os.kill(redis_proc.proc.pid, signal.SIGSTOP)
        try:
            # More than the two sockets' buffers hold: the write itself must wait, and stops
            # (on the connection itself: the client's retry would end in a read's timeout).
            with pytest.raises(RedisTimeoutError, match="writing"):
                await conn.send_command("SET", "big", b"x" * (64 << 20))
        finally:
            # redis-py closed the connection without waiting: drop the bytes it still holds.
            transport.abort()
            os.kill(redis_proc.proc.pid, signal.SIGCONT)
            await pool.release(conn)
        assert await r.execute_command("ECHO", "back") == b"back"
    finally:
        await r.aclose()


async def test_an_idle_connection_is_still_health_checked(
    redis_proc: RedisProcess, redis: Redis
) -> None:
    r = redis_for(f"127.0.0.1:{redis_proc.port}", "")
    r.connection_pool.connection_kwargs["health_check_interval"] = 0.05
    try:
        await r.ping()
        await redis.config_resetstat()
        await asyncio.sleep(0.2)
        assert await r.execute_command("ECHO", "checked") == b"checked"
        stats = await redis.info("commandstats")
        assert stats["cmdstat_ping"]["calls"] == 1  # the health check, before the ECHO
    finally:
        await r.aclose()
