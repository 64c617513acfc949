"""What the client sends: jobs as the caller describes them (one keyword style for
``submit``, ``submit_many`` and ``schedule``) turned into the API's request messages.

Pure: :class:`Requests` builds every request message of a tenant's calls, so the blocking and
the asyncio client differ only in how they send them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypedDict, Unpack

from shardq.client.model import JobState, TenantLimits
from shardq.common import ids, tracing
from shardq.common.errors import InvalidArgument
from shardq.v1 import admin_pb2, common_pb2, jobs_pb2, schedules_pb2, tenants_pb2

#: A duration: a timedelta, or seconds.
Duration = timedelta | float


@dataclass(frozen=True, slots=True)
class RetryBackoff:
    """This job's wait before each retry: ``min(max, base * 2**(n-1))`` after attempt n
    failed, ``jitter`` of it drawn at random (0: none, 1: full). A field left None takes the
    handler's policy, else the server default (1 s doubling to 1 h, full jitter)."""

    base: Duration | None = None
    max: Duration | None = None
    jitter: float | None = None

    def to_proto(self) -> common_pb2.RetryBackoff:
        msg = common_pb2.RetryBackoff()
        if self.base is not None:
            msg.base_ms = _ms(self.base, "retry.base")
        if self.max is not None:
            msg.max_ms = _ms(self.max, "retry.max")
        if self.jitter is not None:
            msg.jitter = self.jitter
        return msg


class JobOptions(TypedDict, total=False):
    """The keywords of ``submit`` (and of each item of ``submit_many``)."""

    #: Idempotency key: the same one again returns the first job. A new one is made when
    #: None, before the first try, so the client's own retries never make a second job.
    request_id: str | None
    #: The queue the job waits in (None: ``default``).
    queue: str | None
    #: 0 to 9, 9 the most urgent (None: 0).
    priority: int | None
    #: Run this long after the server accepts it (not with ``run_at``).
    delay: Duration | None
    #: Run at this time (an aware datetime; not with ``delay``).
    run_at: datetime | None
    #: Attempts before the job goes dead (None: the server default).
    max_attempts: int | None
    #: The handler's time limit per attempt (None: the server default).
    timeout: Duration | None
    #: The wait before each retry of this job (None: the handler's or the server's).
    retry: RetryBackoff | None


class ScheduleOptions(TypedDict, total=False):
    """The keywords of ``schedule``: a job's, less those each tick sets itself."""

    timezone: str
    queue: str | None
    priority: int | None
    max_attempts: int | None
    timeout: Duration | None
    retry: RetryBackoff | None


@dataclass(frozen=True, slots=True)
class JobRequest:
    """One job of a ``submit_many`` batch (a dict with these keys does as well)."""

    handler: str
    payload: Any = None
    request_id: str | None = None
    queue: str | None = None
    priority: int | None = None
    delay: Duration | None = None
    run_at: datetime | None = None
    max_attempts: int | None = None
    timeout: Duration | None = None
    retry: RetryBackoff | None = None

    @classmethod
    def of(cls, item: JobRequest | Mapping[str, Any]) -> JobRequest:
        if isinstance(item, JobRequest):
            return item
        try:
            return cls(**item)
        except TypeError as exc:
            raise InvalidArgument(str(exc), field="submit_many") from exc

    def to_spec(self) -> common_pb2.JobSpec:
        return job_spec(
            self.handler,
            self.payload,
            request_id=self.request_id,
            queue=self.queue,
            priority=self.priority,
            delay=self.delay,
            run_at=self.run_at,
            max_attempts=self.max_attempts,
            timeout=self.timeout,
            retry=self.retry,
        )


#: An item of ``submit_many``: a :class:`JobRequest`, a dict of its fields, or a ``JobSpec``
#: as :func:`job_spec` makes it.
BatchItem = JobRequest | Mapping[str, Any] | common_pb2.JobSpec


#: One encoder for every payload: ``json.dumps`` with a keyword argument builds a new
#: ``JSONEncoder`` per call, over a third of its time on a small payload.
_JSON = json.JSONEncoder(separators=(",", ":"))


def encode_payload(payload: Any) -> bytes:
    """bytes pass through (they must be JSON already); anything else is JSON-encoded."""
    if isinstance(payload, bytes | bytearray):
        return bytes(payload)
    return _JSON.encode(payload).encode()


def new_request_id() -> str:
    """A request_id made by the client: 128 random bits as 32 hex digits (the spelling of
    ``uuid4().hex``, in a fraction of its time: the UUID object was most of a ``job_spec``,
    then ``secrets.token_hex``'s system call per ID was 12% of a client sending batches)."""
    return ids.random_hex()


def _ms(value: Duration, name: str) -> int:
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if seconds < 0:
        raise InvalidArgument(f"must be >= 0, not {value!r}", field=name)
    return round(seconds * 1000)


def _unix_ms(when: datetime) -> int:
    if when.tzinfo is None:
        # A naive datetime is the machine's local time to Python, rarely what was meant.
        raise InvalidArgument("give an aware datetime (e.g. tzinfo=UTC)", field="run_at")
    return round(when.astimezone(UTC).timestamp() * 1000)


def job_spec(
    handler: str, payload: Any = None, **options: Unpack[JobOptions]
) -> common_pb2.JobSpec:
    """The ``JobSpec`` of a job; its request_id is fixed here (made when not given), before
    any try, so every retry of the call that sends it repeats it."""
    spec = common_pb2.JobSpec(
        request_id=options.get("request_id") or new_request_id(),
        handler=handler,
        payload=encode_payload(payload),
    )
    _template(spec, options)
    # The submitter's span, when tracing is on (shardq[otel], SHARDQ_OTEL); else a no-op.
    tracing.inject(spec.trace_context)
    delay, run_at = options.get("delay"), options.get("run_at")
    if delay is not None and run_at is not None:
        raise InvalidArgument("give delay or run_at, not both", field="delay")
    if delay is not None:
        spec.delay_ms = _ms(delay, "delay")
    if run_at is not None:
        spec.run_at_unix_ms = _unix_ms(run_at)
    return spec


def _template(spec: common_pb2.JobSpec, options: JobOptions | ScheduleOptions) -> None:
    """The fields a job and a schedule's template share. A field left at its default is not
    set: proto3 does not send one, and the three sets were 7% of a job_spec() call."""
    if queue := options.get("queue"):
        spec.queue = queue
    if priority := options.get("priority"):
        spec.priority = priority
    if max_attempts := options.get("max_attempts"):
        spec.max_attempts = max_attempts
    timeout = options.get("timeout")
    if timeout is not None:
        spec.timeout_ms = _ms(timeout, "timeout")
    retry = options.get("retry")
    if retry is not None:
        spec.retry.CopyFrom(retry.to_proto())


class Requests:
    """The request messages of one tenant's calls (``tenant_id`` empty: the token's)."""

    def __init__(self, tenant_id: str = "") -> None:
        self.tenant_id = tenant_id

    def submit(self, handler: str, payload: Any, options: JobOptions) -> jobs_pb2.SubmitJobRequest:
        spec = job_spec(handler, payload, **options)
        return jobs_pb2.SubmitJobRequest(tenant_id=self.tenant_id, job=spec)

    def submit_many(self, jobs: Iterable[BatchItem]) -> jobs_pb2.SubmitJobsRequest:
        specs = [
            _with_request_id(j) if isinstance(j, common_pb2.JobSpec) else JobRequest.of(j).to_spec()
            for j in jobs
        ]
        return jobs_pb2.SubmitJobsRequest(tenant_id=self.tenant_id, jobs=specs)

    def get(self, job_id: str) -> jobs_pb2.GetJobRequest:
        return jobs_pb2.GetJobRequest(tenant_id=self.tenant_id, job_id=job_id)

    def cancel(self, job_id: str) -> jobs_pb2.CancelJobRequest:
        return jobs_pb2.CancelJobRequest(tenant_id=self.tenant_id, job_id=job_id)

    def watch(self, job_id: str) -> jobs_pb2.WatchJobRequest:
        return jobs_pb2.WatchJobRequest(tenant_id=self.tenant_id, job_id=job_id)

    def list_jobs(
        self, state: JobState, page_size: int, page_token: str
    ) -> jobs_pb2.ListJobsRequest:
        return jobs_pb2.ListJobsRequest(
            tenant_id=self.tenant_id,
            state=int(state),  # type: ignore[arg-type]  # a JobState, or the API's number
            page_size=page_size,
            page_token=page_token,
        )

    def list_dead(self, page_size: int, page_token: str) -> jobs_pb2.ListDeadJobsRequest:
        return jobs_pb2.ListDeadJobsRequest(
            tenant_id=self.tenant_id, page_size=page_size, page_token=page_token
        )

    def requeue_dead(self, job_ids: Sequence[str], all: bool) -> jobs_pb2.RequeueDeadJobsRequest:
        if bool(job_ids) == all:
            raise InvalidArgument("give job IDs or all=True", field="job_ids")
        return jobs_pb2.RequeueDeadJobsRequest(
            tenant_id=self.tenant_id, job_ids=list(job_ids), all=all
        )

    def schedule(
        self, schedule_id: str, cron: str, handler: str, payload: Any, options: ScheduleOptions
    ) -> schedules_pb2.CreateScheduleRequest:
        # No request_id: each tick of the schedule makes its own.
        template = common_pb2.JobSpec(handler=handler, payload=encode_payload(payload))
        _template(template, options)
        schedule = schedules_pb2.Schedule(
            schedule_id=schedule_id,
            cron=cron,
            time_zone=options.get("timezone") or "UTC",
            job_template=template,
        )
        return schedules_pb2.CreateScheduleRequest(tenant_id=self.tenant_id, schedule=schedule)

    def list_schedules(self, page_token: str) -> schedules_pb2.ListSchedulesRequest:
        return schedules_pb2.ListSchedulesRequest(
            tenant_id=self.tenant_id, page_size=1000, page_token=page_token
        )

    def delete_schedule(self, schedule_id: str) -> schedules_pb2.DeleteScheduleRequest:
        return schedules_pb2.DeleteScheduleRequest(
            tenant_id=self.tenant_id, schedule_id=schedule_id
        )

    def tenant_stats(self) -> tenants_pb2.GetTenantStatsRequest:
        return tenants_pb2.GetTenantStatsRequest(tenant_id=self.tenant_id)

    def list_tenant_stats(
        self, shard_id: int | None, page_size: int, page_token: str
    ) -> admin_pb2.ListTenantStatsRequest:
        req = admin_pb2.ListTenantStatsRequest(page_size=page_size, page_token=page_token)
        if shard_id is not None:
            req.shard_id = shard_id
        return req

    def set_tenant_limits(
        self, limits: TenantLimits, tenant_id: str
    ) -> admin_pb2.SetTenantLimitsRequest:
        return admin_pb2.SetTenantLimitsRequest(
            tenant_id=tenant_id or self.tenant_id, limits=limits.to_proto()
        )

    def tenant_limits(
        self, tenant_id: str, stored_only: bool = False
    ) -> admin_pb2.GetTenantLimitsRequest:
        return admin_pb2.GetTenantLimitsRequest(
            tenant_id=tenant_id or self.tenant_id, stored_only=stored_only
        )


def _with_request_id(spec: common_pb2.JobSpec) -> common_pb2.JobSpec:
    """``spec``, or a copy with a request_id of its own when it has none: the client retries
    a batch, and a spec the server named would make a second job on each retry."""
    if spec.request_id:
        return spec
    named = common_pb2.JobSpec()
    named.CopyFrom(spec)
    named.request_id = new_request_id()
    return named
