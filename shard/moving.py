"""The data plane of a tenant move, on one shard: the ``move_*.lua`` scripts and the reads
between them. ``coordinator.mover`` drives a whole move with these; each step is safe to
repeat, which is what makes a crashed mover simply resumable.

A job always exists on at least one side: it is taken off the source's queues (``take``),
copied (``put``, which skips what the target already has), and only then deleted from the
source (``drop``). Between ``take`` and ``drop`` it sits in the source's ``moving`` set, where
nothing runs it and where a re-run mover finds it again.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from shardq.shard import cron
from shardq.shard.client import ShardClient
from shardq.shard.models import TenantLimits
from shardq.shard.records import DedupeEntry, JobField, JobRecord, JobState, derived_job_id

#: The counters (that only grow) a move adds to the target; gauges follow the jobs.
MOVED_COUNTERS = ("submitted", "succeeded", "failed", "unrunnable")


@dataclass(frozen=True, slots=True)
class JobCopy:
    job_id: str
    #: Milliseconds left to live (-1: no expiry), kept on the target.
    pttl_ms: int
    #: The hash's fields, flat: field, value, field, value...
    fields: tuple[bytes, ...]

    @property
    def state(self) -> JobState:
        """The job's state (hash field ``s``)."""
        pairs = dict(zip(self.fields[::2], self.fields[1::2], strict=True))
        return JobState.parse(pairs.get(JobField.STATE.encode()))


@dataclass(frozen=True, slots=True)
class DedupeCopy:
    request_id: str
    value: bytes
    pttl_ms: int

    @property
    def job_id(self) -> str:
        return DedupeEntry.from_value(self.value).job_id


@dataclass(frozen=True, slots=True)
class ScheduleCopy:
    schedule_id: str
    spec: str
    #: The tick the target fires first.
    next_tick_ms: int


@dataclass(frozen=True, slots=True)
class TenantControls:
    """What a move carries besides jobs and schedules: the tenant's limits and pause state."""

    limits: TenantLimits
    #: Paused whole (``ShardClient.pause(tenant)``).
    paused: bool
    #: Its own paused queues (``ShardClient.pause(tenant, queue)``); queues paused for every
    #: tenant belong to the shard, not to the tenant, and stay.
    paused_queues: tuple[str, ...]


class ShardSide:
    """One shard's part in moving ``tenant``: as the source or as the target."""

    def __init__(self, shard: ShardClient, tenant: str) -> None:
        self.shard = shard
        self.tenant = tenant
        self.keys = shard.keys
        self._r: Any = shard.redis

    async def _run(self, script: str, args: Sequence[Any]) -> Any:
        return await self.shard._run(script, [], args)

    # -- source -------------------------------------------------------------------------

    async def take(self, limit: int) -> int:
        """Take up to ``limit`` queued jobs off this shard's queues (into the moving set)."""
        return int(await self._run("move_out", [self.tenant, limit]))

    async def taken(self) -> list[str]:
        return sorted(m.decode() for m in await self._r.smembers(self.keys.moving(self.tenant)))

    async def taken_by_due(self) -> list[str]:
        """The set-aside jobs due soonest first (by run-at, then job ID): ready ones, and
        scheduled ones that came due while set aside, before those due later. A mover copies
        them in this order, so a copy that has to wait for others is one not yet due."""
        ids = await self.taken()
        if not ids:
            return ids
        pipe = self._r.pipeline(transaction=False)
        for jid in ids:
            pipe.hget(self.keys.job(jid), JobField.RUN_AT_MS.value)
        run_at = [int(ra) if ra else 0 for ra in await pipe.execute()]
        return [jid for _, jid in sorted(zip(run_at, ids, strict=True))]

    async def read_jobs(self, job_ids: Sequence[str]) -> list[JobCopy]:
        """The hashes (and TTLs) of ``job_ids`` that still exist here."""
        pipe = self._r.pipeline(transaction=False)
        for jid in job_ids:
            pipe.hgetall(self.keys.job(jid))
            pipe.pttl(self.keys.job(jid))
        replies = await pipe.execute()
        out = []
        for jid, raw, pttl in zip(job_ids, replies[::2], replies[1::2], strict=True):
            if raw:
                flat = tuple(x for kv in raw.items() for x in kv)
                out.append(JobCopy(jid, int(pttl), flat))
        return out

    async def set_aside(self) -> list[JobRecord]:
        """The tenant's jobs taken off this (source) shard's queues and not yet dropped, by
        job ID: at most a batch or two (a mover copies what it takes before it takes more),
        more only where a mover died mid-batch. Still the tenant's jobs to the API."""
        records = await self.shard.records(await self.taken())
        return [r for r in records if r.tenant == self.tenant]

    async def holds(self, job_ids: Sequence[str]) -> set[str]:
        """Those of ``job_ids`` this (target) shard has a hash of (copied here already)."""
        if not job_ids:
            return set()
        pipe = self._r.pipeline(transaction=False)
        for jid in job_ids:
            pipe.exists(self.keys.job(jid))
        found = await pipe.execute()
        return {jid for jid, n in zip(job_ids, found, strict=True) if n}

    async def take_schedules(self) -> int:
        return int(await self._run("move_schedules_out", [self.tenant]))

    async def taken_schedules(self) -> list[ScheduleCopy]:
        """The set-aside schedules, each with the tick the target must fire first."""
        raw = await self._r.hgetall(self.keys.moving_schedules(self.tenant))
        out = []
        for sid, value in sorted(raw.items()):
            tick_s, fired, spec = value.decode().split(" ", 2)
            tick = int(float(tick_s))
            if fired == "1" or await self.fired(sid.decode(), tick):
                body = json.loads(spec)
                tick = cron.next_tick_ms(body["cron"], body["tz"], tick)
            out.append(ScheduleCopy(sid.decode(), spec, tick))
        return out

    async def fired(self, schedule_id: str, tick_ms: int) -> bool:
        """Whether this shard's loop enqueued the job of that tick (its dedupe key exists, or
        its hash at the derived ID: FOLDED_FORMAT)."""
        request_id = cron.tick_request_id(schedule_id, tick_ms)
        return bool(
            await self._r.exists(
                self.keys.dedupe(self.tenant, request_id),
                self.keys.job(derived_job_id(self.tenant, request_id)),
            )
        )

    async def dedupe_keys(self, count: int = 1000) -> list[DedupeCopy]:
        """Every dedupe key of the tenant here (a SCAN: the mover's one O(keyspace) step)."""
        prefix = self.keys.dedupe(self.tenant, "")
        names = [k async for k in self._r.scan_iter(match=prefix + "*", count=count)]
        out: list[DedupeCopy] = []
        for i in range(0, len(names), count):
            chunk = names[i : i + count]
            pipe = self._r.pipeline(transaction=False)
            for name in chunk:
                pipe.get(name)
                pipe.pttl(name)
            replies = await pipe.execute()
            for name, value, pttl in zip(chunk, replies[::2], replies[1::2], strict=True):
                if value is not None:
                    out.append(DedupeCopy(name.decode()[len(prefix) :], value, int(pttl)))
        return out

    async def drop(
        self,
        job_ids: Sequence[str] = (),
        dedupe: Sequence[DedupeCopy] = (),
        schedule_ids: Sequence[str] = (),
    ) -> tuple[int, int, int]:
        """Delete what the target now has (taken or finished jobs only; unchanged keys only)."""
        args: list[Any] = [self.tenant, len(job_ids), len(dedupe), len(schedule_ids), *job_ids]
        for d in dedupe:
            args += [d.request_id, d.value]
        args += list(schedule_ids)
        a, b, c = await self._run("move_drop", args)
        return int(a), int(b), int(c)

    async def submitted(self) -> bytes:
        """The tenant's submit counter as stored (b"0" when absent), for ``finish``."""
        raw = await self._r.hget(self.keys.counts(self.tenant), "submitted")
        return bytes(raw) if raw is not None else b"0"

    async def active(self) -> int:
        return int(await self._r.zcard(self.keys.active_by_tenant(self.tenant)))

    async def finish(self, submitted_seen: bytes) -> tuple[bool, str]:
        """End the tenant's presence here if nothing of it is left: (done, what is left)."""
        done, left = await self._run("move_finish", [self.tenant, submitted_seen])
        return bool(int(done)), left.decode() if isinstance(left, bytes) else str(left)

    async def set_aside_counters(self) -> dict[str, int]:
        raw = await self._r.hgetall(self.keys.moved_counts(self.tenant))
        return {k.decode(): int(v) for k, v in raw.items()}

    async def load_sample(self) -> bytes:
        """The shard loop's last load sample of the tenant here (JSON), b"" for none."""
        raw = await self._r.hget(self.keys.load(), self.tenant)
        return bytes(raw) if raw is not None else b""

    async def forget_counters(self) -> None:
        await self._r.delete(self.keys.moved_counts(self.tenant))

    async def controls(self) -> TenantControls:
        """The tenant's limits and pause state here (the source's, for the target)."""
        limits = await self.shard.limits(self.tenant)
        paused = bool(await self._r.sismember(self.keys.paused(), self.tenant))
        queues = await self.shard.paused_queues_of(self.tenant)
        return TenantControls(limits, paused, tuple(queues))

    # -- target -------------------------------------------------------------------------

    async def put(
        self,
        jobs: Sequence[JobCopy] = (),
        dedupe: Sequence[DedupeCopy] = (),
        schedules: Sequence[ScheduleCopy] = (),
    ) -> tuple[int, int, int]:
        """Add copies here, each as it was (a scheduled job already due by this shard's clock
        arrives ready); what is already here is skipped."""
        now = self.shard._now_arg()
        args: list[Any] = [self.tenant, now, len(jobs), len(dedupe), len(schedules)]
        for j in jobs:
            args += [j.job_id, j.pttl_ms, len(j.fields) // 2, *j.fields]
        for d in dedupe:
            args += [d.request_id, d.value, d.pttl_ms]
        for s in schedules:
            args += [s.schedule_id, s.spec, s.next_tick_ms]
        a, b, c = await self._run("move_in", args)
        return int(a), int(b), int(c)

    async def add_counters(
        self, move_id: str, counters: dict[str, int], ttl_ms: int, sample: bytes = b""
    ) -> bool:
        """Add the source's counters once per ``move_id``, and take on its load ``sample``
        (``load_sample``: its rates count here from the start); False if added before."""
        pairs = [x for name in MOVED_COUNTERS if counters.get(name)
                 for x in (name, counters[name])]  # fmt: skip
        marker = self.keys.moved_in(self.tenant, move_id)
        added = await self.shard._run(
            "move_counters", [marker, self.keys.load()], [self.tenant, ttl_ms, sample, *pairs]
        )
        return bool(int(added))

    async def adopt_controls(self, controls: TenantControls) -> None:
        """Take on the source's limits (unless the tenant has limits here already: an admin
        set them on both sides meanwhile) and its pauses (added to any here). Repeatable."""
        if controls.limits != TenantLimits():
            await self.shard.adopt_limits(self.tenant, controls.limits)
        if controls.paused:
            await self.shard.pause(self.tenant)
        for queue in controls.paused_queues:
            await self.shard.pause(self.tenant, queue)


async def fence_map(shard: ShardClient, version: int, undo: bool = False) -> int:
    """Raise the shard's map fence to ``version`` (or take that raise back)."""
    args = [version, "undo" if undo else "raise"]
    return int(await shard._run("map_fence", [], args))


async def copy_started(shard: ShardClient, tenant: str) -> bool:
    """Whether a move of ``tenant`` off this (source) shard has begun: jobs or schedules taken
    off its queues, or its counters set aside. Until then aborting the move loses nothing."""
    keys = shard.keys
    found = await shard.redis.exists(
        keys.moving(tenant), keys.moving_schedules(tenant), keys.moved_counts(tenant)
    )
    return bool(found)


async def shard_identity(shard: ShardClient) -> int | None:
    """The shard ID this Redis holds the data of (``Keys.identity``), None when unmarked."""
    raw = await shard.redis.get(shard.keys.identity())
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        return None


async def mark_identity(shard: ShardClient, shard_id: int) -> int:
    """Mark this Redis as holding shard ``shard_id``'s data, unless it is marked already;
    returns the ID it is marked with afterwards (another one: the caller must not use it)."""
    await shard.redis.set(shard.keys.identity(), str(shard_id), nx=True)
    found = await shard_identity(shard)
    return shard_id if found is None else found
