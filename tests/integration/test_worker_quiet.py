"""No warning for normal events, and one for every real problem: a worker acking its own jobs
loses no lease, a lease really taken away is logged and counted once, a worker started before
its coordinator waits quietly (one warning only past a threshold, and a line when it is back),
and a shard loop stopped cleanly says so at INFO."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import signal
import threading
import time
import urllib.request
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from shardq.client import job_spec
from shardq.common.clock import FakeClock
from shardq.coordinator.server import build_server
from shardq.coordinator.tools.redis_server import RedisProcess, free_port
from shardq.shard import ItemCode, Lease, ShardClient, ShardSettings
from shardq.shard.loop import ShardLoop
from shardq.worker.assignment import Endpoint, follow
from shardq.worker.heartbeat import Heartbeater
from tests.support.cluster import Cluster, running_cluster
from tests.support.procs import WorkerProcess, start_worker, wait_until_serving
from tests.support.shard import job
from tests.support.workers import FAST_LOOP, wait_for_rows


@pytest.fixture
async def cluster(database_url: str) -> AsyncIterator[Cluster]:
    async with running_cluster(database_url) as c:
        yield c


async def until(cond: Callable[[], bool], what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"not in {timeout_s} s: {what}"
        await asyncio.sleep(0.05)


def lease_losses(w: WorkerProcess) -> float:
    """``shardq_worker_lease_losses`` as the worker's /metrics shows it."""
    url = f"http://127.0.0.1:{w.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("shardq_worker_lease_losses_total "):
                return float(line.split()[1])
    raise AssertionError("no shardq_worker_lease_losses_total on /metrics")


def log_lines(path: Path) -> list[dict[str, Any]]:
    """The worker's JSON log lines; any other line on its stderr is an error of its own."""
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            raise AssertionError(f"not a log line on the worker's stderr: {line!r}") from None
    return out


def lost_lines(path: Path) -> list[dict[str, Any]]:
    return [rec for rec in log_lines(path) if rec["msg"] == "lease lost"]


# --- leases ------------------------------------------------------------------------------------


@pytest.mark.timeout(400)
async def test_ten_thousand_quick_jobs_lose_no_lease_to_their_own_acks(
    cluster: Cluster, tmp_path: Path
) -> None:
    # Heartbeats every 10 ms (a third of the lease) while jobs are acked by the hundred: many
    # heartbeats carry a lease whose ack lands between their snapshot and their call. No
    # shard loop runs, so nothing reaps a lease: any loss counted here is a false one.
    log_path = tmp_path / "worker.log"
    with log_path.open("wb") as log:
        w = start_worker(cluster, "w-quick", log=log, lease_ms=30, concurrency=64)
        try:
            await wait_until_serving(w, shards=2)
            c = await cluster.client("acme")
            specs = [job_spec("test.work", {"n": i}) for i in range(10_000)]
            for lo in range(0, len(specs), 1_000):
                items = await c.submit_many(specs[lo : lo + 1_000])
                assert not any(item.error is not None for item in items)
            await wait_for_rows(cluster.database_url, 10_000, timeout_s=300)
            assert await asyncio.to_thread(lease_losses, w) == 0
        finally:
            w.stop()
    assert lost_lines(log_path) == []


async def test_a_heartbeat_that_meets_a_lease_its_worker_just_acked_reports_nothing(
    redis_proc: RedisProcess,
) -> None:
    """The race itself, made certain: between the heartbeat's snapshot and its call, the
    worker stops heart-beating the lease and acks it. The STALE_LEASE answer is the ack's
    doing, not a loss. A lease reaped from under it, still held, is reported."""
    settings = ShardSettings(key_prefix="sq")
    setup = ShardClient(Redis(port=redis_proc.port), settings)
    reported: list[tuple[int, str, ItemCode]] = []
    called = threading.Event()
    heartbeater: Heartbeater

    class AckedMeanwhile(ShardClient):
        async def heartbeat(self, leases: Sequence[Lease], lease_ms: int) -> list[ItemCode]:
            settled = [lease for lease in leases if lease.job_id.startswith("acked")]
            for lease in settled:  # what Worker._record does, in this order
                heartbeater.remove(0, lease.job_id)
            await self.ack(settled)
            codes = await super().heartbeat(leases, lease_ms)
            called.set()
            return codes

    def make_client(address: str) -> ShardClient:
        return AckedMeanwhile(Redis.from_url(f"redis://{address}"), settings)

    heartbeater = Heartbeater(30, make_client, lambda *lost: reported.append(lost))
    heartbeater.start()  # with nothing to keep alive yet
    try:
        await setup.enqueue([job("reaped")])
        claimed = await setup.claim("w1", 1, 1)  # a lease of 1 ms
        await setup.enqueue([job("acked1"), job("acked2")])
        claimed += await setup.claim("w1", 2, 600_000)
        leases = [Lease(c.job_id, c.fence) for c in claimed]
        heartbeater.add_many(0, f"127.0.0.1:{redis_proc.port}", leases)
        # The first lease is taken away for real (the worker still holds it), not the others.
        later = FakeClock(int(time.time() * 1000) + 60_000)
        assert await ShardClient(setup.redis, settings, later).reap() == (1, 0)
        await asyncio.to_thread(called.wait, 10)
        await until(lambda: len(reported) >= 1, "the reaped lease reported")
    finally:
        await asyncio.to_thread(heartbeater.stop)
        await setup.redis.aclose()
    # The heartbeater reports a lost lease on every beat until the worker lets it go (the
    # worker acts on the first); at a beat every 10 ms a slow machine sees more than one.
    assert set(reported) == {(0, "reaped", ItemCode.STALE_LEASE)}


async def jobs_held_by(cluster: Cluster, worker_id: str) -> list[tuple[int, str]]:
    """(index of the shard, job ID) of every lease ``worker_id`` holds."""
    out = []
    for i, proc in enumerate(cluster.shards):
        r = Redis(port=proc.port)
        try:
            for jid in await r.zrange("sq:leases", 0, -1):
                if await r.hget(f"sq:job:{jid.decode()}", "w") == worker_id.encode():
                    out.append((i, jid.decode()))
        finally:
            await r.aclose()
    return out


async def take_leases_away(cluster: Cluster, shard_index: int) -> int:
    """What a reaper does once the leases have run out: the shard's reap, an hour from now."""
    redis = Redis(port=cluster.shards[shard_index].port)
    later = FakeClock(int(time.time() * 1000) + 3_600_000)
    try:
        ready, dead = await ShardClient(redis, ShardSettings(key_prefix="sq"), later).reap()
        return ready + dead
    finally:
        await redis.aclose()


@pytest.mark.parametrize(
    ("lease_ms", "job_ms"),
    [
        pytest.param(600, 3_000, id="found-by-the-heartbeat"),
        # Heartbeats every 20 s: the handler returns first, and the ack finds the lease gone.
        pytest.param(60_000, 1_000, id="found-by-the-ack"),
    ],
)
async def test_a_lease_taken_away_is_logged_and_counted_once(
    cluster: Cluster, tmp_path: Path, lease_ms: int, job_ms: int
) -> None:
    log_path = tmp_path / "worker.log"
    with log_path.open("wb") as log:
        w = start_worker(cluster, "w-lose", log=log, lease_ms=lease_ms, concurrency=1)
        try:
            await wait_until_serving(w, shards=2)
            c = await cluster.client("acme")
            await c.submit("test.work", {"ms": job_ms}, max_attempts=1)
            held: list[tuple[int, str]] = []
            deadline = time.monotonic() + 30
            while not held:
                assert time.monotonic() < deadline, "the worker never claimed the job"
                held = await jobs_held_by(cluster, "w-lose")
                await asyncio.sleep(0.02)
            assert await take_leases_away(cluster, held[0][0]) == 1
            deadline = time.monotonic() + 30
            while await asyncio.to_thread(lease_losses, w) < 1:
                assert time.monotonic() < deadline, "the lost lease was never counted"
                await asyncio.sleep(0.05)
            await asyncio.sleep(job_ms / 1000 + 1)  # whatever else would notice it, has
            assert await asyncio.to_thread(lease_losses, w) == 1
        finally:
            w.stop()
    (line,) = lost_lines(log_path)
    assert (line["level"], line["job_id"]) == ("WARNING", held[0][1])


# --- the coordinator away ----------------------------------------------------------------------


async def test_a_worker_started_before_its_coordinator_waits_without_a_warning(
    cluster: Cluster, tmp_path: Path
) -> None:
    # The coordinator goes away (its port stays known), the worker starts, and 2.5 s later the
    # coordinator starts on that port: a rollout, or a whole cluster coming up at once.
    await cluster.server.stop(0)
    await cluster.coordinator.stop()
    log_path = tmp_path / "worker.log"
    with log_path.open("wb") as log:
        w = start_worker(cluster, "w-early", log=log, log_level="INFO")
        try:
            await asyncio.sleep(2.5)
            assert w.proc.poll() is None
            settings = dataclasses.replace(cluster.settings, listen=cluster.target)
            server, _, coord, _ = await build_server(settings)
            await server.start()
            cluster.server, cluster.coordinator = server, coord
            await wait_until_serving(w, shards=2, timeout_s=30)
            w.proc.send_signal(signal.SIGTERM)
            await asyncio.to_thread(w.proc.wait, 30)
        finally:
            w.stop()
    lines = log_lines(log_path)
    assert [rec for rec in lines if rec["level"] not in ("INFO", "DEBUG")] == []
    said = [rec["msg"] for rec in lines]
    assert any("unreachable" in m for m in said), said  # it did wait
    assert any(" is back after " in m for m in said), said


async def test_a_coordinator_away_past_the_threshold_is_warned_about_once_then_back(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="shardq.worker")
    port = free_port()
    target = f"127.0.0.1:{port}"
    seen: list[dict[int, Endpoint]] = []
    async with running_cluster(database_url) as cluster:
        await cluster.server.stop(0)
        await cluster.coordinator.stop()
        task = asyncio.create_task(
            follow(target, cluster.admin_token, "w-away", 4, seen.append, warn_after_s=1.0)
        )
        try:
            await asyncio.sleep(4)  # away for four times the threshold
            settings = dataclasses.replace(cluster.settings, listen=target)
            server, _, coord, _ = await build_server(settings)
            await server.start()
            cluster.server, cluster.coordinator = server, coord
            await until(lambda: bool(seen and seen[-1]), "an assignment after the outage")
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    mine = [r for r in caplog.records if r.name == "shardq.worker"]
    warnings = [r for r in mine if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert "unreachable for" in warnings[0].getMessage()
    back = [r for r in mine if " is back after " in r.getMessage()]
    assert len(back) == 1 and back[0].levelno == logging.INFO
    assert mine.index(warnings[0]) < mine.index(back[0])


# --- the shard loop ----------------------------------------------------------------------------


async def test_a_shard_loop_stopped_cleanly_logs_no_warning_and_a_real_loss_does(
    redis: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="shardq.shard")
    shard = ShardClient(redis, ShardSettings(key_prefix="sq"))
    settings = dataclasses.replace(FAST_LOOP, leader_ttl_ms=600, load_interval_s=0)

    loop = ShardLoop(shard, settings)
    task = asyncio.create_task(loop.run())
    await until(lambda: loop.role == "leader", "leading")
    # Another instance takes the lease (this one's ran out while it was paused, say).
    await redis.set("sq:leader", "someone-else", px=60_000)
    await until(lambda: loop.role == "standby", "standing by")
    lost = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.getMessage() for r in lost] == ["leader lease lost; standing by"]
    await redis.delete("sq:leader")
    await until(lambda: loop.role == "leader", "leading again")

    caplog.clear()
    loop.stop()
    await asyncio.wait_for(task, 10)
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert "stopping; giving up the leader lease" in [r.getMessage() for r in caplog.records]
    assert await redis.get("sq:leader") is None  # released, for a standby to take at once
