"""Prometheus metrics of one worker process (served by shard.ops_http.OpsServer)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from shard.models import ClaimedJob

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

    def claimed(self, job: ClaimedJob, now_ms: int) -> None:
        self.in_flight.inc()
        self.jobs.labels(job.tenant, job.handler, "claimed").inc()
        self.queue_wait.labels(job.handler).observe(max(0, now_ms - job.run_at_ms) / 1000)

    def finished(self, job: ClaimedJob, kind: str, duration_ms: int, dead: bool) -> None:
        self.in_flight.dec()
        outcome = "dead" if dead else {"success": "succeeded", "failure": "retried"}.get(kind, kind)
        self.jobs.labels(job.tenant, job.handler, outcome).inc()
        if kind in ("success", "failure"):
            self.duration.labels(job.handler).observe(duration_ms / 1000)
