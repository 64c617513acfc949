"""set_limits.lua and the limits enqueue.lua enforces from the tenant's limits:{t} hash, with
the caller's defaults where the hash sets nothing: submit rate and burst, pending jobs, pending
payload bytes. Refusals write nothing but the rate bucket."""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio import Redis

from shardq.shard import FakeClock, ItemCode, Lease, NewJob, ShardClient, TenantLimits
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
