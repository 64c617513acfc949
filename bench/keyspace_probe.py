"""Is the slower claim/promote of the ``scale`` scenario shardq's doing, or the keyspace's?

Runs the ``scale`` probe (claim and promote of 10,000 jobs, Redis' own µs per job from
``INFO commandstats``) on an empty shard, then again after filling Redis with keys shardq never
touches: 2,000,000 strings (half with a TTL, as dedupe keys have) and a 1,000,000-member ZSET —
about the key count and shape of 1,000,000 scheduled jobs, none of them shardq's.

    .venv/bin/python bench/keyspace_probe.py [--strings 2000000] [--zset 1000000]

Prints both probes as JSON lines. If the filler slows claim as much as the scheduled backlog
does, the cost is the size of Redis' keyspace (cache and TLB misses on every key lookup), not
a scan of the backlog: claim never reads the delayed ZSETs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from redis.asyncio import Redis
from services import RedisServer
from shardq_bench import _probe


async def _fill(url: str, strings: int, zset: int) -> int:
    redis = Redis.from_url(url)
    try:
        pipe = redis.pipeline(transaction=False)
        for i in range(strings):
            pipe.set(f"filler:{uuid.uuid4().hex}", "x" * 40, px=86_400_000 if i % 2 else None)
            if i % 10_000 == 9_999:
                await pipe.execute()
                pipe = redis.pipeline(transaction=False)
        await pipe.execute()
        for lo in range(0, zset, 10_000):
            members = {uuid.uuid4().hex[:26]: lo + k for k in range(min(10_000, zset - lo))}
            await redis.zadd("filler:zset", members)
        return int((await redis.info("memory"))["used_memory"])
    finally:
        await redis.aclose()


async def main(strings: int, zset: int) -> None:
    with RedisServer() as server:
        await _probe(server.url, 10_000, "bench-probe")  # warm-up pass, as in `scale`
        empty = await _probe(server.url, 10_000, "bench-probe")
        used = await _fill(server.url, strings, zset)
        await _probe(server.url, 10_000, "bench-probe")
        filled = await _probe(server.url, 10_000, "bench-probe")
    rounded = {k: round(v, 2) for k, v in empty.items()}
    print(json.dumps({"keyspace": "empty", **rounded}))
    rounded = {k: round(v, 2) for k, v in filled.items()}
    print(json.dumps({"keyspace": f"{strings} strings + {zset}-member zset", "used_memory": used,
                      **rounded}))  # fmt: skip


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--strings", type=int, default=2_000_000)
    ap.add_argument("--zset", type=int, default=1_000_000)
    args = ap.parse_args()
    asyncio.run(main(args.strings, args.zset))
