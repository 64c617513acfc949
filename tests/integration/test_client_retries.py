"""The client's RetryPolicy: which codes it retries, for how long, with the same request,
for the blocking client (gRPC's sync stubs) and the asyncio one alike.

A scripted JobService on a real gRPC server answers each try as the test says and records
what it was sent; RESOURCE_EXHAUSTED is also run against a real coordinator whose tenant is
over its submit rate. The retry through a coordinator restart is in test_coordinator.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc
import pytest
from google.protobuf import any_pb2, duration_pb2
from google.rpc import error_details_pb2, status_pb2

from shardq.client import CHANNEL_OPTIONS, AsyncClient, Client, RetryPolicy, Submitted
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
    jobs = ScriptedJobs()  # type: ignore[abstract]  # only SubmitJob is called
    srv = grpc.aio.server()
    jobs_pb2_grpc.add_JobServiceServicer_to_server(jobs, srv)
    port = srv.add_insecure_port("127.0.0.1:0")
    await srv.start()
    try:
        yield jobs, f"127.0.0.1:{port}"
    finally:
        await srv.stop(0)


def submit_blocking(target: str, policy: RetryPolicy | None) -> grpc.StatusCode | None:
    with Client(target, "sq_token", retry=policy) as client:
        try:
            client.submit("h", {}, request_id="rid-1")
        except grpc.RpcError as exc:
            code: grpc.StatusCode = exc.code()
            return code
    return None


async def submit_async(target: str, policy: RetryPolicy | None) -> grpc.StatusCode | None:
    async with AsyncClient(target, "sq_token", retry=policy) as client:
        try:
            await client.submit("h", {}, request_id="rid-1")
        except grpc.aio.AioRpcError as exc:
            return exc.code()
    return None


Submit = Callable[..., Awaitable[grpc.StatusCode | None]]


@pytest.fixture(params=["blocking", "asyncio"])
def submit(request: pytest.FixtureRequest) -> Submit:
    """Submit one job with a policy (the default when None) through the blocking client (in a
    thread: the scripted server runs on this loop) or the asyncio one: None, or the code it
    raised."""

    async def blocking(target: str, policy: RetryPolicy | None = None) -> grpc.StatusCode | None:
        return await asyncio.to_thread(submit_blocking, target, policy)

    async def asyncio_(target: str, policy: RetryPolicy | None = None) -> grpc.StatusCode | None:
        return await submit_async(target, policy)

    return blocking if request.param == "blocking" else asyncio_


def test_the_default_budget_covers_a_coordinator_restart() -> None:
    policy = RetryPolicy()
    assert policy.deadline_s >= 15  # a restart is 5-7 s, plus the reconnect backoff
    assert policy.attempts == 0  # the deadline, not a count, ends it
    assert policy.retry_resource_exhausted  # after the delay the server asks for
    assert dict(CHANNEL_OPTIONS)["grpc.max_reconnect_backoff_ms"] <= 5_000
    for attempt in range(30):
        ceiling = min(policy.cap_s, policy.base_s * 2**attempt)
        assert ceiling / 2 <= policy.pause_s(attempt) <= ceiling  # jittered, never zero


async def test_unavailable_is_retried_with_the_same_request_until_it_succeeds(
    server: tuple[ScriptedJobs, str], submit: Submit
) -> None:
    jobs, target = server
    jobs.script = [Answer(UNAVAILABLE)] * 5 + [Answer(grpc.StatusCode.CANCELLED)]
    assert await submit(target) is None
    assert jobs.tries == ["rid-1"] * 7


async def test_attempts_and_the_deadline_each_end_the_retries(
    server: tuple[ScriptedJobs, str], submit: Submit
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


async def test_other_codes_are_not_retried(
    server: tuple[ScriptedJobs, str], submit: Submit
) -> None:
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


async def test_resource_exhausted_is_retried_after_the_servers_delay_unless_turned_off(
    server: tuple[ScriptedJobs, str], submit: Submit
) -> None:
    jobs, target = server
    for answer in (
        Answer(EXHAUSTED, retry_info_ms=50, trailer_ms=60_000),  # RetryInfo first
        Answer(EXHAUSTED, trailer_ms=50),  # the trailer alone
    ):
        jobs.tries.clear()
        jobs.script = [answer]
        assert await submit(target) is None  # the default policy waits and retries
        assert jobs.tries == ["rid-1", "rid-1"]
    for answer in (
        Answer(EXHAUSTED),  # no delay given: not retried
        Answer(EXHAUSTED, retry_info_ms=60_000),  # longer than the budget: not waited for
    ):
        jobs.tries.clear()
        jobs.script = [answer]
        assert await submit(target) == EXHAUSTED
        assert len(jobs.tries) == 1
    jobs.tries.clear()
    jobs.script = [Answer(EXHAUSTED, retry_info_ms=50, trailer_ms=50)]
    off = RetryPolicy(retry_resource_exhausted=False)  # the caller's own backpressure
    assert await submit(target, off) == EXHAUSTED
    assert len(jobs.tries) == 1


def submit_three_blocking(target: str, token: str) -> list[Submitted]:
    with Client(target, token) as client:  # the default policy
        return [client.submit("h", {"blocking": i}) for i in range(3)]


async def test_a_tenant_over_its_rate_gets_through_by_waiting_as_the_server_says(
    database_url: str,
) -> None:
    limits = {"rated": TenantLimits(submit_rate_per_s=2, submit_burst=1)}
    async with running_cluster(database_url, tenant_limits=limits) as cluster:
        off = await cluster.client("rated", retry=RetryPolicy(retry_resource_exhausted=False))
        codes = []
        for i in range(3):
            try:
                await off.submit("h", {"i": i})
                codes.append(grpc.StatusCode.OK)
            except grpc.aio.AioRpcError as exc:
                codes.append(exc.code())
        assert EXHAUSTED in codes  # over its rate: refused, with the delay to wait
        assert set(codes) <= {grpc.StatusCode.OK, EXHAUSTED}
        accepted = codes.count(grpc.StatusCode.OK)

        # The default policy waits the RetryInfo delay and tries again: every submit gets
        # through (a bucket of 1 refuses at least the second of each quick run of three),
        # each one job.
        patient = await cluster.client("rated", retry=RetryPolicy())
        subs = [await patient.submit("h", {"n": i}) for i in range(3)]
        token = await cluster.token_for("rated")
        subs += await asyncio.to_thread(submit_three_blocking, cluster.target, token)
        assert len({s.job_id for s in subs}) == 6
        assert len({s.job.request_id for s in subs}) == 6
        assert not any(s.deduplicated for s in subs)
        assert (await patient.tenant_stats()).submitted_total == accepted + 6
