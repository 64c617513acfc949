"""requeue.lua: seed dead jobs, requeue, assert the whole resulting keyspace and the reply."""

from __future__ import annotations

from redis.asyncio import Redis

from shardq.shard import Failure, FakeClock, NewJob, ShardClient
from tests.support.shard import DIGEST, LEASE, NOW, WAKE, drop_wake_tokens, job, ready_alone
from tests.support.state import dump

DIED = NOW + 100


async def kill(shard: ShardClient, clock: FakeClock, *jobs: NewJob) -> None:
    """Enqueue, claim and fail the jobs permanently: they end in their tenants' dead sets."""
    await shard.enqueue(list(jobs))
    claimed = await shard.claim("w1", len(jobs), LEASE)
    clock.set(DIED)
    await shard.fail([Failure(c.job_id, c.fence, 1, "boom", permanent=True) for c in claimed])
    await drop_wake_tokens(shard.redis)


async def test_requeue_from_dead_resets_attempts_and_makes_the_job_ready(
    shard: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    await kill(shard, clock, job("J1", priority=3, max_attempts=2))
    assert await shard.requeue_dead("acme", ["J1"]) == (1, [])
    assert await dump(redis) == {
        "sq:job:J1": {
            "t": "acme", "r": "rJ1", "h": "h", "p": "{}", "pr": "3", "s": "ready",
            "ra": str(NOW), "ca": str(NOW), "at": "0", "ma": "2", "to": "300000", "f": "1",
            "w": "w1", "sa": str(NOW), "e": "boom",
        },
        "sq:fence": "1",
        **ready_alone("acme", {3: ["J1"]}),
        WAKE: ["1"],
        "sq:counts:acme": {
            "ready": "1", "active": "0", "dead": "0", "submitted": "1", "failed": "1",
            "bytes": "2",
        },
        "sq:tenants": {"acme"},
        "sq:dedupe:acme:rJ1": f"J1 {DIGEST}",
    }  # fmt: skip


async def test_a_requeued_job_gets_its_full_attempts_again(
    shard: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    await kill(shard, clock, job("J1", max_attempts=2))
    await shard.requeue_dead("acme", ["J1"])
    (c,) = await shard.claim("w2", 1, LEASE)
    assert (c.attempt, c.max_attempts, c.fence) == (1, 2, 2)
    (res,) = await shard.fail([Failure("J1", c.fence, c.attempt, "again", retry_at_ms=DIED)])
    assert res.state == "scheduled"


async def test_ids_that_are_not_dead_jobs_of_the_tenant_are_returned_and_left_alone(
    shard: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    await kill(shard, clock, job("D1"), job("B1", tenant="bravo"))
    await shard.enqueue([job("R1"), job("S1", delay_ms=60_000)])
    await drop_wake_tokens(redis)
    before = await dump(redis)
    got = await shard.requeue_dead("acme", ["R1", "S1", "B1", "NOSUCHJOB"])
    assert got == (0, ["R1", "S1", "B1", "NOSUCHJOB"])
    assert await dump(redis) == before


async def test_one_requeue_call_moves_the_dead_and_reports_the_rest(
    shard: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    await kill(shard, clock, job("D1"), job("D2"), job("D3"))
    assert await shard.requeue_dead("acme", ["D3", "NOPE", "D1", "D1"]) == (2, ["NOPE", "D1"])
    assert await redis.lrange("sq:ready:acme:default:0", 0, -1) == [b"D3", b"D1"]
    assert await redis.zrange("sq:dead:acme", 0, -1) == [b"D2"]
    assert await redis.hget("sq:counts:acme", "dead") == b"1"


async def test_requeueing_no_ids_sends_nothing(shard: ShardClient, redis: Redis) -> None:
    await redis.config_resetstat()
    assert await shard.requeue_dead("acme", []) == (0, [])
    assert "cmdstat_evalsha" not in await redis.info("commandstats")
