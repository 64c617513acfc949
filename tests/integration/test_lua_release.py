"""release.lua: a stopping worker hands its jobs back to ready at once, attempt not counted."""

from __future__ import annotations

from redis.asyncio import Redis

from shardq.shard import FakeClock, ItemCode, Lease, NewJob, ShardClient
from tests.support.state import dump


async def claim_one(shard: ShardClient, rid: str = "r1") -> Lease:
    await shard.enqueue([NewJob("acme", "h", b"{}", rid, job_id=f"J{rid}", priority=3)])
    (c,) = await shard.claim("w1", 1, 30_000)
    return Lease(c.job_id, c.fence)


async def test_a_released_job_is_ready_again_with_its_attempt_given_back(
    shard: ShardClient, redis: Redis
) -> None:
    lease = await claim_one(shard)
    assert await shard.release([lease]) == [ItemCode.OK]
    state = await dump(redis)
    job = state["sq:job:Jr1"]
    assert (job["s"], job["at"], job["f"], job["w"]) == ("ready", "0", "1", "w1")
    assert state["sq:ready:acme:3"] == ["Jr1"]
    assert state["sq:ring:3"] == ["acme"]
    assert "sq:tactive:acme" not in state and "sq:leases" not in state
    assert state["sq:counts:acme"] == {"ready": "1", "active": "0", "submitted": "1"}
    assert state["sq:wake"] == ["1", "1"]  # one from the submit, one from the release
    (again,) = await shard.claim("w2", 1, 30_000)
    assert (again.job_id, again.attempt, again.fence) == ("Jr1", 1, 2)


async def test_release_with_a_stale_fence_changes_nothing(
    shard: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    lease = await claim_one(shard)
    before = await dump(redis)
    assert await shard.release([Lease(lease.job_id, lease.fence + 1)]) == [ItemCode.STALE_LEASE]
    assert await dump(redis) == before


async def test_releasing_a_job_cancelled_while_active_ends_it_cancelled(
    shard: ShardClient, redis: Redis
) -> None:
    lease = await claim_one(shard)
    await shard.cancel("acme", lease.job_id)
    assert await shard.release([lease]) == [ItemCode.CANCELLED]
    assert (await shard.get_job("acme", lease.job_id)).state == "cancelled"
    assert await redis.llen("sq:ready:acme:3") == 0
