"""The Python client as a service meets it, through a real cluster (gRPC coordinator, Redis
shards, shard loops, a worker, Postgres): typed results, one keyword style, ``wait`` with a
timeout, ``watch`` as an iterator, the blocking client shared by threads and used inside a
running event loop, and the raw stubs.

The cluster runs on this test's event loop, so the blocking client is called from other
threads (``asyncio.to_thread``), as a synchronous service's threads would call it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import grpc
import pytest

from shardq import (
    AsyncClient,
    Client,
    Job,
    JobRequest,
    JobState,
    RetryBackoff,
    Schedule,
    TenantStats,
)
from shardq.common.errors import InvalidArgument
from shardq.v1 import common_pb2, jobs_pb2
from tests.support.cluster import Cluster, running_cluster
from tests.support.workers import running_worker, shard_loops

TENANT = "typed"


@pytest.fixture
async def cluster(database_url: str) -> AsyncIterator[Cluster]:
    async with running_cluster(database_url) as c, shard_loops(c):
        yield c


async def blocking(cluster: Cluster, tenant: str = TENANT) -> Client:
    """A blocking client of ``tenant`` (close it after use)."""
    return Client(cluster.target, await cluster.token_for(tenant))


async def test_a_job_reads_back_typed_before_and_after_it_runs(cluster: Cluster) -> None:
    c = await cluster.client(TENANT)
    sub = await c.submit("echo", {"hello": "world"}, priority=7, delay=timedelta(hours=1))
    job = await c.get(sub.job_id)
    assert job == sub.job and isinstance(job, Job)
    assert job.state is JobState.SCHEDULED and job.state.name == "SCHEDULED"
    assert not job.done
    assert (job.handler, job.payload, job.priority, job.queue) == (
        "echo", {"hello": "world"}, 7, "default",
    )  # fmt: skip
    assert (job.result, job.error, job.progress) == (None, None, None)
    assert (job.started_at, job.finished_at, job.next_attempt_at, job.worker_id) == (
        None, None, None, None,
    )  # fmt: skip
    assert job.created_at is not None and job.run_at is not None
    assert job.created_at.tzinfo == UTC
    assert job.run_at - job.created_at == timedelta(hours=1)  # one clock, exact to the ms
    assert (job.attempts, job.tenant_id) == (0, TENANT)
    assert job.max_attempts > 0 and job.timeout is not None  # server defaults applied

    async with running_worker(cluster, ["echo", "test.always_fails"]):
        done = await c.wait((await c.submit("echo", [1, "two", None])).job_id, timeout=60)
        dead = await c.submit(
            "test.always_fails", {}, max_attempts=2, retry=RetryBackoff(base=0.05, max=0.05)
        )
        failed = await c.wait(dead.job_id, timeout=60)
    assert done.state is JobState.SUCCEEDED and done.done
    assert done.result == [1, "two", None] and done.payload == [1, "two", None]
    assert done.created_at and done.started_at and done.finished_at
    assert done.created_at <= done.started_at <= done.finished_at
    assert (done.attempts, done.error) == (1, None) and done.worker_id
    assert failed.state is JobState.DEAD and failed.attempts == 2
    assert failed.error is not None and "nope" in failed.error and failed.result is None
    dead_page = await c.list_dead()
    assert [j.job_id for j in dead_page] == [dead.job_id] and not dead_page.next_page_token


async def test_wait_raises_timeout_error_when_the_job_does_not_end_in_time(
    cluster: Cluster,
) -> None:
    c = await cluster.client(TENANT)
    later = await c.submit("echo", {}, delay=3600)
    with pytest.raises(TimeoutError):
        await c.wait(later.job_id, timeout=0.3)
    sync = await blocking(cluster)
    try:
        with pytest.raises(TimeoutError):
            await asyncio.to_thread(sync.wait, later.job_id, timeout=timedelta(seconds=0.3))
        # The job is untouched: a timeout is the caller's, not the job's.
        assert (await asyncio.to_thread(sync.get, later.job_id)).state is JobState.SCHEDULED
    finally:
        sync.close()
    # A job that is not there is the server's NOT_FOUND, not a timeout.
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await c.wait("NOSUCHJOB", timeout=5)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


async def test_watch_yields_typed_jobs_until_the_job_ends(cluster: Cluster) -> None:
    c = await cluster.client(TENANT)
    sync = await blocking(cluster)
    try:
        async with running_worker(cluster, ["test.work"]):
            first = await c.submit("test.work", {"ms": 300}, delay=0.3)
            seen = [job async for job in c.watch(first.job_id)]
            second = await c.submit("test.work", {"ms": 300}, delay=0.3)
            seen_sync = await asyncio.to_thread(lambda: list(sync.watch(second.job_id)))
    finally:
        sync.close()
    for updates in (seen, seen_sync):
        assert all(isinstance(j, Job) for j in updates)
        states = [j.state for j in updates]
        assert states[0] is JobState.SCHEDULED  # the job as it is now, first
        assert states[-1] is JobState.SUCCEEDED and updates[-1].result["n"] is None
        assert all(not j.done for j in updates[:-1])  # it ends at the end state, not before
        assert len(set(states)) == len(states)  # one message per change


async def test_one_blocking_client_serves_many_threads(cluster: Cluster) -> None:
    sync = await blocking(cluster)
    ids: list[str] = []
    lock = threading.Lock()

    def work(thread: int) -> None:
        for n in range(20):
            sub = sync.submit("echo", {"thread": thread, "n": n}, delay=3600)
            job = sync.get(sub.job_id)
            assert job.payload == {"thread": thread, "n": n}
            with lock:
                ids.append(sub.job_id)

    try:
        await asyncio.gather(*(asyncio.to_thread(work, t) for t in range(8)))
        stats = await asyncio.to_thread(sync.tenant_stats)
    finally:
        sync.close()
    assert len(set(ids)) == 160
    assert isinstance(stats, TenantStats)
    assert (stats.tenant_id, stats.scheduled, stats.submitted_total) == (TENANT, 160, 160)


def run_inside_an_event_loop(target: str, token: str) -> tuple[str, object, bool]:
    """The blocking client called from a coroutine, as a framework's sync code running on
    an event loop's thread would call it."""

    async def main() -> tuple[str, object, bool]:
        running = asyncio.get_running_loop().is_running()
        with Client(target, token) as c:
            job = c.wait(c.submit("echo", {"in": "a loop"}).job_id, timeout=60)
        return job.state.name, job.result, running

    return asyncio.run(main())


async def test_the_blocking_client_works_inside_a_running_event_loop(cluster: Cluster) -> None:
    token = await cluster.token_for(TENANT)
    async with running_worker(cluster, ["echo"]):
        got = await asyncio.to_thread(run_inside_an_event_loop, cluster.target, token)
    assert got == ("SUCCEEDED", {"in": "a loop"}, True)


async def test_the_raw_stubs_are_reachable_with_the_clients_token(cluster: Cluster) -> None:
    c = await cluster.client(TENANT)
    sub = await c.submit("echo", {"raw": True}, delay=3600)
    req = jobs_pb2.GetJobRequest(job_id=sub.job_id)
    raw = await c.stubs.jobs.GetJob(req, metadata=c.metadata)
    assert isinstance(raw, common_pb2.Job) and raw.state == common_pb2.JOB_STATE_SCHEDULED
    assert Job.from_proto(raw) == await c.get(sub.job_id)
    sync = await blocking(cluster)
    try:
        raw_sync = await asyncio.to_thread(sync.stubs.jobs.GetJob, req, metadata=sync.metadata)
    finally:
        sync.close()
    assert raw_sync == raw
    with pytest.raises(grpc.aio.AioRpcError) as info:  # without the token: refused
        await c.stubs.jobs.GetJob(req)
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_submit_many_and_schedule_take_the_same_keywords(cluster: Cluster) -> None:
    c = await cluster.client(TENANT)
    at = datetime.now(UTC) + timedelta(hours=2)
    items = await c.submit_many(
        [
            JobRequest("echo", {"n": 0}, request_id="many-0", priority=3, delay=3600),
            {"handler": "echo", "payload": {"n": 1}, "run_at": at, "queue": "reports"},
            JobRequest("bad handler!", {}),
        ]
    )
    assert [(i.index, i.ok) for i in items] == [(0, True), (1, True), (2, False)]
    assert items[2].error and items[2].error.code == grpc.StatusCode.INVALID_ARGUMENT
    assert items[2].error.field == "job.handler" and items[2].job_id is None
    first, second = [await c.get(str(i.job_id)) for i in items[:2]]
    assert (first.request_id, first.priority, first.state) == ("many-0", 3, JobState.SCHEDULED)
    assert second.queue == "reports" and second.run_at is not None
    assert abs(second.run_at - at) < timedelta(milliseconds=1)

    made = await c.schedule("nightly", "0 3 * * *", "echo", {"kind": "nightly"},
                            timezone="Europe/Paris", priority=4)  # fmt: skip
    assert isinstance(made, Schedule)
    assert (made.timezone, made.handler, made.payload, made.priority) == (
        "Europe/Paris", "echo", {"kind": "nightly"}, 4,
    )  # fmt: skip
    assert made.next_run_at is not None and made.next_run_at > datetime.now(UTC)
    assert made.next_run_at.astimezone(ZoneInfo("Europe/Paris")).hour == 3
    assert await c.list_schedules() == [made]


async def test_bad_arguments_are_refused_naming_the_field(cluster: Cluster) -> None:
    c = await cluster.client(TENANT)
    at = datetime.now(UTC) + timedelta(hours=1)
    cases = [
        ({"delay": 5, "run_at": at}, "delay"),  # both: refused before anything is sent
        ({"run_at": datetime(2030, 1, 1)}, "run_at"),  # naive: whose local time?
        ({"delay": -1}, "delay"),
        ({"timeout": timedelta(seconds=-1)}, "timeout"),
    ]
    for options, field in cases:
        with pytest.raises(InvalidArgument) as refused:
            await c.submit("echo", {}, **options)  # type: ignore[arg-type]
        assert refused.value.field == field, options
    # The server's own checks: its status, the field named in the details.
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await c.submit("echo", {}, priority=12)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "job.priority" in (info.value.details() or "")
    sync = await blocking(cluster)
    try:
        with pytest.raises(grpc.RpcError) as sync_info:
            await asyncio.to_thread(sync.submit, "echo", {}, priority=12)
    finally:
        sync.close()
    assert sync_info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (await c.tenant_stats()).submitted_total == 0  # nothing was created


async def test_the_async_client_closes_and_so_does_the_blocking_one(cluster: Cluster) -> None:
    token = await cluster.token_for(TENANT)
    async with AsyncClient(cluster.target, token) as c:
        await c.submit("echo", {}, delay=3600)
    with pytest.raises(Exception, match="closed"):
        await c.submit("echo", {}, delay=3600)

    def closed_blocking() -> None:
        with Client(cluster.target, token) as sync:
            sync.submit("echo", {}, delay=3600)
        sync.submit("echo", {}, delay=3600)

    with pytest.raises(ValueError, match="closed"):
        await asyncio.to_thread(closed_blocking)
