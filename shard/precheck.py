"""Result rows looked up ahead of a delayed job's run-at, by the leading shard loop.

A worker starts a job on its first claim at once (``ClaimedJob.at_once``) and looks its
``(tenant, request_id)`` up in Postgres alongside: nothing but the job's own run can record it
before that claim, save a job submitted again after the dedupe window whose first one ended
(or a claim a failed-over Redis lost). When the lookup finds that row, the worker stops the
run and acks the job; the row stands. Every later claim is looked up before it starts.

So that a delayed job submitted again after the window is acked without its handler starting
at all, the leader walks the delayed set a little ahead of now
(``LoopSettings.precheck_ahead_ms``), looks up the jobs that were never claimed, and marks
those a final row answers for (``prechecked.lua``: hash field ``ck`` = ``d``). Their first
claim is then looked up before it starts, as any later claim is.

Best effort by design: a job due sooner than the walk gets to it, one submitted behind the
cursor, a pass that fails (Postgres or Redis down) — all simply stay unmarked, and their
worker's lookup alongside the start stops them if a row is there.
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
            "Delayed jobs looked up ahead of their run-at: clean (no final row: the worker "
            "starts it at once) or done (a final row exists, marked: the worker acks it unrun)",
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
        """Look up every job due up to now + ``ahead_ms`` not looked up yet, and mark those
        found done: one pass."""
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
                done_ids = [job_id for job_id, t, r in page.jobs if (t, r) in found]
                marked = await self.shard.mark_prechecked(done_ids)
                self.metrics.count("done", marked)
                self.metrics.count("clean", len(page.jobs) - len(done_ids))
            # The cursor moves only once the page is marked: a failed call repeats it.
            done, offset = done + page.tenants_done, page.offset
        self._from_ms = until + 1
