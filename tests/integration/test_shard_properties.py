"""Properties of one shard that hold across scripts: time, cost, priority, fairness, fencing,
script-cache loss, input checking and listing."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from redis.asyncio import Redis

from shardq.common.errors import InvalidArgument
from shardq.shard import (
    ClaimedJob,
    Failure,
    FakeClock,
    ItemCode,
    Lease,
    NewJob,
    ScheduleSpec,
    ShardClient,
    ShardSettings,
    TenantLimits,
)
from shardq.shard.moving import ShardSide, fence_map
from shardq.shard.records import JOB_FORMAT
from shardq.shard.scripts import SCRIPT_NAMES
from tests.support.shard import LEASE, NOW, job, seed_previous_layout
from tests.support.state import dump

DAY = 86_400_000


async def enqueue_many(shard: ShardClient, jobs: list[NewJob]) -> None:
    for i in range(0, len(jobs), 500):
        results = await shard.enqueue(jobs[i : i + 500])
        assert all(r.code is ItemCode.OK for r in results)


# --- time ----------------------------------------------------------------------------------


async def test_a_job_scheduled_for_the_future_is_never_claimable_before_its_time(
    shard: ShardClient, clock: FakeClock
) -> None:
    rng = random.Random(5)
    delays = {f"J{i}": rng.randrange(1, 200) for i in range(40)}
    delays |= {"E0": 1, "E1": 199, "E2": 200}
    await shard.enqueue([job(jid, delay_ms=d) for jid, d in delays.items()])
    claimed_at: dict[str, int] = {}
    for _ in range(205):
        clock.advance(1)
        await shard.promote()
        for c in await shard.claim("w1", 50, LEASE):
            assert c.job_id not in claimed_at
            claimed_at[c.job_id] = clock.now_ms()
    # Never before its time, and (promoted every ms) claimable the very ms it is due.
    assert claimed_at == {jid: NOW + d for jid, d in delays.items()}


# --- promotion cost ------------------------------------------------------------------------

#: Future jobs seeded before measuring promote. Seeding 200,000 through ShardClient.enqueue takes
#: ~34 s on 2 cores, so 1,000 go through enqueue and the rest are written as enqueue.lua would
#: write them (job hash, tenant's delayed ZSET, the tenant on ``due``), in pipelined batches.
FUTURE_JOBS = 200_000
ENQUEUED_FUTURE_JOBS = 1_000
DUE_JOBS = 100


async def _promote_command_calls(shard: ShardClient, redis: Redis) -> dict[str, int]:
    """Per-command call counts of one promote() that moves DUE_JOBS jobs."""
    await redis.config_resetstat()
    total, _ = await shard.promote()
    assert total == DUE_JOBS
    stats = await redis.info("commandstats")
    return {name: s["calls"] for name, s in stats.items()}


async def _seed_due(shard: ShardClient, clock: FakeClock) -> None:
    await shard.promote()  # load the script, so a NOSCRIPT retry is not measured
    await shard.enqueue([job(f"D{i}", tenant=f"t{i % 7}", delay_ms=1_000) for i in range(100)])
    clock.advance(1_000)


async def _seed_future_like_enqueue(redis: Redis, clock: FakeClock, numbers: range) -> None:
    now = clock.now_ms()
    for start in range(numbers.start, numbers.stop, 10_000):
        chunk = range(start, min(start + 10_000, numbers.stop))
        pipe = redis.pipeline(transaction=False)
        for i in chunk:
            t = f"t{i % 7}"
            pipe.zadd(f"sq:tscheduled:{t}", {f"F{i}": now + DAY + i})
            pipe.zadd("sq:due", {t: now + DAY + i}, lt=True)
            pipe.hset(
                f"sq:job:F{i}",
                mapping={"t": t, "r": f"F{i}", "h": "h", "p": "{}", "pr": 0, "s": "scheduled",
                         "ra": now + DAY + i, "ca": now, "at": 0, "ma": 5, "to": 300_000, "f": 0},
            )  # fmt: skip
        await pipe.execute()


async def test_promotion_cost_does_not_grow_with_the_number_of_future_jobs(
    shard: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    await _seed_due(shard, clock)
    empty = await _promote_command_calls(shard, redis)
    await redis.flushall()

    future = [
        job(f"F{i}", tenant=f"t{i % 7}", delay_ms=DAY + i) for i in range(ENQUEUED_FUTURE_JOBS)
    ]
    await enqueue_many(shard, future)
    await _seed_future_like_enqueue(redis, clock, range(ENQUEUED_FUTURE_JOBS, FUTURE_JOBS))
    await _seed_due(shard, clock)
    assert await _scheduled(redis) == FUTURE_JOBS + DUE_JOBS
    crowded = await _promote_command_calls(shard, redis)

    # The same commands, but that each tenant stays on `due` (ZADD of its next run-at) where
    # on the empty shard it leaves it (ZREM).
    assert crowded.pop("cmdstat_zadd") - empty.pop("cmdstat_zadd") == 7
    assert empty.pop("cmdstat_zrem") - crowded.pop("cmdstat_zrem") == 7
    assert crowded == empty
    assert empty["cmdstat_evalsha"] == 1
    assert await _scheduled(redis) == FUTURE_JOBS


async def _scheduled(redis: Redis) -> int:
    return sum([await redis.zcard(f"sq:tscheduled:t{i}") for i in range(7)])


# --- priority and fairness -----------------------------------------------------------------


@pytest.mark.parametrize("batch", [1, 7, 500])
async def test_claims_come_out_highest_priority_first_whatever_the_submission_order(
    shard: ShardClient, batch: int
) -> None:
    jobs = [job(f"P{p}N{n}", priority=p) for p in range(10) for n in range(5)]
    random.Random(batch).shuffle(jobs)
    await shard.enqueue(jobs)
    claimed: list[ClaimedJob] = []
    while got := await shard.claim("w1", batch, LEASE):
        claimed += got
    assert len(claimed) == 50
    priorities = [c.priority for c in claimed]
    assert priorities == sorted(priorities, reverse=True)
    # Within a priority, submission order.
    for p in range(10):
        order = [j.job_id for j in jobs if j.priority == p]
        assert [c.job_id for c in claimed if c.priority == p] == order


@pytest.mark.parametrize("batch", [1, 20], ids=["one-at-a-time", "batches-of-20"])
async def test_a_small_tenant_is_served_within_the_first_claims_despite_a_big_backlog(
    shard: ShardClient, batch: int
) -> None:
    # The big tenant submits first, so it is at the head of the ring (the harder order).
    big = [job(f"A{i}", tenant="alpha") for i in range(10_000)]
    small = [job(f"B{i}", tenant="bravo") for i in range(10)]
    await enqueue_many(shard, big + small)
    first: list[ClaimedJob] = []
    while len(first) < 20:
        first += await shard.claim("w1", batch, LEASE)
    assert len(first) == 20
    assert sorted(c.job_id for c in first if c.tenant == "bravo") == sorted(j.job_id for j in small)


# --- fencing ---------------------------------------------------------------------------


async def test_stale_fences_cannot_ack_fail_or_heartbeat_and_reaped_jobs_are_claimed_once(
    shard: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    await shard.enqueue([job(f"J{i}") for i in range(30)])
    old = await shard.claim("w1", 30, LEASE)
    clock.advance(LEASE)
    assert await shard.reap() == (30, 0)

    batches = await asyncio.gather(*(shard.claim(f"w{i}", 4, LEASE) for i in range(10)))
    again = [c for b in batches for c in b]
    assert sorted(c.job_id for c in again) == sorted(c.job_id for c in old)
    assert {c.fence for c in again}.isdisjoint({c.fence for c in old})
    assert await shard.claim("w99", 30, LEASE) == []

    stale = [Lease(c.job_id, c.fence) for c in old]
    before = await dump(redis)
    assert set(await shard.heartbeat(stale, LEASE)) == {ItemCode.STALE_LEASE}
    assert set(await shard.ack(stale)) == {ItemCode.STALE_LEASE}
    fails = await shard.fail([Failure(c.job_id, c.fence, 1, "late") for c in old])
    assert {r.code for r in fails} == {ItemCode.STALE_LEASE}
    assert await dump(redis) == before

    current = [Lease(c.job_id, c.fence) for c in again]
    assert set(await shard.ack(current)) == {ItemCode.OK}


# --- script cache ----------------------------------------------------------------------


class _OneCallPerScript:
    """One ShardClient call per Lua script, in an order where each has something to do."""

    def __init__(self, shard: ShardClient, clock: FakeClock) -> None:
        self.shard, self.clock = shard, clock
        self.claimed: list[ClaimedJob] = []
        self.taken: list[str] = []

    async def enqueue(self) -> None:
        results = await self.shard.enqueue([job("J1"), job("J2"), job("J3", delay_ms=10)])
        assert [r.code for r in results] == [ItemCode.OK] * 3

    async def precheck(self) -> None:  # J3, delayed, never claimed
        page = await self.shard.precheck_page(0, 2**53, ["acme"], 0, 10)
        assert [j for j, _, _ in page.jobs] == ["J3"]

    async def prechecked(self) -> None:
        assert await self.shard.mark_prechecked(["J3"]) == 1

    async def claim(self) -> None:
        self.claimed = await self.shard.claim("w1", 3, LEASE)
        assert [c.job_id for c in self.claimed] == ["J1", "J2"]

    async def heartbeat(self) -> None:
        c = self.claimed[0]
        assert await self.shard.heartbeat([Lease(c.job_id, c.fence)], LEASE) == [ItemCode.OK]

    async def ack(self) -> None:
        c = self.claimed[0]
        assert await self.shard.ack([Lease(c.job_id, c.fence)]) == [ItemCode.OK]

    async def fail(self) -> None:
        c = self.claimed[1]
        (res,) = await self.shard.fail([Failure(c.job_id, c.fence, 1, "x", permanent=True)])
        assert (res.code, res.state) == (ItemCode.OK, "dead")

    async def requeue(self) -> None:
        assert await self.shard.requeue_dead("acme", ["J2"]) == (1, [])

    async def promote(self) -> None:
        self.clock.advance(10)
        assert await self.shard.promote() == (1, None)

    async def cancel(self) -> None:
        assert await self.shard.cancel("acme", "J3") == (ItemCode.OK, "cancelled")

    async def reap(self) -> None:
        await self.shard.claim("w1", 1, LEASE)
        self.clock.advance(LEASE)
        assert await self.shard.reap() == (1, 0)

    async def release(self) -> None:
        (c,) = await self.shard.claim("w1", 1, LEASE)
        assert await self.shard.release([Lease(c.job_id, c.fence)], 1_000) == [ItemCode.OK]

    async def schedule_upsert(self) -> None:
        await self.shard.upsert_schedule("acme", ScheduleSpec("S1", "* * * * *", "h", b"{}"))

    async def schedule_advance(self) -> None:
        self.clock.advance(60_000)
        (tick,) = await self.shard.due_ticks()
        assert await self.shard.advance_schedule(tick, tick.tick_ms + 60_000) is ItemCode.OK

    async def schedule_delete(self) -> None:
        await self.shard.delete_schedule("acme", "S1")

    async def leader(self) -> None:
        assert await self.shard.acquire_leader("i1", 10_000) is True

    async def leader_release(self) -> None:
        assert await self.shard.release_leader("i1") is True

    async def map_fence(self) -> None:
        assert await fence_map(self.shard, 1) == 1

    async def move_schedules_out(self) -> None:
        await self.shard.upsert_schedule("acme", ScheduleSpec("S2", "* * * * *", "h", b"{}"))
        assert await ShardSide(self.shard, "acme").take_schedules() == 1

    async def move_in(self) -> None:  # the set-aside schedule back in place: as on a target
        side = ShardSide(self.shard, "acme")
        assert await side.put(schedules=await side.taken_schedules()) == (0, 0, 1)

    async def move_out(self) -> None:
        await self.shard.enqueue([job("J9", delay_ms=10_000)])
        side = ShardSide(self.shard, "acme")
        assert await side.take(10) >= 1  # J9, and any job earlier steps left queued
        self.taken = await side.taken()

    async def move_drop(self) -> None:
        side = ShardSide(self.shard, "acme")
        dropped = await side.drop(job_ids=self.taken, schedule_ids=["S2"])
        assert dropped == (len(self.taken), 0, 1)

    async def move_finish(self) -> None:
        side = ShardSide(self.shard, "acme")
        assert await side.finish(await side.submitted()) == (False, "schedules")

    async def move_counters(self) -> None:
        assert await ShardSide(self.shard, "bob").add_counters("m1", {"submitted": 1}, 1000)

    async def set_limits(self) -> None:
        await self.shard.set_limits("acme", TenantLimits(weight=2, max_active=1))
        assert (await self.shard.limits("acme")).max_active == 1

    async def pause(self) -> None:
        assert await self.shard.pause("acme", "mail") is True

    async def resume(self) -> None:
        assert await self.shard.resume("acme", "mail") is True

    async def upgrade_layout(self) -> None:
        await seed_previous_layout(self.shard.redis, {("old", 3): ["O1", "O2"]}, {"old": 2})
        assert await self.shard.upgrade_layout() == 2

    async def job_format(self) -> None:
        assert await self.shard.raise_job_format() == (1, JOB_FORMAT)

    async def rows_written(self) -> None:  # J3's cancelled row: Redis agrees already
        assert await self.shard.rows_written([("J3", None, "cancelled")]) == [False]


ORDER = [
    "enqueue", "precheck", "prechecked", "claim", "heartbeat", "ack", "fail", "requeue",
    "promote", "cancel", "reap", "release", "schedule_upsert", "schedule_advance",
    "schedule_delete", "leader", "leader_release",
    "map_fence", "move_schedules_out", "move_in", "move_out", "move_drop", "move_finish",
    "move_counters", "set_limits", "pause", "resume", "upgrade_layout", "job_format",
    "rows_written",
]  # fmt: skip


async def test_every_script_still_works_after_the_script_cache_is_flushed(
    shard: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    assert sorted(ORDER) == sorted(SCRIPT_NAMES)
    # Load every script once, so each call below really meets a cache that lost it.
    for name in SCRIPT_NAMES:
        await redis.script_load(shard._scripts[name].script)
    calls = _OneCallPerScript(shard, clock)
    for name in ORDER:
        await redis.script_flush()
        await getattr(calls, name)()
        assert await redis.script_exists(shard._scripts[name].sha) == [True], name


# --- input checking ------------------------------------------------------------------------

Call = Callable[[ShardClient], Awaitable[Any]]
BIG = b"x" * (1_048_576 + 1)


def _enqueue(**kw: Any) -> Call:
    fields = {"tenant": "acme", "handler": "h", "payload": b"{}", "request_id": "rX"} | kw
    return lambda s: s.enqueue([job("OK1"), NewJob(**fields)])


def _schedule(**kw: Any) -> Call:
    fields: dict[str, Any] = {"schedule_id": "S1", "cron": "* * * * *", "handler": "h"}
    fields |= {"payload": b"{}"} | kw
    return lambda s: s.upsert_schedule("acme", ScheduleSpec(**fields))


BAD_INPUT: list[tuple[str, Call, str]] = [
    *(
        (f"enqueue-tenant-{name}", _enqueue(tenant=t), "tenant_id")
        for name, t in [
            ("colon", "a:b"),
            ("brace", "a{b}"),
            ("star", "a*"),
            ("nul", "a\0b"),
            ("65-chars", "x" * 65),
            ("empty", ""),
        ]
    ),
    ("enqueue-priority-minus-1", _enqueue(priority=-1), "priority"),
    ("enqueue-priority-10", _enqueue(priority=10), "priority"),
    ("enqueue-priority-true", _enqueue(priority=True), "priority"),
    ("enqueue-priority-float", _enqueue(priority=1.0), "priority"),
    ("enqueue-tenant-bytes", _enqueue(tenant=b"acme"), "tenant_id"),
    ("enqueue-handler-none", _enqueue(handler=None), "handler"),
    ("enqueue-request-id-int", _enqueue(request_id=7), "request_id"),
    ("enqueue-max-attempts-true", _enqueue(max_attempts=True), "max_attempts"),
    ("enqueue-timeout-float", _enqueue(timeout_ms=1.5), "timeout_ms"),
    ("enqueue-negative-delay", _enqueue(delay_ms=-1), "delay_ms"),
    ("enqueue-negative-run-at", _enqueue(run_at_ms=-1), "run_at_ms"),
    ("enqueue-beyond-horizon", _enqueue(delay_ms=367 * DAY), "delay_ms"),
    ("enqueue-run-at-and-delay", _enqueue(run_at_ms=NOW, delay_ms=0), "delay_ms"),
    ("enqueue-empty-request-id", _enqueue(request_id=""), "request_id"),
    ("enqueue-oversized-payload", _enqueue(payload=BIG), "payload"),
    ("enqueue-str-payload", _enqueue(payload="{}"), "payload"),
    ("enqueue-bad-handler", _enqueue(handler="a b"), "handler"),
    ("enqueue-bad-job-id", _enqueue(job_id="J:1"), "job_id"),
    ("enqueue-max-attempts", _enqueue(max_attempts=1_001), "max_attempts"),
    ("enqueue-timeout", _enqueue(timeout_ms=-5), "timeout_ms"),
    ("enqueue-queue-colon", _enqueue(queue="a:b"), "queue"),
    ("enqueue-queue-empty", _enqueue(queue=""), "queue"),
    ("enqueue-queue-65-chars", _enqueue(queue="q" * 65), "queue"),
    (
        "enqueue-default-rate",
        _enqueue(limits=TenantLimits(submit_rate_per_s=-1)),
        "submit_rate_per_s",
    ),
    ("enqueue-default-burst", _enqueue(limits=TenantLimits(submit_burst=-1)), "submit_burst"),
    (
        "enqueue-default-bytes",
        _enqueue(limits=TenantLimits(max_pending_bytes=-1)),
        "max_pending_bytes",
    ),
    ("claim-worker", lambda s: s.claim("w 1", 1, LEASE), "worker_id"),
    ("claim-zero-jobs", lambda s: s.claim("w1", 0, LEASE), "max_jobs"),
    ("claim-too-many-jobs", lambda s: s.claim("w1", 501, LEASE), "max_jobs"),
    ("claim-zero-lease", lambda s: s.claim("w1", 1, 0), "lease_ms"),
    ("claim-no-queue", lambda s: s.claim("w1", 1, LEASE, []), "queues"),
    ("claim-queue-string", lambda s: s.claim("w1", 1, LEASE, "default"), "queues"),  # type: ignore[arg-type]
    ("claim-queue-star", lambda s: s.claim("w1", 1, LEASE, ["default", "q*"]), "queues"),
    (
        "claim-101-queues",
        lambda s: s.claim("w1", 1, LEASE, [f"q{i}" for i in range(101)]),
        "queues",
    ),
    ("wait-queue-brace", lambda s: s.wait_for_work(0.01, ["a{b}"]), "queues"),
    ("release-negative-avoid", lambda s: s.release([Lease("J1", 1)], avoid_ms=-1), "avoid_ms"),
    ("cancel-tenant", lambda s: s.cancel("a:b", "J1"), "tenant_id"),
    ("cancel-job-id", lambda s: s.cancel("acme", "J*"), "job_id"),
    ("get-job-tenant", lambda s: s.get_job("a{b}", "J1"), "tenant_id"),
    ("get-job-id", lambda s: s.get_job("acme", ""), "job_id"),
    ("requeue-tenant", lambda s: s.requeue_dead("x" * 65, ["J1"]), "tenant_id"),
    ("requeue-job-id", lambda s: s.requeue_dead("acme", ["J1", "J:2"]), "job_id"),
    ("list-tenant", lambda s: s.list_jobs("a:b", "ready"), "tenant_id"),
    ("list-state", lambda s: s.list_jobs("acme", "succeeded"), "state"),
    ("list-page-size-0", lambda s: s.list_jobs("acme", "dead", page_size=0), "page_size"),
    ("list-page-size-1001", lambda s: s.list_jobs("acme", "dead", 1_001), "page_size"),
    ("list-token-text", lambda s: s.list_jobs("acme", "dead", page_token="x"), "page_token"),
    ("list-token-negative", lambda s: s.list_jobs("acme", "active", page_token="-1"), "page_token"),
    ("list-ready-token-text", lambda s: s.list_jobs("acme", "ready", page_token="x"), "page_token"),
    (
        "list-ready-token-priority",
        lambda s: s.list_jobs("acme", "ready", page_token="10.0"),
        "page_token",
    ),
    (
        "list-ready-token-negative",
        lambda s: s.list_jobs("acme", "ready", page_token="9.-1"),
        "page_token",
    ),
    ("schedule-cron-fields", _schedule(cron="* * *"), "cron"),
    ("schedule-cron-range", _schedule(cron="61 * * * *"), "cron"),
    ("schedule-cron-text", _schedule(cron="every day"), "cron"),
    ("schedule-time-zone", _schedule(time_zone="Mars/Olympus_Mons"), "time_zone"),
    ("schedule-id", _schedule(schedule_id="a:b"), "schedule_id"),
    ("schedule-handler", _schedule(handler=""), "handler"),
    ("schedule-priority", _schedule(priority=10), "priority"),
    ("schedule-payload", _schedule(payload=BIG), "payload"),
    ("delete-schedule-id", lambda s: s.delete_schedule("acme", "S*"), "schedule_id"),
    ("limits-weight", lambda s: s.set_limits("acme", TenantLimits(weight=1_001)), "weight"),
    ("limits-tenant", lambda s: s.set_limits("a:b", TenantLimits(weight=2)), "tenant_id"),
    ("limits-active", lambda s: s.set_limits("acme", TenantLimits(max_active=-1)), "max_active"),
    (
        "limits-rate",
        lambda s: s.set_limits("acme", TenantLimits(submit_rate_per_s=float("nan"))),
        "submit_rate_per_s",
    ),
    (
        "limits-burst",
        lambda s: s.set_limits("acme", TenantLimits(submit_burst=2**32)),
        "submit_burst",
    ),
    ("limits-pending", lambda s: s.set_limits("acme", TenantLimits(max_pending=-1)), "max_pending"),
    (
        "limits-bytes",
        lambda s: s.set_limits("acme", TenantLimits(max_pending_bytes=2**53 + 1)),
        "max_pending_bytes",
    ),
    ("limits-read-tenant", lambda s: s.limits("a*"), "tenant_id"),
    ("pause-nothing", lambda s: s.pause(), "tenant_id"),
    ("pause-tenant", lambda s: s.pause("a:b"), "tenant_id"),
    ("pause-queue", lambda s: s.pause(queue="a b"), "queue"),
    ("resume-nothing", lambda s: s.resume(None, ""), "tenant_id"),
    ("resume-queue", lambda s: s.resume("acme", "a:b"), "queue"),
    ("paused-tenant", lambda s: s.paused("a{b}"), "tenant_id"),
    (
        "list-ready-token-queue",
        lambda s: s.list_jobs("acme", "ready", page_token="9.0.a:b"),
        "page_token",
    ),
]


@pytest.mark.parametrize(("call", "field"), [pytest.param(c, f, id=i) for i, c, f in BAD_INPUT])
async def test_bad_input_raises_invalid_argument_naming_the_field_and_writes_nothing(
    shard: ShardClient, redis: Redis, call: Call, field: str
) -> None:
    await shard.enqueue([job("J1")])
    before = await dump(redis)
    await redis.config_resetstat()
    with pytest.raises(InvalidArgument) as err:
        await call(shard)
    assert err.value.field == field
    assert await dump(redis) == before
    assert "cmdstat_evalsha" not in await redis.info("commandstats")


async def test_bad_input_on_an_empty_shard_writes_nothing(shard: ShardClient, redis: Redis) -> None:
    for _, call, _ in BAD_INPUT:
        with pytest.raises(InvalidArgument):
            await call(shard)
    assert await dump(redis) == {}


# --- listing -------------------------------------------------------------------------------


async def _seed_every_state(shard: ShardClient, clock: FakeClock, tenant: str) -> dict[str, list]:
    """Seven jobs of the tenant in each listable state; returns their IDs in listing order.

    The active and dead ones go through queue "run", which only this seeding claims from: a
    claim takes turns between tenants, so another tenant's ready jobs must not be in its way.
    """
    t = tenant[0].upper()
    active = [job(f"{t}A{i}", tenant, priority=9, queue="run") for i in range(7)]
    await shard.enqueue(active)
    assert len(await shard.claim("w1", 7, LEASE, ["run"])) == 7
    dead = [job(f"{t}D{i}", tenant, priority=9, queue="run") for i in range(7)]
    for d in dead:
        await shard.enqueue([d])
        (c,) = await shard.claim("w1", 1, LEASE, ["run"])
        await shard.fail([Failure(c.job_id, c.fence, 1, "x", permanent=True)])
        clock.advance(1)
    scheduled = [job(f"{t}S{i}", tenant, delay_ms=DAY - i) for i in range(7)]
    ready = [job(f"{t}R{i}", tenant, priority=i % 3) for i in range(7)]
    mail = [job(f"{t}M{i}", tenant, priority=i % 2, queue="mail") for i in range(4)]
    cancelled = [job(f"{t}C{i}", tenant, priority=i % 3) for i in range(3)]
    await shard.enqueue([*ready[:3], *mail[:2], *cancelled, *ready[3:], *mail[2:], *scheduled])
    for c in cancelled:
        await shard.cancel(tenant, c.job_id)
    return {
        "active": [j.job_id for j in active],
        "dead": [j.job_id for j in reversed(dead)],
        "scheduled": [j.job_id for j in reversed(scheduled)],
        # Queue by queue (by name), most urgent first, then FIFO.
        "ready": [j.job_id for q in (ready, mail) for p in (2, 1, 0) for j in q if j.priority == p],
    }


@pytest.mark.parametrize("page_size", [1, 2, 3, 6, 7, 100])
async def test_paging_through_each_state_lists_each_job_exactly_once(
    shard: ShardClient, clock: FakeClock, page_size: int
) -> None:
    expected = await _seed_every_state(shard, clock, "acme")
    await _seed_every_state(shard, clock, "bravo")
    for state, ids in expected.items():
        seen: list[str] = []
        token = ""
        for _ in range(20):
            page = await shard.list_jobs("acme", state, page_size, token)
            assert len(page.jobs) <= page_size
            assert all(j.state == state and j.tenant == "acme" for j in page.jobs)
            seen += [j.job_id for j in page.jobs]
            token = page.next_page_token
            if not token:
                break
        assert seen == ids, state


async def test_ready_listing_skips_jobs_whose_cancelled_hash_has_already_expired(
    redis: Redis, clock: FakeClock
) -> None:
    # Cancelled-while-ready IDs stay in the ready list until a claim pops them, and the
    # cancelled job's hash expires after retention_ms: the listing must neither show nor
    # repeat anything around such an ID.
    shard = ShardClient(redis, ShardSettings(key_prefix="sq", retention_ms=1), clock)
    await shard.enqueue([job("P1", priority=5), job("P2", priority=5)])
    await shard.enqueue([job("X1"), job("A1"), job("B1")])
    await shard.cancel("acme", "X1")
    await asyncio.sleep(0.01)
    assert not await redis.exists("sq:job:X1")
    seen: list[str] = []
    token = ""
    while True:
        page = await shard.list_jobs("acme", "ready", 3, token)
        seen += [j.job_id for j in page.jobs]
        if not (token := page.next_page_token):
            break
    assert seen == ["P1", "P2", "A1", "B1"]
