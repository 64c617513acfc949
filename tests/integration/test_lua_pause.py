"""pause.lua and resume.lua: a tenant, a queue (for every tenant), or one tenant's queue.
Nothing paused is claimed; submits and promotion go on; resume puts the tenants back on their
rings and wakes the queues' workers at once; no job is lost or claimed twice."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from shardq.common.errors import InvalidArgument
from shardq.shard import FakeClock, ShardClient, TenantLimits
from tests.support.shard import LEASE, drop_wake_tokens, job, ready_keys, ring_keys, seed
from tests.support.state import dump

QUEUES = ["default", "mail"]
#: acme and bravo, each with two jobs in each of two queues.
JOBS = {
    f"{t[0].upper()}{q[0].upper()}{i}": (t, q)
    for t in ("acme", "bravo")
    for q in QUEUES
    for i in range(2)
}

# (what is paused, the jobs a claim of both queues still gets, the pause set and its member)
PAUSES = [
    pytest.param(("acme", None), {"BD0", "BD1", "BM0", "BM1"}, ("sq:paused", "acme"), id="tenant"),
    pytest.param((None, "mail"), {"AD0", "AD1", "BD0", "BD1"}, ("sq:qpaused", "mail"), id="queue"),
    pytest.param(
        ("acme", "mail"),
        {"AD0", "AD1", "BD0", "BD1", "BM0", "BM1"},
        ("sq:tqpaused", "acme/mail"),
        id="tenants-queue",
    ),
]


async def seed_jobs(shard: ShardClient, redis: Redis) -> None:
    await seed(shard, redis, *(job(jid, tenant=t, queue=q) for jid, (t, q) in JOBS.items()))


async def claim_all(shard: ShardClient, worker: str = "w1") -> list[str]:
    out: list[str] = []
    while got := await shard.claim(worker, 3, LEASE, QUEUES):
        out += [c.job_id for c in got]
    return out


@pytest.mark.parametrize(("what", "claimable", "member"), PAUSES)
async def test_nothing_paused_is_claimed_and_after_resume_everything_is_once(
    shard: ShardClient,
    redis: Redis,
    what: tuple[str | None, str | None],
    claimable: set[str],
    member: tuple[str, str],
) -> None:
    await seed_jobs(shard, redis)
    assert await shard.pause(*what) is True
    assert await shard.pause(*what) is False  # pausing what is paused changes nothing
    key, value = member
    assert await redis.smembers(key) == {value.encode()}
    first = await claim_all(shard)
    assert len(first) == len(set(first)) and set(first) == claimable
    await drop_wake_tokens(redis)
    assert await shard.resume(*what) is True
    assert await redis.exists(key) == 0
    woken = {k.decode() for k in await redis.keys("sq:wake:*")}
    assert woken == ({"sq:wake:mail"} if what[1] == "mail" else {f"sq:wake:{q}" for q in QUEUES})
    rest = await claim_all(shard)
    assert sorted(first + rest) == sorted(JOBS)  # nothing lost, nothing twice
    assert await shard.resume(*what) is False


@pytest.mark.parametrize(("what", "claimable", "member"), PAUSES)
async def test_a_paused_tenant_is_dropped_from_its_rings_lazily_and_put_back_on_resume(
    shard: ShardClient,
    redis: Redis,
    what: tuple[str | None, str | None],
    claimable: set[str],
    member: tuple[str, str],
) -> None:
    await seed_jobs(shard, redis)
    await shard.pause(*what)
    await claim_all(shard)
    await drop_wake_tokens(redis)
    # What is left: acme's paused jobs, off the rings (a queue paused for all keeps its ring).
    left = {jid for jid in JOBS if jid not in claimable}
    state = await dump(redis)
    structures = ("sq:ready", "sq:tprio", "sq:tqueues", "sq:qring", "sq:inring")
    got = {k: v for k, v in state.items() if k.startswith(structures)}
    want: dict = {}
    for t, q in sorted({JOBS[jid] for jid in left}):
        want |= ready_keys(t, {0: sorted(j for j in left if JOBS[j] == (t, q))}, q)
    tenants_queues = {}
    for t, q in {JOBS[jid] for jid in left}:
        tenants_queues.setdefault(f"sq:tqueues:{t}", set()).add(q)
    want |= tenants_queues
    if what == (None, "mail"):
        want |= ring_keys("mail", "acme", "bravo")
    assert got == want
    await shard.resume(*what)
    state = await dump(redis)
    rings = {k: v for k, v in state.items() if k.startswith(("sq:qring", "sq:inring"))}
    if what == (None, "mail"):
        assert rings == ring_keys("mail", "acme", "bravo")
    elif what == ("acme", None):
        assert rings == ring_keys("default", "acme") | ring_keys("mail", "acme")
    else:
        assert rings == ring_keys("mail", "acme")


async def test_submits_are_accepted_and_promoted_while_paused_and_claimed_after_resume(
    shard: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    await shard.pause("acme")
    await shard.pause(queue="mail")
    results = await shard.enqueue(
        [job("J1"), job("J2", queue="mail", tenant="bravo"), job("J3", delay_ms=10)]
    )
    assert [r.state for r in results] == ["ready", "ready", "scheduled"]
    clock.advance(10)
    assert await shard.promote() == (1, None)
    assert await shard.claim("w1", 10, LEASE, QUEUES) == []
    assert await redis.lrange("sq:ready:acme:default:0", 0, -1) == [b"J1", b"J3"]
    await shard.resume("acme")
    assert [c.job_id for c in await shard.claim("w1", 10, LEASE, QUEUES)] == ["J1", "J3"]
    await shard.resume(queue="mail")
    assert [c.job_id for c in await shard.claim("w1", 10, LEASE, QUEUES)] == ["J2"]


async def test_resuming_a_tenants_queue_leaves_its_whole_pause_and_its_parking_in_force(
    shard: ShardClient, redis: Redis
) -> None:
    await seed_jobs(shard, redis)
    await shard.pause("acme")
    await shard.pause("acme", "mail")
    await shard.resume("acme", "mail")  # still paused whole
    assert {c.tenant for c in await shard.claim("w1", 10, LEASE, QUEUES)} == {"bravo"}
    await shard.set_limits("acme", TenantLimits(max_active=1))
    await shard.resume("acme")
    got = await shard.claim("w1", 10, LEASE, QUEUES)
    assert [c.job_id for c in got] == ["AD0"]  # and at its cap of 1 after that
    await shard.pause("acme", "mail")
    await shard.resume("acme", "mail")  # parked: not back on the ring yet
    assert await redis.lrange("sq:qring:mail", 0, -1) == []


async def test_paused_answers_the_tenant_and_every_queue_paused_for_it(
    shard: ShardClient,
) -> None:
    assert await shard.paused("acme") == (False, [])
    await shard.pause("acme", "reports")
    await shard.pause("bravo", "emails")
    await shard.pause(queue="emails")
    await shard.pause(queue="batch")
    assert await shard.paused("acme") == (False, ["batch", "emails", "reports"])
    await shard.pause("acme")
    paused = await shard.paused("acme")
    assert (paused.tenant, paused.queues) == (True, ["batch", "emails", "reports"])
    assert await shard.paused("bravo") == (False, ["batch", "emails"])


async def test_pause_needs_a_tenant_or_a_queue_and_checks_both(
    shard: ShardClient, redis: Redis
) -> None:
    for bad in [(None, None), ("", ""), ("a:b", None), (None, "q*"), ("acme", "a b")]:
        with pytest.raises(InvalidArgument):
            await shard.pause(*bad)
        with pytest.raises(InvalidArgument):
            await shard.resume(*bad)
    assert await dump(redis) == {}
