"""heartbeat.lua: seed leases, heartbeat, assert the whole resulting keyspace and every code."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from shardq.shard import FakeClock, ItemCode, Lease, ShardClient
from shardq.shard.records import JobProgress
from tests.support.shard import LEASE, NOW, STALE_LEASES, MakeStale, claimed, job
from tests.support.state import dump


async def test_a_heartbeat_with_the_current_fence_extends_the_lease_from_now(
    shard: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    (c,) = await claimed(shard, redis, job("J1"))
    before = await dump(redis)
    clock.advance(20_000)
    assert await shard.heartbeat([Lease("J1", c.fence)], 60_000) == [ItemCode.OK]
    before["sq:leases"] = [("J1", NOW + 20_000 + 60_000)]
    assert await dump(redis) == before


async def test_a_heartbeat_may_shorten_a_lease(
    shard: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    (c,) = await claimed(shard, redis, job("J1"))
    assert await shard.heartbeat([Lease("J1", c.fence)], 1_000) == [ItemCode.OK]
    assert await redis.zscore("sq:leases", "J1") == NOW + 1_000


async def test_a_heartbeat_of_a_job_cancelled_while_active_says_so_and_extends_the_lease(
    shard: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    (c,) = await claimed(shard, redis, job("J1"))
    await shard.cancel("acme", "J1")
    before = await dump(redis)
    assert before["sq:job:J1"]["cx"] == "1"
    clock.advance(5)
    assert await shard.heartbeat([Lease("J1", c.fence)], LEASE) == [ItemCode.CANCEL_REQUESTED]
    before["sq:leases"] = [("J1", NOW + 5 + LEASE)]
    assert await dump(redis) == before


@pytest.mark.parametrize("make_stale", STALE_LEASES)
async def test_a_heartbeat_with_a_stale_fence_is_refused_and_changes_nothing(
    shard: ShardClient, redis: Redis, clock: FakeClock, make_stale: MakeStale
) -> None:
    (c,) = await claimed(shard, redis, job("J1"))
    lease = await make_stale(shard, c, clock)
    before = await dump(redis)
    clock.advance(1)
    assert await shard.heartbeat([lease], LEASE) == [ItemCode.STALE_LEASE]
    assert await dump(redis) == before


async def test_one_heartbeat_call_answers_every_lease_in_order(
    shard: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    c1, c2, c3 = await claimed(shard, redis, job("J1"), job("J2"), job("J3"))
    await shard.cancel("acme", "J2")
    before = await dump(redis)
    clock.advance(10)
    codes = await shard.heartbeat(
        [Lease("J1", c1.fence), Lease("J2", c2.fence), Lease("J3", c1.fence)], LEASE
    )
    assert codes == [ItemCode.OK, ItemCode.CANCEL_REQUESTED, ItemCode.STALE_LEASE]
    assert c3.fence == 3
    before["sq:leases"] = [("J3", NOW + LEASE), ("J1", NOW + 10 + LEASE), ("J2", NOW + 10 + LEASE)]
    assert await dump(redis) == before


async def test_a_heartbeat_of_no_leases_sends_nothing(shard: ShardClient, redis: Redis) -> None:
    await redis.config_resetstat()
    assert await shard.heartbeat([], LEASE) == []
    assert "cmdstat_evalsha" not in await redis.info("commandstats")


# --- progress ------------------------------------------------------------------------------


async def test_a_heartbeat_stores_the_reported_progress_with_the_shards_time(
    shard: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    (c,) = await claimed(shard, redis, job("J1"))
    before = await dump(redis)
    clock.advance(20)
    report = {"J1": JobProgress(0.4, "resized 4/10")}
    assert await shard.heartbeat([Lease("J1", c.fence)], LEASE, report) == [ItemCode.OK]
    before["sq:leases"] = [("J1", NOW + 20 + LEASE)]
    before["sq:job:J1"]["pg"] = f"{NOW + 20} 0.4 resized 4/10"
    assert await dump(redis) == before
    rec = await shard.get_job("acme", "J1")
    assert rec.progress == JobProgress(0.4, "resized 4/10", NOW + 20)


async def test_a_later_report_replaces_the_earlier_one_and_no_report_keeps_it(
    shard: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    (c,) = await claimed(shard, redis, job("J1"))
    lease = Lease("J1", c.fence)
    await shard.heartbeat([lease], LEASE, {"J1": JobProgress(0.1, "a")})
    clock.advance(5)
    await shard.heartbeat([lease], LEASE, {"J1": JobProgress(1.0, "")})
    clock.advance(5)
    await shard.heartbeat([lease], LEASE)  # nothing new: the value stays, with its time
    assert await redis.hget("sq:job:J1", "pg") == f"{NOW + 5} 1.0 ".encode()


async def test_progress_is_stored_only_for_the_leases_it_names(
    shard: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    c1, c2 = await claimed(shard, redis, job("J1"), job("J2"))
    leases = [Lease("J1", c1.fence), Lease("J2", c2.fence)]
    assert await shard.heartbeat(leases, LEASE, {"J2": JobProgress(0.5, "half")}) == [
        ItemCode.OK,
        ItemCode.OK,
    ]
    assert await redis.hget("sq:job:J1", "pg") is None
    assert await redis.hget("sq:job:J2", "pg") == f"{NOW} 0.5 half".encode()


async def test_progress_of_a_job_cancelled_while_active_is_still_stored(
    shard: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    (c,) = await claimed(shard, redis, job("J1"))
    await shard.cancel("acme", "J1")
    report = {"J1": JobProgress(0.9, "winding down")}
    assert await shard.heartbeat([Lease("J1", c.fence)], LEASE, report) == [
        ItemCode.CANCEL_REQUESTED
    ]
    assert await redis.hget("sq:job:J1", "pg") == f"{NOW} 0.9 winding down".encode()


@pytest.mark.parametrize("make_stale", STALE_LEASES)
async def test_progress_under_a_stale_fence_is_refused_and_changes_nothing(
    shard: ShardClient, redis: Redis, clock: FakeClock, make_stale: MakeStale
) -> None:
    (c,) = await claimed(shard, redis, job("J1"))
    lease = await make_stale(shard, c, clock)
    before = await dump(redis)
    clock.advance(1)
    report = {"J1": JobProgress(0.7, "from a lost lease")}
    assert await shard.heartbeat([lease], LEASE, report) == [ItemCode.STALE_LEASE]
    assert await dump(redis) == before
