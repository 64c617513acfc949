"""Result rows of jobs that ended without a worker, written by the leading shard loop.

A worker writes the row of every job it finishes, before its ack. A job can also end with no
worker to write it: the lease reaper dead-letters (or ends as cancelled) a job whose worker
died on its last attempt, ``CancelJob`` ends a scheduled or ready job, and a cancel can win
over an active job's ack or fail. Each script that ends a job that way puts its ID on the
shard's outbox (``Keys.outbox``) in the same atomic step, so no crash can lose it; this module
drains the outbox:

1. read a batch of IDs (oldest first) and their job hashes;
2. upsert their rows in one statement, with the rule every row write follows (only a ``dead``
   row is ever replaced: a ``succeeded`` or ``cancelled`` row that exists wins);
3. read the rows' statuses back, and through ``rows_written.lua`` take the IDs off the outbox
   and make Redis say what the row says where the two differ (the row decides: a worker that
   committed ``succeeded`` but whose ack was lost left a job the reaper then dead-lettered).

The IDs leave the outbox only after the commit: a crash in between repeats an idempotent
upsert. While Postgres cannot be reached the outbox just grows (``shardq_shard_outbox_depth``,
``shardq_shard_results_db_reachable``, one log line when it goes and one when it is back).

The :class:`Reconciler` is the net under all of this: it walks the shard's dead sets (a
page of at most ``reconcile_batch`` jobs per pass, the cursor moving on across passes) and
compares each job with its row: a missing row is written, a row that says ``succeeded`` or
``cancelled`` makes Redis agree. Both count in ``shardq_shard_reconciled_total{kind}``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import psycopg
from prometheus_client import CollectorRegistry, Counter, Gauge

from shardq.shard.client import ShardClient
from shardq.shard.records import JobRecord, JobState
from shardq.store.results import ResultRow, ResultStore

log = logging.getLogger("shardq.shard")

#: What a failed Postgres call raises when the database cannot be reached (not a bug).
DB_ERRORS = (psycopg.OperationalError, psycopg.InterfaceError, OSError)
#: The ends whose row the shard loop writes (a worker writes every ``succeeded`` row).
_ENDS = (JobState.DEAD, JobState.CANCELLED)


@dataclass(frozen=True, slots=True)
class RowSettings:
    #: Pause between two drains of the outbox when it was empty, in ms.
    outbox_interval_ms: int = 500
    #: Most outbox entries (and so rows) per statement.
    batch: int = 500
    #: Pause between two reconciler passes, in s (``SHARDQ_RECONCILE_INTERVAL_S``); 0: off.
    reconcile_interval_s: float = 30.0
    #: Most dead jobs one reconciler pass compares with their rows.
    reconcile_batch: int = 500
    #: Most tenants one reconciler pass looks at (bounds a pass over many empty dead sets).
    reconcile_tenants: int = 100


class RowMetrics:
    def __init__(self, registry: CollectorRegistry, shard_id: str) -> None:
        self.depth = Gauge(
            "shardq_shard_outbox_depth", "Ended jobs waiting for their result row", ["shard"],
            registry=registry,
        ).labels(shard=shard_id)  # fmt: skip
        self.reachable = Gauge(
            "shardq_shard_results_db_reachable",
            "0 while the last write of result rows failed to reach Postgres", ["shard"],
            registry=registry,
        ).labels(shard=shard_id)  # fmt: skip
        self.reachable.set(1)
        self.written = Counter(
            "shardq_shard_rows_written", "Result rows the shard loop wrote, by status",
            ["shard", "status"], registry=registry,
        )  # fmt: skip
        self.reconciled = Counter(
            "shardq_shard_reconciled",
            "Disagreements fixed: missing_row (a dead job without its row, row written), "
            "redis_state (Redis took the row's status), gone (the job hash expired first)",
            ["shard", "kind"], registry=registry,
        )  # fmt: skip
        self.shard_id = shard_id

    def count(self, kind: str, n: int = 1) -> None:
        if n:
            self.reconciled.labels(shard=self.shard_id, kind=kind).inc(n)


def row_of(rec: JobRecord, shard_id: int) -> ResultRow:
    """The row of a job that ended dead or cancelled, from its hash: the last attempt's worker
    and fencing token, its last error (the reaper's ``lease expired``)."""
    return ResultRow(
        tenant_id=rec.tenant,
        request_id=rec.request_id,
        job_id=rec.job_id,
        shard_id=shard_id,
        handler=rec.handler,
        status=rec.state.value,
        attempts=rec.attempts,
        fence=rec.fence,
        worker_id=rec.worker_id,
        queued_ms=rec.run_at_ms,
        started_ms=rec.started_at_ms,
        finished_ms=rec.finished_at_ms or rec.created_at_ms,
        error=rec.last_error or (rec.state.value if rec.state is JobState.CANCELLED else None),
        progress=None if rec.progress is None else rec.progress.as_json(),
    )


class TerminalRows:
    """Drains the outbox and runs the reconciler; :meth:`run` until cancelled (the leader's
    task group cancels it when leadership ends)."""

    def __init__(
        self,
        shard: ShardClient,
        store: ResultStore,
        shard_id: int,
        settings: RowSettings | None = None,
        metrics: RowMetrics | None = None,
    ) -> None:
        self.shard = shard
        self.store = store
        self.shard_id = shard_id
        self.settings = settings or RowSettings()
        self.metrics = metrics or RowMetrics(CollectorRegistry(), str(shard_id))
        self.reconciler = Reconciler(self)
        self._db_down = False

    async def run(self) -> None:
        s = self.settings
        loop = asyncio.get_running_loop()
        next_reconcile = loop.time() + s.reconcile_interval_s
        while True:
            try:
                await self.drain()
                if s.reconcile_interval_s > 0 and loop.time() >= next_reconcile:
                    await self.reconciler.step()
                    next_reconcile = loop.time() + s.reconcile_interval_s
                self._reachable(None)
            except DB_ERRORS as exc:
                self._reachable(exc)
            except Exception:
                # Redis errors and bugs alike: the promoter and the reaper must go on.
                log.exception("writing the rows of ended jobs failed; retrying")
            await asyncio.sleep(s.outbox_interval_ms / 1000)

    def _reachable(self, exc: Exception | None) -> None:
        """Log once when Postgres goes and once when it is back (not once per retry)."""
        if exc is not None and not self._db_down:
            log.warning("results database unreachable; ended jobs wait on the outbox: %s", exc)
        elif exc is None and self._db_down:
            log.info("results database reachable again; writing the waiting rows")
        self._db_down = exc is not None
        self.metrics.reachable.set(0 if self._db_down else 1)

    async def drain(self) -> int:
        """Write the rows of everything on the outbox now; returns the entries settled."""
        total = 0
        try:
            while entries := await self.shard.outbox(self.settings.batch):
                total += len(entries)
                await self._settle(entries)
                if len(entries) < self.settings.batch:
                    break
        finally:
            self.metrics.depth.set(await self.shard.outbox_depth())
        return total

    async def _settle(self, entries: Sequence[tuple[str, int]]) -> None:
        recs = {r.job_id: r for r in await self.shard.records([j for j, _ in entries])}
        ended = [r for r in recs.values() if r.state in _ENDS]
        statuses = await self.write(ended)
        items: list[tuple[str, int | None, str]] = []
        for job_id, score in entries:
            rec = recs.get(job_id)
            if rec is None:
                # Its hash expired (the retention window) or moved away before the row could
                # be written: nothing is left to write it from.
                log.warning("ended job %s is gone before its row was written", job_id)
                self.metrics.count("gone")
            status = statuses.get((rec.tenant, rec.request_id), "") if rec else ""
            # A job requeued since (not ended) leaves the outbox: its next end adds it again.
            items.append((job_id, score, status if rec and rec.state in _ENDS else ""))
        changed = await self.shard.rows_written(items)
        self.metrics.count("redis_state", sum(changed))

    async def write(self, recs: Sequence[JobRecord]) -> dict[tuple[str, str], str]:
        """Upsert the rows of ended jobs; the statuses of their rows afterwards."""
        if not recs:
            return {}
        await self.store.write([row_of(r, self.shard_id) for r in recs])
        for r in recs:
            self.metrics.written.labels(shard=self.metrics.shard_id, status=r.state.value).inc()
        return await self.store.statuses((r.tenant, r.request_id) for r in recs)


class Reconciler:
    """Compares the shard's dead jobs with their rows, a bounded page per :meth:`step`.

    The cursor (a tenant, an offset in its dead set) lives in memory: a new leader starts
    over. The offset is a rank, so a dead set that shrinks between two pages can make a pass
    skip a few jobs; the next round over the tenants sees them.
    """

    def __init__(self, rows: TerminalRows) -> None:
        self.rows = rows
        self._tenants: list[str] = []
        self._index = 0
        self._offset = 0

    async def step(self) -> int:
        """One pass: at most ``reconcile_batch`` jobs of at most ``reconcile_tenants``
        tenants; returns the jobs compared."""
        s = self.rows.settings
        shard = self.rows.shard
        checked = 0
        for _ in range(s.reconcile_tenants):
            if self._index >= len(self._tenants):
                self._tenants, self._index, self._offset = await shard.tenants(), 0, 0
                if not self._tenants:
                    break
            tenant = self._tenants[self._index]
            want = s.reconcile_batch - checked
            ids = await shard.dead_ids(tenant, self._offset, want)
            await self.check(ids)
            checked += len(ids)
            if len(ids) < want:
                self._index, self._offset = self._index + 1, 0
            else:
                self._offset += len(ids)
            # A round over the tenants ends the pass; the next one reads them afresh.
            if checked >= s.reconcile_batch or self._index >= len(self._tenants):
                break
        return checked

    async def check(self, job_ids: Sequence[str]) -> None:
        shard, rows = self.rows.shard, self.rows
        # Ones on the outbox are the drain's: their rows are on the way.
        waiting = await shard.in_outbox(job_ids)
        recs = [
            r
            for r in await shard.records([j for j in job_ids if j not in waiting])
            if r.state is JobState.DEAD
        ]
        if not recs:
            return
        statuses = await rows.store.statuses((r.tenant, r.request_id) for r in recs)
        missing = [r for r in recs if (r.tenant, r.request_id) not in statuses]
        if missing:
            log.warning("%d dead jobs had no result row; writing them", len(missing))
            rows.metrics.count("missing_row", len(missing))
            statuses.update(await rows.write(missing))
        items: list[tuple[str, int | None, str]] = [
            (r.job_id, None, statuses.get((r.tenant, r.request_id), "")) for r in recs
        ]
        items = [i for i in items if i[2] in ("succeeded", "cancelled")]
        if items:
            changed = await shard.rows_written(items)
            rows.metrics.count("redis_state", sum(changed))
