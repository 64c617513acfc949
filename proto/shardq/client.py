"""Python client for the shardq.v1 API: :class:`AsyncClient` (asyncio) and :class:`Client`.

Submits always carry a request_id (one is generated when the caller gives none) and are
retried on UNAVAILABLE with that same request_id, so a retry through a coordinator restart can
never create a second job: the server deduplicates it. By default a call is retried for up to
20 s (:class:`RetryPolicy`), which outlasts a coordinator restart.

    async with AsyncClient("localhost:50051", token="sq_...") as c:
        job = await c.submit("email.send", {"to": "a@example.com"}, delay_ms=5_000)
        async for update in c.watch(job.job_id):
            print(update.state)
"""

from __future__ import annotations

import asyncio
import json
import random
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from google.protobuf.message import DecodeError
from google.rpc import error_details_pb2, status_pb2

from shardq.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    common_pb2,
    jobs_pb2,
    jobs_pb2_grpc,
    schedules_pb2,
    schedules_pb2_grpc,
    tenants_pb2,
    tenants_pb2_grpc,
)

T = TypeVar("T")
#: Codes worth retrying: the call did not reach a shard, or the coordinator went away under
#: it (a server stopping cancels its calls; a cancel of our own raises CancelledError instead).
#: Every call is safe to repeat: submits carry a fixed request_id, the rest only read or are
#: idempotent.
RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED})
#: Longest wait between the channel's attempts to reconnect to a coordinator that went away,
#: in ms. gRPC's default grows to 120 s (1 s, 1.6 s, 2.6 s, 4.1 s, 6.6 s... apart), so a client
#: could stay away for seconds after a restarted coordinator is back; capped, it sees it
#: within about 2 s, well inside ``RetryPolicy``'s budget.
MAX_RECONNECT_BACKOFF_MS = 2_000
#: Options of every client channel (``AsyncClient(channel_options=...)`` adds or overrides).
CHANNEL_OPTIONS: tuple[tuple[str, Any], ...] = (
    ("grpc.max_reconnect_backoff_ms", MAX_RECONNECT_BACKOFF_MS),
)


@dataclass(frozen=True, slots=True)
class Submitted:
    job: common_pb2.Job
    deduplicated: bool

    @property
    def job_id(self) -> str:
        return self.job.job_id


def encode_payload(payload: Any) -> bytes:
    """bytes pass through (they must be JSON already); anything else is JSON-encoded."""
    if isinstance(payload, bytes | bytearray):
        return bytes(payload)
    return json.dumps(payload, separators=(",", ":")).encode()


def job_spec(
    handler: str,
    payload: Any = None,
    *,
    request_id: str | None = None,
    priority: int = 0,
    run_at_ms: int | None = None,
    delay_ms: int | None = None,
    max_attempts: int = 0,
    timeout_ms: int = 0,
    queue: str = "",
) -> common_pb2.JobSpec:
    """A JobSpec with a request_id (generated when not given) fixed before the first try.
    ``queue`` empty means the ``default`` queue."""
    spec = common_pb2.JobSpec(
        request_id=request_id or uuid.uuid4().hex,
        handler=handler,
        payload=encode_payload(payload),
        priority=priority,
        max_attempts=max_attempts,
        timeout_ms=timeout_ms,
        queue=queue,
    )
    if run_at_ms is not None:
        spec.run_at_unix_ms = run_at_ms
    if delay_ms is not None:
        spec.delay_ms = delay_ms
    return spec


def _channel_args(
    tls: bool, root_certificates: bytes | None, client_cert: tuple[bytes, bytes] | None
) -> grpc.ChannelCredentials | None:
    if not tls and root_certificates is None:
        return None
    key, chain = client_cert if client_cert else (None, None)
    return grpc.ssl_channel_credentials(root_certificates, key, chain)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How a call that failed with a retryable code is tried again.

    Retried: ``UNAVAILABLE`` and ``CANCELLED`` (:data:`RETRYABLE`), and ``RESOURCE_EXHAUSTED``
    after the delay the server gives only when ``retry_resource_exhausted`` is set. Tries go
    on until one succeeds, fails otherwise, or the budget is spent: ``deadline_s`` seconds
    from the start of the first try (the last retry starts at the deadline at the latest),
    or ``attempts`` tries if that is set. Every try of a submit carries the same request_id,
    so no retry can make a second job.

    The default budget (20 s) outlasts a coordinator restart (5-7 s) plus gRPC's reconnect
    backoff (at most :data:`MAX_RECONNECT_BACKOFF_MS` on the client's channel).
    ``RetryPolicy(attempts=1)`` never retries.
    """

    #: Time budget of a call, in seconds from the start of its first try: no retry starts
    #: after it. Each try still has the client's ``timeout_s``.
    deadline_s: float = 20.0
    #: Most tries in all, the first included; 0: no limit but ``deadline_s``.
    attempts: int = 0
    #: First pause, in seconds; doubles after each try up to ``cap_s``. Each pause is drawn
    #: between half and all of that (jitter: clients that failed together do not retry
    #: together).
    base_s: float = 0.1
    cap_s: float = 2.0
    #: Also retry ``RESOURCE_EXHAUSTED`` (a tenant over its rate or quota) after the delay its
    #: ``RetryInfo`` detail or ``retry-after-ms`` trailer gives, within the budget. Off: such
    #: an error goes to the caller at once, whose backpressure it is.
    retry_resource_exhausted: bool = False

    def pause_s(self, attempt: int) -> float:
        """The pause after try number ``attempt`` (0 for the first) failed retryably."""
        ceiling = min(self.cap_s, self.base_s * 2 ** min(attempt, 64))
        return random.uniform(ceiling / 2, ceiling)

    def pause_after(self, exc: grpc.aio.AioRpcError, attempt: int) -> float | None:
        """The pause before trying again after ``exc`` ended try number ``attempt`` (0 for the
        first), or None when it is not to be retried (the budget aside)."""
        code = exc.code()
        if code in RETRYABLE:
            return self.pause_s(attempt)
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED and self.retry_resource_exhausted:
            delay_ms = retry_delay_ms(exc)
            if delay_ms is None:
                return None
            return delay_ms / 1000 * random.uniform(1.0, 1.1)
        return None


class AsyncClient:
    def __init__(
        self,
        target: str,
        token: str,
        *,
        tls: bool = False,
        root_certificates: bytes | None = None,
        client_cert: tuple[bytes, bytes] | None = None,
        retry: RetryPolicy | None = None,
        timeout_s: float = 30.0,
        tenant_id: str = "",
        channel_options: Sequence[tuple[str, Any]] = (),
    ) -> None:
        creds = _channel_args(tls, root_certificates, client_cert)
        options = list({**dict(CHANNEL_OPTIONS), **dict(channel_options)}.items())
        self.channel = (
            grpc.aio.secure_channel(target, creds, options)
            if creds
            else grpc.aio.insecure_channel(target, options)
        )
        self._md = (("authorization", f"Bearer {token}"),)
        self.retry = retry or RetryPolicy()
        self.timeout_s = timeout_s
        self.tenant_id = tenant_id
        self.jobs = jobs_pb2_grpc.JobServiceStub(self.channel)
        self.schedules = schedules_pb2_grpc.ScheduleServiceStub(self.channel)
        self.tenants = tenants_pb2_grpc.TenantServiceStub(self.channel)
        self.admin = admin_pb2_grpc.AdminServiceStub(self.channel)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self.channel.close()

    async def _call(self, method: Callable[..., Any], request: Any) -> Any:
        """``method(request)``, tried again as ``self.retry`` says; the same request (so the
        same request_id) every time."""
        policy = self.retry
        loop = asyncio.get_running_loop()
        started = loop.time()
        attempt = 0
        while True:
            try:
                return await method(request, metadata=self._md, timeout=self.timeout_s)
            except grpc.aio.AioRpcError as exc:
                pause = policy.pause_after(exc, attempt)
                attempt += 1
                left = policy.deadline_s - (loop.time() - started)
                if pause is None or left <= 0 or 0 < policy.attempts <= attempt:
                    raise
                if pause > left:
                    if exc.code() not in RETRYABLE:
                        raise  # the server asks for a longer wait than the budget has
                    pause = left  # one last try, at the deadline
            await asyncio.sleep(pause)

    async def submit(self, handler: str, payload: Any = None, **options: Any) -> Submitted:
        """Submit one job; ``options`` are :func:`job_spec`'s (``queue=``, ``delay_ms=``...)."""
        spec = job_spec(handler, payload, **options)
        req = jobs_pb2.SubmitJobRequest(tenant_id=self.tenant_id, job=spec)
        resp = await self._call(self.jobs.SubmitJob, req)
        return Submitted(resp.job, resp.deduplicated)

    async def submit_many(
        self, specs: Iterable[common_pb2.JobSpec]
    ) -> list[jobs_pb2.SubmitJobsItem]:
        """Submit a batch (build items with :func:`job_spec`); one status per item."""
        req = jobs_pb2.SubmitJobsRequest(tenant_id=self.tenant_id, jobs=list(specs))
        resp = await self._call(self.jobs.SubmitJobs, req)
        return list(resp.items)

    async def get(self, job_id: str) -> common_pb2.Job:
        req = jobs_pb2.GetJobRequest(tenant_id=self.tenant_id, job_id=job_id)
        job: common_pb2.Job = await self._call(self.jobs.GetJob, req)
        return job

    async def cancel(self, job_id: str) -> common_pb2.Job:
        req = jobs_pb2.CancelJobRequest(tenant_id=self.tenant_id, job_id=job_id)
        return (await self._call(self.jobs.CancelJob, req)).job  # type: ignore[no-any-return]

    async def watch(self, job_id: str) -> AsyncIterator[common_pb2.Job]:
        req = jobs_pb2.WatchJobRequest(tenant_id=self.tenant_id, job_id=job_id)
        async for job in self.jobs.WatchJob(req, metadata=self._md):
            yield job

    async def wait(self, job_id: str) -> common_pb2.Job:
        """Block until the job is terminal; returns its final state."""
        final = None
        async for job in self.watch(job_id):
            final = job
        if final is None:
            raise RuntimeError(f"the watch of {job_id} ended without a message")
        return final

    async def list_jobs(
        self, state: common_pb2.JobState.ValueType, page_size: int = 100, page_token: str = ""
    ) -> jobs_pb2.ListJobsResponse:
        req = jobs_pb2.ListJobsRequest(
            tenant_id=self.tenant_id, state=state, page_size=page_size, page_token=page_token
        )
        return await self._call(self.jobs.ListJobs, req)  # type: ignore[no-any-return]

    async def list_dead(
        self, page_size: int = 100, page_token: str = ""
    ) -> jobs_pb2.ListDeadJobsResponse:
        req = jobs_pb2.ListDeadJobsRequest(
            tenant_id=self.tenant_id, page_size=page_size, page_token=page_token
        )
        return await self._call(self.jobs.ListDeadJobs, req)  # type: ignore[no-any-return]

    async def requeue_dead(
        self, job_ids: Sequence[str] = (), *, all: bool = False
    ) -> jobs_pb2.RequeueDeadJobsResponse:
        req = jobs_pb2.RequeueDeadJobsRequest(
            tenant_id=self.tenant_id, job_ids=list(job_ids), all=all
        )
        return await self._call(self.jobs.RequeueDeadJobs, req)  # type: ignore[no-any-return]

    async def create_schedule(
        self, schedule_id: str, cron: str, template: common_pb2.JobSpec, time_zone: str = "UTC"
    ) -> schedules_pb2.Schedule:
        req = schedules_pb2.CreateScheduleRequest(
            tenant_id=self.tenant_id,
            schedule=schedules_pb2.Schedule(
                schedule_id=schedule_id, cron=cron, time_zone=time_zone, job_template=template
            ),
        )
        return (await self._call(self.schedules.CreateSchedule, req)).schedule  # type: ignore[no-any-return]

    async def list_schedules(self) -> list[schedules_pb2.Schedule]:
        out: list[schedules_pb2.Schedule] = []
        token = ""
        while True:
            req = schedules_pb2.ListSchedulesRequest(
                tenant_id=self.tenant_id, page_size=1000, page_token=token
            )
            resp = await self._call(self.schedules.ListSchedules, req)
            out.extend(resp.schedules)
            token = resp.next_page_token
            if not token:
                return out

    async def delete_schedule(self, schedule_id: str) -> None:
        req = schedules_pb2.DeleteScheduleRequest(tenant_id=self.tenant_id, schedule_id=schedule_id)
        await self._call(self.schedules.DeleteSchedule, req)

    async def tenant_stats(self) -> common_pb2.TenantStats:
        req = tenants_pb2.GetTenantStatsRequest(tenant_id=self.tenant_id)
        return await self._call(self.tenants.GetTenantStats, req)  # type: ignore[no-any-return]

    async def shard_map(self) -> admin_pb2.ShardMap:
        return await self._call(self.admin.GetShardMap, admin_pb2.GetShardMapRequest())  # type: ignore[no-any-return]

    async def list_tenant_stats(
        self, shard_id: int | None = None, page_size: int = 100, page_token: str = ""
    ) -> admin_pb2.ListTenantStatsResponse:
        req = admin_pb2.ListTenantStatsRequest(page_size=page_size, page_token=page_token)
        if shard_id is not None:
            req.shard_id = shard_id
        return await self._call(self.admin.ListTenantStats, req)  # type: ignore[no-any-return]

    # -- admin: tenant limits, pause and resume (the admin token) ------------------------------

    async def set_tenant_limits(
        self, limits: common_pb2.TenantLimits, tenant_id: str = ""
    ) -> common_pb2.TenantLimits:
        """Replace a tenant's limits (every field; 0 takes the server default); returns them
        as now enforced. ``tenant_id`` defaults to the client's."""
        req = admin_pb2.SetTenantLimitsRequest(tenant_id=tenant_id or self.tenant_id, limits=limits)
        return await self._call(self.admin.SetTenantLimits, req)  # type: ignore[no-any-return]

    async def tenant_limits(self, tenant_id: str = "") -> common_pb2.TenantLimits:
        """A tenant's limits as stored, server defaults applied."""
        req = admin_pb2.GetTenantLimitsRequest(tenant_id=tenant_id or self.tenant_id)
        return await self._call(self.admin.GetTenantLimits, req)  # type: ignore[no-any-return]

    async def pause(self, tenant_id: str = "", queue: str = "") -> None:
        """Stop claims of a tenant, of a queue for every tenant, or of one tenant's queue."""
        req = admin_pb2.PauseRequest(tenant_id=tenant_id, queue=queue)
        await self._call(self.admin.Pause, req)

    async def resume(self, tenant_id: str = "", queue: str = "") -> None:
        """Undo a :meth:`pause` of the same target; waiting workers wake at once."""
        req = admin_pb2.ResumeRequest(tenant_id=tenant_id, queue=queue)
        await self._call(self.admin.Resume, req)


class Client:
    """The blocking twin of :class:`AsyncClient`, for scripts and synchronous services."""

    def __init__(self, target: str, token: str, **kwargs: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._async = self._loop.run_until_complete(self._make(target, token, kwargs))

    @staticmethod
    async def _make(target: str, token: str, kwargs: dict[str, Any]) -> AsyncClient:
        return AsyncClient(target, token, **kwargs)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._loop.run_until_complete(self._async.close())
        self._loop.close()

    def _run(self, aw: Any) -> Any:
        return self._loop.run_until_complete(aw)

    def submit(self, handler: str, payload: Any = None, **options: Any) -> Submitted:
        return self._run(self._async.submit(handler, payload, **options))  # type: ignore[no-any-return]

    def submit_many(self, specs: Iterable[common_pb2.JobSpec]) -> list[jobs_pb2.SubmitJobsItem]:
        return self._run(self._async.submit_many(specs))  # type: ignore[no-any-return]

    def get(self, job_id: str) -> common_pb2.Job:
        return self._run(self._async.get(job_id))  # type: ignore[no-any-return]

    def cancel(self, job_id: str) -> common_pb2.Job:
        return self._run(self._async.cancel(job_id))  # type: ignore[no-any-return]

    def watch(self, job_id: str) -> Iterator[common_pb2.Job]:
        it = self._async.watch(job_id).__aiter__()
        while True:
            try:
                yield self._run(it.__anext__())
            except StopAsyncIteration:
                return

    def wait(self, job_id: str) -> common_pb2.Job:
        return self._run(self._async.wait(job_id))  # type: ignore[no-any-return]

    def __getattr__(self, name: str) -> Any:
        """The remaining calls (list_jobs, list_dead, schedules, stats...), run to completion."""
        method = getattr(self._async, name)
        if not callable(method):
            return method

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._run(method(*args, **kwargs))

        return call


def retry_delay_ms(exc: grpc.aio.AioRpcError) -> int | None:
    """The server's suggested delay of a RESOURCE_EXHAUSTED error, if it gave one: the
    ``RetryInfo`` detail of the status, else the ``retry-after-ms`` trailer."""
    fallback = None
    for key, value in exc.trailing_metadata() or ():
        if key == "grpc-status-details-bin" and isinstance(value, bytes):
            delay = _retry_info_ms(value)
            if delay is not None:
                return delay
        elif key == "retry-after-ms":
            try:
                fallback = max(0, int(value))
            except ValueError:
                continue
    return fallback


def _retry_info_ms(raw: bytes) -> int | None:
    """The delay of the ``google.rpc.RetryInfo`` detail in a serialized ``google.rpc.Status``."""
    try:
        status = status_pb2.Status.FromString(raw)
    except DecodeError:
        return None
    for detail in status.details:
        info = error_details_pb2.RetryInfo()
        if detail.Unpack(info):
            delay: int = info.retry_delay.ToMilliseconds()
            return max(0, delay)
    return None
