"""schedule_upsert.lua, schedule_delete.lua, schedule_advance.lua: seed schedules, run each
script, assert the whole resulting keyspace and every return code."""

from __future__ import annotations

import json
from typing import Any

import pytest
from redis.asyncio import Redis

from shardq.common.errors import NotFound, ResourceExhausted
from shardq.shard import FakeClock, ItemCode, NewJob, ScheduleSpec, ShardClient
from shardq.shard.models import DueTick, Schedule
from tests.support.shard import NOW  # 2023-11-14 22:13:20 UTC
from tests.support.state import dump

EVERY_5_MIN_TICK = 1_700_000_100_000  # 22:15:00 UTC
NINE_UTC_TICK = 1_700_038_800_000  # 2023-11-15 09:00 UTC
NINE_PARIS_TICK = 1_700_035_200_000  # 2023-11-15 09:00 Europe/Paris (08:00 UTC)


def spec(sid: str = "S1", cron: str = "*/5 * * * *", **kw: Any) -> ScheduleSpec:
    return ScheduleSpec(schedule_id=sid, cron=cron, handler="h", payload=b'{"n":1}', **kw)


def body(cron: str = "*/5 * * * *", tz: str = "UTC", **over: Any) -> dict[str, Any]:
    b = {
        "cron": cron, "tz": tz, "handler": "h", "payload": '{"n":1}', "priority": 0,
        "max_attempts": 0, "timeout_ms": 0, "created_at_ms": NOW,
    }  # fmt: skip
    b.update(over)
    return b


async def state(redis: Redis) -> dict[str, Any]:
    """The whole keyspace, with schedule specs parsed so a diff shows the field that differs."""
    out = await dump(redis)
    for key, value in out.items():
        if key.startswith("sq:schedules:"):
            out[key] = {sid: json.loads(text) for sid, text in value.items()}
    return out


@pytest.mark.parametrize(
    ("cron", "tz", "tick"),
    [
        ("*/5 * * * *", "UTC", EVERY_5_MIN_TICK),
        ("0 9 * * *", "UTC", NINE_UTC_TICK),
        ("0 9 * * *", "Europe/Paris", NINE_PARIS_TICK),
    ],
)
async def test_a_new_schedule_is_stored_with_its_next_tick_in_its_time_zone(
    shard: ShardClient, redis: Redis, cron: str, tz: str, tick: int
) -> None:
    got = await shard.upsert_schedule("acme", spec(cron=cron, time_zone=tz))
    assert got == Schedule(spec(cron=cron, time_zone=tz, created_at_ms=NOW), "acme", tick)
    assert await state(redis) == {
        "sq:schedules:acme": {"S1": body(cron, tz)},
        "sq:promoter_wake": ["1"],
        "sq:cron": [("acme/S1", tick)],
    }


async def test_upserting_an_existing_schedule_replaces_its_spec_and_next_tick(
    shard: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    await shard.upsert_schedule("acme", spec())
    await shard.upsert_schedule("bravo", spec())
    clock.advance(3_600_000)
    await shard.upsert_schedule("acme", spec(cron="0 9 * * *", priority=4, created_at_ms=NOW))
    assert await state(redis) == {
        "sq:schedules:acme": {"S1": body("0 9 * * *", priority=4)},
        "sq:schedules:bravo": {"S1": body()},
        "sq:promoter_wake": ["1"],
        "sq:cron": [("bravo/S1", EVERY_5_MIN_TICK), ("acme/S1", NINE_UTC_TICK)],
    }


async def test_a_new_schedule_over_the_tenants_cap_is_refused_and_writes_nothing(
    shard: ShardClient, redis: Redis
) -> None:
    await shard.upsert_schedule("acme", spec("S1"), max_schedules=1)
    before = await dump(redis)
    with pytest.raises(ResourceExhausted) as err:
        await shard.upsert_schedule("acme", spec("S2"), max_schedules=1)
    assert err.value.field == "schedule_id"
    assert await dump(redis) == before


async def test_replacing_a_schedule_at_the_cap_is_allowed(shard: ShardClient, redis: Redis) -> None:
    await shard.upsert_schedule("acme", spec("S1"), max_schedules=1)
    await shard.upsert_schedule("acme", spec("S1", cron="0 9 * * *"), max_schedules=1)
    assert await state(redis) == {
        "sq:schedules:acme": {"S1": body("0 9 * * *")},
        "sq:promoter_wake": ["1"],
        "sq:cron": [("acme/S1", NINE_UTC_TICK)],
    }


async def test_only_a_tick_earlier_than_every_other_wakes_the_shard_loop(
    shard: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    await shard.upsert_schedule("acme", spec("S1", cron="0 9 * * *"))
    await redis.delete("sq:promoter_wake")
    await shard.upsert_schedule("acme", spec("S2", cron="0 10 * * *"))
    assert await redis.exists("sq:promoter_wake") == 0
    await shard.upsert_schedule("acme", spec("S3"))
    assert await redis.lrange("sq:promoter_wake", 0, -1) == [b"1"]


async def test_the_cap_is_per_tenant(shard: ShardClient, redis: Redis) -> None:
    await shard.upsert_schedule("acme", spec("S1"), max_schedules=1)
    await shard.upsert_schedule("bravo", spec("S1"), max_schedules=1)
    assert len(await redis.zrange("sq:cron", 0, -1)) == 2


async def test_deleting_a_schedule_removes_its_spec_and_its_tick(
    shard: ShardClient, redis: Redis
) -> None:
    await shard.upsert_schedule("acme", spec("S1"))
    await shard.upsert_schedule("acme", spec("S2"))
    await shard.delete_schedule("acme", "S1")
    assert await state(redis) == {
        "sq:schedules:acme": {"S2": body()},
        "sq:promoter_wake": ["1"],
        "sq:cron": [("acme/S2", EVERY_5_MIN_TICK)],
    }
    await shard.delete_schedule("acme", "S2")
    assert await dump(redis) == {"sq:promoter_wake": ["1"]}


@pytest.mark.parametrize(("tenant", "sid"), [("acme", "NOPE"), ("bravo", "S1")])
async def test_deleting_a_missing_or_another_tenants_schedule_is_not_found(
    shard: ShardClient, redis: Redis, tenant: str, sid: str
) -> None:
    await shard.upsert_schedule("acme", spec("S1"))
    before = await dump(redis)
    with pytest.raises(NotFound) as err:
        await shard.delete_schedule(tenant, sid)
    assert err.value.field == "schedule_id"
    assert await dump(redis) == before


async def test_deleting_a_schedule_leaves_the_jobs_it_enqueued(
    shard: ShardClient, redis: Redis
) -> None:
    await shard.upsert_schedule("acme", spec("S1"))
    await shard.enqueue([NewJob("acme", "h", b"{}", f"cron:S1:{EVERY_5_MIN_TICK}", job_id="J1")])
    await shard.delete_schedule("acme", "S1")
    assert await redis.hget("sq:job:J1", "s") == b"ready"


async def test_a_due_tick_is_listed_once_its_time_comes(
    shard: ShardClient, clock: FakeClock
) -> None:
    await shard.upsert_schedule("acme", spec("S1"))
    assert await shard.due_ticks() == []
    clock.set(EVERY_5_MIN_TICK)
    assert await shard.due_ticks() == [DueTick("acme", "S1", EVERY_5_MIN_TICK)]


async def test_advancing_from_the_fired_tick_moves_the_schedule_to_its_next_tick(
    shard: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    await shard.upsert_schedule("acme", spec("S1"))
    clock.set(EVERY_5_MIN_TICK)
    (tick,) = await shard.due_ticks()
    assert await shard.advance_schedule(tick, EVERY_5_MIN_TICK + 300_000) is ItemCode.OK
    assert await state(redis) == {
        "sq:schedules:acme": {"S1": body()},
        "sq:promoter_wake": ["1"],
        "sq:cron": [("acme/S1", EVERY_5_MIN_TICK + 300_000)],
    }
    assert await shard.due_ticks() == []


async def test_advancing_a_tick_another_loop_already_advanced_is_a_conflict(
    shard: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    await shard.upsert_schedule("acme", spec("S1"))
    clock.set(EVERY_5_MIN_TICK)
    (tick,) = await shard.due_ticks()
    assert await shard.advance_schedule(tick, EVERY_5_MIN_TICK + 300_000) is ItemCode.OK
    before = await dump(redis)
    assert await shard.advance_schedule(tick, EVERY_5_MIN_TICK + 999) is ItemCode.CONFLICT
    assert await dump(redis) == before


async def test_advancing_a_schedule_deleted_meanwhile_is_not_found_and_does_not_revive_it(
    shard: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    await shard.upsert_schedule("acme", spec("S1"))
    clock.set(EVERY_5_MIN_TICK)
    (tick,) = await shard.due_ticks()
    await shard.delete_schedule("acme", "S1")
    assert await shard.advance_schedule(tick, EVERY_5_MIN_TICK + 300_000) is ItemCode.NOT_FOUND
    assert await dump(redis) == {"sq:promoter_wake": ["1"]}
