"""One clock for a job's times: created, run-at, started and finished all come from the shard's
clock (Redis TIME inside the Lua scripts), so their order holds for every job whatever the
coordinator's, the shard loop's or the worker's clock says, and a ``delay_ms`` job's run-at
is exactly its created-at plus the delay. Through the real gRPC API, a real shard loop and a
real worker process, over a few thousand jobs of every kind of submit."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from shardq.client import AsyncClient, Job, JobOptions, JobRequest, JobState
from tests.support.cluster import Cluster, running_cluster
from tests.support.procs import start_worker, wait_until_serving
from tests.support.workers import shard_loops, wait_for_rows


@pytest.fixture
async def cluster(database_url: str) -> AsyncIterator[Cluster]:
    async with running_cluster(database_url) as c:
        yield c


@dataclass(frozen=True, slots=True)
class Asked:
    """What a submit asked for: a delay, an absolute run-at, or neither (due at once)."""

    delay_ms: int | None = None
    run_at_ms: int | None = None

    def options(self) -> JobOptions:
        options: JobOptions = {}
        if self.delay_ms is not None:
            options["delay"] = timedelta(milliseconds=self.delay_ms)
        if self.run_at_ms is not None:
            options["run_at"] = datetime.fromtimestamp(self.run_at_ms / 1000, UTC)
        return options


def ms(ts: datetime | None) -> int:
    assert ts is not None
    return round(ts.timestamp() * 1000)


def disorder(job: Job, asked: Asked) -> list[str]:
    """Every way ``job``'s times break the one-clock rules (none: an empty list)."""
    created, run_at = ms(job.created_at), ms(job.run_at)
    started, finished = ms(job.started_at), ms(job.finished_at)
    bad = []
    if not created <= started:
        bad.append(f"started {created - started} ms before created")
    if not run_at <= started:
        bad.append(f"started {run_at - started} ms before run-at")
    if not started <= finished:
        bad.append(f"finished {started - finished} ms before started")
    # A retry's run-at is its backoff time; the first run-at is what was asked for.
    if job.attempts == 1:
        if asked.delay_ms is not None and run_at != created + asked.delay_ms:
            bad.append(f"run-at is created + {run_at - created}, asked {asked.delay_ms}")
        if asked.run_at_ms is not None and run_at != asked.run_at_ms:
            bad.append(f"run-at {run_at}, asked {asked.run_at_ms}")
        if asked == Asked() and run_at != created:
            bad.append(f"due at once, yet run-at is created + {run_at - created}")
    return bad


async def submit_unary(
    c: AsyncClient, handler: str, payload: dict[str, Any], asked: Asked
) -> tuple[str, Asked]:
    sub = await c.submit(handler, payload, **asked.options())
    # The answer is built from enqueue.lua's reply: its times are the stored ones.
    assert disorder_of_answer(sub.job, asked) == []
    return sub.job_id, asked


def disorder_of_answer(job: Job, asked: Asked) -> list[str]:
    after = ms(job.run_at) - ms(job.created_at)
    if asked.run_at_ms is not None:
        return [] if ms(job.run_at) == asked.run_at_ms else [f"answered run-at {after}"]
    if after != (asked.delay_ms or 0):
        return [f"answered run-at created + {after}, asked {asked.delay_ms}"]
    return []


async def submit_batch(c: AsyncClient, asks: Sequence[Asked]) -> list[tuple[str, Asked]]:
    specs = [JobRequest("test.work", {"n": i}, **a.options()) for i, a in enumerate(asks)]
    items = await c.submit_many(specs)
    assert all(item.ok for item in items)
    return [(str(item.job_id), a) for item, a in zip(items, asks, strict=True)]


async def test_every_job_records_its_times_by_one_clock_in_order(
    cluster: Cluster, tmp_path: Path
) -> None:
    rng = random.Random(14)
    c = await cluster.client("acme")
    now = int(time.time() * 1000)
    log = (tmp_path / "worker.log").open("wb")
    # A long lease: no job is reaped and run twice on a loaded machine (its row's times would
    # then be another attempt's).
    worker = start_worker(cluster, "w-times", log=log, concurrency=32, lease_ms=30_000)
    submitted: list[tuple[str, Asked]] = []
    try:
        async with shard_loops(cluster):
            await wait_until_serving(worker, shards=2)
            # Unary submits run concurrently, so the coordinator coalesces them into shared
            # enqueue calls (where a run-at computed before the batch once came out early).
            unary = [Asked() for _ in range(700)]
            unary += [Asked(delay_ms=rng.randrange(0, 1_500)) for _ in range(700)]
            unary += [Asked(run_at_ms=now + rng.randrange(-1_000, 1_500)) for _ in range(300)]
            rng.shuffle(unary)
            for lo in range(0, len(unary), 200):
                chunk = unary[lo : lo + 200]
                submitted += await asyncio.gather(
                    *(submit_unary(c, "test.work", {"n": i}, a) for i, a in enumerate(chunk))
                )
            batch = [Asked(delay_ms=rng.randrange(0, 1_500)) for _ in range(600)]
            batch += [Asked(run_at_ms=now + rng.randrange(0, 1_500)) for _ in range(300)]
            batch += [Asked() for _ in range(300)]
            for lo in range(0, len(batch), 300):
                submitted += await submit_batch(c, batch[lo : lo + 300])
            # Retried once: the second attempt's run-at is the backoff the worker asked for.
            retry = {"delay_s": 0.05}
            submitted += await asyncio.gather(
                *(submit_unary(c, "test.retry_later", retry, Asked()) for _ in range(200))
            )

            # While the delayed ones wait: ListJobs shows the same times GetJob will.
            asked_of = dict(submitted)
            page = await c.list_jobs(JobState.SCHEDULED, page_size=1000)
            for job in page:
                a = asked_of[job.job_id]
                if a.delay_ms is not None:
                    assert ms(job.run_at) == ms(job.created_at) + a.delay_ms

            rows = await wait_for_rows(cluster.database_url, len(submitted), timeout_s=180)
    finally:
        worker.stop()
        log.close()

    assert len(submitted) == 3_100
    jobs: list[Job] = []
    for lo in range(0, len(submitted), 250):
        jobs += await asyncio.gather(*(c.get(jid) for jid, _ in submitted[lo : lo + 250]))
    bad = {
        job.job_id: problems
        for job, (_, asked) in zip(jobs, submitted, strict=True)
        if (problems := disorder(job, asked))
    }
    assert not bad, f"{len(bad)} jobs out of order, e.g. {list(bad.items())[:5]}"
    assert all(j.state is JobState.SUCCEEDED for j in jobs)
    assert sum(j.attempts == 2 for j in jobs) == 200  # the retries did happen

    # The result row's times are the job's own (the worker's clock is not one of them).
    by_request = {str(r["request_id"]): r for r in rows}
    for job in jobs:
        row = by_request[job.request_id]
        assert ms(row["queued_at"]) == ms(job.run_at), job.job_id
        assert ms(row["started_at"]) == ms(job.started_at), job.job_id
        assert ms(row["started_at"]) <= ms(row["finished_at"]) <= ms(job.finished_at)
