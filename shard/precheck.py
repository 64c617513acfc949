"""Result rows looked up ahead of a delayed job's run-at, by the leading shard loop.

A worker looks a job's ``(tenant, request_id)`` up in Postgres before it runs the handler: a
re-delivered job whose last run committed its row, or a job submitted again after the dedupe
window whose first one ended, is acked without running. On the claim path that lookup is a
Postgres round trip between "due" and "started" of every job.

For delayed jobs it need not be: the leader walks the delayed set a little ahead of now
(``LoopSettings.precheck_ahead_ms``), looks up the jobs that were never claimed, and marks
those without a final row (``prechecked.lua``: hash field ``ck``). Nothing can record such a
job before its first claim (only its own run writes its row; a cancel ends it instead), so
the worker starts a marked job at once on that claim (``ClaimedJob.checked``) and looks it up
alongside, stopping it if a row turns up (a Redis that lost a claim to a failover). A job
claimed once is looked up first on every later claim, as before.

Best effort by design: a job due sooner than the walk gets to it, one submitted behind the
cursor, a pass that fails (Postgres or Redis down) — all simply stay unmarked, and the worker
looks them up as it always did.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter

from shardq.shard.client import ShardClient
from shardq.store.results import ResultStore

log = logging.getLogger("shardq.shard")

#: Tenants passed to one ``precheck.lua`` call (each is one ZSET range there).
TENANTS_PER_CALL = 100


@dataclass(frozen=True, slots=True)
class PrecheckSettings:
    #: How far past now the walk marks jobs, in ms; 0 turns prechecking off. A job submitted
    #: due sooner than this plus ``interval_ms`` may be behind the walk's cursor already (its
    #: worker looks it up). The lookup of a page must end before its first job is due.
    ahead_ms: int = 1_000
    #: Pause between two walks, in ms.
    interval_ms: int = 100
    #: Most delayed-set entries one script call reads.
    batch: int = 500


class PrecheckMetrics:
    def __init__(self, registry: CollectorRegistry, shard_id: str) -> None:
        self.jobs = Counter(
            "shardq_shard_prechecked_jobs",
            "Delayed jobs looked up ahead of their run-at: clean (marked: the worker starts it "
            "without a lookup) or done (a final row exists: the worker acks it unrun)",
            ["shard", "result"], registry=registry,
        )  # fmt: skip
        self.shard_id = shard_id

    def count(self, result: str, n: int) -> None:
        if n:
            self.jobs.labels(shard=self.shard_id, result=result).inc(n)


class Prechecker:
    """:meth:`run` until cancelled (the leader's task group cancels it with leadership)."""

    def __init__(
        self,
        shard: ShardClient,
        store: ResultStore,
        settings: PrecheckSettings | None = None,
        metrics: PrecheckMetrics | None = None,
    ) -> None:
        self.shard = shard
        self.store = store
        self.settings = settings or PrecheckSettings()
        self.metrics = metrics or PrecheckMetrics(CollectorRegistry(), "0")
        #: The next walk reads run-ats from ``_from_ms`` (where the last one ended). Behind now
        #: it jumps to now (those jobs are due: workers look them up).
        self._from_ms = 0
        self._failing = False

    async def run(self) -> None:
        s = self.settings
        if s.ahead_ms <= 0:
            return
        while True:
            try:
                await self.walk()
                if self._failing:
                    log.info("prechecking delayed jobs again")
                self._failing = False
            except Exception as exc:  # an optimisation: it must never stop the leader
                if not self._failing:
                    log.warning("prechecking delayed jobs failed (workers look them up): %s", exc)
                self._failing = True
            await asyncio.sleep(s.interval_ms / 1000)

    async def walk(self) -> None:
        """Mark every job due up to now + ``ahead_ms`` not marked yet: one pass."""
        s = self.settings
        now = self.shard.clock.now_ms()
        until = now + s.ahead_ms
        self._from_ms = max(self._from_ms, now)
        tenants = await self.shard.due_tenants(until)
        done, offset = 0, 0
        while done < len(tenants):
            page = await self.shard.precheck_page(
                self._from_ms, until, tenants[done : done + TENANTS_PER_CALL], offset, s.batch
            )
            if page.jobs:
                found = await self.store.already_done((t, r) for _, t, r in page.jobs)
                clean = [job_id for job_id, t, r in page.jobs if (t, r) not in found]
                marked = await self.shard.mark_prechecked(clean)
                self.metrics.count("clean", marked)
                self.metrics.count("done", len(page.jobs) - len(clean))
            # The cursor moves only once the page is marked: a failed call repeats it.
            done, offset = done + page.tenants_done, page.offset
        self._from_ms = until + 1
