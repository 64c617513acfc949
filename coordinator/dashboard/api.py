"""The API calls the dashboard makes, each with the logged-in user's token.

One channel for the whole process (made by ``shardq.client.AsyncClient``, with its channel
options and TLS), and the generated stubs on it called with per-call metadata: the client's
methods hold one token per client, and a dashboard serves many users, each with their own.
"""

from __future__ import annotations

from typing import Any

from shardq.client import AsyncClient
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

#: Per-call deadline: a page waits no longer for the coordinator than this (seconds).
TIMEOUT_S = 10.0


class Api:
    def __init__(
        self,
        target: str,
        *,
        tls: bool = False,
        root_certificates: bytes | None = None,
        client_cert: tuple[bytes, bytes] | None = None,
    ):
        # The client's token is never used: every call passes the session's own. The client
        # certificate (key, chain) is the dashboard's own, for a coordinator that requires
        # one (mTLS); it identifies the process, the token still the user.
        self._client = AsyncClient(
            target, "", tls=tls, root_certificates=root_certificates, client_cert=client_cert
        )
        channel = self._client.channel
        self.jobs = jobs_pb2_grpc.JobServiceStub(channel)
        self.admin = admin_pb2_grpc.AdminServiceStub(channel)
        self.schedules = schedules_pb2_grpc.ScheduleServiceStub(channel)
        self.tenants = tenants_pb2_grpc.TenantServiceStub(channel)

    async def close(self) -> None:
        await self._client.close()

    @staticmethod
    async def _call(method: Any, request: Any, md: Any) -> Any:
        return await method(request, metadata=md, timeout=TIMEOUT_S)

    # -- who is this token ------------------------------------------------------------------

    async def shard_map(self, md: Any) -> admin_pb2.ShardMap:
        return await self._call(self.admin.GetShardMap, admin_pb2.GetShardMapRequest(), md)  # type: ignore[no-any-return]

    async def tenant_stats(self, md: Any, tenant: str) -> common_pb2.TenantStats:
        req = tenants_pb2.GetTenantStatsRequest(tenant_id=tenant)
        return await self._call(self.tenants.GetTenantStats, req, md)  # type: ignore[no-any-return]

    # -- admin ------------------------------------------------------------------------------

    async def shard_status(self, md: Any) -> admin_pb2.ListShardStatusResponse:
        req = admin_pb2.ListShardStatusRequest()
        return await self._call(self.admin.ListShardStatus, req, md)  # type: ignore[no-any-return]

    async def tenant_stats_page(
        self, md: Any, page_size: int, page_token: str
    ) -> admin_pb2.ListTenantStatsResponse:
        req = admin_pb2.ListTenantStatsRequest(page_size=page_size, page_token=page_token)
        return await self._call(self.admin.ListTenantStats, req, md)  # type: ignore[no-any-return]

    async def pause(self, md: Any, tenant: str, queue: str, *, resume: bool) -> None:
        if resume:
            await self._call(
                self.admin.Resume, admin_pb2.ResumeRequest(tenant_id=tenant, queue=queue), md
            )
        else:
            await self._call(
                self.admin.Pause, admin_pb2.PauseRequest(tenant_id=tenant, queue=queue), md
            )

    async def get_limits(
        self, md: Any, tenant: str, stored_only: bool = False
    ) -> common_pb2.TenantLimits:
        req = admin_pb2.GetTenantLimitsRequest(tenant_id=tenant, stored_only=stored_only)
        return await self._call(self.admin.GetTenantLimits, req, md)  # type: ignore[no-any-return]

    async def set_limits(
        self, md: Any, tenant: str, limits: common_pb2.TenantLimits
    ) -> common_pb2.TenantLimits:
        req = admin_pb2.SetTenantLimitsRequest(tenant_id=tenant, limits=limits)
        return await self._call(self.admin.SetTenantLimits, req, md)  # type: ignore[no-any-return]

    # -- jobs -------------------------------------------------------------------------------

    async def get_job(
        self, md: Any, tenant: str, job_id: str = "", request_id: str = ""
    ) -> common_pb2.Job:
        req = jobs_pb2.GetJobRequest(tenant_id=tenant, job_id=job_id, request_id=request_id)
        return await self._call(self.jobs.GetJob, req, md)  # type: ignore[no-any-return]

    def watch(self, md: Any, tenant: str, job_id: str) -> Any:
        """The WatchJob stream (no deadline: it lasts as long as the page is open)."""
        req = jobs_pb2.WatchJobRequest(tenant_id=tenant, job_id=job_id)
        return self.jobs.WatchJob(req, metadata=md)

    async def list_jobs(
        self, md: Any, tenant: str, state: int, page_size: int, page_token: str
    ) -> jobs_pb2.ListJobsResponse:
        req = jobs_pb2.ListJobsRequest(
            tenant_id=tenant,
            state=state,  # type: ignore[arg-type]
            page_size=page_size,
            page_token=page_token,
        )
        return await self._call(self.jobs.ListJobs, req, md)  # type: ignore[no-any-return]

    async def list_dead(
        self, md: Any, tenant: str, page_size: int, page_token: str
    ) -> jobs_pb2.ListDeadJobsResponse:
        req = jobs_pb2.ListDeadJobsRequest(
            tenant_id=tenant, page_size=page_size, page_token=page_token
        )
        return await self._call(self.jobs.ListDeadJobs, req, md)  # type: ignore[no-any-return]

    async def requeue(
        self, md: Any, tenant: str, job_ids: list[str], *, all: bool
    ) -> jobs_pb2.RequeueDeadJobsResponse:
        req = jobs_pb2.RequeueDeadJobsRequest(tenant_id=tenant, job_ids=job_ids, all=all)
        return await self._call(self.jobs.RequeueDeadJobs, req, md)  # type: ignore[no-any-return]

    async def cancel(self, md: Any, tenant: str, job_id: str) -> common_pb2.Job:
        req = jobs_pb2.CancelJobRequest(tenant_id=tenant, job_id=job_id)
        return (await self._call(self.jobs.CancelJob, req, md)).job  # type: ignore[no-any-return]

    # -- schedules --------------------------------------------------------------------------

    async def list_schedules(
        self, md: Any, tenant: str, page_size: int, page_token: str
    ) -> schedules_pb2.ListSchedulesResponse:
        req = schedules_pb2.ListSchedulesRequest(
            tenant_id=tenant, page_size=page_size, page_token=page_token
        )
        return await self._call(self.schedules.ListSchedules, req, md)  # type: ignore[no-any-return]

    async def delete_schedule(self, md: Any, tenant: str, schedule_id: str) -> None:
        req = schedules_pb2.DeleteScheduleRequest(tenant_id=tenant, schedule_id=schedule_id)
        await self._call(self.schedules.DeleteSchedule, req, md)
