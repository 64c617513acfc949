"""fail.lua: seed leases, record failures, assert the whole resulting keyspace and every code."""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio import Redis

from shardq.shard import ClaimedJob, Failure, FakeClock, ItemCode, Lease, ShardClient
from shardq.shard.backoff import Backoff
from shardq.shard.models import FailResult
from tests.support.shard import LEASE, NOW, claimed, claimed_hash, dedupe, job
from tests.support.state import dump, ttls

FAILED = NOW + 700
RETRY = NOW + 10_000


def failure(c: ClaimedJob, **kw: Any) -> Failure:
    return Failure(c.job_id, c.fence, c.attempt, kw.pop("error", "boom"), **kw)


async def test_a_failure_with_attempts_left_schedules_a_retry_at_retry_at(
    shard: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    (c,) = await claimed(shard, redis, job("J1"))
    clock.set(FAILED)
    assert await shard.fail([failure(c, retry_at_ms=RETRY)]) == [
        FailResult(ItemCode.OK, "scheduled")
    ]
    assert await dump(redis) == {
        "sq:job:J1": claimed_hash("J1", "scheduled", 1, ra=str(RETRY), e="boom"),
        "sq:fence": "1",
        "sq:due": [("acme", RETRY)],
        "sq:tscheduled:acme": [("J1", RETRY)],
        "sq:promoter_wake": ["1"],
        "sq:counts:acme": {
            "ready": "0", "active": "0", "scheduled": "1", "submitted": "1", "failed": "1",
            "bytes": "2",
        },
        "sq:tenants": {"acme"},
        **dedupe("J1"),
    }  # fmt: skip
    assert set(await ttls(redis)) == {"sq:dedupe:acme:rJ1"}


async def test_a_retry_later_than_the_next_due_job_does_not_wake_the_promoter(
    shard: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    (c,) = await claimed(shard, redis, job("J1"), job("J2", delay_ms=5_000))
    clock.set(FAILED)
    await shard.fail([failure(c, retry_at_ms=RETRY)])
    assert await redis.exists("sq:promoter_wake") == 0
    assert await redis.zrange("sq:tscheduled:acme", 0, -1) == [b"J2", b"J1"]
    assert await redis.zrange("sq:due", 0, -1, withscores=True) == [(b"acme", NOW + 5_000)]


@pytest.mark.parametrize("attempt", [1, 3, 20])
async def test_without_retry_at_the_retry_is_backed_off_within_the_ceiling(
    shard: ShardClient, redis: Redis, clock: FakeClock, attempt: int
) -> None:
    (c,) = await claimed(shard, redis, job("J1"))
    clock.set(FAILED)
    await shard.fail([Failure("J1", c.fence, attempt, "boom")])
    run_at = int(await redis.zscore("sq:tscheduled:acme", "J1"))
    assert FAILED <= run_at <= FAILED + shard.settings.backoff.ceiling_ms(attempt)


async def test_a_failure_on_the_last_attempt_sends_the_job_to_the_dead_set(
    shard: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    (c,) = await claimed(shard, redis, job("J1", max_attempts=1))
    clock.set(FAILED)
    assert await shard.fail([failure(c, retry_at_ms=RETRY)]) == [FailResult(ItemCode.OK, "dead")]
    assert await dump(redis) == {
        "sq:job:J1": claimed_hash("J1", "dead", 1, ma="1", fa=str(FAILED), e="boom"),
        "sq:fence": "1",
        "sq:dead:acme": [("J1", FAILED)],
        "sq:counts:acme": {
            "ready": "0", "active": "0", "dead": "1", "submitted": "1", "failed": "1",
            "bytes": "0",
        },
        "sq:tenants": {"acme"},
        **dedupe("J1"),
    }  # fmt: skip
    assert set(await ttls(redis)) == {"sq:dedupe:acme:rJ1"}


async def test_a_job_goes_dead_after_exactly_max_attempts(
    shard: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    await shard.enqueue([job("J1", max_attempts=3)])
    states = []
    for _ in range(3):
        (c,) = await shard.claim("w1", 1, LEASE)
        (res,) = await shard.fail([failure(c, retry_at_ms=clock.now_ms() + 10)])
        states.append((c.attempt, res.state))
        clock.advance(10)
        await shard.promote()
    assert states == [(1, "scheduled"), (2, "scheduled"), (3, "dead")]
    assert await shard.claim("w1", 1, LEASE) == []


async def test_failures_for_want_of_the_database_are_not_counted_up_to_their_cap(
    shard: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    """On its one and only attempt, a job whose handler could not reach the results database
    is handed back twice with its attempt given back; the third such failure counts, and the
    job that so ends dead goes to the outbox (its worker wrote no dead row)."""
    await shard.enqueue([job("J1", max_attempts=1)])
    seen = []
    for _ in range(3):
        clock.advance(1)
        (c,) = await shard.claim("w1", 1, LEASE)
        (res,) = await shard.fail([failure(c, store_retries_max=2, draw=0.0)])
        h = await redis.hmget("sq:job:J1", "at", "sr", "ra")
        seen.append((c.attempt, res.state, int(h[0]), int(h[1] or 0)))
        if res.state == "scheduled":
            # The backoff grows with the uncounted failures: 1 s, then 2 s (no jitter drawn).
            assert int(h[2]) - clock.now_ms() == 1000 * 2 ** (int(h[1]) - 1)
            clock.set(int(h[2]))
            await shard.promote()
    assert seen == [(1, "scheduled", 0, 1), (1, "scheduled", 0, 2), (1, "dead", 1, 2)]
    assert await redis.zrange("sq:outbox", 0, -1) == [b"J1"]
    assert await redis.zrange("sq:dead:acme", 0, -1) == [b"J1"]
    # A requeue gives the job its attempts and its uncounted ones back.
    assert (await shard.requeue_dead("acme", ["J1"]))[0] == 1
    assert await redis.hmget("sq:job:J1", "at", "sr") == [b"0", None]


async def test_a_failure_that_counts_writes_no_outbox_entry_for_its_dead_job(
    shard: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    """The handler's own failure on the last attempt: its worker writes the dead row."""
    (c,) = await claimed(shard, redis, job("J1", max_attempts=1))
    assert await shard.fail([failure(c)]) == [FailResult(ItemCode.OK, "dead")]
    assert await redis.exists("sq:outbox") == 0


async def test_a_permanent_failure_is_dead_at_once_whatever_attempts_remain(
    shard: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    (c,) = await claimed(shard, redis, job("J1", max_attempts=10))
    clock.set(FAILED)
    assert await shard.fail([failure(c, retry_at_ms=RETRY, permanent=True)]) == [
        FailResult(ItemCode.OK, "dead")
    ]
    state = await dump(redis)
    assert state["sq:job:J1"] == claimed_hash("J1", "dead", 1, ma="10", fa=str(FAILED), e="boom")
    assert state["sq:dead:acme"] == [("J1", FAILED)]
    assert "sq:due" not in state and "sq:tscheduled:acme" not in state


async def test_a_failure_of_a_job_cancelled_while_active_ends_it_as_cancelled(
    shard: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    (c,) = await claimed(shard, redis, job("J1"))
    await shard.cancel("acme", "J1")
    clock.set(FAILED)
    assert await shard.fail([failure(c, retry_at_ms=RETRY)]) == [
        FailResult(ItemCode.CANCELLED, "cancelled")
    ]
    assert await dump(redis) == {
        "sq:job:J1": claimed_hash("J1", "cancelled", 1, cx="1", fa=str(FAILED), e="boom"),
        "sq:fence": "1",
        # A worker writes no row for a failure: the shard loop writes the cancelled one.
        "sq:outbox": [("J1", FAILED)],
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


@pytest.mark.parametrize(
    ("stale", "state"),
    [("wrong-fence", "active"), ("acked", "succeeded"), ("failed", "scheduled"),
     ("reaped", "ready"), ("missing-job", "")],
)  # fmt: skip
async def test_a_failure_with_a_stale_fence_is_refused_and_changes_nothing(
    shard: ShardClient, redis: Redis, clock: FakeClock, stale: str, state: str
) -> None:
    (c,) = await claimed(shard, redis, job("J1"))
    f = failure(c, retry_at_ms=RETRY)
    if stale == "wrong-fence":
        f = Failure("J1", c.fence + 1, 1, "boom", retry_at_ms=RETRY)
    elif stale == "acked":
        await shard.ack([Lease("J1", c.fence)])
    elif stale == "failed":
        await shard.fail([f])
    elif stale == "reaped":
        clock.advance(LEASE)
        await shard.reap()
    else:
        f = Failure("NOSUCHJOB", 1, 1, "boom", retry_at_ms=RETRY)
    before = await dump(redis)
    clock.advance(1)
    assert await shard.fail([f]) == [FailResult(ItemCode.STALE_LEASE, state)]
    assert await dump(redis) == before


async def test_one_fail_call_answers_every_job_in_order(
    shard: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    c1, c2, c3 = await claimed(shard, redis, job("J1"), job("J2", max_attempts=1), job("J3"))
    await shard.cancel("acme", "J3")
    results = await shard.fail(
        [
            failure(c1, retry_at_ms=RETRY),
            failure(c2, retry_at_ms=RETRY),
            failure(c3, retry_at_ms=RETRY),
            Failure("J1", c1.fence, 1, "again", retry_at_ms=RETRY),
        ]
    )
    assert results == [
        FailResult(ItemCode.OK, "scheduled"),
        FailResult(ItemCode.OK, "dead"),
        FailResult(ItemCode.CANCELLED, "cancelled"),
        FailResult(ItemCode.STALE_LEASE, "scheduled"),
    ]


async def test_a_long_error_is_cut_to_4096_characters(
    shard: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    (c,) = await claimed(shard, redis, job("J1"))
    await shard.fail([failure(c, error="x" * 10_000, retry_at_ms=RETRY)])
    assert await redis.hget("sq:job:J1", "e") == b"x" * 4096


async def test_a_retried_job_is_claimed_again_with_the_next_attempt_and_a_new_fence(
    shard: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    (c,) = await claimed(shard, redis, job("J1"))
    await shard.fail([failure(c, retry_at_ms=RETRY)])
    clock.set(RETRY)
    assert await shard.promote() == (1, None)
    (again,) = await shard.claim("w2", 1, LEASE)
    assert (again.job_id, again.attempt, again.fence, again.run_at_ms) == ("J1", 2, 2, RETRY)


async def test_a_failure_of_no_jobs_sends_nothing(shard: ShardClient, redis: Redis) -> None:
    await redis.config_resetstat()
    assert await shard.fail([]) == []
    assert "cmdstat_evalsha" not in await redis.info("commandstats")


# --- the backoff: fail.lua computes every wait ------------------------------------------------


async def retry_wait(shard: ShardClient, redis: Redis, attempt: int, f: Failure) -> int:
    """The wait fail.lua gives the claimed job J1 after its ``attempt``-th failure (one
    attempt left: it is retried)."""
    await redis.hset("sq:job:J1", mapping={"at": attempt, "ma": attempt + 1})
    assert await shard.fail([f]) == [FailResult(ItemCode.OK, "scheduled")]
    return int(await redis.zscore("sq:tscheduled:acme", "J1")) - FAILED


@pytest.mark.parametrize(
    ("attempt", "draw", "wait"),
    [
        (1, 0.0, 1_000),  # full jitter drawn at 0: the whole ceiling
        (1, 0.5, 500),
        (3, 0.0, 4_000),
        (3, 0.75, 1_000),
        (13, 0.0, 3_600_000),  # the cap
        (1_000, 0.0, 3_600_000),  # a huge attempt: the exponent stops at 40, the cap holds
        (2, 0.999999, 0),
    ],
)
async def test_the_server_default_doubles_from_one_second_to_an_hour_with_full_jitter(
    shard: ShardClient, redis: Redis, clock: FakeClock, attempt: int, draw: float, wait: int
) -> None:
    (c,) = await claimed(shard, redis, job("J1"))
    clock.set(FAILED)
    assert await retry_wait(shard, redis, attempt, failure(c, draw=draw)) == wait


@pytest.mark.parametrize(("attempt", "wait"), [(1, 250), (2, 500), (4, 2_000), (9, 8_000)])
async def test_the_handlers_policy_replaces_the_default(
    shard: ShardClient, redis: Redis, clock: FakeClock, attempt: int, wait: int
) -> None:
    (c,) = await claimed(shard, redis, job("J1"))
    clock.set(FAILED)
    handler_policy = Backoff(base_ms=250, cap_ms=8_000, jitter=0.0)
    f = failure(c, backoff=handler_policy, draw=0.9)  # no jitter: the draw does not matter
    assert await retry_wait(shard, redis, attempt, f) == wait


async def test_jitter_takes_at_most_its_fraction_off_the_wait(
    shard: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    (c,) = await claimed(shard, redis, job("J1"))
    clock.set(FAILED)
    f = failure(c, backoff=Backoff(10_000, 60_000, 0.25), draw=0.5)
    assert await retry_wait(shard, redis, 1, f) == 10_000 - 1_250


async def test_the_jobs_own_policy_wins_field_by_field_and_is_kept_on_the_job(
    shard: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    # The job sets base (5 s) and jitter (0.5); max comes from the handler's policy (8 s).
    (c,) = await claimed(shard, redis, job("J1", retry=Backoff(5_000, 0, 0.5)))
    clock.set(FAILED)
    f = failure(c, backoff=Backoff(base_ms=250, cap_ms=8_000, jitter=0.0), draw=0.5)
    # Attempt 1: min(8000, 5000) = 5000, minus 5000 * 0.5 * 0.5.
    assert await shard.fail([f]) == [FailResult(ItemCode.OK, "scheduled")]
    retry_at = FAILED + 3_750
    assert await dump(redis) == {
        "sq:job:J1": claimed_hash(
            "J1", "scheduled", 1, ra=str(retry_at), e="boom", rb="5000 0 0.5"
        ),
        "sq:fence": "1",
        "sq:due": [("acme", retry_at)],
        "sq:tscheduled:acme": [("J1", retry_at)],
        "sq:promoter_wake": ["1"],
        "sq:counts:acme": {
            "ready": "0", "active": "0", "scheduled": "1", "submitted": "1", "failed": "1",
            "bytes": "2",
        },
        "sq:tenants": {"acme"},
        **dedupe("J1"),
    }  # fmt: skip
    rec = await shard.get_job("acme", "J1")
    assert (rec.retry, rec.next_attempt_at_ms) == (Backoff(5_000, 0, 0.5), retry_at)


async def test_the_jobs_cap_applies_over_the_default(
    shard: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    (c,) = await claimed(shard, redis, job("J1", retry=Backoff(0, 3_000, 0.0)))
    clock.set(FAILED)
    # Default base 1 s doubling, the job's cap 3 s, the job's jitter unset: the default's (1).
    assert await retry_wait(shard, redis, 5, failure(c, draw=0.0)) == 3_000


async def test_a_retry_later_wait_overrides_every_policy(
    shard: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    (c,) = await claimed(shard, redis, job("J1", retry=Backoff(60_000, 0, 0.0)))
    clock.set(FAILED)
    f = failure(c, retry_at_ms=FAILED + 123, backoff=Backoff(50_000, 90_000, 0.0), draw=0.0)
    assert await retry_wait(shard, redis, 1, f) == 123


async def test_a_permanent_failure_is_dead_whatever_the_policy(
    shard: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    (c,) = await claimed(shard, redis, job("J1", retry=Backoff(5_000, 0, 0.0)))
    clock.set(FAILED)
    assert await shard.fail([failure(c, permanent=True)]) == [FailResult(ItemCode.OK, "dead")]
    assert await redis.zscore("sq:dead:acme", "J1") == FAILED
