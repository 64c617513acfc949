"""A pure-Python model of one shard's job lifecycle, for stateful (model-based) tests.

It mirrors what the Lua scripts promise in their header contracts, written independently of
them: every job's state, fencing token and attempts, plus the FIFO ready lists and the
round-robin rings (so the exact jobs a claim returns can be predicted), the lease deadlines
(so reap can be predicted) and the per-tenant counters. Time is the caller's FakeClock value.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from shardq.shard.client import digest
from shardq.shard.codes import ItemCode

GAUGES = ("scheduled", "ready", "active", "dead")
COUNTERS = ("submitted", "succeeded", "failed")


@dataclass
class ModelJob:
    job_id: str
    tenant: str
    request_id: str
    handler: str
    payload: bytes
    priority: int
    state: str
    run_at: int
    created_at: int
    max_attempts: int
    timeout_ms: int
    attempts: int = 0
    fence: int = 0
    worker: str = ""
    started_at: int = 0
    finished_at: int = 0
    cancel_requested: bool = False
    lease_deadline: int = 0
    error: str = ""


@dataclass(frozen=True)
class Submit:
    """One job of an enqueue call, as the model sees it."""

    tenant: str
    job_id: str
    request_id: str
    handler: str
    payload: bytes
    priority: int
    run_at: int
    max_attempts: int
    timeout_ms: int
    max_pending: int


@dataclass
class ShardModel:
    now: int
    jobs: dict[str, ModelJob] = field(default_factory=dict)
    #: (tenant, priority) -> job IDs in FIFO order, including IDs cancelled while ready.
    ready: dict[tuple[str, int], list[str]] = field(default_factory=dict)
    #: priority -> tenants in round-robin order.
    rings: dict[int, list[str]] = field(default_factory=dict)
    #: (tenant, request_id) -> (first job ID, digest).
    dedupe: dict[tuple[str, str], tuple[str, str]] = field(default_factory=dict)
    fence: int = 0
    counters: dict[str, Counter[str]] = field(default_factory=dict)
    tenants: set[str] = field(default_factory=set)
    #: tenant -> jobs per round-robin turn (absent: 1).
    weights: dict[str, int] = field(default_factory=dict)
    #: priority -> tenant -> jobs claimed in its current turn (weights > 1 only).
    credit: dict[int, dict[str, int]] = field(default_factory=dict)

    # --- helpers ----------------------------------------------------------------------

    def count(self, tenant: str, name: str, by: int = 1) -> None:
        self.counters.setdefault(tenant, Counter())[name] += by

    def gauges(self, tenant: str) -> dict[str, int]:
        c = Counter(j.state for j in self.jobs.values() if j.tenant == tenant)
        return {g: c[g] for g in GAUGES}

    def in_state(self, state: str) -> list[ModelJob]:
        return [j for j in self.jobs.values() if j.state == state]

    def _push_ready(self, job: ModelJob) -> None:
        lst = self.ready.setdefault((job.tenant, job.priority), [])
        lst.append(job.job_id)
        if len(lst) == 1:
            self.rings.setdefault(job.priority, []).append(job.tenant)

    def _finish(self, job: ModelJob, state: str) -> None:
        job.state = state
        job.finished_at = self.now

    # --- operations -------------------------------------------------------------------

    def enqueue(self, submits: list[Submit]) -> list[tuple[ItemCode, str, str]]:
        out = []
        for s in submits:
            d = digest(s.handler, s.payload)
            seen = self.dedupe.get((s.tenant, s.request_id))
            if seen is not None:
                first_id, first_digest = seen
                code = ItemCode.DEDUPLICATED if first_digest == d else ItemCode.CONFLICT
                first = self.jobs.get(first_id)
                out.append((code, first_id, first.state if first else ""))
                continue
            g = self.gauges(s.tenant)
            if s.max_pending and g["scheduled"] + g["ready"] + g["active"] >= s.max_pending:
                out.append((ItemCode.OVER_QUOTA, "", ""))
                continue
            state = "scheduled" if s.run_at > self.now else "ready"
            job = ModelJob(
                job_id=s.job_id, tenant=s.tenant, request_id=s.request_id, handler=s.handler,
                payload=s.payload, priority=s.priority, state=state, run_at=s.run_at,
                created_at=self.now, max_attempts=s.max_attempts, timeout_ms=s.timeout_ms,
            )  # fmt: skip
            self.jobs[s.job_id] = job
            self.dedupe[(s.tenant, s.request_id)] = (s.job_id, d)
            if state == "ready":
                self._push_ready(job)
            self.count(s.tenant, "submitted")
            self.tenants.add(s.tenant)
            out.append((ItemCode.OK, s.job_id, state))
        return out

    def next_due(self) -> int | None:
        return min((j.run_at for j in self.in_state("scheduled")), default=None)

    def promote(self) -> tuple[int, int | None]:
        due = sorted(
            (j for j in self.in_state("scheduled") if j.run_at <= self.now),
            key=lambda j: (j.run_at, j.job_id),
        )
        for job in due:
            job.state = "ready"
            self._push_ready(job)
        return len(due), self.next_due()

    def set_weight(self, tenant: str, weight: int) -> None:
        if weight == 1:
            self.weights.pop(tenant, None)
        else:
            self.weights[tenant] = weight

    def _advance_ring(self, prio: int, remaining: int) -> None:
        """After serving the ring's head once: drop it when empty, else rotate after w turns."""
        ring, credit = self.rings[prio], self.credit.setdefault(prio, {})
        tenant = ring[0]
        if remaining == 0:
            ring.pop(0)
            credit.pop(tenant, None)
            return
        w = self.weights.get(tenant, 1)
        if w > 1:
            credit[tenant] = credit.get(tenant, 0) + 1
            if credit[tenant] < w:
                return
            del credit[tenant]
        ring.append(ring.pop(0))

    def claim(self, worker: str, max_jobs: int, lease_ms: int) -> list[ModelJob]:
        claimed: list[ModelJob] = []
        for prio in range(9, -1, -1):
            ring = self.rings.get(prio, [])
            while len(claimed) < max_jobs and ring:
                lst = self.ready[(ring[0], prio)]
                job = self.jobs[lst.pop(0)]
                self._advance_ring(prio, len(lst))
                if job.state != "ready":
                    continue  # cancelled while ready: removed lazily
                self.fence += 1
                job.state, job.fence, job.worker = "active", self.fence, worker
                job.attempts += 1
                job.started_at = self.now
                job.lease_deadline = self.now + lease_ms
                claimed.append(job)
        return claimed

    def _current(self, job_id: str, fence: int) -> ModelJob | None:
        job = self.jobs.get(job_id)
        if job is None or job.state != "active" or job.fence != fence:
            return None
        return job

    def heartbeat(self, leases: list[tuple[str, int]], lease_ms: int) -> list[ItemCode]:
        out = []
        for job_id, fence in leases:
            job = self._current(job_id, fence)
            if job is None:
                out.append(ItemCode.STALE_LEASE)
                continue
            job.lease_deadline = self.now + lease_ms
            out.append(ItemCode.CANCEL_REQUESTED if job.cancel_requested else ItemCode.OK)
        return out

    def ack(self, leases: list[tuple[str, int]]) -> list[ItemCode]:
        out = []
        for job_id, fence in leases:
            job = self._current(job_id, fence)
            if job is None:
                out.append(ItemCode.STALE_LEASE)
            elif job.cancel_requested:
                self._finish(job, "cancelled")
                out.append(ItemCode.CANCELLED)
            else:
                self._finish(job, "succeeded")
                self.count(job.tenant, "succeeded")
                out.append(ItemCode.OK)
        return out

    def fail(self, failures: list[tuple[str, int, str, int, bool]]) -> list[tuple[ItemCode, str]]:
        """``failures``: (job_id, fence, error, retry_at, permanent)."""
        out = []
        for job_id, fence, error, retry_at, permanent in failures:
            job = self._current(job_id, fence)
            if job is None:
                current = self.jobs.get(job_id)
                out.append((ItemCode.STALE_LEASE, current.state if current else ""))
                continue
            self.count(job.tenant, "failed")
            job.error = error
            if job.cancel_requested:
                self._finish(job, "cancelled")
                out.append((ItemCode.CANCELLED, "cancelled"))
            elif permanent or job.attempts >= job.max_attempts:
                self._finish(job, "dead")
                out.append((ItemCode.OK, "dead"))
            else:
                job.state, job.run_at = "scheduled", retry_at
                out.append((ItemCode.OK, "scheduled"))
        return out

    def reap(self) -> tuple[int, int]:
        expired = sorted(
            (j for j in self.in_state("active") if j.lease_deadline <= self.now),
            key=lambda j: (j.lease_deadline, j.job_id),
        )
        to_ready = to_dead = 0
        for job in expired:
            self.count(job.tenant, "failed")
            job.error = "lease expired"
            if job.cancel_requested:
                self._finish(job, "cancelled")
            elif job.attempts >= job.max_attempts:
                self._finish(job, "dead")
                to_dead += 1
            else:
                job.state = "ready"
                self._push_ready(job)
                to_ready += 1
        return to_ready, to_dead

    def cancel(self, tenant: str, job_id: str) -> tuple[ItemCode, str]:
        job = self.jobs.get(job_id)
        if job is None or job.tenant != tenant:
            return ItemCode.NOT_FOUND, ""
        if job.state == "active":
            job.cancel_requested = True
            return ItemCode.CANCEL_REQUESTED, "active"
        if job.state in ("scheduled", "ready"):
            self._finish(job, "cancelled")
            return ItemCode.OK, "cancelled"
        return ItemCode.ALREADY_TERMINAL, job.state

    def requeue_dead(self, tenant: str, job_ids: list[str]) -> tuple[int, list[str]]:
        requeued, missing = 0, []
        for job_id in job_ids:
            job = self.jobs.get(job_id)
            if job is None or job.tenant != tenant or job.state != "dead":
                missing.append(job_id)
                continue
            job.state, job.attempts, job.finished_at = "ready", 0, 0
            self._push_ready(job)
            requeued += 1
        return requeued, missing
