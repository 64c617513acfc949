"""upgrade_layout.lua: a shard written before queues (ready:{t}:{p} lists, ring:{p},
credit:{p}, the weights hash) becomes queue "default" of the new layout, in capped batches,
idempotently, and every job it held is claimable exactly once; the shard loop runs it when it
starts leading."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

from redis.asyncio import Redis

from shardq.shard import ShardClient, ShardSettings, TenantLimits
from shardq.shard.loop import LoopSettings, ShardLoop
from tests.support.shard import (
    LEASE,
    NOW,
    WAKE,
    dedupe,
    drop_wake_tokens,
    job,
    job_hash,
    ready_keys,
    ring_keys,
    seed_previous_layout,
)
from tests.support.state import dump

OLD_READY = {
    ("acme", 9): ["O1", "O2", "O3"],
    ("acme", 0): ["O4", "X5"],
    ("bravo", 5): ["B1", "B2"],
}


async def seed(shard: ShardClient, redis: Redis) -> None:
    """The previous layout as above, with X5 cancelled while ready (its ID left in the list),
    a turn half-used on ring:9, weights 3 and 1, and N1: a job submitted since the shard's
    code was upgraded (already in the new layout, behind acme's older priority-9 jobs)."""
    await seed_previous_layout(redis, OLD_READY, weights={"acme": 3, "bravo": 1})
    await redis.hset("sq:job:X5", mapping={"s": "cancelled", "fa": str(NOW)})
    await redis.hincrby("sq:counts:acme", "ready", -1)
    await redis.hset("sq:credit:9", "acme", 1)
    await shard.enqueue([job("N1", priority=9)])
    await drop_wake_tokens(redis)


async def test_the_previous_layout_becomes_queue_default_and_every_job_is_claimed_once(
    shard: ShardClient, redis: Redis
) -> None:
    await seed(shard, redis)
    # Capped at 2 jobs a call: the client calls again until nothing of the old layout is left.
    assert await shard.upgrade_layout(limit=2) == 7
    old = {f"sq:job:{j}": job_hash(j, "ready", t, pr=str(p)) for (t, p), ids in
           OLD_READY.items() for j in ids}  # fmt: skip
    old["sq:job:X5"] |= {"s": "cancelled", "fa": str(NOW)}
    assert await dump(redis) == {
        **old,
        "sq:job:N1": job_hash("N1", "ready", pr="9"),
        **ready_keys("acme", {0: ["O4", "X5"], 9: ["O1", "O2", "O3", "N1"]}),
        **ready_keys("bravo", {5: ["B1", "B2"]}),
        **ring_keys("default", "acme", "bravo"),
        "sq:limits:acme": {"weight": "3"},
        "sq:counts:acme": {"ready": "5", "submitted": "6", "bytes": "2"},
        "sq:counts:bravo": {"ready": "2", "submitted": "2"},
        "sq:tenants": {"acme", "bravo"},
        WAKE: ["1"] * 4,  # from each of the 4 calls (2 + 2 + 2 + 1 jobs): workers start at once
        **dedupe("N1"),
    }
    once = await dump(redis)
    assert await shard.upgrade_layout() == 0  # idempotent: nothing left to convert
    assert await dump(redis) == once

    claimed = []
    while got := await shard.claim("w1", 3, LEASE):
        claimed += got
    assert Counter(c.job_id for c in claimed) == Counter(["O1", "O2", "O3", "N1", "O4", "B1", "B2"])
    assert [c.job_id for c in claimed if c.tenant == "acme"] == ["O1", "O2", "O3", "N1", "O4"]
    # acme's weight of 3 came along: three of its jobs per turn.
    assert [c.tenant for c in claimed][:5] == ["acme"] * 3 + ["bravo", "acme"]


async def test_a_long_old_list_moves_in_batches_in_its_order(
    shard: ShardClient, redis: Redis
) -> None:
    ids = [f"J{i:04d}" for i in range(1_234)]
    await seed_previous_layout(redis, {("acme", 4): ids})
    calls = 0
    while True:
        _, done = await shard._run("upgrade_layout", [], [500])
        calls += 1
        if int(done):
            break
    assert calls == 3
    assert await redis.lrange("sq:ready:acme:default:4", 0, -1) == [i.encode() for i in ids]
    old = ("sq:ready:acme:4", "sq:ring:", "sq:credit:", "sq:weights")
    assert not [k for k in await redis.keys("sq:*") if k.decode().startswith(old)]
    assert not await redis.exists("sq:wake")
    claimed = []
    while got := await shard.claim("w1", 500, LEASE):
        claimed += [c.job_id for c in got]
    assert claimed == ids


async def test_a_shard_loop_that_starts_leading_converts_the_previous_layout(
    redis: Redis,
) -> None:
    await seed_previous_layout(redis, {("acme", 2): ["O1", "O2"]}, weights={"acme": 2})
    shard = ShardClient(redis, ShardSettings(key_prefix="sq"))
    loop = ShardLoop(shard, LoopSettings(leader_ttl_ms=1_000, load_interval_s=0))
    task = asyncio.create_task(loop.run())
    try:
        deadline = time.monotonic() + 10
        while await redis.exists("sq:ring:2", "sq:weights", "sq:ready:acme:2"):
            assert time.monotonic() < deadline, "the loop never converted the old layout"
            await asyncio.sleep(0.01)
    finally:
        loop.stop()
        await asyncio.wait_for(task, 10)
    assert [c.job_id for c in await shard.claim("w1", 5, LEASE)] == ["O1", "O2"]
    assert await shard.limits("acme") == TenantLimits(weight=2)
