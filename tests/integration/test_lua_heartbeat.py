"""heartbeat.lua: seed leases, heartbeat, assert the whole resulting keyspace and every code."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from redis.asyncio import Redis

from shardq.shard import ClaimedJob, Failure, FakeClock, ItemCode, Lease, NewJob, ShardClient
from tests.support.state import dump

NOW = 1_700_000_000_000
LEASE = 30_000


def job(jid: str, tenant: str = "acme", **kw: Any) -> NewJob:
    return NewJob(tenant=tenant, handler="h", payload=b"{}", request_id=f"r{jid}", job_id=jid, **kw)


async def claimed(shard: ShardClient, redis: Redis, *jids: str) -> list[ClaimedJob]:
    """Enqueue and claim the jobs, then drop the wake-up tokens."""
    await shard.enqueue([job(j) for j in jids])
    out = await shard.claim("w1", len(jids), LEASE)
    await redis.delete("sq:wake")
    return out


async def test_a_heartbeat_with_the_current_fence_extends_the_lease_from_now(
    shard: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    (c,) = await claimed(shard, redis, "J1")
    before = await dump(redis)
    clock.advance(20_000)
    assert await shard.heartbeat([Lease("J1", c.fence)], 60_000) == [ItemCode.OK]
    before["sq:leases"] = [("J1", NOW + 20_000 + 60_000)]
    assert await dump(redis) == before


async def test_a_heartbeat_may_shorten_a_lease(
    shard: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    (c,) = await claimed(shard, redis, "J1")
    assert await shard.heartbeat([Lease("J1", c.fence)], 1_000) == [ItemCode.OK]
    assert await redis.zscore("sq:leases", "J1") == NOW + 1_000


async def test_a_heartbeat_of_a_job_cancelled_while_active_says_so_and_extends_the_lease(
    shard: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    (c,) = await claimed(shard, redis, "J1")
    await shard.cancel("acme", "J1")
    before = await dump(redis)
    assert before["sq:job:J1"]["cx"] == "1"
    clock.advance(5)
    assert await shard.heartbeat([Lease("J1", c.fence)], LEASE) == [ItemCode.CANCEL_REQUESTED]
    before["sq:leases"] = [("J1", NOW + 5 + LEASE)]
    assert await dump(redis) == before


async def _wrong_fence(shard: ShardClient, c: ClaimedJob, clock: FakeClock) -> Lease:
    return Lease(c.job_id, c.fence + 1)


async def _after_ack(shard: ShardClient, c: ClaimedJob, clock: FakeClock) -> Lease:
    await shard.ack([Lease(c.job_id, c.fence)])
    return Lease(c.job_id, c.fence)


async def _after_fail(shard: ShardClient, c: ClaimedJob, clock: FakeClock) -> Lease:
    await shard.fail([Failure(c.job_id, c.fence, c.attempt, "boom", retry_at_ms=NOW + 10_000)])
    return Lease(c.job_id, c.fence)


async def _after_reap_and_reclaim(shard: ShardClient, c: ClaimedJob, clock: FakeClock) -> Lease:
    clock.advance(LEASE)
    assert await shard.reap() == (1, 0)
    (again,) = await shard.claim("w2", 1, LEASE)
    assert again.fence == c.fence + 1
    return Lease(c.job_id, c.fence)


async def _after_reap_only(shard: ShardClient, c: ClaimedJob, clock: FakeClock) -> Lease:
    clock.advance(LEASE)
    assert await shard.reap() == (1, 0)
    return Lease(c.job_id, c.fence)


async def _missing_job(shard: ShardClient, c: ClaimedJob, clock: FakeClock) -> Lease:
    return Lease("NOSUCHJOB", 1)


Setup = Callable[[ShardClient, ClaimedJob, FakeClock], Awaitable[Lease]]


@pytest.mark.parametrize(
    "make_stale",
    [
        _wrong_fence,
        _after_ack,
        _after_fail,
        _after_reap_only,
        _after_reap_and_reclaim,
        _missing_job,
    ],
    ids=["wrong-fence", "acked", "failed", "reaped", "reaped-and-reclaimed", "missing-job"],
)
async def test_a_heartbeat_with_a_stale_fence_is_refused_and_changes_nothing(
    shard: ShardClient, redis: Redis, clock: FakeClock, make_stale: Setup
) -> None:
    (c,) = await claimed(shard, redis, "J1")
    lease = await make_stale(shard, c, clock)
    before = await dump(redis)
    clock.advance(1)
    assert await shard.heartbeat([lease], LEASE) == [ItemCode.STALE_LEASE]
    assert await dump(redis) == before


async def test_one_heartbeat_call_answers_every_lease_in_order(
    shard: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    c1, c2, c3 = await claimed(shard, redis, "J1", "J2", "J3")
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
