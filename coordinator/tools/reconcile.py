"""Reconcile what a load was told with what the stores hold, after faults: the figures of a
chaos test and of ``shardq soak``.

Given the request_ids whose submit the caller saw succeed (:class:`Accepted`, per tenant), it
reads the result rows in Postgres, the jobs on every shard's Redis (their hashes and the
outbox), and optionally a side-effect table (written through ``ctx.session`` in the row's
transaction) and the handler runs a test logged, and says, per accepted job:

- **lost**: no result row and no trace on any shard (nothing left that could still run it);
- **stuck**: not final when the recovery deadline passed (no row yet, yet still on a shard);
- **duplicates**: a second job for one ``(tenant, request_id)`` (two job hashes, or a row or
  a job hash naming another job than the submit answered), a second row, a second side effect;
- **disagreements**: the row says one end and the job's hash in Redis another (the row
  decides; the shard loop's reconciler is meant to leave none);
- **re-executions**: handler runs beyond one per job, by cause where the run log says
  (``new_attempt``: the job came back with its attempt counted, after a lease expired or a
  retry; ``same_attempt``: run again without an attempt counted, a hand-back), and the
  re-deliveries the rows' ``attempts`` show (``attempts - 1`` summed), which need no log;
- **recovery time**: from the end of the last fault to the moment every accepted job was final
  and Redis agreed with Postgres (:func:`settle`).

:func:`settle` polls until all is final or its deadline; :func:`take_snapshot` and
:func:`reconcile` are the two halves, for a caller that wants one look only. Nothing here
imports test code: ``shardq soak`` and ``tests/chaos/`` share it.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import sqlalchemy as sa
from redis.asyncio import Redis
from redis.exceptions import RedisError
from sqlalchemy.ext.asyncio import AsyncConnection

from shardq.common.redis import redis_for
from shardq.coordinator.shardmap import ShardMapStore
from shardq.shard.keys import Keys
from shardq.shard.records import JobField
from shardq.store import db

__all__ = [
    "Accepted",
    "Key",
    "Reconciliation",
    "RedisJob",
    "RowInfo",
    "Snapshot",
    "reconcile",
    "settle",
    "shard_addresses",
    "take_snapshot",
]

#: ``(tenant_id, request_id)``: what names one job for its submitter, its row and its dedupe.
Key = tuple[str, str]
#: Per job, the attempt number of each handler run a log recorded (0 where unknown).
Runs = Mapping[Key, Sequence[int]]

#: Hash fields read per job: enough to match it to its submit and its row.
_FIELDS = (JobField.TENANT, JobField.REQUEST_ID, JobField.STATE)
#: How many examples of each problem :meth:`Reconciliation.render` names.
_EXAMPLES = 5


class Accepted:
    """The submits that succeeded, as their caller saw them: ``(tenant, request_id)`` and the
    job ID the answer named ("" when the caller did not keep it)."""

    def __init__(self) -> None:
        self._jobs: dict[Key, str] = {}
        self._conflicts: set[Key] = set()

    def add(self, tenant: str, request_id: str, job_id: str = "") -> None:
        """Record one accepted submit (again: a retry's answer must name the same job)."""
        known = self._jobs.get((tenant, request_id))
        if known and job_id and known != job_id:
            # Kept both ways: reconcile() reports the key as a duplicate job.
            self._conflicts.add((tenant, request_id))
        if not known:
            self._jobs[(tenant, request_id)] = job_id

    @property
    def conflicts(self) -> frozenset[Key]:
        """Keys whose submits were answered with two different job IDs."""
        return frozenset(self._conflicts)

    def job_id(self, key: Key) -> str:
        return self._jobs.get(key, "")

    def tenants(self) -> list[str]:
        return sorted({t for t, _ in self._jobs})

    def __contains__(self, key: object) -> bool:
        return key in self._jobs

    def __iter__(self) -> Iterator[Key]:
        return iter(self._jobs)

    def __len__(self) -> int:
        return len(self._jobs)


@dataclass(frozen=True, slots=True)
class RowInfo:
    """What one result row says."""

    status: str
    job_id: str
    handler: str
    attempts: int


@dataclass(frozen=True, slots=True)
class RedisJob:
    """One job hash on a shard: where, in which state, and whether it waits on the outbox."""

    job_id: str
    shard: str
    state: str
    on_outbox: bool


@dataclass
class Snapshot:
    """What the stores held at one moment, for the tenants of an :class:`Accepted`."""

    rows: dict[Key, RowInfo] = field(default_factory=dict)
    #: Rows per key (the primary key allows one; counted, not assumed).
    row_counts: Counter[Key] = field(default_factory=Counter)
    jobs: dict[Key, list[RedisJob]] = field(default_factory=dict)
    #: Side-effect rows per key; None when no side-effect table was given.
    side_effects: Counter[Key] | None = None
    outbox_depth: int = 0


@dataclass
class Reconciliation:
    """The figures of one run: :attr:`ok` when nothing was lost, duplicated, stuck or left in
    disagreement; :meth:`render` prints them."""

    accepted: int
    #: Rows of accepted jobs, by status.
    by_status: dict[str, int]
    lost: list[Key]
    stuck: list[Key]
    duplicate_jobs: list[Key]
    duplicate_rows: list[Key]
    duplicate_side_effects: list[Key]
    #: A job that ended ``succeeded`` through a side-effect handler without its side effect,
    #: or one whose side effect stands though its row says it did not succeed (no rollback).
    missing_side_effects: list[Key]
    stray_side_effects: list[Key]
    #: (key, the state in Redis, the row's status).
    disagreements: list[tuple[Key, str, str]]
    #: Jobs that ended ``dead`` though the driver said they should not (``may_die``): in a
    #: chaos run only a job given ``max_attempts=1`` should die of a fault or two.
    unexpected_dead: list[Key]
    #: Rows of request_ids the caller was not told were accepted (a submit that failed to its
    #: caller but reached its shard): not an error, at-least-once submit retries make them.
    unaccepted_rows: int
    #: Handler runs the log recorded (None: no log), and the runs beyond one per job by cause.
    executions: int | None
    re_executions: dict[str, int]
    #: ``attempts - 1`` summed over the accepted jobs' rows: re-deliveries, known without a log.
    redeliveries: int
    #: Seconds from the end of the last fault to all final and agreeing (None: never, or no
    #: fault time given); the deadline :func:`settle` waited up to.
    recovery_s: float | None
    deadline_s: float | None = None
    outbox_depth: int = 0
    #: Figures the driver adds (faults injected, submits refused...), printed as given.
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not (
            self.lost
            or self.stuck
            or self.duplicate_jobs
            or self.duplicate_rows
            or self.duplicate_side_effects
            or self.missing_side_effects
            or self.stray_side_effects
            or self.disagreements
            or self.unexpected_dead
        )

    @property
    def re_executed(self) -> int:
        return sum(self.re_executions.values())

    def render(self) -> str:
        """The figures, one per line, with a few examples of each problem."""

        def keys(items: Sequence[Key]) -> str:
            if not items:
                return "0"
            shown = ", ".join(f"{t}/{r}" for t, r in items[:_EXAMPLES])
            more = f", … {len(items) - _EXAMPLES} more" if len(items) > _EXAMPLES else ""
            return f"{len(items)} ({shown}{more})"

        statuses = ", ".join(f"{s} {n}" for s, n in sorted(self.by_status.items())) or "none"
        disagree = "0"
        if self.disagreements:
            shown = ", ".join(
                f"{t}/{r} redis={s or 'gone'} row={st}"
                for (t, r), s, st in self.disagreements[:_EXAMPLES]
            )
            disagree = f"{len(self.disagreements)} ({shown})"
        if self.recovery_s is not None:
            recovery = f"{self.recovery_s:.1f} s"
        elif self.stuck or self.disagreements:
            recovery = f"not within {self.deadline_s or 0:.0f} s"
        else:
            recovery = "n/a"
        if self.executions is None:
            runs = "not logged"
        else:
            causes = ", ".join(f"{c} {n}" for c, n in sorted(self.re_executions.items()) if n)
            runs = f"{self.executions} runs, {self.re_executed} beyond one per job"
            runs += f" ({causes})" if causes else ""
        lines = [
            f"reconciliation: {'OK' if self.ok else 'NOT OK'}",
            f"  accepted                {self.accepted}",
            f"  rows                    {statuses}",
            f"  lost                    {keys(self.lost)}",
            f"  stuck                   {keys(self.stuck)}",
            f"  duplicate jobs          {keys(self.duplicate_jobs)}",
            f"  duplicate rows          {keys(self.duplicate_rows)}",
            f"  duplicate side effects  {keys(self.duplicate_side_effects)}",
            f"  missing side effects    {keys(self.missing_side_effects)}",
            f"  stray side effects      {keys(self.stray_side_effects)}",
            f"  redis/postgres disagree {disagree}",
            f"  dead, not expected to   {keys(self.unexpected_dead)}",
            f"  handler executions      {runs}",
            f"  re-deliveries (rows)    {self.redeliveries}",
            f"  unaccepted rows         {self.unaccepted_rows}",
            f"  outbox left             {self.outbox_depth}",
            f"  recovery time           {recovery}",
        ]
        lines += [f"  {name:<23} {value}" for name, value in self.extra.items()]
        return "\n".join(lines)


# --- reading the stores ----------------------------------------------------------------------


async def shard_addresses(database_url: str) -> list[str]:
    """``host:port`` of every shard in the cluster's shard map (for a cluster not started by
    the caller)."""
    engine = db.make_engine(database_url)
    try:
        shard_map = await ShardMapStore(engine).load()
    finally:
        await engine.dispose()
    return [info.address for _, info in sorted(shard_map.shards.items())]


async def _read_rows(
    database_url: str, tenants: Sequence[str], side_effect_table: str | None
) -> tuple[dict[Key, RowInfo], Counter[Key], Counter[Key] | None]:
    r = db.results.c
    query = sa.select(r.tenant_id, r.request_id, r.status, r.job_id, r.handler, r.attempts)
    query = query.where(r.tenant_id.in_(tenants))
    engine = db.make_engine(database_url)
    rows: dict[Key, RowInfo] = {}
    counts: Counter[Key] = Counter()
    effects: Counter[Key] | None = None
    try:
        async with engine.connect() as conn:
            for t, rid, status, job_id, handler, attempts in await conn.execute(query):
                rows[(t, rid)] = RowInfo(status, job_id, handler, attempts)
                counts[(t, rid)] += 1
            if side_effect_table is not None:
                effects = await _count_side_effects(conn, side_effect_table, tenants)
    finally:
        await engine.dispose()
    return rows, counts, effects


async def _count_side_effects(
    conn: AsyncConnection, table_name: str, tenants: Sequence[str]
) -> Counter[Key]:
    """Rows of ``table_name`` per ``(tenant_id, request_id)``: no unique key is assumed."""
    effects: Counter[Key] = Counter()
    exists = await conn.execute(
        sa.text("SELECT to_regclass(:name) IS NOT NULL"), {"name": table_name}
    )
    if not exists.scalar_one():  # a handler that makes its table on first use never ran
        return effects
    table = sa.table(table_name, sa.column("tenant_id"), sa.column("request_id"))
    grouped = (
        sa.select(table.c.tenant_id, table.c.request_id, sa.func.count())
        .where(table.c.tenant_id.in_(tenants))
        .group_by(table.c.tenant_id, table.c.request_id)
    )
    for t, rid, n in await conn.execute(grouped):
        effects[(t, rid)] = int(n)
    return effects


async def _read_shard(
    redis: Redis, address: str, keys: Keys, tenants: frozenset[str]
) -> tuple[list[tuple[Key, RedisJob]], int]:
    """Every job hash of ``tenants`` on one shard (SCAN, then HMGET in pipelines)."""
    outbox = {m.decode() for m in await redis.zrange(keys.outbox(), 0, -1)}
    prefix = keys.job("")
    found: list[tuple[Key, RedisJob]] = []
    batch: list[str] = []

    async def flush() -> None:
        async with redis.pipeline(transaction=False) as pipe:
            for k in batch:
                pipe.hmget(k, [f.value for f in _FIELDS])
            values = await pipe.execute()
        for k, (t, rid, state) in zip(batch, values, strict=True):
            if t is None or t.decode() not in tenants:
                continue
            job_id = k[len(prefix) :]
            state_s = state.decode() if state else ""
            job = RedisJob(job_id, address, state_s, job_id in outbox)
            found.append(((t.decode(), rid.decode() if rid else ""), job))
        batch.clear()

    async for k in redis.scan_iter(match=f"{prefix}*", count=1000):
        batch.append(k.decode())
        if len(batch) >= 1000:
            await flush()
    if batch:
        await flush()
    return found, len(outbox)


async def take_snapshot(
    accepted: Accepted,
    *,
    database_url: str,
    shards: Sequence[str],
    key_prefix: str = "shardq",
    redis_password: str = "",
    side_effect_table: str | None = None,
) -> Snapshot:
    """The rows, side effects and job hashes of ``accepted``'s tenants, now. ``shards`` are
    ``host:port`` addresses (:func:`shard_addresses` reads them from the shard map). Raises
    what the stores raise when one cannot be read (:func:`settle` retries)."""
    tenants = accepted.tenants()
    rows, counts, effects = await _read_rows(database_url, tenants, side_effect_table)
    snap = Snapshot(rows=rows, row_counts=counts, side_effects=effects)
    keys = Keys(key_prefix)
    for address in shards:
        redis = redis_for(address, redis_password)
        try:
            found, depth = await _read_shard(redis, address, keys, frozenset(tenants))
        finally:
            await redis.aclose()
        snap.outbox_depth += depth
        for key, job in found:
            snap.jobs.setdefault(key, []).append(job)
    return snap


# --- judging ---------------------------------------------------------------------------------


def _final(key: Key, snap: Snapshot) -> bool:
    """A row, and no job hash saying otherwise or still waiting on the outbox."""
    row = snap.rows.get(key)
    if row is None:
        return False
    return all(j.state == row.status and not j.on_outbox for j in snap.jobs.get(key, ()))


def settled(accepted: Accepted, snap: Snapshot) -> bool:
    """Every accepted job is final and Redis agrees with its row."""
    return all(_final(key, snap) for key in accepted)


def _re_executions(runs: Runs, accepted: Accepted) -> tuple[int, dict[str, int]]:
    total = 0
    causes = {"new_attempt": 0, "same_attempt": 0}
    for key, attempts in runs.items():
        if key not in accepted:
            continue
        total += len(attempts)
        seen: set[int] = set()
        for a in sorted(attempts):
            if not seen:
                seen.add(a)
            elif a in seen:
                causes["same_attempt"] += 1
            else:
                seen.add(a)
                causes["new_attempt"] += 1
    return total, causes


def _effect_verdict(status: str, count: int) -> str | None:
    """What is wrong with ``count`` side-effect rows of a job whose row says ``status``:
    written in the row's transaction, there is one exactly when it succeeded."""
    if count > 1:
        return "duplicate"
    if status == "succeeded" and count == 0:
        return "missing"
    if status != "succeeded" and count:
        return "stray"
    return None


def reconcile(
    accepted: Accepted,
    snap: Snapshot,
    *,
    runs: Runs | None = None,
    side_effect_handlers: Iterable[str] = (),
    recovery_s: float | None = None,
    deadline_s: float | None = None,
    may_die: Callable[[Key], bool] | None = None,
) -> Reconciliation:
    """Judge ``snap`` against ``accepted`` (see the module's docstring for each figure).
    ``side_effect_handlers``: the handlers whose succeeded jobs must have exactly one
    side-effect row, and whose other ends none. ``may_die``: which jobs may end ``dead``
    (None: any)."""
    effect_handlers = frozenset(side_effect_handlers)
    by_status: Counter[str] = Counter()
    lost: list[Key] = []
    stuck: list[Key] = []
    dup_jobs: list[Key] = sorted(accepted.conflicts)
    dup_rows: list[Key] = []
    effects: dict[str, list[Key]] = {"duplicate": [], "missing": [], "stray": []}
    disagree: list[tuple[Key, str, str]] = []
    unexpected_dead: list[Key] = []
    redeliveries = 0
    for key in sorted(accepted):
        row = snap.rows.get(key)
        jobs = snap.jobs.get(key, [])
        answered = accepted.job_id(key)
        job_ids = {j.job_id for j in jobs} | ({row.job_id} if row else set())
        if len(job_ids | ({answered} if answered else set())) > 1 and key not in dup_jobs:
            dup_jobs.append(key)
        if snap.row_counts.get(key, 0) > 1:
            dup_rows.append(key)
        if row is None:
            (stuck if jobs else lost).append(key)
            continue
        by_status[row.status] += 1
        if row.status == "dead" and may_die is not None and not may_die(key):
            unexpected_dead.append(key)
        redeliveries += max(0, row.attempts - 1)
        for j in jobs:
            if j.state != row.status:
                disagree.append((key, j.state, row.status))
                break
        else:
            if any(j.on_outbox for j in jobs):
                stuck.append(key)
        if snap.side_effects is not None and row.handler in effect_handlers:
            verdict = _effect_verdict(row.status, snap.side_effects.get(key, 0))
            if verdict is not None:
                effects[verdict].append(key)
    executions, causes = (None, {}) if runs is None else _re_executions(runs, accepted)
    return Reconciliation(
        accepted=len(accepted),
        by_status=dict(by_status),
        lost=lost,
        stuck=stuck,
        duplicate_jobs=dup_jobs,
        duplicate_rows=dup_rows,
        duplicate_side_effects=effects["duplicate"],
        missing_side_effects=effects["missing"],
        stray_side_effects=effects["stray"],
        disagreements=disagree,
        unexpected_dead=unexpected_dead,
        unaccepted_rows=sum(1 for key in snap.rows if key not in accepted),
        executions=executions,
        re_executions=causes,
        redeliveries=redeliveries,
        recovery_s=recovery_s,
        deadline_s=deadline_s,
        outbox_depth=snap.outbox_depth,
    )


async def settle(
    accepted: Accepted,
    *,
    database_url: str,
    shards: Sequence[str] | Callable[[], Sequence[str]],
    key_prefix: str = "shardq",
    redis_password: str = "",
    faults_ended_at: float | None = None,
    deadline_s: float = 120.0,
    side_effect_table: str | None = None,
    side_effect_handlers: Iterable[str] = (),
    runs: Callable[[], Runs] | None = None,
    may_die: Callable[[Key], bool] | None = None,
) -> Reconciliation:
    """Wait until every accepted job is final and Redis agrees with Postgres, or
    ``deadline_s`` (from now) has passed; then reconcile. ``faults_ended_at`` (a
    ``time.monotonic()`` value) is when the last fault ended: recovery time counts from it.
    ``shards`` may be a callable, for a cluster whose shard addresses change (a failover).
    ``runs`` is read once at the end (a log the handlers append to)."""
    start = time.monotonic()
    deadline = start + deadline_s
    snap: Snapshot | None = None
    recovered_at: float | None = None
    failure: Exception | None = None
    pause = 0.2
    while True:
        began = time.monotonic()
        addresses = shards() if callable(shards) else shards
        try:
            snap = await take_snapshot(
                accepted,
                database_url=database_url,
                shards=addresses,
                key_prefix=key_prefix,
                redis_password=redis_password,
                side_effect_table=side_effect_table,
            )
            failure = None
        except (OSError, RedisError, sa.exc.SQLAlchemyError) as exc:
            failure = exc  # a store still coming back: look again
        now = time.monotonic()
        if snap is not None and failure is None and settled(accepted, snap):
            recovered_at = now
            break
        if now >= deadline:
            break
        # A big keyspace takes a while to read: look less often than it takes.
        await asyncio.sleep(max(pause, 2 * (now - began)))
    if snap is None:
        raise RuntimeError(f"the stores could not be read within {deadline_s:.0f} s: {failure}")
    recovery = None
    if recovered_at is not None and faults_ended_at is not None:
        recovery = max(0.0, recovered_at - faults_ended_at)
    return reconcile(
        accepted,
        snap,
        runs=runs() if runs is not None else None,
        side_effect_handlers=side_effect_handlers,
        recovery_s=recovery,
        deadline_s=deadline_s,
        may_die=may_die,
    )
