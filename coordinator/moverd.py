"""The cluster's own mover: one coordinator replica at a time runs the pending tenant moves.

A placement change (``shards add``, ``tenants move``, ``rebalance --apply``, a Helm upgrade)
only records its moves; :class:`MoverDaemon`, inside every coordinator started with
``--run-moves`` (the default), makes sure they finish without a second command.

**Who runs them: the mover lease.** A session-level Postgres advisory lock
(``pg_try_advisory_lock``) held on a dedicated connection (:class:`MoverLease`). Chosen over a
row with an expiry because its lifetime *is* the holder's: a coordinator killed with
``kill -9`` (or its pod) closes its socket, Postgres drops the session and the lock at once,
and the next replica's attempt (every ``poll_s``) takes it -- no expiry to wait out, no clock
to trust, no row to clean up. The lock lives in the shard map's database, so the leader is the
same for every replica that shares the map.

**Fencing.** On taking the lock the holder draws a token, ``pg_current_xact_id()``: Postgres'
transaction counter, which only grows, so a later leader's token is always larger (logged, and
shown by ``shardq moves list`` through :func:`lease_holder`). What a stale holder could still
do is guarded twice: the one Postgres write of a move (dropping its mark,
``ShardMapStore.finish_move``) is made only while this very session still holds the lock, in
the same transaction; and every Redis step of a move is idempotent by job ID (``shard.moving``)
so two movers overlapping for an instant end in the same state as one. The holder checks its
session every ``poll_s`` and cancels its moves the moment it is gone.

The ``shardq`` commands take the same lease before running moves themselves (``moves run``, or
a change with no coordinator running moves), so there is never more than one mover.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import psycopg
from prometheus_client import CollectorRegistry, Gauge
from psycopg.rows import TupleRow
from sqlalchemy.exc import SQLAlchemyError

from shardq.common.errors import FailedPrecondition
from shardq.coordinator.mover import Fence, Mover, MoveReport, MovesFailed, RedisShards
from shardq.coordinator.shardmap import LEASE_KEY, SHARD_ERRORS, MoverLeaseLost, ShardMapStore
from shardq.store import db

log = logging.getLogger("shardq.coordinator.moverd")

T = TypeVar("T")

#: The ``application_name`` of the lease's connection: how ``lease_holder`` tells who it is.
APP_PREFIX = "shardq-mover"


class MoverLease:
    """The mover lease: an advisory lock held on a connection of its own."""

    def __init__(self, dsn: str, holder: str) -> None:
        self._dsn = db.psycopg_dsn(dsn)
        #: Who holds it, as ``lease_holder`` reports it ("coordinator host:pid", "shardq cli").
        self.holder = holder
        self._conn: psycopg.AsyncConnection[TupleRow] | None = None
        #: The fencing token of the current holding (0: not held).
        self.token = 0
        #: The backend PID of the lease's session, which ``finish_move`` checks.
        self.pid = 0

    @property
    def held(self) -> bool:
        return self._conn is not None

    async def try_acquire(self) -> bool:
        """Take the lease if nobody holds it; True when this lease holds it afterwards."""
        if self._conn is not None:
            return True
        conn: psycopg.AsyncConnection[TupleRow] = await psycopg.AsyncConnection.connect(
            self._dsn,
            autocommit=True,
            application_name=f"{APP_PREFIX} {self.holder}"[:63],
            connect_timeout=5,
            # A holder whose host vanishes (node lost, network cut) must lose the lock in
            # seconds, not after the kernel's default two hours of TCP keepalive: probes on
            # both ends, and a send that stays unacknowledged for 10 s ends the session.
            keepalives=1,
            keepalives_idle=5,
            keepalives_interval=2,
            keepalives_count=3,
            tcp_user_timeout=10_000,
            options="-c tcp_keepalives_idle=5 -c tcp_keepalives_interval=2"
            " -c tcp_keepalives_count=3 -c tcp_user_timeout=10000",
        )
        try:
            cur = await conn.execute("SELECT pg_try_advisory_lock(%s)", (LEASE_KEY,))
            row = await cur.fetchone()
            if not row or not row[0]:
                await conn.close()
                return False
            cur = await conn.execute("SELECT pg_current_xact_id()::text::bigint, pg_backend_pid()")
            token_row = await cur.fetchone()
            assert token_row is not None
            self.token, self.pid = int(token_row[0]), int(token_row[1])
        except BaseException:
            with contextlib.suppress(psycopg.Error, OSError):
                await conn.close()
            raise
        self._conn = conn
        log.info("mover lease taken by %s (fencing token %d)", self.holder, self.token)
        return True

    async def check(self) -> bool:
        """Whether the lease's session is still alive (and so still holds the lock)."""
        if self._conn is None:
            return False
        try:
            async with asyncio.timeout(5):
                await self._conn.execute("SELECT 1")
            return True
        except (psycopg.Error, OSError, TimeoutError) as exc:
            log.warning("mover lease of %s lost: %s", self.holder, exc)
            await self._drop()
            return False

    async def release(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(psycopg.Error, OSError):
                await self._conn.execute("SELECT pg_advisory_unlock(%s)", (LEASE_KEY,))
            await self._drop()

    async def _drop(self) -> None:
        conn, self._conn = self._conn, None
        self.token = self.pid = 0
        if conn is not None:
            with contextlib.suppress(psycopg.Error, OSError):
                await conn.close()


@dataclass(frozen=True, slots=True)
class Holder:
    """Who holds the mover lease now (``lease_holder``)."""

    #: The lease connection's ``application_name`` less its prefix, e.g. "coordinator h:12".
    name: str
    pid: int


async def lease_holder(dsn: str) -> Holder | None:
    """Who holds the mover lease in ``dsn``'s database, None when nobody does."""
    async with await psycopg.AsyncConnection.connect(
        db.psycopg_dsn(dsn), autocommit=True, connect_timeout=5
    ) as conn:
        cur = await conn.execute(
            "SELECT a.application_name, l.pid FROM pg_locks l JOIN pg_stat_activity a "
            "ON a.pid = l.pid WHERE l.locktype = 'advisory' AND l.granted "
            "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
            "AND l.classid = 0 AND l.objid = %s AND l.objsubid = 1",
            (LEASE_KEY,),
        )
        row = await cur.fetchone()
    if row is None:
        return None
    return Holder(str(row[0]).removeprefix(APP_PREFIX).strip(), int(row[1]))


class MoverDaemon:
    """Inside a coordinator: take the mover lease when free, and while holding it run every
    pending move to its end (resuming each from its recorded step), until stopped."""

    def __init__(
        self,
        store: ShardMapStore,
        database_url: str,
        shards: RedisShards,
        holder: str,
        registry: CollectorRegistry | None = None,
        *,
        poll_s: float = 0.5,
        active_wait_s: float = 5.0,
    ) -> None:
        self.store = store
        self.shards = shards
        self.lease = MoverLease(database_url, holder)
        self.poll_s = poll_s
        #: A pass over the moves ends after this long waiting for active jobs; the next pass
        #: (which also picks up moves recorded meanwhile) goes on from there.
        self.active_wait_s = active_wait_s
        self._task: asyncio.Task[None] | None = None
        #: When some pending move last made progress (monotonic), for the stuck gauge.
        self._progress_at = time.monotonic()
        self._pending = 0
        self._seen: dict[str, tuple[int, int, int, bool]] = {}
        self._leader = Gauge(
            "shardq_mover_leader",
            "1 while this coordinator holds the mover lease and runs the pending tenant moves",
            registry=registry,
        )
        self._leader.set_function(lambda: 1.0 if self.lease.held else 0.0)
        self._stuck = Gauge(
            "shardq_move_stuck_seconds",
            "seconds since a pending tenant move last made progress (0: none pending, or "
            "progressing); reported by the mover lease's holder",
            registry=registry,
        )
        self._stuck.set_function(self._stuck_seconds)

    def _stuck_seconds(self) -> float:
        if not self.lease.held or not self._pending:
            return 0.0
        return max(0.0, time.monotonic() - self._progress_at)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="shardq-moverd")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        try:
            await self.lease.release()
        finally:
            # Postgres away at the release must not leave the shards' connections open.
            await self.shards.close()

    async def _loop(self) -> None:
        while True:
            try:
                if await self.lease.try_acquire():
                    await self._lead()
            except (psycopg.Error, OSError, SQLAlchemyError, FailedPrecondition) as exc:
                # Postgres away: whoever holds the lease keeps it only while its session
                # lives; try again on the next round.
                log.warning("mover: %s", " ".join(str(exc).split()))
                await self.lease.release()
            except Exception:
                # A bug must not leave the lock held by a mover that no longer runs: let go,
                # so this or another coordinator takes it again on a later round.
                log.exception("mover: crashed; releasing the lease")
                await self.lease.release()
            await asyncio.sleep(self.poll_s)

    async def _lead(self) -> None:
        """Run the pending moves while holding the lease; returns once the lease is lost."""
        while await self.lease.check():
            smap = await self.store.load()
            self._pending = len(smap.moves)
            if not smap.moves:
                await asyncio.sleep(self.poll_s)
                continue
            try:
                await run_fenced(self._pass(), self.lease, self.poll_s)
            except MoverLeaseLost as exc:
                log.warning("mover: %s", exc)
                return
            except MovesFailed as exc:
                # A shard that cannot be reached: the moves that need it wait for it, the next
                # pass tries again (what they did is kept).
                log.warning("mover: %s", exc)
                await asyncio.sleep(self.poll_s)
            except SHARD_ERRORS as exc:
                log.warning("mover: %s", " ".join(str(exc).split()))
                await asyncio.sleep(self.poll_s)

    async def _pass(self) -> list[MoveReport]:
        mover = Mover(
            self.store,
            self.shards,
            active_wait_s=self.active_wait_s,
            progress=self._on_progress,
            lease=self.lease,
        )
        reports = await mover.run()
        log.debug("mover pass: %d moves, %d finished", len(reports),
                  sum(r.finished for r in reports))  # fmt: skip
        return reports

    def _on_progress(self, report: MoveReport) -> None:
        # The mover reports every round, also while it only waits: progress is what it moved.
        done = (report.jobs, report.dedupe_keys, report.schedules, report.finished)
        if self._seen.get(report.tenant) != done:
            self._seen[report.tenant] = done
            self._progress_at = time.monotonic()


async def run_fenced(work: Coroutine[Any, Any, T], lease: Fence, poll_s: float) -> T:
    """Run ``work`` (a mover's pass) only while ``lease`` is held: the lease is checked every
    ``poll_s`` meanwhile, and the moment a check finds it gone the pass is cancelled and
    MoverLeaseLost raised, so that it takes nothing more off a shard once another mover may
    have taken over. (The mover also checks before every batch it takes: ``Mover._guard``.)"""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=poll_s)
            if done:
                return task.result()
            if not await lease.check():
                raise MoverLeaseLost("the mover lease was lost: another mover may run the moves")
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


async def run_under_lease(
    mover: Mover, lease: MoverLease, tenants: Sequence[str] | None, poll_s: float = 0.5
) -> list[MoveReport] | None:
    """Run ``tenants``' moves here (a ``shardq`` command) under the same lease, and fenced the
    same way, as the cluster's mover (:func:`run_fenced`); None when another mover holds it
    (the caller watches instead). MoverLeaseLost when the lease is lost mid-pass: the pass
    has stopped, and what it did is kept for whichever mover holds the lease next."""
    if not await lease.try_acquire():
        return None
    try:
        mover.lease = lease
        return await run_fenced(mover.run(tenants), lease, poll_s)
    finally:
        await lease.release()
