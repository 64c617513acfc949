"""enqueue.lua: seed a state, enqueue, assert the whole resulting keyspace and every code."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import pytest
from redis.asyncio import Redis

from shardq.shard import (
    FakeClock,
    ItemCode,
    Lease,
    NewJob,
    ShardClient,
    ShardSettings,
    TenantLimits,
)
from shardq.shard.client import digest
from shardq.shard.models import Failure
from tests.support.shard import LEASE, NOW, WAKE, ready_alone, seed
from tests.support.shard import job_hash as shard_job_hash
from tests.support.state import dump, ttls

P = b'{"to":"a@example.com"}'


def job(tenant: str = "acme", request_id: str = "r1", **kw: Any) -> NewJob:
    return NewJob(
        tenant=tenant,
        handler=kw.pop("handler", "email.send"),
        payload=kw.pop("payload", P),
        request_id=request_id,
        job_id=kw.pop("job_id", "J1"),
        **kw,
    )


def job_hash(state: str, run_at: int = NOW, **over: str) -> dict[str, str]:
    """The hash of ``job()``: job J1 of request r1, handler email.send, payload P."""
    this_job = {"r": "r1", "h": "email.send", "p": P.decode(), "ra": str(run_at)}
    return shard_job_hash("J1", state, **(this_job | over))


DEDUPE = f"J1 {digest('email.send', P)}"


async def test_a_job_due_now_is_ready_and_wakes_one_worker(
    shard: ShardClient, redis: Redis
) -> None:
    (res,) = await shard.enqueue([job()])
    assert (res.code, res.job_id, res.state) == (ItemCode.OK, "J1", "ready")
    assert await dump(redis) == {
        "sq:job:J1": job_hash("ready"),
        **ready_alone("acme", {0: ["J1"]}),
        "sq:dedupe:acme:r1": DEDUPE,
        "sq:counts:acme": {"ready": "1", "submitted": "1", "bytes": str(len(P))},
        "sq:tenants": {"acme"},
        WAKE: ["1"],
    }
    assert set(await ttls(redis)) == {"sq:dedupe:acme:r1"}


async def test_a_future_job_is_scheduled_and_wakes_the_promoter(
    shard: ShardClient, redis: Redis
) -> None:
    (res,) = await shard.enqueue([job(delay_ms=5_000, priority=7)])
    assert (res.code, res.state) == (ItemCode.OK, "scheduled")
    assert await dump(redis) == {
        "sq:job:J1": job_hash("scheduled", NOW + 5_000, pr="7"),
        "sq:due": [("acme", NOW + 5_000)],
        "sq:tscheduled:acme": [("J1", NOW + 5_000)],
        "sq:promoter_wake": ["1"],
        "sq:dedupe:acme:r1": DEDUPE,
        "sq:counts:acme": {"scheduled": "1", "submitted": "1", "bytes": str(len(P))},
        "sq:tenants": {"acme"},
    }


async def test_a_later_job_than_the_next_due_does_not_wake_the_promoter(
    shard: ShardClient, redis: Redis
) -> None:
    await shard.enqueue([job(delay_ms=1_000)])
    await redis.delete("sq:promoter_wake")
    await shard.enqueue([job(request_id="r2", job_id="J2", delay_ms=2_000)])
    assert await redis.exists("sq:promoter_wake") == 0
    await shard.enqueue([job(request_id="r3", job_id="J3", delay_ms=500)])
    assert await redis.lrange("sq:promoter_wake", 0, -1) == [b"1"]


async def test_run_at_in_the_past_is_ready_at_once(shard: ShardClient) -> None:
    (res,) = await shard.enqueue([job(run_at_ms=NOW - 60_000)])
    assert res.state == "ready"


async def test_same_request_id_and_payload_returns_the_first_job(
    shard: ShardClient, redis: Redis
) -> None:
    await shard.enqueue([job()])
    before = await dump(redis)
    (res,) = await shard.enqueue([job(job_id="J2")])
    assert (res.code, res.job_id, res.state, res.deduplicated) == (
        ItemCode.DEDUPLICATED, "J1", "ready", True,
    )  # fmt: skip
    assert await dump(redis) == before


async def test_same_request_id_with_another_payload_is_a_conflict(
    shard: ShardClient, redis: Redis
) -> None:
    await shard.enqueue([job()])
    before = await dump(redis)
    (res,) = await shard.enqueue([job(job_id="J2", payload=b'{"to":"b@example.com"}')])
    assert (res.code, res.job_id) == (ItemCode.CONFLICT, "J1")
    (res,) = await shard.enqueue([job(job_id="J3", handler="email.other")])
    assert (res.code, res.job_id) == (ItemCode.CONFLICT, "J1")
    assert await dump(redis) == before


async def test_a_repeat_that_differs_only_outside_handler_and_payload_is_the_first_job(
    shard: ShardClient, redis: Redis
) -> None:
    """What the proto promises (JobSpec.request_id): only handler and payload are compared;
    a repeat with another priority, queue, delay or attempts gets the first job, unchanged."""
    await shard.enqueue([job()])
    before = await dump(redis)
    (res,) = await shard.enqueue(
        [job(job_id="J2", priority=9, queue="mail", delay_ms=60_000, max_attempts=2)]
    )
    assert (res.code, res.job_id, res.deduplicated) == (ItemCode.DEDUPLICATED, "J1", True)
    assert await dump(redis) == before


async def test_request_ids_are_per_tenant(shard: ShardClient) -> None:
    a, b = await shard.enqueue([job(), job(tenant="bravo", job_id="J2")])
    assert (a.code, b.code, b.job_id) == (ItemCode.OK, ItemCode.OK, "J2")


async def test_a_duplicate_inside_one_batch_is_deduplicated(shard: ShardClient) -> None:
    a, b = await shard.enqueue([job(), job(job_id="J2")])
    assert (a.code, b.code, b.job_id) == (ItemCode.OK, ItemCode.DEDUPLICATED, "J1")


async def test_dedupe_expires_after_the_window(
    shard: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    await shard.enqueue([job()])
    ttl = await redis.pttl("sq:dedupe:acme:r1")
    assert 0 < ttl <= shard.settings.dedupe_ttl_ms
    # A window of 200 ms (Redis expires the key on its own clock, not the fake one): inside
    # it the same request_id is the first job, after it a new one.
    short = ShardClient(redis, replace(shard.settings, dedupe_ttl_ms=200), clock)
    (first,) = await short.enqueue([job(request_id="r2", job_id="J2")])
    assert first.code is ItemCode.OK
    (again,) = await short.enqueue([job(request_id="r2", job_id="J3")])
    assert (again.code, again.job_id) == (ItemCode.DEDUPLICATED, "J2")
    async with asyncio.timeout(30):
        while await redis.exists("sq:dedupe:acme:r2"):
            await asyncio.sleep(0.02)
    (after,) = await short.enqueue([job(request_id="r2", job_id="J3")])
    assert (after.code, after.job_id) == (ItemCode.OK, "J3")
    assert await redis.get("sq:dedupe:acme:r2") == f"J3 {digest('email.send', P)}".encode()


async def test_over_quota_is_refused_and_writes_nothing(shard: ShardClient, redis: Redis) -> None:
    limits = TenantLimits(max_pending=1)
    await shard.enqueue([job(limits=limits)])
    before = await dump(redis)
    (res,) = await shard.enqueue([job(request_id="r2", job_id="J2", limits=limits)])
    assert res.code is ItemCode.OVER_QUOTA and res.retry_after_ms > 0
    assert await dump(redis) == before


async def test_the_quota_counts_the_jobs_made_earlier_in_the_same_batch(
    shard: ShardClient, redis: Redis
) -> None:
    # counts:{t} is written once per tenant at the end of the call: the check must still see
    # the batch's own jobs, ready and scheduled alike.
    limits = TenantLimits(max_pending=2)
    results = await shard.enqueue(
        [
            job(request_id="r1", job_id="J1", limits=limits),
            job(request_id="r2", job_id="J2", limits=limits, delay_ms=5_000),
            job(request_id="r3", job_id="J3", limits=limits),
        ]
    )
    assert [r.code for r in results] == [ItemCode.OK, ItemCode.OK, ItemCode.OVER_QUOTA]
    assert await redis.hgetall("sq:counts:acme") == {
        b"ready": b"1",
        b"scheduled": b"1",
        b"submitted": b"2",
        b"bytes": str(2 * len(P)).encode(),
    }


async def test_each_job_of_a_batch_is_held_to_its_own_tenants_limits_and_defaults(
    shard: ShardClient,
) -> None:
    """The limits in force are worked out once per tenant and defaults of a batch: a batch
    over two tenants, one with a quota of its own on the shard, and jobs sent with two
    defaults, is judged job by job."""
    await shard.set_limits("acme", TenantLimits(max_pending=1))
    one, none = TenantLimits(max_pending=1), TenantLimits()
    results = await shard.enqueue(
        [
            job("acme", "r1", job_id="A1", limits=none),
            job("beta", "r1", job_id="B1", limits=none),
            job("acme", "r2", job_id="A2", limits=none),  # acme's own quota: 1
            job("beta", "r2", job_id="B2", limits=one),  # these defaults: 1
            job("beta", "r3", job_id="B3", limits=none),  # none: no quota
            job("cyan", "r1", job_id="C1", limits=one),
            job("cyan", "r2", job_id="C2", limits=none),
        ]
    )
    assert [r.code for r in results] == [
        ItemCode.OK,
        ItemCode.OK,
        ItemCode.OVER_QUOTA,
        ItemCode.OVER_QUOTA,
        ItemCode.OK,
        ItemCode.OK,
        ItemCode.OK,
    ]


async def test_rate_limit_refuses_past_the_burst_then_refills(
    shard: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    limits = TenantLimits(submit_rate_per_s=2)
    results = await shard.enqueue(
        [job(request_id=f"r{i}", job_id=f"J{i}", limits=limits) for i in range(3)]
    )
    assert [r.code for r in results] == [ItemCode.OK, ItemCode.OK, ItemCode.RATE_LIMITED]
    assert results[2].retry_after_ms == 500
    assert not await redis.exists("sq:job:J2")
    clock.advance(500)
    (res,) = await shard.enqueue([job(request_id="r2", job_id="J2", limits=limits)])
    assert res.code is ItemCode.OK


async def test_a_refused_item_does_not_stop_the_rest_of_the_batch(shard: ShardClient) -> None:
    await shard.enqueue([job()])
    results = await shard.enqueue(
        [job(job_id="X", payload=b"{}"), job(request_id="r2", job_id="J2")]
    )
    assert [r.code for r in results] == [ItemCode.CONFLICT, ItemCode.OK]


@pytest.mark.parametrize("count", [1, 501, 1_200])
async def test_large_batches_are_split_and_all_land(
    shard: ShardClient, redis: Redis, count: int
) -> None:
    results = await shard.enqueue([job(request_id=f"r{i}", job_id=f"J{i}") for i in range(count)])
    assert all(r.code is ItemCode.OK for r in results)
    assert await redis.llen("sq:ready:acme:default:0") == count
    assert await redis.hget("sq:counts:acme", "ready") == str(count).encode()


async def test_one_batch_over_tenants_queues_and_priorities_fills_each_list_in_order(
    shard: ShardClient, redis: Redis
) -> None:
    """A batch's ready jobs are pushed a list at a time: each list still gets its jobs in
    the batch's order, and each queue's ring the tenants in the order of their first ready
    job there; a list that had jobs before gets the new ones after them."""
    await seed(shard, redis, job("beta", "r0", job_id="B0", queue="mail"))
    specs = [
        ("acme", "r1", "A1", "mail", 3),
        ("beta", "r1", "B1", "mail", 0),
        ("acme", "r2", "A2", "default", 0),
        ("acme", "r3", "A3", "mail", 3),
        ("cyan", "r1", "C1", "mail", 9),
        ("acme", "r4", "A4", "mail", 0),
        ("beta", "r2", "B2", "mail", 0),
    ]
    results = await shard.enqueue(
        [job(t, rid, job_id=jid, queue=q, priority=pr) for t, rid, jid, q, pr in specs]
    )
    assert [r.code for r in results] == [ItemCode.OK] * len(specs)
    state = await dump(redis)
    assert {k: v for k, v in state.items() if k.startswith(("sq:ready:", "sq:qring:"))} == {
        "sq:ready:acme:mail:3": ["A1", "A3"],
        "sq:ready:acme:mail:0": ["A4"],
        "sq:ready:acme:default:0": ["A2"],
        "sq:ready:beta:mail:0": ["B0", "B1", "B2"],
        "sq:ready:cyan:mail:9": ["C1"],
        "sq:qring:mail": ["beta", "acme", "cyan"],
        "sq:qring:default": ["acme"],
    }
    assert state["sq:tprio:acme:mail"] == [("0", 0), ("3", 3)]
    assert state["sq:tqueues:acme"] == {"mail", "default"}
    assert state["sq:tprio:cyan:mail"] == [("9", 9)]
    assert state["sq:tenants"] == {"acme", "beta", "cyan"}
    assert {k: v for k, v in state.items() if k.startswith("sq:wake")} == {
        "sq:wake:mail": ["1"],
        "sq:wake:default": ["1"],
    }


async def test_more_ready_jobs_in_one_list_than_one_push_takes_all_land_in_order(
    redis: Redis, clock: FakeClock
) -> None:
    """Past 1,000 jobs for one list in one script, the push goes in pieces: Lua's unpack
    fails past ~8,000 values. A client whose batches are larger than the usual 500."""
    n = 8_500
    shard = ShardClient(redis, ShardSettings(key_prefix="sq", max_batch=n), clock)
    results = await shard.enqueue([job(request_id=f"r{i}", job_id=f"J{i}") for i in range(n)])
    assert all(r.code is ItemCode.OK for r in results)
    assert await redis.lrange("sq:ready:acme:default:0", 0, -1) == [
        f"J{i}".encode() for i in range(n)
    ]
    assert await redis.lrange("sq:qring:default", 0, -1) == [b"acme"]


async def test_a_batch_of_more_tenants_than_one_sadd_takes_adds_them_all(
    redis: Redis, clock: FakeClock
) -> None:
    """The batch's tenants join the shard's tenant set together, in pieces of 1,000."""
    n = 1_100
    shard = ShardClient(redis, ShardSettings(key_prefix="sq", max_batch=n), clock)
    results = await shard.enqueue([job(f"t{i}", "r1", job_id=f"J{i}") for i in range(n)])
    assert all(r.code is ItemCode.OK for r in results)
    assert await redis.smembers("sq:tenants") == {f"t{i}".encode() for i in range(n)}


async def test_more_scheduled_jobs_of_one_tenant_than_one_zadd_takes_all_land(
    redis: Redis, clock: FakeClock
) -> None:
    """A batch's scheduled jobs go on their tenant's delayed ZSET a tenant at a time, past
    500 jobs in pieces (Lua's unpack fails past ~8,000 values, a score and an ID a job); the
    tenant is due by its earliest."""
    n = 4_100
    shard = ShardClient(redis, ShardSettings(key_prefix="sq", max_batch=n), clock)
    jobs = [job(request_id=f"r{i}", job_id=f"J{i}", run_at_ms=NOW + 10_000 - i) for i in range(n)]
    results = await shard.enqueue([*jobs, job("beta", "r1", job_id="B1", delay_ms=60_000)])
    assert all(r.code is ItemCode.OK and r.state == "scheduled" for r in results)
    scheduled = await redis.zrange("sq:tscheduled:acme", 0, -1, withscores=True)
    assert sorted(scheduled) == sorted((f"J{i}".encode(), NOW + 10_000 - i) for i in range(n))
    assert await redis.zrange("sq:tscheduled:beta", 0, -1, withscores=True) == [
        (b"B1", NOW + 60_000)
    ]
    assert await redis.zrange("sq:due", 0, -1, withscores=True) == [
        (b"acme", NOW + 10_000 - (n - 1)),
        (b"beta", NOW + 60_000),
    ]


async def test_a_job_of_another_queue_waits_in_that_queues_list_and_ring(
    shard: ShardClient, redis: Redis
) -> None:
    (res,) = await shard.enqueue([job(queue="mail", priority=4)])
    assert (res.code, res.state) == (ItemCode.OK, "ready")
    assert await dump(redis) == {
        "sq:job:J1": job_hash("ready", pr="4", q="mail"),
        **ready_alone("acme", {4: ["J1"]}, queue="mail"),
        "sq:dedupe:acme:r1": DEDUPE,
        "sq:counts:acme": {"ready": "1", "submitted": "1", "bytes": str(len(P))},
        "sq:tenants": {"acme"},
        "sq:wake:mail": ["1"],
    }
    assert (await shard.get_job("acme", "J1")).queue == "mail"


async def test_one_batch_wakes_each_queue_it_made_ready_jobs_in_once(
    shard: ShardClient, redis: Redis
) -> None:
    await shard.enqueue(
        [
            job(request_id="r1", job_id="J1", queue="a"),
            job(request_id="r2", job_id="J2", queue="a"),
            job(request_id="r3", job_id="J3", queue="b"),
            job(request_id="r4", job_id="J4", queue="c", delay_ms=1_000),
        ]
    )
    state = await dump(redis)
    assert {k: v for k, v in state.items() if k.startswith("sq:wake")} == {
        "sq:wake:a": ["1"],
        "sq:wake:b": ["1"],
    }


async def test_wake_up_lists_hold_at_most_their_cap_however_many_calls_push(
    shard: ShardClient, redis: Redis
) -> None:
    # A token per call, the list trimmed only once it passes the cap: 64 for a queue's idle
    # workers (more would only cause empty claims), 1 for the shard loop.
    for n in range(70):
        await shard.enqueue([job(request_id=f"r{n}", job_id=f"J{n}")])
        assert await redis.llen(WAKE) == min(n + 1, 64)
    for n in range(3):
        await shard.enqueue([job(request_id=f"d{n}", job_id=f"D{n}", delay_ms=1_000 - n)])
        assert await redis.lrange("sq:promoter_wake", 0, -1) == [b"1"]


async def test_the_payload_bytes_of_pending_jobs_are_counted_until_each_job_ends(
    shard: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    sizes = {"J1": 10, "J2": 20, "J3": 30, "J4": 40, "J5": 50}
    await shard.enqueue(
        [
            job(request_id=f"r{jid}", job_id=jid, payload=b'"' + b"x" * (n - 2) + b'"')
            for jid, n in sizes.items()
        ]
    )

    async def pending_bytes() -> int:
        return int(await redis.hget("sq:counts:acme", "bytes"))

    assert await pending_bytes() == 150
    leases = {c.job_id: Lease(c.job_id, c.fence) for c in await shard.claim("w1", 4, LEASE)}
    assert await pending_bytes() == 150  # ready -> active: still pending
    await shard.ack([leases["J1"]])
    assert await pending_bytes() == 140  # succeeded
    await shard.fail([Failure("J2", leases["J2"].fence, 1, "boom", permanent=True)])
    assert await pending_bytes() == 120  # dead
    await shard.fail([Failure("J3", leases["J3"].fence, 1, "boom", retry_at_ms=NOW + 1)])
    assert await pending_bytes() == 120  # retried: scheduled, still pending
    await shard.cancel("acme", "J5")
    assert await pending_bytes() == 70  # cancelled while ready
    await shard.cancel("acme", "J4")
    await shard.ack([leases["J4"]])
    assert await pending_bytes() == 30  # cancelled while active, ended by its ack
    assert await shard.requeue_dead("acme", ["J2"]) == (1, [])
    assert await pending_bytes() == 50  # dead -> ready: pending again
    clock.advance(LEASE)
    assert (await shard.tenant_load("acme")).pending_bytes == 50


async def test_on_the_system_clock_the_scripts_stamp_the_shards_time(redis: Redis) -> None:
    """A client on the system clock sends now_ms 0: created-at, run-at, started-at, finished-at
    and the lease deadline all come from Redis TIME, and a delay is added to it exactly."""
    shard = ShardClient(redis, ShardSettings(key_prefix="sq"))
    assert shard.shard_time

    def shard_ms(reply: list[bytes]) -> int:
        return int(reply[0]) * 1000 + int(reply[1]) // 1000

    before = shard_ms(await redis.time())
    now, later = await shard.enqueue(
        [job(job_id="J1"), job(request_id="r2", job_id="J2", delay_ms=5)]
    )
    after = shard_ms(await redis.time())
    assert before <= now.created_at_ms <= after
    assert (now.run_at_ms, later.run_at_ms) == (now.created_at_ms, later.created_at_ms + 5)
    assert await redis.hmget("sq:job:J2", "ca", "ra") == [
        str(later.created_at_ms).encode(), str(later.run_at_ms).encode()
    ]  # fmt: skip

    async with asyncio.timeout(10):
        while (await shard.promote())[0] == 0:  # J2 is due 5 ms after it was created
            await asyncio.sleep(0.001)
    claimed = await shard.claim("w1", 2, LEASE)
    assert [c.job_id for c in claimed] == ["J1", "J2"]
    for c in claimed:
        assert c.started_at_ms >= c.run_at_ms >= c.created_at_ms
        assert await redis.zscore("sq:leases", c.job_id) == c.started_at_ms + LEASE
    await shard.ack([Lease(c.job_id, c.fence) for c in claimed])
    for c in claimed:
        finished = int(await redis.hget(f"sq:job:{c.job_id}", "fa") or 0)
        assert finished >= c.started_at_ms
