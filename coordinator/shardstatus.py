"""The live state of every shard for ``AdminService.ListShardStatus`` (the dashboard's
overview): memory, the shard loop holding the leader lease, job gauges summed over the
shard's tenants, and the moves under way with their progress.

Read when asked, from each shard's Redis, one pipelined round trip per chunk of tenants; a
shard that does not answer is reported unreachable rather than failing the whole call, since
the one shard that is down is the one an operator opens the page to see.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any

from shardq.coordinator.placement import ShardMap
from shardq.coordinator.router import ShardPool
from shardq.shard.client import ShardClient
from shardq.v1 import admin_pb2

#: Gauges of a tenant's counts hash (``shard/keys.py``, ``counts``) summed per shard.
GAUGES = ("scheduled", "ready", "active", "dead")
#: Counters of the same hash (they only grow), summed per shard: the dashboard's throughput
#: is their increase between two samples.
COUNTERS = ("submitted", "succeeded", "failed")
#: Tenants whose counts one pipeline reads: bounded, so a shard of many tenants is read in
#: several round trips instead of one huge reply.
CHUNK = 500
#: A shard slower than this to answer is reported unreachable: the page must not hang on it.
SHARD_TIMEOUT_S = 3.0


@dataclass(slots=True)
class ShardStatus:
    shard_id: int
    address: str
    state: str
    reachable: bool = False
    error: str = ""
    used_memory_bytes: int = 0
    leader_instance_id: str = ""
    leader_ttl_ms: int = 0
    tenant_count: int = 0
    gauges: dict[str, int] = field(default_factory=lambda: dict.fromkeys(GAUGES, 0))
    counters: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))
    due_lateness_ms: int = 0


@dataclass(slots=True)
class MoveStatus:
    tenant_id: str
    from_shard_id: int
    to_shard_id: int
    started_at_ms: int
    jobs_on_source: int = 0
    jobs_on_target: int = 0
    jobs_in_transit: int = 0


def _int(value: Any) -> int:
    return int(value) if value is not None else 0


async def _tenant_jobs(client: ShardClient, tenant: str) -> int:
    """The tenant's jobs counted on one shard (scheduled + ready + active + dead)."""
    r: Any = client.redis  # redis-py's annotations mix sync and async replies
    values = await r.hmget(client.keys.counts(tenant), list(GAUGES))
    return sum(_int(v) for v in values)


async def _read_shard(client: ShardClient, status: ShardStatus) -> None:
    r: Any = client.redis
    keys = client.keys
    memory = await r.info("memory")
    status.used_memory_bytes = int(memory.get("used_memory", 0))
    pipe = r.pipeline(transaction=False)
    pipe.get(keys.leader())
    pipe.pttl(keys.leader())
    pipe.smembers(keys.tenants())
    pipe.zrange(keys.due(), 0, 0, withscores=True)
    pipe.time()
    leader, ttl_ms, members, first_due, (now_s, now_us) = await pipe.execute()
    if first_due:
        now_ms = int(now_s) * 1000 + int(now_us) // 1000
        status.due_lateness_ms = max(0, now_ms - int(first_due[0][1]))
    status.leader_instance_id = leader.decode() if isinstance(leader, bytes) else (leader or "")
    status.leader_ttl_ms = max(0, int(ttl_ms)) if status.leader_instance_id else 0
    tenants = sorted(m.decode() if isinstance(m, bytes) else str(m) for m in members)
    status.tenant_count = len(tenants)
    for i in range(0, len(tenants), CHUNK):
        pipe = r.pipeline(transaction=False)
        for tenant in tenants[i : i + CHUNK]:
            pipe.hmget(keys.counts(tenant), [*GAUGES, *COUNTERS])
        for row in await pipe.execute():
            for name, value in zip(GAUGES, row[: len(GAUGES)], strict=True):
                status.gauges[name] += _int(value)
            for name, value in zip(COUNTERS, row[len(GAUGES) :], strict=True):
                status.counters[name] += _int(value)
    status.reachable = True


async def _one(client: ShardClient | None, status: ShardStatus) -> None:
    if client is None:
        status.error = "no client for this shard yet"
        return
    try:
        await asyncio.wait_for(_read_shard(client, status), SHARD_TIMEOUT_S)
    except (OSError, TimeoutError, ConnectionError) as exc:
        status.error = f"unreachable: {type(exc).__name__}"
    except Exception as exc:  # redis-py's errors; the page shows them, the call goes on
        status.error = f"{type(exc).__name__}: {exc}"


async def _move(pool: ShardPool, move: MoveStatus) -> None:
    # Bounded like a shard's own read: a shard away must not hold the whole answer.
    with contextlib.suppress(Exception):  # listed without its counts
        await asyncio.wait_for(_move_counts(pool, move), SHARD_TIMEOUT_S)


async def _move_counts(pool: ShardPool, move: MoveStatus) -> None:
    try:
        source = pool.get(move.from_shard_id)[0]
        target = pool.get(move.to_shard_id)[0]
        move.jobs_on_source = await _tenant_jobs(source, move.tenant_id)
        move.jobs_on_target = await _tenant_jobs(target, move.tenant_id)
        r: Any = source.redis
        move.jobs_in_transit = int(await r.scard(source.keys.moving(move.tenant_id)))
    except Exception:  # a shard away: the move is still listed, without its counts
        return


async def collect(smap: ShardMap, pool: ShardPool) -> tuple[list[ShardStatus], list[MoveStatus]]:
    """Every shard of ``smap`` and every move under way, read concurrently."""
    clients = pool.all()
    shards = [
        ShardStatus(s.shard_id, s.address, s.state)
        for s in sorted(smap.shards.values(), key=lambda s: s.shard_id)
    ]
    moves = [
        MoveStatus(m.tenant_id, m.from_shard_id, m.to_shard_id, m.started_at_ms)
        for m in sorted(smap.moves.values(), key=lambda m: m.tenant_id)
    ]
    await asyncio.gather(
        *(_one(clients.get(s.shard_id), s) for s in shards),
        *(_move(pool, m) for m in moves),
    )
    return shards, moves


def shard_pb(s: ShardStatus) -> admin_pb2.ShardStatus:
    return admin_pb2.ShardStatus(
        shard_id=s.shard_id,
        address=s.address,
        state=admin_pb2.SHARD_STATE_DRAINING
        if s.state == "draining"
        else admin_pb2.SHARD_STATE_ACTIVE,
        reachable=s.reachable,
        error=s.error,
        used_memory_bytes=s.used_memory_bytes,
        leader_instance_id=s.leader_instance_id,
        leader_ttl_ms=s.leader_ttl_ms,
        tenant_count=s.tenant_count,
        **s.gauges,
        submitted_total=s.counters["submitted"],
        completed_total=s.counters["succeeded"],
        failed_total=s.counters["failed"],
        due_lateness_ms=s.due_lateness_ms,
    )


def move_pb(m: MoveStatus) -> admin_pb2.MoveStatus:
    return admin_pb2.MoveStatus(
        tenant_id=m.tenant_id,
        from_shard_id=m.from_shard_id,
        to_shard_id=m.to_shard_id,
        started_at_unix_ms=m.started_at_ms,
        jobs_on_source=m.jobs_on_source,
        jobs_on_target=m.jobs_on_target,
        jobs_in_transit=m.jobs_in_transit,
    )
