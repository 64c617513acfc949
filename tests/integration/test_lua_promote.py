"""promote.lua: seed scheduled jobs, promote, assert the whole resulting keyspace and the reply."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from shardq.shard import FakeClock, ShardClient, ShardSettings, SystemClock
from tests.support.shard import (
    NOW,
    WAKE,
    dedupe,
    job,
    job_hash,
    ready_alone,
    ready_keys,
    ring_keys,
    seed,
)
from tests.support.state import dump


async def test_promote_on_an_empty_shard_takes_nothing_and_writes_nothing(
    shard: ShardClient, redis: Redis
) -> None:
    assert await shard.promote() == (0, None)
    assert await dump(redis) == {}


async def test_a_due_job_moves_to_ready_and_the_next_due_time_is_returned(
    shard: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    await seed(shard, redis, job("J1", delay_ms=1_000), job("J2", delay_ms=5_000, priority=3))
    clock.advance(1_000)
    assert await shard.promote() == (1, NOW + 5_000)
    assert await dump(redis) == {
        "sq:job:J1": job_hash("J1", "ready", ra=str(NOW + 1_000)),
        "sq:job:J2": job_hash("J2", "scheduled", ra=str(NOW + 5_000), pr="3"),
        **ready_alone("acme", {0: ["J1"]}),
        "sq:scheduled": [("J2", NOW + 5_000)],
        "sq:tscheduled:acme": [("J2", NOW + 5_000)],
        "sq:counts:acme": {"scheduled": "1", "ready": "1", "submitted": "2", "bytes": "4"},
        "sq:tenants": {"acme"},
        WAKE: ["1"],
        **dedupe("J1", "J2"),
    }


@pytest.mark.parametrize(
    ("elapsed_ms", "promoted"),
    [(0, False), (999, False), (1_000, True), (60_000, True)],
    ids=["at-submit", "one-ms-early", "exactly-due", "long-overdue"],
)
async def test_a_job_is_promoted_exactly_when_its_run_at_is_reached(
    shard: ShardClient, redis: Redis, clock: FakeClock, elapsed_ms: int, promoted: bool
) -> None:
    await seed(shard, redis, job("J1", delay_ms=1_000))
    before = await dump(redis)
    clock.advance(elapsed_ms)
    if not promoted:
        assert await shard.promote() == (0, NOW + 1_000)
        assert await dump(redis) == before
        return
    assert await shard.promote() == (1, None)
    assert await dump(redis) == {
        "sq:job:J1": job_hash("J1", "ready", ra=str(NOW + 1_000)),
        **ready_alone("acme", {0: ["J1"]}),
        "sq:counts:acme": {"scheduled": "0", "ready": "1", "submitted": "1", "bytes": "2"},
        "sq:tenants": {"acme"},
        WAKE: ["1"],
        **dedupe("J1"),
    }


async def test_promoted_jobs_join_their_tenant_queue_and_priority_lists_and_rings_once(
    shard: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    await seed(
        shard,
        redis,
        job("A1", delay_ms=10, priority=2),
        job("A2", delay_ms=20, priority=2),
        job("A3", delay_ms=30, priority=7),
        job("B1", tenant="bravo", delay_ms=40, priority=2),
        job("M1", tenant="bravo", delay_ms=40, priority=2, queue="mail"),
    )
    clock.advance(40)
    assert await shard.promote() == (5, None)
    state = await dump(redis)
    structures = ("sq:ready", "sq:tprio", "sq:tqueues", "sq:qring", "sq:inring", "sq:wake")
    assert {k: v for k, v in state.items() if k.startswith(structures)} == {
        **ready_keys("acme", {2: ["A1", "A2"], 7: ["A3"]}),
        **ready_keys("bravo", {2: ["B1"]}),
        **ready_keys("bravo", {2: ["M1"]}, queue="mail"),
        "sq:tqueues:bravo": {"default", "mail"},
        **ring_keys("default", "acme", "bravo"),
        **ring_keys("mail", "bravo"),
        WAKE: ["1"],
        "sq:wake:mail": ["1"],
    }
    assert state["sq:counts:acme"] == {
        "scheduled": "0", "ready": "3", "submitted": "3", "bytes": "6",
    }  # fmt: skip
    assert state["sq:counts:bravo"] == {
        "scheduled": "0", "ready": "2", "submitted": "2", "bytes": "4",
    }  # fmt: skip
    assert "sq:scheduled" not in state
    assert "sq:tscheduled:acme" not in state
    assert "sq:tscheduled:bravo" not in state


async def test_a_promoted_job_joins_the_end_of_a_list_that_already_has_ready_jobs(
    shard: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    await seed(shard, redis, job("J1"), job("J2", delay_ms=5))
    clock.advance(5)
    assert await shard.promote() == (1, None)
    assert await redis.lrange("sq:ready:acme:default:0", 0, -1) == [b"J1", b"J2"]
    assert await redis.lrange("sq:qring:default", 0, -1) == [b"acme"]


async def test_an_id_whose_job_is_not_scheduled_is_taken_off_without_promoting(
    shard: ShardClient, redis: Redis
) -> None:
    # Not reachable through the API (cancel removes the ID); promote must still drain it.
    await redis.zadd("sq:scheduled", {"GONE": NOW - 1})
    assert await shard.promote() == (1, None)
    assert await dump(redis) == {}


async def test_promote_works_in_capped_batches_until_nothing_is_due(
    shard: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    await seed(shard, redis, *(job(f"J{i}", delay_ms=1 + i) for i in range(5)))
    await shard.promote()  # loads the script, so NOSCRIPT retries do not count below
    clock.advance(100)
    await redis.config_resetstat()
    assert await shard.promote(limit=2) == (5, None)
    stats = await redis.info("commandstats")
    # 2 + 2 + 1: the third call took fewer than the limit, so the loop stopped.
    assert stats["cmdstat_evalsha"]["calls"] == 3
    want = [f"J{i}".encode() for i in range(5)]
    assert await redis.lrange("sq:ready:acme:default:0", 0, -1) == want


class BehindByAMinute(SystemClock):
    """The system clock of a host whose clock is a minute behind the shard's."""

    def now_ms(self) -> int:
        return super().now_ms() - 60_000


async def test_a_client_whose_clock_is_off_is_told_the_next_due_time_by_its_own_clock(
    redis: Redis,
) -> None:
    # The job's times are the shard's; only the sleep until the next due job is the caller's.
    shard = ShardClient(redis, ShardSettings(key_prefix="sq"), BehindByAMinute())
    (res,) = await shard.enqueue([job("J1", delay_ms=10_000)])
    taken, next_due = await shard.promote()
    local = shard.clock.now_ms()
    assert taken == 0 and next_due is not None
    assert res.run_at_ms == res.created_at_ms + 10_000
    assert abs(res.created_at_ms - (local + 60_000)) < 5_000  # stamped by the shard, not by us
    # Due in 10 s from now by either clock (a few ms of this test's own running aside).
    assert local + 9_000 < next_due <= local + 10_000
