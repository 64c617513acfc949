"""The move_*.lua scripts and map_fence.lua, on two real redis-servers: a tenant's every kind
of job leaves the source and arrives on the target as it was; each step repeated changes
nothing; a crash between any two steps loses and duplicates nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from shardq.coordinator.tools.redis_server import RedisProcess
from shardq.shard import (
    Failure,
    FakeClock,
    ItemCode,
    Lease,
    NewJob,
    ShardClient,
    ShardSettings,
    TenantLimits,
)
from shardq.shard.models import ScheduleSpec
from shardq.shard.moving import ShardSide, TenantControls, fence_map
from tests.support.shard import LEASE, NOW, P, job, ready_keys, ring_keys
from tests.support.state import dump


@pytest.fixture
async def target_redis() -> AsyncIterator[Redis]:
    proc = RedisProcess().start()
    client = Redis.from_url(proc.url)
    try:
        yield client
    finally:
        await client.aclose()
        proc.cleanup()


@pytest.fixture
def target(target_redis: Redis, settings: ShardSettings, clock: FakeClock) -> ShardClient:
    return ShardClient(target_redis, settings, clock)


async def seed_every_kind(shard: ShardClient, clock: FakeClock) -> dict[str, int]:
    """On the source: scheduled J1, ready J2 (priority 7), ready M1 of queue mail, J3
    cancelled while ready, dead J4, succeeded J5, active J6, and job B1 of another tenant.
    Returns fencing tokens by job."""
    await shard.enqueue([job("J4"), job("J5"), job("J6")])
    fences = {}
    for c in await shard.claim("w1", 3, LEASE):
        fences[c.job_id] = c.fence
    await shard.fail([Failure("J4", fences["J4"], 1, "boom", permanent=True)])
    await shard.ack([Lease("J5", fences["J5"])])
    await shard.enqueue(
        [
            job("J1", delay_ms=5_000, priority=3),
            job("J2", priority=7),
            job("M1", queue="mail", priority=2),
            job("J3"),
            job("B1", "bob"),
        ]
    )
    await shard.cancel("acme", "J3")
    return fences


async def move_queued(src: ShardSide, dst: ShardSide) -> None:
    while await src.take(2):
        ids = await src.taken()
        await dst.put(jobs=await src.read_jobs(ids))
        await src.drop(job_ids=ids)


async def test_queued_jobs_arrive_on_the_target_as_they_were(
    shard: ShardClient, target: ShardClient, redis: Redis, target_redis: Redis, clock: FakeClock
) -> None:
    fences = await seed_every_kind(shard, clock)
    before = {j: await shard.get_job("acme", j) for j in ("J1", "J2", "J4", "M1")}
    src, dst = ShardSide(shard, "acme"), ShardSide(target, "acme")
    await move_queued(src, dst)

    for jid, rec in before.items():
        assert await target.get_job("acme", jid) == rec  # state, priority, run-at, attempts, fence
    left = await dump(redis)
    assert not any(k in left for k in ("sq:job:J1", "sq:job:J2", "sq:job:J4", "sq:moving:acme"))
    assert left["sq:job:J6"]["s"] == "active"  # active jobs finish where they run
    assert not [k for k in left if k.startswith(("sq:ready:acme", "sq:tprio:acme", "sq:tqueues"))
                and "bob" not in k]  # fmt: skip
    assert left["sq:qring:default"] == ["bob"] and left["sq:inring:default"] == {"bob"}
    assert "sq:qring:mail" not in left and "sq:inring:mail" not in left
    counts = left["sq:counts:acme"]
    assert (counts["scheduled"], counts["ready"], counts["dead"]) == ("0", "0", "0")
    assert counts["bytes"] == "2"  # the active J6's payload: it is still pending here

    moved = await dump(target_redis)
    assert moved["sq:tscheduled:acme"] == [("J1", NOW + 5_000)]
    assert moved["sq:due"] == [("acme", NOW + 5_000)]
    assert {k: v for k, v in moved.items() if k.startswith(("sq:ready", "sq:tprio"))} == {
        k: v
        for k, v in {
            **ready_keys("acme", {7: ["J2"]}),
            **ready_keys("acme", {2: ["M1"]}, "mail"),
        }.items()
        if k.startswith(("sq:ready", "sq:tprio"))
    }
    assert moved["sq:tqueues:acme"] == {"default", "mail"}
    assert {k: moved[k] for k in ("sq:qring:default", "sq:inring:default")} == ring_keys(
        "default", "acme"
    )
    assert moved["sq:qring:mail"] == ["acme"]
    assert [m for m, _ in moved["sq:dead:acme"]] == ["J4"]
    assert moved["sq:counts:acme"] == {"scheduled": "1", "ready": "2", "dead": "1", "bytes": "6"}
    # A claim on the target always takes a fencing token above any a moved job had.
    assert int(moved["sq:fence"]) == fences["J4"] == before["J4"].fence
    await target.requeue_dead("acme", ["J4"])
    claimed = {c.job_id: c.fence for c in await target.claim("w2", 2, LEASE)}
    assert claimed.keys() == {"J2", "J4"} and claimed["J4"] > fences["J4"]
    assert [c.job_id for c in await target.claim("w2", 5, LEASE, ["mail"])] == ["M1"]
    clock.advance(5_000)
    assert (await target.promote())[0] == 1


async def test_every_step_repeated_changes_nothing(
    shard: ShardClient, target: ShardClient, redis: Redis, target_redis: Redis, clock: FakeClock
) -> None:
    await seed_every_kind(shard, clock)
    src, dst = ShardSide(shard, "acme"), ShardSide(target, "acme")
    assert await src.take(100) == 4
    ids = await src.taken()
    jobs = await src.read_jobs(ids)
    assert await dst.put(jobs=jobs) == (4, 0, 0)
    once = await dump(target_redis)
    assert await dst.put(jobs=jobs) == (0, 0, 0)  # a re-run mover adds nothing twice
    assert await dump(target_redis) == once
    assert (await src.drop(job_ids=ids))[0] == 4
    after_drop = await dump(redis)
    assert await src.drop(job_ids=ids) == (0, 0, 0)
    assert await dump(redis) == after_drop
    assert await src.take(100) == 0


async def test_a_crash_between_any_two_steps_loses_and_duplicates_nothing(
    shard: ShardClient, target: ShardClient, redis: Redis, target_redis: Redis, clock: FakeClock
) -> None:
    await shard.enqueue([job(f"J{i}", delay_ms=1_000 + i) for i in range(10)])
    src, dst = ShardSide(shard, "acme"), ShardSide(target, "acme")
    await src.take(4)  # crash 1: taken, not copied
    ids = await src.taken()
    await dst.put(jobs=await src.read_jobs(ids[:2]))  # crash 2: half copied, none deleted
    # Between the crashes the taken jobs run nowhere and are still readable on the source.
    assert (await shard.promote(100))[0] == 0 and (await target.promote(100))[0] == 0
    assert (await shard.get_job("acme", ids[3])).state == "scheduled"
    await move_queued(src, dst)  # the re-run
    assert await dst.put(jobs=await src.read_jobs(ids)) == (0, 0, 0)
    moved = await dump(target_redis)
    assert sorted(m for m, _ in moved["sq:tscheduled:acme"]) == sorted(f"J{i}" for i in range(10))
    assert moved["sq:counts:acme"]["scheduled"] == "10"
    assert not [k for k in await dump(redis) if k.startswith("sq:job:")]


async def test_a_job_being_copied_cannot_be_cancelled_on_the_source(
    shard: ShardClient, target: ShardClient, clock: FakeClock
) -> None:
    await shard.enqueue([job("J1")])
    await ShardSide(shard, "acme").take(10)
    assert await shard.cancel("acme", "J1") == (ItemCode.MOVING, "ready")
    assert (await shard.get_job("acme", "J1")).state == "ready"


async def test_the_map_fence_refuses_submits_routed_with_an_older_map(
    shard: ShardClient, redis: Redis
) -> None:
    assert await fence_map(shard, 5) == 5
    assert await fence_map(shard, 3) == 5  # never lowered by an older raise
    prepared = [shard.prepare(job("J1")), shard.prepare(job("J2"))]
    refused = await shard.enqueue_prepared(prepared, map_version=4)
    assert [(r.code, r.retry_after_ms) for r in refused] == [(ItemCode.STALE_MAP, 5)] * 2
    assert not [k for k in await dump(redis) if k != "sq:mapfence"]  # nothing written
    assert all(r.accepted for r in await shard.enqueue_prepared(prepared, map_version=5))
    # The shard's own loop (version 0) is never refused: its cron ticks need no routing.
    assert (await shard.enqueue_prepared([shard.prepare(job("J3"))], map_version=0))[0].accepted
    assert await fence_map(shard, 4, undo=True) == 5  # only the raise to 4 could be undone
    assert await fence_map(shard, 5, undo=True) == 4


async def test_finished_jobs_and_dedupe_keys_move_once_nothing_runs_on_the_source(
    shard: ShardClient, target: ShardClient, redis: Redis, target_redis: Redis, clock: FakeClock
) -> None:
    fences = await seed_every_kind(shard, clock)
    src, dst = ShardSide(shard, "acme"), ShardSide(target, "acme")
    await move_queued(src, dst)
    seen = await src.submitted()
    assert await src.finish(seen) == (False, "active jobs")
    await shard.ack([Lease("J6", fences["J6"])])
    keys = await src.dedupe_keys()
    assert sorted(d.request_id for d in keys) == sorted(["rM1", *(f"rJ{i}" for i in range(1, 7))])
    finished = [j for j in await src.read_jobs([d.job_id for d in keys]) if j.state in
                ("succeeded", "cancelled")]  # fmt: skip
    assert sorted(j.job_id for j in finished) == ["J3", "J5", "J6"]
    await dst.put(jobs=finished, dedupe=keys)
    await src.drop(job_ids=[j.job_id for j in finished], dedupe=keys)
    await shard.enqueue([job("J7", delay_ms=10)])  # a late submit on the source (cron)...
    assert await src.finish(seen) == (False, "scheduled jobs")  # ...is not left behind
    await move_queued(src, dst)
    await dst.put(dedupe=await src.dedupe_keys())
    await src.drop(dedupe=await src.dedupe_keys())
    assert await src.finish(seen) == (False, "new submits")
    assert await src.finish(await src.submitted()) == (True, "")
    counters = await src.set_aside_counters()
    assert counters["submitted"] == 8 and counters["succeeded"] == 2
    assert await dst.add_counters("m1", counters, 60_000) is True
    assert await dst.add_counters("m1", counters, 60_000) is False  # once per move
    await src.forget_counters()

    left = await dump(redis)
    assert not [k for k in left if "acme" in k or k.startswith("sq:job:J")], left
    assert left["sq:tenants"] == {"bob"}
    moved = await dump(target_redis)
    assert moved["sq:counts:acme"]["submitted"] == "8"
    assert moved["sq:counts:acme"]["succeeded"] == "2"
    for jid, state in [("J3", "cancelled"), ("J5", "succeeded"), ("J6", "succeeded")]:
        assert (await target.get_job("acme", jid)).state == state
        assert 0 < await target_redis.pttl(f"sq:job:{jid}") <= shard.settings.retention_ms
    # A retried request_id is answered by the target's copy of the dedupe key.
    (again,) = await target.enqueue([NewJob("acme", "h", P, "rJ5")])
    assert (again.code, again.job_id) == (ItemCode.DEDUPLICATED, "J5")


async def test_schedules_move_with_their_next_tick_neither_repeated_nor_skipped(
    shard: ShardClient, target: ShardClient, target_redis: Redis, clock: FakeClock
) -> None:
    every_minute = ScheduleSpec("S1", "* * * * *", "h", P)
    hourly = ScheduleSpec("S2", "0 * * * *", "h", P)
    s1 = await shard.upsert_schedule("acme", every_minute)
    s2 = await shard.upsert_schedule("acme", hourly)
    # S1's next tick already fired here (the loop enqueued it, then the move took S1).
    await shard.enqueue([NewJob("acme", "h", P, f"cron:S1:{s1.next_tick_ms}")])
    src, dst = ShardSide(shard, "acme"), ShardSide(target, "acme")
    assert await src.take_schedules() == 2
    assert await shard.list_schedules("acme") == [] and await shard.due_ticks() == []
    copies = {c.schedule_id: c for c in await src.taken_schedules()}
    assert copies["S1"].next_tick_ms == s1.next_tick_ms + 60_000
    assert copies["S2"].next_tick_ms == s2.next_tick_ms
    assert await dst.put(schedules=list(copies.values())) == (0, 0, 2)
    assert await dst.put(schedules=list(copies.values())) == (0, 0, 0)
    await src.drop(schedule_ids=list(copies))
    moved = {s.spec.schedule_id: s for s in await target.list_schedules("acme")}
    assert moved["S1"].next_tick_ms == s1.next_tick_ms + 60_000
    assert moved["S2"].spec == s2.spec


async def test_limits_pauses_and_the_unrunnable_counter_go_with_the_tenant(
    shard: ShardClient, target: ShardClient, redis: Redis, target_redis: Redis
) -> None:
    limits = TenantLimits(weight=3, max_active=2, submit_rate_per_s=1.5, max_pending_bytes=99)
    await shard.set_limits("acme", limits)
    await shard.enqueue([job("J1")])
    (c,) = await shard.claim("w1", 1, LEASE)
    await shard.release([Lease("J1", c.fence)], avoid_ms=1_000)
    await shard.pause("acme")
    await shard.pause("acme", "mail")
    await shard.pause(queue="everyone")  # the shard's, not the tenant's: it stays here
    src, dst = ShardSide(shard, "acme"), ShardSide(target, "acme")
    controls = await src.controls()
    assert controls == TenantControls(limits, True, ("mail",))
    await dst.adopt_controls(controls)
    await dst.adopt_controls(controls)  # a re-run mover: the same
    assert await target.limits("acme") == limits
    assert await target.paused("acme") == (True, ["mail"])
    # Limits an admin set on the target meanwhile are kept.
    await target.set_limits("acme", TenantLimits(weight=5))
    await dst.adopt_controls(controls)
    assert await target.limits("acme") == TenantLimits(weight=5)

    await move_queued(src, dst)
    keys = await src.dedupe_keys()
    await dst.put(dedupe=keys)
    await src.drop(dedupe=keys)
    assert await src.finish(await src.submitted()) == (True, "")
    counters = await src.set_aside_counters()
    assert counters["unrunnable"] == 1
    await dst.add_counters("m1", counters, 60_000)
    await src.forget_counters()
    assert (await target.tenant_load("acme")).unrunnable_total == 1
    left = await dump(redis)
    assert not [k for k in left if "acme" in k], left
    assert "sq:paused" not in left and "sq:tqpaused" not in left
    assert left["sq:qpaused"] == {"everyone"}
    moved = await dump(target_redis)
    assert moved["sq:job:J1"]["xw"] == "w1"  # the hand-back's marks travel with the job
    assert moved["sq:counts:acme"]["bytes"] == "2"
