"""Retry policies per handler and per job, through a real coordinator, a real shard and a real
worker process: the job's ``JobSpec.retry`` over the handler's ``Retry`` over the server
default, seen in ``GetJob``'s ``next_attempt_at_unix_ms``; exceptions a handler lists as
permanent dead-letter the job after one attempt; a bad ``retry`` is INVALID_ARGUMENT naming
its field. The waits are long (minutes), so a retry never runs during a test, and each is
checked against the shard's own clock read before and after the failure (no timing).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from redis.asyncio import Redis

from shardq.v1 import common_pb2, jobs_pb2, jobs_pb2_grpc
from tests.support.cluster import Cluster, running_cluster
from tests.support.procs import start_worker, wait_until_serving
from tests.support.workers import wait_for_rows

HANDLERS = "tests.support.handlers_progress"
TENANT = "acme"
S = common_pb2.JobState


@pytest.fixture
async def cluster(database_url: str) -> AsyncIterator[Cluster]:
    async with running_cluster(database_url, shard_count=1) as c:
        yield c


@pytest.fixture
async def stub(cluster: Cluster) -> AsyncIterator[jobs_pb2_grpc.JobServiceStub]:
    channel = grpc.aio.insecure_channel(cluster.target)
    yield jobs_pb2_grpc.JobServiceStub(channel)
    await channel.close()


@pytest.fixture
async def md(cluster: Cluster) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {await cluster.token_for(TENANT)}"),)


def spec(handler: str, payload: Any = None, **kw: Any) -> common_pb2.JobSpec:
    return common_pb2.JobSpec(handler=handler, payload=json.dumps(payload).encode(), **kw)


async def shard_now(cluster: Cluster) -> int:
    """The shard's clock (Redis TIME), which every time of a job comes from."""
    redis = Redis.from_url(cluster.shards[0].url)
    try:
        sec, usec = await redis.time()
        return sec * 1000 + usec // 1000
    finally:
        await redis.aclose()


async def failed_once(
    stub: jobs_pb2_grpc.JobServiceStub, md: Any, job_id: str, state: int = S.JOB_STATE_SCHEDULED
) -> common_pb2.Job:
    """The job once its first attempt failed (SCHEDULED for a retry, or DEAD)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60
    while True:
        job = await stub.GetJob(jobs_pb2.GetJobRequest(job_id=job_id), metadata=md)
        if job.attempts >= 1 and job.state == state:
            return job
        assert job.state in (S.JOB_STATE_READY, S.JOB_STATE_ACTIVE), job
        assert loop.time() < deadline, f"never failed once: {job}"
        await asyncio.sleep(0.05)


async def test_the_jobs_policy_then_the_handlers_then_the_default_set_next_attempt_at(
    cluster: Cluster, stub: jobs_pb2_grpc.JobServiceStub, md: Any
) -> None:
    w = start_worker(cluster, "retry-0", handlers=HANDLERS)
    try:
        await wait_until_serving(w)
        submitted = {}
        before = await shard_now(cluster)
        # retry.handler: Retry(base=300 s, max=600 s, jitter=0) in its @handler.
        cases = {
            # No job policy: the handler's, exactly 300 s (no jitter).
            "handler": (spec("retry.handler", {}), 300_000, 300_000),
            # The job's base (10 min) over the handler's: capped by the handler's max (600 s).
            "job base": (
                spec("retry.handler", {}, retry=common_pb2.RetryBackoff(base_ms=900_000)),
                600_000,
                600_000,
            ),
            # The job's max alone: the handler's base (300 s) capped at the job's 120 s.
            "job max": (
                spec("retry.handler", {}, retry=common_pb2.RetryBackoff(max_ms=120_000)),
                120_000,
                120_000,
            ),
            # No handler policy: the job's base 400 s, the default's full jitter below it.
            "job on default": (
                spec("retry.default", {}, retry=common_pb2.RetryBackoff(base_ms=400_000)),
                0,
                400_000,
            ),
        }
        for name, (s, _, _) in cases.items():
            req = jobs_pb2.SubmitJobRequest(job=s)
            submitted[name] = (await stub.SubmitJob(req, metadata=md)).job.job_id
        for name, job_id in submitted.items():
            _, low, high = cases[name]
            job = await failed_once(stub, md, job_id)
            after = await shard_now(cluster)
            wait_from = (before + low, after + high)
            assert job.next_attempt_at_unix_ms == job.run_at_unix_ms, name
            assert wait_from[0] <= job.next_attempt_at_unix_ms <= wait_from[1], name
            # Exact where there is no jitter: the wait counted from the failure, which came
            # after the attempt started.
            if low == high:
                assert job.next_attempt_at_unix_ms >= job.started_at_unix_ms + low, name
            assert job.last_error.startswith("RuntimeError: "), name
    finally:
        w.stop()


async def test_a_job_not_waiting_for_a_retry_has_no_next_attempt(
    cluster: Cluster, stub: jobs_pb2_grpc.JobServiceStub, md: Any
) -> None:
    # No worker: the job stays READY, then SCHEDULED by a delay, neither after a failure.
    ready = await stub.SubmitJob(jobs_pb2.SubmitJobRequest(job=spec("x")), metadata=md)
    later = await stub.SubmitJob(
        jobs_pb2.SubmitJobRequest(job=spec("x", delay_ms=600_000)), metadata=md
    )
    assert (ready.job.state, ready.job.next_attempt_at_unix_ms) == (S.JOB_STATE_READY, 0)
    assert (later.job.state, later.job.next_attempt_at_unix_ms) == (S.JOB_STATE_SCHEDULED, 0)
    got = await stub.GetJob(jobs_pb2.GetJobRequest(job_id=later.job.job_id), metadata=md)
    assert (got.state, got.next_attempt_at_unix_ms) == (S.JOB_STATE_SCHEDULED, 0)


async def test_an_exception_the_handler_lists_as_permanent_dead_letters_after_one_attempt(
    cluster: Cluster, stub: jobs_pb2_grpc.JobServiceStub, md: Any
) -> None:
    w = start_worker(cluster, "retry-permanent", handlers=HANDLERS)
    try:
        await wait_until_serving(w)
        req = jobs_pb2.SubmitJobRequest(job=spec("retry.handler", {"permanent": True}))
        job_id = (await stub.SubmitJob(req, metadata=md)).job.job_id
        dead = await failed_once(stub, md, job_id, S.JOB_STATE_DEAD)
        assert (dead.attempts, dead.max_attempts) == (1, 5)
        assert dead.last_error == "ValueError: bad input, no retry will help"
        assert dead.next_attempt_at_unix_ms == 0
        (row,) = await wait_for_rows(cluster.database_url, 1)
        assert (row["status"], row["attempts"]) == ("dead", 1)
    finally:
        w.stop()


def fields_of(err: grpc.aio.AioRpcError) -> list[str]:
    status = rpc_status.from_call(err)  # type: ignore[arg-type]
    out = []
    for d in status.details if status else ():
        bad = error_details_pb2.BadRequest()
        if d.Unpack(bad):
            out += [v.field for v in bad.field_violations]
    return out


BAD_RETRIES = [
    (common_pb2.RetryBackoff(base_ms=-1), "job.retry.base_ms", "-1 is outside"),
    (common_pb2.RetryBackoff(max_ms=-5), "job.retry.max_ms", "-5 is outside"),
    (common_pb2.RetryBackoff(base_ms=10**12), "job.retry.base_ms", "is outside"),
    (common_pb2.RetryBackoff(base_ms=5_000, max_ms=1_000), "job.retry.max_ms", "below"),
    (common_pb2.RetryBackoff(jitter=1.5), "job.retry.jitter", "1.5 is outside [0, 1]"),
    (common_pb2.RetryBackoff(jitter=float("nan")), "job.retry.jitter", "outside"),
]


async def test_a_bad_retry_is_invalid_argument_naming_its_field(
    cluster: Cluster, stub: jobs_pb2_grpc.JobServiceStub, md: Any
) -> None:
    for retry, field, says in BAD_RETRIES:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            req = jobs_pb2.SubmitJobRequest(job=spec("x", retry=retry))
            await stub.SubmitJob(req, metadata=md)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, field
        assert fields_of(err.value) == [field]
        assert says in (err.value.details() or ""), (field, err.value.details())
        # In a batch: that item fails with the field named, the other one is accepted.
        batch = jobs_pb2.SubmitJobsRequest(jobs=[spec("x"), spec("x", retry=retry)])
        items = (await stub.SubmitJobs(batch, metadata=md)).items
        assert items[0].job_id and not items[0].HasField("error"), field
        assert (items[1].error.code, items[1].error.field) == (3, field)
