"""Tenant-first fairness on one shard: whatever priorities tenants choose, they take turns
(weighted) in each queue; a tenant capped at max_active never runs more while others take the
rest. Counted in claims (a FakeClock, no timing)."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from redis.asyncio import Redis

from shardq.shard import ClaimedJob, ItemCode, Lease, NewJob, ShardClient, TenantLimits
from tests.support.shard import LEASE, job


async def enqueue_many(shard: ShardClient, jobs: list[NewJob]) -> None:
    for i in range(0, len(jobs), 500):
        results = await shard.enqueue(jobs[i : i + 500])
        assert all(r.code is ItemCode.OK for r in results)


async def claim_one_at_a_time(shard: ShardClient, n: int) -> list[ClaimedJob]:
    out: list[ClaimedJob] = []
    for _ in range(n):
        out += await shard.claim("w1", 1, LEASE)
    return out


async def test_a_tenant_flooding_priority_9_cannot_delay_another_tenants_priority_0_jobs(
    shard: ShardClient,
) -> None:
    # alpha submits first, so it is at the head of the ring (the harder order for bravo).
    flood = [job(f"A{i}", tenant="alpha", priority=9) for i in range(5_000)]
    few = [job(f"B{i}", tenant="bravo", priority=0) for i in range(50)]
    await enqueue_many(shard, flood + few)
    first = await claim_one_at_a_time(shard, 110)
    # Turns alternate until bravo is empty: all 50 of its jobs in the first 100 claims.
    assert [c.tenant for c in first[:100]] == ["alpha", "bravo"] * 50
    assert [c.job_id for c in first if c.tenant == "bravo"] == [j.job_id for j in few]
    assert {c.tenant for c in first[100:]} == {"alpha"}
    # alpha's own jobs come out in submission order (one priority, FIFO).
    assert [c.job_id for c in first if c.tenant == "alpha"] == [f"A{i}" for i in range(60)]


@pytest.mark.parametrize("batch", [1, 7, 100])
async def test_weights_3_to_1_give_claimed_counts_within_10_percent_of_3_to_1(
    shard: ShardClient, batch: int
) -> None:
    await shard.set_limits("alpha", TenantLimits(weight=3))
    await shard.set_limits("bravo", TenantLimits(weight=1))
    # Both stay backlogged throughout, at different priorities (which must not matter).
    await enqueue_many(
        shard,
        [job(f"A{i}", tenant="alpha", priority=0) for i in range(4_000)]
        + [job(f"B{i}", tenant="bravo", priority=9) for i in range(4_000)],
    )
    claimed: Counter[str] = Counter()
    while claimed.total() < 4_000:
        got = await shard.claim("w1", min(batch, 4_000 - claimed.total()), LEASE)
        claimed.update(c.tenant for c in got)
    ratio = claimed["alpha"] / claimed["bravo"]
    assert 3 * 0.9 <= ratio <= 3 * 1.1, claimed
    assert claimed == {"alpha": 3_000, "bravo": 1_000}  # exactly, in fact: turns of 3 and 1


async def test_a_tenant_capped_at_4_active_never_has_more_while_another_takes_the_rest(
    shard: ShardClient, redis: Redis
) -> None:
    await shard.set_limits("capped", TenantLimits(max_active=4))
    await enqueue_many(
        shard,
        [job(f"C{i}", tenant="capped", priority=9) for i in range(200)]
        + [job(f"O{i}", tenant="other") for i in range(400)],
    )
    rng = random.Random(7)
    running: dict[str, ClaimedJob] = {}
    concurrency, peak = 10, 0
    for _ in range(100):
        # A worker with 10 slots claims what it has room for, then some of its jobs finish.
        running.update({c.job_id: c for c in await shard.claim("w1", 10 - len(running), LEASE)})
        active = Counter(c.tenant for c in running.values())
        assert active["capped"] <= 4, active
        assert int(await redis.hget("sq:counts:capped", "active")) == active["capped"]
        assert len(running) == concurrency  # the other tenant took the rest of the room
        peak = max(peak, active["capped"])
        done = rng.sample(sorted(running), rng.randint(1, 4))
        assert set(await shard.ack([Lease(j, running[j].fence) for j in done])) == {ItemCode.OK}
        for j in done:
            del running[j]
    assert peak == 4


async def test_an_ack_below_the_cap_un_parks_the_tenant_and_its_next_job_is_claimed(
    shard: ShardClient, redis: Redis
) -> None:
    await shard.set_limits("capped", TenantLimits(max_active=2))
    await enqueue_many(
        shard,
        [job(f"C{i}", tenant="capped") for i in range(5)]
        + [job(f"O{i}", tenant="other") for i in range(5)],
    )
    first = await shard.claim("w1", 4, LEASE)
    assert [c.job_id for c in first] == ["C0", "O0", "C1", "O1"]
    assert await redis.smembers("sq:parked") == {b"capped"}
    # Lazily: the parked tenant leaves the ring when a claim finds it at the head.
    assert [c.job_id for c in await shard.claim("w1", 1, LEASE)] == ["O2"]
    assert await redis.lrange("sq:qring:default", 0, -1) == [b"other"]
    await redis.delete("sq:wake:default")
    assert await shard.ack([Lease("C0", first[0].fence)]) == [ItemCode.OK]
    assert await redis.exists("sq:parked") == 0
    assert await redis.lrange("sq:qring:default", 0, -1) == [b"other", b"capped"]
    assert await redis.lrange("sq:wake:default", 0, -1) == [b"1"]  # woken at once
    assert [c.job_id for c in await shard.claim("w1", 2, LEASE)] == ["O3", "C2"]
    assert await redis.smembers("sq:parked") == {b"capped"}


async def test_a_cap_set_while_over_it_parks_at_once_and_lifting_it_un_parks(
    shard: ShardClient, redis: Redis
) -> None:
    await enqueue_many(shard, [job(f"C{i}", tenant="capped") for i in range(6)])
    assert len(await shard.claim("w1", 3, LEASE)) == 3
    await shard.set_limits("capped", TenantLimits(max_active=2))
    assert await redis.smembers("sq:parked") == {b"capped"}
    assert await shard.claim("w1", 3, LEASE) == []
    await redis.delete("sq:wake:default")
    await shard.set_limits("capped", TenantLimits(max_active=5))
    assert await redis.exists("sq:parked") == 0
    assert await redis.lrange("sq:wake:default", 0, -1) == [b"1"]
    assert [c.job_id for c in await shard.claim("w1", 3, LEASE)] == ["C3", "C4"]
    assert await redis.smembers("sq:parked") == {b"capped"}
