"""cancel.lua: seed a job in each state, cancel, assert the whole resulting keyspace and codes."""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio import Redis

from shardq.common.errors import FailedPrecondition, NotFound
from shardq.shard import Failure, FakeClock, ItemCode, Lease, ShardClient
from tests.support.shard import LEASE, NOW, dedupe, job, job_hash, ready_alone, seed
from tests.support.state import dump, ttls

LATER = NOW + 500
COMMON = {"sq:tenants": {"acme"}, **dedupe("J1")}


async def test_cancelling_a_scheduled_job_ends_it_and_takes_it_off_the_delayed_sets(
    shard: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    await seed(shard, redis, job(delay_ms=5_000))
    clock.set(LATER)
    assert await shard.cancel("acme", "J1") == (ItemCode.OK, "cancelled")
    assert await dump(redis) == {
        "sq:job:J1": job_hash("J1", "cancelled", ra=str(NOW + 5_000), fa=str(LATER)),
        "sq:counts:acme": {"scheduled": "0", "submitted": "1", "bytes": "0"},
        # No worker writes its cancelled row: the shard loop does, from the outbox.
        "sq:outbox": [("J1", LATER)],
        **COMMON,
    }
    assert set(await ttls(redis)) == {"sq:job:J1", "sq:dedupe:acme:rJ1"}
    assert 0 < await redis.pttl("sq:job:J1") <= shard.settings.retention_ms
    clock.advance(10_000)
    assert await shard.promote() == (0, None)


async def test_cancelling_a_ready_job_ends_it_and_leaves_its_id_for_claim_to_skip(
    shard: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    await seed(shard, redis, job())
    clock.set(LATER)
    assert await shard.cancel("acme", "J1") == (ItemCode.OK, "cancelled")
    assert await dump(redis) == {
        "sq:job:J1": job_hash("J1", "cancelled", fa=str(LATER)),
        **ready_alone("acme", {0: ["J1"]}),
        "sq:counts:acme": {"ready": "0", "submitted": "1", "bytes": "0"},
        "sq:outbox": [("J1", LATER)],
        **COMMON,
    }
    assert set(await ttls(redis)) == {"sq:job:J1", "sq:dedupe:acme:rJ1"}
    assert await shard.claim("w1", 1, LEASE) == []


async def test_cancelling_an_active_job_only_marks_it_for_its_worker(
    shard: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    await seed(shard, redis, job())
    (c,) = await shard.claim("w1", 1, LEASE)
    before = await dump(redis)
    clock.set(LATER)
    assert await shard.cancel("acme", "J1") == (ItemCode.CANCEL_REQUESTED, "active")
    before["sq:job:J1"]["cx"] = "1"
    assert await dump(redis) == before
    assert await shard.ack([Lease("J1", c.fence)]) == [ItemCode.CANCELLED]


async def test_cancelling_an_active_job_twice_asks_twice_and_changes_nothing_more(
    shard: ShardClient, redis: Redis
) -> None:
    await seed(shard, redis, job())
    await shard.claim("w1", 1, LEASE)
    await shard.cancel("acme", "J1")
    before = await dump(redis)
    assert await shard.cancel("acme", "J1") == (ItemCode.CANCEL_REQUESTED, "active")
    assert await dump(redis) == before


async def _succeeded(shard: ShardClient) -> None:
    (c,) = await shard.claim("w1", 1, LEASE)
    await shard.ack([Lease(c.job_id, c.fence)])


async def _cancelled(shard: ShardClient) -> None:
    await shard.cancel("acme", "J1")


async def _dead(shard: ShardClient) -> None:
    (c,) = await shard.claim("w1", 1, LEASE)
    await shard.fail([Failure(c.job_id, c.fence, 1, "boom", permanent=True)])


@pytest.mark.parametrize(
    ("finish", "state"),
    [(_succeeded, "succeeded"), (_cancelled, "cancelled"), (_dead, "dead")],
    ids=["succeeded", "cancelled", "dead"],
)
async def test_cancelling_a_finished_job_is_refused_and_changes_nothing(
    shard: ShardClient, redis: Redis, finish: Any, state: str
) -> None:
    await seed(shard, redis, job())
    await finish(shard)
    before = await dump(redis)
    with pytest.raises(FailedPrecondition, match=f"already {state}") as err:
        await shard.cancel("acme", "J1")
    assert err.value.field == "job_id"
    assert await dump(redis) == before


@pytest.mark.parametrize("delay_ms", [None, 5_000], ids=["ready", "scheduled"])
async def test_cancelling_another_tenants_job_is_not_found_and_changes_nothing(
    shard: ShardClient, redis: Redis, delay_ms: int | None
) -> None:
    await seed(shard, redis, job(delay_ms=delay_ms))
    before = await dump(redis)
    with pytest.raises(NotFound) as err:
        await shard.cancel("bravo", "J1")
    assert err.value.field == "job_id"
    assert await dump(redis) == before


async def test_cancelling_a_missing_job_is_not_found_and_writes_nothing(
    shard: ShardClient, redis: Redis
) -> None:
    with pytest.raises(NotFound):
        await shard.cancel("acme", "NOSUCHJOB")
    assert await dump(redis) == {}
