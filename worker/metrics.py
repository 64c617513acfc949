"""Prometheus metrics of one worker process (served by shard.ops_http.OpsServer).

Label values come from bounded sets only: a ``handler`` label is one of this worker's
registered handlers, or ``other`` for any name it does not have (jobs carry whatever name a
client sent, and 500 random names once made 21,000 series); a ``queue`` label is one of the
queues this worker serves, or ``other``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from shardq.shard.records import ClaimedJob

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

#: The label value of every handler (or queue) name this worker does not have.
OTHER = "other"


class WorkerMetrics:
    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        handlers: Iterable[str] = (),
        queues: Iterable[str] = (),
    ) -> None:
        r = self.registry = registry or CollectorRegistry()
        self._handlers = frozenset(handlers)
        self._queues = frozenset(queues)
        self.jobs = Counter(
            "shardq_worker_jobs", "Jobs by outcome", ["tenant", "handler", "outcome"], registry=r
        )
        self.duration = Histogram(
            "shardq_worker_job_duration_seconds", "Handler run time", ["handler"],
            buckets=_LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.queue_wait = Histogram(
            "shardq_worker_queue_wait_seconds", "Claim time minus due time", ["handler"],
            buckets=_LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.in_flight = Gauge("shardq_worker_in_flight", "Jobs held by this worker", registry=r)
        #: Read at each scrape from the worker (``Worker._recording``): no cost per job.
        self.awaiting_rows = Gauge(
            "shardq_worker_awaiting_rows",
            "Jobs whose handler has returned, waiting for their result row and ack",
            registry=r,
        )
        self.lease_lost = Counter("shardq_worker_lease_losses", "Leases lost mid-run", registry=r)
        self.shards = Gauge("shardq_worker_shards", "Shards this worker claims from", registry=r)
        self.unrunnable = Counter(
            "shardq_worker_unrunnable",
            "Jobs handed back because this worker has no handler of their name",
            ["queue"],
            registry=r,
        )

        # Label children by their labels: ``labels()`` locks and builds tuples on every call,
        # a cost per job that showed in the profile of a drain.
        self._jobs: dict[tuple[str, str, str], Counter] = {}
        self._duration: dict[str, Histogram] = {}
        self._queue_wait: dict[str, Histogram] = {}

    def serve(self, handlers: Iterable[str], queues: Iterable[str]) -> None:
        """The handler and queue names that get label values of their own."""
        self._handlers = frozenset(handlers)
        self._queues = frozenset(queues)

    def handler_label(self, name: str) -> str:
        return name if name in self._handlers else OTHER

    def _count(self, tenant: str, handler: str, outcome: str) -> None:
        key = (tenant, handler, outcome)
        child = self._jobs.get(key)
        if child is None:
            child = self._jobs[key] = self.jobs.labels(*key)
        child.inc()

    def claimed_many(self, jobs: Sequence[ClaimedJob], now_ms: int) -> None:
        self.in_flight.inc(len(jobs))
        for job in jobs:
            handler = self.handler_label(job.handler)
            self._count(job.tenant, handler, "claimed")
            wait = self._queue_wait.get(handler)
            if wait is None:
                wait = self._queue_wait[handler] = self.queue_wait.labels(handler)
            # Both by the shard's clock when the claim says when it started (this worker's
            # clock may be off); ``now_ms`` for a record without it.
            wait.observe(max(0, (job.started_at_ms or now_ms) - job.run_at_ms) / 1000)

    def claimed(self, job: ClaimedJob, now_ms: int) -> None:
        self.claimed_many([job], now_ms)

    def finished(self, job: ClaimedJob, kind: str, duration_ms: int, dead: bool) -> None:
        self.in_flight.dec()
        outcome = "dead" if dead else {"success": "succeeded", "failure": "retried"}.get(kind, kind)
        handler = self.handler_label(job.handler)
        self._count(job.tenant, handler, outcome)
        if kind in ("success", "failure"):
            hist = self._duration.get(handler)
            if hist is None:
                hist = self._duration[handler] = self.duration.labels(handler)
            hist.observe(duration_ms / 1000)

    def unrunnable_job(self, job: ClaimedJob) -> None:
        self.unrunnable.labels(job.queue if job.queue in self._queues else OTHER).inc()
