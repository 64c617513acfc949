"""The typed Python API over one shard's Redis: the only way shardq code touches shard data.

Every state change is one Lua script (``shard/lua/``); reads are plain commands. Methods take
batches where the hot path needs them (enqueue, claim, heartbeat, ack, fail), because one
round trip per job per step caps a process at ~10k jobs/s. Inputs are checked before anything
is sent, so bad input raises :class:`~shard.errors.InvalidArgument` and writes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import math
import random
from collections.abc import Mapping, Sequence
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisError, ResponseError

from shardq.common import validation
from shardq.common.clock import Clock, SystemClock
from shardq.common.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
)
from shardq.common.ids import new_job_id
from shardq.common.redis import NotReplicated, Packed, pack, packs_ahead
from shardq.common.validation import MAX_PRIORITY, MIN_PRIORITY
from shardq.shard import cron
from shardq.shard.backoff import Backoff, job_backoff
from shardq.shard.codes import ItemCode, item_code
from shardq.shard.keys import Keys
from shardq.shard.models import (
    DueTick,
    Failure,
    JobPage,
    Lease,
    NewJob,
    Paused,
    PauseSummary,
    Schedule,
    ScheduleSpec,
    ShardSettings,
    TenantCounts,
    TenantLimits,
    TenantLoad,
)
from shardq.shard.records import (
    DEFAULT_QUEUE,
    JOB_FORMAT,
    ClaimedJob,
    DedupeEntry,
    EnqueueResult,
    FailResult,
    JobField,
    JobProgress,
    JobRecord,
    JobState,
    PrecheckPage,
    PreparedJob,
    derived_job_id,
    limit_defaults,
)
from shardq.shard.scripts import register_all

#: The states ``list_jobs`` lists (finished jobs are read one by one, by ID).
LISTABLE_STATES = (JobState.SCHEDULED, JobState.READY, JobState.ACTIVE, JobState.DEAD)
#: Most queues one claim (or one wait for work) names.
MAX_CLAIM_QUEUES = 100
#: Largest count Lua's numbers (doubles) hold exactly: pending jobs and bytes.
MAX_COUNT = 2**53
MAX_UINT32 = 2**32 - 1
MAX_WEIGHT = 1000
#: Scripts not followed by WAIT under ``ShardSettings.durability``: a heartbeat or the loop's
#: lease that a failover loses only shortens a lease (a re-delivery, fenced: the running
#: worker's next heartbeat is refused) or re-elects a leader, and they are the frequent calls.
#: Claims are waited for (``ShardClient.claim``): the fencing counter they raise must survive
#: a failover, or the promoted replica hands the same (job, token) to a second worker.
#: A precheck mark lost with a failover only costs the worker a lookup: not worth a WAIT.
NOT_WAITED = frozenset({"heartbeat", "leader", "leader_release", "precheck", "prechecked"})
#: The fields of the limits:{t} hash, in the order of TenantLimits' fields (result_retention_s
#: aside: Postgres' purge reads it from the tenant's row, the shard has no use for it).
LIMIT_FIELDS = (
    "weight", "max_active", "rate", "burst", "max_pending", "max_pending_bytes", "dedupe",
)  # fmt: skip
#: Shortest dedupe window a tenant may be given, in s: longer than a client's retries of one
#: submit take (``shardq.client.RetryPolicy``'s default budget is 20 s), so a retry after a
#: lost reply still finds the first job instead of making a second one.
MIN_DEDUPE_WINDOW_S = 30
#: Longest, in s (7 days): each accepted job holds a dedupe key for the window, ~200 bytes of
#: Redis (measured: docs/queues-and-limits.md), so at 1,000 jobs/s a week is ~120 GB, more
#: than a shard should hold for idempotency alone; past that, the result row (one per
#: request_id, kept for result_retention_s) is the record that keeps a handler from running
#: twice (docs/guarantees.md).
MAX_DEDUPE_WINDOW_S = 7 * 86_400
#: Longest result retention, in s (100 years: "forever" by another name, still a valid interval).
MAX_RETENTION_S = 100 * 365 * 86_400


def _s(value: bytes | str | None) -> str:
    if value is None:
        return ""
    return value.decode() if isinstance(value, bytes) else value


def digest(handler: str, payload: bytes) -> str:
    """What makes two submits of one request_id "the same job"."""
    h = hashlib.blake2b(handler.encode(), digest_size=8)
    h.update(b"\0")
    h.update(payload)
    return h.hexdigest()


class Row:
    """The pieces of one caller's enqueue (the coordinator's SubmitJobs call alone on its
    process: ``JobService._submit_alone``), sent to the shard one after another on one
    connection, each as soon as it is packed, and their replies read in the same order.
    Redis runs one connection's commands in the order they come, so the jobs land in the
    caller's order, the scripts back to back, while the caller prepares the next pieces and
    reads the replies of the last. The caller closes the row when its pieces are done.

    Pieces sent on connections of their own could run out of order (one still opening, or a
    large one read by Redis in parts): ``tests/integration/test_submit_pieces.py``. Where the
    shard has lost its scripts, each piece is refused and run again after the load, and one
    may then follow the piece after it, which Redis ran once the script was there."""

    def __init__(self, pieces: int) -> None:
        self.sent = [asyncio.Event() for _ in range(pieces)]
        self.read = [asyncio.Event() for _ in range(pieces)]
        self.client: ShardClient | None = None  # the shard of the first piece sent
        self.conn: Any = None
        self.unread = 0  # pieces sent on the connection whose replies are not read yet
        self.broken = False

    def turns(self) -> list[Turn]:
        return [Turn(self, k) for k in range(len(self.sent))]

    async def _fail(self) -> None:
        """A piece failed between a send and its reply: the connection is out of step and
        is dropped, and the pieces after it fail too."""
        self.broken = True
        if self.conn is not None:
            await self.conn.disconnect(nowait=True)
        for event in (*self.sent, *self.read):
            event.set()

    async def close(self) -> None:
        """Give the connection back (dropped if a reply may be left unread on it)."""
        conn, self.conn = self.conn, None
        if conn is None or self.client is None:
            return
        if self.unread:
            await conn.disconnect(nowait=True)
        await self.client.redis.connection_pool.release(conn)


class Turn:
    """One piece's place in a :class:`Row`."""

    def __init__(self, row: Row, k: int) -> None:
        self.row, self.k = row, k

    async def wait_before(self) -> None:
        """Until the pieces before this one are answered (a piece sent otherwise than on the
        row's connection, which then passes its place on with :meth:`skip`)."""
        if self.k:
            await self.row.read[self.k - 1].wait()
        if self.row.broken:
            raise RedisConnectionError("an earlier piece of this enqueue failed")

    def skip(self) -> None:
        """Nothing of this piece was sent (its jobs were answered without a script), or it
        has been: the pieces after it need not wait for it."""
        self.row.sent[self.k].set()
        self.row.read[self.k].set()

    async def run(self, client: ShardClient, name: str, command: Packed) -> Any:
        """``command`` (``name``'s EVALSHA, packed) sent in this piece's place, its reply."""
        row, k = self.row, self.k
        if k:
            await row.sent[k - 1].wait()
        if row.client is not None and row.client is not client:
            # Routed to another shard than the pieces before it (the shard map changed under
            # the call): after them, on a connection of its own.
            await self.wait_before()
            try:
                return await client._run_packed(name, command)
            finally:
                self.skip()
        await self._send(client, command)
        await self.wait_before()
        return await self._read(client, name, command)

    async def _send(self, client: ShardClient, command: Packed) -> None:
        row = self.row
        if row.broken:
            raise RedisConnectionError("an earlier piece of this enqueue failed")
        try:
            if row.conn is None:
                pool: Any = client.redis.connection_pool  # (get_connection is untyped)
                row.client, row.conn = client, await pool.get_connection()
            # A health check reads its PING's reply: not while a piece's reply is unread.
            await row.conn.send_packed_command(command, check_health=row.unread == 0)
            row.unread += 1
        except BaseException:
            await row._fail()
            raise
        row.sent[self.k].set()

    async def _read(self, client: ShardClient, name: str, command: Packed) -> Any:
        row = self.row
        try:
            reply = await row.conn.read_response()
        except ResponseError as exc:  # a reply read whole: the connection is still in step
            row.unread -= 1
            if not isinstance(exc, NoScriptError):
                raise
            # Loaded, and run again on a connection of its own, before the next piece's reply
            # is read (which, sent before the load, is refused too).
            return await client._run_packed(name, command)
        except BaseException:
            await row._fail()
            raise
        else:
            row.unread -= 1
            return reply
        finally:
            row.read[self.k].set()


class ShardClient:
    """One shard's data plane. Safe to share between tasks of one event loop."""

    def __init__(
        self,
        redis: Redis,
        settings: ShardSettings | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.redis = redis
        # redis-py's annotations say "bytes | str" for every reply whatever decode_responses
        # is; this client always works in bytes, so replies are read through an untyped alias.
        self._r: Any = redis
        self.settings = settings or ShardSettings()
        self.clock = clock or SystemClock()
        #: On the system clock, scripts read the shard's own (Redis TIME): every time a job
        #: records and every lease deadline come from one clock, whichever process called.
        #: A FakeClock (tests) is passed to them instead, so tests drive time.
        self.shard_time = isinstance(self.clock, SystemClock)
        self.keys = Keys(self.settings.key_prefix)
        self._scripts = register_all(redis)
        self._base = self.keys.base()
        self._packs_ahead = packs_ahead(redis)
        self._last_limits: tuple[TenantLimits, str] | None = None

    def _waited(self, name: str) -> bool:
        """Whether a call of script ``name`` waits for replicas after its write."""
        return bool(self.settings.durability.replicas) and name not in NOT_WAITED

    async def _run(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        if not self._waited(name):
            return await self._scripts[name](keys=[self._base, *keys], args=list(args))
        return await self._pipelined(name, keys, args)

    async def _pipelined(
        self, name: str, keys: Sequence[str], args: Sequence[Any], first: Sequence[Any] = ()
    ) -> Any:
        """The script in one round trip after the command ``first`` (none: ``()``), and where
        writes wait for replicas, WAIT (or WAITAOF) after it: a call whose write fewer
        replicas confirm raises NotReplicated, and is not acknowledged."""
        script = self._scripts[name]
        keys = [self._base, *keys]
        replicated = self._waited(name)
        for _ in range(2):
            pipe = self._r.pipeline(transaction=False)
            if first:
                pipe.execute_command(*first)
            pipe.evalsha(script.sha, len(keys), *keys, *args)
            if replicated:
                pipe.incr(self.keys.wait_mark())  # so the WAIT below waits for everything
                pipe.execute_command(*self.settings.durability.command())
            replies = await pipe.execute(raise_on_error=False)
            if first:
                if isinstance(replies[0], Exception):
                    raise replies[0]
                replies, first = replies[1:], ()  # done: a reload below does not run it again
            reply = replies[0]
            if isinstance(reply, NoScriptError):  # a restarted or flushed Redis: load, again
                await self._r.script_load(script.script)
                continue
            # Errors come back as values here, past the pool's shard tagging: those that
            # mean "not replicated" must still reach the caller as retryable (UNAVAILABLE).
            if isinstance(reply, ResponseError) and str(reply).startswith("NOREPLICAS"):
                raise NotReplicated(f"the shard refused the write: {reply}") from reply
            if isinstance(reply, Exception):
                raise reply
            if not replicated:
                return reply
            waited = replies[2]
            try:
                if isinstance(waited, Exception):
                    raise NotReplicated(f"the wait for the shard's replicas failed: {waited}")
                self.settings.durability.check(waited)
            except NotReplicated as exc:
                exc.reply = reply  # applied by the primary: the caller may have to undo it
                raise
            return reply
        raise NoScriptError(f"script {name} was flushed again as it was loaded")

    async def wait_for_replicas(self) -> None:
        """Where writes wait for replicas (``ShardSettings.durability``), wait until they hold
        every write the primary has, as after a script; NotReplicated when too few confirm.
        For writes made outside the scripts (the identity marker: ``shard/moving.py``)."""
        if not self.settings.durability.replicas:
            return
        pipe = self._r.pipeline(transaction=False)
        pipe.incr(self.keys.wait_mark())  # a write of this connection: the WAIT covers all
        pipe.execute_command(*self.settings.durability.command())
        marked, waited = await pipe.execute(raise_on_error=False)
        if isinstance(marked, ResponseError) and str(marked).startswith("NOREPLICAS"):
            raise NotReplicated(f"the shard refused the write: {marked}") from marked
        if isinstance(marked, Exception):
            raise marked
        if isinstance(waited, Exception):
            raise NotReplicated(f"the wait for the shard's replicas failed: {waited}")
        self.settings.durability.check(waited)

    def _now_arg(self) -> int:
        """A script's now_ms ARGV: 0 (read Redis TIME, see ``shard_now`` in lua/_lib.lua) on
        the system clock, else the (fake) clock's now."""
        return 0 if self.shard_time else self.clock.now_ms()

    # --- submit -------------------------------------------------------------------------

    def prepare(self, job: NewJob, now_ms: int | None = None) -> PreparedJob:
        """Check one job and complete it (job ID, run-at, defaults, digest) for ``enqueue.lua``.

        A delay (or no time: due at once) is left for ``enqueue.lua`` to add to the shard's
        clock. ``now_ms`` (this client's clock) only bounds ``run_at_ms`` and ``delay_ms`` by
        the schedule horizon, which is therefore approximate by the skew between the two.
        """
        s = self.settings
        now = self.clock.now_ms() if now_ms is None else now_ms
        # Each check's usual case (a valid value) is tested here and its function called only
        # to say why a value is not valid (or to take one of a subtype): a call or two per
        # field were a third of this method's time, once per submitted job.
        tenant, handler, rid = job.tenant, job.handler, job.request_id
        validation.names(tenant, handler, rid)
        payload = job.payload
        if type(payload) is not bytes or len(payload) > s.max_payload_bytes:
            payload = validation.payload(payload, s.max_payload_bytes)
        prio = job.priority
        if type(prio) is not int or not MIN_PRIORITY <= prio <= MAX_PRIORITY:
            prio = validation.priority(prio)
        queue = job.queue
        if queue != DEFAULT_QUEUE:
            queue = validation.queue(queue)
        if job.job_id:
            validation.job_id(job.job_id)
        run_at: int | None = None
        delay = 0
        if job.delay_ms is not None:
            if job.run_at_ms is not None:
                raise InvalidArgument("give run_at_ms or delay_ms, not both", field="delay_ms")
            delay = validation.int_in_range(job.delay_ms, 0, s.max_schedule_horizon_ms, "delay_ms")
        elif job.run_at_ms is not None:
            run_at = validation.int_in_range(
                job.run_at_ms, 0, now + s.max_schedule_horizon_ms, "run_at_ms"
            )
        attempts = job.max_attempts
        if type(attempts) is not int or not 0 <= attempts <= validation.MAX_ATTEMPTS_LIMIT:
            attempts = validation.int_in_range(
                attempts, 0, validation.MAX_ATTEMPTS_LIMIT, "max_attempts"
            )
        timeout = job.timeout_ms
        if type(timeout) is not int or not 0 <= timeout <= validation.MAX_TIMEOUT_MS:
            timeout = validation.int_in_range(timeout, 0, validation.MAX_TIMEOUT_MS, "timeout_ms")
        # Positional, in PreparedJob's order: keywords cost a NamedTuple a lookup each.
        return PreparedJob(
            tenant,
            job.job_id or new_job_id(now),
            rid,
            handler,
            payload,
            prio,
            run_at,
            delay,
            attempts or s.default_max_attempts,
            timeout or s.default_timeout_ms,
            digest(handler, payload),
            queue,
            self._checked(job.limits),
            "" if job.retry is None else _retry_arg(job.retry),
            job.trace_context,
        )

    def _checked(self, limits: TenantLimits) -> str:
        """``limits`` checked and encoded as ``PreparedJob.limit_defaults``, remembered for
        the last object seen: the coordinator gives every job of a tenant the same (frozen)
        defaults, and checking them per job was a third of the cost of ``prepare``."""
        if self._last_limits is None or self._last_limits[0] is not limits:
            ok = check_limits(limits)
            encoded = limit_defaults(
                ok.max_pending, ok.max_pending_bytes, ok.submit_rate_per_s, ok.submit_burst
            )
            self._last_limits = (limits, encoded)
        return self._last_limits[1]

    async def enqueue(self, jobs: Sequence[NewJob]) -> list[EnqueueResult]:
        """Enqueue jobs (any tenants of this shard); one result per job, in order.

        Every job is checked before any is written: one bad job fails the call and writes
        nothing. Refusals that depend on state (dedupe conflict, quota, rate) come back per job:
        each job's ``limits`` are the defaults for what the tenant's limits on this shard
        (:meth:`set_limits`) do not set.
        """
        now = self.clock.now_ms()
        prepared = [self.prepare(j, now) for j in jobs]
        return await self.enqueue_prepared(prepared, now)

    async def enqueue_prepared(
        self,
        prepared: Sequence[PreparedJob],
        now_ms: int | None = None,
        map_version: int = 0,
        turn: Turn | None = None,
    ) -> list[EnqueueResult]:
        """Enqueue jobs already checked by :meth:`prepare`, in batches of ``max_batch``.

        ``map_version`` is the shard-map version the caller routed with (the coordinator's);
        below the shard's map fence every job comes back STALE_MAP. 0, for callers that do
        not route by the map (the shard's own loop), is never refused.

        ``now_ms`` is the created-at given to the jobs by a client on a FakeClock (default:
        its now); on the system clock the shard's clock stamps them and it is not used.

        ``turn``: these jobs are a piece of a :class:`Row`, sent in its place there.
        """
        now = self._now_arg() if now_ms is None or self.shard_time else now_ms
        step = self.settings.max_batch
        calls: list[list[Any]] = []
        for i in range(0, len(prepared), step):
            args: list[Any] = [now, self.settings.dedupe_ttl_ms, map_version]
            for job in prepared[i : i + step]:
                args.extend(job.to_argv())
            calls.append(args)
        if turn is not None and len(calls) == 1 and self.streams:
            command = pack("EVALSHA", self._scripts["enqueue"].sha, 1, self._base, *calls[0])
            return EnqueueResult.from_reply(await turn.run(self, "enqueue", command))
        if turn is not None:  # in its place, on connections of their own
            await turn.wait_before()
        try:
            replies = [await self._run("enqueue", [], args) for args in calls]
        finally:
            if turn is not None:
                turn.skip()
        return [res for reply in replies for res in EnqueueResult.from_reply(reply)]

    @property
    def streams(self) -> bool:
        """Whether a :class:`Row`'s pieces can share a connection here: commands packed
        ahead are sent as they are, and no script call waits for replicas (a WAIT)."""
        return self._packs_ahead and not self._waited("enqueue")

    async def _run_packed(self, name: str, command: Packed) -> Any:
        """A script's EVALSHA packed ahead (:func:`shardq.common.redis.pack`); loaded first
        where Redis has not got it (restarted or flushed), as redis-py's scripts do."""
        try:
            return await self._r.execute_command("EVALSHA", command)
        except NoScriptError:
            await self._r.script_load(self._scripts[name].script)
            return await self._r.execute_command("EVALSHA", command)

    async def submit(self, job: NewJob) -> EnqueueResult:
        """Enqueue one job and raise on refusal (AlreadyExists, ResourceExhausted)."""
        (res,) = await self.enqueue([job])
        raise_for_enqueue(res)
        return res

    # --- the shard loop ---------------------------------------------------------------

    async def promote(self, limit: int | None = None, ahead_ms: int = 0) -> tuple[int, int | None]:
        """Move due jobs to ready, in capped batches until none is due; with ``ahead_ms``,
        also those due within that long (their workers wait for their run-at: see
        ``promote.lua``).

        Returns (jobs taken off the delayed set, next due time in unix ms or None). Due is
        decided by the shard's clock; the next due time is told by this client's clock (the
        shard's, moved by their difference), so that a caller sleeping until it by its own
        clock wakes when the shard finds the job due, however the two clocks differ.
        """
        limit = limit or self.settings.max_batch
        total = 0
        while True:
            taken, next_due, shard_now = await self._run(
                "promote", [], [self._now_arg(), limit, ahead_ms]
            )
            total += int(taken)
            if int(taken) < limit:
                if int(next_due) < 0:
                    return total, None
                return total, int(next_due) - int(shard_now) + self.clock.now_ms()

    async def due_tenants(self, until_ms: int) -> list[str]:
        """The tenants that may have a job due by ``until_ms`` (those on ``due`` by then)."""
        names = await self._r.zrange(self.keys.due(), "-inf", until_ms, byscore=True)
        return [n.decode() for n in names]

    async def precheck_page(
        self,
        from_ms: int,
        until_ms: int,
        tenants: Sequence[str],
        offset: int = 0,
        limit: int | None = None,
    ) -> PrecheckPage:
        """The tenants' delayed jobs due in [from_ms, until_ms] (after ``offset`` of the first
        tenant's) never claimed nor marked yet: ``precheck.lua``."""
        limit = limit or self.settings.max_batch
        reply = await self._run("precheck", [], [from_ms, until_ms, limit, offset, *tenants])
        return PrecheckPage.from_reply(reply)

    async def mark_prechecked(self, job_ids: Sequence[str]) -> int:
        """Mark jobs found with a final row (``prechecked.lua``): their first claim tells the
        worker to look the row up before it starts them. Returns how many were still never
        claimed, and so marked."""
        marked = 0
        step = self.settings.max_batch
        for i in range(0, len(job_ids), step):
            marked += int(await self._run("prechecked", [], list(job_ids[i : i + step])))
        return marked

    async def reap(self, limit: int | None = None) -> tuple[int, int]:
        """Take back expired leases until none is left: (back to ready, to dead)."""
        limit = limit or self.settings.max_batch
        ready = dead = 0
        while True:
            taken, to_ready, to_dead = await self._run(
                "reap",
                [self.keys.leases()],
                [self._now_arg(), limit, self.settings.retention_ms, self.settings.dedupe_ttl_ms],
            )
            ready += int(to_ready)
            dead += int(to_dead)
            if int(taken) < limit:
                return ready, dead

    async def next_due_ms(self) -> int | None:
        """The first score on ``due``: the earliest run-at of a scheduled job, or earlier (a
        tenant's score is a lower bound until promote sets it right)."""
        first = await self._r.zrange(self.keys.due(), 0, 0, withscores=True)
        return int(first[0][1]) if first else None

    async def next_cron_tick_ms(self) -> int | None:
        first = await self._r.zrange(self.keys.cron(), 0, 0, withscores=True)
        return int(first[0][1]) if first else None

    async def wait_for_promoter_wake(self, timeout_s: float) -> bool:
        """Block until an earlier job is scheduled (True) or the timeout passes (False)."""
        return await self._r.blpop([self.keys.promoter_wake()], timeout_s) is not None

    async def acquire_leader(self, instance_id: str, ttl_ms: int) -> bool:
        return bool(await self._run("leader", [self.keys.leader()], [instance_id, ttl_ms]))

    async def release_leader(self, instance_id: str) -> bool:
        return bool(await self._run("leader_release", [self.keys.leader()], [instance_id]))

    # --- workers ---------------------------------------------------------------------

    async def claim(
        self,
        worker_id: str,
        max_jobs: int,
        lease_ms: int,
        queues: Sequence[str] = (DEFAULT_QUEUE,),
        wait_s: float = 0,
    ) -> list[ClaimedJob]:
        """Claim up to ``max_jobs`` ready jobs of ``queues`` under leases of ``lease_ms``.

        One job from each queue in turn, starting with the first (a caller serving several
        queues rotates their order between calls, so that none is always first); in a queue,
        tenants take turns (weighted), then the tenant's highest priority, then FIFO. Paused
        queues and tenants, tenants at their ``max_active``, and jobs this worker handed back
        for want of their handler (:meth:`release` with ``avoid_ms``) are passed over.

        With ``wait_s`` > 0, first wait as :meth:`wait_for_work` does, up to ``wait_s``, and
        claim as that wait ends, in the same round trip: Redis runs the claim queued behind
        the BLPOP as soon as a wake-up token unblocks it (or the wait times out), and the
        jobs come back with no second trip. For a caller that found nothing ready.
        """
        validation.worker_id(worker_id)
        validation.int_in_range(max_jobs, 1, self.settings.max_batch, "max_jobs")
        validation.int_in_range(lease_ms, 1, validation.MAX_TIMEOUT_MS, "lease_ms")
        names = _queue_list(queues)
        k = self.keys
        # Where writes wait for replicas, a claim waits too (in _run), and its jobs are given
        # to the worker only once a replica holds the claim: the fencing tokens it took are
        # then ones a promoted replica will not hand out again. (A token made unique per
        # primary instead, say with its replication ID, needs the primary change itself
        # replicated before its first token; that is this WAIT again, once per primary, with
        # more moving parts; and claims are batched, one WAIT per batch.)
        keys = [k.fence(), k.leases()]
        args = [self._now_arg(), lease_ms, max_jobs, worker_id, *names]
        try:
            if wait_s > 0:
                wait = ["BLPOP", *(k.wake(q) for q in names), wait_s]
                flat = await self._pipelined("claim", keys, args, wait)
            else:
                flat = await self._run("claim", keys, args)
        except NotReplicated as exc:
            if exc.reply:
                await self._give_back(ClaimedJob.from_reply(exc.reply))
            raise
        return ClaimedJob.from_reply(flat)

    async def _give_back(self, jobs: Sequence[ClaimedJob]) -> None:
        """Best effort: hand back, uncounted, jobs claimed on a primary whose replicas did not
        confirm the claim (the worker will not run them). The release is applied by that
        primary even if its replicas do not confirm it either; if it fails, the leases expire
        and the reaper hands the jobs out again, as after a worker's crash."""
        with contextlib.suppress(RedisError):
            await self.release([Lease(j.job_id, j.fence) for j in jobs])

    async def wait_for_work(
        self, timeout_s: float, queues: Sequence[str] = (DEFAULT_QUEUE,)
    ) -> bool:
        """Block until a job of ``queues`` may be ready (True) or the timeout passes (False).

        No polling: a BLPOP on the queues' wake-up lists, which enqueue, promote, reap,
        release, requeue, resume and un-parking push to.
        """
        names = _queue_list(queues)
        return await self._r.blpop([self.keys.wake(q) for q in names], timeout_s) is not None

    @staticmethod
    def _lease_args(leases: Sequence[Lease]) -> list[Any]:
        args: list[Any] = []
        for lease in leases:
            args += [lease.job_id, lease.fence]
        return args

    async def heartbeat(
        self,
        leases: Sequence[Lease],
        lease_ms: int,
        progress: Mapping[str, JobProgress] | None = None,
    ) -> list[ItemCode]:
        """Extend leases in one round trip: OK, CANCEL_REQUESTED or STALE_LEASE per lease.

        ``progress`` (by job ID) is stored on the jobs whose lease is still current, with the
        shard's time; a stale lease stores nothing."""
        if not leases:
            return []
        validation.int_in_range(lease_ms, 1, validation.MAX_TIMEOUT_MS, "lease_ms")
        progress = progress or {}
        args: list[Any] = [self._now_arg(), lease_ms]
        for lease in leases:
            p = progress.get(lease.job_id)
            args += [lease.job_id, lease.fence, "" if p is None else p.to_arg()]
        codes = await self._run("heartbeat", [self.keys.leases()], args)
        return [item_code(c) for c in codes]

    async def ack(self, leases: Sequence[Lease]) -> list[ItemCode]:
        """Finish jobs whose results are committed: OK, CANCELLED or STALE_LEASE per lease."""
        if not leases:
            return []
        codes = await self._run(
            "ack",
            [],
            [
                self._now_arg(),
                self.settings.retention_ms,
                self.settings.dedupe_ttl_ms,
                *self._lease_args(leases),
            ],
        )
        return [item_code(c) for c in codes]

    async def release(self, leases: Sequence[Lease], avoid_ms: int = 0) -> list[ItemCode]:
        """Hand jobs back to ready at once, their attempt not counted: OK, CANCELLED (a cancel
        was requested: the job ends cancelled) or STALE_LEASE per lease.

        ``avoid_ms`` 0: a worker shutting down; any worker may claim them again. Above 0: the
        worker that held each job lacks its handler; it may not claim the job again for that
        long (another worker takes it), and the tenant's ``unrunnable`` counter grows.
        """
        validation.int_in_range(avoid_ms, 0, validation.MAX_TIMEOUT_MS, "avoid_ms")
        if not leases:
            return []
        args = [self._now_arg(), self.settings.retention_ms, avoid_ms, self.settings.dedupe_ttl_ms]
        codes = await self._run("release", [], args + self._lease_args(leases))
        return [item_code(c) for c in codes]

    async def fail(self, failures: Sequence[Failure]) -> list[FailResult]:
        """Record failed attempts: retry after backoff, or dead when attempts are used up.

        A retry's run-at is the shard's now plus the wait ``fail.lua`` computes from the job's
        own policy over ``f.backoff`` (shard/backoff.py); a ``retry_at_ms`` given (by this
        client's clock) is sent as the wait from this client's now. A failure with
        ``store_retries_max`` is handed back without counting the attempt while the job has
        had fewer uncounted ones; one that ends dead so goes to the outbox (its worker, which
        could not reach the results database, writes no row for it).
        """
        if not failures:
            return []
        now = self.clock.now_ms()
        args: list[Any] = [self._now_arg(), self.settings.retention_ms, self.settings.dedupe_ttl_ms]
        default = self.settings.backoff.to_arg()
        for f in failures:
            retry_in = -1 if f.retry_at_ms is None else max(0, f.retry_at_ms - now)
            policy = default if f.backoff is None else f.backoff.to_arg()
            # The jitter's one random draw (fail.lua is deterministic).
            draw = random.random() if f.draw is None else f.draw
            args += [f.job_id, f.fence, f.error[:4096], retry_in, int(f.permanent), policy, draw]
            args.append(f.store_retries_max)
        rows = await self._run("fail", [], args)
        return [FailResult.from_reply(row) for row in rows]

    # --- tenants ----------------------------------------------------------------------

    async def cancel(self, tenant: str, job_id: str) -> tuple[ItemCode, JobState]:
        """Cancel a job: (OK, 'cancelled'), (CANCEL_REQUESTED, 'active'), or (MOVING, state)
        while its tenant's move is copying it to the target shard.

        Raises NotFound (no such job of this tenant) or FailedPrecondition (already final).
        """
        validation.tenant_id(tenant)
        validation.job_id(job_id)
        code, state = await self._run(
            "cancel",
            [],
            [
                tenant,
                job_id,
                self._now_arg(),
                self.settings.retention_ms,
                self.settings.dedupe_ttl_ms,
            ],
        )
        code = item_code(code)
        if code is ItemCode.NOT_FOUND:
            raise NotFound(f"no job {job_id}", field="job_id")
        if code is ItemCode.ALREADY_TERMINAL:
            raise FailedPrecondition(f"job {job_id} is already {_s(state)}", field="job_id")
        return code, JobState.parse(state)

    async def requeue_dead(self, tenant: str, job_ids: Sequence[str]) -> tuple[int, list[str]]:
        """Dead jobs back to ready with fresh attempts: (requeued, IDs that were not dead)."""
        validation.tenant_id(tenant)
        for jid in job_ids:
            validation.job_id(jid)
        requeued, missing = 0, []
        step = self.settings.max_batch
        for i in range(0, len(job_ids), step):
            n, miss = await self._run(
                "requeue", [self.keys.dead(tenant)], [tenant, *job_ids[i : i + step]]
            )
            requeued += int(n)
            missing += [_s(m) for m in miss]
        return requeued, missing

    async def get_job(self, tenant: str, job_id: str) -> JobRecord:
        """One job of this tenant; NotFound for another tenant's job, as for a missing one."""
        validation.tenant_id(tenant)
        validation.job_id(job_id)
        raw = await self._r.hgetall(self.keys.job(job_id))
        rec = JobRecord.from_hash(job_id, raw) if raw else None
        if rec is None or rec.tenant != tenant:
            raise NotFound(f"no job {job_id}", field="job_id")
        return rec

    # --- result rows the shard loop writes (shard/rows.py) ---------------------------------

    async def outbox(self, limit: int) -> list[tuple[str, int]]:
        """The oldest ``limit`` jobs waiting for their result row: (job ID, score in ms)."""
        raw = await self._r.zrange(self.keys.outbox(), 0, limit - 1, withscores=True)
        return [(_s(m), int(score)) for m, score in raw]

    async def outbox_depth(self) -> int:
        return int(await self._r.zcard(self.keys.outbox()))

    async def in_outbox(self, job_ids: Sequence[str]) -> set[str]:
        """Those of ``job_ids`` that wait on the outbox."""
        if not job_ids:
            return set()
        scores = await self._r.zmscore(self.keys.outbox(), list(job_ids))
        return {j for j, sc in zip(job_ids, scores, strict=True) if sc is not None}

    async def records(self, job_ids: Sequence[str]) -> list[JobRecord]:
        """The jobs of ``job_ids`` that still have a hash, in order (any tenant)."""
        return await self._records(job_ids) if job_ids else []

    async def dead_ids(self, tenant: str, offset: int, limit: int) -> list[str]:
        """A page of a tenant's dead job IDs, oldest death first."""
        ids = await self._r.zrange(self.keys.dead(tenant), offset, offset + limit - 1)
        return [_s(m) for m in ids]

    async def rows_written(self, items: Sequence[tuple[str, int | None, str]]) -> list[bool]:
        """After the rows of ``items`` (job ID, outbox score or None, the row's status) are
        committed: off the outbox (unless put back since), and Redis takes the row's status
        where it differs (``rows_written.lua``). One flag per item: Redis changed."""
        out: list[bool] = []
        step = self.settings.max_batch
        for i in range(0, len(items), step):
            args: list[Any] = [self.settings.retention_ms]
            for job_id, score, status in items[i : i + step]:
                args += [job_id, "" if score is None else score, status]
            out += [bool(int(f)) for f in await self._run("rows_written", [], args)]
        return out

    async def dedupe_entries(
        self, tenant: str, request_ids: Sequence[str]
    ) -> list[DedupeEntry | None]:
        """Per request_id: the first job submitted with it within the dedupe window, or None.
        Its dedupe key says (written at submit, or at its end at FOLDED_FORMAT), else a hash
        at its derived ID (``derived_job_id``: a job of FOLDED_FORMAT, live or retained)."""
        validation.tenant_id(tenant)
        for request_id in request_ids:
            validation.request_id(request_id)
        if not request_ids:
            return []
        ids = [derived_job_id(tenant, request_id) for request_id in request_ids]
        pipe = self._r.pipeline(transaction=False)
        pipe.mget([self.keys.dedupe(tenant, request_id) for request_id in request_ids])
        for job_id in ids:
            pipe.hget(self.keys.job(job_id), JobField.DIGEST)
        values, *digests = await pipe.execute()
        out: list[DedupeEntry | None] = []
        for value, job_id, d in zip(values, ids, digests, strict=True):
            if value is not None:
                out.append(DedupeEntry.from_value(value))
            else:
                out.append(DedupeEntry(job_id, d.decode()) if d else None)
        return out

    async def counts(self, tenant: str) -> TenantCounts:
        validation.tenant_id(tenant)
        raw = await self._r.hgetall(self.keys.counts(tenant))
        values = {k.decode(): int(v) for k, v in raw.items()}
        return TenantCounts(**{k: v for k, v in values.items() if k in TenantCounts.__slots__})

    async def tenants(self) -> list[str]:
        return sorted(m.decode() for m in await self._r.smembers(self.keys.tenants()))

    # --- load per tenant (rates sampled by the shard loop, see shard/load.py) -------------

    async def load_rows(
        self, tenants: Sequence[str] | None = None
    ) -> list[tuple[str, dict[str, int], dict[str, Any]]]:
        """(tenant, counts hash, last load sample) of the given tenants, else of every tenant.

        Read in pipelined chunks of ``max_batch`` tenants, one round trip each, so a shard
        with thousands of tenants costs a few round trips, not thousands. An unreadable
        sample counts as none (the sampler then starts the tenant afresh).
        """
        names = list(tenants) if tenants is not None else await self.tenants()
        rows: list[tuple[str, dict[str, int], dict[str, Any]]] = []
        step = self.settings.max_batch
        for i in range(0, len(names), step):
            chunk = names[i : i + step]
            pipe = self._r.pipeline(transaction=False)
            for tenant in chunk:
                pipe.hgetall(self.keys.counts(tenant))
            pipe.hmget(self.keys.load(), chunk)
            *counts, samples = await pipe.execute()
            for tenant, raw, sample in zip(chunk, counts, samples, strict=True):
                try:
                    parsed = json.loads(sample) if sample else {}
                except ValueError:
                    parsed = {}
                rows.append(
                    (
                        tenant,
                        {k.decode(): int(v) for k, v in raw.items()},
                        parsed if isinstance(parsed, dict) else {},
                    )
                )
        return rows

    async def tenant_loads(self) -> dict[str, TenantLoad]:
        """Every tenant of this shard with its gauges now and its last sampled rates."""
        return {t: TenantLoad.of(t, c, s) for t, c, s in await self.load_rows()}

    async def tenant_load(self, tenant: str) -> TenantLoad:
        """One tenant's load; all zeros for a tenant this shard does not know."""
        validation.tenant_id(tenant)
        ((_, counts, sample),) = await self.load_rows([tenant])
        return TenantLoad.of(tenant, counts, sample)

    # --- limits and pauses --------------------------------------------------------------

    async def set_limits(self, tenant: str, limits: TenantLimits) -> None:
        """Replace the tenant's limits on this shard (every field; 0 = not set here).

        Admission limits apply to the next submits; a new ``max_active`` at once (a tenant
        parked at its old cap and below the new one is served again, its workers woken).
        """
        validation.tenant_id(tenant)
        checked = check_limits(limits)
        await self._run("set_limits", [], [tenant, "set", *_limit_values(checked)])

    async def adopt_limits(self, tenant: str, limits: TenantLimits) -> bool:
        """Set the tenant's limits only if it has none on this shard (a move's target, which
        keeps limits an admin set there meanwhile). True when they were set."""
        validation.tenant_id(tenant)
        checked = check_limits(limits)
        args = [tenant, "adopt", *_limit_values(checked)]
        return bool(await self._run("set_limits", [], args))

    async def limits(self, tenant: str) -> TenantLimits:
        """The tenant's limits as this shard holds them (0 where not set)."""
        validation.tenant_id(tenant)
        raw = await self._r.hmget(self.keys.limits(tenant), list(LIMIT_FIELDS))
        weight, active, rate, burst, pending, pending_bytes, dedupe = (_s(v) or "0" for v in raw)
        return TenantLimits(
            weight=int(weight),
            max_active=int(active),
            submit_rate_per_s=float(rate),
            submit_burst=int(burst),
            max_pending=int(pending),
            max_pending_bytes=int(pending_bytes),
            dedupe_window_s=int(dedupe),
        )

    async def pause(self, tenant: str | None = None, queue: str | None = None) -> bool:
        """Stop claims of ``tenant`` (alone: all its queues), of ``queue`` (alone: for every
        tenant of this shard), or of the tenant's queue (both). Submits and promotion go on.
        True when it was not paused yet."""
        t, q = _pause_target(tenant, queue)
        return bool(await self._run("pause", [], [t, q]))

    async def resume(self, tenant: str | None = None, queue: str | None = None) -> bool:
        """Undo :meth:`pause` of the same target; its workers are woken at once. True when it
        was paused."""
        t, q = _pause_target(tenant, queue)
        return bool(await self._run("resume", [], [t, q]))

    async def paused(self, tenant: str) -> Paused:
        """``(tenant, queues)``: whether ``tenant`` is paused whole, and the queues paused for
        it (its own paused queues and the queues paused for every tenant, sorted)."""
        validation.tenant_id(tenant)
        k = self.keys
        pipe = self._r.pipeline(transaction=False)
        pipe.sismember(k.paused(), tenant)
        pipe.smembers(k.paused_queues())
        whole, everyone = await pipe.execute()
        queues = {*await self.paused_queues_of(tenant), *map(_s, everyone)}
        return Paused(bool(whole), sorted(queues))

    async def pause_summary(self) -> PauseSummary:
        """How many tenants, queues and tenants' queues are paused and tenants parked at
        their cap on this shard, in one round trip."""
        k = self.keys
        pipe = self._r.pipeline(transaction=False)
        pipe.scard(k.paused())
        pipe.smembers(k.paused_queues())
        pipe.scard(k.paused_tenant_queues())
        pipe.scard(k.parked())
        tenants, queues, tenant_queues, parked = await pipe.execute()
        return PauseSummary(int(tenants), sorted(map(_s, queues)), int(tenant_queues), int(parked))

    async def paused_queues_of(self, tenant: str) -> list[str]:
        """The queues paused for ``tenant`` alone (``pause(tenant, queue)``), sorted."""
        validation.tenant_id(tenant)
        members = self._r.sscan_iter(self.keys.paused_tenant_queues(), match=f"{tenant}/*")
        return sorted([_s(m).partition("/")[2] async for m in members])

    async def upgrade_layout(self, limit: int | None = None) -> int:
        """Convert what the previous key layout (no queues) still holds into queue
        ``default``, in capped steps until nothing is left; returns the jobs moved. Run by
        the shard loop when it starts leading; a no-op on a converted shard."""
        limit = limit or self.settings.max_batch
        total = 0
        while True:
            moved, done = await self._run("upgrade_layout", [], [limit])
            total += int(moved)
            if int(done):
                return total

    async def list_jobs(
        self, tenant: str, state: JobState, page_size: int = 100, page_token: str = ""
    ) -> JobPage:
        """A page of one tenant's jobs in one state (scheduled by run-at, dead newest first).

        Page tokens are positions; jobs that change state between pages may shift a page.
        """
        validation.tenant_id(tenant)
        if state not in LISTABLE_STATES:
            shown = state.value if isinstance(state, JobState) else state
            listable = tuple(s.value for s in LISTABLE_STATES)
            raise InvalidArgument(f"{shown!r} is not one of {listable}", field="state")
        size = validation.int_in_range(page_size, 1, 1000, "page_size")
        if state == JobState.READY:
            return await self._list_ready(tenant, size, page_token)
        offset = _parse_offset(page_token)
        k = self.keys
        if state == JobState.DEAD:
            ids = await self._r.zrevrange(k.dead(tenant), offset, offset + size - 1)
        else:
            key = (
                k.scheduled_by_tenant(tenant)
                if state == JobState.SCHEDULED
                else k.active_by_tenant(tenant)
            )
            ids = await self._r.zrange(key, offset, offset + size - 1)
        jobs = await self._records([i.decode() for i in ids])
        token = str(offset + size) if len(ids) == size else ""
        return JobPage(jobs, token)

    async def _list_ready(self, tenant: str, size: int, page_token: str) -> JobPage:
        """Ready jobs queue by queue (by name), most urgent first, then FIFO: the order a
        claim of the queue takes them in when the tenant is alone. The token, where the next
        page starts, is ``{priority}.{offset}.{queue}``."""
        start, prio, offset = "", 9, 0
        if page_token:
            try:
                token_prio, token_offset, start = page_token.split(".", 2)
                prio = validation.priority(int(token_prio))
                offset = validation.int_in_range(int(token_offset), 0, 2**31, "page_token")
                validation.queue(start)
            except (ValueError, InvalidArgument) as exc:
                raise InvalidArgument("not a token from this listing", field="page_token") from exc
        names = sorted(_s(q) for q in await self._r.smembers(self.keys.queues(tenant)))
        jobs: list[JobRecord] = []
        for queue in (q for q in names if q >= start):
            if queue != start:
                prio, offset = 9, 0
            for p in map(int, await self._r.zrevrange(self.keys.priorities(tenant, queue), 0, -1)):
                if p > prio:
                    continue
                if p < prio:
                    prio, offset = p, 0
                while ids := await self._r.lrange(
                    self.keys.ready(tenant, queue, p), offset, offset + size - len(jobs) - 1
                ):
                    # _records drops IDs whose hash expired (cancelled while ready, past
                    # retention), so positions are counted over ids, not over records found.
                    found = {r.job_id: r for r in await self._records([_s(i) for i in ids])}
                    for jid in ids:
                        rec = found.get(_s(jid))
                        if rec is not None and rec.state is JobState.READY:
                            jobs.append(rec)
                    offset += len(ids)
                    if len(jobs) == size:
                        return JobPage(jobs, f"{p}.{offset}.{queue}")
        return JobPage(jobs, "")

    async def _records(self, job_ids: Sequence[str]) -> list[JobRecord]:
        pipe = self._r.pipeline(transaction=False)
        for jid in job_ids:
            pipe.hgetall(self.keys.job(jid))
        raws = await pipe.execute()
        return [
            JobRecord.from_hash(jid, raw) for jid, raw in zip(job_ids, raws, strict=True) if raw
        ]

    # --- recurring schedules -------------------------------------------------------------

    async def upsert_schedule(
        self, tenant: str, spec: ScheduleSpec, max_schedules: int = 0
    ) -> Schedule:
        validation.tenant_id(tenant)
        validation.schedule_id(spec.schedule_id)
        cron.check(spec.cron, spec.time_zone)
        # The template must be a valid job; its request_id is made per tick.
        self.prepare(
            NewJob(
                tenant=tenant,
                handler=spec.handler,
                payload=spec.payload,
                request_id="cron:check",
                priority=spec.priority,
                max_attempts=spec.max_attempts,
                timeout_ms=spec.timeout_ms,
            )
        )
        now = self.clock.now_ms()
        tick = cron.next_tick_ms(spec.cron, spec.time_zone, now)
        body = json.dumps(
            {
                "cron": spec.cron,
                "tz": spec.time_zone,
                "handler": spec.handler,
                "payload": spec.payload.decode("utf-8", "surrogateescape"),
                "priority": spec.priority,
                "max_attempts": spec.max_attempts,
                "timeout_ms": spec.timeout_ms,
                "created_at_ms": spec.created_at_ms or now,
            }
        )
        code = await self._run(
            "schedule_upsert",
            [self.keys.schedules(tenant), self.keys.cron()],
            [tenant, spec.schedule_id, body, tick, max_schedules],
        )
        if item_code(code) is ItemCode.OVER_QUOTA:
            raise ResourceExhausted(
                f"the tenant has {max_schedules} schedules already",
                retry_after_ms=0,
                field="schedule_id",
            )
        return Schedule(_spec(spec.schedule_id, body), tenant, tick)

    async def delete_schedule(self, tenant: str, schedule_id: str) -> None:
        validation.tenant_id(tenant)
        validation.schedule_id(schedule_id)
        code = await self._run(
            "schedule_delete",
            [self.keys.schedules(tenant), self.keys.cron()],
            [tenant, schedule_id],
        )
        if item_code(code) is ItemCode.NOT_FOUND:
            raise NotFound(f"no schedule {schedule_id}", field="schedule_id")

    async def list_schedules(self, tenant: str) -> list[Schedule]:
        validation.tenant_id(tenant)
        raw = await self._r.hgetall(self.keys.schedules(tenant))
        pipe = self._r.pipeline(transaction=False)
        ids = sorted(k.decode() for k in raw)
        for sid in ids:
            pipe.zscore(self.keys.cron(), f"{tenant}/{sid}")
        scores = await pipe.execute()
        return [
            Schedule(_spec(sid, raw[sid.encode()].decode()), tenant, int(score or 0))
            for sid, score in zip(ids, scores, strict=True)
        ]

    async def get_schedule(self, tenant: str, schedule_id: str) -> ScheduleSpec | None:
        validation.tenant_id(tenant)
        validation.schedule_id(schedule_id)
        body = await self._r.hget(self.keys.schedules(tenant), schedule_id)
        return _spec(schedule_id, body.decode()) if body is not None else None

    async def due_ticks(self, limit: int = 100) -> list[DueTick]:
        rows = await self._r.zrangebyscore(
            self.keys.cron(), "-inf", self.clock.now_ms(), start=0, num=limit, withscores=True
        )
        out = []
        for member, score in rows:
            tenant, _, sid = member.decode().partition("/")
            out.append(DueTick(tenant, sid, int(score)))
        return out

    async def advance_schedule(self, tick: DueTick, next_tick_ms: int) -> ItemCode:
        code = await self._run(
            "schedule_advance",
            [self.keys.cron()],
            [f"{tick.tenant}/{tick.schedule_id}", tick.tick_ms, next_tick_ms],
        )
        return item_code(code)

    # --- upgrades -------------------------------------------------------------------------

    async def raise_job_format(self, job_format: int = JOB_FORMAT) -> tuple[int, int]:
        """Raise the job-hash format this shard's ``enqueue.lua`` writes to ``job_format``
        (never lower it; 0 only reads it): ``shardq shards finalize``, once no pod of an older
        release runs. Returns the format before and after."""
        before, after = await self._run("job_format", [], [job_format])
        return int(before), int(after)


def _retry_arg(policy: Backoff | None) -> str:
    """A job's own retry policy checked, as enqueue.lua stores it in 'rb' ('' for none)."""
    if policy is None:
        return ""
    checked = job_backoff(policy.base_ms, policy.cap_ms, policy.jitter)
    return "" if checked is None else checked.to_arg()


def raise_for_enqueue(res: EnqueueResult) -> None:
    """Turn a refused enqueue into its error; accepted results pass through."""
    if res.code is ItemCode.CONFLICT:
        raise AlreadyExists(
            f"request_id was used for job {res.job_id} with another handler or payload",
            field="request_id",
        )
    if res.code is ItemCode.OVER_QUOTA:
        raise ResourceExhausted(
            "the tenant has too many pending jobs", retry_after_ms=res.retry_after_ms
        )
    if res.code is ItemCode.RATE_LIMITED:
        raise ResourceExhausted("the tenant submits too fast", retry_after_ms=res.retry_after_ms)


def check_limits(limits: TenantLimits) -> TenantLimits:
    """``limits`` if every field is in range (else InvalidArgument naming the field), with the
    rate as a float: weight 0-1000, the others >= 0 (0 = not set)."""
    validation.int_in_range(limits.weight, 0, MAX_WEIGHT, "weight")
    validation.int_in_range(limits.max_active, 0, MAX_UINT32, "max_active")
    validation.int_in_range(limits.submit_burst, 0, MAX_UINT32, "submit_burst")
    validation.int_in_range(limits.max_pending, 0, MAX_COUNT, "max_pending")
    validation.int_in_range(limits.max_pending_bytes, 0, MAX_COUNT, "max_pending_bytes")
    validation.int_in_range(limits.result_retention_s, 0, MAX_RETENTION_S, "result_retention_s")
    validation.int_in_range(limits.max_watch_streams, 0, MAX_UINT32, "max_watch_streams")
    if limits.dedupe_window_s:
        validation.int_in_range(
            limits.dedupe_window_s, MIN_DEDUPE_WINDOW_S, MAX_DEDUPE_WINDOW_S, "dedupe_window_s"
        )
    rate = limits.submit_rate_per_s
    if (
        isinstance(rate, bool)
        or not isinstance(rate, int | float)
        or not math.isfinite(rate)
        or not 0 <= rate < 1e9
    ):
        raise InvalidArgument(f"{rate!r} is not a rate in [0, 1e9)", field="submit_rate_per_s")
    return dataclasses.replace(limits, submit_rate_per_s=float(rate))


def _limit_values(limits: TenantLimits) -> list[Any]:
    """The values of ``set_limits.lua``'s ARGV, in the order of LIMIT_FIELDS."""
    return [
        limits.weight,
        limits.max_active,
        repr(float(limits.submit_rate_per_s)),
        limits.submit_burst,
        limits.max_pending,
        limits.max_pending_bytes,
        limits.dedupe_window_s,
    ]


def _queue_list(queues: Sequence[str]) -> list[str]:
    """Checked queue names, each once, in the order given."""
    if isinstance(queues, str) or not isinstance(queues, Sequence):
        raise InvalidArgument("give a list of queue names", field="queues")
    names = list(dict.fromkeys(validation.queue(q, "queues") for q in queues))
    if not 1 <= len(names) <= MAX_CLAIM_QUEUES:
        raise InvalidArgument(f"give 1 to {MAX_CLAIM_QUEUES} queues", field="queues")
    return names


def _pause_target(tenant: str | None, queue: str | None) -> tuple[str, str]:
    """(tenant or '', queue or '') for pause.lua and resume.lua, checked."""
    if not tenant and not queue:
        raise InvalidArgument("name a tenant, a queue, or both", field="tenant_id")
    if tenant:
        validation.tenant_id(tenant)
    if queue:
        validation.queue(queue)
    return tenant or "", queue or ""


def _parse_offset(token: str) -> int:
    if not token:
        return 0
    try:
        return validation.int_in_range(int(token), 0, 2**31, "page_token")
    except ValueError as exc:
        raise InvalidArgument("not a token from this listing", field="page_token") from exc


def _spec(schedule_id: str, body: str) -> ScheduleSpec:
    d = json.loads(body)
    return ScheduleSpec(
        schedule_id=schedule_id,
        cron=d["cron"],
        time_zone=d["tz"],
        handler=d["handler"],
        payload=d["payload"].encode("utf-8", "surrogateescape"),
        priority=d["priority"],
        max_attempts=d["max_attempts"],
        timeout_ms=d["timeout_ms"],
        created_at_ms=d["created_at_ms"],
    )
