"""Attempts are the handler's: a handler whose ``ctx.session`` cannot reach the results
database (here Postgres refusing new connections for 10 s, as at its connection limit, while
the connections already open go on) gets its attempt back and a retry after a backoff, so
``ledger.add`` jobs with a single attempt all succeed once Postgres takes connections again,
each with its side effect written once."""

from __future__ import annotations

import asyncio
import urllib.request

import sqlalchemy as sa

from shardq.client import JobState, RetryBackoff
from shardq.store import db
from shardq.worker.runtime import STORE_RETRIES
from tests.support.cluster import running_cluster
from tests.support.coordinator_proc import wait_for
from tests.support.outage import proxied_database
from tests.support.procs import start_worker, wait_until_serving
from tests.support.workers import running_worker, shard_loops, wait_for_rows

SHORTAGE_S = 10.0


async def ledger_rows(database_url: str) -> list[str]:
    engine = db.make_engine(database_url)
    try:
        async with engine.connect() as conn:
            rows = await conn.execute(sa.text("SELECT request_id FROM shardq_example_ledger"))
            return sorted(str(r[0]) for r in rows)
    finally:
        await engine.dispose()


async def test_ledger_jobs_survive_a_connection_shortage_without_losing_attempts(
    database_url: str,
) -> None:
    async with (
        proxied_database(database_url) as (proxy, proxied_url),
        running_cluster(database_url) as cluster,
        shard_loops(cluster),
        running_worker(cluster, database_url=proxied_url, concurrency=8, db_retry_cap_s=0.3),
    ):
        acme = await cluster.client("acme")
        first = await acme.submit("ledger.add", {"account": "a", "amount": 1}, request_id="warm")
        assert (await acme.wait(first.job_id, timeout=60)).state == JobState.SUCCEEDED

        proxy.refuse_new()
        subs = [
            await acme.submit(
                "ledger.add", {"account": "a", "amount": n}, request_id=f"r{n}", max_attempts=1
            )
            for n in range(20)
        ]
        await asyncio.sleep(SHORTAGE_S)
        # Meanwhile no job died: each failure for want of a connection was handed back.
        during = [await acme.get(s.job_id) for s in subs]
        assert not [j for j in during if j.state == JobState.DEAD], during
        proxy.restore()

        rows = await wait_for_rows(database_url, 21, timeout_s=180)
        assert {r["status"] for r in rows} == {"succeeded"}, rows
        jobs = [await acme.get(s.job_id) for s in subs]
        assert {(j.state, j.attempts) for j in jobs} == {(JobState.SUCCEEDED, 1)}
        assert await ledger_rows(database_url) == sorted(["warm", *(f"r{n}" for n in range(20))])
        # The path under test was taken: some jobs were handed back uncounted.
        shard = cluster.coordinator.shard_map.shard_for("acme")
        client, _ = cluster.coordinator.pool.get(shard)
        retried = [(await client.get_job("acme", s.job_id)).store_retries for s in subs]
        print(f"\nuncounted attempts per job: {retried}")
        assert any(retried), "no job met the shortage: nothing was tested"


def dead_count(metrics: str, tenant: str, handler: str) -> float:
    """``shardq_worker_jobs_total{outcome="dead"}`` of ``tenant``'s ``handler`` jobs."""
    for line in metrics.splitlines():
        if (
            line.startswith("shardq_worker_jobs_total{")
            and 'outcome="dead"' in line
            and (f'tenant="{tenant}"' in line and f'handler="{handler}"' in line)
        ):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_a_job_that_dies_after_its_uncounted_attempts_counts_as_dead(
    database_url: str,
) -> None:
    async with (
        proxied_database(database_url) as (proxy, proxied_url),
        running_cluster(database_url) as cluster,
        shard_loops(cluster),
    ):
        worker = start_worker(cluster, "w-dead", database_url=proxied_url)
        try:
            await wait_until_serving(worker, shards=2)
            acme = await cluster.client("acme")
            # The worker's own connection to the results database is open (it reads and
            # writes rows through it); ``ctx.session`` has none yet and cannot get one.
            warm = await acme.submit("test.work", {})
            assert (await acme.wait(warm.job_id, timeout=60)).state == JobState.SUCCEEDED
            proxy.refuse_new()
            quick = RetryBackoff(base=0.01, max=0.05, jitter=0)
            job = await acme.submit(
                "ledger.add", {"account": "a", "amount": 2}, max_attempts=1, retry=quick
            )
            # Handed back uncounted STORE_RETRIES times, then the attempt counts: dead.
            assert (await acme.wait(job.job_id, timeout=120)).state == JobState.DEAD
            shard = cluster.coordinator.shard_map.shard_for("acme")
            client, _ = cluster.coordinator.pool.get(shard)
            assert (await client.get_job("acme", job.job_id)).store_retries == STORE_RETRIES

            url = f"http://127.0.0.1:{worker.metrics_port}/metrics"

            async def dead() -> float:
                body = await asyncio.to_thread(
                    lambda: urllib.request.urlopen(url, timeout=5).read()
                )
                return dead_count(body.decode(), "acme", "ledger.add")

            # The worker's /metrics counts it among the dead (it counted none before).
            await wait_for(dead, lambda n: n == 1, timeout_s=30, what="the dead job counted")
        finally:
            worker.stop()
