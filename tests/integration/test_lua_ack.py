"""ack.lua: seed leases, ack, assert the whole resulting keyspace, TTLs and every code."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from shardq.shard import FakeClock, ItemCode, Lease, ShardClient, TenantLimits
from tests.support.shard import (
    LEASE,
    NOW,
    STALE_LEASES,
    MakeStale,
    claimed,
    claimed_hash,
    dedupe,
    job,
)
from tests.support.state import dump, ttls

DONE = NOW + 700


async def test_an_ack_with_the_current_fence_ends_the_job_as_succeeded(
    shard: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    (c,) = await claimed(shard, redis, job("J1"))
    clock.set(DONE)
    assert await shard.ack([Lease("J1", c.fence)]) == [ItemCode.OK]
    assert await dump(redis) == {
        "sq:job:J1": claimed_hash("J1", "succeeded", 1, fa=str(DONE)),
        "sq:fence": "1",
        "sq:counts:acme": {
            "ready": "0",
            "active": "0",
            "submitted": "1",
            "succeeded": "1",
            "bytes": "0",
        },
        "sq:tenants": {"acme"},
        **dedupe("J1"),
    }
    assert set(await ttls(redis)) == {"sq:job:J1", "sq:dedupe:acme:rJ1"}
    assert 0 < await redis.pttl("sq:job:J1") <= shard.settings.retention_ms


async def test_an_ack_of_a_job_cancelled_while_active_ends_it_as_cancelled(
    shard: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    (c,) = await claimed(shard, redis, job("J1"))
    await shard.cancel("acme", "J1")
    clock.set(DONE)
    assert await shard.ack([Lease("J1", c.fence)]) == [ItemCode.CANCELLED]
    assert await dump(redis) == {
        "sq:job:J1": claimed_hash("J1", "cancelled", 1, cx="1", fa=str(DONE)),
        "sq:fence": "1",
        # Its worker may have committed a succeeded row: the shard loop settles which stands.
        "sq:outbox": [("J1", DONE)],
        "sq:counts:acme": {"ready": "0", "active": "0", "submitted": "1", "bytes": "0"},
        "sq:tenants": {"acme"},
        **dedupe("J1"),
    }
    assert set(await ttls(redis)) == {"sq:job:J1", "sq:dedupe:acme:rJ1"}


@pytest.mark.parametrize("make_stale", STALE_LEASES)
async def test_an_ack_with_a_stale_fence_is_refused_and_changes_nothing(
    shard: ShardClient, redis: Redis, clock: FakeClock, make_stale: MakeStale
) -> None:
    (c,) = await claimed(shard, redis, job("J1"))
    lease = await make_stale(shard, c, clock)
    before = await dump(redis)
    clock.advance(1)
    assert await shard.ack([lease]) == [ItemCode.STALE_LEASE]
    assert await dump(redis) == before


async def test_one_ack_call_answers_every_lease_in_order(
    shard: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    c1, c2, c3 = await claimed(shard, redis, job("J1"), job("J2"), job("J3"))
    await shard.cancel("acme", "J2")
    clock.set(DONE)
    codes = await shard.ack([Lease("J1", c1.fence), Lease("J2", c2.fence), Lease("J3", c1.fence)])
    assert codes == [ItemCode.OK, ItemCode.CANCELLED, ItemCode.STALE_LEASE]
    assert await dump(redis) == {
        "sq:job:J1": claimed_hash("J1", "succeeded", 1, fa=str(DONE)),
        "sq:job:J2": claimed_hash("J2", "cancelled", 2, cx="1", fa=str(DONE)),
        "sq:job:J3": claimed_hash("J3", "active", c3.fence),
        "sq:fence": "3",
        "sq:outbox": [("J2", DONE)],
        "sq:leases": [("J3", NOW + LEASE)],
        "sq:tactive:acme": [("J3", NOW)],
        "sq:counts:acme": {
            "ready": "0",
            "active": "1",
            "submitted": "3",
            "succeeded": "1",
            "bytes": "2",
        },
        "sq:tenants": {"acme"},
        **dedupe("J1", "J2", "J3"),
    }


async def test_one_ack_call_over_tenants_ends_each_tenants_jobs_and_unparks_it(
    shard: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    """The leases, the active sets and each tenant's counts change once per tenant at the
    end of the call: still every job of every tenant, and a tenant parked at its max_active
    is served again once below it."""
    await shard.set_limits("beta", TenantLimits(max_active=2))
    jobs = await claimed(
        shard, redis, job("J1"), job("J2"), job("B1", "beta"), job("B2", "beta"), job("J3")
    )
    fence = {c.job_id: c.fence for c in jobs}
    await shard.enqueue([job("B3", "beta")])  # waits: beta is parked at its 2 active jobs
    assert await redis.smembers("sq:parked") == {b"beta"}
    await shard.cancel("acme", "J2")
    clock.set(DONE)
    codes = await shard.ack(
        [Lease(jid, fence[jid]) for jid in ("J1", "B1", "J2", "B2")] + [Lease("J3", fence["J1"])]
    )
    assert codes == [
        ItemCode.OK,
        ItemCode.OK,
        ItemCode.CANCELLED,
        ItemCode.OK,
        ItemCode.STALE_LEASE,
    ]
    state = await dump(redis)
    assert state["sq:leases"] == [("J3", NOW + LEASE)]
    assert state["sq:tactive:acme"] == [("J3", NOW)]
    assert "sq:tactive:beta" not in state
    assert (state["sq:counts:acme"]["active"], state["sq:counts:acme"]["succeeded"]) == ("1", "1")
    assert (state["sq:counts:beta"]["active"], state["sq:counts:beta"]["succeeded"]) == ("0", "2")
    assert "sq:parked" not in state
    assert state["sq:qring:default"] == ["beta"]  # back on the ring, with B3
    (b3,) = await shard.claim("w2", 1, LEASE)
    assert b3.job_id == "B3"


async def test_an_ack_of_no_leases_sends_nothing(shard: ShardClient, redis: Redis) -> None:
    await redis.config_resetstat()
    assert await shard.ack([]) == []
    assert "cmdstat_evalsha" not in await redis.info("commandstats")
