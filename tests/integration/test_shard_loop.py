"""The shard loop: promotion on time without polling, leader lease and failover, cron ticks."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from redis.asyncio import Redis

from shardq.coordinator.tools.redis_server import RedisProcess, free_port, parent_death_prefix
from shardq.shard import FakeClock, NewJob, ScheduleSpec, ShardClient, ShardSettings, SystemClock
from shardq.shard.loop import LoopSettings, ShardLoop
from shardq.store.migrate import upgrade
from tests.support.workers import result_rows

SETTINGS = ShardSettings(key_prefix="sq")


def job(request_id: str, **kw: Any) -> NewJob:
    return NewJob(tenant="acme", handler="h", payload=b"{}", request_id=request_id, **kw)


@asynccontextmanager
async def loop_running(redis: Redis, **settings: Any) -> AsyncIterator[ShardLoop]:
    # A long idle cap: anything the loop does early must come from a wake-up, not a poll.
    kw: dict[str, Any] = {"leader_ttl_ms": 1_000, "reap_interval_ms": 100, "max_idle_ms": 60_000}
    loop = ShardLoop(ShardClient(redis, SETTINGS), LoopSettings(**(kw | settings)))
    task = asyncio.create_task(loop.run())
    try:
        yield loop
    finally:
        loop.stop()
        await asyncio.wait_for(task, 10)


@pytest.fixture
async def running_loop(redis: Redis) -> AsyncIterator[ShardLoop]:
    async with loop_running(redis) as loop:
        yield loop


async def wait_for_state(shard: ShardClient, job_id: str, state: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while (await shard.get_job("acme", job_id)).state != state:
        assert time.monotonic() < deadline, f"{job_id} never became {state}"
        await asyncio.sleep(0.005)


@pytest.mark.parametrize("ahead", [0, LoopSettings().promote_ahead_ms])
async def test_a_delayed_job_is_promoted_its_ahead_before_its_time_and_not_sooner(
    redis: Redis, ahead: int
) -> None:
    # Promoted ahead (LoopSettings.promote_ahead_ms, 0: on its run-at), so that its worker
    # claims it before its run-at and starts it on it (tests/integration/test_promote_ahead.py).
    async with loop_running(redis, promote_ahead_ms=ahead) as loop:
        shard = ShardClient(redis, SETTINGS)
        (res,) = await shard.enqueue([job("r1", delay_ms=300)])
        run_at = (await shard.get_job("acme", res.job_id)).run_at_ms
        await wait_for_state(shard, res.job_id, "ready", timeout_s=10)
        assert SystemClock().now_ms() >= run_at - ahead
        assert loop.role == "leader"


def counted_calls(monkeypatch: pytest.MonkeyPatch, obj: Any, name: str) -> Callable[[], int]:
    """``obj.name`` (a coroutine method) still called, and counted: how many calls so far."""
    calls = 0
    real = getattr(obj, name)

    async def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        return await real(*args, **kwargs)

    monkeypatch.setattr(obj, name, counted)
    return lambda: calls


async def a_due_stream(redis: Redis, jobs: int = 200) -> None:
    """``jobs`` jobs due a ms apart from 300 ms on, until the last one is ready."""
    shard = ShardClient(redis, SETTINGS)
    first = SystemClock().now_ms() + 300
    done = await shard.enqueue([job(f"r{i}", run_at_ms=first + i) for i in range(jobs)])
    await wait_for_state(shard, done[-1].job_id, "ready", timeout_s=10)


async def test_jobs_due_a_ms_apart_are_promoted_a_quarter_window_at_a_time(
    redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The loop comes back for the next due job no sooner than a quarter of promote_ahead_ms
    # after its last promote: 200 jobs due 1 ms apart take ~40 promotes of 5 ms of run-ats
    # each (plus the wake-up of their enqueue), not one promote per job (142 before).
    async with loop_running(redis, promote_ahead_ms=20) as loop:
        promotes = counted_calls(monkeypatch, loop.shard, "promote")
        await a_due_stream(redis)
        assert 0 < promotes() <= 60


async def test_a_stream_of_due_jobs_reads_the_cron_schedules_only_when_woken(
    redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The cron ZSET is read when a tick is due, when the loop is woken (a schedule with the
    # earliest tick pushes a wake-up) and every max_idle_ms: not at every promote.
    async with loop_running(redis, promote_ahead_ms=20) as loop:
        reads = counted_calls(monkeypatch, loop.shard, "due_ticks")
        await a_due_stream(redis)
        assert reads() <= 3  # the enqueue's wake-up, not each of the ~40 promotes
        before = reads()
        shard = ShardClient(redis, SETTINGS)
        await shard.upsert_schedule("acme", ScheduleSpec("every-min", "* * * * *", "h", b"{}"))
        deadline = time.monotonic() + 10
        while reads() == before:  # the upsert's wake-up brings a read
            assert time.monotonic() < deadline, "the schedule's wake-up brought no cron read"
            await asyncio.sleep(0.01)


async def test_an_earlier_job_wakes_a_loop_sleeping_until_a_later_one(
    redis: Redis, running_loop: ShardLoop
) -> None:
    shard = ShardClient(redis, SETTINGS)
    await shard.enqueue([job("far", delay_ms=600_000)])
    await asyncio.sleep(0.2)  # the loop is now asleep until the far job (or the 60 s cap)
    (near,) = await shard.enqueue([job("near", delay_ms=100)])
    # Without the wake-up the loop would sleep for 60 s; the bound is generous for a busy CI.
    await wait_for_state(shard, near.job_id, "ready", timeout_s=10)


async def test_expired_leases_are_reaped_by_the_loop(redis: Redis, running_loop: ShardLoop) -> None:
    shard = ShardClient(redis, SETTINGS)
    (res,) = await shard.enqueue([job("r1")])
    (claimed,) = await shard.claim("w1", 1, lease_ms=50)
    await wait_for_state(shard, claimed.job_id, "ready", timeout_s=10)
    assert (await shard.get_job("acme", res.job_id)).last_error == "lease expired"


async def test_a_stopped_leader_releases_its_lease(redis: Redis) -> None:
    loop = ShardLoop(ShardClient(redis, SETTINGS), LoopSettings(leader_ttl_ms=60_000))
    task = asyncio.create_task(loop.run())
    while loop.role != "leader":
        await asyncio.sleep(0.01)
    loop.stop()
    await asyncio.wait_for(task, 10)
    assert await redis.exists("sq:leader") == 0


# --- recurring schedules, driven by a fake clock -------------------------------------------

MINUTE = 60_000
T0 = 1_700_000_040_000  # 2023-11-14 22:14:00 UTC, on a minute boundary


async def test_each_cron_tick_fires_once_even_with_two_loops(redis: Redis) -> None:
    clock = FakeClock(T0 - 1)
    a, b = ShardClient(redis, SETTINGS, clock), ShardClient(redis, SETTINGS, clock)
    await a.upsert_schedule("acme", ScheduleSpec("every-min", "* * * * *", "h", b"{}"))
    loops = [ShardLoop(c, LoopSettings()) for c in (a, b)]
    for _minute in range(3):
        clock.advance(MINUTE)
        await asyncio.gather(*(lp._fire_cron() for lp in loops))
        await asyncio.gather(*(lp._fire_cron() for lp in loops))
    counts = await a.counts("acme")
    assert counts.submitted == 3
    ids = await redis.keys("sq:dedupe:acme:cron:every-min:*")
    assert sorted(k.decode().rsplit(":", 1)[1] for k in ids) == [
        str(T0 + MINUTE * m) for m in range(3)
    ]


async def test_ticks_missed_while_no_loop_ran_fire_once_late(redis: Redis) -> None:
    clock = FakeClock(T0 - 1)
    shard = ShardClient(redis, SETTINGS, clock)
    await shard.upsert_schedule("acme", ScheduleSpec("m", "* * * * *", "h", b"{}"))
    clock.advance(10 * MINUTE + 5_000)  # ten ticks pass with no loop running
    next_tick = await ShardLoop(shard, LoopSettings())._fire_cron()
    assert (await shard.counts("acme")).submitted == 1
    assert next_tick == T0 + 11 * MINUTE


async def test_a_deleted_schedule_stops_firing(redis: Redis) -> None:
    clock = FakeClock(T0 - 1)
    shard = ShardClient(redis, SETTINGS, clock)
    await shard.upsert_schedule("acme", ScheduleSpec("m", "* * * * *", "h", b"{}"))
    await shard.delete_schedule("acme", "m")
    clock.advance(5 * MINUTE)
    assert await ShardLoop(shard, LoopSettings())._fire_cron() is None
    assert (await shard.counts("acme")).submitted == 0


# --- two shard loop processes: one leader, failover on SIGKILL -----------------------------


def start_loop_process(
    redis_url: str, name: str, stderr: int | None = None, **env_over: str
) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if k != "SHARDQ_DATABASE_URL"},
        "SHARDQ_REDIS_URL": redis_url,
        "SHARDQ_KEY_PREFIX": "sq",
        "SHARDQ_LEADER_TTL_MS": "1000",
        "SHARDQ_INSTANCE_ID": name,
        "SHARDQ_METRICS_PORT": str(port),
        "SHARDQ_LOG_LEVEL": "WARNING",
        **env_over,
    }
    cmd = [*parent_death_prefix(), sys.executable, "-m", "shardq.shard"]
    return subprocess.Popen(cmd, env=env, stderr=stderr), port


def health(port: int) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as r:
            body: dict[str, Any] = json.loads(r.read())
            return body
    except OSError:
        return None


def promoted_total(port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("shardq_promoted_jobs_total"):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.fixture
def two_loops(redis_proc: RedisProcess) -> Iterator[dict[str, tuple[subprocess.Popen[bytes], int]]]:
    procs = {n: start_loop_process(redis_proc.url, n) for n in ("alpha", "beta")}
    try:
        yield procs
    finally:
        for proc, _ in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(10)


def wait_roles(
    procs: dict[str, tuple[subprocess.Popen[bytes], int]], timeout_s: float
) -> dict[str, str]:
    deadline = time.monotonic() + timeout_s
    while True:
        roles = {
            n: (h or {}).get("role", "down")
            for n, (p, port) in procs.items()
            for h in [health(port) if p.poll() is None else None]
        }
        if list(roles.values()).count("leader") == 1 and "down" not in {
            r for n, r in roles.items() if procs[n][0].poll() is None
        }:
            return roles
        assert time.monotonic() < deadline, f"no single leader: {roles}"
        time.sleep(0.05)


async def test_only_the_leader_promotes_and_a_standby_takes_over_after_sigkill(
    redis: Redis, two_loops: dict[str, tuple[subprocess.Popen[bytes], int]]
) -> None:
    roles = wait_roles(two_loops, timeout_s=15)
    leader = next(n for n, r in roles.items() if r == "leader")
    standby = next(n for n in roles if n != leader)
    shard = ShardClient(redis, SETTINGS)
    await shard.enqueue([job(f"r{i}", delay_ms=50) for i in range(20)])
    deadline = time.monotonic() + 10
    while (await shard.counts("acme")).ready < 20:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)
    assert promoted_total(two_loops[leader][1]) == 20
    assert promoted_total(two_loops[standby][1]) == 0

    two_loops[leader][0].kill()
    two_loops[leader][0].wait(5)
    # The standby takes over once the dead leader's lease runs out (its TTL, then a retry at a
    # third of it): waited for, generously, not timed (a loaded box is not a broken loop).
    deadline = time.monotonic() + 30
    while (health(two_loops[standby][1]) or {}).get("role") != "leader":
        assert time.monotonic() < deadline, "the standby never took over"
        await asyncio.sleep(0.02)
    await shard.enqueue([job("after", delay_ms=50)])
    deadline = time.monotonic() + 10
    while (await shard.counts("acme")).ready < 21:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)
    assert promoted_total(two_loops[standby][1]) == 1


# --- the rows of jobs that end without a worker ---------------------------------------------


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)


async def test_a_loop_process_given_the_database_writes_the_row_of_a_job_it_reaps_dead(
    redis_proc: RedisProcess, redis: Redis, database_url: str
) -> None:
    await asyncio.to_thread(upgrade, database_url)
    proc, _ = start_loop_process(
        redis_proc.url, "solo", SHARDQ_DATABASE_URL=database_url, SHARDQ_SHARD_ID="4"
    )
    try:
        shard = ShardClient(redis, SETTINGS)
        await shard.enqueue([job("r-doomed", max_attempts=1)])
        # Its worker is gone: nothing renews the 50 ms lease.
        (claimed,) = await shard.claim("w-gone", 1, 50)
        async with asyncio.timeout(30):
            while not (rows := await result_rows(database_url)):
                await asyncio.sleep(0.05)
        (row,) = rows
        assert (row["request_id"], row["status"], row["error"]) == (
            "r-doomed",
            "dead",
            "lease expired",
        )
        assert (row["shard_id"], row["worker_id"], row["fence"]) == (4, "w-gone", claimed.fence)
        assert (await shard.get_job("acme", claimed.job_id)).state == "dead"
    finally:
        stop(proc)


async def test_a_loop_process_without_a_database_says_so_at_start(redis_proc: RedisProcess) -> None:
    proc, port = start_loop_process(redis_proc.url, "rowless", stderr=subprocess.PIPE)
    try:
        wait_roles({"rowless": (proc, port)}, timeout_s=15)
    finally:
        stop(proc)
    assert proc.stderr is not None
    with proc.stderr:
        assert b"no --database-url (SHARDQ_DATABASE_URL)" in proc.stderr.read()
