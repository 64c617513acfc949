"""Conversions between the wire messages of shardq.v1 and the shard's typed values."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

import orjson

from shardq.common import tracing, validation
from shardq.common.errors import InvalidArgument
from shardq.shard import cron
from shardq.shard.backoff import job_backoff
from shardq.shard.models import NewJob, Schedule, ScheduleSpec, TenantLimits, TenantLoad
from shardq.shard.records import EnqueueResult, JobProgress, JobRecord, JobState, PreparedJob
from shardq.v1 import common_pb2, schedules_pb2

STATE_TO_PB: dict[JobState, common_pb2.JobState.ValueType] = {
    JobState.SCHEDULED: common_pb2.JOB_STATE_SCHEDULED,
    JobState.READY: common_pb2.JOB_STATE_READY,
    JobState.ACTIVE: common_pb2.JOB_STATE_ACTIVE,
    JobState.SUCCEEDED: common_pb2.JOB_STATE_SUCCEEDED,
    JobState.DEAD: common_pb2.JOB_STATE_DEAD,
    JobState.CANCELLED: common_pb2.JOB_STATE_CANCELLED,
}
PB_TO_STATE = {v: k for k, v in STATE_TO_PB.items()}
TERMINAL_PB = frozenset(
    {common_pb2.JOB_STATE_SUCCEEDED, common_pb2.JOB_STATE_DEAD, common_pb2.JOB_STATE_CANCELLED}
)


#: The queue of a job whose spec names none.
DEFAULT_QUEUE = "default"

#: Longest cron expression and time zone name accepted (IANA names are under 40 characters).
MAX_CRON_CHARS = 256
MAX_TIME_ZONE_CHARS = 64


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


#: One decoder for every payload: ``json.loads`` with a keyword argument builds a new
#: ``JSONDecoder`` per call, two thirds of the check's time on a small payload.
_JSON = json.JSONDecoder(parse_constant=_no_constant)
#: Payloads with more brackets than this are checked by json alone: they may nest deeper than
#: json reads under the coordinator's stack, which orjson would accept.
_ORJSON_MAX_OPENS = 500


def check_json(payload: bytes, field: str = "job.payload") -> bytes:
    """The payload handed to handlers: a UTF-8 JSON document; empty stands for JSON null.

    Stricter than ``json.loads(bytes)``, which also takes UTF-16/32, a BOM, lone surrogates
    encoded in UTF-8 and NaN/Infinity: a handler in any language must be able to read it.
    """
    if not payload:
        return b"null"
    # orjson reads a small payload in a tenth of json's time (0.2 against 2.3 µs for ``5``)
    # and refuses what JSON does not allow, and a few documents that JSON allows besides:
    # numbers past a float's range (``1e400``, a 400-digit integer) and escaped lone
    # surrogates (``"\\ud800"``). json decides those, and any payload that could nest deeper
    # than json reads (its limit is the recursion limit less the caller's depth; orjson's is
    # 1,024), so what is accepted is what json accepts. Only for the check: orjson reads an
    # integer past 64 bits as a float, so the worker reads payloads with json.
    if payload.count(b"[") + payload.count(b"{") <= _ORJSON_MAX_OPENS:
        try:
            orjson.loads(payload)
        except orjson.JSONDecodeError:
            pass
        else:
            return payload
    try:
        _JSON.decode(payload.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise InvalidArgument(f"not a UTF-8 JSON document ({exc})", field=field) from exc
    except RecursionError as exc:
        raise InvalidArgument("not a JSON document: nested too deeply", field=field) from exc
    return payload


def check_recurrence(expr: str, time_zone: str) -> None:
    """A cron expression and time zone that yield a next tick, or InvalidArgument naming one.

    ``shard.cron.check`` alone lets through expressions that never fire (``0 0 31 2 *``) and
    zone names that are directories of the tz database (``America``) or too long for a file
    name; those then failed while computing the first tick, as INTERNAL or UNAVAILABLE.
    """
    if len(expr) > MAX_CRON_CHARS:
        raise InvalidArgument(f"longer than {MAX_CRON_CHARS} characters", field="schedule.cron")
    bad_zone = InvalidArgument(
        f"{time_zone[:80]!r} is not an IANA time zone", field="schedule.time_zone"
    )
    if len(time_zone) > MAX_TIME_ZONE_CHARS or not time_zone.isprintable():
        raise bad_zone
    try:
        cron.zone(time_zone)
    except (OSError, InvalidArgument) as exc:  # OSError: a directory, a name the OS refuses
        raise bad_zone from exc
    try:
        cron.check(expr, time_zone)
        cron.next_tick_ms(expr, time_zone, int(time.time() * 1000))
    except InvalidArgument as exc:
        raise InvalidArgument(exc.message, field=f"schedule.{exc.field}") from exc
    except (ValueError, OverflowError) as exc:  # croniter's errors are ValueErrors
        raise InvalidArgument(f"{expr!r} never fires ({exc})", field="schedule.cron") from exc


def _when(spec: common_pb2.JobSpec) -> tuple[int | None, int | None]:
    which = spec.WhichOneof("when")
    if which == "run_at_unix_ms":
        return spec.run_at_unix_ms, None
    if which == "delay_ms":
        return None, spec.delay_ms
    return None, None


def new_job(
    tenant: str,
    spec: common_pb2.JobSpec,
    request_id: str,
    limits: TenantLimits,
    max_payload: int,
) -> NewJob:
    """A submitted JobSpec as a NewJob; raises InvalidArgument naming the ``job.`` field."""
    payload = spec.payload
    if len(payload) > max_payload:
        raise InvalidArgument(
            f"{len(payload)} bytes is over the {max_payload}-byte limit", field="job.payload"
        )
    run_at, delay = _when(spec)
    if run_at is not None and run_at < 0:
        raise InvalidArgument(f"{run_at} is before 1970", field="job.run_at_unix_ms")
    if delay is not None and delay < 0:
        raise InvalidArgument(f"{delay} is negative", field="job.delay_ms")
    # int32 on the wire: a caller's -1 is -1 here, and is refused as such. The usual values
    # tested here, the check's function called only to say what is wrong (once per job).
    priority = spec.priority
    if not validation.MIN_PRIORITY <= priority <= validation.MAX_PRIORITY:
        validation.priority(priority, "job.priority")
    queue = spec.queue
    if not queue:
        queue = DEFAULT_QUEUE
    elif queue != DEFAULT_QUEUE:
        validation.queue(queue, "job.queue")
    retry = None
    if spec.HasField("retry"):
        r = spec.retry
        retry = job_backoff(r.base_ms, r.max_ms, r.jitter, "job.retry")
    return NewJob(
        tenant=tenant,
        handler=spec.handler,
        payload=check_json(payload),
        request_id=request_id,
        priority=priority,
        run_at_ms=run_at,
        delay_ms=delay,
        max_attempts=spec.max_attempts,
        timeout_ms=spec.timeout_ms,
        limits=limits,
        queue=queue,
        trace_context=tracing.encode(spec.trace_context),
        retry=retry,
    )


def job_to_pb(rec: JobRecord, shard_id: int, result: bytes | None = None) -> common_pb2.Job:
    return common_pb2.Job(
        job_id=rec.job_id,
        tenant_id=rec.tenant,
        request_id=rec.request_id,
        handler=rec.handler,
        payload=rec.payload,
        priority=rec.priority,
        state=STATE_TO_PB.get(rec.state, common_pb2.JOB_STATE_UNSPECIFIED),
        run_at_unix_ms=rec.run_at_ms,
        created_at_unix_ms=rec.created_at_ms,
        attempts=rec.attempts,
        max_attempts=rec.max_attempts,
        timeout_ms=rec.timeout_ms,
        last_error=rec.last_error,
        started_at_unix_ms=rec.started_at_ms,
        finished_at_unix_ms=rec.finished_at_ms,
        worker_id=rec.worker_id,
        result=result or b"",
        shard_id=shard_id,
        cancel_requested=rec.cancel_requested,
        queue=rec.queue,
        progress=progress_to_pb(rec.progress),
        next_attempt_at_unix_ms=rec.next_attempt_at_ms,
    )


def new_job_into(
    out: common_pb2.Job, job: PreparedJob, result: EnqueueResult, shard_id: int
) -> None:
    """Fill ``out`` (a response's own ``Job``) with the job ``enqueue.lua`` just made of ``job``
    (``result.code`` OK): ``job_to_pb(JobRecord.of_new(job, result), shard_id)``, field for
    field, set where it lies. Every other field of a new job is at its zero value. Through the
    record, then a message copied into the response, it took 11-13 µs against 2-3 on an AMD
    EPYC machine (``bench/submit_stages.py``'s ``unary_answer``)."""
    out.job_id = result.job_id
    out.tenant_id = job.tenant
    out.request_id = job.request_id
    out.handler = job.handler
    out.payload = job.payload
    out.priority = job.priority
    out.state = STATE_TO_PB.get(result.state, common_pb2.JOB_STATE_UNSPECIFIED)
    out.run_at_unix_ms = result.run_at_ms
    out.created_at_unix_ms = result.created_at_ms
    out.max_attempts = job.max_attempts
    out.timeout_ms = job.timeout_ms
    out.shard_id = shard_id
    out.queue = job.queue


def progress_to_pb(p: JobProgress | None) -> common_pb2.JobProgress | None:
    if p is None:
        return None
    return common_pb2.JobProgress(
        fraction=p.fraction, message=p.message, updated_at_unix_ms=p.updated_at_ms
    )


def limits_from_pb(m: common_pb2.TenantLimits) -> TenantLimits:
    """The message's values as they are (``limits.check`` says whether they may be set)."""
    return TenantLimits(
        weight=m.weight,
        max_active=m.max_active,
        submit_rate_per_s=m.submit_rate_per_s,
        submit_burst=m.submit_burst,
        max_pending=m.max_pending,
        max_pending_bytes=m.max_pending_bytes,
        result_retention_s=m.result_retention_s,
        dedupe_window_s=m.dedupe_window_s,
        max_watch_streams=m.max_watch_streams,
    )


def limits_to_pb(t: TenantLimits) -> common_pb2.TenantLimits:
    return common_pb2.TenantLimits(
        weight=t.weight,
        max_active=t.max_active,
        submit_rate_per_s=t.submit_rate_per_s,
        submit_burst=t.submit_burst,
        max_pending=t.max_pending,
        max_pending_bytes=t.max_pending_bytes,
        result_retention_s=t.result_retention_s,
        dedupe_window_s=t.dedupe_window_s,
        max_watch_streams=t.max_watch_streams,
    )


def tenant_stats_pb(
    tenant: str,
    shard_id: int,
    load: TenantLoad,
    *,
    limits: TenantLimits | None = None,
    paused: bool = False,
    paused_queues: Sequence[str] = (),
) -> common_pb2.TenantStats:
    """Every field of TenantStats from a tenant's load (``ShardClient.tenant_load(s)``), its
    limits (defaults applied) and its pauses."""
    return common_pb2.TenantStats(
        tenant_id=tenant,
        shard_id=shard_id,
        scheduled=load.scheduled,
        ready=load.ready,
        active=load.active,
        dead=load.dead,
        submitted_total=load.submitted_total,
        completed_total=load.completed_total,
        failed_total=load.failed_total,
        submitted_per_s=load.submit_per_s,
        completed_per_s=load.complete_per_s,
        failed_per_s=load.fail_per_s,
        rates_sampled_at_unix_ms=load.at_ms,
        limits=limits_to_pb(limits) if limits is not None else None,
        paused=paused,
        paused_queues=sorted(paused_queues),
        pending_bytes=load.pending_bytes,
        unrunnable_total=load.unrunnable_total,
    )


def schedule_spec(s: schedules_pb2.Schedule, max_payload: int) -> ScheduleSpec:
    """The schedule as the shard stores it; raises InvalidArgument naming the field as the
    request spells it (``schedule.job_template.priority``)."""
    t = s.job_template
    tpl = "schedule.job_template."
    validation.schedule_id(s.schedule_id, "schedule.schedule_id")
    check_recurrence(s.cron, s.time_zone or "UTC")
    validation.handler(t.handler, tpl + "handler")
    validation.payload(t.payload, max_payload, tpl + "payload")
    validation.priority(t.priority, tpl + "priority")
    validation.int_in_range(t.max_attempts, 0, validation.MAX_ATTEMPTS_LIMIT, tpl + "max_attempts")
    validation.int_in_range(t.timeout_ms, 0, validation.MAX_TIMEOUT_MS, tpl + "timeout_ms")
    if t.queue not in ("", DEFAULT_QUEUE):
        validation.queue(t.queue, tpl + "queue")
        raise InvalidArgument(
            f"schedules make jobs in the {DEFAULT_QUEUE!r} queue only", field=tpl + "queue"
        )
    return ScheduleSpec(
        schedule_id=s.schedule_id,
        cron=s.cron,
        handler=t.handler,
        payload=check_json(t.payload, tpl + "payload"),
        time_zone=s.time_zone or "UTC",
        priority=t.priority,
        max_attempts=t.max_attempts,
        timeout_ms=t.timeout_ms,
    )


def schedule_to_pb(s: Schedule) -> schedules_pb2.Schedule:
    sp = s.spec
    return schedules_pb2.Schedule(
        schedule_id=sp.schedule_id,
        cron=sp.cron,
        time_zone=sp.time_zone,
        job_template=common_pb2.JobSpec(
            handler=sp.handler,
            payload=sp.payload,
            priority=sp.priority,
            max_attempts=sp.max_attempts,
            timeout_ms=sp.timeout_ms,
        ),
        next_run_at_unix_ms=s.next_tick_ms,
        created_at_unix_ms=sp.created_at_ms,
    )


def page_size(
    requested: int, default: int = 100, maximum: int = 1000, field: str = "page_size"
) -> int:
    """The page size to use; a negative one (int32 on the wire: a caller's -1) is refused."""
    if requested < 0:
        raise InvalidArgument(f"must be >= 0, got {requested}", field=field)
    return default if requested == 0 else min(requested, maximum)


def as_dict(obj: Any) -> dict[str, Any]:
    return {k: getattr(obj, k) for k in obj.__slots__}
