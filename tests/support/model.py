"""A pure-Python model of one shard's job lifecycle, for stateful (model-based) tests.

It mirrors what the Lua scripts promise in their header contracts, written independently of
them: every job's state, queue, fencing token and attempts, plus the FIFO ready lists per
tenant, queue and priority and the round-robin rings per queue with their lazy clean-up (so
the exact jobs a claim returns can be predicted: tenants take turns first, then the tenant's
highest priority, then FIFO), the tenants' limits (weight, max_active and the pending quotas),
pauses and parking, hand-backs for a missing handler, the lease deadlines (so reap can be
predicted) and the per-tenant counters. Time is the caller's FakeClock value.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from shardq.shard.client import digest
from shardq.shard.codes import ItemCode

GAUGES = ("scheduled", "ready", "active", "dead", "bytes")
COUNTERS = ("submitted", "succeeded", "failed", "unrunnable")
PENDING = ("scheduled", "ready", "active")
DEFAULT_QUEUE = "default"
#: claim.lua's cap on IDs and ring entries passed over in one call.
MAX_SKIP = 1000


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
    queue: str = DEFAULT_QUEUE
    attempts: int = 0
    fence: int = 0
    worker: str = ""
    started_at: int = 0
    finished_at: int = 0
    cancel_requested: bool = False
    lease_deadline: int = 0
    error: str = ""
    #: A hand-back for a missing handler: this worker may not claim it before avoid_until.
    avoid_worker: str = ""
    avoid_until: int = 0


@dataclass(frozen=True)
class Submit:
    """One job of an enqueue call, as the model sees it (limits: the caller's defaults)."""

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
    queue: str = DEFAULT_QUEUE
    max_pending_bytes: int = 0


@dataclass
class ShardModel:
    now: int
    jobs: dict[str, ModelJob] = field(default_factory=dict)
    #: (tenant, queue, priority) -> job IDs in FIFO order, including IDs cancelled while ready.
    ready: dict[tuple[str, str, int], list[str]] = field(default_factory=dict)
    #: queue -> tenants in round-robin order.
    rings: dict[str, list[str]] = field(default_factory=dict)
    #: (tenant, request_id) -> (first job ID, digest).
    dedupe: dict[tuple[str, str], tuple[str, str]] = field(default_factory=dict)
    fence: int = 0
    counters: dict[str, Counter[str]] = field(default_factory=dict)
    tenants: set[str] = field(default_factory=set)
    #: tenant -> the limits:{t} hash (fields set, as stored).
    limits: dict[str, dict[str, int]] = field(default_factory=dict)
    #: queue -> tenant -> jobs claimed in its current turn (weights > 1 only).
    credit: dict[str, dict[str, int]] = field(default_factory=dict)
    paused: set[str] = field(default_factory=set)
    paused_queues: set[str] = field(default_factory=set)
    #: '{tenant}/{queue}' of one tenant's paused queue.
    paused_tenant_queues: set[str] = field(default_factory=set)
    parked: set[str] = field(default_factory=set)
    #: job ID -> when it ended dead or cancelled with no worker to write its row (the
    #: outbox ZSET; nothing here drains it, the shard loop does).
    outbox: dict[str, int] = field(default_factory=dict)
    #: tenant -> its score on ``due``: at or before its earliest scheduled run-at (a cancel
    #: leaves it early; promote sets it right once it is due).
    due: dict[str, int] = field(default_factory=dict)

    # --- helpers ----------------------------------------------------------------------

    def _due_by(self, tenant: str, at: int) -> None:
        self.due[tenant] = min(self.due.get(tenant, at), at)

    def _earliest(self, tenant: str) -> int | None:
        return min(
            (j.run_at for j in self.in_state("scheduled") if j.tenant == tenant), default=None
        )

    def _undue_if_empty(self, tenant: str) -> None:
        if self._earliest(tenant) is None:
            self.due.pop(tenant, None)

    def count(self, tenant: str, name: str, by: int = 1) -> None:
        self.counters.setdefault(tenant, Counter())[name] += by

    def gauges(self, tenant: str) -> dict[str, int]:
        mine = [j for j in self.jobs.values() if j.tenant == tenant]
        c = Counter(j.state for j in mine)
        out = {g: c[g] for g in GAUGES}
        out["bytes"] = sum(len(j.payload) for j in mine if j.state in PENDING)
        return out

    def in_state(self, state: str) -> list[ModelJob]:
        return [j for j in self.jobs.values() if j.state == state]

    def active_of(self, tenant: str) -> int:
        return sum(1 for j in self.jobs.values() if j.tenant == tenant and j.state == "active")

    def lists_of(self, tenant: str, queue: str) -> dict[int, list[str]]:
        """The tenant's non-empty ready lists in the queue, by priority."""
        return {
            p: ids for (t, q, p), ids in self.ready.items() if t == tenant and q == queue and ids
        }

    def queues_of(self, tenant: str) -> set[str]:
        """The queues where the tenant has a non-empty ready list (``tqueues:{t}``)."""
        return {q for (t, q, _), ids in self.ready.items() if t == tenant and ids}

    def _ring_tenant(self, tenant: str, queue: str) -> None:
        ring = self.rings.setdefault(queue, [])
        if tenant not in ring:
            ring.append(tenant)

    def _push_ready(self, job: ModelJob) -> None:
        lst = self.ready.setdefault((job.tenant, job.queue, job.priority), [])
        lst.append(job.job_id)
        if len(lst) == 1:
            self._ring_tenant(job.tenant, job.queue)

    def _rering(self, tenant: str) -> None:
        if tenant in self.paused or tenant in self.parked:
            return
        for q in self.queues_of(tenant):
            if f"{tenant}/{q}" not in self.paused_tenant_queues:
                self._ring_tenant(tenant, q)

    def _unpark_if_below_cap(self, tenant: str) -> None:
        if tenant not in self.parked:
            return
        cap = self.limits.get(tenant, {}).get("max_active", 0)
        if cap == 0 or self.active_of(tenant) < cap:
            self.parked.discard(tenant)
            self._rering(tenant)

    def _end_lease(self, job: ModelJob, state: str) -> None:
        """The job leaves active (the caller sets where it goes, ``state``)."""
        job.state = state
        self._unpark_if_below_cap(job.tenant)

    def _finish(self, job: ModelJob, state: str, rowless: bool = True) -> None:
        """The job ends in ``state``; ``rowless`` when no worker writes its row (every end
        but a worker's ack of a success or its fail that kills the job)."""
        job.state = state
        job.finished_at = self.now
        if rowless:
            self.outbox[job.job_id] = self.now

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
            stored = self.limits.get(s.tenant, {})
            max_pending = stored.get("max_pending") or s.max_pending
            max_bytes = stored.get("max_pending_bytes") or s.max_pending_bytes
            g = self.gauges(s.tenant)
            if (max_pending and sum(g[p] for p in PENDING) >= max_pending) or (
                max_bytes and g["bytes"] + len(s.payload) > max_bytes
            ):
                out.append((ItemCode.OVER_QUOTA, "", ""))
                continue
            state = "scheduled" if s.run_at > self.now else "ready"
            job = ModelJob(
                job_id=s.job_id, tenant=s.tenant, request_id=s.request_id, handler=s.handler,
                payload=s.payload, priority=s.priority, state=state, run_at=s.run_at,
                created_at=self.now, max_attempts=s.max_attempts, timeout_ms=s.timeout_ms,
                queue=s.queue,
            )  # fmt: skip
            self.jobs[s.job_id] = job
            self.dedupe[(s.tenant, s.request_id)] = (s.job_id, d)
            if state == "ready":
                self._push_ready(job)
            else:
                self._due_by(s.tenant, s.run_at)
            self.count(s.tenant, "submitted")
            self.tenants.add(s.tenant)
            out.append((ItemCode.OK, s.job_id, state))
        return out

    def next_due(self) -> int | None:
        return min(self.due.values(), default=None)

    def promote(self) -> tuple[int, int | None]:
        due = sorted(
            (j for j in self.in_state("scheduled") if j.run_at <= self.now),
            key=lambda j: (j.run_at, j.tenant, j.job_id),
        )
        for job in due:
            job.state = "ready"
            self._push_ready(job)
        for tenant in [t for t, at in self.due.items() if at <= self.now]:
            earliest = self._earliest(tenant)
            if earliest is None:
                del self.due[tenant]
            else:
                self.due[tenant] = earliest
        return len(due), self.next_due()

    def set_limits(self, tenant: str, values: dict[str, int]) -> None:
        """``set_limits.lua`` with these fields (0: removed)."""
        self.limits[tenant] = {k: v for k, v in values.items() if v > 0}
        for credit in self.credit.values():
            credit.pop(tenant, None)
        if not self.limits[tenant]:
            del self.limits[tenant]
        cap = values.get("max_active", 0)
        if cap > 0 and self.active_of(tenant) >= cap:
            self.parked.add(tenant)
        else:
            self._unpark_if_below_cap(tenant)

    def pause(self, tenant: str | None, queue: str | None) -> bool:
        target, members = self._pause_set(tenant, queue)
        added = target not in members
        members.add(target)
        return added

    def resume(self, tenant: str | None, queue: str | None) -> bool:
        target, members = self._pause_set(tenant, queue)
        if target not in members:
            return False
        members.discard(target)
        if tenant and queue:
            if (
                queue in self.queues_of(tenant)
                and tenant not in self.paused
                and tenant not in self.parked
            ):
                self._ring_tenant(tenant, queue)
        elif tenant:
            self._rering(tenant)
        return True

    def _pause_set(self, tenant: str | None, queue: str | None) -> tuple[str, set[str]]:
        if tenant and queue:
            return f"{tenant}/{queue}", self.paused_tenant_queues
        if tenant:
            return tenant, self.paused
        assert queue
        return queue, self.paused_queues

    # --- claim: claim.lua, step by step ---------------------------------------------------

    def claim(
        self, worker: str, max_jobs: int, lease_ms: int, queues: Iterable[str] = (DEFAULT_QUEUE,)
    ) -> list[ModelJob]:
        c = _Claim(self, worker, max_jobs, lease_ms)
        names = [q for q in dict.fromkeys(queues) if q not in self.paused_queues]
        c.stuck = {q: set() for q in names}
        at = 0
        while len(c.claimed) < max_jobs and c.skipped < MAX_SKIP and names:
            if at >= len(names):
                at = 0
            if c.claim_from(names[at]):
                at += 1
            else:
                names.pop(at)
        return c.claimed

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
                continue
            state = "cancelled" if job.cancel_requested else "succeeded"
            self._end_lease(job, state)
            self._finish(job, state, rowless=job.cancel_requested)
            if state == "succeeded":
                self.count(job.tenant, "succeeded")
            out.append(ItemCode.CANCELLED if job.cancel_requested else ItemCode.OK)
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
                self._end_lease(job, "cancelled")
                self._finish(job, "cancelled")
                out.append((ItemCode.CANCELLED, "cancelled"))
            elif permanent or job.attempts >= job.max_attempts:
                self._end_lease(job, "dead")
                self._finish(job, "dead", rowless=False)
                out.append((ItemCode.OK, "dead"))
            else:
                self._end_lease(job, "scheduled")
                job.run_at = retry_at
                self._due_by(job.tenant, retry_at)
                out.append((ItemCode.OK, "scheduled"))
        return out

    def release(self, leases: list[tuple[str, int]], avoid_ms: int) -> list[ItemCode]:
        out = []
        for job_id, fence in leases:
            job = self._current(job_id, fence)
            if job is None:
                out.append(ItemCode.STALE_LEASE)
                continue
            if job.cancel_requested:
                self._end_lease(job, "cancelled")
                self._finish(job, "cancelled")
                out.append(ItemCode.CANCELLED)
                continue
            self._end_lease(job, "ready")
            job.attempts -= 1
            if avoid_ms > 0:
                job.avoid_worker, job.avoid_until = job.worker, self.now + avoid_ms
                self.count(job.tenant, "unrunnable")
            self._push_ready(job)
            out.append(ItemCode.OK)
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
                self._end_lease(job, "cancelled")
                self._finish(job, "cancelled")
            elif job.attempts >= job.max_attempts:
                self._end_lease(job, "dead")
                self._finish(job, "dead")
                to_dead += 1
            else:
                self._end_lease(job, "ready")
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
            self._undue_if_empty(tenant)
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


@dataclass
class _Claim:
    """One claim call of claim.lua on the model."""

    m: ShardModel
    worker: str
    max_jobs: int
    lease_ms: int
    claimed: list[ModelJob] = field(default_factory=list)
    skipped: int = 0
    #: Job IDs this worker must avoid met in this call.
    avoided: set[str] = field(default_factory=set)
    #: queue -> tenants whose highest priority holds only jobs to avoid.
    stuck: dict[str, set[str]] = field(default_factory=dict)

    def weight(self, tenant: str) -> int:
        return max(1, self.m.limits.get(tenant, {}).get("weight", 1))

    def blocked(self, tenant: str, queue: str) -> bool:
        m = self.m
        if tenant in m.paused or tenant in m.parked:
            return True
        cap = m.limits.get(tenant, {}).get("max_active", 0)
        if cap > 0 and m.active_of(tenant) >= cap:
            m.parked.add(tenant)
            return True
        return f"{tenant}/{queue}" in m.paused_tenant_queues

    def drop_head(self, queue: str) -> None:
        tenant = self.m.rings[queue].pop(0)
        self.m.credit.get(queue, {}).pop(tenant, None)

    def end_turn(self, queue: str) -> None:
        ring = self.m.rings[queue]
        self.m.credit.get(queue, {}).pop(ring[0], None)
        ring.append(ring.pop(0))

    def advance(self, queue: str, tenant: str, remaining: bool) -> None:
        if not remaining:
            self.drop_head(queue)
            return
        w = self.weight(tenant)
        if w > 1:
            credit = self.m.credit.setdefault(queue, {})
            credit[tenant] = credit.get(tenant, 0) + 1
            if credit[tenant] < w:
                return
        self.end_turn(queue)

    def claim_from(self, queue: str) -> bool:
        m = self.m
        ring = m.rings.setdefault(queue, [])
        while self.skipped < MAX_SKIP:
            if not ring:
                return False
            tenant = ring[0]
            if self.blocked(tenant, queue):
                self.drop_head(queue)
                self.skipped += 1
                continue
            if tenant in self.stuck[queue]:
                if len(self.stuck[queue]) >= len(ring):
                    return False
                self.end_turn(queue)
                self.skipped += 1
                continue
            lists = m.lists_of(tenant, queue)
            if not lists:
                self.drop_head(queue)
                self.skipped += 1
                continue
            prio = max(lists)
            lst = lists[prio]
            job = m.jobs[lst.pop(0)]
            remaining = bool(lst) or len(lists) > 1
            if job.state == "ready" and job.avoid_worker == self.worker and job.avoid_until > m.now:
                lst.append(job.job_id)
                if job.job_id in self.avoided:
                    self.stuck[queue].add(tenant)
                self.avoided.add(job.job_id)
                self.end_turn(queue)
                self.skipped += 1
                continue
            self.advance(queue, tenant, remaining)
            if job.state != "ready":
                self.skipped += 1  # cancelled while ready: removed lazily
                continue
            self.take(job)
            return True
        return False

    def take(self, job: ModelJob) -> None:
        m = self.m
        m.fence += 1
        job.state, job.fence, job.worker = "active", m.fence, self.worker
        job.attempts += 1
        job.started_at = m.now
        job.lease_deadline = m.now + self.lease_ms
        job.avoid_worker, job.avoid_until = "", 0
        cap = m.limits.get(job.tenant, {}).get("max_active", 0)
        if cap > 0 and m.active_of(job.tenant) >= cap:
            m.parked.add(job.tenant)
        self.claimed.append(job)
