"""Moves tenants between shards while their jobs keep flowing (``shardq moves run``).

A placement change (``ShardMapStore`` with a :class:`RedisShards` directory) records a move
per tenant it takes off a shard, in the same map version that sends the tenant's new work to
the target. This module then empties the source of the tenant, copy-then-delete, in batches:

1. queued jobs (scheduled, ready, dead) leave the source's queues and are copied with their
   priority, run-at, attempts and fencing token, then deleted from the source;
2. recurring schedules, keeping the next tick (and whether it already fired);
3. once no job of the tenant is active on the source (active jobs finish, and are acked,
   where they run): finished jobs and dedupe keys, so GetJob and retried request_ids keep
   answering from the target after the move;
4. the source's counters are added to the target's once, and the move's mark is dropped.

Every step is idempotent (see ``shard.moving``): a mover killed anywhere is run again and
ends with the same state. Coordinators read both sides meanwhile (source first, then the
target), so GetJob, CancelJob and WatchJob keep working throughout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from redis.exceptions import RedisError

from shardq.common.errors import ShardqError
from shardq.coordinator.errors import SHARD_ADDRESS_ATTR, SHARD_ID_ATTR
from shardq.coordinator.placement import ShardInfo, ShardMap, TenantMove
from shardq.coordinator.rebalance import tenant_load
from shardq.coordinator.router import ShardRedis
from shardq.coordinator.shardmap import MoverLeaseLost, ShardMapStore
from shardq.shard.client import ShardClient
from shardq.shard.models import ShardSettings
from shardq.shard.moving import (
    DedupeCopy,
    JobCopy,
    ScheduleCopy,
    ShardSide,
    copy_started,
    fence_map,
)
from shardq.shard.records import FINISHED_STATES

log = logging.getLogger("shardq.coordinator.mover")

#: How long the target remembers that a move's counters were added (a re-run within it adds
#: nothing twice); far longer than any mover run.
COUNTERS_MARKER_TTL_MS = 7 * 86_400_000


class Fence(Protocol):
    """The mover lease a mover runs under (``coordinator.moverd.MoverLease``)."""

    #: The backend PID of the lease's Postgres session; ``finish_move`` writes only while
    #: that session still holds the lease.
    pid: int

    async def check(self) -> bool:
        """Whether the lease is still held."""


class RedisShards:
    """The shards of a map as ``ShardMapStore`` and the mover reach them: one client each."""

    def __init__(self, password: str = "", settings: ShardSettings | None = None) -> None:
        self.password = password
        self.settings = settings or ShardSettings()
        self._clients: dict[tuple[int, str], ShardClient] = {}

    def client(self, info: ShardInfo) -> ShardClient:
        """The shard's client; its errors name the shard (``ShardRedis``)."""
        found = self._clients.get((info.shard_id, info.address))
        if found is None:
            redis = ShardRedis.open(
                info.shard_id, info.address, self.password, self.settings.redis_username
            )
            found = ShardClient(redis, self.settings)
            self._clients[(info.shard_id, info.address)] = found
        return found

    async def fence(self, info: ShardInfo, version: int, undo: bool = False) -> None:
        await fence_map(self.client(info), version, undo)

    async def tenants(self, info: ShardInfo) -> list[str]:
        return await self.client(info).tenants()

    async def copy_started(self, info: ShardInfo, tenant: str) -> bool:
        return await copy_started(self.client(info), tenant)

    async def close(self) -> None:
        for c in self._clients.values():
            await c.redis.aclose()
        self._clients.clear()


class MovesFailed(Exception):
    """Some moves stopped on an error (a shard that cannot be reached): one line that names
    the shards and the tenants. What they did is kept; ``moves run`` resumes them."""

    def __init__(
        self, moves: Sequence[TenantMove], results: Sequence[MoveReport | BaseException | None]
    ) -> None:
        errors = [(m, r) for m, r in zip(moves, results, strict=True)
                  if isinstance(r, BaseException)]  # fmt: skip
        self.errors = errors
        for _, exc in errors:
            # A cancellation is no failed move, and an unexpected error is a bug to show.
            if not isinstance(exc, RedisError | OSError | ShardqError):
                raise exc
        by_cause: dict[str, list[str]] = {}
        for move, exc in errors:
            by_cause.setdefault(describe_shard_error(exc), []).append(move.tenant_id)
        parts = [f"{cause} (moves of {', '.join(ts[:5])}{', ...' if len(ts) > 5 else ''})"
                 for cause, ts in by_cause.items()]  # fmt: skip
        super().__init__(
            f"{len(errors)} of {len(moves)} moves stopped: {'; '.join(parts)}; "
            "`shardq moves run` resumes them, `shardq moves abort` undoes those not yet copying"
        )


def describe_shard_error(exc: BaseException) -> str:
    """One line on why a move stopped, naming the shard (and its address: operators only)."""
    shard_id = getattr(exc, SHARD_ID_ATTR, None)
    text = " ".join(str(exc).split()) or type(exc).__name__
    if shard_id is None:
        return text
    return f"shard {shard_id} ({getattr(exc, SHARD_ADDRESS_ATTR, '?')}) unreachable: {text}"


@dataclass
class MoveReport:
    tenant: str
    from_shard_id: int
    to_shard_id: int
    jobs: int = 0
    dedupe_keys: int = 0
    schedules: int = 0
    finished: bool = False
    #: Why an unfinished move stopped (e.g. jobs still active at the deadline).
    waiting_for: str = ""
    seconds: float = 0.0


@dataclass
class Batching:
    """A batch size for one kind of move script, kept where a call's round trip (an upper
    bound of the time the script blocks the shard: Redis runs nothing else meanwhile) stays
    under ``budget_s``: halved after a slower call, grown by a quarter after one well under.
    The work of a job differs with its payload and fields, and a shard's speed with its host:
    no fixed count keeps every script under the budget (100 jobs took 7-16 ms here)."""

    size: int
    high: int
    budget_s: float
    low: int = 20

    def record(self, sent: int, elapsed_s: float) -> None:
        if elapsed_s > self.budget_s:
            self.size = max(self.low, min(self.size, sent) // 2)
        elif elapsed_s < self.budget_s / 2 and sent >= self.size:
            self.size = min(self.high, self.size + max(1, self.size // 4))


@dataclass
class Mover:
    store: ShardMapStore
    shards: RedisShards
    #: Jobs per take/copy/delete round trip. Small: a batch is what a killed mover leaves set
    #: aside (off the queues, not yet on the target) until the next mover picks it up, and
    #: one batch is one script that blocks a shard's Redis (a copy of 500 took 40-143 ms).
    batch: int = 100
    #: How long to wait for the tenant's active jobs on the source to finish, in seconds.
    active_wait_s: float = 300.0
    poll_s: float = 0.1
    #: After taking schedules off the source: lets a cron tick its loop was firing land, so
    #: the target neither repeats nor skips it.
    cron_grace_s: float = 0.5
    #: Tenants moved at the same time.
    parallel: int = 4
    progress: Callable[[MoveReport], None] = field(default=lambda _r: None)
    #: The mover lease this mover runs under (None: unfenced, a test of the steps alone).
    lease: Fence | None = None
    #: Finished moves whose marks the map drops in one change (one version bump)...
    finish_batch: int = 100
    #: ...or fewer, once the first of them has waited this long, in seconds (a timer: a
    #: finished move's mark does not wait for the next move to finish, nor for the pass's end).
    finish_every_s: float = 5.0
    #: The longest a move script's round trip should take, in seconds: each kind of script
    #: gets batches sized to it (``Batching``), at most ``batch`` items...
    script_budget_s: float = 0.004
    #: ...and at most this many bytes of job fields a copy (payloads are the caller's)...
    copy_bytes: int = 256 * 1024
    #: ...and at most this many jobs a copy: writing a job's whole hash on the target costs
    #: several times taking it off the source (100 a copy took up to 5.6 ms).
    copy_batch: int = 50
    _to_finish: list[TenantMove] = field(default_factory=list, init=False)
    _first_pending: float = field(default=0.0, init=False)
    #: Set when a finished move starts a batch: the flusher's cue to start its clock.
    _batch_started: asyncio.Event = field(default_factory=asyncio.Event, init=False)
    _takes: Batching = field(init=False)
    _copies: Batching = field(init=False)

    def __post_init__(self) -> None:
        self._takes = Batching(self.batch, self.batch, self.script_budget_s)
        self._copies = Batching(self.copy_batch, self.copy_batch, self.script_budget_s)

    async def run(self, tenants: Sequence[str] | None = None) -> list[MoveReport]:
        """Carry out the moves in progress (those of ``tenants`` only, if given), up to
        ``parallel`` at a time, busiest tenants first: a slot move is one move per tenant on
        the slot. The map drops the marks of finished moves in batches (one version each)."""
        smap = await self.store.load()
        moves = [m for t, m in sorted(smap.moves.items()) if tenants is None or t in tenants]
        moves = await self._busiest_first(moves, smap)
        gate = asyncio.Semaphore(self.parallel)
        self._to_finish, self._first_pending = [], 0.0
        self._batch_started.clear()

        async def one(move: TenantMove) -> MoveReport | None:
            async with gate:
                return await self.move(move, smap)

        flusher = asyncio.create_task(self._flush_on_time(), name="shardq-mover-finish")
        # Every move runs to its end or its error: a shard that cannot be reached stops the
        # moves that need it, not the others (each is resumable where it stopped).
        try:
            results = await asyncio.gather(*(one(m) for m in moves), return_exceptions=True)
        finally:
            flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await flusher  # a flush that failed (the lease lost) fails the pass
            if self._to_finish:
                await self._flush_finished()
        failed = [r for r in results if isinstance(r, BaseException)]
        for exc in failed:
            if isinstance(exc, MoverLeaseLost):
                raise exc  # not a move's failure: this mover must stop, the moves are fine
        if failed:
            raise MovesFailed(moves, results)
        return [r for r in results if isinstance(r, MoveReport)]  # None: aborted meanwhile

    async def _busiest_first(self, moves: list[TenantMove], smap: ShardMap) -> list[TenantMove]:
        """``moves`` with the busiest tenants (rebalance's load: rate and backlog) first: they
        have the most due work and the most to copy. A source that cannot be read leaves its
        moves in name order, after the others (the move itself then reports the shard)."""
        loads: dict[str, float] = {}
        for shard_id in sorted({m.from_shard_id for m in moves}):
            try:
                found = await self.shards.client(smap.shards[shard_id]).tenant_loads()
            except (RedisError, OSError):
                continue
            loads.update({t: tenant_load(load) for t, load in found.items()})
        return sorted(moves, key=lambda m: -loads.get(m.tenant_id, -1.0))

    async def _guard(self) -> None:
        """Go on only while this mover's lease is held (checked with Postgres, before each
        batch it sets aside): once it is lost another mover may run the same moves."""
        if self.lease is not None and not await self.lease.check():
            raise MoverLeaseLost("the mover lease was lost: another mover may run the moves")

    async def _finish(self, move: TenantMove) -> None:
        """Drop ``move``'s mark, with those of the moves finished about the same time: one map
        version per ``finish_batch`` moves or ``finish_every_s`` (311 reloads of the map on
        every replica for one ``shards add`` before)."""
        await self._guard()
        if not self._to_finish:
            self._first_pending = time.monotonic()
            self._batch_started.set()
        self._to_finish.append(move)
        if len(self._to_finish) >= self.finish_batch:
            await self._flush_finished()

    async def _flush_on_time(self) -> None:
        """Drop the marks of a batch of finished moves ``finish_every_s`` after its first one
        finished, whether or not another move finishes meanwhile: a pass that goes on waiting
        for one tenant's active jobs (up to ``active_wait_s``) must not keep the moves it
        finished showing as in progress."""
        while True:
            await self._batch_started.wait()
            self._batch_started.clear()
            while self._to_finish:
                wait = self._first_pending + self.finish_every_s - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                else:
                    await self._flush_finished()

    async def _flush_finished(self) -> None:
        batch, self._to_finish = self._to_finish, []
        await self.store.finish_moves(batch, self.lease.pid if self.lease else None)

    async def move(self, move: TenantMove, smap: ShardMap) -> MoveReport | None:
        """Run ``move`` to its end (or ``active_wait_s``); None when it was aborted before
        this mover could start copying."""
        started = time.monotonic()
        report = MoveReport(move.tenant_id, move.from_shard_id, move.to_shard_id)
        src = ShardSide(self.shards.client(smap.shards[move.from_shard_id]), move.tenant_id)
        dst = ShardSide(self.shards.client(smap.shards[move.to_shard_id]), move.tenant_id)
        # Reach the target before taking anything off the source: against a target that is
        # down the move stops untouched, and `moves abort` can still undo it.
        target: Any = dst.shard.redis  # redis-py types ping() as "Awaitable | bool"
        await target.ping()
        # The point of no return, in Postgres: the move's row says copying from here on, set
        # only while the row is still there (the map read above may be minutes old: 300
        # moves, 4 at a time). `moves abort` deletes only rows not copying, so whichever of
        # the two reaches the row first wins: an abort never succeeds once this mover may
        # take jobs, and no job is taken for a move aborted meanwhile.
        if not await self.store.start_copying(move, self.lease.pid if self.lease else None):
            log.info("move of tenant %s was aborted before it started copying", move.tenant_id)
            return None
        # The tenant's limits and pauses first, so the target enforces them on its first job.
        await dst.adopt_controls(await src.controls())
        # And the source's job format: a shard added after `shards finalize` is still at 1,
        # and below FOLDED_FORMAT its submits would not find the live jobs copied there by
        # their request IDs (they have no dedupe keys). A source at a format means every pod
        # reads it; the target is raised, never lowered.
        _, source_format = await src.shard.raise_job_format(0)
        await dst.shard.raise_job_format(source_format)
        deadline = time.monotonic() + self.active_wait_s
        while True:
            await self._guard()
            await self._add_counters(move, src, dst)  # a killed run's, before finish asks
            seen = await src.submitted()
            await self._copy_taken(src, dst, report)  # what a killed run left half-way
            while True:
                await self._guard()  # each batch set aside: only while the lease is held
                # No more than one copy takes: a job set aside (where nothing runs it) waits
                # for that copy only, not for the copies of others taken with it.
                size = min(self._takes.size, self._copies.size)
                started_at = time.perf_counter()
                taken = await src.take(size)
                self._takes.record(size, time.perf_counter() - started_at)
                if not taken:
                    break
                await self._copy_taken(src, dst, report)
            if await src.take_schedules():
                await asyncio.sleep(self.cron_grace_s)
            await self._copy_schedules(src, dst, report)
            active = await src.active()
            if active == 0:
                await self._copy_finished(src, dst, report)
                done, left = await src.finish(seen)
                if done:
                    break
                report.waiting_for = left
            else:
                report.waiting_for = f"{active} active jobs"
            self.progress(report)
            if time.monotonic() > deadline:
                report.seconds = time.monotonic() - started
                return report
            await asyncio.sleep(self.poll_s)
        await self._add_counters(move, src, dst)
        await self._finish(move)
        report.finished, report.waiting_for = True, ""
        report.seconds = time.monotonic() - started
        self.progress(report)
        log.info("moved tenant %s from shard %d to %d: %d jobs, %d dedupe keys, %d schedules",
                 move.tenant_id, move.from_shard_id, move.to_shard_id, report.jobs,
                 report.dedupe_keys, report.schedules)  # fmt: skip
        return report

    @staticmethod
    async def _add_counters(move: TenantMove, src: ShardSide, dst: ShardSide) -> None:
        counters = await src.set_aside_counters()
        if counters:
            sample = await src.load_sample()
            await dst.add_counters(
                str(move.started_at_ms), counters, COUNTERS_MARKER_TTL_MS, sample
            )
            await src.forget_counters()

    async def _put(
        self,
        dst: ShardSide,
        jobs: Sequence[JobCopy] = (),
        dedupe: Sequence[DedupeCopy] = (),
        schedules: Sequence[ScheduleCopy] = (),
    ) -> tuple[int, int, int]:
        """``dst.put``, timed for the size of the next copies."""
        started_at = time.perf_counter()
        added = await dst.put(jobs=jobs, dedupe=dedupe, schedules=schedules)
        self._copies.record(
            len(jobs) + len(dedupe) + len(schedules), time.perf_counter() - started_at
        )
        return added

    def _chunk(self, ids: Sequence[str], at: int) -> Sequence[str]:
        return ids[at : at + self._copies.size]

    def _by_bytes(self, jobs: list[JobCopy]) -> list[JobCopy]:
        """The first of ``jobs`` (at least one) whose fields fit in ``copy_bytes``."""
        total = 0
        for n, job in enumerate(jobs):
            total += sum(len(f) for f in job.fields)
            if total > self.copy_bytes and n:
                return jobs[:n]
        return jobs

    async def _copy_taken(self, src: ShardSide, dst: ShardSide, report: MoveReport) -> None:
        """Copy the set-aside jobs to the target, due soonest first, then drop them here."""
        ids = await src.taken_by_due()
        at = 0
        while at < len(ids):
            chunk = self._chunk(ids, at)
            jobs = self._by_bytes(await src.read_jobs(chunk))
            if jobs and len(jobs) < len(chunk):  # cut short by size: up to the last one sent
                chunk = chunk[: chunk.index(jobs[-1].job_id) + 1]
            added, _, _ = await self._put(dst, jobs=jobs)
            await src.drop(job_ids=chunk)
            report.jobs += added
            at += len(chunk)
        self.progress(report)

    async def _copy_schedules(self, src: ShardSide, dst: ShardSide, report: MoveReport) -> None:
        schedules = await src.taken_schedules()
        at = 0
        while at < len(schedules):
            chunk = schedules[at : at + self._copies.size]
            _, _, added = await self._put(dst, schedules=chunk)
            await src.drop(schedule_ids=[s.schedule_id for s in chunk])
            report.schedules += added
            at += len(chunk)

    async def _copy_finished(self, src: ShardSide, dst: ShardSide, report: MoveReport) -> None:
        """Dedupe keys, with the finished jobs they point to. A key whose job is still queued
        or running here stays until a later pass (that job is not finished yet)."""
        keys = await src.dedupe_keys()
        at = 0
        while at < len(keys):
            # A key and its job go in one copy: half the size each.
            chunk = keys[at : at + max(1, self._copies.size // 2)]
            at += len(chunk)
            jobs = {j.job_id: j for j in await src.read_jobs([d.job_id for d in chunk])}
            ready = [d for d in chunk if d.job_id not in jobs or jobs[d.job_id].state in
                     FINISHED_STATES]  # fmt: skip
            finished = [jobs[d.job_id] for d in ready if d.job_id in jobs]
            added_jobs, added_keys, _ = await self._put(dst, jobs=finished, dedupe=ready)
            await src.drop(job_ids=[j.job_id for j in finished], dedupe=ready)
            report.jobs += added_jobs
            report.dedupe_keys += added_keys
