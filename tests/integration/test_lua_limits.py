"""set_limits.lua and the limits enqueue.lua enforces from the tenant's limits:{t} hash, with
the caller's defaults where the hash sets nothing: submit rate and burst, pending jobs, pending
payload bytes. Refusals write nothing but the rate bucket."""

from __future__ import annotations

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
from tests.support.shard import LEASE, job
from tests.support.state import dump

OK, LIMITED, OVER = ItemCode.OK, ItemCode.RATE_LIMITED, ItemCode.OVER_QUOTA


def sized(jid: str, size: int, **kw: Any) -> NewJob:
    """Job ``jid`` of acme whose payload is ``size`` bytes (a JSON string)."""
    return NewJob("acme", "h", b'"' + b"x" * (size - 2) + b'"', f"r{jid}", job_id=jid, **kw)


async def test_set_limits_stores_the_fields_set_and_removes_those_set_to_0(
    shard: ShardClient, redis: Redis
) -> None:
    every = TenantLimits(
        weight=3, max_active=4, submit_rate_per_s=2.5, submit_burst=6, max_pending=7,
        max_pending_bytes=8,
    )  # fmt: skip
    await shard.set_limits("acme", every)
    assert await dump(redis) == {
        "sq:limits:acme": {
            "weight": "3", "max_active": "4", "rate": "2.5", "burst": "6", "max_pending": "7",
            "max_pending_bytes": "8",
        },
    }  # fmt: skip
    assert await shard.limits("acme") == every
    await shard.set_limits("acme", TenantLimits(max_pending=9))
    assert await dump(redis) == {"sq:limits:acme": {"max_pending": "9"}}
    await shard.set_limits("acme", TenantLimits())
    assert await dump(redis) == {}
    assert await shard.limits("acme") == TenantLimits()


async def test_adopting_limits_sets_them_only_where_the_tenant_has_none(
    shard: ShardClient, redis: Redis
) -> None:
    assert await shard.adopt_limits("acme", TenantLimits(weight=2)) is True
    assert await shard.adopt_limits("acme", TenantLimits(weight=5, max_pending=1)) is False
    assert await shard.limits("acme") == TenantLimits(weight=2)


# (limits on the shard, the job's defaults, submits (jid, payload bytes, ms after the last),
#  codes, retry_after_ms of each)
CASES = [
    pytest.param(
        TenantLimits(submit_rate_per_s=1, submit_burst=3), TenantLimits(),
        [("J1", 2, 0), ("J2", 2, 0), ("J3", 2, 0), ("J4", 2, 0), ("J5", 2, 1_000)],
        [OK, OK, OK, LIMITED, OK], [0, 0, 0, 1_000, 0],
        id="burst-then-the-rate",
    ),
    pytest.param(
        TenantLimits(submit_rate_per_s=4), TenantLimits(),
        [("J1", 2, 0), ("J2", 2, 0), ("J3", 2, 0), ("J4", 2, 0), ("J5", 2, 0), ("J6", 2, 250)],
        [OK, OK, OK, OK, LIMITED, OK], [0, 0, 0, 0, 250, 0],
        id="burst-0-is-the-rate",
    ),
    pytest.param(
        TenantLimits(), TenantLimits(submit_rate_per_s=1, submit_burst=2),
        [("J1", 2, 0), ("J2", 2, 0), ("J3", 2, 0)],
        [OK, OK, LIMITED], [0, 0, 1_000],
        id="the-defaults-when-the-shard-sets-nothing",
    ),
    pytest.param(
        TenantLimits(submit_rate_per_s=100), TenantLimits(submit_rate_per_s=1),
        [("J1", 2, 0), ("J2", 2, 0), ("J3", 2, 0)],
        [OK, OK, OK], [0, 0, 0],
        id="the-shard-over-the-defaults",
    ),
    pytest.param(
        TenantLimits(max_pending=2), TenantLimits(max_pending=100),
        [("J1", 2, 0), ("J2", 2, 0), ("J3", 2, 0)],
        [OK, OK, OVER], [0, 0, 1_000],
        id="max-pending",
    ),
    pytest.param(
        TenantLimits(max_pending_bytes=10), TenantLimits(),
        [("J1", 4, 0), ("J2", 6, 0), ("J3", 2, 0)],
        [OK, OK, OVER], [0, 0, 1_000],
        id="max-pending-bytes",
    ),
    pytest.param(
        TenantLimits(), TenantLimits(max_pending_bytes=10),
        [("J1", 4, 0), ("J2", 7, 0), ("J3", 6, 0)],
        [OK, OVER, OK], [0, 1_000, 0],
        id="max-pending-bytes-by-default-a-smaller-job-still-fits",
    ),
    pytest.param(
        TenantLimits(max_pending=5, max_pending_bytes=8, submit_rate_per_s=1, submit_burst=2),
        TenantLimits(),
        [("J1", 4, 0), ("J2", 5, 0), ("J3", 2, 0), ("J4", 2, 0)],
        [OK, OVER, OK, LIMITED], [0, 1_000, 0, 1_000],
        id="a-quota-refusal-takes-no-token",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("limits", "defaults", "submits", "codes", "retry"), CASES)
async def test_enqueue_enforces_the_tenants_limits_over_the_callers_defaults(
    shard: ShardClient,
    redis: Redis,
    clock: FakeClock,
    limits: TenantLimits,
    defaults: TenantLimits,
    submits: list[tuple[str, int, int]],
    codes: list[ItemCode],
    retry: list[int],
) -> None:
    await shard.set_limits("acme", limits)
    got = []
    for jid, size, after_ms in submits:
        clock.advance(after_ms)
        before = await dump(redis)
        (res,) = await shard.enqueue([sized(jid, size, limits=defaults)])
        got.append((res.code, res.retry_after_ms))
        if res.code is not OK:  # nothing written but the rate bucket
            after = await dump(redis)
            after.pop("sq:bucket:acme", None), before.pop("sq:bucket:acme", None)
            assert after == before
    assert got == list(zip(codes, retry, strict=True))


async def test_pending_bytes_go_down_as_jobs_end_and_make_room_again(
    shard: ShardClient, redis: Redis
) -> None:
    await shard.set_limits("acme", TenantLimits(max_pending_bytes=10))
    assert [r.code for r in await shard.enqueue([sized("J1", 6), sized("J2", 4)])] == [OK, OK]
    assert (await shard.enqueue([sized("J3", 3)]))[0].code is OVER
    (c, _) = await shard.claim("w1", 2, LEASE)
    await shard.ack([Lease(c.job_id, c.fence)])
    assert await redis.hget("sq:counts:acme", "bytes") == b"4"
    assert (await shard.enqueue([sized("J3", 6)]))[0].code is OK
    await shard.cancel("acme", "J3")
    assert (await shard.enqueue([sized("J4", 6)]))[0].code is OK
    assert (await shard.tenant_load("acme")).pending_bytes == 10


async def test_a_batch_counts_its_own_jobs_against_the_quotas(shard: ShardClient) -> None:
    await shard.set_limits("acme", TenantLimits(max_pending=2))
    results = await shard.enqueue([job(f"J{i}", delay_ms=i) for i in range(4)])
    assert [r.code for r in results] == [OK, OK, OVER, OVER]


async def test_a_batch_takes_its_tokens_as_the_same_jobs_sent_one_call_each(
    redis: Redis, clock: FakeClock
) -> None:
    # enqueue.lua reads a tenant's bucket once per call and writes it once at its end: each
    # job must still see it as the job before it left it. The same jobs go as one batch to
    # one prefix and one call each to another, on the same Redis and clock: two tenants, the
    # shard's limits and the callers' defaults (two rates and bursts for one tenant), a
    # bucket left part full by an earlier call, and quota refusals that take no token.
    batch, each = (ShardClient(redis, ShardSettings(key_prefix=p), clock) for p in ("one", "each"))
    slow = TenantLimits(submit_rate_per_s=3, submit_burst=2)
    fast = TenantLimits(submit_rate_per_s=7.5, submit_burst=4, max_pending_bytes=40)
    for shard in (batch, each):
        await shard.set_limits("acme", TenantLimits(submit_rate_per_s=2, submit_burst=3))
        await shard.enqueue([sized("J0", 2), sized("J00", 2)])
    clock.advance(333)  # acme's bucket: 1 + 0.666 tokens
    jobs = [
        sized("J1", 2), NewJob("beta", "h", b"1", "b1", job_id="B1", limits=slow),
        sized("J2", 2), NewJob("beta", "h", b"2", "b2", job_id="B2", limits=fast),
        NewJob("beta", "h", b"3", "b3", job_id="B3", limits=slow), sized("J3", 2),
        NewJob("beta", "h", b"x" * 39, "b4", job_id="B4", limits=fast),
        NewJob("beta", "h", b"5", "b5", job_id="B5", limits=fast),
        NewJob("beta", "h", b"6", "b6", job_id="B6", limits=fast),
    ]  # fmt: skip
    in_one = [(r.code, r.job_id, r.retry_after_ms) for r in await batch.enqueue(jobs)]
    one_each = [(r.code, r.job_id, r.retry_after_ms) for j in jobs for r in await each.enqueue([j])]
    assert in_one == one_each
    assert {c for c, _, _ in in_one} == {OK, LIMITED, OVER}
    for tenant in ("acme", "beta"):
        left = [await redis.hgetall(f"{p}:bucket:{tenant}") for p in ("one", "each")]
        assert left[0] == left[1] and left[0], tenant
        ttl = [await redis.pttl(f"{p}:bucket:{tenant}") for p in ("one", "each")]
        assert abs(ttl[0] - ttl[1]) < 1_000 and min(ttl) > 0, ttl  # the last job's burst
