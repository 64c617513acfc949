"""A shard connection sends its command in the caller's own turn of the event loop
(``shardq.common.redis``), and still guards what redis-py's slower checks guard: a pooled
connection with something left to read or closed by the server is opened again, a command
over the write buffer's high-water mark goes out whole, a Redis that does not read times the
write out, and an idle connection is still health-checked. Each on asyncio's loop and on
uvloop (the servers'), whose transports are different code."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import uvloop
from redis.asyncio import Redis
from redis.exceptions import TimeoutError as RedisTimeoutError

from shardq.common.redis import ShardConnection, redis_for
from shardq.coordinator.tools.redis_server import RedisProcess

Scenario = Callable[[Redis, Redis, RedisProcess], Awaitable[None]]
LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop] | None] = {
    "asyncio": None,
    "uvloop": uvloop.new_event_loop,
}


def _run(loop: str, redis_proc: RedisProcess, scenario: Scenario, **options: Any) -> None:
    """``scenario(client, admin, redis_proc)`` on ``loop``: ``client`` a shard client (with
    its pool's connection ``options``), ``admin`` a plain redis-py client of the same Redis."""

    async def go() -> None:
        client = redis_for(f"127.0.0.1:{redis_proc.port}", "")
        client.connection_pool.connection_kwargs.update(options)
        admin = Redis.from_url(redis_proc.url)
        try:
            await scenario(client, admin, redis_proc)
        finally:
            await client.aclose()
            await admin.aclose()

    with asyncio.Runner(loop_factory=LOOPS[loop]) as runner:
        runner.run(go())


async def _connection_id(r: Redis) -> int:
    return int(await r.execute_command("CLIENT", "ID"))


@pytest.fixture(params=list(LOOPS))
def loop(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_the_pool_hands_out_shard_connections(loop: str, redis_proc: RedisProcess) -> None:
    async def scenario(client: Redis, admin: Redis, proc: RedisProcess) -> None:
        await client.ping()
        (conn,) = client.connection_pool._available_connections  # type: ignore[attr-defined]
        assert isinstance(conn, ShardConnection)

    _run(loop, redis_proc, scenario)


async def _closed_by_the_server(client: Redis, admin: Redis) -> None:
    await admin.execute_command("CLIENT", "KILL", "ID", str(await _connection_id(client)))


async def _a_reply_left_unread(client: Redis, admin: Redis) -> None:
    pool = client.connection_pool
    conn = await pool.get_connection()
    await conn.send_command("ECHO", "stale")  # its reply is never read
    await pool.release(conn)


@pytest.mark.parametrize("spoil", [_closed_by_the_server, _a_reply_left_unread])
def test_a_pooled_connection_left_unfit_is_opened_again_for_the_next_command(
    loop: str, redis_proc: RedisProcess, spoil: Callable[[Redis, Redis], Awaitable[None]]
) -> None:
    """Its end, or a reply nobody read, is never taken for the next command's answer."""

    async def scenario(client: Redis, admin: Redis, proc: RedisProcess) -> None:
        first = await _connection_id(client)
        await spoil(client, admin)
        await asyncio.sleep(0.1)  # what it left comes in on the idle connection
        assert await client.execute_command("ECHO", "fresh") == b"fresh"
        assert await _connection_id(client) != first

    _run(loop, redis_proc, scenario)


def test_a_command_larger_than_the_write_buffer_is_sent_whole(
    loop: str, redis_proc: RedisProcess
) -> None:
    async def scenario(client: Redis, admin: Redis, proc: RedisProcess) -> None:
        value = os.urandom(4 << 20)  # far above the transport's high-water mark (64 KiB)
        await client.set("big", value)
        assert await client.get("big") == value
        assert await client.execute_command("ECHO", "next") == b"next"

    _run(loop, redis_proc, scenario)


def test_a_write_to_a_redis_that_does_not_read_times_out(
    loop: str, redis_proc: RedisProcess
) -> None:
    async def scenario(client: Redis, admin: Redis, proc: RedisProcess) -> None:
        await client.ping()
        pool = client.connection_pool
        conn = await pool.get_connection()
        transport = conn._writer.transport  # type: ignore[attr-defined]
        assert proc.proc is not None
        os.kill(proc.proc.pid, signal.SIGSTOP)
        try:
            # More than the two sockets' buffers hold: the write itself must wait, and stops
            # (on the connection itself: the client's retry would end in a read's timeout).
            with pytest.raises(RedisTimeoutError, match="writing"):
                await conn.send_command("SET", "big", b"x" * (64 << 20))
        finally:
            # redis-py closed the connection without waiting: drop the bytes it still holds.
            transport.abort()
            os.kill(proc.proc.pid, signal.SIGCONT)
            await pool.release(conn)
        assert await client.execute_command("ECHO", "back") == b"back"

    _run(loop, redis_proc, scenario, socket_timeout=0.5)


def test_an_idle_connection_is_still_health_checked(loop: str, redis_proc: RedisProcess) -> None:
    async def scenario(client: Redis, admin: Redis, proc: RedisProcess) -> None:
        await client.ping()
        await admin.config_resetstat()
        await asyncio.sleep(0.2)
        assert await client.execute_command("ECHO", "checked") == b"checked"
        stats = await admin.info("commandstats")
        assert stats["cmdstat_ping"]["calls"] == 1  # the health check, before the ECHO

    _run(loop, redis_proc, scenario, health_check_interval=0.05)
