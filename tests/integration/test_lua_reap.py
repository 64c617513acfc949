"""reap.lua: seed leases, let them expire, reap, assert the whole resulting keyspace."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from shardq.shard import Failure, FakeClock, ItemCode, Lease, ShardClient
from shardq.shard.models import FailResult
from tests.support.shard import LEASE, NOW, WAKE, claimed, claimed_hash, dedupe, job, ready_alone
from tests.support.state import dump, ttls

EXPIRED = NOW + LEASE


async def test_reap_on_an_empty_shard_takes_nothing(shard: ShardClient, redis: Redis) -> None:
    assert await shard.reap() == (0, 0)
    assert await dump(redis) == {}


@pytest.mark.parametrize(
    ("elapsed_ms", "reaped"),
    [(0, False), (LEASE - 1, False), (LEASE, True)],
    ids=["fresh", "one-ms-left", "deadline-reached"],
)
async def test_a_lease_is_reaped_once_its_deadline_is_reached(
    shard: ShardClient, redis: Redis, clock: FakeClock, elapsed_ms: int, reaped: bool
) -> None:
    await claimed(shard, redis, job("J1"))
    before = await dump(redis)
    clock.advance(elapsed_ms)
    assert await shard.reap() == ((1, 0) if reaped else (0, 0))
    if not reaped:
        assert await dump(redis) == before


async def test_an_expired_lease_returns_the_job_to_ready_and_wakes_a_worker(
    shard: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    await claimed(shard, redis, job("J1", priority=6))
    clock.set(EXPIRED)
    assert await shard.reap() == (1, 0)
    assert await dump(redis) == {
        "sq:job:J1": claimed_hash("J1", "ready", 1, pr="6", e="lease expired"),
        "sq:fence": "1",
        **ready_alone("acme", {6: ["J1"]}),
        WAKE: ["1"],
        "sq:counts:acme": {
            "ready": "1",
            "active": "0",
            "submitted": "1",
            "failed": "1",
            "bytes": "2",
        },
        "sq:tenants": {"acme"},
        **dedupe("J1"),
    }


async def test_an_expired_lease_on_the_last_attempt_sends_the_job_to_the_dead_set(
    shard: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    await claimed(shard, redis, job("J1", max_attempts=1))
    clock.set(EXPIRED)
    assert await shard.reap() == (0, 1)
    assert await dump(redis) == {
        "sq:job:J1": claimed_hash("J1", "dead", 1, ma="1", fa=str(EXPIRED), e="lease expired"),
        "sq:fence": "1",
        "sq:dead:acme": [("J1", EXPIRED)],
        # No worker writes its row: the shard loop does, from the outbox.
        "sq:outbox": [("J1", EXPIRED)],
        "sq:counts:acme": {
            "ready": "0", "active": "0", "dead": "1", "submitted": "1", "failed": "1",
            "bytes": "0",
        },
        "sq:tenants": {"acme"},
        **dedupe("J1"),
    }  # fmt: skip


async def test_an_expired_lease_of_a_job_cancelled_while_active_ends_it_as_cancelled(
    shard: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    await claimed(shard, redis, job("J1"))
    await shard.cancel("acme", "J1")
    clock.set(EXPIRED)
    assert await shard.reap() == (0, 0)
    assert await dump(redis) == {
        "sq:job:J1": claimed_hash("J1", "cancelled", 1, cx="1", fa=str(EXPIRED), e="lease expired"),
        "sq:fence": "1",
        "sq:outbox": [("J1", EXPIRED)],
        "sq:counts:acme": {
            "ready": "0",
            "active": "0",
            "submitted": "1",
            "failed": "1",
            "bytes": "0",
        },
        "sq:tenants": {"acme"},
        **dedupe("J1"),
    }
    assert set(await ttls(redis)) == {"sq:job:J1", "sq:dedupe:acme:rJ1"}


async def test_a_lease_entry_of_a_job_no_longer_active_is_dropped(
    shard: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    # Not reachable through the API (ack and fail remove the entry); reap must still drain it.
    await redis.zadd("sq:leases", {"GONE": NOW})
    assert await shard.reap() == (0, 0)
    assert await dump(redis) == {}


async def test_a_heartbeat_keeps_a_lease_from_being_reaped(
    shard: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    (c,) = await claimed(shard, redis, job("J1"))
    clock.advance(LEASE - 1)
    await shard.heartbeat([Lease("J1", c.fence)], LEASE)
    clock.advance(LEASE - 1)
    assert await shard.reap() == (0, 0)
    clock.advance(1)
    assert await shard.reap() == (1, 0)


async def test_reap_works_in_capped_batches_until_no_lease_has_expired(
    shard: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    await claimed(shard, redis, *(job(f"J{i}", max_attempts=1 + i % 2) for i in range(5)))
    clock.set(EXPIRED)
    assert await shard.reap(limit=2) == (2, 3)
    assert await redis.exists("sq:leases") == 0


async def test_a_reaped_job_is_claimable_again_exactly_once_and_its_old_fence_is_refused(
    shard: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    (old,) = await claimed(shard, redis, job("J1"))
    clock.set(EXPIRED)
    await shard.reap()
    first = await shard.claim("w2", 10, LEASE)
    assert [(c.job_id, c.fence, c.attempt) for c in first] == [("J1", 2, 2)]
    assert await shard.claim("w3", 10, LEASE) == []
    stale = Lease("J1", old.fence)
    before = await dump(redis)
    assert await shard.heartbeat([stale], LEASE) == [ItemCode.STALE_LEASE]
    assert await shard.ack([stale]) == [ItemCode.STALE_LEASE]
    assert await shard.fail([Failure("J1", old.fence, 1, "late")]) == [
        FailResult(ItemCode.STALE_LEASE, "active")
    ]
    assert await dump(redis) == before
    assert await shard.ack([Lease("J1", first[0].fence)]) == [ItemCode.OK]
