"""What ``--shard-replicas-to-ack 1`` costs a submit: the same submits to a shard with one
replica, without and with the WAIT that makes each acknowledged write replicated.

    python bench/replica_cost.py [--jobs 2000] [--batch-jobs 20000] [--concurrent 64]

Starts a primary redis-server (AOF) and a replica on free ports and measures, each way:

- one submit at a time (``ShardClient.enqueue_prepared`` of one job): the latency a lone
  caller sees, mean and p99;
- submits from ``--concurrent`` tasks at once through the coordinator's coalescer (one
  round trip, and one WAIT, per coalesced batch): jobs per second;
- batches of 500 (``SubmitJobs``): jobs per second.

Prints one table; docs/operating.md quotes a run. Replication here is over loopback, so the
figures are the floor of the cost: a replica in another zone adds its round-trip time to
every acknowledged write.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable

from redis.asyncio import Redis

from shardq.common.redis import Durability, redis_for
from shardq.coordinator.coalesce import Coalescer
from shardq.coordinator.tools.redis_server import RedisProcess
from shardq.shard.client import ShardClient
from shardq.shard.models import NewJob, ShardSettings


def _job(n: int, tag: str) -> NewJob:
    return NewJob("bench", "bench.noop", b'{"n": 1}', request_id=f"{tag}-{n}")


async def _one_at_a_time(shard: ShardClient, jobs: int, tag: str) -> list[float]:
    out = []
    for n in range(jobs):
        job = shard.prepare(_job(n, tag))
        t = time.perf_counter()
        await shard.enqueue_prepared([job])
        out.append(time.perf_counter() - t)
    return out


async def _coalesced(shard: ShardClient, jobs: int, tasks: int, tag: str) -> float:
    coalescer = Coalescer(shard)
    per_task = jobs // tasks

    async def submitter(k: int) -> None:
        for n in range(per_task):
            await coalescer.submit(shard.prepare(_job(k * per_task + n, tag)))

    t = time.perf_counter()
    await asyncio.gather(*(submitter(k) for k in range(tasks)))
    await coalescer.close()
    return per_task * tasks / (time.perf_counter() - t)


async def _batched(shard: ShardClient, jobs: int, tag: str) -> float:
    prepared = [shard.prepare(_job(n, tag)) for n in range(jobs)]
    t = time.perf_counter()
    for i in range(0, jobs, 500):
        await shard.enqueue_prepared(prepared[i : i + 500])
    return jobs / (time.perf_counter() - t)


async def _measure(
    address: str, durability: Durability, args: argparse.Namespace, tag: str
) -> dict[str, float]:
    settings = ShardSettings(key_prefix="bench", durability=durability)
    shard = ShardClient(redis_for(address, ""), settings)
    try:
        lat = await _one_at_a_time(shard, args.jobs, f"{tag}-1")
        coalesced = await _coalesced(shard, args.batch_jobs, args.concurrent, f"{tag}-c")
        batched = await _batched(shard, args.batch_jobs, f"{tag}-b")
    finally:
        await shard.redis.aclose()
    lat_ms = sorted(x * 1000 for x in lat)
    return {
        "one at a time, mean ms": statistics.fmean(lat_ms),
        "one at a time, p99 ms": lat_ms[int(len(lat_ms) * 0.99) - 1],
        f"{args.concurrent} concurrent (coalesced), jobs/s": coalesced,
        "batches of 500, jobs/s": batched,
    }


async def _wait(check: Callable[[], Awaitable[bool]]) -> None:
    for _ in range(600):  # 30 s
        if await check():
            return
        await asyncio.sleep(0.05)
    raise TimeoutError("the replica did not connect within 30 s")


async def main(args: argparse.Namespace) -> None:
    primary = RedisProcess().start()
    replica = RedisProcess(extra_args=["--replicaof", "127.0.0.1", str(primary.port)]).start()
    try:
        probe = Redis(port=primary.port)

        async def synced() -> bool:
            return int((await probe.info("replication"))["connected_slaves"]) >= 1

        await _wait(synced)
        await probe.aclose()
        address = f"127.0.0.1:{primary.port}"
        rows: dict[str, dict[str, list[float]]] = {}
        for rounds in range(args.repeat):
            for name, durability in (("off", Durability()), ("replicas-to-ack 1", Durability(1))):
                got = await _measure(address, durability, args, f"{name[:3]}{rounds}")
                for k, v in got.items():
                    rows.setdefault(k, {}).setdefault(name, []).append(v)
        print(f"{'':42} {'off':>12} {'replicas-to-ack 1':>18}")
        for k, by in rows.items():
            off, on = statistics.median(by["off"]), statistics.median(by["replicas-to-ack 1"])
            print(f"{k:42} {off:12.2f} {on:18.2f}")
    finally:
        replica.cleanup()
        primary.cleanup()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=2_000, help="submits one at a time")
    p.add_argument("--batch-jobs", type=int, default=20_000, help="submits coalesced/batched")
    p.add_argument("--concurrent", type=int, default=64, help="concurrent submitters")
    p.add_argument("--repeat", type=int, default=3, help="rounds, alternating; medians shown")
    asyncio.run(main(p.parse_args()))
