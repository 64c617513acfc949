"""Every terminal state has its row: jobs that end without a worker (reaped dead, cancelled)
get theirs from the shard loop's outbox, and Redis and Postgres agree on how a job ended.

Real Redis (a fake clock drives leases), real Postgres; the shard loop's row writer
(``shard/rows.py``) is driven a step at a time, except where the story is its loop (Postgres
away). The result upsert's guard is checked here in both directions, on both write paths.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import sqlalchemy as sa
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncSession

from shardq.client import job_spec
from shardq.shard import FakeClock, Lease, ShardClient
from shardq.shard.records import JobState
from shardq.shard.rows import RowSettings, TerminalRows
from shardq.store.db import make_engine, psycopg_dsn, results
from shardq.store.results import ResultRow, ResultStore, write_in_session
from shardq.v1 import common_pb2
from tests.chaos.test_worker_chaos import active_jobs_of
from tests.support.cluster import Cluster, running_cluster
from tests.support.outage import proxied_database
from tests.support.procs import start_worker, wait_until_serving
from tests.support.shard import LEASE, claimed, job, seed
from tests.support.workers import result_rows, shard_loops, wait_for_rows


@pytest.fixture
def rows(shard: ShardClient, result_store: ResultStore) -> TerminalRows:
    return TerminalRows(shard, result_store, shard_id=3)


async def rows_of(database_url: str) -> dict[str, dict[str, Any]]:
    """request_id -> its row (every row of the test's database)."""
    engine = make_engine(database_url)
    try:
        async with engine.connect() as conn:
            found = (await conn.execute(sa.select(results))).mappings().all()
    finally:
        await engine.dispose()
    return {r["request_id"]: dict(r) for r in found}


def reconciled_of(rows: TerminalRows, kind: str) -> float:
    return rows.metrics.reconciled.labels(shard=rows.metrics.shard_id, kind=kind)._value.get()


def reconciled(rows: TerminalRows, kind: str) -> float:
    return reconciled_of(rows, kind)


def row(request_id: str, status: str, job_id: str = "J1", **kw: Any) -> ResultRow:
    fields: dict[str, Any] = {
        "tenant_id": "acme", "request_id": request_id, "job_id": job_id, "shard_id": 0,
        "handler": "h", "status": status, "attempts": 1, "fence": 1, "worker_id": "w1",
        "queued_ms": 1, "started_ms": 2, "finished_ms": 3, "result": {"by": status},
    }  # fmt: skip
    return ResultRow(**(fields | kw))


async def reaped_dead(shard: ShardClient, redis: Redis, clock: FakeClock, *jids: str) -> None:
    """Jobs on their last attempt whose worker died: the reaper dead-letters them."""
    await claimed(shard, redis, *(job(j, max_attempts=1) for j in jids))
    clock.advance(LEASE)
    assert await shard.reap() == (0, len(jids))


# --- the reaper's dead and cancelled jobs ----------------------------------------------------


async def test_a_job_reaped_dead_on_its_last_attempt_gets_exactly_one_dead_row(
    shard: ShardClient, redis: Redis, clock: FakeClock, rows: TerminalRows, database_url: str
) -> None:
    await reaped_dead(shard, redis, clock, "J1", "J2")
    assert await shard.outbox_depth() == 2
    assert await rows.drain() == 2
    found = await rows_of(database_url)
    assert set(found) == {"rJ1", "rJ2"}
    r = found["rJ1"]
    assert (r["status"], r["error"], r["attempts"], r["fence"], r["shard_id"]) == (
        "dead", "lease expired", 1, 1, 3,
    )  # fmt: skip
    assert r["worker_id"] == "w1" and r["job_id"] == "J1"
    assert await shard.outbox_depth() == 0
    assert (await shard.get_job("acme", "J1")).state is JobState.DEAD
    # Nothing left to do: a second drain writes nothing and changes nothing.
    assert await rows.drain() == 0
    assert await rows_of(database_url) == found


async def test_a_cancelled_active_job_whose_lease_expires_gets_its_cancelled_row(
    shard: ShardClient, redis: Redis, clock: FakeClock, rows: TerminalRows, database_url: str
) -> None:
    await claimed(shard, redis, job("J1"))
    await shard.cancel("acme", "J1")
    clock.advance(LEASE)
    await shard.reap()
    await rows.drain()
    assert (await rows_of(database_url))["rJ1"]["status"] == "cancelled"


@pytest.mark.parametrize("delay_ms", [5_000, 0], ids=["scheduled", "ready"])
async def test_a_job_cancelled_before_it_ran_gets_one_cancelled_row(
    shard: ShardClient, redis: Redis, rows: TerminalRows, database_url: str, delay_ms: int
) -> None:
    await seed(shard, redis, job("J1", delay_ms=delay_ms))
    await shard.cancel("acme", "J1")
    await rows.drain()
    r = (await rows_of(database_url))["rJ1"]
    assert (r["status"], r["attempts"], r["worker_id"], r["error"]) == (
        "cancelled",
        0,
        "",
        "cancelled",
    )
    assert (await shard.get_job("acme", "J1")).state is JobState.CANCELLED


async def test_a_lost_ack_after_a_committed_success_ends_succeeded_in_redis_and_postgres(
    shard: ShardClient, redis: Redis, clock: FakeClock, rows: TerminalRows,
    result_store: ResultStore, database_url: str,
) -> None:  # fmt: skip
    (c,) = await claimed(shard, redis, job("J1", max_attempts=1))
    # The worker commits its row, then dies before its ack reaches Redis.
    await result_store.write([row("rJ1", "succeeded", fence=c.fence)])
    clock.advance(LEASE)
    assert await shard.reap() == (0, 1)
    assert (await shard.get_job("acme", "J1")).state is JobState.DEAD
    await rows.drain()
    # The row decides: it was committed with whatever the handler wrote through ctx.session.
    assert (await rows_of(database_url))["rJ1"]["status"] == "succeeded"
    rec = await shard.get_job("acme", "J1")
    assert rec.state is JobState.SUCCEEDED
    assert await redis.zrange("sq:dead:acme", 0, -1) == []
    counts = await shard.counts("acme")
    assert (counts.dead, counts.succeeded) == (0, 1)
    assert 0 < await redis.pttl("sq:job:J1") <= shard.settings.retention_ms
    assert reconciled(rows, "redis_state") == 1


async def test_a_cancel_that_wins_over_the_ack_of_a_committed_success_ends_succeeded(
    shard: ShardClient,
    redis: Redis,
    rows: TerminalRows,
    result_store: ResultStore,
    database_url: str,
) -> None:
    (c,) = await claimed(shard, redis, job("J1"))
    await result_store.write([row("rJ1", "succeeded", fence=c.fence)])
    await shard.cancel("acme", "J1")  # after the commit, before the ack
    await shard.ack([Lease("J1", c.fence)])
    assert (await shard.get_job("acme", "J1")).state is JobState.CANCELLED
    await rows.drain()
    assert (await rows_of(database_url))["rJ1"]["status"] == "succeeded"
    assert (await shard.get_job("acme", "J1")).state is JobState.SUCCEEDED


async def test_a_dead_job_requeued_before_its_row_was_written_leaves_the_outbox_rowless(
    shard: ShardClient, redis: Redis, clock: FakeClock, rows: TerminalRows, database_url: str
) -> None:
    await reaped_dead(shard, redis, clock, "J1")
    assert await shard.requeue_dead("acme", ["J1"]) == (1, [])
    await rows.drain()
    # It has not ended: its next end writes (or puts on the outbox) its row.
    assert await rows_of(database_url) == {}
    assert await shard.outbox_depth() == 0


async def test_a_requeued_dead_job_that_dies_again_leaves_its_newer_outbox_entry_in_place(
    shard: ShardClient, redis: Redis, clock: FakeClock, rows: TerminalRows, database_url: str
) -> None:
    await reaped_dead(shard, redis, clock, "J1")
    ((_, first),) = await shard.outbox(10)
    await shard.requeue_dead("acme", ["J1"])
    await shard.claim("w2", 1, LEASE)
    clock.advance(LEASE)
    await shard.reap()
    # The first drain's removal must not take the second death's entry with it.
    assert await shard.rows_written([("J1", first, "dead")]) == [False]
    assert await shard.outbox_depth() == 1
    await rows.drain()
    r = (await rows_of(database_url))["rJ1"]
    assert (r["status"], r["worker_id"]) == ("dead", "w2")
    assert await shard.outbox_depth() == 0


# --- Postgres away -----------------------------------------------------------------------


async def wait_for(cond: Callable[[], Awaitable[bool]], timeout_s: float = 30) -> None:
    async with asyncio.timeout(timeout_s):
        while not await cond():
            await asyncio.sleep(0.05)


async def test_rows_of_jobs_dead_lettered_while_postgres_is_away_appear_once_it_returns(
    shard: ShardClient, redis: Redis, clock: FakeClock, result_store: ResultStore, database_url: str
) -> None:
    async with proxied_database(database_url) as (proxy, through_proxy):
        cut_store = ResultStore(psycopg_dsn(through_proxy))
        writer = TerminalRows(shard, cut_store, 0, RowSettings(outbox_interval_ms=20))
        task = asyncio.create_task(writer.run())
        try:
            proxy.cut()
            await reaped_dead(shard, redis, clock, "J1", "J2", "J3")

            async def unreachable() -> bool:
                return writer.metrics.reachable._value.get() == 0

            await wait_for(unreachable)
            assert writer.metrics.depth._value.get() == 3
            assert await rows_of(database_url) == {}
            proxy.restore()

            async def written() -> bool:
                return len(await rows_of(database_url)) == 3

            await wait_for(written)
            await wait_for(lambda: _true(writer.metrics.depth._value.get() == 0))
            assert writer.metrics.reachable._value.get() == 1
            assert {r["status"] for r in (await rows_of(database_url)).values()} == {"dead"}
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await cut_store.close()


async def _true(value: bool) -> bool:
    return value


# --- the reconciler ------------------------------------------------------------------------


async def test_the_reconciler_writes_a_missing_row_and_fixes_redis_where_the_row_disagrees(
    shard: ShardClient, redis: Redis, clock: FakeClock, rows: TerminalRows,
    result_store: ResultStore, database_url: str,
) -> None:  # fmt: skip
    await reaped_dead(shard, redis, clock, "J1", "J2", "J3")
    # Made by hand: the outbox lost (as on a shard of an earlier version), J2's row committed
    # as succeeded (a lost ack), J3's row there already.
    await redis.delete("sq:outbox")
    await result_store.write([row("rJ2", "succeeded", "J2"), row("rJ3", "dead", "J3")])
    assert await rows.reconciler.step() == 3
    found = await rows_of(database_url)
    assert {k: r["status"] for k, r in found.items()} == {
        "rJ1": "dead", "rJ2": "succeeded", "rJ3": "dead",
    }  # fmt: skip
    assert (await shard.get_job("acme", "J2")).state is JobState.SUCCEEDED
    assert await redis.zrange("sq:dead:acme", 0, -1) == [b"J1", b"J3"]
    assert (reconciled(rows, "missing_row"), reconciled(rows, "redis_state")) == (1, 1)
    # Agreed now: the next rounds find nothing to fix.
    await rows.reconciler.step()
    await rows.reconciler.step()
    assert (reconciled(rows, "missing_row"), reconciled(rows, "redis_state")) == (1, 1)
    assert await rows_of(database_url) == found


async def test_a_reconciler_pass_compares_at_most_its_batch_and_moves_on(
    shard: ShardClient, redis: Redis, clock: FakeClock, result_store: ResultStore, database_url: str
) -> None:
    await reaped_dead(shard, redis, clock, *(f"J{n}" for n in range(5)))
    await redis.delete("sq:outbox")
    small = TerminalRows(shard, result_store, 0, RowSettings(reconcile_batch=2))
    assert [await small.reconciler.step() for _ in range(3)] == [2, 2, 1]
    assert len(await rows_of(database_url)) == 5


async def test_the_reconciler_leaves_jobs_on_the_outbox_to_the_drain(
    shard: ShardClient, redis: Redis, clock: FakeClock, rows: TerminalRows, database_url: str
) -> None:
    await reaped_dead(shard, redis, clock, "J1")
    await rows.reconciler.step()
    assert await rows_of(database_url) == {}
    assert reconciled(rows, "missing_row") == 0


# --- the result upsert's guard, on both write paths ----------------------------------------

Write = Callable[[ResultStore, str, ResultRow], Awaitable[None]]


async def _batch(result_store: ResultStore, url: str, r: ResultRow) -> None:
    await result_store.write([r])


async def _in_session(result_store: ResultStore, url: str, r: ResultRow) -> None:
    engine = make_engine(url)
    try:
        async with AsyncSession(engine) as session:
            await write_in_session(session, r)
    finally:
        await engine.dispose()


WRITES = pytest.mark.parametrize("write", [_batch, _in_session], ids=["batch", "ctx.session"])


@WRITES
@pytest.mark.parametrize("first", ["succeeded", "cancelled"])
@pytest.mark.parametrize("late", ["succeeded", "dead", "cancelled"])
async def test_a_final_row_is_never_replaced_by_a_late_or_duplicate_write(
    result_store: ResultStore, database_url: str, write: Write, first: str, late: str
) -> None:
    await write(result_store, database_url, row("r1", first, "J1", worker_id="first"))
    await write(result_store, database_url, row("r1", late, "J2", worker_id="late", fence=9))
    r = (await rows_of(database_url))["r1"]
    assert (r["status"], r["job_id"], r["worker_id"], r["fence"]) == (first, "J1", "first", 1)


@WRITES
@pytest.mark.parametrize("then", ["succeeded", "cancelled", "dead"])
async def test_a_dead_row_is_replaced_by_the_next_end_of_the_requeued_job(
    result_store: ResultStore, database_url: str, write: Write, then: str
) -> None:
    await write(result_store, database_url, row("r1", "dead", error="boom"))
    await write(result_store, database_url, row("r1", then, attempts=2, fence=7, error=None))
    r = (await rows_of(database_url))["r1"]
    assert (r["status"], r["attempts"], r["fence"], r["error"]) == (then, 2, 7, None)
    assert r["result"] == {"by": then}


# --- with real worker processes ------------------------------------------------------------


@pytest.fixture
async def cluster(database_url: str) -> AsyncIterator[Cluster]:
    async with running_cluster(database_url) as c, shard_loops(c) as loops:
        c.loops = loops  # type: ignore[attr-defined]
        yield c


def loop_counts(cluster: Cluster, kind: str) -> float:
    """A reconciled_total kind, summed over the cluster's shard loops."""
    writers = [lp.rows for lp in cluster.loops if lp.rows is not None]  # type: ignore[attr-defined]
    return sum(reconciled_of(w, kind) for w in writers)


async def test_jobs_on_their_last_attempt_whose_worker_is_killed_end_dead_with_their_row(
    cluster: Cluster,
) -> None:
    w = start_worker(cluster, "w-doomed", concurrency=8)
    try:
        await wait_until_serving(w, shards=2)
        c = await cluster.client("acme")
        specs = [
            job_spec("test.work", {"n": n, "ms": 600_000}, request_id=f"k{n}", max_attempts=1)
            for n in range(8)
        ]
        subs = await c.submit_many(specs)
        async with asyncio.timeout(30):
            while len(await active_jobs_of(cluster, "w-doomed")) < 8:
                await asyncio.sleep(0.05)
        w.signal(signal.SIGKILL)
        await asyncio.to_thread(w.proc.wait, 10)
        found = await wait_for_rows(cluster.database_url, 8)
    finally:
        w.stop()
    assert {r["request_id"]: (r["status"], r["error"]) for r in found} == {
        f"k{n}": ("dead", "lease expired") for n in range(8)
    }
    for sub in subs:
        assert (await c.get(sub.job_id)).state == common_pb2.JOB_STATE_DEAD
    # Written from the outbox, not found missing by the reconciler (the net under it).
    assert loop_counts(cluster, "missing_row") == 0


async def test_a_worker_dying_between_its_commit_and_its_ack_leaves_a_succeeded_job(
    cluster: Cluster,
) -> None:
    w = start_worker(cluster, "w-exits", concurrency=1)
    try:
        await wait_until_serving(w, shards=2)
        c = await cluster.client("acme")
        sub = await c.submit("test.exit_after_commit", {}, request_id="lost-ack", max_attempts=1)
        await asyncio.to_thread(w.proc.wait, 60)
        assert w.proc.returncode == 9  # it died in the hook, after the commit
        async with asyncio.timeout(60):
            while (job := await c.get(sub.job_id)).state != common_pb2.JOB_STATE_SUCCEEDED:
                # Dead for a moment (the reaper), then succeeded once the row is read back.
                assert job.state in (common_pb2.JOB_STATE_ACTIVE, common_pb2.JOB_STATE_DEAD)
                await asyncio.sleep(0.05)
    finally:
        w.stop()
    (r,) = await result_rows(cluster.database_url)
    assert (r["status"], r["result"], r["worker_id"]) == (
        "succeeded",
        {"committed": True},
        "w-exits",
    )
