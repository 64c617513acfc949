"""Prometheus metrics of one worker process (served by shard.ops_http.OpsServer)."""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from shardq.shard.records import ClaimedJob

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class WorkerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry or CollectorRegistry()
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
        self.lease_lost = Counter("shardq_worker_lease_losses", "Leases lost mid-run", registry=r)
        self.shards = Gauge("shardq_worker_shards", "Shards this worker claims from", registry=r)

        # Label children by their labels: ``labels()`` locks and builds tuples on every call,
        # a cost per job that showed in the profile of a drain.
        self._jobs: dict[tuple[str, str, str], Counter] = {}
        self._duration: dict[str, Histogram] = {}
        self._queue_wait: dict[str, Histogram] = {}

    def _count(self, tenant: str, handler: str, outcome: str) -> None:
        key = (tenant, handler, outcome)
        child = self._jobs.get(key)
        if child is None:
            child = self._jobs[key] = self.jobs.labels(*key)
        child.inc()

    def claimed_many(self, jobs: Sequence[ClaimedJob], now_ms: int) -> None:
        self.in_flight.inc(len(jobs))
        for job in jobs:
            self._count(job.tenant, job.handler, "claimed")
            wait = self._queue_wait.get(job.handler)
            if wait is None:
                wait = self._queue_wait[job.handler] = self.queue_wait.labels(job.handler)
            wait.observe(max(0, now_ms - job.run_at_ms) / 1000)

    def claimed(self, job: ClaimedJob, now_ms: int) -> None:
        self.claimed_many([job], now_ms)

    def finished(self, job: ClaimedJob, kind: str, duration_ms: int, dead: bool) -> None:
        self.in_flight.dec()
        outcome = "dead" if dead else {"success": "succeeded", "failure": "retried"}.get(kind, kind)
        self._count(job.tenant, job.handler, outcome)
        if kind in ("success", "failure"):
            hist = self._duration.get(job.handler)
            if hist is None:
                hist = self._duration[job.handler] = self.duration.labels(job.handler)
            hist.observe(duration_ms / 1000)
