"""The client's RetryPolicy: which codes it retries, for how long, with the same request.

A scripted JobService on a real gRPC server answers each try as the test says and records
what it was sent; the RESOURCE_EXHAUSTED opt-in is also run against a real coordinator
whose tenant is over its submit rate. The retry through a coordinator restart is in
test_coordinator.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest
from google.protobuf import any_pb2, duration_pb2
from google.rpc import error_details_pb2, status_pb2

from shardq.client import CHANNEL_OPTIONS, AsyncClient, RetryPolicy
from shardq.shard.models import TenantLimits
from shardq.v1 import common_pb2, jobs_pb2, jobs_pb2_grpc
from tests.support.cluster import running_cluster

UNAVAILABLE = grpc.StatusCode.UNAVAILABLE
EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED


class Answer:
    """How the scripted server answers one try: an error code, with a retry delay as a
    RetryInfo detail and/or a retry-after-ms trailer."""

    def __init__(
        self, code: grpc.StatusCode, retry_info_ms: int | None = None, trailer_ms: int | None = None
    ) -> None:
        self.code, self.retry_info_ms, self.trailer_ms = code, retry_info_ms, trailer_ms


class ScriptedJobs(jobs_pb2_grpc.JobServiceServicer):
    def __init__(self) -> None:
        #: Answers for the next tries, in order; when empty, a try succeeds (or ``forever``).
        self.script: list[Answer] = []
        self.forever: Answer | None = None
        #: The request_id of every try received.
        self.tries: list[str] = []

    async def SubmitJob(
        self, request: jobs_pb2.SubmitJobRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> jobs_pb2.SubmitJobResponse:
        self.tries.append(request.job.request_id)
        answer = self.script.pop(0) if self.script else self.forever
        if answer is None:
            job = common_pb2.Job(job_id="J1", request_id=request.job.request_id)
            return jobs_pb2.SubmitJobResponse(job=job)
        status = status_pb2.Status(code=answer.code.value[0], message="scripted")
        if answer.retry_info_ms is not None:
            delay = duration_pb2.Duration()
            delay.FromMilliseconds(answer.retry_info_ms)
            detail = any_pb2.Any()
            detail.Pack(error_details_pb2.RetryInfo(retry_delay=delay))
            status.details.append(detail)
        trailers: list[tuple[str, str | bytes]] = [
            ("grpc-status-details-bin", status.SerializeToString())
        ]
        if answer.trailer_ms is not None:
            trailers.append(("retry-after-ms", str(answer.trailer_ms)))
        await context.abort(answer.code, "scripted", tuple(trailers))
        raise AssertionError("unreachable")


@pytest.fixture
async def server() -> AsyncIterator[tuple[ScriptedJobs, str]]:
    jobs = ScriptedJobs()
    srv = grpc.aio.server()
    jobs_pb2_grpc.add_JobServiceServicer_to_server(jobs, srv)
    port = srv.add_insecure_port("127.0.0.1:0")
    await srv.start()
    try:
        yield jobs, f"127.0.0.1:{port}"
    finally:
        await srv.stop(0)


async def submit(target: str, policy: RetryPolicy | None = None) -> grpc.StatusCode | None:
    """Submit one job with ``policy`` (the default when None): None, or the code it raised."""
    async with AsyncClient(target, "sq_token", retry=policy) as client:
        try:
            await client.submit("h", {}, request_id="rid-1")
        except grpc.aio.AioRpcError as exc:
            return exc.code()
    return None


def test_the_default_budget_covers_a_coordinator_restart() -> None:
    policy = RetryPolicy()
    assert policy.deadline_s >= 15  # a restart is 5-7 s, plus the reconnect backoff
    assert policy.attempts == 0  # the deadline, not a count, ends it
    assert not policy.retry_resource_exhausted
    assert dict(CHANNEL_OPTIONS)["grpc.max_reconnect_backoff_ms"] <= 5_000
    for attempt in range(30):
        ceiling = min(policy.cap_s, policy.base_s * 2**attempt)
        assert ceiling / 2 <= policy.pause_s(attempt) <= ceiling  # jittered, never zero


async def test_unavailable_is_retried_with_the_same_request_until_it_succeeds(
    server: tuple[ScriptedJobs, str],
) -> None:
    jobs, target = server
    jobs.script = [Answer(UNAVAILABLE)] * 5 + [Answer(grpc.StatusCode.CANCELLED)]
    assert await submit(target) is None
    assert jobs.tries == ["rid-1"] * 7


async def test_attempts_and_the_deadline_each_end_the_retries(
    server: tuple[ScriptedJobs, str],
) -> None:
    jobs, target = server
    jobs.forever = Answer(UNAVAILABLE)
    assert await submit(target, RetryPolicy(attempts=1)) == UNAVAILABLE
    assert len(jobs.tries) == 1
    jobs.tries.clear()
    assert await submit(target, RetryPolicy(attempts=4, base_s=0.01)) == UNAVAILABLE
    assert len(jobs.tries) == 4
    jobs.tries.clear()
    # No count: the deadline ends it, after the first try and at least one retry.
    assert await submit(target, RetryPolicy(deadline_s=0.5, base_s=0.05, cap_s=0.1)) == UNAVAILABLE
    assert len(jobs.tries) >= 2
    assert set(jobs.tries) == {"rid-1"}


async def test_other_codes_are_not_retried(server: tuple[ScriptedJobs, str]) -> None:
    jobs, target = server
    for code in (
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.ALREADY_EXISTS,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.FAILED_PRECONDITION,
    ):
        jobs.tries.clear()
        jobs.script = [Answer(code)]
        assert await submit(target) == code
        assert len(jobs.tries) == 1


async def test_resource_exhausted_is_retried_after_the_servers_delay_only_when_asked(
    server: tuple[ScriptedJobs, str],
) -> None:
    jobs, target = server
    opt_in = RetryPolicy(retry_resource_exhausted=True)
    jobs.script = [Answer(EXHAUSTED, retry_info_ms=50, trailer_ms=50)]
    assert await submit(target) == EXHAUSTED  # the default: the caller's backpressure
    assert len(jobs.tries) == 1
    for answer in (
        Answer(EXHAUSTED, retry_info_ms=50, trailer_ms=60_000),  # RetryInfo first
        Answer(EXHAUSTED, trailer_ms=50),  # the trailer alone
    ):
        jobs.tries.clear()
        jobs.script = [answer]
        assert await submit(target, opt_in) is None
        assert jobs.tries == ["rid-1", "rid-1"]
    for answer in (
        Answer(EXHAUSTED),  # no delay given: not retried
        Answer(EXHAUSTED, retry_info_ms=60_000),  # longer than the budget: not waited for
    ):
        jobs.tries.clear()
        jobs.script = [answer]
        assert await submit(target, opt_in) == EXHAUSTED
        assert len(jobs.tries) == 1


async def test_a_tenant_over_its_rate_gets_through_with_the_opt_in(database_url: str) -> None:
    limits = {"rated": TenantLimits(submit_rate_per_s=1, submit_burst=1)}
    async with running_cluster(database_url, tenant_limits=limits) as cluster:
        plain = await cluster.client("rated", retry=RetryPolicy())
        codes = []
        for i in range(3):
            try:
                await plain.submit("h", {"i": i})
                codes.append(grpc.StatusCode.OK)
            except grpc.aio.AioRpcError as exc:
                codes.append(exc.code())
        assert EXHAUSTED in codes  # the default policy hands it to the caller
        assert set(codes) <= {grpc.StatusCode.OK, EXHAUSTED}
        patient = await cluster.client("rated", retry=RetryPolicy(retry_resource_exhausted=True))
        subs = [await patient.submit("h", {"n": i}, request_id=f"r-{i}") for i in range(3)]
        assert len({s.job_id for s in subs}) == 3
        assert not any(s.deduplicated for s in subs)
