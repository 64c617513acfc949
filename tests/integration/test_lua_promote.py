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
        "sq:due": [("acme", NOW + 5_000)],
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
    assert "sq:due" not in state
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
    await redis.zadd("sq:tscheduled:acme", {"GONE": NOW - 1})
    await redis.zadd("sq:due", {"acme": NOW - 1})
    assert await shard.promote() == (1, None)
    assert await dump(redis) == {}


async def test_jobs_due_across_tenants_are_promoted_in_run_at_order_through_capped_calls(
    shard: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    # A backlog over three tenants, interleaved by run-at: each call of 2 takes the 2 earliest
    # of all, whichever tenant they belong to (a merge of the tenants' ZSETs by `due`).
    order = [("acme", 10), ("bravo", 20), ("acme", 30), ("carol", 40), ("bravo", 50), ("acme", 60)]
    await seed(shard, redis, *(job(f"{t[0]}{at}", tenant=t, delay_ms=at) for t, at in order))
    clock.advance(1_000)
    promoted = []
    for _ in range(3):
        taken, _, _ = await shard._run("promote", [], [clock.now_ms(), 2, 0])
        assert taken == 2
        promoted.append(await _ready_ids(redis))
    assert promoted == [["a10", "b20"], ["a10", "a30", "b20", "c40"],
                        ["a10", "a30", "a60", "b20", "b50", "c40"]]  # fmt: skip
    assert await shard.promote() == (0, None)
    assert "sq:due" not in await dump(redis)


async def _ready_ids(redis: Redis) -> list[str]:
    ids = []
    for key in await redis.keys("sq:ready:*"):
        ids += [i.decode() for i in await redis.lrange(key, 0, -1)]
    return sorted(ids)


async def test_a_tenant_whose_earliest_job_was_cancelled_gets_its_right_score_and_nothing_else(
    shard: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    await seed(shard, redis, job("J1", delay_ms=1_000), job("J2", delay_ms=5_000))
    await shard.cancel("acme", "J1")
    assert await redis.zscore("sq:due", "acme") == NOW + 1_000  # early: a lower bound
    clock.advance(1_000)
    before = {k: v for k, v in (await dump(redis)).items() if k != "sq:due"}
    assert await shard.promote() == (0, NOW + 5_000)
    after = await dump(redis)
    assert after.pop("sq:due") == [("acme", NOW + 5_000)]
    assert after == before


async def test_a_tenant_whose_last_scheduled_job_is_cancelled_leaves_due(
    shard: ShardClient, redis: Redis
) -> None:
    await seed(shard, redis, job("J1", delay_ms=1_000))
    await shard.cancel("acme", "J1")
    assert "sq:due" not in await dump(redis)
    assert await shard.promote() == (0, None)


async def test_jobs_on_the_earlier_layouts_shard_wide_zset_are_moved_onto_due_and_promoted(
    shard: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    """A shard written by the version before ``due``: every scheduled job on ``scheduled`` and
    its tenant's ZSET, no ``due``. Promote moves the entries over in run-at order (counted as
    taken, so the client's loop goes on until none is left), then promotes as ever."""
    await seed(
        shard, redis,
        *(job(f"A{i}", delay_ms=100 * (i + 1)) for i in range(3)),
        *(job(f"B{i}", tenant="bravo", delay_ms=150 * (i + 1)) for i in range(3)),
    )  # fmt: skip
    await redis.delete("sq:due")
    for t in ("acme", "bravo"):
        entries = await redis.zrange(f"sq:tscheduled:{t}", 0, -1, withscores=True)
        await redis.zadd("sq:scheduled", dict(entries))
    await redis.zadd("sq:scheduled", {"GONE": NOW})  # an ID whose job is gone: dropped
    clock.advance(250)
    # 7 entries moved 2 at a call (4 calls: the last moves 1 and promotes 1 of the 3 due).
    assert await shard.promote(limit=2) == (7 + 3, NOW + 300)
    state = await dump(redis)
    assert "sq:scheduled" not in state
    assert state["sq:due"] == [("acme", NOW + 300), ("bravo", NOW + 300)]
    assert await _ready_ids(redis) == ["A0", "A1", "B0"]
    clock.advance(200)
    assert await shard.promote() == (3, None)
    assert await _ready_ids(redis) == ["A0", "A1", "A2", "B0", "B1", "B2"]


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
