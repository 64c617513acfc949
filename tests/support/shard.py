"""What the shard tests (the Lua scripts one by one, and the shard's properties) build from.

The fake clock's start, the lease they claim with, the job they submit and the hash enqueue
writes for it, its dedupe key, the keys that hold a tenant's ready jobs and rings, the seeding
steps (enqueue, then claim, or the previous key layout by hand) and the ways a lease goes
stale. One copy here, so that a change to what a script writes is made in one place.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import pytest
from redis.asyncio import Redis

from shardq.shard import ClaimedJob, Failure, FakeClock, ItemCode, Lease, NewJob, ShardClient
from shardq.shard.client import digest

#: The FakeClock's start (the ``clock`` fixture in tests/conftest.py).
NOW = 1_700_000_000_000
LEASE = 30_000
P = b"{}"
DIGEST = digest("h", P)
#: The wake-up list of the default queue's workers.
WAKE = "sq:wake:default"


def job(jid: str = "J1", tenant: str = "acme", **kw: Any) -> NewJob:
    """Job ``jid`` of handler ``h`` with payload ``P``; its request ID is ``r`` + ``jid``."""
    return NewJob(tenant=tenant, handler="h", payload=P, request_id=f"r{jid}", job_id=jid, **kw)


def job_hash(jid: str, state: str, tenant: str = "acme", **over: str) -> dict[str, str]:
    """The hash enqueue writes for ``job(jid, tenant)`` at NOW, in ``state``, fields overridden.
    Without 'at' and 'f': enqueue leaves them out while they are 0 (before the first claim)."""
    h = {
        "t": tenant, "r": f"r{jid}", "h": "h", "p": P.decode(), "pr": "0", "s": state,
        "ra": str(NOW), "ca": str(NOW), "ma": "5", "to": "300000",
    }  # fmt: skip
    h.update(over)
    return h


def claimed_hash(
    jid: str, state: str, fence: int, tenant: str = "acme", **over: str
) -> dict[str, str]:
    """The hash of ``job(jid, tenant)`` once worker w1 claimed it at NOW with ``fence``."""
    claim = {"at": "1", "f": str(fence), "w": "w1", "sa": str(NOW)}
    return job_hash(jid, state, tenant, **(claim | over))


def dedupe(*jids: str, tenant: str = "acme") -> dict[str, str]:
    """The dedupe keys of ``job(jid, tenant)`` for each of ``jids``."""
    return {f"sq:dedupe:{tenant}:r{j}": f"{j} {DIGEST}" for j in jids}


def ready_keys(
    tenant: str, lists: Mapping[int, Sequence[str]], queue: str = "default"
) -> dict[str, Any]:
    """The keys that hold ``tenant``'s ready jobs of ``queue``: a list per priority (priority
    -> job IDs, FIFO), the priorities that have one, and the tenant's queues (this one)."""
    return {
        **{f"sq:ready:{tenant}:{queue}:{p}": list(ids) for p, ids in lists.items()},
        f"sq:tprio:{tenant}:{queue}": [(str(p), p) for p in sorted(lists)],
        f"sq:tqueues:{tenant}": {queue},
    }


def ring_keys(queue: str, *tenants: str) -> dict[str, Any]:
    """The round-robin ring of ``queue`` holding ``tenants`` in this order, and its member set."""
    return {f"sq:qring:{queue}": list(tenants), f"sq:inring:{queue}": set(tenants)}


def ready_alone(tenant: str, lists: Mapping[int, Sequence[str]], queue: str = "default") -> dict:
    """:func:`ready_keys` of a tenant alone on the queue's ring."""
    return ready_keys(tenant, lists, queue) | ring_keys(queue, tenant)


async def drop_wake_tokens(redis: Redis) -> None:
    """Delete every queue's wake-up list and the shard loop's."""
    names = [k async for k in redis.scan_iter(match="sq:wake*")]
    await redis.delete("sq:promoter_wake", *names)


async def seed(shard: ShardClient, redis: Redis, *jobs: NewJob) -> None:
    """Enqueue, then drop the wake-up tokens so the assertions show only what came after."""
    await shard.enqueue(list(jobs))
    await drop_wake_tokens(redis)


async def claimed(shard: ShardClient, redis: Redis, *jobs: NewJob) -> list[ClaimedJob]:
    """Enqueue and claim the jobs as worker w1, then drop the wake-up tokens."""
    await shard.enqueue(list(jobs))
    out = await shard.claim("w1", len(jobs), LEASE)
    await drop_wake_tokens(redis)
    return out


async def seed_previous_layout(
    redis: Redis,
    ready: Mapping[tuple[str, int], Sequence[str]],
    weights: Mapping[str, int] | None = None,
) -> None:
    """Write ready jobs as the shard's previous key layout (before queues) held them: per
    (tenant, priority) a job hash and the list ``ready:{t}:{p}``, each tenant once on
    ``ring:{p}``, tenant counts; the ``weights`` hash; a token on the old ``wake`` list."""
    pipe = redis.pipeline(transaction=False)
    for (tenant, prio), ids in ready.items():
        for jid in ids:
            pipe.hset(f"sq:job:{jid}", mapping=job_hash(jid, "ready", tenant, pr=str(prio)))
            pipe.hincrby(f"sq:counts:{tenant}", "ready", 1)
            pipe.hincrby(f"sq:counts:{tenant}", "submitted", 1)
            pipe.sadd("sq:tenants", tenant)
        pipe.rpush(f"sq:ready:{tenant}:{prio}", *ids)
        pipe.rpush(f"sq:ring:{prio}", tenant)
    for tenant, weight in (weights or {}).items():
        pipe.hset("sq:weights", tenant, weight)
    pipe.rpush("sq:wake", "1")
    await pipe.execute()


# --- ways the lease of a claimed job goes stale ------------------------------------------------

#: Given the shard, a job just claimed and the clock, leaves the claim stale and returns its lease.
MakeStale = Callable[[ShardClient, ClaimedJob, FakeClock], Awaitable[Lease]]


async def _wrong_fence(shard: ShardClient, c: ClaimedJob, clock: FakeClock) -> Lease:
    return Lease(c.job_id, c.fence + 1)


async def _acked(shard: ShardClient, c: ClaimedJob, clock: FakeClock) -> Lease:
    assert await shard.ack([Lease(c.job_id, c.fence)]) == [ItemCode.OK]
    return Lease(c.job_id, c.fence)


async def _failed(shard: ShardClient, c: ClaimedJob, clock: FakeClock) -> Lease:
    await shard.fail([Failure(c.job_id, c.fence, c.attempt, "boom", retry_at_ms=NOW + 10_000)])
    return Lease(c.job_id, c.fence)


async def _reaped(shard: ShardClient, c: ClaimedJob, clock: FakeClock) -> Lease:
    clock.advance(LEASE)
    assert await shard.reap() == (1, 0)
    return Lease(c.job_id, c.fence)


async def _reaped_and_reclaimed(shard: ShardClient, c: ClaimedJob, clock: FakeClock) -> Lease:
    await _reaped(shard, c, clock)
    (again,) = await shard.claim("w2", 1, LEASE)
    assert again.job_id == c.job_id
    assert again.fence == c.fence + 1
    return Lease(c.job_id, c.fence)


async def _missing_job(shard: ShardClient, c: ClaimedJob, clock: FakeClock) -> Lease:
    return Lease("NOSUCHJOB", c.fence)


#: Every way a lease goes stale, as parameters of a test taking ``make_stale: MakeStale``.
STALE_LEASES = [
    pytest.param(_wrong_fence, id="wrong-fence"),
    pytest.param(_acked, id="acked"),
    pytest.param(_failed, id="failed"),
    pytest.param(_reaped, id="reaped"),
    pytest.param(_reaped_and_reclaimed, id="reaped-and-reclaimed"),
    pytest.param(_missing_job, id="missing-job"),
]
