"""The worker: claims jobs from its shards, runs handlers, records results, acks in batches.

Flow per job: claim (a batch, up to free slots, from the queues this worker claims on that
shard, their order rotated on every call) → skip if its result row exists → run the handler
(or hand the job back when this worker has no handler of its name) → queue the outcome → the
recorder writes many rows in one transaction → one ack (or fail, or release) call per shard
for the batch. A job is acked only after its row is committed; if Postgres is down the
recorder retries while the heartbeat thread keeps the leases alive.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import multiprocessing
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import psycopg
import sqlalchemy.exc
from redis.asyncio import Redis
from redis.exceptions import RedisError
from sqlalchemy.ext.asyncio import async_sessionmaker
from sqlalchemy.orm import sessionmaker

from shardq.common import tracing
from shardq.common.redis import log_redis_error, redis_for
from shardq.shard.backoff import Backoff
from shardq.shard.client import ShardClient
from shardq.shard.codes import ItemCode
from shardq.shard.models import Failure, Lease
from shardq.shard.records import ClaimedJob, JobProgress, JobState
from shardq.store import db
from shardq.store.results import (
    ResultRow,
    ResultStore,
    storable,
    to_json,
    write_in_session,
    write_in_sync_session,
)
from shardq.worker.assignment import CoordinatorTls, Endpoint, follow
from shardq.worker.context import Context, make_context
from shardq.worker.handlers import HandlerSpec, PermanentFailure, RetryLater
from shardq.worker.heartbeat import Heartbeater
from shardq.worker.metrics import WorkerMetrics
from shardq.worker.settings import WorkerSettings
from shardq.worker.shardclock import ShardClock, monotonic_ms, sleep_until
from shardq.worker.unrunnable import UnknownHandlers

log = logging.getLogger("shardq.worker")
DB_ERRORS = (
    sqlalchemy.exc.OperationalError,
    sqlalchemy.exc.InterfaceError,
    psycopg.OperationalError,
    psycopg.InterfaceError,
    OSError,
)


#: What a handler's ``ctx.session`` raises when the results database cannot be reached.
#: Not OSError alone: a handler's own HTTP call raises that, and its failure is its own.
STORE_UNREACHABLE = (
    sqlalchemy.exc.OperationalError,
    sqlalchemy.exc.InterfaceError,
    sqlalchemy.exc.TimeoutError,
    psycopg.OperationalError,
    psycopg.InterfaceError,
)
#: Uncounted attempts a job gets for want of the results database (each after the backoff of
#: that many failures: with the server default, 1 s doubling, 10 span ~17 minutes).
STORE_RETRIES = 10


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def _spawn(coro: Any, name: str) -> asyncio.Task[Any]:
    """A background task whose crash is logged instead of vanishing with the task."""
    task = asyncio.create_task(coro, name=name)
    task.add_done_callback(_log_crash)
    return task


def _log_crash(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("task %s crashed", task.get_name(), exc_info=task.exception())


@dataclass
class Running:
    shard_id: int
    address: str
    job: ClaimedJob
    started_ms: int
    task: asyncio.Task[None] | None = None
    #: Set by the heartbeat thread: STALE_LEASE (lost) or CANCEL_REQUESTED.
    lost: ItemCode | None = None
    releasing: bool = False
    #: Started before the row lookup (``ClaimedJob.at_once``), which then found its row.
    duplicate: bool = False
    #: Its outcome is with the recorder: it holds no slot, only its lease (Worker._done).
    recording: bool = False
    #: The handler's last progress report (``ctx.progress``), for the result row.
    progress: JobProgress | None = None
    #: A job claimed before its run-at: when to start it (``shardclock.monotonic_ms``).
    start_at_ms: float | None = None

    @property
    def lease(self) -> Lease:
        return Lease(self.job.job_id, self.job.fence)


@dataclass
class Outcome:
    run: Running
    #: success | failure | duplicate (row existed) | release (shutdown) | lost | cancelled
    #: | unrunnable (no handler of the job's name here: back to ready, away from this worker)
    kind: str
    finished_ms: int = field(default_factory=now_ms)
    result: Any = None
    error: str = ""
    retry_at_ms: int | None = None
    permanent: bool = False
    #: The handler's retry policy (worker/handlers.py ``Retry``) over the server default.
    backoff: Backoff | None = None
    #: The row was already committed in the handler's own session.
    row_written: bool = False
    #: The handler's ``ctx.session`` could not reach the results database: the attempt is not
    #: counted (up to this many times a job, ``Failure.store_retries_max``); 0: it counts.
    store_retries_max: int = 0

    @property
    def dies(self) -> bool:
        """A failure this worker writes a dead row for. Not one for want of the database: the
        shard decides whether it counts, and writes the row through its outbox if it dies."""
        j = self.run.job
        if self.kind != "failure" or self.store_retries_max:
            return False
        return self.permanent or j.attempt >= j.max_attempts


@dataclass
class ShardHandle:
    shard_id: int
    address: str
    client: ShardClient
    #: Queues claimed from on this shard (the assignment may give this worker some of its
    #: queues on one shard and others elsewhere).
    queues: tuple[str, ...]
    task: asyncio.Task[None] | None = None
    active: bool = True
    #: Claim calls made: where the rotation of ``queues`` stands.
    turn: int = 0
    #: The shard's clock, for jobs claimed before their run-at.
    clock: ShardClock = field(default_factory=ShardClock)

    def claim_order(self) -> tuple[str, ...]:
        """The queues in this call's order: each call starts one queue further on, so a
        queue that always has jobs cannot keep the ones after it waiting."""
        qs = self.queues
        start = self.turn % len(qs)
        self.turn += 1
        return qs[start:] + qs[:start]


class Worker:
    def __init__(
        self,
        settings: WorkerSettings,
        handlers: Mapping[str, HandlerSpec],
        metrics: WorkerMetrics | None = None,
    ) -> None:
        self.settings = settings
        self.handlers = dict(handlers)
        self.metrics = metrics or WorkerMetrics()
        self.metrics.serve(self.handlers, settings.queues)
        self.unknown = UnknownHandlers(self.metrics, settings.unknown_handler_log_interval_s)
        self.engine = db.make_engine(settings.database_url)
        self.results = ResultStore(db.psycopg_dsn(db.sqlalchemy_url(settings.database_url)))
        self._async_sessions = async_sessionmaker(self.engine, expire_on_commit=False)
        self._sync_sessions: sessionmaker[Any] | None = None
        self._threads = ThreadPoolExecutor(settings.thread_pool_size, "shardq-handler")
        # Not forked from this process: a fork while gRPC's threads hold its locks can kill
        # the child ("terminated abruptly", BrokenProcessPool for every later job).
        self._procs = (
            ProcessPoolExecutor(
                settings.process_pool_size, mp_context=multiprocessing.get_context("forkserver")
            )
            if settings.process_pool_size
            else None
        )
        self.shards: dict[int, ShardHandle] = {}
        self._starting: set[asyncio.Task[None]] = set()
        #: One client per shard address, kept while jobs from it may still need settling.
        self._clients: dict[str, ShardClient] = {}
        self.running: dict[tuple[int, str], Running] = {}
        self._outcomes: asyncio.Queue[Outcome] = asyncio.Queue()
        #: While the recorder lingers (:meth:`_gather`): how many more outcomes end the wait
        #: (0: it does not), and the event that ends it.
        self._gather_until = 0
        self._gathered = asyncio.Event()
        #: Slots promised to claims in flight, so concurrent shard loops cannot overshoot.
        self._reserved = 0
        #: Runs in ``running`` whose outcome is with the recorder (``Running.recording``).
        self._recording = 0
        self.metrics.awaiting_rows.set_function(lambda: self._recording)
        self._room = asyncio.Event()
        self._room.set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._stopping = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._recorder: asyncio.Task[None] | None = None
        self.heartbeater = Heartbeater(
            settings.lease_ms, self._new_client, self._lease_lost, settings.progress_interval_ms
        )

    # --- lifecycle ----------------------------------------------------------------------

    def _new_client(self, address: str) -> ShardClient:
        redis: Redis = redis_for(
            address, self.settings.redis_password, self.settings.shard.redis_username
        )
        return ShardClient(redis, self.settings.shard)

    def _client(self, address: str) -> ShardClient:
        if address not in self._clients:
            self._clients[address] = self._new_client(address)
        return self._clients[address]

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.heartbeater.start()
        self._recorder = _spawn(self._record_forever(), "shardq-recorder")

    def set_shards(self, endpoints: Mapping[int, str | Endpoint]) -> None:
        """Serve exactly these shards (id -> host:port, or an Endpoint naming the queues to
        claim there: by default every queue this worker serves); in-flight jobs elsewhere
        finish."""
        wanted = {sid: self._endpoint(e) for sid, e in endpoints.items()}
        for sid, handle in list(self.shards.items()):
            want = wanted.get(sid)
            if want is None or want.address != handle.address or not want.queues:
                handle.active = False
                if handle.task:
                    handle.task.cancel()
                del self.shards[sid]
                log.info("stopped claiming from shard %s", sid)
            elif want.queues != handle.queues:
                # The claim loop picks them up on its next call (an idle one blocked on the
                # old queues' wake lists: within idle_block_s).
                handle.queues = want.queues
                log.info("claiming from shard %s: queues %s", sid, ", ".join(want.queues))
        for sid, e in wanted.items():
            if sid not in self.shards and e.queues and not self._stopping.is_set():
                handle = ShardHandle(sid, e.address, self._client(e.address), e.queues)
                handle.task = _spawn(self._claim_forever(handle), f"shardq-claim-{sid}")
                self.shards[sid] = handle
                log.info(
                    "claiming from shard %s at %s: queues %s", sid, e.address, ", ".join(e.queues)
                )
        self.metrics.shards.set(len(self.shards))

    def _endpoint(self, e: str | Endpoint) -> Endpoint:
        """``e`` with the queues to claim there: those of this worker's that it names, all of
        them when it names none (static shards, a coordinator older than queues). An empty
        result means nothing to claim on that shard."""
        if isinstance(e, str):
            e = Endpoint(e)
        mine = self.settings.queues
        if not e.queues:
            return Endpoint(e.address, mine)
        return Endpoint(e.address, tuple(q for q in mine if q in e.queues))

    def stop(self) -> None:
        """Stop claiming; :meth:`drain` then finishes or hands back what is in flight."""
        self._stopping.set()
        for handle in self.shards.values():
            if handle.task:
                handle.task.cancel()

    async def drain(self) -> None:
        self.stop()
        if self._starting:
            await asyncio.wait(self._starting)
        tasks = [r.task for r in self.running.values() if r.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=self.settings.drain_grace_s)
        for run in list(self.running.values()):
            if run.task is not None and not run.task.done():
                run.releasing = True
                run.task.cancel()
        await self._idle.wait()
        if self._recorder:
            self._recorder.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._recorder
        await self.close()

    async def close(self) -> None:
        await asyncio.to_thread(self.heartbeater.stop)
        self.shards.clear()
        for client in self._clients.values():
            await client.redis.aclose()
        self._clients.clear()
        await self.results.close()
        self._threads.shutdown(wait=False, cancel_futures=True)
        if self._procs:
            self._procs.shutdown(wait=False, cancel_futures=True)
        await self.engine.dispose()

    # --- claiming -----------------------------------------------------------------------

    async def _claim_forever(self, shard: ShardHandle) -> None:
        s = self.settings
        idle = False
        while shard.active and not self._stopping.is_set():
            await self._room.wait()
            room = self._free_slots()
            want = min(room, s.claim_batch)
            if want <= 0:
                self._update_room()
                continue
            wait_s = 0.0
            if idle:
                # Nothing was ready: wait for work and claim in one round trip. The slots
                # it holds while it waits are this shard's share of the room, so that the
                # other shards' loops can claim meanwhile; with less room than that, it
                # waits alone, holding none, and claims after.
                share = room // max(1, len(self.shards))
                if share < 1:
                    try:
                        await shard.client.wait_for_work(s.idle_block_s, shard.queues)
                    except RedisError:
                        await asyncio.sleep(0.5)
                    idle = False
                    continue
                want, wait_s = min(want, share), s.idle_block_s
            self._reserved += want
            claim_ns = time.time_ns()
            try:
                jobs = await shard.client.claim(
                    s.worker_id, want, s.lease_ms, queues=shard.claim_order(), wait_s=wait_s
                )
            except RedisError as exc:
                log_redis_error(log, f"shard {shard.shard_id}", "the claim", exc)
                await asyncio.sleep(0.5)
                continue
            finally:
                self._reserved -= want
                self._update_room()
            idle = not jobs
            if jobs:
                if wait_s:  # the claim ran as the wait ended: its span starts at the reply
                    claim_ns = time.time_ns()
                shard.clock.observe(monotonic_ms(), jobs[0].started_at_ms)
                runs = self._register(shard, jobs)
                for job in jobs:  # a job submitted traced: a claim span in its trace
                    if job.trace_context:
                        tracing.record(
                            "shardq claim", job.trace_context, claim_ns, "consumer", _attrs(job)
                        )
                at_once = self._start_at_once(runs)
                # A task of its own, not awaited: this loop claims on while Postgres answers
                # the batch's already-done check (waiting for it put every Postgres hiccup
                # into the claim lateness of the jobs behind). A stop() that cancels this
                # loop cannot strand the batch half-started: drain() waits for the task.
                start = _spawn(self._start_jobs(runs), f"shardq-start-{shard.shard_id}")
                self._starting.add(start)
                start.add_done_callback(self._starting.discard)
                if at_once and wait_s:
                    # Woken from idle: the handlers take their first step before this loop
                    # builds and sends its next claim. (Under load it sends it first, so that
                    # Redis works on the next batch while this one runs.)
                    await asyncio.sleep(0)

    def _register(self, shard: ShardHandle, jobs: list[ClaimedJob]) -> list[Running]:
        """Hold claimed jobs (slots, leases, metrics) before anything awaits."""
        started = now_ms()
        runs = []
        for job in jobs:
            run = Running(shard.shard_id, shard.address, job, started)
            if job.started_at_ms and job.run_at_ms > job.started_at_ms:
                # Claimed ahead of its run-at (promoted ahead: LoopSettings.promote_ahead_ms).
                run.start_at_ms = shard.clock.local_ms(job.run_at_ms)
            self.running[(shard.shard_id, job.job_id)] = run
            runs.append(run)
        self.heartbeater.add_many(shard.shard_id, shard.address, [r.lease for r in runs])
        self.metrics.claimed_many(jobs, started)
        self._idle.clear()
        self._update_room()
        return runs

    def _start_at_once(self, runs: list[Running]) -> bool:
        """Start the first claims (claim.lua's 'at_once'); whether there was one. Only a job's
        own run writes its row, so a first claim has none but in two rare cases that
        :meth:`_start_jobs`' lookup alongside still catches. Their tasks are made before that
        lookup's, so they take their first step before its query is built and sent."""
        at_once = False
        for run in runs:
            if run.job.at_once:
                run.task = _spawn(self._execute(run), f"shardq-job-{run.job.job_id}")
                at_once = True
        return at_once

    async def _start_jobs(self, runs: list[Running]) -> None:
        # The first claims are started already (_start_at_once). The others wait for the
        # lookup: a re-delivery may find the row its last run committed. A first claim whose
        # handler has returned already (short handlers return in their first step, before
        # this task's) is not looked up: the answer could no longer stop it, and its row
        # meets the final one as a late completion does (store/results.py). A batch of such
        # jobs costs Postgres no query (already_done of nothing sends none).
        keys = [(r.job.tenant, r.job.request_id) for r in runs
                if not (r.job.at_once and r.recording)]  # fmt: skip
        done = await self._retry_db(lambda: self.results.already_done(keys))
        for run in runs:
            found = (run.job.tenant, run.job.request_id) in done
            if run.job.at_once:
                # Looked up all the same, alongside, for the two cases a first claim can have
                # a row: the same request_id submitted again after its dedupe window, whose
                # first job ended (a delayed one is found ahead instead, shard/precheck.py),
                # and a Redis that lost acknowledged writes (a failover without replica acks),
                # which can lose a claim whose run committed its row and hand the job out
                # again as never claimed. The run stops here; the row stands.
                if found and run.task is not None and not run.task.done():
                    run.duplicate = True
                    run.task.cancel()
            elif found:
                # Re-delivered after its row was committed: ack without running it again.
                self._done(Outcome(run, "duplicate"))
            else:
                run.task = _spawn(self._execute(run), f"shardq-job-{run.job.job_id}")

    # --- running ------------------------------------------------------------------------

    async def _execute(self, run: Running) -> None:
        job = run.job
        spec = self.handlers.get(job.handler)
        if spec is None:
            # Not this worker's to fail: back to ready, for a worker that has the handler.
            self.unknown.note(job)
            self._done(Outcome(run, "unrunnable"))
            return
        if run.start_at_ms is not None:
            try:
                job = await self._until_run_at(run)
            except asyncio.CancelledError:
                self._done(Outcome(run, _interrupted(run)))
                return
        timeout_s = spec.timeout_s or job.timeout_ms / 1000
        factory: Any = None
        if spec.mode == "async":
            factory = self._async_sessions
        elif spec.mode == "thread":
            factory = self._sync_session_factory()
        ctx = make_context(
            job, run.shard_id, int(run.started_ms + timeout_s * 1000), factory, self._reporter(run)
        )
        try:
            payload = json.loads(job.payload)
            # A timeout scope, not wait_for: wait_for wraps the call in a second task per job.
            async with asyncio.timeout(timeout_s):
                # The handler's spans are children of this one (no-op when untraced).
                with tracing.span(f"shardq run {job.handler}", job.trace_context, "consumer",
                                  _attrs(job) if job.trace_context else None):  # fmt: skip
                    value = await self._call(spec, ctx, payload, run)
            outcome = Outcome(run, "success", result=to_json(value), row_written=ctx.uses_session)
        except asyncio.CancelledError:
            outcome = Outcome(run, _interrupted(run))
        except Exception as exc:
            outcome = _failure(run, exc, timeout_s)
            if ctx.uses_session and _from_the_database(exc) and not _permanent(exc, spec):
                # Not the handler's failure: Postgres refused or dropped the session's
                # connection (down, at max_connections, a failover). Retried, not counted.
                outcome.store_retries_max = STORE_RETRIES
            if spec.retry is not None:
                outcome.backoff = spec.retry.over(self.settings.shard.backoff)
                if isinstance(exc, spec.retry.permanent):
                    outcome.permanent = True
        finally:
            await _close_session(ctx)
        # For a failure for want of the database, fail.lua ignores this while the attempt is
        # uncounted, and honours it once the job's uncounted attempts are used up.
        if outcome.kind == "failure" and spec.max_attempts and job.attempt >= spec.max_attempts:
            outcome.permanent = True
        self._done(outcome)

    async def _until_run_at(self, run: Running) -> ClaimedJob:
        """Sleep until ``run``'s job is due by its shard's clock (``ShardClock``); then it
        counts as started there: its row's start is its run-at (as the job hash's 'sa' says),
        its timeout and duration run from now."""
        assert run.start_at_ms is not None
        await sleep_until(run.start_at_ms)
        run.started_ms = now_ms()
        run.job = dataclasses.replace(run.job, started_at_ms=run.job.run_at_ms)
        return run.job

    async def _call(self, spec: HandlerSpec, ctx: Context, payload: Any, run: Running) -> Any:
        loop = asyncio.get_running_loop()
        if spec.mode == "async":
            value = await spec.fn(ctx, payload)
            if ctx.uses_session:
                await write_in_session(
                    ctx.session, self._row(run, JobState.SUCCEEDED, to_json(value))
                )
            return value
        if spec.mode == "thread":
            return await loop.run_in_executor(
                self._threads, self._call_sync, spec, ctx, payload, run
            )
        if self._procs is None:
            raise RuntimeError("cpu_bound handlers need --process-pool-size > 0")
        light = {"job_id": ctx.job_id, "tenant_id": ctx.tenant_id, "attempt": ctx.attempt}
        return await loop.run_in_executor(self._procs, spec.fn, light, payload)

    def _call_sync(self, spec: HandlerSpec, ctx: Context, payload: Any, run: Running) -> Any:
        value = spec.fn(ctx, payload)
        if ctx.uses_session:
            write_in_sync_session(ctx.session, self._row(run, JobState.SUCCEEDED, to_json(value)))
        return value

    def _sync_session_factory(self) -> sessionmaker[Any]:
        if self._sync_sessions is None:
            engine = db.make_sync_engine(self.settings.database_url)
            self._sync_sessions = sessionmaker(engine, expire_on_commit=False)
        return self._sync_sessions

    def _reporter(self, run: Running) -> Callable[[JobProgress], bool]:
        """Where ``ctx.progress`` of ``run`` goes: the run (for its row, timed like the row's
        finish, see :meth:`_row`) and the heartbeat thread (for the job hash)."""

        def report(p: JobProgress) -> bool:
            started = run.job.started_at_ms or run.started_ms
            at = started + max(0, now_ms() - run.started_ms)
            run.progress = dataclasses.replace(p, updated_at_ms=at)
            return self.heartbeater.report(run.shard_id, run.lease, p)

        return report

    def _row(
        self, run: Running, status: JobState, result: Any = None, error: str = ""
    ) -> ResultRow:
        job = run.job
        # The shard's clock, like every time of the job in Redis (created, run-at, started):
        # this worker's clock may be off. Finished = that start plus the run's duration here.
        started = job.started_at_ms or run.started_ms
        return ResultRow(
            tenant_id=job.tenant,
            request_id=job.request_id,
            job_id=job.job_id,
            shard_id=run.shard_id,
            handler=job.handler,
            status=status.value,
            attempts=job.attempt,
            fence=job.fence,
            queued_ms=job.run_at_ms,
            worker_id=self.settings.worker_id,
            started_ms=started,
            finished_ms=started + max(0, now_ms() - run.started_ms),
            result=result,
            error=error or None,
            progress=None if run.progress is None else run.progress.as_json(),
        )

    def _lease_lost(self, shard_id: int, job_id: str, code: ItemCode) -> None:
        """Called from the heartbeat thread."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._stop_handler, shard_id, job_id, code)

    def _stop_handler(self, shard_id: int, job_id: str, code: ItemCode) -> None:
        run = self.running.get((shard_id, job_id))
        if run is None or run.lost is not None:
            return
        run.lost = code
        if code is ItemCode.STALE_LEASE:
            self._lease_lost_here(shard_id, job_id)
        if run.task is not None and not run.task.done():
            run.task.cancel()

    # --- recording ----------------------------------------------------------------------

    async def _record_forever(self) -> None:
        while True:
            batch = [await self._outcomes.get()]
            try:
                await self._gather(batch)
                await self._record(batch)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("recording a batch failed; its leases will expire and rerun")
            finally:
                for o in batch:
                    self._finish(o.run)

    async def _gather(self, batch: list[Outcome]) -> None:
        """Add the outcomes waiting to ``batch``, up to ``record_batch``; when that makes
        fewer than ``concurrency``, wait up to ``record_linger_ms`` for more. At a trickle of
        jobs (delayed jobs due a ms apart) each was recorded alone, a Postgres transaction
        and an ack call per job: a few jobs a batch took 13–24% off such a job's CPU, every
        process counted (docs/benchmarks.md, session 26). The wait ends as soon as
        ``concurrency`` outcomes are gathered: past that, :meth:`_free_slots` holds the claims
        back. The handlers' slots are free meanwhile; only the rows and acks come later."""
        s = self.settings
        self._take_waiting(batch)
        enough = min(s.record_batch, s.concurrency)
        if not s.record_linger_ms or len(batch) >= enough:
            return
        self._gathered.clear()
        self._gather_until = enough - len(batch)
        try:
            async with asyncio.timeout(s.record_linger_ms / 1000):
                await self._gathered.wait()
        except TimeoutError:
            pass
        finally:
            self._gather_until = 0
        self._take_waiting(batch)

    def _take_waiting(self, batch: list[Outcome]) -> None:
        while len(batch) < self.settings.record_batch and not self._outcomes.empty():
            batch.append(self._outcomes.get_nowait())

    async def _record(self, batch: list[Outcome]) -> None:
        rows = []
        for o in batch:
            if o.kind == "success" and o.run.lost is ItemCode.CANCEL_REQUESTED:
                o.kind = "cancelled"
            if o.kind == "success" and not o.row_written:
                rows.append(self._row(o.run, JobState.SUCCEEDED, o.result))
            elif o.kind == "cancelled":
                rows.append(self._row(o.run, JobState.CANCELLED, error="cancelled while running"))
            elif o.dies:
                rows.append(self._row(o.run, JobState.DEAD, error=o.error))
        # The last progress of these jobs goes to their hashes before the acks end the
        # leases (through the heartbeat thread, which sends every progress in order).
        flushing = self.heartbeater.flush([(o.run.shard_id, o.run.job.job_id) for o in batch])
        # Rows first, then acks: a crash in between leaves rows whose jobs get re-delivered
        # and acked without running (already_done), never an acked job without its row.
        await self._retry_db(lambda: self.results.write(rows))
        if flushing is not None:
            wait_s = self.settings.lease_ms / 1000
            await asyncio.wait([asyncio.wrap_future(flushing)], timeout=wait_s)
        # No more heartbeats for these leases, before the calls that end them: a heartbeat
        # answered after an ack would otherwise read as a lost lease (worker/heartbeat.py).
        # Those calls' own answers tell a lease that really was lost (_count_stale).
        for o in batch:
            self.heartbeater.remove(o.run.shard_id, o.run.job.job_id)
        by_shard: dict[int, dict[str, list[Outcome]]] = defaultdict(lambda: defaultdict(list))
        for o in batch:
            by_shard[o.run.shard_id][o.kind].append(o)
        for shard_id, kinds in by_shard.items():
            await self._settle(shard_id, kinds)

    async def _settle(self, shard_id: int, kinds: Mapping[str, list[Outcome]]) -> None:
        # By address, not by assignment: a shard unassigned meanwhile still gets its acks.
        client = self._client(next(iter(kinds.values()))[0].run.address)
        done = [*kinds.get("success", []), *kinds.get("duplicate", []), *kinds.get("cancelled", [])]
        failures = kinds.get("failure", [])
        released = kinds.get("release", [])
        unrunnable = kinds.get("unrunnable", [])
        # The jobs the shard says are dead now, when it answered: a failure for want of the
        # results database dies there once its uncounted attempts are used up ('sr'), which
        # ``Outcome.dies`` (this worker's own guess, for the row it writes) does not know.
        died: set[str] | None = None
        try:
            if done:
                self._count_stale(done, await client.ack([o.run.lease for o in done]))
            if failures:
                failed = await client.fail(
                    [
                        Failure(
                            o.run.job.job_id,
                            o.run.job.fence,
                            o.run.job.attempt,
                            o.error,
                            permanent=o.permanent,
                            retry_at_ms=o.retry_at_ms,
                            backoff=o.backoff,
                            store_retries_max=o.store_retries_max,
                        )
                        for o in failures
                    ]
                )
                self._count_stale(failures, [r.code for r in failed])
                died = {o.run.job.job_id for o, r in zip(failures, failed, strict=True)
                        if r.code is ItemCode.OK and r.state is JobState.DEAD}  # fmt: skip
            if released:
                self._count_stale(released, await client.release([o.run.lease for o in released]))
            if unrunnable:
                codes = await client.release(
                    [o.run.lease for o in unrunnable],
                    avoid_ms=self.settings.unknown_handler_backoff_ms,
                )
                self._count_stale(unrunnable, codes)
        except RedisError as exc:
            # Rows are committed; the leases expire and re-delivery acks them (already_done).
            log.warning("settling on shard %s failed: %s", shard_id, exc)
        for kind, outcomes in kinds.items():
            for o in outcomes:
                dead = (
                    o.run.job.job_id in died if died is not None and kind == "failure" else o.dies
                )
                self.metrics.finished(o.run.job, kind, o.finished_ms - o.run.started_ms, dead)

    def _count_stale(self, outcomes: list[Outcome], codes: list[ItemCode]) -> None:
        """A lease found lost by the call that ends it (the heartbeat did not see it first:
        the handler had returned): logged and counted once, like one the heartbeat finds."""
        for o, code in zip(outcomes, codes, strict=True):
            if code is ItemCode.STALE_LEASE and o.run.lost is not ItemCode.STALE_LEASE:
                o.run.lost = code
                self._lease_lost_here(o.run.shard_id, o.run.job.job_id)

    def _lease_lost_here(self, shard_id: int, job_id: str) -> None:
        self.metrics.lease_lost.inc()
        log.warning("lease lost", extra={"job_id": job_id, "shard": shard_id})

    def _done(self, outcome: Outcome) -> None:
        """Hand a run's outcome to the recorder. Its slot is free from here on: a slot is a
        handler running (``--concurrency``), and a run that waited in its slot for its row's
        commit and its ack held the next jobs back for those round trips, however short its
        handlers (at the default 16 slots a drain ran at ~60% of its pace now). Its lease is
        still held and heartbeated until the ack."""
        run = outcome.run
        if not run.recording:
            run.recording = True
            self._recording += 1
        self._outcomes.put_nowait(outcome)
        if self._gather_until and self._outcomes.qsize() >= self._gather_until:
            self._gathered.set()
        self._update_room()

    def _finish(self, run: Running) -> None:
        self.running.pop((run.shard_id, run.job.job_id), None)
        if run.recording:
            run.recording = False
            self._recording -= 1
        self.heartbeater.remove(run.shard_id, run.job.job_id)
        self._update_room()
        if not self.running:
            self._idle.set()

    def _free_slots(self) -> int:
        """Slots neither running a handler nor promised to a claim in flight. Bounded too by
        the outcomes waiting for their rows: at most ``concurrency`` of them besides the
        running handlers (one batch being written while the next one runs), so that a
        Postgres that is slow or down stops the claims, as before, instead of running more
        handlers whose rows cannot be written."""
        c = self.settings.concurrency
        return min(c + self._recording, 2 * c) - len(self.running) - self._reserved

    def _update_room(self) -> None:
        """Open the gate for claim loops exactly while a slot is free (:meth:`_free_slots`)."""
        if self._free_slots() > 0:
            self._room.set()
        else:
            self._room.clear()

    async def _retry_db(self, fn: Any) -> Any:
        delay = self.settings.db_retry_base_s
        while True:
            try:
                return await fn()
            except DB_ERRORS as exc:
                log.warning("database unavailable, retrying in %.1fs: %s", delay, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.settings.db_retry_cap_s)


def _attrs(job: ClaimedJob) -> dict[str, Any]:
    """A traced job's span attributes."""
    return {
        "shardq.tenant": job.tenant, "shardq.job_id": job.job_id,
        "shardq.request_id": job.request_id, "shardq.handler": job.handler,
        "shardq.attempt": job.attempt, "shardq.queue": job.queue,
    }  # fmt: skip


def _interrupted(run: Running) -> str:
    """Why a handler was cancelled: its row turned up, shutdown, a cancel, or a lost lease."""
    if run.duplicate:
        return "duplicate"
    if run.releasing:
        return "release"
    return "cancelled" if run.lost is ItemCode.CANCEL_REQUESTED else "lost"


def _from_the_database(exc: BaseException) -> bool:
    """``exc`` (or what it was raised from) is the results database out of reach: a
    connection refused, dropped or not to be had (sqlalchemy's OperationalError/InterfaceError
    or its pool's TimeoutError, psycopg's own), as opposed to an error of the handler's SQL."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, STORE_UNREACHABLE):
            return True
        # ``raise X from None`` says: not because of what was being handled.
        cause = cause.__cause__ or (None if cause.__suppress_context__ else cause.__context__)
    return False


def _permanent(exc: Exception, spec: HandlerSpec) -> bool:
    """The handler said the job cannot succeed, whatever the database did meanwhile."""
    if isinstance(exc, PermanentFailure):
        return True
    return spec.retry is not None and isinstance(exc, spec.retry.permanent)


def _failure(run: Running, exc: Exception, timeout_s: float) -> Outcome:
    # The message as Redis and Postgres take it: a NUL or an unpaired surrogate in it (the
    # handler's own exception says anything) would fail the fail and the row of the attempt.
    message = storable(str(exc)) or ""
    if isinstance(exc, RetryLater):
        retry_at = now_ms() + int(exc.delay_s * 1000)
        return Outcome(run, "failure", error=message, retry_at_ms=retry_at)
    if isinstance(exc, PermanentFailure):
        return Outcome(run, "failure", error=f"permanent: {message}", permanent=True)
    if isinstance(exc, TimeoutError):
        return Outcome(run, "failure", error=f"timed out after {timeout_s:g}s")
    return Outcome(run, "failure", error=f"{type(exc).__name__}: {message}")


async def _close_session(ctx: Context) -> None:
    session = ctx._session
    if session is None:
        return
    close = session.close()
    if asyncio.iscoroutine(close):
        await close


async def serve(
    worker: Worker,
    *,
    shards: Mapping[int, str] | None = None,
    coordinator: str = "",
    token: str = "",
    tls: CoordinatorTls | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    """Run ``worker`` on static ``shards`` or the coordinator's assignment (reached over
    ``tls`` when given) until ``stop`` is set, then drain (in-flight jobs finish within the
    grace period, the rest go back)."""
    if shards is None and not coordinator:
        raise ValueError("give static shards or a coordinator address")
    stop = stop or asyncio.Event()
    await worker.start()
    tasks: set[asyncio.Task[Any]] = {asyncio.create_task(stop.wait())}
    follower: asyncio.Task[None] | None = None
    if shards is not None:
        worker.set_shards(shards)
    else:
        s = worker.settings
        follower = asyncio.create_task(
            follow(
                coordinator,
                token,
                s.worker_id,
                s.concurrency,
                worker.set_shards,
                tls,
                queues=s.queues,
                handlers=worker.handlers,
            )
        )
        tasks.add(follower)
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        if follower is not None and follower in done:
            follower.result()  # the coordinator refused the token: stop with that error
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await worker.drain()
