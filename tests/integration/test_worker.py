"""Workers end to end: gRPC submits, real shards and shard loops, result rows in Postgres."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest
import sqlalchemy as sa
from prometheus_client import generate_latest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from shardq.client import JobState, job_spec
from shardq.shard.client import ShardClient
from shardq.shard.codes import ItemCode
from shardq.shard.models import Lease
from shardq.store.db import make_engine
from tests.support.cluster import Cluster, running_cluster
from tests.support.handlers import EXECUTIONS
from tests.support.workers import running_worker, shard_loops, wait_for_rows


@pytest.fixture
async def cluster(database_url: str) -> AsyncIterator[Cluster]:
    async with running_cluster(database_url) as c, shard_loops(c):
        yield c


async def test_jobs_of_several_tenants_end_with_exactly_one_result_row_each(
    cluster: Cluster,
) -> None:
    tenants = [f"tenant-{i}" for i in range(6)]
    assert {cluster.coordinator.shard_map.shard_for(t) for t in tenants} == {0, 1}
    expected: dict[tuple[str, str], int] = {}
    EXECUTIONS.clear()
    async with running_worker(cluster):
        for t in tenants:
            c = await cluster.client(t)
            specs = [
                job_spec(
                    "test.work",
                    # A few ms each, so that a job run twice (a lease taken back while it
                    # runs, a claim handing it out twice) would overlap its first run.
                    {"n": n, "ms": 20},
                    request_id=f"{t}-{n}",
                    priority=n % 10,
                    delay=(n % 3) * 0.15,
                )
                for n in range(30)
            ]
            items = await c.submit_many(specs)
            assert all(i.error is None for i in items)
            expected.update({(t, f"{t}-{n}"): n for n in range(30)})
        rows = await wait_for_rows(cluster.database_url, len(expected))
    assert {(r["tenant_id"], r["request_id"]) for r in rows} == set(expected)
    # The primary key allows one row per job whatever happens: count the handler's runs.
    assert {rid: EXECUTIONS[rid] for _, rid in expected} == {rid: 1 for _, rid in expected}
    for r in rows:
        assert r["status"] == "succeeded"
        assert r["result"]["n"] == expected[(r["tenant_id"], r["request_id"])]
    c = await cluster.client(tenants[0])
    async with running_worker(cluster):
        echo = await c.submit("echo", {"x": 1})
        final = await c.wait(echo.job_id)
    assert final.state == JobState.SUCCEEDED
    assert final.result == {"x": 1}
    assert (await c.get(echo.job_id)).result == {"x": 1}


async def test_retries_follow_the_backoff_then_dead_then_requeue_runs_it_again(
    cluster: Cluster,
) -> None:
    c = await cluster.client("acme")
    async with running_worker(cluster):
        later = await c.submit("test.retry_later", {"delay_s": 0.3})
        dead = await c.submit("test.always_fails", {}, max_attempts=2)
        perm = await c.submit("test.permanent", {}, max_attempts=5)
        assert (await c.wait(later.job_id)).attempts == 2
        for sub in (dead, perm):
            final = await c.wait(sub.job_id)
            assert final.state == JobState.DEAD
        assert (await c.get(perm.job_id)).attempts == 1
        listed = {j.job_id for j in (await c.list_dead()).items}
        assert listed == {dead.job_id, perm.job_id}
        rows = {r["request_id"]: r for r in await wait_for_rows(cluster.database_url, 3)}
        assert rows[dead.job.request_id]["status"] == "dead"
        assert "nope" in rows[dead.job.request_id]["error"]
        await c.requeue_dead([dead.job_id])
        again = await c.wait(dead.job_id)
        assert again.state == JobState.DEAD and again.attempts == 2


async def test_a_handler_side_effect_is_exactly_once_and_rolls_back_on_failure(
    cluster: Cluster,
) -> None:
    c = await cluster.client("acme")
    async with running_worker(cluster):
        ok = await c.submit("ledger.add", {"account": "a", "amount": 5}, request_id="pay-1")
        bad = await c.submit(
            "ledger.add", {"account": "b", "amount": 7, "then_fail": True}, max_attempts=1
        )
        assert (await c.wait(ok.job_id)).state == JobState.SUCCEEDED
        assert (await c.wait(bad.job_id)).state == JobState.DEAD
        again = await c.submit("ledger.add", {"account": "a", "amount": 5}, request_id="pay-1")
        assert again.deduplicated
    engine = make_engine(cluster.database_url)
    async with engine.connect() as conn:
        query = sa.text("SELECT account, amount FROM shardq_example_ledger")
        ledger = (await conn.execute(query)).all()
    await engine.dispose()
    assert [tuple(r) for r in ledger] == [("a", 5)]


async def test_sync_and_cpu_bound_handlers_run_off_the_loop_and_metrics_count_them(
    cluster: Cluster,
) -> None:
    c = await cluster.client("acme")
    async with running_worker(cluster, process_pool_size=1) as worker:
        sync = await c.submit("test.sync", {"n": 1, "ms": 20})
        cpu = await c.submit("test.cpu", {"n": 1_000})
        sync_final, cpu_final = await c.wait(sync.job_id), await c.wait(cpu.job_id)
        text = generate_latest(worker.metrics.registry).decode()
    assert sync_final.result == {"n": 1, "thread": True}
    cpu_result = cpu_final.result
    assert cpu_result["sum"] == sum(range(1_000)) and cpu_result["pid"] != os.getpid()
    assert (
        'shardq_worker_jobs_total{handler="test.cpu",outcome="succeeded",tenant="acme"} 1.0' in text
    )
    assert 'shardq_worker_job_duration_seconds_count{handler="test.sync"} 1.0' in text


async def test_a_redelivered_job_whose_row_exists_is_acked_without_running_again(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The first ack is lost, as when a worker dies between the commit and the ack: the row
    # is in Postgres, the lease expires, the reaper makes the job ready again (the attempt
    # counts) and the next claim finds the row.
    real_ack = ShardClient.ack
    lost: list[list[Lease]] = []

    async def ack_lost_once(self: ShardClient, leases: Sequence[Lease]) -> list[ItemCode]:
        if not lost:
            lost.append(list(leases))
            raise RedisConnectionError("connection lost before the ack")
        return await real_ack(self, leases)

    monkeypatch.setattr(ShardClient, "ack", ack_lost_once)
    c = await cluster.client("acme")
    async with running_worker(cluster):
        sub = await c.submit("ledger.add", {"account": "z", "amount": 3}, request_id="once")
        final = await c.wait(sub.job_id)
    assert [lease.job_id for batch in lost for lease in batch] == [sub.job_id]
    assert final.state == JobState.SUCCEEDED and final.attempts == 2
    engine = make_engine(cluster.database_url)
    async with engine.connect() as conn:
        ledger = (
            await conn.execute(sa.text("SELECT count(*) FROM shardq_example_ledger"))
        ).scalar()
    await engine.dispose()
    assert ledger == 1
    rows = await wait_for_rows(cluster.database_url, 1)
    assert [(r["request_id"], r["attempts"]) for r in rows] == [("once", 1)]


@pytest.mark.parametrize("concurrency", [1, 2])
@pytest.mark.parametrize("shard_id", [0, 1])
async def test_an_idle_worker_waiting_on_every_shard_takes_a_job_from_either_at_once(
    cluster: Cluster, concurrency: int, shard_id: int
) -> None:
    """An idle claim loop waits for work and claims in one round trip, holding slots while it
    waits: only its shard's share, so that a job on the other shard is not left for the whole
    wait (a minute here) for want of a slot. With fewer slots than shards, it holds none."""
    tenant = next(
        t for t in (f"idle-{i}" for i in range(16))
        if cluster.coordinator.shard_map.shard_for(t) == shard_id
    )  # fmt: skip
    async with running_worker(cluster, concurrency=concurrency, idle_block_s=60) as worker:
        async with asyncio.timeout(30):
            while len(worker.shards) < 2:
                await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)  # both claim loops have found nothing and wait
        client = await cluster.client(tenant)
        submitted = await client.submit("test.work", {"n": shard_id})
        async with asyncio.timeout(30):  # half the wait: the job was taken as it came
            assert (await client.wait(submitted.job_id)).state == JobState.SUCCEEDED


async def test_a_slot_is_free_while_its_row_waits_for_postgres_and_finished_jobs_are_bounded(
    cluster: Cluster,
) -> None:
    """A slot is a handler running: a job whose handler returned waits for its row's commit
    without holding one, so the next job runs meanwhile. No more than --concurrency such jobs
    wait besides the running handlers: with the results table locked against writes, a worker
    of one slot runs two jobs and no third, and every row lands once the lock goes."""
    EXECUTIONS.clear()
    client = await cluster.client("acme")
    engine = make_engine(cluster.database_url)
    try:
        async with engine.connect() as lock:
            # SHARE mode: the worker's INSERTs wait, its already-done SELECTs do not.
            await lock.execute(sa.text("LOCK TABLE shardq_results IN SHARE MODE"))
            async with running_worker(cluster, concurrency=1) as worker:
                for n in range(4):
                    await client.submit("test.work", {"n": n}, request_id=f"slot-{n}")
                async with asyncio.timeout(30):
                    while len(EXECUTIONS) < 2:
                        await asyncio.sleep(0.02)
                await asyncio.sleep(1)  # a third would have started by now
                assert sorted(EXECUTIONS) == ["slot-0", "slot-1"]
                assert len(worker.running) == 2
                text = generate_latest(worker.metrics.registry).decode()
                assert "shardq_worker_awaiting_rows 2.0" in text
                await lock.rollback()
                rows = await wait_for_rows(cluster.database_url, 4)
    finally:
        await engine.dispose()
    assert sorted(r["request_id"] for r in rows) == [f"slot-{n}" for n in range(4)]
    assert dict(EXECUTIONS) == {f"slot-{n}": 1 for n in range(4)}


async def test_a_trickle_of_jobs_is_recorded_in_batches_gathered_over_the_linger(
    cluster: Cluster,
) -> None:
    """Jobs that end one by one are written (and acked) together when they end within the
    recorder's linger: here 6 jobs submitted 20 ms apart under a linger of a second. Each
    is still recorded: one row each, every job acked."""
    client = await cluster.client("acme")
    async with running_worker(cluster, record_linger_ms=1_000) as worker:
        sizes: list[int] = []
        write = worker.results.write

        async def counted(rows: Sequence[Any]) -> None:
            sizes.append(len(rows))
            await write(rows)

        worker.results.write = counted  # type: ignore[method-assign]
        for n in range(6):
            await client.submit("echo", {"n": n}, request_id=f"trickle-{n}")
            await asyncio.sleep(0.02)
        rows = await wait_for_rows(cluster.database_url, 6)
        async with asyncio.timeout(30):
            while worker.running:  # acked: the runs end after their batch's acks
                await asyncio.sleep(0.02)
    assert sorted(r["request_id"] for r in rows) == [f"trickle-{n}" for n in range(6)]
    assert sum(sizes) == 6
    # One write, or two should the machine stall for most of the second between submits.
    assert len(sizes) <= 2, sizes


async def test_a_shard_that_refuses_claims_is_logged_as_refusing_and_served_once_it_accepts(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    """A shard that answers a claim with an error (here its ACL takes scripts away from the
    user shardq logs in as: NOPERM) is not "unavailable": the worker's log and the shard
    loop's say it refused, and why. The worker keeps trying, and the job waiting there runs
    once the shard accepts it again."""
    tenant = next(t for t in (f"acl-{i}" for i in range(16))
                  if cluster.coordinator.shard_map.shard_for(t) == 0)  # fmt: skip
    client = await cluster.client(tenant)
    submitted = await client.submit("test.work", {"n": 1})
    port = cluster.shards[0].port
    everything: dict[str, Any] = {"keys": ["*"], "channels": ["*"], "enabled": True}
    admin = Redis(port=port, username="admin", password="pw")
    async with Redis(port=port) as shard:
        await shard.acl_setuser("admin", passwords=["+pw"], commands=["+@all"], **everything)
        await shard.acl_setuser(
            "default", reset=True, nopass=True, commands=["+@all", "-@scripting"], **everything
        )
    try:
        with caplog.at_level(logging.WARNING):
            async with running_worker(cluster):
                async with asyncio.timeout(30):
                    while not {"shardq.worker", "shardq.shard"} <= {
                        r.name for r in caplog.records if " refused " in r.getMessage()
                    }:
                        await asyncio.sleep(0.05)
                for r in caplog.records:
                    if r.name in ("shardq.worker", "shardq.shard"):
                        assert "unavailable" not in r.getMessage(), r.getMessage()
                (claim, *_) = [r for r in caplog.records if "refused the claim" in r.getMessage()]
                assert claim.levelno == logging.ERROR
                assert claim.getMessage().startswith("shard 0 refused the claim: ")
                assert "no permissions to run the 'evalsha' command" in claim.getMessage()
                await admin.acl_setuser("default", reset=True, nopass=True, commands=["+@all"],
                                        **everything)  # fmt: skip
                async with asyncio.timeout(30):
                    assert (await client.wait(submitted.job_id)).state == JobState.SUCCEEDED
    finally:
        await admin.acl_setuser(
            "default", reset=True, nopass=True, commands=["+@all"], **everything
        )
        await admin.acl_deluser("admin")
        await admin.aclose()
