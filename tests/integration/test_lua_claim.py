"""claim.lua: seed ready jobs, claim, assert the whole resulting keyspace and what was claimed."""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis

from shardq.shard import ClaimedJob, FakeClock, ShardClient, ShardSettings, TenantLimits
from tests.support.shard import (
    LEASE,
    NOW,
    WAKE,
    P,
    claimed_hash,
    dedupe,
    job,
    job_hash,
    ready_keys,
    ring_keys,
    seed,
)
from tests.support.state import dump

#: Keys that hold ready jobs or who may be served; gone when nothing is ready.
READY_STRUCTURES = ("sq:ready", "sq:tprio", "sq:tqueues", "sq:qring", "sq:inring", "sq:qcredit")


def active(jid: str, fence: int, tenant: str = "acme", **over: str) -> dict[str, str]:
    return claimed_hash(jid, "active", fence, tenant, **over)


async def claim_ids(
    shard: ShardClient, max_jobs: int, queues: tuple[str, ...] = ("default",)
) -> list[str]:
    return [c.job_id for c in await shard.claim("w1", max_jobs, LEASE, queues)]


async def test_claim_on_an_empty_shard_returns_nothing_and_writes_nothing(
    shard: ShardClient, redis: Redis
) -> None:
    assert await shard.claim("w1", 10, LEASE) == []
    assert await dump(redis) == {}


async def test_claiming_the_only_ready_job_leases_it_with_a_fresh_fence(
    shard: ShardClient, redis: Redis
) -> None:
    await seed(shard, redis, job("J1", priority=4, max_attempts=3, timeout_ms=9_000))
    (claimed,) = await shard.claim("w1", 1, LEASE)
    assert claimed == ClaimedJob(
        job_id="J1", fence=1, tenant="acme", request_id="rJ1", handler="h", payload=P,
        priority=4, run_at_ms=NOW, created_at_ms=NOW, attempt=1, max_attempts=3,
        timeout_ms=9_000, queue="default", started_at_ms=NOW, at_once=True,
    )  # fmt: skip
    assert await dump(redis) == {
        "sq:job:J1": active("J1", 1, pr="4", ma="3", to="9000"),
        "sq:fence": "1",
        "sq:leases": [("J1", NOW + LEASE)],
        "sq:tactive:acme": [("J1", NOW)],
        "sq:counts:acme": {"ready": "0", "active": "1", "submitted": "1", "bytes": "2"},
        "sq:tenants": {"acme"},
        **dedupe("J1"),
    }


async def test_claim_gives_a_tenants_highest_priority_first_and_fences_grow(
    shard: ShardClient, redis: Redis
) -> None:
    await seed(shard, redis, *(job(f"P{p}", priority=p) for p in (3, 9, 0, 5)))
    claimed = await shard.claim("w1", 10, LEASE)
    assert [(c.job_id, c.fence) for c in claimed] == [("P9", 1), ("P5", 2), ("P3", 3), ("P0", 4)]
    state = await dump(redis)
    assert state["sq:fence"] == "4"
    assert state["sq:leases"] == [(f"P{p}", NOW + LEASE) for p in (0, 3, 5, 9)]
    assert not [k for k in state if k.startswith((*READY_STRUCTURES, "sq:wake"))]


async def test_fences_grow_by_one_over_claims_of_one_job_and_of_several(
    shard: ShardClient, redis: Redis
) -> None:
    # A claim of one job takes its fence with one INCR; a claim of more counts on from it
    # and writes the last back: no fence is given twice, none is skipped.
    await seed(shard, redis, *(job(f"J{n}") for n in range(6)))
    fences = [c.fence for c in await shard.claim("w1", 1, LEASE)]
    assert (fences, await redis.get("sq:fence")) == ([1], b"1")
    fences += [c.fence for c in await shard.claim("w1", 3, LEASE)]
    assert (fences, await redis.get("sq:fence")) == ([1, 2, 3, 4], b"4")
    fences += [c.fence for c in await shard.claim("w1", 1, LEASE)]
    fences += [c.fence for c in await shard.claim("w1", 5, LEASE)]
    assert (fences, await redis.get("sq:fence")) == ([1, 2, 3, 4, 5, 6], b"6")
    assert await shard.claim("w1", 5, LEASE) == []  # nothing to claim: no fence taken
    assert await redis.get("sq:fence") == b"6"


async def test_jobs_of_one_tenant_and_priority_are_claimed_in_submission_order(
    shard: ShardClient, redis: Redis
) -> None:
    await seed(shard, redis, *(job(f"J{i}") for i in range(5)))
    assert await claim_ids(shard, 2) == ["J0", "J1"]
    assert await claim_ids(shard, 2) == ["J2", "J3"]
    assert await claim_ids(shard, 2) == ["J4"]
    assert await claim_ids(shard, 2) == []


async def test_claim_skips_ids_of_jobs_cancelled_while_ready(
    shard: ShardClient, redis: Redis
) -> None:
    await seed(shard, redis, job("J1"), job("J2"), job("J3"))
    await shard.cancel("acme", "J2")
    assert await claim_ids(shard, 3) == ["J1", "J3"]
    state = await dump(redis)
    assert state["sq:job:J2"] == job_hash("J2", "cancelled", fa=str(NOW))
    assert state["sq:job:J3"] == active("J3", 2)
    assert state["sq:counts:acme"] == {"ready": "0", "active": "2", "submitted": "3", "bytes": "4"}
    assert not [k for k in state if k.startswith(READY_STRUCTURES)]


async def test_a_list_of_only_cancelled_ids_is_drained_and_its_tenant_leaves_the_ring(
    shard: ShardClient, redis: Redis
) -> None:
    await seed(shard, redis, job("J1"), job("J2"))
    await shard.cancel("acme", "J1")
    await shard.cancel("acme", "J2")
    assert await redis.lrange("sq:ready:acme:default:0", 0, -1) == [b"J1", b"J2"]
    before = await dump(redis)
    assert await claim_ids(shard, 5) == []
    for key in [*ready_keys("acme", {0: []}), *ring_keys("default")]:
        del before[key]
    assert await dump(redis) == before


async def test_skipping_is_capped_per_call_and_leaves_a_wake_token_for_the_rest(
    shard: ShardClient, redis: Redis
) -> None:
    await seed(shard, redis, *(job(f"C{i}") for i in range(1_001)), job("J1"))
    for i in range(1_001):
        await shard.cancel("acme", f"C{i}")
    assert await claim_ids(shard, 5) == []
    assert await redis.lrange(WAKE, 0, -1) == [b"1"]
    assert await redis.lrange("sq:ready:acme:default:0", 0, -1) == [b"C1000", b"J1"]
    assert await claim_ids(shard, 5) == ["J1"]


@pytest.mark.parametrize(
    ("ready", "max_jobs", "wake"),
    [(3, 2, ["1"]), (2, 2, None), (1, 5, None)],
    ids=["batch-full-work-remains", "batch-full-nothing-left", "batch-not-full"],
)
async def test_claim_leaves_a_wake_token_only_when_its_batch_filled_and_work_remains(
    shard: ShardClient, redis: Redis, ready: int, max_jobs: int, wake: list[str] | None
) -> None:
    await seed(shard, redis, *(job(f"J{i}") for i in range(ready)))
    await claim_ids(shard, max_jobs)
    assert (await dump(redis)).get(WAKE) == wake


async def test_work_remaining_at_a_lower_priority_also_leaves_a_wake_token(
    shard: ShardClient, redis: Redis
) -> None:
    await seed(shard, redis, job("J1", priority=9), job("J2", priority=1))
    assert await claim_ids(shard, 1) == ["J1"]
    assert await redis.lrange(WAKE, 0, -1) == [b"1"]


async def test_tenants_of_one_priority_take_turns(shard: ShardClient, redis: Redis) -> None:
    await seed(
        shard,
        redis,
        *(job(f"A{i}") for i in range(3)),
        *(job(f"B{i}", tenant="bravo") for i in range(3)),
    )
    assert await claim_ids(shard, 6) == ["A0", "B0", "A1", "B1", "A2", "B2"]


async def test_turns_carry_over_between_claim_calls(shard: ShardClient, redis: Redis) -> None:
    await seed(
        shard,
        redis,
        *(job(f"A{i}") for i in range(3)),
        *(job(f"B{i}", tenant="bravo") for i in range(3)),
    )
    assert [await claim_ids(shard, 1) for _ in range(4)] == [["A0"], ["B0"], ["A1"], ["B1"]]
    assert await redis.lrange("sq:qring:default", 0, -1) == [b"acme", b"bravo"]


@pytest.mark.parametrize("weight", [2, 3, 5])
async def test_a_tenant_of_weight_w_gets_w_jobs_per_turn(
    shard: ShardClient, redis: Redis, weight: int
) -> None:
    await shard.set_limits("acme", TenantLimits(weight=weight))
    await seed(
        shard,
        redis,
        *(job(f"A{i}") for i in range(2 * weight)),
        *(job(f"B{i}", tenant="bravo") for i in range(3)),
    )
    got = await claim_ids(shard, 2 * weight + 3)
    turn = ["A"] * weight + ["B"]
    assert [jid[0] for jid in got] == turn + turn + ["B"]
    state = await dump(redis)
    assert state["sq:limits:acme"] == {"weight": str(weight)}
    assert "sq:qcredit:default" not in state


async def test_a_weighted_tenant_keeps_its_credit_between_calls(
    shard: ShardClient, redis: Redis
) -> None:
    await shard.set_limits("acme", TenantLimits(weight=3))
    await seed(shard, redis, *(job(f"A{i}") for i in range(5)), job("B0", tenant="bravo"))
    assert await claim_ids(shard, 2) == ["A0", "A1"]
    assert await redis.hgetall("sq:qcredit:default") == {b"acme": b"2"}
    assert await claim_ids(shard, 2) == ["A2", "B0"]
    assert await redis.exists("sq:qcredit:default") == 0


async def test_a_weight_gives_its_turns_whatever_priorities_the_other_tenants_use(
    shard: ShardClient, redis: Redis
) -> None:
    # Was test_weights_apply_per_priority (Z1 first, then acme's and bravo's turns at 5):
    # zulu's priority 9 now only orders zulu's own jobs; it waits for its turn on the ring.
    await shard.set_limits("acme", TenantLimits(weight=2))
    await seed(
        shard,
        redis,
        *(job(f"A{i}", priority=5) for i in range(4)),
        *(job(f"B{i}", tenant="bravo", priority=5) for i in range(2)),
        job("Z1", tenant="zulu", priority=9),
    )
    assert await claim_ids(shard, 7) == ["A0", "A1", "B0", "Z1", "A2", "A3", "B1"]


async def test_a_tenants_priority_never_puts_it_before_another_tenants_turn(
    shard: ShardClient, redis: Redis
) -> None:
    # Was test_a_higher_priority_tenant_goes_before_any_lower_one (["B0", "A0"]): tenants
    # take turns first, so acme, first on the ring, is served before bravo's priority 8.
    await seed(
        shard,
        redis,
        *(job(f"A{i}", priority=1) for i in range(3)),
        job("B0", tenant="bravo", priority=8),
    )
    assert await claim_ids(shard, 2) == ["A0", "B0"]


async def test_within_its_turn_a_tenant_gives_its_most_urgent_job_first(
    shard: ShardClient, redis: Redis
) -> None:
    await seed(
        shard,
        redis,
        job("A1", priority=1),
        job("A8", priority=8),
        job("B5", tenant="bravo", priority=5),
        job("B9", tenant="bravo", priority=9),
        job("A8b", priority=8),
    )
    assert await claim_ids(shard, 5) == ["A8", "B9", "A8b", "B5", "A1"]
    state = await dump(redis)
    assert not [k for k in state if k.startswith(READY_STRUCTURES)]


async def test_a_tenants_priorities_and_queues_are_kept_as_its_lists_fill_and_empty(
    shard: ShardClient, redis: Redis
) -> None:
    await seed(shard, redis, job("A1", priority=1), job("A8", priority=8), job("M1", queue="m"))
    assert await claim_ids(shard, 1) == ["A8"]
    state = await dump(redis)
    assert {k: v for k, v in state.items() if k.startswith(READY_STRUCTURES)} == {
        **ready_keys("acme", {1: ["A1"]}),
        **ready_keys("acme", {0: ["M1"]}, queue="m"),
        "sq:tqueues:acme": {"default", "m"},
        **ring_keys("default", "acme"),
        **ring_keys("m", "acme"),
    }


async def test_a_claim_for_some_queues_never_takes_a_job_of_another_queue(
    shard: ShardClient, redis: Redis
) -> None:
    await seed(
        shard,
        redis,
        job("B1", queue="b", priority=9),
        job("A1", queue="a"),
        job("B2", tenant="bravo", queue="b"),
        job("D1"),
    )
    assert await claim_ids(shard, 10, ("a",)) == ["A1"]
    assert await claim_ids(shard, 10, ("a",)) == []
    assert await claim_ids(shard, 10, ("a", "c")) == []
    assert await claim_ids(shard, 10, ("b",)) == ["B1", "B2"]
    claimed = await shard.claim("w1", 10, LEASE, ["default", "b"])
    assert [(c.job_id, c.queue) for c in claimed] == [("D1", "default")]


async def test_a_claim_of_several_queues_takes_one_job_from_each_in_turn(
    shard: ShardClient, redis: Redis
) -> None:
    await seed(
        shard,
        redis,
        *(job(f"A{i}", queue="a") for i in range(3)),
        *(job(f"B{i}", queue="b") for i in range(1)),
        *(job(f"C{i}", queue="c") for i in range(2)),
    )
    assert await claim_ids(shard, 5, ("c", "a", "b")) == ["C0", "A0", "B0", "C1", "A1"]
    assert await claim_ids(shard, 5, ("b", "a")) == ["A2"]


async def test_each_queue_has_its_own_ring_and_credit(shard: ShardClient, redis: Redis) -> None:
    await shard.set_limits("acme", TenantLimits(weight=2))
    await seed(
        shard,
        redis,
        *(job(f"A{i}", queue="a") for i in range(3)),
        job("X1", tenant="bravo", queue="a"),
        *(job(f"M{i}", queue="m") for i in range(3)),
        job("Y1", tenant="bravo", queue="m"),
    )
    assert await claim_ids(shard, 1, ("a",)) == ["A0"]
    assert await claim_ids(shard, 1, ("m",)) == ["M0"]
    assert await redis.hgetall("sq:qcredit:a") == {b"acme": b"1"}
    assert await redis.hgetall("sq:qcredit:m") == {b"acme": b"1"}
    assert await claim_ids(shard, 3, ("a",)) == ["A1", "X1", "A2"]
    assert await claim_ids(shard, 3, ("m",)) == ["M1", "Y1", "M2"]


async def test_claim_records_the_worker_and_counts_the_attempt(
    shard: ShardClient, redis: Redis
) -> None:
    await seed(shard, redis, job("J1"))
    (c,) = await shard.claim("worker-7", 1, 1_000)
    assert c.attempt == 1
    raw = await redis.hgetall("sq:job:J1")
    assert (raw[b"w"], raw[b"at"], raw[b"f"], raw[b"sa"]) == (b"worker-7", b"1", b"1", b"%d" % NOW)
    assert await redis.zscore("sq:leases", "J1") == NOW + 1_000


# -- a claim that waits for work (claim(wait_s=...): BLPOP and claim.lua in one round trip) --


async def test_a_waiting_claim_takes_the_job_enqueued_while_it_waits(
    shard: ShardClient, redis: Redis
) -> None:
    waiting = asyncio.create_task(shard.claim("w1", 5, LEASE, wait_s=30))
    await asyncio.sleep(0.2)
    assert not waiting.done()  # nothing ready, no wake-up token: it waits
    await shard.enqueue([job("J1")])
    async with asyncio.timeout(20):  # well inside its 30 s wait: the enqueue's token woke it
        (claimed,) = await waiting
    assert (claimed.job_id, claimed.fence) == ("J1", 1)
    assert (await dump(redis)).get(WAKE) is None  # the token was taken, none left behind


async def test_a_waiting_claim_with_nothing_ready_returns_nothing_when_its_wait_ends(
    shard: ShardClient, redis: Redis
) -> None:
    assert await shard.claim("w1", 5, LEASE, wait_s=0.1) == []
    assert await dump(redis) == {}


async def test_a_waiting_claim_reloads_a_flushed_script_and_does_not_wait_again(
    shard: ShardClient, redis: Redis
) -> None:
    """The BLPOP took the wake-up token and the claim found its script gone (a restarted
    Redis): the script is loaded and the claim runs again alone, not behind a second wait."""
    await shard.enqueue([job("J1")])  # ready, with its wake-up token
    await redis.script_flush()
    async with asyncio.timeout(20):
        claimed = await shard.claim("w1", 5, LEASE, wait_s=60)
    assert [c.job_id for c in claimed] == ["J1"]


async def test_a_claim_of_more_jobs_than_one_zadd_takes_leases_them_all(
    redis: Redis, clock: FakeClock
) -> None:
    """A call's leases and active-set entries go in at its end, in pieces of 500 jobs (Lua's
    unpack fails past ~8,000 values, a score and an ID a job): a claim of 4,100 (a client
    whose batches are larger than the usual 500) leases each."""
    n = 4_100
    shard = ShardClient(redis, ShardSettings(key_prefix="sq", max_batch=n + 1), clock)
    await seed(shard, redis, *(job(f"J{i}") for i in range(n)), job("B1", "beta"))
    got = await shard.claim("w1", n + 1, LEASE)
    assert len(got) == n + 1
    assert await redis.zcard("sq:leases") == n + 1
    assert await redis.zcard("sq:tactive:acme") == n
    assert await redis.zrange("sq:tactive:beta", 0, -1, withscores=True) == [(b"B1", NOW)]
    assert await redis.zscore("sq:leases", f"J{n - 1}") == NOW + LEASE
