"""Commands to a shard's Redis are packed by hiredis (``shardq.common.redis``): the bytes on
the wire are redis-py's own, argument for argument, and a value Redis cannot take is refused
the same way."""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio import Redis
from redis.asyncio.connection import Connection
from redis.exceptions import DataError

from shardq.common.redis import (
    ShardConnection,
    ShardSentinelConnection,
    pack,
    packs_ahead,
    redis_for,
)

CASES: list[tuple[Any, ...]] = [
    ("PING",),
    ("EVALSHA", "a" * 40, 2, "sq:", b"sq:scheduled", 0, -1, 1_700_000_000_000, 10**20),
    ("SET", "k", "é ü", "PX", 1_000),
    ("HSET", b"sq:job:J1", b"p", b'{"a": "b c"}', b"", ""),
    ("ZADD", "z", 1.5, "m", 0.1, "n", 1e20, "o", float("inf"), "p"),
    ("CONFIG GET", "maxmemory"),  # a command given with its subcommand: split
    (b"CLIENT SETNAME", b"shardq"),
    ("SET", "k", memoryview(b"viewed")),
    ("EVALSHA", "b" * 40, 1, "sq:", *[str(i) for i in range(3_000)]),  # a batch of 200 jobs
]


@pytest.mark.parametrize("args", CASES, ids=lambda a: str(a[0]))
def test_a_command_packs_to_the_bytes_redis_py_sends(args: tuple[Any, ...]) -> None:
    ours = b"".join(ShardConnection().pack_command(*args))
    theirs = b"".join(bytes(chunk) for chunk in Connection().pack_command(*args))
    assert ours == theirs


@pytest.mark.parametrize("bad", [None, object(), {"a": 1}])
def test_a_value_redis_cannot_take_is_refused_as_redis_py_refuses_it(bad: object) -> None:
    with pytest.raises(DataError):
        Connection().pack_command("SET", "k", bad)
    with pytest.raises(DataError):
        ShardConnection().pack_command("SET", "k", bad)


async def test_every_shard_client_makes_its_connections_with_the_hiredis_packing() -> None:
    plain = redis_for("127.0.0.1:6390", "")
    sentinel = redis_for("sentinel://127.0.0.1:26390/shard-0", "pw")
    try:
        assert plain.connection_pool.connection_class is ShardConnection
        assert sentinel.connection_pool.connection_class is ShardSentinelConnection
    finally:
        await plain.aclose()
        await sentinel.aclose()


@pytest.mark.parametrize("args", CASES[1:3], ids=lambda a: str(a[0]))
def test_a_command_packed_ahead_is_sent_as_it_is_and_as_it_would_be_packed(
    args: tuple[Any, ...],
) -> None:
    ahead = pack(*args)
    assert ahead == b"".join(bytes(chunk) for chunk in Connection().pack_command(*args))
    sent = ShardConnection().pack_command("EVALSHA", ahead)
    assert sent == [ahead] and sent[0] is ahead  # not packed again, not copied
    with pytest.raises(DataError):
        pack("SET", "k", None)


async def test_only_a_shard_client_is_given_commands_packed_ahead() -> None:
    shard, plain = redis_for("127.0.0.1:6390", ""), Redis(port=6390)
    try:
        assert packs_ahead(shard) and not packs_ahead(plain)
    finally:
        await shard.aclose()
        await plain.aclose()
