"""Progress from handlers, through a real coordinator, a real shard and real worker processes:
``ctx.progress`` in a handler, carried by the worker's heartbeats to the job hash, shown by
``GetJob`` and ``WatchJob`` while the job runs, kept in the result row, and refused from a
handler whose lease is gone. No test waits on a clock: the handlers wait for files the test
creates once it has seen what it waits for (tests/support/handlers_progress.py).
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest
from redis.asyncio import Redis

from shardq.v1 import common_pb2, jobs_pb2, jobs_pb2_grpc
from tests.support.cluster import Cluster, running_cluster
from tests.support.procs import WorkerProcess, start_worker, wait_until_serving
from tests.support.workers import wait_for_rows

HANDLERS = "tests.support.handlers_progress"
TENANT = "acme"
T = TypeVar("T")


@pytest.fixture
async def cluster(database_url: str) -> AsyncIterator[Cluster]:
    async with running_cluster(database_url, shard_count=1) as c:
        yield c


@pytest.fixture
async def api(cluster: Cluster) -> AsyncIterator[Api]:
    channel = grpc.aio.insecure_channel(cluster.target)
    yield Api(jobs_pb2_grpc.JobServiceStub(channel), await cluster.token_for(TENANT))
    await channel.close()


class Api:
    """The raw JobService stub with the tenant's token (the Python client is not under test)."""

    def __init__(self, stub: jobs_pb2_grpc.JobServiceStub, token: str) -> None:
        self.stub = stub
        self.md = (("authorization", f"Bearer {token}"),)

    async def submit(self, handler: str, payload: Any, **spec: Any) -> common_pb2.Job:
        job = common_pb2.JobSpec(handler=handler, payload=json.dumps(payload).encode(), **spec)
        req = jobs_pb2.SubmitJobRequest(job=job)
        return (await self.stub.SubmitJob(req, metadata=self.md)).job

    async def get(self, job_id: str) -> common_pb2.Job:
        return await self.stub.GetJob(jobs_pb2.GetJobRequest(job_id=job_id), metadata=self.md)

    def watch(self, job_id: str) -> Any:
        return self.stub.WatchJob(jobs_pb2.WatchJobRequest(job_id=job_id), metadata=self.md)


async def eventually(read: Callable[[], Awaitable[T]], ok: Callable[[T], bool], what: str) -> T:
    """``read()`` until ``ok`` holds (a generous bound, for a loaded machine)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60
    while True:
        value = await read()
        if ok(value):
            return value
        assert loop.time() < deadline, f"never {what}: last {value}"
        await asyncio.sleep(0.05)


def worker(cluster: Cluster, name: str, **flags: Any) -> WorkerProcess:
    return start_worker(cluster, name, handlers=HANDLERS, **flags)


def progress_of(job: common_pb2.Job) -> tuple[float, str] | None:
    return (job.progress.fraction, job.progress.message) if job.HasField("progress") else None


async def test_a_watcher_sees_each_report_mid_run_and_the_row_keeps_the_last(
    cluster: Cluster, api: Api, tmp_path: Path
) -> None:
    w = worker(cluster, "progress-0")
    try:
        await wait_until_serving(w)
        job = await api.submit("progress.steps", {"dir": str(tmp_path)})
        assert progress_of(job) is None  # nothing reported before it runs
        seen: list[tuple[int, tuple[float, str] | None]] = []
        async with asyncio.timeout(60):  # a bound for a broken build, not a timing
            async for update in api.watch(job.job_id):
                seen.append((update.state, progress_of(update)))
                # Each report is seen while the handler waits: only then may it go on.
                if progress_of(update) == (0.25, "resized 1/4"):
                    assert update.state == common_pb2.JOB_STATE_ACTIVE
                    assert update.progress.updated_at_unix_ms >= update.started_at_unix_ms > 0
                    (tmp_path / "go1").touch()
                elif progress_of(update) == (0.5, "resized 2/4"):
                    assert update.state == common_pb2.JOB_STATE_ACTIVE
                    (tmp_path / "go2").touch()
        progresses = [p for _, p in seen if p is not None]
        assert progresses[:2] == [(0.25, "resized 1/4"), (0.5, "resized 2/4")]
        # The last report, sent before the ack, is on the job's final message.
        assert seen[-1] == (common_pb2.JOB_STATE_SUCCEEDED, (1.0, "done"))
        done = await api.get(job.job_id)
        assert progress_of(done) == (1.0, "done")
        (row,) = await wait_for_rows(cluster.database_url, 1)
        assert row["status"] == "succeeded"
        assert row["progress"]["fraction"] == 1.0 and row["progress"]["message"] == "done"
        assert row["progress"]["updated_at_unix_ms"] >= done.started_at_unix_ms
    finally:
        w.stop()


async def test_a_plain_handler_reports_with_progress_sync(
    cluster: Cluster, api: Api, tmp_path: Path
) -> None:
    w = worker(cluster, "progress-sync")
    try:
        await wait_until_serving(w)
        job = await api.submit("progress.sync", {"dir": str(tmp_path)})
        mid = await eventually(
            lambda: api.get(job.job_id), lambda j: progress_of(j) is not None, "reported"
        )
        assert (mid.state, progress_of(mid)) == (common_pb2.JOB_STATE_ACTIVE, (0.5, "half way"))
        (tmp_path / "go").touch()
        done = await eventually(
            lambda: api.get(job.job_id),
            lambda j: j.state == common_pb2.JOB_STATE_SUCCEEDED,
            "succeeded",
        )
        assert progress_of(done) == (0.75, "three quarters")
        (row,) = await wait_for_rows(cluster.database_url, 1)
        assert (row["progress"]["fraction"], row["progress"]["message"]) == (
            0.75,
            "three quarters",
        )
    finally:
        w.stop()


async def test_reports_are_written_at_most_once_per_interval_and_the_last_one_wins(
    cluster: Cluster, api: Api, tmp_path: Path
) -> None:
    # An interval of 10 minutes: within this test only the first report and the last (sent
    # as the job ends) can be written; the lease is long enough that no regular heartbeat
    # (every 20 s) comes either.
    w = worker(cluster, "progress-burst", progress_interval_ms=600_000, lease_ms=60_000)
    try:
        await wait_until_serving(w)
        job = await api.submit("progress.burst", {"dir": str(tmp_path)})
        await eventually(
            lambda: api.get(job.job_id), lambda j: progress_of(j) == (0.0, "first"), "first"
        )
        (tmp_path / "go1").touch()
        await eventually(
            lambda: asyncio.to_thread((tmp_path / "reported").exists), bool, "1,000 reports"
        )
        mid = await api.get(job.job_id)
        assert (mid.state, progress_of(mid)) == (common_pb2.JOB_STATE_ACTIVE, (0.0, "first"))
        (tmp_path / "go2").touch()
        done = await eventually(
            lambda: api.get(job.job_id),
            lambda j: j.state == common_pb2.JOB_STATE_SUCCEEDED,
            "succeeded",
        )
        # The last report, sent as the job ended (before its ack), and kept in its row.
        assert progress_of(done) == (1.0, "1000/1000")
        (row,) = await wait_for_rows(cluster.database_url, 1)
        assert row["progress"]["message"] == "1000/1000"
    finally:
        w.stop()


def lease_losses(w: WorkerProcess) -> float:
    url = f"http://127.0.0.1:{w.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("shardq_worker_lease_losses_total"):
                return float(line.split()[-1])
    return 0.0


async def test_progress_from_a_handler_whose_lease_was_lost_is_refused(
    cluster: Cluster, api: Api, tmp_path: Path
) -> None:
    # A long lease: its regular heartbeat (every 20 s) is not what finds the loss; the
    # heartbeat that carries the refused report is.
    w = worker(cluster, "progress-lost", lease_ms=60_000)
    redis = Redis.from_url(cluster.shards[0].url)
    try:
        await wait_until_serving(w)
        job = await api.submit("progress.lost", {"dir": str(tmp_path)}, max_attempts=1)
        await eventually(
            lambda: api.get(job.job_id), lambda j: progress_of(j) == (0.1, "before"), "0.1"
        )
        # As if the lease expired and the job was claimed again: a newer fencing token.
        key = f"{cluster.settings.shard.key_prefix}:job:{job.job_id}"
        await redis.hincrby(key, "f", 1000)
        (tmp_path / "go").touch()
        await eventually(
            lambda: asyncio.to_thread((tmp_path / "reported").exists), bool, "reported 0.9"
        )
        await eventually(lambda: asyncio.to_thread(lease_losses, w), bool, "a lease loss")
        after = await api.get(job.job_id)
        assert progress_of(after) == (0.1, "before")
        assert after.state == common_pb2.JOB_STATE_ACTIVE  # the other "holder" still has it
    finally:
        await redis.aclose()
        w.stop()


BAD_REPORTS = [
    ({"fraction": 1.5}, "ValueError: progress fraction must be from 0 to 1, not 1.5"),
    ({"fraction": -0.1}, "ValueError: progress fraction must be from 0 to 1, not -0.1"),
    ({"fraction": "half"}, "ValueError: progress fraction must be a number from 0 to 1"),
    ({"fraction": 0.5, "message": "x" * 257}, "message is 257 characters, at most 256"),
]


async def test_a_bad_report_fails_the_attempt_with_a_clear_value_error(
    cluster: Cluster, api: Api
) -> None:
    w = worker(cluster, "progress-bad")
    try:
        await wait_until_serving(w)
        jobs = [await api.submit("progress.invalid", p, max_attempts=1) for p, _ in BAD_REPORTS]
        for job, (_, error) in zip(jobs, BAD_REPORTS, strict=True):
            dead = await eventually(
                lambda j=job: api.get(j.job_id),
                lambda j: j.state == common_pb2.JOB_STATE_DEAD,
                "dead",
            )
            assert error in dead.last_error
            assert progress_of(dead) is None
    finally:
        w.stop()
