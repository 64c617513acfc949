"""claim.lua: seed ready jobs, claim, assert the whole resulting keyspace and what was claimed."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from shardq.shard import ClaimedJob, ShardClient
from tests.support.shard import LEASE, NOW, P, claimed_hash, dedupe, job, job_hash, seed
from tests.support.state import dump


def active(jid: str, fence: int, tenant: str = "acme", **over: str) -> dict[str, str]:
    return claimed_hash(jid, "active", fence, tenant, **over)


async def claim_ids(shard: ShardClient, max_jobs: int) -> list[str]:
    return [c.job_id for c in await shard.claim("w1", max_jobs, LEASE)]


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
        timeout_ms=9_000,
    )  # fmt: skip
    assert await dump(redis) == {
        "sq:job:J1": active("J1", 1, pr="4", ma="3", to="9000"),
        "sq:fence": "1",
        "sq:leases": [("J1", NOW + LEASE)],
        "sq:tactive:acme": [("J1", NOW)],
        "sq:counts:acme": {"ready": "0", "active": "1", "submitted": "1"},
        "sq:tenants": {"acme"},
        **dedupe("J1"),
    }


async def test_claim_gives_the_highest_priority_first_and_fences_grow(
    shard: ShardClient, redis: Redis
) -> None:
    await seed(shard, redis, *(job(f"P{p}", priority=p) for p in (3, 9, 0, 5)))
    claimed = await shard.claim("w1", 10, LEASE)
    assert [(c.job_id, c.fence) for c in claimed] == [("P9", 1), ("P5", 2), ("P3", 3), ("P0", 4)]
    state = await dump(redis)
    assert state["sq:fence"] == "4"
    assert state["sq:leases"] == [(f"P{p}", NOW + LEASE) for p in (0, 3, 5, 9)]
    assert not [k for k in state if k.startswith(("sq:ready", "sq:ring", "sq:wake"))]


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
    assert state["sq:counts:acme"] == {"ready": "0", "active": "2", "submitted": "3"}
    assert "sq:ready:acme:0" not in state
    assert "sq:ring:0" not in state


async def test_a_list_of_only_cancelled_ids_is_drained_and_its_tenant_leaves_the_ring(
    shard: ShardClient, redis: Redis
) -> None:
    await seed(shard, redis, job("J1"), job("J2"))
    await shard.cancel("acme", "J1")
    await shard.cancel("acme", "J2")
    assert await redis.lrange("sq:ready:acme:0", 0, -1) == [b"J1", b"J2"]
    before = await dump(redis)
    assert await claim_ids(shard, 5) == []
    del before["sq:ready:acme:0"], before["sq:ring:0"]
    assert await dump(redis) == before


async def test_skipping_is_capped_per_call_and_leaves_a_wake_token_for_the_rest(
    shard: ShardClient, redis: Redis
) -> None:
    await seed(shard, redis, *(job(f"C{i}") for i in range(1_001)), job("J1"))
    for i in range(1_001):
        await shard.cancel("acme", f"C{i}")
    assert await claim_ids(shard, 5) == []
    assert await redis.lrange("sq:wake", 0, -1) == [b"1"]
    assert await redis.lrange("sq:ready:acme:0", 0, -1) == [b"C1000", b"J1"]
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
    assert (await dump(redis)).get("sq:wake") == wake


async def test_work_remaining_at_a_lower_priority_also_leaves_a_wake_token(
    shard: ShardClient, redis: Redis
) -> None:
    await seed(shard, redis, job("J1", priority=9), job("J2", priority=1))
    assert await claim_ids(shard, 1) == ["J1"]
    assert await redis.lrange("sq:wake", 0, -1) == [b"1"]


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
    assert await redis.lrange("sq:ring:0", 0, -1) == [b"acme", b"bravo"]


@pytest.mark.parametrize("weight", [2, 3, 5])
async def test_a_tenant_of_weight_w_gets_w_jobs_per_turn(
    shard: ShardClient, redis: Redis, weight: int
) -> None:
    await shard.set_weight("acme", weight)
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
    assert state["sq:weights"] == {"acme": str(weight)}
    assert "sq:credit:0" not in state


async def test_a_weighted_tenant_keeps_its_credit_between_calls(
    shard: ShardClient, redis: Redis
) -> None:
    await shard.set_weight("acme", 3)
    await seed(shard, redis, *(job(f"A{i}") for i in range(5)), job("B0", tenant="bravo"))
    assert await claim_ids(shard, 2) == ["A0", "A1"]
    assert await redis.hgetall("sq:credit:0") == {b"acme": b"2"}
    assert await claim_ids(shard, 2) == ["A2", "B0"]
    assert await redis.exists("sq:credit:0") == 0


async def test_weights_apply_per_priority(shard: ShardClient, redis: Redis) -> None:
    await shard.set_weight("acme", 2)
    await seed(
        shard,
        redis,
        *(job(f"A{i}", priority=5) for i in range(4)),
        *(job(f"B{i}", tenant="bravo", priority=5) for i in range(2)),
        job("Z1", tenant="zulu", priority=9),
    )
    assert await claim_ids(shard, 7) == ["Z1", "A0", "A1", "B0", "A2", "A3", "B1"]


async def test_a_higher_priority_tenant_goes_before_any_lower_one(
    shard: ShardClient, redis: Redis
) -> None:
    await seed(
        shard,
        redis,
        *(job(f"A{i}", priority=1) for i in range(3)),
        job("B0", tenant="bravo", priority=8),
    )
    assert await claim_ids(shard, 2) == ["B0", "A0"]


async def test_claim_records_the_worker_and_counts_the_attempt(
    shard: ShardClient, redis: Redis
) -> None:
    await seed(shard, redis, job("J1"))
    (c,) = await shard.claim("worker-7", 1, 1_000)
    assert c.attempt == 1
    raw = await redis.hgetall("sq:job:J1")
    assert (raw[b"w"], raw[b"at"], raw[b"f"], raw[b"sa"]) == (b"worker-7", b"1", b"1", b"%d" % NOW)
    assert await redis.zscore("sq:leases", "J1") == NOW + 1_000
