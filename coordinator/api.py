"""The shardq.v1 services: transport only. Each RPC authenticates (through ``Coordinator``),
validates and parses the request, calls the tenant router (``coordinator.router``) for anything
that touches a shard, converts the answer to protobuf (``coordinator.convert``), and turns any
error into a status code in ``coordinator.errors``."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc
from google.protobuf import message_factory
from google.protobuf.message import DecodeError, Message

from shardq.common import tracing, validation
from shardq.common.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    ShardqError,
)
from shardq.common.ids import new_job_id
from shardq.coordinator import convert, limits, shardstatus
from shardq.coordinator.app import Coordinator
from shardq.coordinator.assignment import assign
from shardq.coordinator.errors import Ctx, abort, item_code, shorten, translate
from shardq.coordinator.metrics import CODE_NAMES, code_name
from shardq.coordinator.router import PlacedJob, Submitted, TenantStatus, page_offset
from shardq.shard.client import Row, Turn, raise_for_enqueue
from shardq.shard.codes import ItemCode
from shardq.shard.models import NewJob, TenantLimits, TenantLoad
from shardq.shard.records import EnqueueResult, JobState
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
    workers_pb2,
    workers_pb2_grpc,
)

#: Most bytes of jobs or schedules in one page of a listing: under the 4 MiB a gRPC client
#: accepts by default (a page of 100 jobs of 1 MiB payloads would be refused by the client).
#: A listing sends fewer items than page_size rather than go over it.
MAX_PAGE_BYTES = 3 * 1024 * 1024

#: Bytes a SubmitJob or CreateSchedule request may carry besides its payload (the spec's
#: other fields: IDs, handler, queue, headers, trace context).
REQUEST_OVERHEAD_BYTES = 64 * 1024
#: Most bytes any other request may have: they carry IDs, names and a page token (the largest,
#: a worker's WatchAssignment with its handler names, or 1,000 IDs to requeue, is far less).
#: Bigger requests are refused before they are parsed.
SMALL_REQUEST_BYTES = 256 * 1024
#: Methods that carry jobs' payloads, bounded by the server's receive limit alone (a payload
#: over --max-payload-bytes is then refused INVALID_ARGUMENT, naming its field).
PAYLOAD_METHODS = frozenset({"SubmitJob", "SubmitJobs", "CreateSchedule"})
#: Fewest jobs in a piece of a SubmitJobs call sent in pieces (``JobService._submit_alone``):
#: each piece costs a script call and a round trip, and pieces of 20-50 jobs were measured,
#: not smaller ones (``bench/coordinator_processes.py --batch 100``).
MIN_PIECE_JOBS = 16

Req = TypeVar("Req")
Resp = TypeVar("Resp")


class Malformed:
    """What a request that does not parse as its message type is handed to the servicer as
    (by :func:`add_services`), so the call ends INVALID_ARGUMENT. gRPC itself would answer
    UNKNOWN for a deserializer's exception: bytes that are not protobuf, or a string field
    that is not UTF-8 (which clients in other languages can send)."""

    def __init__(self, type_name: str, error: str) -> None:
        self.type_name = type_name
        self.error = error

    def check(self) -> None:
        raise InvalidArgument(f"the request is not a valid {self.type_name}: {self.error}")


class Oversized(Malformed):
    """A request larger than its method takes: refused before it is parsed."""

    def check(self) -> None:
        # RESOURCE_EXHAUSTED as gRPC's own receive limit answers, with no retry delay: the
        # same request will never fit.
        raise ResourceExhausted(self.error, retry_after_ms=None)


def _parse_or_malformed(message_type: type[Message], max_bytes: int) -> Callable[[bytes], Any]:
    name = message_type.DESCRIPTOR.full_name

    def deserialize(raw: bytes) -> Any:
        if len(raw) > max_bytes:
            return Oversized(name, f"the request is {len(raw)} bytes, over the {max_bytes} a "
                                   f"{name} may have")  # fmt: skip
        try:
            return message_type.FromString(raw)
        except DecodeError as exc:
            return Malformed(name, str(exc))

    return deserialize


def add_services(server: grpc.aio.Server, coord: Coordinator) -> None:
    """Register the five shardq.v1 services, like the generated ``add_*_to_server`` functions
    but with request parsing that cannot end a call as UNKNOWN (see :class:`Malformed`)."""
    servicers: list[Any] = [
        JobService(coord),
        ScheduleService(coord),
        TenantService(coord),
        AdminService(coord),
        WorkerService(coord),
    ]
    modules = (jobs_pb2, schedules_pb2, tenants_pb2, admin_pb2, workers_pb2)
    settings = coord.settings
    for servicer, module in zip(servicers, modules, strict=True):
        service = module.DESCRIPTOR.services_by_name[type(servicer).__name__]
        handlers = {}
        for method in service.methods:
            make = (
                grpc.unary_stream_rpc_method_handler
                if method.server_streaming
                else grpc.unary_unary_rpc_method_handler
            )
            handlers[method.name] = make(
                getattr(servicer, method.name),
                request_deserializer=_parse_or_malformed(
                    message_factory.GetMessageClass(method.input_type),
                    settings.max_request_bytes
                    if method.name in PAYLOAD_METHODS
                    else SMALL_REQUEST_BYTES,
                ),
                response_serializer=_serialize,
            )
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(service.full_name, handlers),)
        )
        server.add_registered_method_handlers(service.full_name, handlers)


def _serialize(message: Message) -> bytes:
    return message.SerializeToString()


def unary(
    fn: Callable[[Any, Req, Ctx], Awaitable[Resp]],
) -> Callable[[Any, Req, Ctx], Awaitable[Resp]]:
    """Every error of a unary RPC leaves as a status code, never as a traceback."""

    @functools.wraps(fn)
    async def wrapper(self: Any, request: Req, context: Ctx) -> Resp:
        try:
            if isinstance(request, Malformed):
                request.check()
            return await fn(self, request, context)
        except (asyncio.CancelledError, grpc.aio.AbortError):
            raise
        except Exception as exc:
            await abort(context, exc)

    return wrapper


def streaming(
    fn: Callable[[Any, Req, Ctx], AsyncIterator[Resp]],
) -> Callable[[Any, Req, Ctx], AsyncIterator[Resp]]:
    @functools.wraps(fn)
    async def wrapper(self: Any, request: Req, context: Ctx) -> AsyncIterator[Resp]:
        try:
            if isinstance(request, Malformed):
                request.check()
            async for item in fn(self, request, context):
                yield item
        except (asyncio.CancelledError, grpc.aio.AbortError):
            raise
        except Exception as exc:
            await abort(context, exc)

    return wrapper


class JobService(jobs_pb2_grpc.JobServiceServicer):
    def __init__(self, coord: Coordinator) -> None:
        self.c = coord
        self.router = coord.router

    def _new_job(
        self, tenant: str, spec: common_pb2.JobSpec, defaults: TenantLimits, max_payload: int
    ) -> NewJob | ShardqError:
        """The spec as a job for the router, or why it is not a valid one (``defaults``: the
        tenant's admission defaults, ``Coordinator.limits_for``)."""
        request_id = spec.request_id or f"gen-{new_job_id()}"
        try:
            job = convert.new_job(tenant, spec, request_id, defaults, max_payload)
        except ShardqError as exc:
            return exc
        if self.c.settings.reject_unknown_handlers:
            return self._known_handler(job)
        return job

    def _known_handler(self, job: NewJob) -> NewJob | ShardqError:
        """``job`` if a live worker serving its queue has its handler (as the registry last
        read), else why not (a malformed name is INVALID_ARGUMENT, as without the check)."""
        try:
            validation.handler(job.handler, "job.handler")
        except InvalidArgument as exc:
            return exc
        if not self.c.registry.serves(job.queue, job.handler):
            return FailedPrecondition(
                f"no live worker serving queue {job.queue!r} has a handler {job.handler!r}",
                field="job.handler",
            )
        return job

    async def _submit_alone(self, tenant: str, specs: list[common_pb2.JobSpec]) -> _Answer:
        """A SubmitJobs call's answer, its jobs sent to the shard in pieces where it is the
        only one in flight on this process (the gate counts them).

        One call at a time, each hop waits for the one before: the coordinator checks and
        prepares every job, then Redis runs the script, then the coordinator builds the
        answer, while the other sits idle. In pieces, each a task of its own, the coordinator
        prepares the next pieces and reads the replies of the last while Redis runs one. The
        pieces go one after another on one connection (``shard.client.Row``), so Redis runs
        them in the call's order, back to back. Each piece costs Redis a script call and the
        coordinator a round trip more, a few µs per job: with other SubmitJobs calls in
        flight, their work already fills those gaps and a call is sent whole. Every job still
        gets its own answer; a call that fails as a whole may have made the jobs of a piece
        before it, which a retry with the same request_ids finds (DEDUPLICATED), as where
        one reply is lost. The answer's items of a piece are made once it is answered, while
        Redis runs the pieces after it.
        """
        answer = _Answer()
        pieces = min(self.c.settings.submit_pieces, len(specs) // MIN_PIECE_JOBS)
        if pieces <= 1 or self.c.gate.batch_calls > 1:
            answer.add(await self._submit(tenant, specs, coalesce=False))
            return answer
        size = -(-len(specs) // pieces)
        starts = range(0, len(specs), size)
        row = Row(len(starts))
        tasks = [
            asyncio.ensure_future(self._submit(tenant, specs[i : i + size], False, turn))
            for i, turn in zip(starts, row.turns(), strict=True)
        ]
        try:
            for start, task in zip(starts, tasks, strict=True):  # in the call's order
                answer.add(await task, start)
        except BaseException:
            for task in tasks:  # the pieces not yet sent or answered: the call has failed
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)  # done with the connection
            raise
        finally:
            await row.close()
        return answer

    async def _submit(
        self,
        tenant: str,
        specs: list[common_pb2.JobSpec],
        coalesce: bool,
        turn: Turn | None = None,
    ) -> list[Submitted | ShardqError]:
        """Per spec, what it became or its error, fields named as the request spells them."""
        defaults, max_payload = self.c.limits_for(tenant), self.c.settings.shard.max_payload_bytes
        jobs = [self._new_job(tenant, spec, defaults, max_payload) for spec in specs]
        outcomes = await self.router.submit(tenant, jobs, coalesce=coalesce, turn=turn)
        return [_wire_error(o) if isinstance(o, ShardqError) else o for o in outcomes]

    async def _job_pb(self, placed: PlacedJob) -> common_pb2.Job:
        rec, result = placed.record, None
        if rec.state is JobState.SUCCEEDED:
            result = await self.c.result_of(rec.tenant, rec.request_id)
        return convert.job_to_pb(rec, placed.shard_id, result)

    async def _page(
        self, tenant: str, state: JobState, page_size: int, page_token: str
    ) -> tuple[list[common_pb2.Job], str]:
        """One page of jobs that fits in MAX_PAGE_BYTES (see ``TenantRouter.list_jobs``)."""
        return await self.router.list_jobs(
            tenant,
            state,
            convert.page_size(page_size),
            page_token,
            convert.job_to_pb,
            _byte_size,
            MAX_PAGE_BYTES,
        )

    @unary
    async def SubmitJob(
        self, request: jobs_pb2.SubmitJobRequest, context: Ctx
    ) -> jobs_pb2.SubmitJobResponse:
        tenant = await self.c.tenant_of(context, request.tenant_id)
        try:
            response = await self._submit_job(tenant, request)
        except Exception as exc:
            self.c.submit_metrics.count(tenant, 0, 0, {code_name(exc): 1})
            raise
        self.c.submit_metrics.one(tenant, response.deduplicated)
        return response

    async def _submit_job(
        self, tenant: str, request: jobs_pb2.SubmitJobRequest
    ) -> jobs_pb2.SubmitJobResponse:
        if not request.HasField("job"):
            raise InvalidArgument("required", field="job")
        # A child of the submitter's span when tracing is on and the job carries one.
        parent = tracing.parent(request.job.trace_context)
        with tracing.span("shardq SubmitJob", parent, "server", {"shardq.tenant": tenant}):
            (outcome,) = await self._submit(tenant, [request.job], coalesce=True)
        if isinstance(outcome, ShardqError):
            raise outcome
        raise_for_enqueue(outcome.result)
        if outcome.result.code is ItemCode.OK:  # made now: built from what was sent
            response = jobs_pb2.SubmitJobResponse()
            convert.new_job_into(response.job, outcome.job, outcome.result, outcome.shard_id)
            return response
        # Deduplicated: the first job, read where it is.
        placed = await self.router.find_job(tenant, outcome.result.job_id)
        return jobs_pb2.SubmitJobResponse(
            job=convert.job_to_pb(placed.record, placed.shard_id),
            deduplicated=outcome.result.deduplicated,
        )

    @unary
    async def SubmitJobs(
        self, request: jobs_pb2.SubmitJobsRequest, context: Ctx
    ) -> jobs_pb2.SubmitJobsResponse:
        tenant = await self.c.tenant_of(context, request.tenant_id)
        limit = self.c.settings.max_batch_jobs
        if len(request.jobs) > limit:
            self.c.submit_metrics.count(tenant, 0, 0, {"INVALID_ARGUMENT": len(request.jobs)})
            raise InvalidArgument(
                f"{len(request.jobs)} jobs is over the {limit} limit", field="jobs"
            )
        try:
            answer = await self._submit_alone(tenant, list(request.jobs))
        except Exception as exc:
            self.c.submit_metrics.count(tenant, 0, 0, {code_name(exc): len(request.jobs)})
            raise
        self.c.submit_metrics.count(tenant, answer.new, answer.deduplicated, answer.refused)
        return answer.response

    @unary
    async def GetJob(self, request: jobs_pb2.GetJobRequest, context: Ctx) -> common_pb2.Job:
        tenant = await self.c.tenant_of(context, request.tenant_id)
        if request.request_id:
            if request.job_id:
                raise InvalidArgument("give job_id or request_id, not both", field="request_id")
            validation.request_id(request.request_id)
            placed = await self.router.find_job_by_request_id(tenant, request.request_id)
            return await self._job_pb(placed)
        return await self._job_pb(await self.router.find_job(tenant, _job_id(request.job_id)))

    @unary
    async def CancelJob(
        self, request: jobs_pb2.CancelJobRequest, context: Ctx
    ) -> jobs_pb2.CancelJobResponse:
        tenant = await self.c.tenant_of(context, request.tenant_id)
        placed = await self.router.cancel(tenant, _job_id(request.job_id))
        return jobs_pb2.CancelJobResponse(job=convert.job_to_pb(placed.record, placed.shard_id))

    @unary
    async def ListJobs(
        self, request: jobs_pb2.ListJobsRequest, context: Ctx
    ) -> jobs_pb2.ListJobsResponse:
        tenant = await self.c.tenant_of(context, request.tenant_id)
        state = convert.PB_TO_STATE.get(request.state)
        if state is None:
            raise InvalidArgument("a job state is required", field="state")
        if state in (JobState.SUCCEEDED, JobState.CANCELLED):
            raise InvalidArgument(
                f"{state} jobs are not listed by state; use GetJob", field="state"
            )
        jobs, token = await self._page(tenant, state, request.page_size, request.page_token)
        return jobs_pb2.ListJobsResponse(jobs=jobs, next_page_token=token)

    @streaming
    async def WatchJob(
        self, request: jobs_pb2.WatchJobRequest, context: Ctx
    ) -> AsyncIterator[common_pb2.Job]:
        tenant = await self.c.tenant_of(context, request.tenant_id)
        job_id = _job_id(request.job_id)
        last: common_pb2.Job | None = None
        delay = 0.02
        while True:
            try:
                placed = await self.router.find_job(tenant, job_id)
            except NotFound:
                if last is None:
                    raise
                return  # expired after its retention period: nothing more will change
            job = await self._job_pb(placed)
            if last is None or _changed(last, job):
                yield job
                last = job
                delay = 0.02
            if job.state in convert.TERMINAL_PB:
                return
            await asyncio.sleep(delay)
            delay = min(delay * 1.5, 0.5)

    @unary
    async def ListDeadJobs(
        self, request: jobs_pb2.ListDeadJobsRequest, context: Ctx
    ) -> jobs_pb2.ListDeadJobsResponse:
        tenant = await self.c.tenant_of(context, request.tenant_id)
        jobs, token = await self._page(tenant, JobState.DEAD, request.page_size, request.page_token)
        return jobs_pb2.ListDeadJobsResponse(jobs=jobs, next_page_token=token)

    @unary
    async def RequeueDeadJobs(
        self, request: jobs_pb2.RequeueDeadJobsRequest, context: Ctx
    ) -> jobs_pb2.RequeueDeadJobsResponse:
        tenant = await self.c.tenant_of(context, request.tenant_id)
        if bool(request.job_ids) == request.all:
            raise InvalidArgument("give job_ids or all, not both or neither", field="job_ids")
        limit = self.c.settings.max_batch_jobs
        if len(request.job_ids) > limit:
            raise InvalidArgument(f"more than {limit} IDs", field="job_ids")
        for jid in request.job_ids:
            _job_id(jid, "job_ids")
        total, missing = await self.router.requeue_dead(
            tenant, list(request.job_ids), every=request.all
        )
        return jobs_pb2.RequeueDeadJobsResponse(requeued_count=total, not_found_job_ids=missing)


class ScheduleService(schedules_pb2_grpc.ScheduleServiceServicer):
    def __init__(self, coord: Coordinator) -> None:
        self.c = coord
        self.router = coord.router

    @unary
    async def CreateSchedule(
        self, request: schedules_pb2.CreateScheduleRequest, context: Ctx
    ) -> schedules_pb2.CreateScheduleResponse:
        tenant = await self.c.tenant_of(context, request.tenant_id)
        if not request.HasField("schedule"):
            raise InvalidArgument("required", field="schedule")
        spec = convert.schedule_spec(request.schedule, self.c.settings.shard.max_payload_bytes)
        created = await _prefixed_async(
            self.router.create_schedule(tenant, spec, self.c.settings.max_schedules_per_tenant),
            "schedule.",
        )
        return schedules_pb2.CreateScheduleResponse(schedule=convert.schedule_to_pb(created))

    @unary
    async def ListSchedules(
        self, request: schedules_pb2.ListSchedulesRequest, context: Ctx
    ) -> schedules_pb2.ListSchedulesResponse:
        tenant = await self.c.tenant_of(context, request.tenant_id)
        size = convert.page_size(request.page_size)
        offset = page_offset(request.page_token)
        schedules = await self.router.list_schedules(tenant)
        page = _fit([convert.schedule_to_pb(s) for s in schedules[offset : offset + size]])
        end = offset + len(page)
        return schedules_pb2.ListSchedulesResponse(
            schedules=page, next_page_token=str(end) if end < len(schedules) else ""
        )

    @unary
    async def DeleteSchedule(
        self, request: schedules_pb2.DeleteScheduleRequest, context: Ctx
    ) -> schedules_pb2.DeleteScheduleResponse:
        tenant = await self.c.tenant_of(context, request.tenant_id)
        await self.router.delete_schedule(tenant, request.schedule_id)
        return schedules_pb2.DeleteScheduleResponse()


class TenantService(tenants_pb2_grpc.TenantServiceServicer):
    def __init__(self, coord: Coordinator) -> None:
        self.c = coord

    @unary
    async def GetTenantStats(
        self, request: tenants_pb2.GetTenantStatsRequest, context: Ctx
    ) -> common_pb2.TenantStats:
        tenant = await self.c.tenant_of(context, request.tenant_id)
        router = self.c.router
        (shard_id, load), status = await asyncio.gather(
            router.tenant_load(tenant), router.tenant_status(tenant)
        )
        return _stats_pb(self.c, tenant, shard_id, load, status)


class AdminService(admin_pb2_grpc.AdminServiceServicer):
    def __init__(self, coord: Coordinator) -> None:
        self.c = coord

    @unary
    async def GetShardMap(
        self, request: admin_pb2.GetShardMapRequest, context: Ctx
    ) -> admin_pb2.ShardMap:
        await self.c.require_role(context, "admin")
        m = self.c.shard_map
        return admin_pb2.ShardMap(
            version=m.version,
            shards=[
                admin_pb2.Shard(
                    shard_id=s.shard_id,
                    address=s.address,
                    weight=s.weight,
                    state=admin_pb2.SHARD_STATE_DRAINING
                    if s.state == "draining"
                    else admin_pb2.SHARD_STATE_ACTIVE,
                )
                for s in sorted(m.shards.values(), key=lambda s: s.shard_id)
            ],
            slot_ranges=[
                admin_pb2.SlotRange(start_slot=a, end_slot=b, shard_id=s)
                for a, b, s in m.slot_ranges()
            ],
            pins=[admin_pb2.TenantPin(tenant_id=t, shard_id=s) for t, s in sorted(m.pins.items())],
            moves_in_progress=[
                admin_pb2.TenantMove(
                    tenant_id=mv.tenant_id,
                    from_shard_id=mv.from_shard_id,
                    to_shard_id=mv.to_shard_id,
                    started_at_unix_ms=mv.started_at_ms,
                )
                for mv in m.moves.values()
            ],
            slot_count=len(m.slots),
        )

    @unary
    async def ListTenantStats(
        self, request: admin_pb2.ListTenantStatsRequest, context: Ctx
    ) -> admin_pb2.ListTenantStatsResponse:
        await self.c.require_role(context, "admin")
        page, token = await self.c.router.tenant_loads(
            request.shard_id if request.HasField("shard_id") else None,
            convert.page_size(request.page_size),
            request.page_token,
        )
        return admin_pb2.ListTenantStatsResponse(
            tenants=[
                _stats_pb(self.c, load.tenant, sid, load, status) for sid, load, status in page
            ],
            next_page_token=token,
        )

    @unary
    async def SetTenantLimits(
        self, request: admin_pb2.SetTenantLimitsRequest, context: Ctx
    ) -> common_pb2.TenantLimits:
        await self.c.require_role(context, "admin")
        tenant = validation.tenant_id(request.tenant_id)
        wanted = limits.check(convert.limits_from_pb(request.limits))
        await self.c.limits.put(tenant, wanted)  # the source of truth first: a retry repairs
        self.c.forget_stream_cap(tenant)
        await self.c.router.set_limits(tenant, wanted)
        return convert.limits_to_pb(self.c.with_defaults(tenant, wanted))

    @unary
    async def GetTenantLimits(
        self, request: admin_pb2.GetTenantLimitsRequest, context: Ctx
    ) -> common_pb2.TenantLimits:
        await self.c.require_role(context, "admin")
        tenant = validation.tenant_id(request.tenant_id)
        stored = await self.c.stored_limits(tenant)
        if request.stored_only:
            return convert.limits_to_pb(stored)
        return convert.limits_to_pb(self.c.with_defaults(tenant, stored))

    @unary
    async def ListShardStatus(
        self, request: admin_pb2.ListShardStatusRequest, context: Ctx
    ) -> admin_pb2.ListShardStatusResponse:
        await self.c.require_role(context, "admin")
        shards, moves = await shardstatus.collect(self.c.shard_map, self.c.router.pool)
        return admin_pb2.ListShardStatusResponse(
            shards=[shardstatus.shard_pb(s) for s in shards],
            moves=[shardstatus.move_pb(m) for m in moves],
        )

    @unary
    async def Pause(self, request: admin_pb2.PauseRequest, context: Ctx) -> admin_pb2.PauseResponse:
        await self.c.require_role(context, "admin")
        await self.c.router.pause(*_pause_target(request))
        return admin_pb2.PauseResponse()

    @unary
    async def Resume(
        self, request: admin_pb2.ResumeRequest, context: Ctx
    ) -> admin_pb2.ResumeResponse:
        await self.c.require_role(context, "admin")
        await self.c.router.pause(*_pause_target(request), resume=True)
        return admin_pb2.ResumeResponse()


class WorkerService(workers_pb2_grpc.WorkerServiceServicer):
    """Shard assignment for workers; an open stream is the worker's sign of life.

    Shards are dealt per queue over every live worker of the cluster that serves the queue
    (``WorkerRegistry``, shared by the replicas through Postgres), so each replica sends its
    workers their share of the same deal, and each shard endpoint names the queues the worker
    claims there.
    """

    def __init__(self, coord: Coordinator) -> None:
        self.c = coord
        self._streams: dict[str, asyncio.Queue[None]] = {}
        coord.follower.on_change(lambda _m: self._nudge())
        coord.registry.on_change(self._nudge)

    def _nudge(self) -> None:
        for q in self._streams.values():
            q.put_nowait(None)

    @streaming
    async def WatchAssignment(
        self, request: workers_pb2.WatchAssignmentRequest, context: Ctx
    ) -> AsyncIterator[workers_pb2.Assignment]:
        await self.c.require_role(context, "admin", "worker")
        worker_id = validation.worker_id(request.worker_id)
        registry = self.c.registry
        info = registry.worker_info(
            request.hostname, request.concurrency, request.queues, request.handlers
        )
        queue: asyncio.Queue[None] = asyncio.Queue()
        previous = self._streams.get(worker_id)
        self._streams[worker_id] = queue
        if previous is not None:
            previous.put_nowait(None)  # a reconnect replaces the old stream
        await registry.join(worker_id, info)
        self._nudge()
        last: tuple[tuple[int, str, tuple[str, ...]], ...] | None = None
        try:
            while self._streams.get(worker_id) is queue:
                m = self.c.shard_map
                live = registry.snapshot()
                mine = tuple(assign(m.shards, live).get(worker_id, {}).items())
                # With the addresses: a shard re-pointed elsewhere is news to its workers.
                sent = tuple((s, m.shards[s].address, queues) for s, queues in mine)
                if sent != last:
                    last = sent
                    yield workers_pb2.Assignment(
                        map_version=m.version,
                        shards=[
                            workers_pb2.ShardEndpoint(
                                shard_id=s, address=m.shards[s].address, queues=queues
                            )
                            for s, queues in mine
                        ],
                        live_workers=len(live),
                    )
                await queue.get()
        finally:
            if self._streams.get(worker_id) is queue:
                del self._streams[worker_id]
                await registry.leave(worker_id)
                self._nudge()


def _stats_pb(
    coord: Coordinator, tenant: str, shard_id: int, load: TenantLoad, status: TenantStatus
) -> common_pb2.TenantStats:
    """A tenant's statistics, with its limits as its shard enforces them (defaults applied)."""
    return convert.tenant_stats_pb(
        tenant,
        shard_id,
        load,
        limits=coord.with_defaults(tenant, status.limits),
        paused=status.paused,
        paused_queues=status.paused_queues,
    )


def _pause_target(
    request: admin_pb2.PauseRequest | admin_pb2.ResumeRequest,
) -> tuple[str | None, str | None]:
    """(tenant or None, queue or None) of a Pause or Resume: at least one, each valid."""
    if not request.tenant_id and not request.queue:
        raise InvalidArgument("give tenant_id, queue, or both", field="tenant_id")
    tenant = validation.tenant_id(request.tenant_id) if request.tenant_id else None
    queue = validation.queue(request.queue) if request.queue else None
    return tenant, queue


def _changed(a: common_pb2.Job, b: common_pb2.Job) -> bool:
    # Progress too: a watcher of a long job sees each report the worker stored.
    return (a.state, a.attempts, a.cancel_requested, a.run_at_unix_ms, a.progress) != (
        b.state, b.attempts, b.cancel_requested, b.run_at_unix_ms, b.progress,
    )  # fmt: skip


def _job_id(value: str, field: str = "job_id") -> str:
    return validation.job_id(value, field)


T = TypeVar("T")


M = TypeVar("M", bound=Message)


def _fit(items: list[M]) -> list[M]:
    """The longest head of ``items`` within MAX_PAGE_BYTES (always at least one item)."""
    total = 0
    for n, item in enumerate(items):
        total += item.ByteSize()
        if total > MAX_PAGE_BYTES and n > 0:
            return items[:n]
    return items


def _byte_size(message: Message) -> int:
    return message.ByteSize()


#: Shard-API argument names that the wire spells differently.
_WIRE_NAMES = {"run_at_ms": "run_at_unix_ms"}


def _wire_error(exc: ShardqError, prefix: str = "job.") -> ShardqError:
    """A job's error with its field named as the request spells it (``job.priority``)."""
    if (
        isinstance(exc, InvalidArgument)
        and exc.field
        and not exc.field.startswith(prefix)
        and "." not in exc.field
    ):
        name = _WIRE_NAMES.get(exc.field, exc.field)
        renamed = InvalidArgument(exc.message, field=prefix + name)
        renamed.__cause__ = exc
        return renamed
    return exc


async def _prefixed_async(aw: Awaitable[T], prefix: str) -> T:
    """Await ``aw``, naming the field of a refusal as the request spells it (``schedule.``)."""
    try:
        return await aw
    except (InvalidArgument, AlreadyExists) as exc:
        if exc.field and "." not in exc.field:
            raise type(exc)(exc.message, field=prefix + exc.field) from exc
        raise


class _Answer:
    """A SubmitJobs call's answer, an item per job in the call's order, added a piece at a
    time (``JobService._submit_alone``), and its jobs counted for the metrics (new,
    deduplicated, refused by code name) as they are added, not in a pass over the whole
    answer after its last piece."""

    __slots__ = ("deduplicated", "new", "refused", "response")

    def __init__(self) -> None:
        self.response = jobs_pb2.SubmitJobsResponse()
        self.new = self.deduplicated = 0
        self.refused: dict[str, int] = {}

    def add(self, outcomes: list[Submitted | ShardqError], first: int = 0) -> None:
        """The items of ``outcomes``, the jobs from index ``first`` on. An accepted job's item
        is written in place (``items.add``): making each item and then copying it into the
        list cost twice as much, once per job of a batch."""
        items = self.response.items
        new = deduplicated = 0
        for index, o in enumerate(outcomes, first):
            if isinstance(o, ShardqError):
                self._refuse(items, _item_error(index, o))
            elif o.result.accepted:
                res = o.result
                items.add(
                    index=index,
                    job_id=res.job_id,
                    request_id=o.job.request_id,
                    deduplicated=res.deduplicated,
                    state=convert.STATE_TO_PB.get(res.state, common_pb2.JOB_STATE_UNSPECIFIED),
                )
                if res.deduplicated:
                    deduplicated += 1
                else:
                    new += 1
            else:
                self._refuse(items, _refused_item(index, o.result))
        self.new += new
        self.deduplicated += deduplicated

    def _refuse(self, items: Any, item: jobs_pb2.SubmitJobsItem) -> None:
        items.append(item)
        code = CODE_NAMES.get(item.error.code, "UNKNOWN")
        self.refused[code] = self.refused.get(code, 0) + 1


def _refused_item(index: int, res: EnqueueResult) -> jobs_pb2.SubmitJobsItem:
    try:
        raise_for_enqueue(res)
    except ShardqError as exc:
        return _item_error(index, exc)
    raise AssertionError(f"unhandled enqueue code {ItemCode(res.code)!r}")


def _item_error(index: int, exc: BaseException) -> jobs_pb2.SubmitJobsItem:
    err = translate(exc)
    return jobs_pb2.SubmitJobsItem(
        index=index,
        error=common_pb2.ItemError(
            code=item_code(err), message=shorten(str(err)), field=err.field or ""
        ),
    )
