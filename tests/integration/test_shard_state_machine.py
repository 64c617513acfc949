"""Model-based test of a shard: random sequences of every job operation on a real redis-server.

A hypothesis ``RuleBasedStateMachine`` drives :class:`~shard.client.ShardClient` (enqueue in
two queues with dedupe and quotas of jobs and bytes, tenant limits (weight, max_active,
max_pending), pause and resume of tenants, queues and a tenant's queue, clock moves incl.
exactly onto a deadline, promote, claim from one or both queues, heartbeat, ack, fail, release
with and without a hand-back, reap, cancel, requeue_dead) against one redis-server and a
FakeClock, and keeps a Python model of every job (:mod:`tests.support.model`). After every step
the whole keyspace is read back and checked twice: against the data-structure rules alone
(each job sits in exactly the structures of the state its hash names, the priorities and
queues of a tenant are exactly its non-empty lists, each ring holds every tenant that may be
served there and only tenants with ready jobs there, a tenant is parked exactly when it is at
its max_active, the gauges count the jobs (and payload bytes) in each state) and against the
model (job hashes field by field, the FIFO order of ready lists and rings, credits, lease
deadlines, counters, the fencing counter). Calls made only with stale fences, and refused
cancels, must leave the keyspace byte for byte as it was; every new fencing token is above all
earlier ones.

One redis-server and one event loop serve the whole run; each example starts from FLUSHALL.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Awaitable, Iterable
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.internal.conjecture import engine as hypothesis_engine
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from redis.asyncio import Redis

from shardq.common.errors import FailedPrecondition, NotFound
from shardq.coordinator.tools.redis_server import RedisProcess
from shardq.shard import (
    FakeClock,
    ItemCode,
    Lease,
    NewJob,
    ShardClient,
    ShardSettings,
    TenantLimits,
)
from shardq.shard.keys import TERMINAL_STATES
from shardq.shard.models import Failure
from tests.support.model import COUNTERS, GAUGES, ModelJob, ShardModel, Submit
from tests.support.shard import NOW
from tests.support.state import snapshot

T = TypeVar("T")

P = "sq"  # key prefix
TENANTS = ("acme", "bravo", "chi")
REQUEST_IDS = tuple(f"req-{i}" for i in range(6))
HANDLERS = ("email.send", "pdf.render")
PAYLOADS = (b"{}", b'{"n":1}')
QUEUES = ("default", "b")
#: What a claim serves: one queue, or both in either order.
CLAIM_QUEUES = (("default",), ("b",), ("default", "b"), ("b", "default"))
MISSING_JOB = "J99999"


def _is_wake(key: str) -> bool:
    """Keys written for idle workers and the shard loop; their content is not job state."""
    return key == f"{P}:promoter_wake" or key.startswith(f"{P}:wake:")


#: Longest Hypothesis shrinks a failure, in s (its own limit is 300 s): then it reports the
#: smallest example found so far. Generation (~35 s on a quiet 2-core box) plus this stays
#: within the test's timeout, so a failure is reported with its example, not cut off.
SHRINK_S = 60
#: The test's timeout, in s: generation, shrinking, the report and closing, with room for a
#: loaded machine.
TIMEOUT_S = 240
#: Longest one Redis call of the machine may take, in s: a hung call fails the run instead of
#: hanging it.
CALL_TIMEOUT_S = 20.0

SETTINGS = settings(
    max_examples=100,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

submits = st.fixed_dictionaries(
    {
        "tenant": st.sampled_from(TENANTS),
        # None: a fresh request ID; else one of a few, reused with the same or another payload.
        "request_id": st.one_of(st.none(), st.none(), st.sampled_from(REQUEST_IDS)),
        "handler": st.sampled_from(HANDLERS),
        "payload": st.sampled_from(PAYLOADS),
        # Any of 0-9, but mostly two: fairness needs several tenants' jobs at one priority.
        "priority": st.one_of(st.sampled_from([0, 7]), st.integers(0, 9)),
        # Negative: a run-at in the past (ready at once); 0: due now; positive: scheduled.
        "delay": st.sampled_from([-1_000, 0, 0, 0, 0, 1, 250, 1_000, 5_000]),
        "max_attempts": st.integers(1, 3),
        "timeout_ms": st.sampled_from([0, 1_000]),
        "max_pending": st.sampled_from([0, 0, 0, 0, 0, 0, 2, 5]),
        "max_pending_bytes": st.sampled_from([0] * 10 + [9, 20]),
        "queue": st.sampled_from(["default", "default", "b"]),
    }
)
#: A pause's target: a tenant, a queue, or a tenant's queue.
pause_targets = st.one_of(
    st.tuples(st.sampled_from(TENANTS), st.none()),
    st.tuples(st.none(), st.sampled_from(QUEUES)),
    st.tuples(st.sampled_from(TENANTS), st.sampled_from(QUEUES)),
)


# --- reading the keyspace ---------------------------------------------------------------


def _members(value: Any) -> list[str]:
    """IDs held by a zset ([(member, score)]) or a list."""
    return [m[0] if isinstance(m, tuple) else m for m in value]


# --- the rules every keyspace must follow, whatever led to it -----------------------------


def _places(snap: dict[str, Any]) -> dict[str, Counter[str]]:
    """job ID -> how many times each job structure holds it."""
    structural = (":tscheduled:", ":ready:", ":leases", ":tactive:", ":dead:")
    places: dict[str, Counter[str]] = {}
    for key, value in snap.items():
        if any(s in key for s in structural):
            for jid in _members(value):
                places.setdefault(jid, Counter())[key] += 1
    return places


def _expected_places(state: str, t: str, q: str, prio: str) -> dict[str, int]:
    return {
        "scheduled": {f"{P}:tscheduled:{t}": 1},
        "ready": {f"{P}:ready:{t}:{q}:{prio}": 1},
        "active": {f"{P}:leases": 1, f"{P}:tactive:{t}": 1},
        "dead": {f"{P}:dead:{t}": 1},
    }.get(state, {})


def _lists(snap: dict[str, Any]) -> dict[tuple[str, str, int], list[str]]:
    """(tenant, queue, priority) -> ready list, from ``ready:{t}:{q}:{p}`` keys."""
    out = {}
    for key, value in snap.items():
        if key.startswith(f"{P}:ready:"):
            _, _, t, q, prio = key.split(":")
            out[(t, q, int(prio))] = value
    return out


def check_structures(snap: dict[str, Any]) -> None:
    """Each job is in exactly the structures of its state; priorities, queues, rings,
    parking, gauges and fences agree."""
    jobs = {k.removeprefix(f"{P}:job:"): h for k, h in snap.items() if k.startswith(f"{P}:job:")}
    places = _places(snap)
    assert set(places) <= set(jobs), f"structures hold unknown jobs {set(places) - set(jobs)}"
    for jid, h in jobs.items():
        state, t, q, prio = h["s"], h["t"], h.get("q", "default"), h.get("pr", "0")
        assert h.get("q") != "default", "the default queue is never stored"
        got = dict(places.get(jid, {}))
        want = _expected_places(state, t, q, prio)
        if state == "cancelled" and got == {f"{P}:ready:{t}:{q}:{prio}": 1}:
            want = got  # cancelled while ready: its ID is removed lazily by claim
        assert got == want, f"job {jid} ({state}) is in {got}, expected {want}"
    lists = _lists(snap)
    tenants = {h["t"] for h in jobs.values()}
    work = {(t, q) for (t, q, _) in lists}
    for t in tenants:
        for q in QUEUES:
            prios = [int(m) for m, _ in snap.get(f"{P}:tprio:{t}:{q}", [])]
            assert prios == sorted(p for (t2, q2, p) in lists if (t2, q2) == (t, q)), (t, q)
        assert snap.get(f"{P}:tqueues:{t}", set()) == {q for (t2, q) in work if t2 == t}
    paused = snap.get(f"{P}:paused", set())
    tq_paused = snap.get(f"{P}:tqpaused", set())
    parked = snap.get(f"{P}:parked", set())
    for q in QUEUES:
        ring = snap.get(f"{P}:qring:{q}", [])
        assert len(ring) == len(set(ring)), f"ring {q} repeats a tenant: {ring}"
        assert snap.get(f"{P}:inring:{q}", set()) == set(ring), f"inring of {q} is not its ring"
        with_work = {t for (t, q2) in work if q2 == q}
        assert set(ring) <= with_work, f"ring {q} is {ring}, tenants with work: {with_work}"
        servable = {
            t for t in with_work if t not in paused | parked and f"{t}/{q}" not in tq_paused
        }
        assert servable <= set(ring), f"ring {q} is {ring}, servable tenants: {servable}"
        credit = set(snap.get(f"{P}:qcredit:{q}", {}))
        assert credit <= set(ring), f"credit {credit} of tenants off ring {q} {ring}"
    for t in tenants:
        counts = snap.get(f"{P}:counts:{t}", {})
        mine = [h for h in jobs.values() if h["t"] == t]
        states = Counter(h["s"] for h in mine)
        want = {g: states[g] for g in GAUGES}
        want["bytes"] = sum(len(h["p"]) for h in mine if h["s"] in ("scheduled", "ready", "active"))
        got = {g: int(counts.get(g, 0)) for g in GAUGES}
        assert got == want, f"{t}: counts {got} vs states {want}"
        cap = int(snap.get(f"{P}:limits:{t}", {}).get("max_active", 0))
        at_cap = cap > 0 and states["active"] >= cap
        assert (t in parked) == at_cap, f"{t}: parked {t in parked}, {states['active']} of {cap}"
    fence = int(snap.get(f"{P}:fence", 0))
    assert all(int(h.get("f", 0)) <= fence for h in jobs.values())  # no 'f': never claimed


# --- what the model says the keyspace must be -------------------------------------------


def _zset(pairs: Iterable[tuple[str, int]]) -> list[tuple[str, int]]:
    return sorted(pairs, key=lambda p: (p[1], p[0]))


def expected_hash(j: ModelJob) -> dict[str, str]:
    h = {
        "t": j.tenant, "r": j.request_id, "h": j.handler, "p": j.payload.decode(),
        "pr": str(j.priority), "s": j.state, "ra": str(j.run_at), "ca": str(j.created_at),
        "ma": str(j.max_attempts), "to": str(j.timeout_ms),
    }  # fmt: skip
    if j.fence:  # 'at' and 'f' are written by the first claim (enqueue leaves them out at 0)
        h |= {"at": str(j.attempts), "f": str(j.fence), "w": j.worker, "sa": str(j.started_at)}
    if j.state in TERMINAL_STATES:
        h["fa"] = str(j.finished_at)
    if j.error:
        h["e"] = j.error
    if j.cancel_requested:
        h["cx"] = "1"
    if j.queue != "default":
        h["q"] = j.queue
    if j.avoid_worker:
        h |= {"xw": j.avoid_worker, "xu": str(j.avoid_until)}
    return h


def _per_tenant(
    m: ShardModel, state: str, key: str, score: str
) -> dict[str, list[tuple[str, int]]]:
    out: dict[str, list[tuple[str, int]]] = {}
    for j in m.in_state(state):
        out.setdefault(f"{P}:{key}:{j.tenant}", []).append((j.job_id, getattr(j, score)))
    return {k: _zset(v) for k, v in out.items()}


def expected_keyspace(m: ShardModel) -> dict[str, Any]:
    """Every key but the wake lists and counts (compared field by field)."""
    exp: dict[str, Any] = {f"{P}:job:{j.job_id}": expected_hash(j) for j in m.jobs.values()}
    exp[f"{P}:leases"] = _zset((j.job_id, j.lease_deadline) for j in m.in_state("active"))
    exp[f"{P}:outbox"] = _zset(m.outbox.items())
    exp |= _per_tenant(m, "scheduled", "tscheduled", "run_at")
    exp |= _per_tenant(m, "active", "tactive", "started_at")
    exp |= _per_tenant(m, "dead", "dead", "finished_at")
    exp |= {f"{P}:ready:{t}:{q}:{p}": list(ids) for (t, q, p), ids in m.ready.items()}
    for t in m.tenants:
        exp[f"{P}:tqueues:{t}"] = m.queues_of(t)
        for q in QUEUES:
            lists = m.lists_of(t, q)
            exp[f"{P}:tprio:{t}:{q}"] = [(str(p), p) for p in sorted(lists)]
    exp |= {f"{P}:qring:{q}": list(ring) for q, ring in m.rings.items()}
    exp |= {f"{P}:inring:{q}": set(ring) for q, ring in m.rings.items()}
    exp |= {f"{P}:dedupe:{t}:{r}": f"{jid} {d}" for (t, r), (jid, d) in m.dedupe.items()}
    exp |= {f"{P}:qcredit:{q}": {t: str(n) for t, n in c.items()} for q, c in m.credit.items()}
    exp |= {f"{P}:limits:{t}": {f: str(v) for f, v in lim.items()} for t, lim in m.limits.items()}
    exp[f"{P}:paused"] = set(m.paused)
    exp[f"{P}:qpaused"] = set(m.paused_queues)
    exp[f"{P}:tqpaused"] = set(m.paused_tenant_queues)
    exp[f"{P}:parked"] = set(m.parked)
    exp[f"{P}:tenants"] = set(m.tenants)
    exp[f"{P}:fence"] = str(m.fence)
    # Redis holds no empty structures and no fence before the first claim.
    return {k: v for k, v in exp.items() if v and v != "0"}


def check_due(due: list[tuple[str, float]], m: ShardModel) -> None:
    """``due`` holds exactly the tenants with scheduled jobs, each at or before the earliest
    run-at of its jobs (a cancel may leave it earlier: promote sets it right), and at the
    score the model says."""
    earliest: dict[str, int] = {}
    for j in m.in_state("scheduled"):
        earliest[j.tenant] = min(earliest.get(j.tenant, j.run_at), j.run_at)
    scores = dict(due)
    assert set(scores) == set(earliest), f"due {set(scores)} != tenants scheduled {set(earliest)}"
    for t, at in earliest.items():
        assert scores[t] <= at, f"{t} is on due at {scores[t]}, after its earliest job ({at})"
    assert scores == m.due, f"due {scores} != model {m.due}"


def check_against_model(snap: dict[str, Any], m: ShardModel) -> None:
    exp = expected_keyspace(m)
    got = {k: v for k, v in snap.items() if not _is_wake(k) and ":counts:" not in k}
    check_due(got.pop(f"{P}:due", []), m)
    assert set(got) == set(exp), f"extra keys {set(got) - set(exp)}, missing {set(exp) - set(got)}"
    for k, v in exp.items():
        assert got[k] == v, f"{k}: redis {got[k]!r} != model {v!r}"
    counted = {k.removeprefix(f"{P}:counts:") for k in snap if ":counts:" in k}
    assert counted == set(m.tenants)
    for t in counted:
        c = snap[f"{P}:counts:{t}"]
        assert set(c) <= {*GAUGES, *COUNTERS}, c
        got_c = {f: int(c.get(f, 0)) for f in (*GAUGES, *COUNTERS)}
        counters = m.counters.get(t, Counter())
        want_c = m.gauges(t) | {f: counters[f] for f in COUNTERS}
        assert got_c == want_c, f"counts of {t}: redis {got_c} != model {want_c}"


# --- the machine -------------------------------------------------------------------------


class ShardJobsMachine(RuleBasedStateMachine):
    def __init__(self, loop: asyncio.AbstractEventLoop, redis: Redis) -> None:
        super().__init__()
        self.loop, self.redis = loop, redis
        self.run(redis.flushall())
        self.clock = FakeClock(NOW)
        self.shard = ShardClient(redis, ShardSettings(key_prefix=P), self.clock)
        self.model = ShardModel(now=NOW)
        #: Every lease any claim handed out, current or long stale.
        self.issued: list[Lease] = []
        self.highest_fence = 0
        self.next_job = 0

    def run(self, aw: Awaitable[T]) -> T:
        try:
            return self.loop.run_until_complete(asyncio.wait_for(aw, CALL_TIMEOUT_S))
        except TimeoutError:
            raise AssertionError(f"a Redis call took over {CALL_TIMEOUT_S} s") from None

    def snap(self) -> dict[str, Any]:
        return self.run(snapshot(self.redis))

    # --- drawing leases and jobs ---

    def draw_leases(self, data: st.DataObject) -> list[Lease]:
        """Current leases, old leases, and forged fences (one off, far ahead, 0)."""
        active = self.model.in_state("active")
        current = [Lease(j.job_id, j.fence) for j in active]
        requested = [Lease(j.job_id, j.fence) for j in active if j.cancel_requested]
        options = [st.sampled_from(self.issued)]
        if current:
            options += [st.sampled_from(current)] * 3
        if requested:
            options += [st.sampled_from(requested)] * 2
        forged = st.builds(
            lambda lease, delta: Lease(lease.job_id, max(0, lease.fence + delta)),
            st.sampled_from(self.issued),
            st.sampled_from([-1, 1, 1_000, -(10**9)]),
        )
        return data.draw(st.lists(st.one_of(*options, forged), min_size=1, max_size=3))

    def all_stale(self, leases: Iterable[Lease]) -> bool:
        jobs = self.model.jobs
        return all(
            lease.job_id not in jobs
            or jobs[lease.job_id].state != "active"
            or jobs[lease.job_id].fence != lease.fence
            for lease in leases
        )

    # --- rules ---

    @initialize(
        weights=st.dictionaries(st.sampled_from(TENANTS), st.sampled_from([2, 3]), max_size=2),
        batch=st.lists(submits, min_size=4, max_size=16),
    )
    def starts_empty_then_weighs_and_enqueues(
        self, weights: dict[str, int], batch: list[dict[str, Any]]
    ) -> None:
        assert self.snap() == {}
        for tenant, weight in weights.items():
            self.set_limits(tenant, weight, 0, 0)
        self.enqueue(batch)

    @rule(batch=st.lists(submits, min_size=1, max_size=6))
    def enqueue(self, batch: list[dict[str, Any]]) -> None:
        now = self.clock.now_ms()
        jobs, model_submits = [], []
        for s in batch:
            self.next_job += 1
            job_id = f"J{self.next_job:05d}"
            request_id = s["request_id"] or f"fresh-{self.next_job}"
            delay = s["delay"]
            timing = {"delay_ms": delay} if delay >= 0 else {"run_at_ms": now + delay}
            jobs.append(
                NewJob(
                    tenant=s["tenant"], handler=s["handler"], payload=s["payload"],
                    request_id=request_id, priority=s["priority"],
                    max_attempts=s["max_attempts"], timeout_ms=s["timeout_ms"], queue=s["queue"],
                    limits=TenantLimits(
                        max_pending=s["max_pending"], max_pending_bytes=s["max_pending_bytes"]
                    ),
                    job_id=job_id, **timing,
                )
            )  # fmt: skip
            model_submits.append(
                Submit(
                    tenant=s["tenant"], job_id=job_id, request_id=request_id,
                    handler=s["handler"], payload=s["payload"], priority=s["priority"],
                    run_at=now + delay, max_attempts=s["max_attempts"],
                    timeout_ms=s["timeout_ms"] or 300_000, max_pending=s["max_pending"],
                    queue=s["queue"], max_pending_bytes=s["max_pending_bytes"],
                )
            )  # fmt: skip
        got = self.run(self.shard.enqueue(jobs))
        want = self.model.enqueue(model_submits)
        assert [(r.code, r.job_id, r.state) for r in got] == want
        for r in got:
            event(f"enqueue: {r.code.name} {r.state}")
        for r in got:
            assert (r.retry_after_ms > 0) == (r.code is ItemCode.OVER_QUOTA)

    @rule(
        tenant=st.sampled_from(TENANTS),
        weight=st.sampled_from([0, 1, 2, 3]),
        max_active=st.sampled_from([0, 0, 1, 2]),
        max_pending=st.sampled_from([0, 0, 0, 0, 0, 6]),
    )
    def set_limits(self, tenant: str, weight: int, max_active: int, max_pending: int) -> None:
        limits = TenantLimits(weight=weight, max_active=max_active, max_pending=max_pending)
        self.run(self.shard.set_limits(tenant, limits))
        self.model.set_limits(
            tenant, {"weight": weight, "max_active": max_active, "max_pending": max_pending}
        )
        assert self.run(self.shard.limits(tenant)) == limits

    @rule(data=st.data())
    def pause_or_resume(self, data: st.DataObject) -> None:
        """Mostly: pause something, or resume something paused; sometimes either, anything."""
        m = self.model
        paused: list[tuple[str | None, str | None]] = [
            *((t, None) for t in sorted(m.paused)),
            *((None, q) for q in sorted(m.paused_queues)),
            *((t, q) for t, _, q in (x.partition("/") for x in sorted(m.paused_tenant_queues))),
        ]
        resume = data.draw(st.booleans(), label="resume")
        what = data.draw(
            st.sampled_from(paused) if resume and paused else pause_targets, label="target"
        )
        if resume:
            got = self.run(self.shard.resume(*what))
            assert got == m.resume(*what)
            event(f"resume: {'was paused' if got else 'was not'}")
        else:
            got = self.run(self.shard.pause(*what))
            assert got == m.pause(*what)
            event(f"pause: {'new' if got else 'again'}")
        assert self.run(self.shard.paused(what[0] or TENANTS[0])) == (
            (what[0] or TENANTS[0]) in m.paused,
            sorted(
                {q for q in QUEUES if f"{what[0] or TENANTS[0]}/{q}" in m.paused_tenant_queues}
                | m.paused_queues
            ),
        )

    @rule(ms=st.sampled_from([0, 1, 100, 250, 1_000, 3_000, 10_000]))
    def advance_clock(self, ms: int) -> None:
        self.clock.advance(ms)
        self.model.now = self.clock.now_ms()

    @precondition(lambda self: self.model.in_state("active") or self.model.in_state("scheduled"))
    @rule(data=st.data(), past=st.sampled_from([0, 0, 1]))
    def advance_clock_to_a_deadline(self, data: st.DataObject, past: int) -> None:
        """Exactly to (or just past) a lease deadline or a run-at: reap and promote boundaries."""
        times = [j.lease_deadline for j in self.model.in_state("active")]
        times += [j.run_at for j in self.model.in_state("scheduled")]
        target = data.draw(st.sampled_from(sorted(times))) + past
        self.advance_clock(max(0, target - self.clock.now_ms()))

    @rule(limit=st.integers(1, 3))
    def promote(self, limit: int) -> None:
        got = self.run(self.shard.promote(limit))
        assert got == self.model.promote()
        event(f"promote: {min(got[0], 2)}+ jobs")

    @precondition(lambda self: any(self.model.rings.values()))
    @rule(
        worker=st.sampled_from(["w1", "w2"]),
        max_jobs=st.integers(1, 5),
        lease_ms=st.sampled_from([1, 100, 1_000, 5_000]),
        queues=st.sampled_from(CLAIM_QUEUES),
    )
    def claim(self, worker: str, max_jobs: int, lease_ms: int, queues: tuple[str, ...]) -> None:
        got = self.run(self.shard.claim(worker, max_jobs, lease_ms, queues))
        want = self.model.claim(worker, max_jobs, lease_ms, queues)
        event(f"claim: {len(got)} of {max_jobs}")
        assert [c.job_id for c in got] == [j.job_id for j in want]
        for c, j in zip(got, want, strict=True):
            assert c.fence > self.highest_fence, "fencing tokens only grow"
            self.highest_fence = c.fence
            assert c.fence == j.fence
            assert (c.tenant, c.request_id, c.handler, c.payload, c.priority) == (
                j.tenant, j.request_id, j.handler, j.payload, j.priority,
            )  # fmt: skip
            assert (c.run_at_ms, c.created_at_ms, c.attempt, c.max_attempts, c.timeout_ms) == (
                j.run_at, j.created_at, j.attempts, j.max_attempts, j.timeout_ms,
            )  # fmt: skip
            assert c.queue == j.queue and c.queue in queues
            self.issued.append(Lease(c.job_id, c.fence))

    def _stale_changes_nothing(self, leases: list[Lease], call: Awaitable[T]) -> T:
        """Run ``call``; when every lease is stale, the keyspace must be left as it was."""
        stale = self.all_stale(leases)
        before = self.snap() if stale else None
        out = self.run(call)
        if stale:
            assert self.snap() == before, "a stale fence changed the shard"
        return out

    @precondition(lambda self: self.issued)
    @rule(data=st.data(), lease_ms=st.sampled_from([1, 100, 1_000, 5_000]))
    def heartbeat(self, data: st.DataObject, lease_ms: int) -> None:
        leases = self.draw_leases(data)
        got = self._stale_changes_nothing(leases, self.shard.heartbeat(leases, lease_ms))
        assert got == self.model.heartbeat([(x.job_id, x.fence) for x in leases], lease_ms)
        for code in got:
            event(f"heartbeat: {code.name}")

    @precondition(lambda self: self.issued)
    @rule(data=st.data())
    def ack(self, data: st.DataObject) -> None:
        leases = self.draw_leases(data)
        got = self._stale_changes_nothing(leases, self.shard.ack(leases))
        assert got == self.model.ack([(x.job_id, x.fence) for x in leases])
        for code in got:
            event(f"ack: {code.name}")

    @precondition(lambda self: self.issued)
    @rule(data=st.data(), avoid_ms=st.sampled_from([0, 0, 100, 5_000]))
    def release(self, data: st.DataObject, avoid_ms: int) -> None:
        leases = self.draw_leases(data)
        got = self._stale_changes_nothing(leases, self.shard.release(leases, avoid_ms))
        assert got == self.model.release([(x.job_id, x.fence) for x in leases], avoid_ms)
        for code in got:
            event(f"release: {code.name} {'hand-back' if avoid_ms else 'shutdown'}")

    @precondition(lambda self: self.issued)
    @rule(data=st.data())
    def fail(self, data: st.DataObject) -> None:
        leases = self.draw_leases(data)
        now = self.clock.now_ms()
        failures = []
        for lease in leases:
            job = self.model.jobs[lease.job_id]
            retry = data.draw(st.sampled_from([None, 0, 1, 500, 2_000]), label="retry in")
            failures.append(
                Failure(
                    job_id=lease.job_id, fence=lease.fence, attempt=max(1, job.attempts),
                    error=f"boom {job.attempts}", permanent=data.draw(st.booleans()),
                    retry_at_ms=None if retry is None else now + retry,
                )
            )  # fmt: skip
        got = self._stale_changes_nothing(leases, self.shard.fail(failures))
        # A retry time left to the shard's backoff is read back, then checked for range.
        retry_at = [f.retry_at_ms or 0 for f in failures]
        for i, (f, r) in enumerate(zip(failures, got, strict=True)):
            if f.retry_at_ms is None and r.state == "scheduled" and r.code is ItemCode.OK:
                ra = int(self.run(self.redis.hget(f"{P}:job:{f.job_id}", "ra")))
                ceiling = self.shard.settings.backoff.ceiling_ms(f.attempt)
                assert now <= ra <= now + ceiling, f"backoff {ra - now} ms outside [0, {ceiling}]"
                retry_at[i] = ra
        want = self.model.fail(
            [
                (f.job_id, f.fence, f.error, at, f.permanent)
                for f, at in zip(failures, retry_at, strict=True)
            ]
        )
        assert [(r.code, r.state) for r in got] == want
        for r in got:
            event(f"fail: {r.code.name} {r.state}")

    @precondition(
        lambda self: any(j.lease_deadline <= self.model.now for j in self.model.in_state("active"))
    )
    @rule(limit=st.integers(1, 3))
    def reap(self, limit: int) -> None:
        got = self.run(self.shard.reap(limit))
        assert got == self.model.reap()
        event(f"reap: to ready {min(got[0], 2)}+, to dead {min(got[1], 2)}+")

    @precondition(lambda self: self.model.jobs)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        """Mostly the job's own tenant; sometimes another tenant's job or no job at all."""
        ids = st.sampled_from([*sorted(self.model.jobs), MISSING_JOB])
        active = sorted(j.job_id for j in self.model.in_state("active"))
        if active:  # the interesting case: cancel requested while a worker runs the job
            ids = st.one_of(st.sampled_from(active), st.sampled_from(active), ids)
        job_id = data.draw(ids)
        own = self.model.jobs[job_id].tenant if job_id in self.model.jobs else TENANTS[0]
        tenant = data.draw(st.sampled_from([own, own, own, *TENANTS]))
        want_code, want_state = self.model.cancel(tenant, job_id)
        event(f"cancel: {want_code.name} {want_state}")
        refused = want_code in (ItemCode.NOT_FOUND, ItemCode.ALREADY_TERMINAL)
        before = self.snap() if refused else None
        if want_code is ItemCode.NOT_FOUND:
            with pytest.raises(NotFound):
                self.run(self.shard.cancel(tenant, job_id))
        elif want_code is ItemCode.ALREADY_TERMINAL:
            with pytest.raises(FailedPrecondition, match=f"already {want_state}"):
                self.run(self.shard.cancel(tenant, job_id))
        else:
            assert self.run(self.shard.cancel(tenant, job_id)) == (want_code, want_state)
        if refused:
            assert self.snap() == before, "a refused cancel changed the shard"

    @precondition(lambda self: self.model.in_state("dead"))
    @rule(data=st.data())
    def requeue_dead(self, data: st.DataObject) -> None:
        dead = sorted(j.job_id for j in self.model.in_state("dead"))
        ids = st.sampled_from([*sorted(self.model.jobs), MISSING_JOB])
        ids = st.one_of(st.sampled_from(dead), st.sampled_from(dead), ids)
        job_ids = data.draw(st.lists(ids, min_size=1, max_size=3))
        tenants = [self.model.jobs[j].tenant for j in job_ids if j in self.model.jobs]
        tenant = data.draw(st.sampled_from([*tenants, *tenants, *TENANTS]))
        got = self.run(self.shard.requeue_dead(tenant, job_ids))
        assert got == self.model.requeue_dead(tenant, job_ids)
        event(f"requeue_dead: {min(got[0], 2)}+ requeued")

    # --- invariants ---

    @invariant()
    def keyspace_matches_the_rules_and_the_model(self) -> None:
        snap = self.snap()
        check_structures(snap)
        check_against_model(snap, self.model)


@pytest.mark.timeout(TIMEOUT_S)
def test_every_job_stays_in_exactly_one_state_whatever_the_operations(
    redis_proc: RedisProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Hypothesis's shrink limit is a module constant, read when shrinking starts.
    monkeypatch.setattr(hypothesis_engine, "MAX_SHRINKING_SECONDS", SHRINK_S)
    loop = asyncio.new_event_loop()
    # A socket timeout too: no read on a wedged connection outlives the budget.
    redis = Redis.from_url(redis_proc.url, socket_timeout=CALL_TIMEOUT_S)
    try:
        run_state_machine_as_test(lambda: ShardJobsMachine(loop, redis), settings=SETTINGS)
    finally:
        # Closing cannot block the run: bounded, and nothing it raises hides the failure.
        with contextlib.suppress(Exception):
            loop.run_until_complete(asyncio.wait_for(redis.aclose(), 5))
        loop.close()
