"""release.lua: a stopping worker hands its jobs back to ready at once, attempt not counted; a
worker without a job's handler hands it back for another worker (avoid_ms)."""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio import Redis

from shardq.shard import FakeClock, ItemCode, Lease, NewJob, ShardClient, TenantLimits
from tests.support.shard import (
    LEASE,
    NOW,
    WAKE,
    claimed_hash,
    dedupe,
    drop_wake_tokens,
    job,
    ready_alone,
)
from tests.support.state import dump

AVOID = 60_000


async def claim_one(shard: ShardClient, rid: str = "r1") -> Lease:
    await shard.enqueue([NewJob("acme", "h", b"{}", rid, job_id=f"J{rid}", priority=3)])
    (c,) = await shard.claim("w1", 1, 30_000)
    return Lease(c.job_id, c.fence)


async def test_a_released_job_is_ready_again_with_its_attempt_given_back(
    shard: ShardClient, redis: Redis
) -> None:
    lease = await claim_one(shard)
    assert await shard.release([lease]) == [ItemCode.OK]
    state = await dump(redis)
    job = state["sq:job:Jr1"]
    assert (job["s"], job["at"], job["f"], job["w"]) == ("ready", "0", "1", "w1")
    assert "xw" not in job and "xu" not in job
    assert state["sq:ready:acme:default:3"] == ["Jr1"]
    assert state["sq:qring:default"] == ["acme"]
    assert "sq:tactive:acme" not in state and "sq:leases" not in state
    assert state["sq:counts:acme"] == {"ready": "1", "active": "0", "submitted": "1", "bytes": "2"}
    assert state[WAKE] == ["1", "1"]  # one from the submit, one from the release
    (again,) = await shard.claim("w2", 1, 30_000)
    assert (again.job_id, again.attempt, again.fence) == ("Jr1", 1, 2)


async def test_release_with_a_stale_fence_changes_nothing(
    shard: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    lease = await claim_one(shard)
    before = await dump(redis)
    assert await shard.release([Lease(lease.job_id, lease.fence + 1)]) == [ItemCode.STALE_LEASE]
    assert await shard.release([Lease(lease.job_id, lease.fence + 1)], AVOID) == [
        ItemCode.STALE_LEASE
    ]
    assert await dump(redis) == before


async def test_releasing_a_job_cancelled_while_active_ends_it_cancelled(
    shard: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    lease = await claim_one(shard)
    await shard.cancel("acme", lease.job_id)
    clock.advance(5)
    assert await shard.release([lease], AVOID) == [ItemCode.CANCELLED]
    rec = await shard.get_job("acme", lease.job_id)
    assert (rec.state, rec.finished_at_ms, rec.avoid_worker_id) == ("cancelled", NOW + 5, "")
    assert 0 < await redis.pttl("sq:job:Jr1") <= shard.settings.retention_ms
    assert await redis.llen("sq:ready:acme:default:3") == 0
    assert await redis.hget("sq:counts:acme", "bytes") == b"0"
    assert await redis.hget("sq:counts:acme", "unrunnable") is None
    # Its worker writes no row for a released job: the shard loop writes the cancelled one.
    assert await redis.zrange("sq:outbox", 0, -1, withscores=True) == [(b"Jr1", NOW + 5)]


async def test_a_job_handed_back_for_want_of_its_handler_is_marked_counted_and_ready(
    shard: ShardClient, redis: Redis
) -> None:
    await shard.enqueue([job("J1", queue="mail")])
    (c,) = await shard.claim("w1", 1, LEASE, ["mail"])
    await drop_wake_tokens(redis)
    assert await shard.release([Lease("J1", c.fence)], avoid_ms=AVOID) == [ItemCode.OK]
    assert await dump(redis) == {
        "sq:job:J1": claimed_hash(
            "J1", "ready", 1, at="0", q="mail", xw="w1", xu=str(NOW + AVOID)
        ),
        **ready_alone("acme", {0: ["J1"]}, queue="mail"),
        "sq:fence": "1",
        "sq:wake:mail": ["1"],
        "sq:counts:acme": {
            "ready": "1", "active": "0", "submitted": "1", "bytes": "2", "unrunnable": "1",
        },
        "sq:tenants": {"acme"},
        **dedupe("J1"),
    }  # fmt: skip
    assert (await shard.tenant_load("acme")).unrunnable_total == 1


# (claims after a hand-back by w1: worker, clock advance in ms, jobs it gets)
AVOID_CASES: list[tuple[str, list[tuple[str, int, list[str]]]]] = [
    ("another worker takes it at once", [("w2", 0, ["J1"])]),
    ("the same worker gets nothing before the time", [("w1", 0, []), ("w1", AVOID - 1, [])]),
    ("the same worker gets it once the time is up", [("w1", AVOID, ["J1"])]),
    ("another worker takes it after its worker passed it over", [("w1", 0, []), ("w3", 0, ["J1"])]),
]


@pytest.mark.parametrize(("name", "claims"), AVOID_CASES, ids=[c[0] for c in AVOID_CASES])
async def test_claim_never_gives_a_handed_back_job_to_its_worker_before_the_time_is_up(
    shard: ShardClient, redis: Redis, clock: FakeClock, name: str, claims: list[Any]
) -> None:
    await shard.enqueue([job("J1")])
    (c,) = await shard.claim("w1", 1, LEASE)
    await shard.release([Lease("J1", c.fence)], avoid_ms=AVOID)
    for worker, advance, want in claims:
        clock.advance(advance)
        got = await shard.claim(worker, 5, LEASE)
        assert [g.job_id for g in got] == want
    rec = await shard.get_job("acme", "J1")
    if any(want for _, _, want in claims):  # claimed: the hand-back marks are gone
        assert (rec.state, rec.avoid_worker_id, rec.avoid_until_ms) == ("active", "", 0)
    else:
        assert (rec.state, rec.avoid_worker_id) == ("ready", "w1")
        assert await redis.lrange("sq:ready:acme:default:0", 0, -1) == [b"J1"]


async def test_the_worker_that_handed_a_job_back_gets_the_next_ones_and_the_job_goes_last(
    shard: ShardClient, redis: Redis
) -> None:
    await shard.enqueue([job("J1"), job("J2"), job("J3"), job("B1", tenant="bravo")])
    (c,) = await shard.claim("w1", 1, LEASE)
    await shard.release([Lease("J1", c.fence)], avoid_ms=AVOID)
    # acme's turn passes over J1 (to its list's tail), bravo's turn, then acme's J2, J3.
    assert [g.job_id for g in await shard.claim("w1", 5, LEASE)] == ["B1", "J2", "J3"]
    assert await redis.lrange("sq:ready:acme:default:0", 0, -1) == [b"J1"]
    assert [g.job_id for g in await shard.claim("w2", 5, LEASE)] == ["J1"]


async def test_a_hand_back_ends_an_active_job_and_un_parks_its_tenant(
    shard: ShardClient, redis: Redis
) -> None:
    await shard.set_limits("acme", TenantLimits(max_active=1))
    await shard.enqueue([job("J1"), job("J2")])
    (c,) = await shard.claim("w1", 5, LEASE)
    assert await redis.smembers("sq:parked") == {b"acme"}
    await shard.release([Lease(c.job_id, c.fence)], avoid_ms=AVOID)
    assert await redis.exists("sq:parked") == 0
    assert [g.job_id for g in await shard.claim("w1", 5, LEASE)] == ["J2"]
