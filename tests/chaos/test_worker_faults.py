"""Worker processes killed every 2 s, or frozen past their lease, under a steady load across
tenants; jobs of one attempt whose worker dies. Each ends with the reconciliation of every
accepted submit against the rows, the side effects and the shards (printed with ``-s``)."""

from __future__ import annotations

import asyncio
import random
import signal
import time

import pytest
import sqlalchemy as sa
from sqlalchemy import text

from shardq.client import JobState
from shardq.coordinator.tools.reconcile import Accepted
from shardq.store.db import make_engine, results
from tests.chaos.test_worker_chaos import active_jobs_of, static_shards
from tests.support.chaos import Chaos, ledger_jobs, load_on
from tests.support.chaos_handlers import GATES, LEDGER
from tests.support.procs import WorkerProcess, wait_until_serving
from tests.support.workers import result_rows, running_worker

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(300)]

#: The workers' lease (tests/support/procs.py's start_worker), in seconds.
LEASE_S = 1.0


async def test_workers_killed_every_two_seconds_under_load_lose_and_duplicate_nothing(
    chaos: Chaos,
) -> None:
    for _ in range(3):
        chaos.start_worker()
    for w in chaos.workers:
        await wait_until_serving(w, timeout_s=90)
    rng = random.Random(11)
    load = load_on(chaos.cluster.target, chaos.cluster.admin_token, ledger_jobs("k", rng))
    for _ in range(6):
        await asyncio.sleep(2)
        victim = await _worker_mid_run(chaos) or rng.choice(chaos.alive())
        victim.signal(signal.SIGKILL)
        await asyncio.to_thread(victim.proc.wait, 10)
        chaos.start_worker()  # the deployment's replacement
    accepted = await load.stop()
    report = await chaos.reconcile(accepted, faults_ended_at=time.monotonic())
    assert report.ok, report.render()
    assert load.load.refused == {}, load.load.refused
    # The kills hit running jobs (else this proves nothing), and each re-run was a new
    # attempt: no claim ran twice (the fencing token).
    assert report.re_executions["new_attempt"] > 0, report.render()
    assert report.re_executions["same_attempt"] == 0, report.render()


async def _worker_mid_run(chaos: Chaos, wait_s: float = 3) -> WorkerProcess | None:
    """An alive worker holding the lease of a job whose handler has begun (its run is in the
    runs file), so that killing it re-runs that job; None if none turns up in ``wait_s``.
    Picking at random, a kill can land between jobs or between a claim and its handler's
    first line, and six such kills would prove nothing."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        begun = {request_id for (_, request_id) in chaos.runs()}
        for w in chaos.alive():
            if await active_jobs_of(chaos.cluster, w.worker_id) & begun:
                return w
        await asyncio.sleep(0.01)
    return None


async def test_a_worker_frozen_past_its_lease_under_load_duplicates_nothing_when_it_wakes(
    chaos: Chaos,
) -> None:
    # Static shards for both: the frozen worker's assignment stream still looks alive to the
    # coordinator; this test is about leases and fencing, not assignment.
    shards = static_shards(chaos.cluster)
    frozen, other = chaos.start_worker(shards=shards), chaos.start_worker(shards=shards)
    for w in (frozen, other):
        await wait_until_serving(w, shards=2, timeout_s=90)
    rng = random.Random(12)
    load = load_on(
        chaos.cluster.target, chaos.cluster.admin_token, ledger_jobs("f", rng, ms=(200, 600))
    )
    await load.until_accepted(60)
    async with asyncio.timeout(60):
        while not (held := await active_jobs_of(chaos.cluster, frozen.worker_id)):
            await asyncio.sleep(0.02)
    frozen.signal(signal.SIGSTOP)  # its heartbeats stop too: its leases run out
    await asyncio.sleep(LEASE_S + 3)
    frozen.signal(signal.SIGCONT)  # it wakes with handlers mid-run and results to record
    await asyncio.sleep(3)
    accepted = await load.stop()
    report = await chaos.reconcile(accepted, faults_ended_at=time.monotonic())
    assert report.ok, report.render()
    rerun = {rid for (_, rid), runs in chaos.runs().items() if len(runs) > 1}
    assert rerun & held, f"none of the frozen worker's jobs {sorted(held)} ran again"


async def test_jobs_of_one_attempt_whose_workers_die_end_once_each_with_their_row(
    chaos: Chaos,
) -> None:
    for _ in range(3):
        chaos.start_worker()
    for w in chaos.workers:
        await wait_until_serving(w, timeout_s=90)
    rng = random.Random(13)
    jobs = ledger_jobs("once", rng, ms=(300, 900), max_attempts=1)
    load = load_on(chaos.cluster.target, chaos.cluster.admin_token, jobs, rate=30)
    for _ in range(5):
        await asyncio.sleep(2)
        victim = rng.choice(chaos.alive())
        victim.signal(signal.SIGKILL)
        await asyncio.to_thread(victim.proc.wait, 10)
        chaos.start_worker()
    accepted = await load.stop()
    report = await chaos.reconcile(
        accepted, faults_ended_at=time.monotonic(), may_die=lambda _key: True
    )
    assert report.ok, report.render()
    assert report.by_status.get("dead", 0) > 0, "no kill hit a running job"
    # One attempt, so one run at most: a dead job is never run again, a succeeded one once.
    assert report.re_executed == 0, report.render()


async def test_a_run_ending_after_its_job_was_recorded_by_another_commits_none_of_its_writes(
    chaos: Chaos,
) -> None:
    """The end of a race a lost lease starts: a run whose handler returns before its worker
    learns the lease is gone (a thread handler cannot even be cancelled) finds the job's row
    already final. Its row is refused by the upsert's guard; what it wrote through
    ``ctx.session`` in the same transaction must be refused with it."""
    cluster = chaos.cluster
    started, release = asyncio.Event(), asyncio.Event()
    GATES["late"] = (started, release)
    async with running_worker(cluster, handlers=["chaos.ledger_gated"], lease_ms=60_000):
        c = await cluster.client("acme")
        sub = await c.submit("chaos.ledger_gated", {}, request_id="late")
        await asyncio.wait_for(started.wait(), 60)  # its ledger write is in its transaction
        await record_as_another_run(cluster.database_url, "acme", "late", sub.job_id)
        release.set()
        async with asyncio.timeout(60):
            while (await c.get(sub.job_id)).state != JobState.SUCCEEDED:
                await asyncio.sleep(0.05)
    accepted = Accepted()
    accepted.add("acme", "late", sub.job_id)
    report = await chaos.reconcile(accepted, faults_ended_at=time.monotonic())
    assert report.ok, report.render()
    (row,) = await result_rows(cluster.database_url)
    assert row["worker_id"] == "w-other"  # the row that stood is the other run's


async def record_as_another_run(
    database_url: str, tenant: str, request_id: str, job_id: str
) -> None:
    """What the run that took the job over commits: its ledger write and its row, together."""
    engine = make_engine(database_url)
    try:
        async with engine.begin() as conn:
            await conn.execute(
                text(f"INSERT INTO {LEDGER} (tenant_id, request_id, amount) VALUES (:t, :r, 1)"),
                {"t": tenant, "r": request_id},
            )
            await conn.execute(
                sa.insert(results).values(
                    tenant_id=tenant, request_id=request_id, job_id=job_id,
                    handler="chaos.ledger_gated", status="succeeded", attempts=2, fence=99,
                    worker_id="w-other",
                )
            )  # fmt: skip
    finally:
        await engine.dispose()
