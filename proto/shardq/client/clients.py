"""The two clients: :class:`Client`, blocking, on gRPC's synchronous stubs (thread-safe: one
client can serve every thread of a process, and it works from any thread, a running event
loop's included), and :class:`AsyncClient`, its awaitable twin on ``grpc.aio`` (same
methods, same arguments, same results).

Each method is the same three steps in both: the request from :class:`Requests`, the call
through ``_call`` (the retries of :class:`~shardq.client.retry.Attempts`), the typed result
from :mod:`shardq.client.model`; only the sending differs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Sequence
from datetime import timedelta
from typing import Any, TypeVar, Unpack

import grpc

from shardq.client.base import ClientBase, Watching, stubs_on
from shardq.client.model import (
    Job,
    JobState,
    Page,
    RequeueResult,
    Schedule,
    SubmitItem,
    Submitted,
    TenantLimits,
    TenantStats,
    job_page,
)
from shardq.client.requests import BatchItem, JobOptions, ScheduleOptions
from shardq.v1 import admin_pb2

Resp = TypeVar("Resp")


class Client(ClientBase):
    """A blocking client of the shardq API.

    ::

        with Client("127.0.0.1:50051", token="sq_...") as c:
            sub = c.submit("email.send", {"to": "a@example.com"}, delay=timedelta(seconds=5))
            job = c.wait(sub.job_id, timeout=60)
            print(job.state.name, job.result)

    Calls are retried as ``retry`` (a :class:`~shardq.client.RetryPolicy`) says; a submit
    keeps its request_id through every retry. ``tenant_id`` empty: the token's tenant. The
    generated stubs are at :attr:`stubs` for calls the client does not wrap.
    """

    def __init__(self, target: str, token: str, **options: Any) -> None:
        super().__init__(token, **options)
        self.channel: grpc.Channel = (
            grpc.secure_channel(target, self.credentials, self.channel_options)
            if self.credentials
            else grpc.insecure_channel(target, self.channel_options)
        )
        self.stubs = stubs_on(self.channel)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.channel.close()

    def _call(self, method: Callable[..., Resp], request: Any) -> Resp:
        """``method(request)``, tried again as :attr:`retry` says: the same request (so the
        same request_id) every time."""
        tries = self.attempts()
        while True:
            try:
                return method(request, metadata=self.metadata, timeout=self.timeout_s)
            except grpc.RpcError as exc:
                time.sleep(tries.pause_after(exc))

    # -- jobs -------------------------------------------------------------------------------

    def submit(self, handler: str, payload: Any = None, **options: Unpack[JobOptions]) -> Submitted:
        """Submit one job (keywords: :class:`~shardq.client.JobOptions`)."""
        req = self.requests.submit(handler, payload, options)
        return Submitted.from_proto(self._call(self.stubs.jobs.SubmitJob, req))

    def submit_many(self, jobs: Iterable[BatchItem]) -> list[SubmitItem]:
        """Submit a batch (``JobRequest``s, dicts of their fields, or ``job_spec()``s); one
        item per job, in order, each accepted or with its own error."""
        resp = self._call(self.stubs.jobs.SubmitJobs, self.requests.submit_many(jobs))
        return [SubmitItem.from_proto(item) for item in resp.items]

    def get(self, job_id: str) -> Job:
        return Job.from_proto(self._call(self.stubs.jobs.GetJob, self.requests.get(job_id)))

    def cancel(self, job_id: str) -> Job:
        resp = self._call(self.stubs.jobs.CancelJob, self.requests.cancel(job_id))
        return Job.from_proto(resp.job)

    def watch(self, job_id: str, *, timeout: timedelta | float | None = None) -> Iterator[Job]:
        """The job now, then at each change, until it ends (SUCCEEDED, DEAD or CANCELLED).
        Past ``timeout`` (seconds or a timedelta; None: none) raises TimeoutError."""
        watching = Watching(self, job_id, timeout)
        while True:
            stream = self.stubs.jobs.WatchJob(
                watching.request, metadata=self.metadata, timeout=watching.timeout()
            )
            try:
                for msg in stream:
                    yield (job := watching.seen(msg))
                    if job.done:
                        return
                return
            except grpc.RpcError as exc:
                time.sleep(watching.pause_after(exc))
            finally:
                stream.cancel()

    def wait(self, job_id: str, *, timeout: timedelta | float | None = None) -> Job:
        """The job once it ended; TimeoutError if it has not within ``timeout``."""
        last = None
        for last in self.watch(job_id, timeout=timeout):  # noqa: B007 - the last one counts
            pass
        return last if last is not None and last.done else self.get(job_id)

    def list_jobs(self, state: JobState, page_size: int = 0, page_token: str = "") -> Page[Job]:
        """A page of the tenant's jobs in ``state`` (``page_size`` 0: the server's 100)."""
        req = self.requests.list_jobs(state, page_size, page_token)
        resp = self._call(self.stubs.jobs.ListJobs, req)
        return job_page(resp.jobs, resp.next_page_token)

    def list_dead(self, page_size: int = 0, page_token: str = "") -> Page[Job]:
        """A page of the tenant's dead jobs, most recently dead first."""
        resp = self._call(
            self.stubs.jobs.ListDeadJobs, self.requests.list_dead(page_size, page_token)
        )
        return job_page(resp.jobs, resp.next_page_token)

    def requeue_dead(self, job_ids: Sequence[str] = (), *, all: bool = False) -> RequeueResult:
        resp = self._call(self.stubs.jobs.RequeueDeadJobs, self.requests.requeue_dead(job_ids, all))
        return RequeueResult(resp.requeued_count, tuple(resp.not_found_job_ids))

    # -- schedules --------------------------------------------------------------------------

    def schedule(
        self,
        schedule_id: str,
        cron: str,
        handler: str,
        payload: Any = None,
        **options: Unpack[ScheduleOptions],
    ) -> Schedule:
        """Create a recurring schedule (the same definition again is a no-op): ``handler``
        with ``payload`` each time the 5-field ``cron`` fires in ``timezone`` (UTC)."""
        req = self.requests.schedule(schedule_id, cron, handler, payload, options)
        return Schedule.from_proto(self._call(self.stubs.schedules.CreateSchedule, req).schedule)

    def list_schedules(self) -> list[Schedule]:
        """Every schedule of the tenant (all pages)."""
        found: list[Schedule] = []
        token = ""
        while True:
            req = self.requests.list_schedules(token)
            resp = self._call(self.stubs.schedules.ListSchedules, req)
            found += map(Schedule.from_proto, resp.schedules)
            if not (token := resp.next_page_token):
                return found

    def delete_schedule(self, schedule_id: str) -> None:
        self._call(self.stubs.schedules.DeleteSchedule, self.requests.delete_schedule(schedule_id))

    # -- stats and admin --------------------------------------------------------------------

    def tenant_stats(self) -> TenantStats:
        resp = self._call(self.stubs.tenants.GetTenantStats, self.requests.tenant_stats())
        return TenantStats.from_proto(resp)

    def list_tenant_stats(
        self, shard_id: int | None = None, page_size: int = 0, page_token: str = ""
    ) -> Page[TenantStats]:
        """Admin: a page of every tenant's stats (of one shard when ``shard_id`` is given)."""
        req = self.requests.list_tenant_stats(shard_id, page_size, page_token)
        resp = self._call(self.stubs.admin.ListTenantStats, req)
        return Page(tuple(map(TenantStats.from_proto, resp.tenants)), resp.next_page_token)

    def shard_map(self) -> admin_pb2.ShardMap:
        """Admin: the shard map, as the API's message."""
        return self._call(self.stubs.admin.GetShardMap, admin_pb2.GetShardMapRequest())

    def set_tenant_limits(self, limits: TenantLimits, tenant_id: str = "") -> TenantLimits:
        """Admin: replace a tenant's limits (every field; 0 takes the server default); returns
        them as now enforced. ``tenant_id`` defaults to the client's."""
        req = self.requests.set_tenant_limits(limits, tenant_id)
        return TenantLimits.from_proto(self._call(self.stubs.admin.SetTenantLimits, req))

    def tenant_limits(self, tenant_id: str = "", stored_only: bool = False) -> TenantLimits:
        """Admin: a tenant's limits as stored, server defaults applied; ``stored_only``: what
        the tenant's row sets alone (0: the default applies), the base of a change made with
        :meth:`set_tenant_limits`, which would otherwise store today's defaults for good."""
        req = self.requests.tenant_limits(tenant_id, stored_only)
        return TenantLimits.from_proto(self._call(self.stubs.admin.GetTenantLimits, req))

    def pause(self, tenant_id: str = "", queue: str = "") -> None:
        """Admin: stop claims of a tenant, of a queue for every tenant, or of a tenant's queue."""
        self._call(self.stubs.admin.Pause, admin_pb2.PauseRequest(tenant_id=tenant_id, queue=queue))

    def resume(self, tenant_id: str = "", queue: str = "") -> None:
        """Admin: undo a :meth:`pause` of the same target; waiting workers wake at once."""
        req = admin_pb2.ResumeRequest(tenant_id=tenant_id, queue=queue)
        self._call(self.stubs.admin.Resume, req)


class AsyncClient(ClientBase):
    """An asyncio client of the shardq API; see :class:`Client`.

    ::

        async with AsyncClient("127.0.0.1:50051", token="sq_...") as c:
            sub = await c.submit("email.send", {"to": "a@example.com"})
            async for job in c.watch(sub.job_id):
                print(job.state.name, job.progress)
    """

    def __init__(self, target: str, token: str, **options: Any) -> None:
        super().__init__(token, **options)
        self.channel: grpc.aio.Channel = (
            grpc.aio.secure_channel(target, self.credentials, self.channel_options)
            if self.credentials
            else grpc.aio.insecure_channel(target, self.channel_options)
        )
        self.stubs = stubs_on(self.channel)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self.channel.close()

    async def _call(self, method: Callable[..., Awaitable[Resp]], request: Any) -> Resp:
        tries = self.attempts()
        while True:
            try:
                return await method(request, metadata=self.metadata, timeout=self.timeout_s)
            except grpc.aio.AioRpcError as exc:
                await asyncio.sleep(tries.pause_after(exc))

    # -- jobs -------------------------------------------------------------------------------

    async def submit(
        self, handler: str, payload: Any = None, **options: Unpack[JobOptions]
    ) -> Submitted:
        req = self.requests.submit(handler, payload, options)
        return Submitted.from_proto(await self._call(self.stubs.jobs.SubmitJob, req))

    async def submit_many(self, jobs: Iterable[BatchItem]) -> list[SubmitItem]:
        resp = await self._call(self.stubs.jobs.SubmitJobs, self.requests.submit_many(jobs))
        return [SubmitItem.from_proto(item) for item in resp.items]

    async def get(self, job_id: str) -> Job:
        return Job.from_proto(await self._call(self.stubs.jobs.GetJob, self.requests.get(job_id)))

    async def cancel(self, job_id: str) -> Job:
        resp = await self._call(self.stubs.jobs.CancelJob, self.requests.cancel(job_id))
        return Job.from_proto(resp.job)

    # ASYNC109: `timeout` here is the watch's own deadline, the blocking client's argument
    # (an asyncio.timeout() around it would also cut a retry's pause short, without saying).
    async def watch(
        self,
        job_id: str,
        *,
        timeout: timedelta | float | None = None,  # noqa: ASYNC109
    ) -> AsyncIterator[Job]:
        watching = Watching(self, job_id, timeout)
        while True:
            call = self.stubs.jobs.WatchJob(
                watching.request, metadata=self.metadata, timeout=watching.timeout()
            )
            try:
                async for msg in call:
                    yield (job := watching.seen(msg))
                    if job.done:
                        return
                return
            except grpc.aio.AioRpcError as exc:
                await asyncio.sleep(watching.pause_after(exc))
            finally:
                call.cancel()

    async def wait(
        self,
        job_id: str,
        *,
        timeout: timedelta | float | None = None,  # noqa: ASYNC109
    ) -> Job:
        last = None
        async for last in self.watch(job_id, timeout=timeout):  # noqa: B007
            pass
        return last if last is not None and last.done else await self.get(job_id)

    async def list_jobs(
        self, state: JobState, page_size: int = 0, page_token: str = ""
    ) -> Page[Job]:
        req = self.requests.list_jobs(state, page_size, page_token)
        resp = await self._call(self.stubs.jobs.ListJobs, req)
        return job_page(resp.jobs, resp.next_page_token)

    async def list_dead(self, page_size: int = 0, page_token: str = "") -> Page[Job]:
        req = self.requests.list_dead(page_size, page_token)
        resp = await self._call(self.stubs.jobs.ListDeadJobs, req)
        return job_page(resp.jobs, resp.next_page_token)

    async def requeue_dead(
        self, job_ids: Sequence[str] = (), *, all: bool = False
    ) -> RequeueResult:
        req = self.requests.requeue_dead(job_ids, all)
        resp = await self._call(self.stubs.jobs.RequeueDeadJobs, req)
        return RequeueResult(resp.requeued_count, tuple(resp.not_found_job_ids))

    # -- schedules --------------------------------------------------------------------------

    async def schedule(
        self,
        schedule_id: str,
        cron: str,
        handler: str,
        payload: Any = None,
        **options: Unpack[ScheduleOptions],
    ) -> Schedule:
        req = self.requests.schedule(schedule_id, cron, handler, payload, options)
        resp = await self._call(self.stubs.schedules.CreateSchedule, req)
        return Schedule.from_proto(resp.schedule)

    async def list_schedules(self) -> list[Schedule]:
        found: list[Schedule] = []
        token = ""
        while True:
            req = self.requests.list_schedules(token)
            resp = await self._call(self.stubs.schedules.ListSchedules, req)
            found += map(Schedule.from_proto, resp.schedules)
            if not (token := resp.next_page_token):
                return found

    async def delete_schedule(self, schedule_id: str) -> None:
        req = self.requests.delete_schedule(schedule_id)
        await self._call(self.stubs.schedules.DeleteSchedule, req)

    # -- stats and admin --------------------------------------------------------------------

    async def tenant_stats(self) -> TenantStats:
        req = self.requests.tenant_stats()
        return TenantStats.from_proto(await self._call(self.stubs.tenants.GetTenantStats, req))

    async def list_tenant_stats(
        self, shard_id: int | None = None, page_size: int = 0, page_token: str = ""
    ) -> Page[TenantStats]:
        req = self.requests.list_tenant_stats(shard_id, page_size, page_token)
        resp = await self._call(self.stubs.admin.ListTenantStats, req)
        return Page(tuple(map(TenantStats.from_proto, resp.tenants)), resp.next_page_token)

    async def shard_map(self) -> admin_pb2.ShardMap:
        return await self._call(self.stubs.admin.GetShardMap, admin_pb2.GetShardMapRequest())

    async def set_tenant_limits(self, limits: TenantLimits, tenant_id: str = "") -> TenantLimits:
        req = self.requests.set_tenant_limits(limits, tenant_id)
        return TenantLimits.from_proto(await self._call(self.stubs.admin.SetTenantLimits, req))

    async def tenant_limits(self, tenant_id: str = "", stored_only: bool = False) -> TenantLimits:
        req = self.requests.tenant_limits(tenant_id, stored_only)
        return TenantLimits.from_proto(await self._call(self.stubs.admin.GetTenantLimits, req))

    async def pause(self, tenant_id: str = "", queue: str = "") -> None:
        await self._call(
            self.stubs.admin.Pause, admin_pb2.PauseRequest(tenant_id=tenant_id, queue=queue)
        )

    async def resume(self, tenant_id: str = "", queue: str = "") -> None:
        req = admin_pb2.ResumeRequest(tenant_id=tenant_id, queue=queue)
        await self._call(self.stubs.admin.Resume, req)
