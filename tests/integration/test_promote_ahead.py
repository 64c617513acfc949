"""Delayed jobs promoted ahead of their run-at (``LoopSettings.promote_ahead_ms``): the worker
claims such a job early and starts its handler on its run-at, never before; a job cancelled
while its worker waits for its run-at never runs.

Through the gRPC API of a real coordinator, a real shard loop (promoting 2 s ahead, so that
every claim here lands well before its run-at on a busy machine) and a real worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime

import pytest

from shardq.client import AsyncClient
from shardq.client.model import JobState
from tests.support import handlers
from tests.support.cluster import Cluster, running_cluster
from tests.support.workers import FAST_LOOP, running_worker, shard_loops

AHEAD_MS = 2_000
#: The run-at of every job here, this far after its submit: past the promote-ahead, so
#: each is scheduled first and promoted ahead by the loop.
LEAD_MS = 4_000
#: For the cancel: the worker learns of it at its next heartbeat (a third of the tests' 1 s
#: lease), which must come before the run-at even on a loaded machine: seconds of margin.
CANCEL_AHEAD_MS = 6_000
CANCEL_LEAD_MS = 8_000

pytestmark = pytest.mark.timeout(120)


@contextlib.asynccontextmanager
async def promoting_ahead(database_url: str, ahead_ms: int) -> AsyncIterator[Cluster]:
    """A one-shard cluster whose loop promotes delayed jobs ``ahead_ms`` early."""
    async with (
        running_cluster(database_url, shard_count=1) as c,
        shard_loops(c, replace(FAST_LOOP, promote_ahead_ms=ahead_ms)),
    ):
        yield c


@pytest.fixture
async def cluster(database_url: str) -> AsyncIterator[Cluster]:
    async with promoting_ahead(database_url, AHEAD_MS) as c:
        yield c


def run_at_ms(lead_ms: int = LEAD_MS) -> int:
    return int(time.time() * 1000) + lead_ms


async def seen_active_before(client: AsyncClient, job_id: str, run_at: int) -> None:
    """Wait until the job is claimed; it must be before its run-at (AHEAD_MS of slack)."""
    while (await client.get(job_id)).state is not JobState.ACTIVE:
        assert time.time() * 1000 < run_at, "not claimed before its run-at"
        await asyncio.sleep(0.02)


async def test_a_job_claimed_ahead_starts_on_its_run_at_and_not_before(cluster: Cluster) -> None:
    client = await cluster.client("acme")
    at = [run_at_ms() + i * 100 for i in range(5)]
    async with running_worker(cluster, handlers=["test.clock"]):
        subs = [
            await client.submit("test.clock", None, run_at=datetime.fromtimestamp(ms / 1000, UTC))
            for ms in at
        ]
        await seen_active_before(client, subs[0].job_id, at[0])
        jobs = []
        for sub in subs:
            async with asyncio.timeout(60):
                while (job := await client.get(sub.job_id)).state is not JobState.SUCCEEDED:
                    await asyncio.sleep(0.05)
            jobs.append(job)
    for ms, job in zip(at, jobs, strict=True):
        assert job.result["started_ms"] >= ms  # the handler's own clock: never early
        # Its row counts the run from its run-at, not from the early claim.
        assert job.started_at is not None
        assert job.started_at >= datetime.fromtimestamp(ms / 1000, UTC)


async def test_a_job_cancelled_while_its_worker_waits_for_its_run_at_never_runs(
    database_url: str,
) -> None:
    async with promoting_ahead(database_url, CANCEL_AHEAD_MS) as cluster:
        await _cancel_while_waiting(cluster)


async def _cancel_while_waiting(cluster: Cluster) -> None:
    client = await cluster.client("acme")
    at = run_at_ms(CANCEL_LEAD_MS)
    async with running_worker(cluster, handlers=["test.clock"]):
        sub = await client.submit("test.clock", None, run_at=datetime.fromtimestamp(at / 1000, UTC))
        await seen_active_before(client, sub.job_id, at)
        await client.cancel(sub.job_id)
        async with asyncio.timeout(60):
            while (await client.get(sub.job_id)).state is not JobState.CANCELLED:
                await asyncio.sleep(0.05)
        # Past its run-at, with the worker still there: it stays cancelled, never run.
        await asyncio.sleep(max(0, at / 1000 - time.time()) + 0.5)
    assert (await client.get(sub.job_id)).state is JobState.CANCELLED
    assert handlers.EXECUTIONS[sub.job.request_id] == 0
