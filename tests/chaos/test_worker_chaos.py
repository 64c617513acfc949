"""Workers killed, frozen, cut off from Postgres or stopped mid-run: no job lost, no row twice."""

from __future__ import annotations

import asyncio
import random
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
from redis.asyncio import Redis

from shardq.client import JobState, job_spec
from shardq.coordinator.tools.faults import CuttableProxy
from shardq.shard import ShardClient
from tests.support.cluster import Cluster, running_cluster
from tests.support.handlers import EXECUTIONS, executions_in
from tests.support.procs import start_worker, wait_until_serving
from tests.support.workers import result_rows, running_worker, shard_loops, wait_for_rows

LEASE_MS = 1_000
REAP_MS = 100


@pytest.fixture
async def cluster(database_url: str) -> AsyncIterator[Cluster]:
    async with running_cluster(database_url) as c, shard_loops(c):
        yield c


def assert_a_row_each(rows: list[dict[str, object]], request_ids: set[str]) -> None:
    """A row for every job and none for another; one row per job is the primary key's, so
    how many times a handler ran is checked on its runs (``executions_in``), not here."""
    assert {str(r["request_id"]) for r in rows} == request_ids


def static_shards(cluster: Cluster) -> str:
    return ",".join(f"{i}=127.0.0.1:{p.port}" for i, p in enumerate(cluster.shards))


async def active_jobs_of(cluster: Cluster, worker_id: str) -> set[str]:
    out: set[str] = set()
    for proc in cluster.shards:
        r = Redis(port=proc.port)
        for key in await r.zrange("sq:leases", 0, -1):
            job = await r.hgetall(f"sq:job:{key.decode()}")
            if job.get(b"w") == worker_id.encode():
                out.add(job[b"r"].decode())
        await r.aclose()
    return out


async def test_a_worker_killed_mid_run_loses_nothing_and_duplicates_nothing(
    cluster: Cluster, tmp_path: Path
) -> None:
    runs = str(tmp_path / "runs")
    workers = [
        start_worker(cluster, name, concurrency=16, test_executions_file=runs)
        for name in ("w-a", "w-b")
    ]
    try:
        for w in workers:
            await wait_until_serving(w)
        c = await cluster.client("acme")
        ids = {f"job-{n}" for n in range(1_000)}
        rng = random.Random(7)
        for chunk in range(0, 1_000, 250):
            await c.submit_many(
                [
                    job_spec(
                        "test.work", {"n": n, "ms": rng.randint(10, 50)}, request_id=f"job-{n}"
                    )
                    for n in range(chunk, chunk + 250)
                ]
            )
        await wait_for_rows(cluster.database_url, 150)
        # Each worker has one of the two shards: kill the one serving this tenant.
        victim, survivor = workers
        orphans = await active_jobs_of(cluster, victim.worker_id)
        if not orphans:
            victim, survivor = survivor, victim
            orphans = await active_jobs_of(cluster, victim.worker_id)
        victim.signal(signal.SIGKILL)
        await asyncio.to_thread(victim.proc.wait, 10)
        # What it still held when it died (a row it committed just before may exist).
        orphans = await active_jobs_of(cluster, victim.worker_id)
        assert orphans, "the killed worker held no job: the test proves nothing"
        rows = await wait_for_rows(cluster.database_url, len(ids), timeout_s=120)
        assert_a_row_each(rows, ids)
        executions = executions_in(runs)
        assert set(executions) == ids
        # Only a job the killed worker held may have run twice.
        assert {rid for rid, n in executions.items() if n > 1} <= orphans
        by_id = {r["request_id"]: r for r in rows}
        rerun = [o for o in orphans if by_id[o]["worker_id"] == survivor.worker_id]
        assert rerun, "none of the killed worker's jobs was run again"
    finally:
        for w in workers:
            w.stop()


async def test_a_frozen_worker_cannot_overwrite_the_result_of_the_worker_that_took_over(
    cluster: Cluster,
) -> None:
    a = start_worker(cluster, "w-frozen", concurrency=1)
    b = None
    try:
        await wait_until_serving(a)
        c = await cluster.client("acme")
        sub = await c.submit("test.work", {"n": 1, "ms": 2_500}, request_id="slow")
        while not await active_jobs_of(cluster, "w-frozen"):
            await asyncio.sleep(0.02)
        a.signal(signal.SIGSTOP)  # its heartbeats stop too: the lease runs out
        # Static shards: the frozen worker's assignment stream still looks alive to the
        # coordinator, and this test is about fencing, not assignment.
        b = start_worker(cluster, "w-b", concurrency=1, shards=static_shards(cluster))
        await wait_until_serving(b, shards=2, timeout_s=60)
        try:
            (row,) = await wait_for_rows(cluster.database_url, 1, timeout_s=60)
        except AssertionError as exc:
            job = await c.get(sub.job_id)
            raise AssertionError(f"{exc}; job {job}; b alive: {b.proc.poll() is None}") from exc
        assert row["worker_id"] == "w-b"
        a.signal(signal.SIGCONT)
        await asyncio.sleep(4)  # the frozen handler finishes its sleep and tries to record
        (after,) = await result_rows(cluster.database_url)
        assert after == row
        assert (await c.get(sub.job_id)).state == JobState.SUCCEEDED
    finally:
        a.stop()
        if b is not None:
            b.stop()


async def test_postgres_cut_off_for_seconds_loses_and_duplicates_nothing(
    cluster: Cluster,
) -> None:
    db = urlsplit(cluster.database_url)
    proxy = CuttableProxy(db.hostname or "127.0.0.1", db.port or 5432)
    await proxy.start()
    netloc = db.netloc.replace(f"{db.hostname}:{db.port}", f"127.0.0.1:{proxy.port}")
    proxied = urlunsplit(db._replace(netloc=netloc))
    try:
        async with running_worker(cluster, database_url=proxied, db_retry_cap_s=0.5) as worker:
            c = await cluster.client("acme")
            ids = {f"pg-{n}" for n in range(400)}
            EXECUTIONS.clear()
            await c.submit_many(
                [job_spec("test.work", {"n": n, "ms": 5}, request_id=f"pg-{n}") for n in range(400)]
            )
            await wait_for_rows(cluster.database_url, 50)
            proxy.cut()
            await asyncio.sleep(5)
            # Nothing may be acked without its row while the database is away.
            rows_during = {r["request_id"] for r in await result_rows(cluster.database_url)}
            acked = await succeeded_request_ids(cluster)
            assert acked <= rows_during
            proxy.restore()
            rows = await wait_for_rows(cluster.database_url, len(ids), timeout_s=90)
            assert_a_row_each(rows, ids)
            # Jobs held through the outage kept their leases: none ran twice.
            assert {rid: EXECUTIONS[rid] for rid in ids} == dict.fromkeys(ids, 1)
            assert not worker.running
    finally:
        await proxy.stop()


async def succeeded_request_ids(cluster: Cluster) -> set[str]:
    out = set()
    for proc in cluster.shards:
        r = Redis(port=proc.port)
        async for key in r.scan_iter("sq:job:*"):
            job = await r.hmget(key, "s", "r")
            if job[0] == b"succeeded":
                out.add(job[1].decode())
        await r.aclose()
    return out


async def test_sigterm_lets_short_jobs_finish_and_hands_long_ones_back_at_once(
    cluster: Cluster,
) -> None:
    # A lease of ten minutes: only the hand-back can free the long jobs within the waits below
    # (and a reaped job would run again as attempt 2, a handed-back one as attempt 1).
    a = start_worker(cluster, "w-term", concurrency=8, drain_grace_s=1, lease_ms=600_000)
    b = None
    try:
        await wait_until_serving(a)
        c = await cluster.client("acme")
        short = [job_spec("test.work", {"n": n, "ms": 800}, request_id=f"s-{n}") for n in range(4)]
        long = [job_spec("test.work", {"n": n, "ms": 4_000}, request_id=f"l-{n}") for n in range(4)]
        await c.submit_many(short + long)
        long_ids = {f"l-{n}" for n in range(4)}
        while not long_ids <= await active_jobs_of(cluster, "w-term"):
            await asyncio.sleep(0.02)
        a.signal(signal.SIGTERM)
        # Long jobs are handed back to ready after the grace, not after a lease timeout.
        async with asyncio.timeout(60):
            while await active_jobs_of(cluster, "w-term"):
                await asyncio.sleep(0.02)
        assert await asyncio.to_thread(a.proc.wait, 30) == 0
        r = Redis(port=cluster.shards[cluster.coordinator.shard_map.shard_for("acme")].port)
        try:
            counts = await ShardClient(r, cluster.settings.shard).counts("acme")
        finally:
            await r.aclose()
        assert counts.failed == 0  # no lease expired: the reaper counts each one it takes
        b = start_worker(cluster, "w-next", concurrency=8)
        rows = await wait_for_rows(cluster.database_url, 8, timeout_s=60)
        by_id = {r["request_id"]: r for r in rows}
        assert {by_id[f"s-{n}"]["worker_id"] for n in range(4)} == {"w-term"}
        assert {by_id[f"l-{n}"]["worker_id"] for n in range(4)} == {"w-next"}
        assert all(by_id[f"l-{n}"]["attempts"] == 1 for n in range(4))
    finally:
        a.stop()
        if b is not None:
            b.stop()


async def test_adding_a_worker_rebalances_shards_and_stopping_one_moves_its_shards(
    cluster: Cluster,
) -> None:
    a = start_worker(cluster, "w-1")
    b = None
    try:
        await wait_until_serving(a, shards=2)
        b = start_worker(cluster, "w-2")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 20
        while True:
            ha, hb = await asyncio.to_thread(a.health), await asyncio.to_thread(b.health)
            if ha and hb and len(ha["shards"]) == 1 and len(hb["shards"]) == 1:
                assert set(ha["shards"]) | set(hb["shards"]) == {0, 1}
                break
            assert loop.time() < deadline, (ha, hb)
            await asyncio.sleep(0.05)
        b.stop()
        await wait_until_serving(a, shards=2)
    finally:
        a.stop()
        if b is not None:
            b.stop()
