"""The retention purge: result rows older than their tenant's retention are deleted, in batches.

A tenant's retention is ``result_retention_s`` of its row in ``shardq_tenant_limits``
(``AdminService.SetTenantLimits``, ``shardq tenants set --result-retention``), else the
coordinator's ``--result-retention-s``; 0 keeps its rows forever. Rows are aged by
``finished_at`` (the database's clock when the row was written).

Who purges: every coordinator replica runs a :class:`RetentionPurger`, and each round begins
with ``pg_try_advisory_lock`` on one connection, so one replica purges and the others skip the
round. The lock is a Postgres one rather than the shard loop's leadership because result rows
are not per shard: there is one table for every shard's tenants, and the shard loops (one
leader per shard) would all compete for it; the coordinators already read the tenants' limits
from the same database. A session-level lock is released by Postgres if its holder dies, so no
lease needs renewing and no replica waits on a crashed one.

How: each tenant with rows (found by a loose scan of the primary key, one index probe per
tenant) is purged by statements that each delete at most ``batch_size`` of its rows finished
before its cutoff, found on ``ix_shardq_results_tenant_id_finished_at``, each in a transaction
of its own. No statement holds locks on more than a batch of rows, and ``SKIP LOCKED`` steps
over a row a worker is replacing (a dead job's row) rather than waiting for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

import sqlalchemy as sa
from prometheus_client import CollectorRegistry, Counter
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

log = logging.getLogger(__name__)

#: Key of the advisory lock one replica holds while it purges (any fixed 64-bit number;
#: "shardqrt"; migrations use "shardqmg").
PURGE_LOCK_KEY = 0x73686172_64717274

# Every tenant that has rows, with its retention in seconds (0 and NULL rows: the default).
# A recursive CTE walks the primary key (tenant_id, request_id) one tenant at a time, where
# SELECT DISTINCT would read every row.
_TENANTS = sa.text("""
WITH RECURSIVE t(tenant_id) AS (
    (SELECT tenant_id FROM shardq_results ORDER BY tenant_id LIMIT 1)
    UNION ALL
    SELECT (SELECT r.tenant_id FROM shardq_results r
            WHERE r.tenant_id > t.tenant_id ORDER BY r.tenant_id LIMIT 1)
    FROM t WHERE t.tenant_id IS NOT NULL
)
SELECT tenant_id, retention_s FROM (
    SELECT t.tenant_id, COALESCE(NULLIF(l.result_retention_s, 0), :default_s) AS retention_s
    FROM t LEFT JOIN shardq_tenant_limits l ON l.tenant_id = t.tenant_id
    WHERE t.tenant_id IS NOT NULL
) AS each_tenant
WHERE retention_s > 0
""")

# One batch of one tenant: the ctid of at most :n rows past the cutoff (an index range of
# ix_shardq_results_tenant_id_finished_at), deleted by a TID scan. A row updated between the
# two (a dead job's row replaced by its retry's success) has moved to another ctid and is
# left alone: it is no longer the row that was found old. The outer conditions repeat the
# tenant and the cutoff: a ctid is unique within one table only, and with the table
# partitioned by tenant (docs/scaling.md) each partition has its own; the tenant keeps the
# delete to the tenant's partition, where the ctid names the row that was found.
_PURGE_BATCH = sa.text("""
DELETE FROM shardq_results
WHERE tenant_id = :tenant AND finished_at < now() - make_interval(secs => :retention_s)
  AND ctid = ANY(ARRAY(
    SELECT ctid FROM shardq_results
    WHERE tenant_id = :tenant AND finished_at < now() - make_interval(secs => :retention_s)
    ORDER BY finished_at
    LIMIT :n
    FOR UPDATE SKIP LOCKED
))
""")


@dataclass(frozen=True, slots=True)
class PurgeReport:
    """What one round did: rows deleted, and the statements that deleted them."""

    rows: int = 0
    batches: int = 0
    #: False when another replica held the lock and this one skipped the round.
    ran: bool = True


class PurgeMetrics:
    """``shardq_results_purged_total`` (rows this replica's purge deleted) and
    ``shardq_results_purge_batches_total`` (the statements that deleted them)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.rows = Counter(
            "shardq_results_purged",
            "Result rows deleted by the retention purge (rows past their tenant's retention)",
            registry=registry,
        )
        self.batches = Counter(
            "shardq_results_purge_batches",
            "DELETE statements of the retention purge that deleted rows, each at most "
            "--retention-batch-size",
            registry=registry,
        )

    def batch(self, rows: int) -> None:
        self.batches.inc()
        self.rows.inc(rows)


class RetentionPurger:
    """Purges result rows past their tenant's retention every ``interval_s`` (``run``/``stop``).

    ``on_batch(n)`` is told how many rows each batch deleted, when it deleted any (the
    coordinator counts them: :class:`PurgeMetrics`).
    """

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        default_retention_s: int = 0,
        batch_size: int = 1_000,
        interval_s: float = 60.0,
        on_batch: Callable[[int], None] | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError("the retention batch size must be 1 or more")
        self.engine = engine
        self.default_retention_s = default_retention_s
        self.batch_size = batch_size
        self.interval_s = interval_s
        self.on_batch = on_batch
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._stop.clear()
        self._task = asyncio.create_task(self.run(), name="retention-purge")

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def run(self) -> None:
        while not self._stop.is_set():
            try:
                report = await self.purge_once()
                if report.rows:
                    log.info("retention: purged %d result rows in %d batches",
                             report.rows, report.batches)  # fmt: skip
            except Exception:  # Postgres away: the next round tries again
                log.warning("retention: the purge failed; retrying next round", exc_info=True)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.interval_s)

    async def purge_once(self) -> PurgeReport:
        """One round over every tenant, if no other replica is purging (else ``ran=False``)."""
        async with self.engine.connect() as conn:
            locked = await conn.scalar(
                sa.text("SELECT pg_try_advisory_lock(:k)"), {"k": PURGE_LOCK_KEY}
            )
            await conn.commit()
            if not locked:
                return PurgeReport(ran=False)
            try:
                return await self._purge(conn)
            finally:
                await conn.rollback()  # a batch cut short by stop(): nothing half-done
                await conn.execute(sa.text("SELECT pg_advisory_unlock(:k)"), {"k": PURGE_LOCK_KEY})
                await conn.commit()

    async def _purge(self, conn: AsyncConnection) -> PurgeReport:
        tenants = (await conn.execute(_TENANTS, {"default_s": self.default_retention_s})).all()
        await conn.commit()
        rows = batches = 0
        for tenant, retention_s in tenants:
            while not self._stop.is_set():
                params = {"tenant": tenant, "retention_s": float(retention_s), "n": self.batch_size}
                deleted = (await conn.execute(_PURGE_BATCH, params)).rowcount
                await conn.commit()  # one short transaction per batch: no long locks
                batches += 1
                rows += deleted
                if deleted and self.on_batch is not None:
                    self.on_batch(deleted)
                if deleted < self.batch_size:
                    break
        return PurgeReport(rows=rows, batches=batches)
