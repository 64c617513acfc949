"""A job hash without the fields at their usual value (``pr``, ``ma``, ``to``; ``shard/records.py``,
``UNSTORED_*``), as ``enqueue.lua`` writes it on a shard at job format 2 (``shardq shards
finalize``, ``tests/integration/test_job_format.py``), goes through every script as if it had
them: promote, claim, release, fail to the dead set, requeue, and reap, each to the same state
and lists as a job that stores them. The fields are taken out by hand here, so that the walk
does not depend on the format's switch."""

from __future__ import annotations

from redis.asyncio import Redis

from shardq.shard import Failure, FakeClock, Lease, ShardClient
from shardq.shard.records import UNSTORED_MAX_ATTEMPTS, UNSTORED_TIMEOUT_MS, JobState
from tests.support.shard import LEASE, NOW, job

LATER = NOW + 60_000


async def _bare(redis: Redis, jid: str) -> None:
    """Take the usual-valued fields out of the job's hash, as a compact writer leaves them."""
    assert await redis.hdel(f"sq:job:{jid}", "pr", "ma", "to") == 3


async def test_a_bare_scheduled_job_is_promoted_and_claimed_at_its_usual_values(
    shard: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    await shard.enqueue([job("J1", run_at_ms=LATER)])
    await _bare(redis, "J1")
    record = await shard.get_job("acme", "J1")
    assert (record.priority, record.max_attempts, record.timeout_ms) == (
        0, UNSTORED_MAX_ATTEMPTS, UNSTORED_TIMEOUT_MS,
    )  # fmt: skip
    clock.set(LATER)
    assert (await shard.promote())[0] == 1
    assert await redis.lrange("sq:ready:acme:default:0", 0, -1) == [b"J1"]
    (c,) = await shard.claim("w1", 1, LEASE)
    assert (c.job_id, c.priority, c.max_attempts, c.timeout_ms, c.attempt) == (
        "J1", 0, UNSTORED_MAX_ATTEMPTS, UNSTORED_TIMEOUT_MS, 1,
    )  # fmt: skip


async def test_a_bare_job_is_released_then_fails_its_usual_attempts_then_is_requeued(
    shard: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    await shard.enqueue([job("J1")])
    await _bare(redis, "J1")
    (c,) = await shard.claim("w1", 1, LEASE)
    await shard.release([Lease("J1", c.fence)])  # back to ready at priority 0, uncounted
    assert await redis.lrange("sq:ready:acme:default:0", 0, -1) == [b"J1"]
    states = []
    for _ in range(UNSTORED_MAX_ATTEMPTS):
        clock.advance(1)
        (c,) = await shard.claim("w1", 1, LEASE)
        (res,) = await shard.fail([Failure("J1", c.fence, c.attempt, "boom", retry_at_ms=0)])
        states.append(res.state)
        if res.state == JobState.SCHEDULED:
            clock.set((await shard.get_job("acme", "J1")).run_at_ms)
            await shard.promote()
    # Dead on its fifth attempt (the usual max), not before and not never.
    assert states == [JobState.SCHEDULED] * (UNSTORED_MAX_ATTEMPTS - 1) + [JobState.DEAD]
    assert await shard.requeue_dead("acme", ["J1"]) == (1, [])
    assert await redis.lrange("sq:ready:acme:default:0", 0, -1) == [b"J1"]
    (c,) = await shard.claim("w1", 1, LEASE)
    assert (c.attempt, c.max_attempts) == (1, UNSTORED_MAX_ATTEMPTS)


async def test_a_bare_job_whose_leases_expire_is_reaped_to_ready_then_to_the_dead_set(
    shard: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    await shard.enqueue([job("J1")])
    await _bare(redis, "J1")
    for attempt in range(1, UNSTORED_MAX_ATTEMPTS + 1):
        (c,) = await shard.claim("w1", 1, LEASE)
        assert c.attempt == attempt
        clock.advance(LEASE)
        to_ready, to_dead = await shard.reap()
        if attempt < UNSTORED_MAX_ATTEMPTS:
            assert (to_ready, to_dead) == (1, 0), attempt
            assert await redis.lrange("sq:ready:acme:default:0", 0, -1) == [b"J1"]
        else:
            assert (to_ready, to_dead) == (0, 1)
    assert (await shard.get_job("acme", "J1")).state is JobState.DEAD
