"""rows_written.lua: after the shard loop wrote or read a job's row, off the outbox, and Redis
takes the row's status where the row says succeeded or cancelled and Redis says it ended
otherwise. Seed a state, run the script, assert the whole resulting keyspace."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from shardq.shard import FakeClock, ShardClient
from tests.support.shard import LEASE, NOW, claimed, claimed_hash, dedupe, job
from tests.support.state import dump, ttls

DIED = NOW + LEASE


async def dead_on_outbox(shard: ShardClient, redis: Redis, clock: FakeClock) -> None:
    await claimed(shard, redis, job("J1", max_attempts=1))
    clock.set(DIED)
    assert await shard.reap() == (0, 1)


def counts(**over: str) -> dict[str, str]:
    c = {"ready": "0", "active": "0", "dead": "1", "submitted": "1", "failed": "1", "bytes": "0"}
    return c | over


DEAD_HASH = claimed_hash("J1", "dead", 1, ma="1", fa=str(DIED), e="lease expired")
COMMON = {"sq:fence": "1", "sq:tenants": {"acme"}, **dedupe("J1")}


async def test_a_dead_row_takes_the_job_off_the_outbox_and_changes_nothing_else(
    shard: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    await dead_on_outbox(shard, redis, clock)
    assert await shard.rows_written([("J1", DIED, "dead")]) == [False]
    assert await dump(redis) == {
        "sq:job:J1": DEAD_HASH,
        "sq:dead:acme": [("J1", DIED)],
        "sq:counts:acme": counts(),
        **COMMON,
    }


@pytest.mark.parametrize("status", ["succeeded", "cancelled"])
async def test_a_dead_job_whose_row_says_otherwise_takes_the_rows_status(
    shard: ShardClient, redis: Redis, clock: FakeClock, status: str
) -> None:
    await dead_on_outbox(shard, redis, clock)
    assert await shard.rows_written([("J1", DIED, status)]) == [True]
    extra = {"succeeded": "1"} if status == "succeeded" else {}
    assert await dump(redis) == {
        "sq:job:J1": DEAD_HASH | {"s": status},
        "sq:counts:acme": counts(dead="0", **extra),
        **COMMON,
    }
    assert "sq:job:J1" in await ttls(redis)


async def test_an_entry_put_back_since_it_was_read_stays_on_the_outbox(
    shard: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    await dead_on_outbox(shard, redis, clock)
    assert await shard.rows_written([("J1", DIED - 1, "dead")]) == [False]
    assert await redis.zrange("sq:outbox", 0, -1, withscores=True) == [(b"J1", DIED)]


async def test_the_reconciler_leaves_the_outbox_alone(
    shard: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    await dead_on_outbox(shard, redis, clock)
    assert await shard.rows_written([("J1", None, "succeeded")]) == [True]
    assert await redis.zrange("sq:outbox", 0, -1, withscores=True) == [(b"J1", DIED)]


@pytest.mark.parametrize("row_status", ["succeeded", "cancelled", "dead"])
async def test_a_job_that_has_not_ended_never_takes_a_rows_status(
    shard: ShardClient, redis: Redis, clock: FakeClock, row_status: str
) -> None:
    await dead_on_outbox(shard, redis, clock)
    await shard.requeue_dead("acme", ["J1"])
    before = await dump(redis)
    assert await shard.rows_written([("J1", None, row_status)]) == [False]
    assert await dump(redis) == before


async def test_a_missing_job_is_taken_off_the_outbox(
    shard: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    await dead_on_outbox(shard, redis, clock)
    await redis.delete("sq:job:J1")
    assert await shard.rows_written([("J1", DIED, "")]) == [False]
    assert await redis.exists("sq:outbox") == 0
