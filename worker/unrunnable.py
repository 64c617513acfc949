"""Jobs this worker has no handler for.

Such a job is not this worker's to fail: another worker of its queue may have the handler (two
groups sharing a queue, or a rolling deploy that adds a handler). The worker hands it back to
ready (``ShardClient.release`` with ``avoid_ms``: its attempt not counted, this worker kept off
it for a while, the tenant's ``unrunnable`` counter raised on the shard), counts it, and says
so in its log once per handler name per interval, however many such jobs arrive.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from shardq.shard.records import ClaimedJob
from shardq.worker.metrics import WorkerMetrics

log = logging.getLogger("shardq.worker")

#: Most distinct handler names remembered per interval; further names are only counted, so
#: a flood of random names cannot grow this worker's memory.
MAX_NAMES_PER_INTERVAL = 1_000


class UnknownHandlers:
    """Counts and logs (once per name per interval) the jobs handed back for want of a handler."""

    def __init__(
        self,
        metrics: WorkerMetrics,
        interval_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.metrics = metrics
        self.interval_s = interval_s
        self._clock = clock
        self._window_start = clock()
        self._logged: set[str] = set()
        #: Jobs of names not logged in this interval because the name cap was reached.
        self._unnamed = 0

    def note(self, job: ClaimedJob) -> None:
        self.metrics.unrunnable_job(job)
        now = self._clock()
        if now - self._window_start >= self.interval_s:
            self._close_window(now)
        if job.handler in self._logged:
            return
        if len(self._logged) >= MAX_NAMES_PER_INTERVAL:
            self._unnamed += 1
            return
        self._logged.add(job.handler)
        log.warning(
            "no handler named %r here: handing its jobs back for another worker of queue %r "
            "(logged once per %gs)",
            job.handler,
            job.queue,
            self.interval_s,
            extra={"handler": job.handler, "tenant": job.tenant, "queue": job.queue},
        )

    def _close_window(self, now: float) -> None:
        if self._unnamed:
            log.warning(
                "%d more jobs handed back in the last %gs, of handler names beyond the first %d "
                "(not logged by name)",
                self._unnamed,
                self.interval_s,
                MAX_NAMES_PER_INTERVAL,
            )
        self._window_start = now
        self._logged.clear()
        self._unnamed = 0
