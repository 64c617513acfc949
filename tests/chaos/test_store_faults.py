"""A shard's redis-server killed and restarted on its AOF, and Postgres cut off for 10 s,
under a steady load across tenants with worker processes running; each ends with the
reconciliation of every accepted submit (printed with ``-s``)."""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import pytest

from shardq.client import RetryPolicy
from tests.support.chaos import Chaos, chaos_of, create_ledger, ledger_jobs, load_on
from tests.support.cluster import running_cluster
from tests.support.outage import proxied_database
from tests.support.procs import wait_until_serving
from tests.support.workers import shard_loops

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(300)]

POSTGRES_DOWN_S = 10.0


async def test_a_shard_redis_killed_and_restarted_on_its_aof_loses_no_accepted_submit(
    chaos: Chaos,
) -> None:
    for _ in range(2):
        chaos.start_worker()
    for w in chaos.workers:
        await wait_until_serving(w, timeout_s=90)
    rng = random.Random(21)
    # The client's default retry budget: submits to the dead shard wait for it to come back.
    load = load_on(chaos.cluster.target, chaos.cluster.admin_token, ledger_jobs("r", rng))
    await load.until_accepted(120)
    shard = chaos.cluster.shards[0]
    before = len(load.accepted)
    shard.kill()  # SIGKILL: only what the AOF has survives
    shard.stop()
    await asyncio.sleep(1)
    shard.start()  # the same port and data dir: it loads its AOF
    await asyncio.sleep(4)
    accepted = await load.stop()
    report = await chaos.reconcile(accepted, faults_ended_at=time.monotonic())
    report.extra["accepted before the kill"] = before
    print(f"  accepted before the kill  {before}")
    assert report.ok, report.render()
    assert load.load.refused == {}, load.load.refused
    assert len(accepted) > before


async def test_postgres_down_ten_seconds_under_load_submits_keep_succeeding_and_nothing_is_lost(
    database_url: str, tmp_path: Path
) -> None:
    await create_ledger(database_url)
    async with (
        proxied_database(database_url) as (proxy, proxied_url),
        running_cluster(proxied_url) as cluster,
        shard_loops(cluster),
    ):
        # Coordinator, shard loops and workers all reach Postgres through the proxy.
        chaos = chaos_of(cluster, tmp_path)
        try:
            for _ in range(2):
                chaos.start_worker(db_retry_cap_s=0.5)
            for w in chaos.workers:
                await wait_until_serving(w, timeout_s=90)
            rng = random.Random(22)
            # One try per submit: any refusal during the outage would show.
            load = load_on(
                cluster.target,
                cluster.admin_token,
                ledger_jobs("pg", rng),
                retry=RetryPolicy(attempts=1),
            )
            await load.until_accepted(80)
            proxy.cut()
            before = len(load.accepted)
            await asyncio.sleep(POSTGRES_DOWN_S)
            during = len(load.accepted) - before
            proxy.restore()
            await asyncio.sleep(2)
            accepted = await load.stop()
            report = await chaos.reconcile(
                accepted, faults_ended_at=time.monotonic(), database_url=database_url
            )
        finally:
            chaos.stop_workers()
    print(f"  accepted while Postgres was down  {during}")
    assert report.ok, report.render()
    assert load.load.refused == {}, load.load.refused
    assert during >= 40, f"only {during} submits accepted in {POSTGRES_DOWN_S:.0f} s of outage"
