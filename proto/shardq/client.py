"""Python client for the shardq.v1 API: :class:`AsyncClient` (asyncio) and :class:`Client`.

Submits always carry a request_id (one is generated when the caller gives none) and are
retried on UNAVAILABLE with that same request_id, so a retry through a coordinator restart can
never create a second job: the server deduplicates it.

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
    #: Tries in all, the first included.
    attempts: int = 6
    #: First pause, in seconds; doubles each time, with full jitter.
    base_s: float = 0.05
    cap_s: float = 2.0

    def pause_s(self, attempt: int) -> float:
        return random.uniform(0, min(self.cap_s, self.base_s * 2**attempt))


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
    ) -> None:
        creds = _channel_args(tls, root_certificates, client_cert)
        self.channel = (
            grpc.aio.secure_channel(target, creds) if creds else grpc.aio.insecure_channel(target)
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
        for attempt in range(self.retry.attempts):
            try:
                return await method(request, metadata=self._md, timeout=self.timeout_s)
            except grpc.aio.AioRpcError as exc:
                if exc.code() not in RETRYABLE or attempt == self.retry.attempts - 1:
                    raise
            await asyncio.sleep(self.retry.pause_s(attempt))
        raise AssertionError("unreachable")

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
    """The server's suggested delay of a RESOURCE_EXHAUSTED error, if it gave one."""
    for key, value in exc.trailing_metadata() or ():
        if key == "retry-after-ms":
            return int(value)
    return None
