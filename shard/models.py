"""Typed values that cross the shard API: the ones callers build and read.

The records that the Lua scripts read and write (a job's states, hash, ARGV and replies) are
encoded and decoded in :mod:`shard.records`, and imported from there; they are re-exported here
so that imports written before the split keep working.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from shardq.common.redis import Durability
from shardq.shard.backoff import Backoff
from shardq.shard.records import (
    DEFAULT_QUEUE,
    UNSTORED_MAX_ATTEMPTS,
    UNSTORED_TIMEOUT_MS,
    ClaimedJob,
    EnqueueResult,
    FailResult,
    JobRecord,
    JobState,
    PreparedJob,
)

# The records of shard.records are listed too: re-exported for imports that predate it.
__all__ = [
    "ClaimedJob",
    "DueTick",
    "EnqueueResult",
    "FailResult",
    "Failure",
    "JobPage",
    "JobRecord",
    "JobState",
    "Lease",
    "Limits",
    "NewJob",
    "Paused",
    "PreparedJob",
    "Schedule",
    "ScheduleSpec",
    "ShardSettings",
    "TenantCounts",
    "TenantLimits",
    "TenantLoad",
]


@dataclass(frozen=True, slots=True)
class ShardSettings:
    """How a shard's data plane behaves. One instance per process; defaults suit production."""

    #: Prefix of every Redis key (``SHARDQ_KEY_PREFIX``).
    key_prefix: str = "shardq"
    #: How long a (tenant, request_id) stays deduplicated after submit, in ms (24 h).
    dedupe_ttl_ms: int = 86_400_000
    #: How long a finished (succeeded/cancelled) job stays readable in Redis, in ms (24 h).
    retention_ms: int = 86_400_000
    #: Largest payload accepted, in bytes (1 MiB).
    max_payload_bytes: int = 1_048_576
    #: Attempts a job gets when it does not say (a job may ask for 1 to 1,000).
    default_max_attempts: int = UNSTORED_MAX_ATTEMPTS
    #: Handler timeout when a job does not say, in ms (5 min).
    default_timeout_ms: int = UNSTORED_TIMEOUT_MS
    #: Furthest into the future a job may be scheduled, in ms (366 days).
    max_schedule_horizon_ms: int = 366 * 86_400_000
    #: Most jobs one script call handles (enqueue, claim, ack, heartbeat, promote, reap).
    max_batch: int = 500
    #: Retry delays after failed attempts.
    backoff: Backoff = field(default_factory=Backoff)
    #: Replicas that must hold a write before it is acknowledged (WAIT after each script
    #: call that changes jobs; ``--shard-replicas-to-ack``): see ``ShardClient._run``.
    durability: Durability = field(default_factory=Durability)
    #: The Redis ACL user this process logs in as (``--redis-username``; docs/security.md),
    #: with the password given beside these settings; empty: ``default``.
    redis_username: str = ""


@dataclass(frozen=True, slots=True)
class TenantLimits:
    """One tenant's share and caps on its shard, the fields of ``shardq.v1.TenantLimits``.

    0 means "not set" everywhere. On the shard (``ShardClient.set_limits``) a set field is
    stored in the tenant's ``limits:{t}`` hash and an unset one is absent from it. As a job's
    ``NewJob.limits`` these are the caller's *defaults*: ``enqueue.lua`` uses them for the
    admission limits the tenant's hash does not set (the weight and the active cap are read by
    claims from the hash alone). With no value anywhere a limit does not apply (weight: 1).
    """

    #: Jobs the tenant gets per round-robin turn in each queue, 1..1000 (0: not set, 1).
    weight: int = 0
    #: Most jobs of the tenant ACTIVE at once, over all its queues (claim parks it there).
    max_active: int = 0
    #: Submits accepted per second, on average (a token bucket).
    submit_rate_per_s: float = 0.0
    #: Tokens the bucket holds: submits accepted at once after a quiet spell (0: max(1, rate)).
    submit_burst: int = 0
    #: Most jobs of the tenant scheduled, ready or active at once.
    max_pending: int = 0
    #: Most payload bytes of the tenant's scheduled, ready and active jobs at once.
    max_pending_bytes: int = 0
    #: Seconds a finished job's result row is kept in Postgres (0: the coordinator's default,
    #: ``--result-retention-s``). Not on the shard: the purge (``shardq.coordinator.retention``)
    #: reads it from the tenant's row.
    result_retention_s: int = 0
    #: Seconds a request_id stays deduplicated after its job is accepted (limits:{t}
    #: ``dedupe``; 0: ``ShardSettings.dedupe_ttl_ms``), in [MIN_DEDUPE_WINDOW_S,
    #: MAX_DEDUPE_WINDOW_S] of ``shard.client`` when set.
    dedupe_window_s: int = 0
    #: WatchJob streams the tenant may keep open at once on one coordinator process (0: its
    #: ``--max-streams-per-tenant``). Not on the shard: the coordinators' gate reads it from
    #: the tenant's row.
    max_watch_streams: int = 0


#: Limits that set nothing (every field 0): the default of ``NewJob.limits``.
NO_LIMITS = TenantLimits()


def Limits(max_pending: int = 0, rate_per_s: float = 0.0) -> TenantLimits:
    """The admission defaults as they were spelled before :class:`TenantLimits` (kept for
    callers written then): a TenantLimits with ``max_pending`` and ``submit_rate_per_s``."""
    return TenantLimits(max_pending=max_pending, submit_rate_per_s=rate_per_s)


@dataclass(frozen=True, slots=True)
class PauseSummary:
    """What is held back on one shard now (the shard loop's gauges)."""

    #: Tenants paused whole.
    tenants: int
    #: Queues paused for every tenant of the shard, sorted.
    queues: list[str]
    #: Single tenants' queues paused (``{tenant}/{queue}`` pairs).
    tenant_queues: int
    #: Tenants off the rings because they are at their ``max_active`` cap.
    parked: int


class Paused(NamedTuple):
    """What ``ShardClient.paused(tenant)`` answers: a pair ``(tenant, queues)``."""

    #: The tenant is paused whole: none of its jobs is claimed.
    tenant: bool
    #: Queues none of its jobs is claimed from: paused for it alone or for every tenant, sorted.
    queues: list[str]


class NewJob(NamedTuple):
    """A job to enqueue. ``run_at_ms`` and ``delay_ms`` are exclusive; neither means now.

    A NamedTuple, as ``PreparedJob``: the coordinator makes one per submitted job, and a frozen
    dataclass's ``__init__`` sets each of these 13 fields through ``object.__setattr__``, 3.5 µs
    of the 11 µs that reading a spec took (``bench/submit_stages.py``). Immutable all the same;
    ``job._replace(field=...)`` makes a changed copy.
    """

    tenant: str
    handler: str
    payload: bytes
    request_id: str
    priority: int = 0
    run_at_ms: int | None = None
    delay_ms: int | None = None
    #: 0 takes ShardSettings.default_max_attempts.
    max_attempts: int = 0
    #: 0 takes ShardSettings.default_timeout_ms.
    timeout_ms: int = 0
    #: The caller's defaults for the admission limits the tenant's ``limits:{t}`` hash on the
    #: shard does not set (rate, burst, pending jobs and bytes); see :class:`TenantLimits`.
    #: One shared (frozen) object by default, so the shard API checks it once, not per job.
    limits: TenantLimits = NO_LIMITS
    #: Set by the shard API when empty; a caller may fix it (migration keeps IDs).
    job_id: str = ""
    #: The queue the job waits in; workers claim from the queues they serve.
    queue: str = DEFAULT_QUEUE
    #: The job's own retry policy (a field 0: the handler's, else the server default's);
    #: None for none, as most jobs (nothing stored).
    retry: Backoff | None = None
    #: The submitter's W3C trace context, encoded by ``shardq.common.tracing.encode`` (the
    #: coordinator checked it); '' for none, as when tracing is off (nothing stored).
    trace_context: str = ""


@dataclass(frozen=True, slots=True)
class Lease:
    job_id: str
    fence: int


@dataclass(frozen=True, slots=True)
class Failure:
    """A failed attempt to record. ``retry_at_ms`` None means: back off by the job's own policy
    over ``backoff`` (the handler's; None: ShardSettings.backoff), computed by ``fail.lua``."""

    job_id: str
    fence: int
    attempt: int
    error: str
    permanent: bool = False
    retry_at_ms: int | None = None
    #: The handler's retry policy, every field set; None takes ShardSettings.backoff.
    backoff: Backoff | None = None
    #: The jitter's random draw in [0, 1); None: ``ShardClient.fail`` draws it (tests fix it).
    draw: float | None = None
    #: > 0: the attempt failed for want of the results database, not by the handler; it is
    #: not counted against max_attempts while the job has had fewer than this many such
    #: (its backoff then grows with them), after which it counts as any failure.
    store_retries_max: int = 0


@dataclass(frozen=True, slots=True)
class TenantCounts:
    scheduled: int = 0
    ready: int = 0
    active: int = 0
    dead: int = 0
    submitted: int = 0
    succeeded: int = 0
    failed: int = 0
    #: Payload bytes of the scheduled, ready and active jobs (a gauge).
    bytes: int = 0
    #: Jobs handed back by a worker without their handler (``release(avoid_ms > 0)``), ever.
    unrunnable: int = 0


@dataclass(frozen=True, slots=True)
class TenantLoad:
    """One tenant's load on its shard: gauges read now, rates from the shard loop's sampler.

    The gauges and totals come from the tenant's counts hash at the time of the read. The rates
    are those of the last interval the leading shard loop sampled (:mod:`shard.load`, every
    ``load_interval_s``); they stay 0 until it has sampled the tenant twice. ``at_ms`` is when
    the last sample was taken (unix ms, 0 for none): rates older than a few intervals mean no
    loop leads the shard.
    """

    tenant: str
    scheduled: int = 0
    ready: int = 0
    active: int = 0
    dead: int = 0
    #: Jobs accepted (deduplicated submits not counted), ever (the ``submitted`` counter).
    submitted_total: int = 0
    #: Jobs that succeeded, ever (the ``succeeded`` counter).
    completed_total: int = 0
    #: Attempts that failed or whose lease expired, ever (the ``failed`` counter).
    failed_total: int = 0
    #: Jobs accepted per second over the last sampled interval.
    submit_per_s: float = 0.0
    #: Jobs that succeeded per second over the last sampled interval.
    complete_per_s: float = 0.0
    #: Failed or expired attempts per second over the last sampled interval.
    fail_per_s: float = 0.0
    #: When the rates were sampled, unix ms; 0 before the first sample.
    at_ms: int = 0
    #: Payload bytes of the scheduled, ready and active jobs (the ``bytes`` gauge).
    pending_bytes: int = 0
    #: Jobs handed back by a worker that had no handler of their name, ever (``unrunnable``).
    unrunnable_total: int = 0

    @property
    def pending(self) -> int:
        """Jobs waiting or running: scheduled + ready + active."""
        return self.scheduled + self.ready + self.active

    @classmethod
    def of(cls, tenant: str, counts: dict[str, int], sample: dict[str, Any]) -> TenantLoad:
        """From a tenant's counts hash and its entry of the load hash (see ``Keys.load``)."""

        def gauge(name: str) -> int:
            # A gauge may dip below 0 for a moment while a move or a repair adjusts it.
            return max(0, counts.get(name, 0))

        def rate(name: str) -> float:
            value = sample.get(name, 0.0)
            return float(value) if isinstance(value, int | float) else 0.0

        at = sample.get("at_ms", 0)
        return cls(
            tenant=tenant,
            scheduled=gauge("scheduled"),
            ready=gauge("ready"),
            active=gauge("active"),
            dead=gauge("dead"),
            submitted_total=gauge("submitted"),
            completed_total=gauge("succeeded"),
            failed_total=gauge("failed"),
            submit_per_s=rate("submit_per_s"),
            complete_per_s=rate("complete_per_s"),
            fail_per_s=rate("fail_per_s"),
            at_ms=at if isinstance(at, int) else 0,
            pending_bytes=gauge("bytes"),
            unrunnable_total=gauge("unrunnable"),
        )


@dataclass(frozen=True, slots=True)
class JobPage:
    jobs: list[JobRecord]
    next_page_token: str


@dataclass(frozen=True, slots=True)
class ScheduleSpec:
    """A recurring schedule: a 5-field cron expression in a time zone, and the job to enqueue."""

    schedule_id: str
    cron: str
    handler: str
    payload: bytes
    time_zone: str = "UTC"
    priority: int = 0
    max_attempts: int = 0
    timeout_ms: int = 0
    created_at_ms: int = 0

    def same_definition(self, other: ScheduleSpec) -> bool:
        """Equal definitions (ID and creation time aside): creating it again is a no-op."""
        return self._definition() == other._definition()

    def _definition(self) -> tuple[Any, ...]:
        return (
            self.cron, self.handler, self.payload, self.time_zone, self.priority,
            self.max_attempts, self.timeout_ms,
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class Schedule:
    spec: ScheduleSpec
    tenant: str
    next_tick_ms: int


@dataclass(frozen=True, slots=True)
class DueTick:
    tenant: str
    schedule_id: str
    tick_ms: int
