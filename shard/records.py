"""A job as the Lua scripts see it: its states, its hash, its ARGV and its replies, in one place.

This is the only Python that knows how ``shard/lua/`` lays a job out: the short field names of
the job hash, the order of ``enqueue.lua``'s per-job ARGV, and the order of ``claim.lua``'s and
``enqueue.lua``'s replies (Asynq keeps its ``TaskMessage`` and ``EncodeMessage``/``DecodeMessage``
together in ``internal/base`` the same way). Everything else reads a job by attribute name, and
a name (``request_id``) keeps its name on both sides. A change to a script's ARGV or reply is a
change here and in that script's header; ``tests/unit/test_records.py`` holds the two together.

Why a module of its own and not more of :mod:`shard.models`: ``models`` holds the values a
caller builds and reads (settings, ``NewJob``, ``TenantLimits``, ``Lease``, ``Failure``, loads,
schedules) and knows nothing of Redis; this module is the wire format, small enough to read
against the scripts in one sitting. ``models`` re-exports the records so that callers import
the shard's values from one module.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from enum import StrEnum
from typing import Any, Final, NamedTuple

from shardq.shard.backoff import Backoff
from shardq.shard.codes import ItemCode, item_code

#: The queue of a job that names none; a job hash without field ``q`` is in it.
DEFAULT_QUEUE: Final = "default"
#: The max attempts and the timeout (ms) of a job hash without field ``ma`` or ``to``: the
#: values most jobs have (``ShardSettings``' defaults). Every reader takes a missing ``pr``,
#: ``at``, ``f``, ``ma`` or ``to`` as its usual value (0, 0, 0, these). ``enqueue.lua`` leaves
#: out ``at`` and ``f`` always, and ``pr``, ``ma`` and ``to`` at :data:`JOB_FORMAT` 2 (248 ->
#: 216 bytes of hash per job in the ``scale`` benchmark).
UNSTORED_MAX_ATTEMPTS: Final = 5
UNSTORED_TIMEOUT_MS: Final = 300_000
#: The job-hash format this release writes once a shard's is raised to it (``Keys.job_format``,
#: ``shardq shards finalize``). Until then a shard writes format 1, every field, which releases
#: before the one that read format 2 (``e23b590``) need: they may run beside this one while pods
#: roll. Format 2 leaves fields at their usual value out (:data:`COMPACT_FORMAT`); format 3
#: (:data:`FOLDED_FORMAT`) also folds the dedupe key of a live job into its hash.
JOB_FORMAT: Final = 3
#: The first format that leaves ``pr``, ``ma`` and ``to`` out at their usual values.
COMPACT_FORMAT: Final = 2
#: The first format whose jobs are found by (tenant, request_id): a job's ID is
#: :func:`derived_job_id` and its hash holds the digest (``d``), the record that deduplicates
#: its request ID while it lives; its dedupe key is written only when it ends, for what is left
#: of its window (``_lib.lua``, ``dedupe_after_end``). One key per scheduled job instead of two.
FOLDED_FORMAT: Final = 3


def derived_job_id(tenant: str, request_id: str) -> str:
    """The ID of the job of (tenant, request_id) at :data:`FOLDED_FORMAT`: the first 26 hex
    digits (104 bits) of the SHA-1 of ``tenant:request_id``, as ``_lib.lua``'s ``derived_id``
    makes it (a tenant ID holds no ``:``, so no two pairs share the text). Lower-case hex, so
    it never looks like a time-sortable ID (``shardq.common.ids``, upper-case base32)."""
    return hashlib.sha1(f"{tenant}:{request_id}".encode(), usedforsecurity=False).hexdigest()[:26]


class JobState(StrEnum):
    """A job's state, as the scripts store it in hash field ``s`` (:attr:`JobField.STATE`).

    A ``StrEnum``: a member equals its string (``JobState.READY == "ready"``).
    """

    #: Not a state of a stored job: a reply about a job that does not exist (never made,
    #: refused, or expired) carries ``''`` where a state would be.
    UNKNOWN = ""
    #: On the delayed ZSETs until its run-at (``promote.lua`` makes it ready).
    SCHEDULED = "scheduled"
    #: On its tenant's ready list for its queue and priority, waiting for a claim.
    READY = "ready"
    #: Claimed: a worker holds its lease (ZSET ``leases``) and fencing token.
    ACTIVE = "active"
    #: Acked after its result row was committed. Final.
    SUCCEEDED = "succeeded"
    #: Attempts used up or failed for good; in the tenant's dead-letter ZSET, can be requeued.
    DEAD = "dead"
    #: Cancelled while scheduled or ready, or finished after a cancel while active. Final.
    CANCELLED = "cancelled"

    @classmethod
    def parse(cls, raw: bytes | str | None) -> JobState:
        """The state a script wrote or answered; UNKNOWN for none (or one this code does not
        know, which no script writes)."""
        if isinstance(raw, bytes):
            return _STATE_OF_BYTES.get(raw, cls.UNKNOWN)
        return _STATE_OF_STR.get(raw or "", cls.UNKNOWN)

    @property
    def terminal(self) -> bool:
        """Nothing changes the job any more (a dead job only by an explicit requeue)."""
        return self in TERMINAL_STATES


_STATE_OF_STR: Final = {s.value: s for s in JobState}
_STATE_OF_BYTES: Final = {s.value.encode(): s for s in JobState}
#: A tuple of a NamedTuple's class made directly (its generated ``__new__`` is a Python call).
_new_tuple: Final = tuple.__new__

#: Every state a stored job can be in (JobState.UNKNOWN aside), in lifecycle order.
STATES: Final = tuple(s for s in JobState if s is not JobState.UNKNOWN)
#: States a job ends in: succeeded, dead (until requeued) and cancelled.
TERMINAL_STATES: Final = frozenset({JobState.SUCCEEDED, JobState.DEAD, JobState.CANCELLED})
#: Finished for good: the move copies such a job's hash as it is, it never changes again.
FINISHED_STATES: Final = frozenset({JobState.SUCCEEDED, JobState.CANCELLED})


class JobField(StrEnum):
    """The fields of the job hash ``{prefix}:job:{job_id}`` (``Keys.job``), named as the
    record attribute each one fills (``REQUEST_ID`` -> ``JobRecord.request_id``) and valued as
    the scripts spell them. Short names keep a scheduled job small in Redis."""

    TENANT = "t"
    REQUEST_ID = "r"
    HANDLER = "h"
    PAYLOAD = "p"
    PRIORITY = "pr"
    STATE = "s"
    RUN_AT_MS = "ra"
    CREATED_AT_MS = "ca"
    ATTEMPTS = "at"
    MAX_ATTEMPTS = "ma"
    TIMEOUT_MS = "to"
    FENCE = "f"
    WORKER_ID = "w"
    STARTED_AT_MS = "sa"
    FINISHED_AT_MS = "fa"
    LAST_ERROR = "e"
    CANCEL_REQUESTED = "cx"
    QUEUE = "q"
    AVOID_WORKER_ID = "xw"
    AVOID_UNTIL_MS = "xu"
    RETRY = "rb"
    PROGRESS = "pg"
    TRACE_CONTEXT = "tc"
    STORE_RETRIES = "sr"
    FOUND_DONE = "ck"
    DIGEST = "d"

    @property
    def attribute(self) -> str:
        """The :class:`JobRecord` attribute this field fills."""
        return self.name.lower()


#: What each field of the job hash holds (documentation; ``Keys.job`` points here).
JOB_FIELD_DOCS: Final[Mapping[JobField, str]] = {
    JobField.TENANT: "tenant ID",
    JobField.REQUEST_ID: "request ID (the tenant's idempotency key)",
    JobField.HANDLER: "handler name",
    JobField.PAYLOAD: "payload (bytes, a JSON document)",
    JobField.PRIORITY: "priority 0-9, 9 most urgent (absent: 0)",
    JobField.STATE: "state: " + " | ".join(STATES),
    JobField.RUN_AT_MS: "run-at, unix ms (when it was or will be due)",
    JobField.CREATED_AT_MS: "created-at, unix ms",
    JobField.ATTEMPTS: "attempts so far (claims, including the one running; absent: 0)",
    JobField.MAX_ATTEMPTS: f"max attempts (absent: {UNSTORED_MAX_ATTEMPTS})",
    JobField.TIMEOUT_MS: f"handler timeout, ms (absent: {UNSTORED_TIMEOUT_MS})",
    JobField.FENCE: "fencing token of the current or last lease (absent: 0, never claimed)",
    JobField.WORKER_ID: "worker ID of the current or last lease",
    JobField.STARTED_AT_MS: "started-at of the current or last attempt, unix ms",
    JobField.FINISHED_AT_MS: "finished-at, unix ms (terminal states)",
    JobField.LAST_ERROR: "last error",
    JobField.CANCEL_REQUESTED: "1 when cancel was requested while active",
    JobField.QUEUE: f"queue (absent: {DEFAULT_QUEUE!r}, which is not stored)",
    JobField.AVOID_WORKER_ID: "worker that handed the job back for want of its handler",
    JobField.AVOID_UNTIL_MS: "unix ms before which that worker ('xw') may not claim it again",
    JobField.RETRY: "the job's own retry policy, '<base_ms> <max_ms> <jitter>' (0: unset; "
    "absent when it has none, as most jobs: shard/backoff.py)",
    JobField.PROGRESS: "the handler's last progress, '<updated_at_ms> <fraction> <message>' "
    "(heartbeat.lua; absent until it reports one: JobProgress)",
    JobField.TRACE_CONTEXT: "the submitter's W3C trace context, '<traceparent>' or "
    "'<traceparent>\\n<tracestate>' (absent when it sent none: shardq.common.tracing)",
    JobField.STORE_RETRIES: "attempts not counted: they failed for want of the results database "
    "(fail.lua; absent: none; a requeue of the dead job resets it)",
    JobField.FOUND_DONE: "d when the shard loop found a final row for the job's request ID "
    "before its first claim (prechecked.lua): that claim is looked up before it starts; "
    "absent: the first claim starts at once, looked up alongside",
    JobField.DIGEST: "digest of handler and payload, what makes two submits of its request ID "
    "the same job (only at FOLDED_FORMAT, whose job IDs are derived_job_id: the job's hash is "
    "then its request ID's dedupe record while it lives; absent below)",
}


@dataclass(frozen=True, slots=True)
class JobProgress:
    """What a handler last reported through ``ctx.progress`` (hash field ``pg``)."""

    #: Fraction done, 0 to 1.
    fraction: float
    #: The handler's text, at most :data:`MAX_PROGRESS_MESSAGE` characters.
    message: str
    #: When the shard stored it (its clock, unix ms); 0 for one not yet stored.
    updated_at_ms: int = 0

    def as_json(self) -> dict[str, Any]:
        """As a result row's ``progress`` column keeps it (``shardq.v1.JobProgress``'s names)."""
        return {
            "fraction": self.fraction,
            "message": self.message,
            "updated_at_unix_ms": self.updated_at_ms,
        }

    def to_arg(self) -> str:
        """``"<fraction> <message>"``: heartbeat.lua's progress entry (it prefixes its time)."""
        return f"{float(self.fraction)!r} {self.message}"

    @classmethod
    def parse(cls, raw: bytes | str | None) -> JobProgress | None:
        """The hash field ``pg`` as heartbeat.lua writes it; None when absent."""
        if not raw:
            return None
        text = raw.decode() if isinstance(raw, bytes) else raw
        at, fraction, message = [*text.split(" ", 2), ""][:3]
        return cls(float(fraction), message, int(at))


#: Longest progress message a handler may report, in characters.
MAX_PROGRESS_MESSAGE: Final = 256


def _text(value: bytes | str | None) -> str:
    if value is None:
        return ""
    return value.decode() if isinstance(value, bytes) else value


# --- submit: enqueue.lua -------------------------------------------------------------------


class PreparedJob(NamedTuple):
    """A job checked and completed by ``ShardClient.prepare``, ready for ``enqueue.lua``.

    The fields are declared in the order ``enqueue.lua`` reads them from its ARGV (one entry
    each, :data:`ENQUEUE_STRIDE`); :meth:`to_argv` writes them in that order. ``limit_defaults``
    carries
    the caller's defaults for the admission limits the tenant's ``limits:{t}`` hash does not
    set (``NewJob.limits``), checked with the write and not stored: four numbers in one
    entry (:func:`limit_defaults`), since redis-py's packing costs per argument and a batch's
    jobs share their tenant's defaults.

    A NamedTuple, not a frozen dataclass: one is made per submitted job, and a frozen
    dataclass's ``__init__`` sets each field through ``object.__setattr__`` (0.8 µs more for
    these 15 fields, of the coordinator's ~11 µs of its own work per job of a batch).
    """

    tenant: str
    job_id: str
    request_id: str
    handler: str
    payload: bytes
    priority: int
    #: The run-at the caller asked for (unix ms), as given; None for a job due after
    #: ``delay_ms`` by the shard's clock, which ``enqueue.lua`` reads: then its run-at is
    #: exactly its created-at plus ``delay_ms``, whatever the caller's clock says.
    run_at_ms: int | None
    #: With no ``run_at_ms``: ms after its creation the job is due (0: at once).
    delay_ms: int
    max_attempts: int
    timeout_ms: int
    #: Of handler and payload (``shard.client.digest``): what makes two submits the same job.
    digest: str
    #: The queue the job waits in.
    queue: str
    #: ``limit_defaults(...)``: the default pending-jobs quota, pending-bytes quota, submit
    #: rate and bucket size (0: none, none, no limit, max(1, rate)).
    limit_defaults: str
    #: The job's own retry policy (``Backoff.to_arg()``), '' for none (nothing stored).
    retry: str = ""
    #: The submitter's trace context (``shardq.common.tracing.encode``), '' for none.
    trace_context: str = ""

    def to_argv(self) -> list[Any]:
        """This job's ARGV entries for ``enqueue.lua``, in the order it reads them: the
        fields, in their declared order, with a run-at of None sent as ''."""
        argv = list(self)
        if self.run_at_ms is None:
            argv[_RUN_AT] = ""
        return argv


def limit_defaults(
    max_pending: int, max_pending_bytes: int, submit_rate_per_s: float, submit_burst: int
) -> str:
    """``PreparedJob.limit_defaults``: ``"<max_pending> <max_pending_bytes> <rate> <burst>"``,
    the rate as a float Lua's ``tonumber`` reads back exactly (``repr``)."""
    return f"{max_pending} {max_pending_bytes} {float(submit_rate_per_s)!r} {submit_burst}"


#: ``enqueue.lua``'s per-job ARGV, in order: the fields of :class:`PreparedJob`.
ENQUEUE_ARGV: Final = PreparedJob._fields
ENQUEUE_STRIDE: Final = len(ENQUEUE_ARGV)
#: Entries per job of ``enqueue.lua``'s reply, after its first (the shard's now).
ENQUEUE_REPLY_STRIDE: Final = 3
_RUN_AT: Final = ENQUEUE_ARGV.index("run_at_ms")


class EnqueueResult(NamedTuple):
    """What ``enqueue.lua`` answers for one job (a NamedTuple, as :class:`PreparedJob`: one
    per submitted job)."""

    code: ItemCode
    job_id: str
    state: JobState
    retry_after_ms: int = 0
    #: The new job's created-at and run-at (unix ms, by the shard's clock: hash fields ``ca``
    #: and ``ra``) when this call created it (OK); 0 otherwise.
    created_at_ms: int = 0
    run_at_ms: int = 0

    @classmethod
    def from_reply(cls, flat: Sequence[Any]) -> list[EnqueueResult]:
        """Every job of ``enqueue.lua``'s flat reply, in order: the shard's now, then
        :data:`ENQUEUE_REPLY_STRIDE` entries per job, ``code, job_id, x``, where ``x`` is the
        run-at of a job made (OK: created now, scheduled when its run-at is after now), the
        state of the first job (DEDUPLICATED, CONFLICT), or the ms to retry after (the
        refusals; for STALE_MAP, the map version needed)."""
        if len(flat) % ENQUEUE_REPLY_STRIDE != 1:
            raise ValueError(
                f"an enqueue reply of {len(flat)} entries is not the shard's now and "
                f"{ENQUEUE_REPLY_STRIDE} per job"
            )
        now = int(flat[0])
        out: list[EnqueueResult] = []
        for i in range(1, len(flat), ENQUEUE_REPLY_STRIDE):
            code, job_id, x = flat[i], flat[i + 1], flat[i + 2]
            # The usual entry, a job made (RESP integers, and bytes where responses are not
            # decoded), read inline and the tuple made without the NamedTuple's __new__: the
            # helpers' and __new__'s calls were half of this, once per job of a SubmitJobs.
            if type(code) is int and code == 0 and type(job_id) is bytes and type(x) is int:
                state = JobState.SCHEDULED if x > now else JobState.READY
                out.append(_new_tuple(cls, (ItemCode.OK, job_id.decode(), state, 0, now, x)))
            else:
                out.append(cls._entry(item_code(code), _text(job_id), x, now))
        return out

    @classmethod
    def _entry(cls, code: ItemCode, job_id: str, x: Any, now: int) -> EnqueueResult:
        if code is ItemCode.OK:
            run_at = int(x)
            state = JobState.SCHEDULED if run_at > now else JobState.READY
            return cls(code, job_id, state, 0, now, run_at)
        if code in (ItemCode.DEDUPLICATED, ItemCode.CONFLICT):
            return cls(code, job_id, JobState.parse(x))
        return cls(code, job_id, JobState.UNKNOWN, int(x))

    @property
    def accepted(self) -> bool:
        return self.code in (ItemCode.OK, ItemCode.DEDUPLICATED)

    @property
    def deduplicated(self) -> bool:
        return self.code is ItemCode.DEDUPLICATED


@dataclass(frozen=True, slots=True)
class DedupeEntry:
    """The value of a dedupe key ``{prefix}:dedupe:{tenant}:{request_id}``: the first job made
    for the request_id and its digest, written by ``enqueue.lua`` as ``'<job_id> <digest>'``."""

    job_id: str
    digest: str

    @classmethod
    def from_value(cls, value: bytes) -> DedupeEntry:
        job_id, _, digest = value.decode().partition(" ")
        return cls(job_id, digest)


# --- reads: the job hash ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class JobRecord:
    """Everything the shard knows of one job: its hash (one attribute per :class:`JobField`)
    and its ID."""

    job_id: str
    tenant: str
    request_id: str
    handler: str
    payload: bytes
    priority: int
    state: JobState
    run_at_ms: int
    created_at_ms: int
    attempts: int
    max_attempts: int
    timeout_ms: int
    fence: int
    worker_id: str
    started_at_ms: int
    finished_at_ms: int
    last_error: str
    cancel_requested: bool
    queue: str
    avoid_worker_id: str
    avoid_until_ms: int
    #: The job's own retry policy (a field 0: unset); None for none.
    retry: Backoff | None = None
    #: The handler's last progress report; None until one.
    progress: JobProgress | None = None
    #: The submitter's W3C trace context as stored (``shardq.common.tracing``), '' for none.
    trace_context: str = ""
    #: Attempts handed back uncounted: the results database could not be reached (fail.lua).
    store_retries: int = 0
    #: The shard loop found a final row for its request ID ahead of its first claim
    #: (``shard/precheck.py``): that claim is looked up before it starts.
    found_done: bool = False
    #: The digest of handler and payload, at FOLDED_FORMAT; '' below it.
    digest: str = ""

    @property
    def next_attempt_at_ms(self) -> int:
        """When a job waiting for a retry (scheduled after a failed attempt) runs again;
        0 otherwise. Only a failure schedules a job that has had attempts (a requeue of a dead
        job resets them, a hand-back makes it ready)."""
        return self.run_at_ms if self.state is JobState.SCHEDULED and self.attempts else 0

    @classmethod
    def from_hash(cls, job_id: str, raw: Mapping[bytes, bytes]) -> JobRecord:
        """The record of an HGETALL of the job's hash. A field the hash lacks (one that a
        script sets only later, like ``w`` before the first claim) reads as 0, ``''`` or
        False; a missing state as ``JobState.UNKNOWN``, a missing queue as the default one."""
        h = {k.decode(): v for k, v in raw.items()}

        def i(f: JobField) -> int:
            return int(h.get(f) or 0)

        def t(f: JobField) -> str:
            return h.get(f, b"").decode()

        return cls(
            job_id=job_id,
            tenant=t(JobField.TENANT),
            request_id=t(JobField.REQUEST_ID),
            handler=t(JobField.HANDLER),
            payload=h.get(JobField.PAYLOAD, b""),
            priority=i(JobField.PRIORITY),
            state=JobState.parse(h.get(JobField.STATE)),
            run_at_ms=i(JobField.RUN_AT_MS),
            created_at_ms=i(JobField.CREATED_AT_MS),
            attempts=i(JobField.ATTEMPTS),
            max_attempts=int(h.get(JobField.MAX_ATTEMPTS) or UNSTORED_MAX_ATTEMPTS),
            timeout_ms=int(h.get(JobField.TIMEOUT_MS) or UNSTORED_TIMEOUT_MS),
            fence=i(JobField.FENCE),
            worker_id=t(JobField.WORKER_ID),
            started_at_ms=i(JobField.STARTED_AT_MS),
            finished_at_ms=i(JobField.FINISHED_AT_MS),
            last_error=t(JobField.LAST_ERROR),
            cancel_requested=h.get(JobField.CANCEL_REQUESTED) == b"1",
            queue=t(JobField.QUEUE) or DEFAULT_QUEUE,
            avoid_worker_id=t(JobField.AVOID_WORKER_ID),
            avoid_until_ms=i(JobField.AVOID_UNTIL_MS),
            retry=Backoff.parse(h.get(JobField.RETRY)),
            progress=JobProgress.parse(h.get(JobField.PROGRESS)),
            trace_context=t(JobField.TRACE_CONTEXT),
            store_retries=i(JobField.STORE_RETRIES),
            found_done=h.get(JobField.FOUND_DONE) == b"d",
            digest=t(JobField.DIGEST),
        )

    @classmethod
    def of_new(cls, job: PreparedJob, result: EnqueueResult) -> JobRecord:
        """The record of a job that ``enqueue.lua`` just created (``result.code`` OK) from
        ``job``: the hash it wrote, without reading it back (its times from the reply)."""
        return cls(
            job_id=result.job_id, tenant=job.tenant, request_id=job.request_id,
            handler=job.handler, payload=job.payload, priority=job.priority,
            state=result.state, run_at_ms=result.run_at_ms, created_at_ms=result.created_at_ms,
            attempts=0, max_attempts=job.max_attempts, timeout_ms=job.timeout_ms, fence=0,
            worker_id="", started_at_ms=0, finished_at_ms=0, last_error="",
            cancel_requested=False, queue=job.queue, avoid_worker_id="", avoid_until_ms=0,
            retry=Backoff.parse(job.retry), trace_context=job.trace_context,
        )  # fmt: skip


# --- workers: claim.lua and fail.lua -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ClaimedJob:
    """A job this worker now holds a lease on; ``fence`` must accompany every later call.

    The fields are declared in the order of ``claim.lua``'s reply, 16 entries per job
    (:data:`CLAIM_STRIDE`); :meth:`from_reply` reads them in that order.
    """

    job_id: str
    fence: int
    tenant: str
    request_id: str
    handler: str
    payload: bytes
    priority: int
    run_at_ms: int
    created_at_ms: int
    #: This attempt's number (hash field ``at`` after the claim counted it): 1 for a first run.
    attempt: int
    max_attempts: int
    timeout_ms: int
    #: The queue it was claimed from (hash field ``q``; absent means ``default``).
    queue: str
    #: When this claim started the attempt, by the shard's clock (hash field ``sa``): the
    #: started-at of its result row, comparable with ``run_at_ms`` and ``created_at_ms``.
    #: Earlier than ``run_at_ms`` for a job promoted ahead: the worker starts it on its run-at
    #: (``sa`` in Redis says so already) and counts its start from there.
    started_at_ms: int = 0
    #: The submitter's trace context (hash field ``tc``), '' for none: the worker's spans of
    #: this job join that trace (``shardq.common.tracing``).
    trace_context: str = ""
    #: A first claim (the job was never claimed before) that the shard loop did not find done
    #: ahead of its run-at (``shard/precheck.py``): the worker starts it at once and looks its
    #: row up alongside, instead of first.
    at_once: bool = False

    @classmethod
    def from_reply(cls, flat: Sequence[Any]) -> list[ClaimedJob]:
        """Every job of ``claim.lua``'s flat reply, in order."""
        if len(flat) % CLAIM_STRIDE:
            raise ValueError(f"a claim reply of {len(flat)} entries is not {CLAIM_STRIDE} per job")
        return [
            cls(
                job_id=flat[i].decode(),
                fence=int(flat[i + 1]),
                tenant=flat[i + 2].decode(),
                request_id=flat[i + 3].decode(),
                handler=flat[i + 4].decode(),
                payload=flat[i + 5],
                priority=int(flat[i + 6]),
                run_at_ms=int(flat[i + 7]),
                created_at_ms=int(flat[i + 8]),
                attempt=int(flat[i + 9]),
                max_attempts=int(flat[i + 10]),
                timeout_ms=int(flat[i + 11]),
                queue=flat[i + 12].decode(),
                started_at_ms=int(flat[i + 13]),
                trace_context=flat[i + 14].decode(),
                at_once=flat[i + 15] == b"1",
            )
            for i in range(0, len(flat), CLAIM_STRIDE)
        ]


@dataclass(frozen=True, slots=True)
class PrecheckPage:
    """One call of ``precheck.lua``: a page of some tenants' delayed jobs in a range of run-at,
    and the jobs in it that the shard loop may look up ahead of their first claim."""

    #: How many of the tenants passed were read to the end of the range: the next call starts
    #: with the tenant after them ...
    tenants_done: int
    #: ... passing over this many entries of its range (read by this call).
    offset: int
    #: (job_id, tenant, request_id) of each job never claimed and not looked up yet.
    jobs: list[tuple[str, str, str]]

    @classmethod
    def from_reply(cls, reply: Sequence[Any]) -> PrecheckPage:
        rest = reply[2:]
        jobs = [
            (rest[i].decode(), rest[i + 1].decode(), rest[i + 2].decode())
            for i in range(0, len(rest), 3)
        ]
        return cls(int(reply[0]), int(reply[1]), jobs)


#: ``claim.lua``'s reply per job, in order: the fields of :class:`ClaimedJob`.
CLAIM_REPLY: Final = tuple(f.name for f in fields(ClaimedJob))
CLAIM_STRIDE: Final = len(CLAIM_REPLY)


@dataclass(frozen=True, slots=True)
class FailResult:
    """``fail.lua``'s answer for one job: ``{code, state}``."""

    code: ItemCode
    state: JobState

    @classmethod
    def from_reply(cls, row: Sequence[Any]) -> FailResult:
        code, state = row
        return cls(item_code(code), JobState.parse(state))
