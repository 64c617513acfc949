"""ack.lua: seed leases, ack, assert the whole resulting keyspace, TTLs and every code."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from redis.asyncio import Redis

from shardq.shard import ClaimedJob, Failure, FakeClock, ItemCode, Lease, NewJob, ShardClient
from shardq.shard.client import digest
from tests.support.state import dump, ttls

NOW = 1_700_000_000_000
LEASE = 30_000
DONE = NOW + 700
P = b"{}"
DIGEST = digest("h", P)


def job(jid: str, tenant: str = "acme", **kw: Any) -> NewJob:
    return NewJob(tenant=tenant, handler="h", payload=P, request_id=f"r{jid}", job_id=jid, **kw)


def job_hash(jid: str, state: str, fence: int, **over: str) -> dict[str, str]:
    h = {
        "t": "acme", "r": f"r{jid}", "h": "h", "p": "{}", "pr": "0", "s": state,
        "ra": str(NOW), "ca": str(NOW), "at": "1", "ma": "5", "to": "300000",
        "f": str(fence), "w": "w1", "sa": str(NOW),
    }  # fmt: skip
    h.update(over)
    return h


def dedupe(*jids: str) -> dict[str, str]:
    return {f"sq:dedupe:acme:r{j}": f"{j} {DIGEST}" for j in jids}


async def claimed(shard: ShardClient, redis: Redis, *jids: str) -> list[ClaimedJob]:
    """Enqueue and claim the jobs, then drop the wake-up tokens."""
    await shard.enqueue([job(j) for j in jids])
    out = await shard.claim("w1", len(jids), LEASE)
    await redis.delete("sq:wake")
    return out


async def test_an_ack_with_the_current_fence_ends_the_job_as_succeeded(
    shard: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    (c,) = await claimed(shard, redis, "J1")
    clock.set(DONE)
    assert await shard.ack([Lease("J1", c.fence)]) == [ItemCode.OK]
    assert await dump(redis) == {
        "sq:job:J1": job_hash("J1", "succeeded", 1, fa=str(DONE)),
        "sq:fence": "1",
        "sq:counts:acme": {"ready": "0", "active": "0", "submitted": "1", "succeeded": "1"},
        "sq:tenants": {"acme"},
        **dedupe("J1"),
    }
    assert set(await ttls(redis)) == {"sq:job:J1", "sq:dedupe:acme:rJ1"}
    assert 0 < await redis.pttl("sq:job:J1") <= shard.settings.retention_ms


async def test_an_ack_of_a_job_cancelled_while_active_ends_it_as_cancelled(
    shard: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    (c,) = await claimed(shard, redis, "J1")
    await shard.cancel("acme", "J1")
    clock.set(DONE)
    assert await shard.ack([Lease("J1", c.fence)]) == [ItemCode.CANCELLED]
    assert await dump(redis) == {
        "sq:job:J1": job_hash("J1", "cancelled", 1, cx="1", fa=str(DONE)),
        "sq:fence": "1",
        "sq:counts:acme": {"ready": "0", "active": "0", "submitted": "1"},
        "sq:tenants": {"acme"},
        **dedupe("J1"),
    }
    assert set(await ttls(redis)) == {"sq:job:J1", "sq:dedupe:acme:rJ1"}


async def _wrong_fence(shard: ShardClient, c: ClaimedJob, clock: FakeClock) -> Lease:
    return Lease(c.job_id, c.fence + 1)


async def _already_acked(shard: ShardClient, c: ClaimedJob, clock: FakeClock) -> Lease:
    assert await shard.ack([Lease(c.job_id, c.fence)]) == [ItemCode.OK]
    return Lease(c.job_id, c.fence)


async def _failed(shard: ShardClient, c: ClaimedJob, clock: FakeClock) -> Lease:
    await shard.fail([Failure(c.job_id, c.fence, c.attempt, "boom", retry_at_ms=NOW + 1)])
    return Lease(c.job_id, c.fence)


async def _reaped(shard: ShardClient, c: ClaimedJob, clock: FakeClock) -> Lease:
    clock.advance(LEASE)
    assert await shard.reap() == (1, 0)
    return Lease(c.job_id, c.fence)


async def _reaped_and_reclaimed(shard: ShardClient, c: ClaimedJob, clock: FakeClock) -> Lease:
    await _reaped(shard, c, clock)
    (again,) = await shard.claim("w2", 1, LEASE)
    assert again.job_id == c.job_id
    return Lease(c.job_id, c.fence)


async def _missing(shard: ShardClient, c: ClaimedJob, clock: FakeClock) -> Lease:
    return Lease("NOSUCHJOB", c.fence)


Setup = Callable[[ShardClient, ClaimedJob, FakeClock], Awaitable[Lease]]


@pytest.mark.parametrize(
    "make_stale",
    [_wrong_fence, _already_acked, _failed, _reaped, _reaped_and_reclaimed, _missing],
    ids=["wrong-fence", "acked-twice", "failed", "reaped", "reaped-and-reclaimed", "missing-job"],
)
async def test_an_ack_with_a_stale_fence_is_refused_and_changes_nothing(
    shard: ShardClient, redis: Redis, clock: FakeClock, make_stale: Setup
) -> None:
    (c,) = await claimed(shard, redis, "J1")
    lease = await make_stale(shard, c, clock)
    before = await dump(redis)
    clock.advance(1)
    assert await shard.ack([lease]) == [ItemCode.STALE_LEASE]
    assert await dump(redis) == before


async def test_one_ack_call_answers_every_lease_in_order(
    shard: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    c1, c2, c3 = await claimed(shard, redis, "J1", "J2", "J3")
    await shard.cancel("acme", "J2")
    clock.set(DONE)
    codes = await shard.ack([Lease("J1", c1.fence), Lease("J2", c2.fence), Lease("J3", c1.fence)])
    assert codes == [ItemCode.OK, ItemCode.CANCELLED, ItemCode.STALE_LEASE]
    assert await dump(redis) == {
        "sq:job:J1": job_hash("J1", "succeeded", 1, fa=str(DONE)),
        "sq:job:J2": job_hash("J2", "cancelled", 2, cx="1", fa=str(DONE)),
        "sq:job:J3": job_hash("J3", "active", c3.fence),
        "sq:fence": "3",
        "sq:leases": [("J3", NOW + LEASE)],
        "sq:tactive:acme": [("J3", NOW)],
        "sq:counts:acme": {"ready": "0", "active": "1", "submitted": "3", "succeeded": "1"},
        "sq:tenants": {"acme"},
        **dedupe("J1", "J2", "J3"),
    }


async def test_an_ack_of_no_leases_sends_nothing(shard: ShardClient, redis: Redis) -> None:
    await redis.config_resetstat()
    assert await shard.ack([]) == []
    assert "cmdstat_evalsha" not in await redis.info("commandstats")
