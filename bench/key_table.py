"""Redis bytes per scheduled job on either side of a doubling of the shard's key table.

    python bench/key_table.py [--jobs 1000000] [--keys-before 80000] [--out FILE.json]

Redis keeps every key in one hash table whose bucket array doubles when the key count reaches
a power of two: 8 more bytes per key at once, paid until the count nears the next power. So
``used_memory`` growth per job over a load (``bench/run.py``'s ``scale``) depends on where the
load starts and ends against 2^n keys. This loads ``--jobs`` scheduled jobs (``scale``'s own
load: one tenant, through ``ShardClient.enqueue``, the shard at a first install's job format)
twice on a fresh Redis: once on an empty keyspace, once after ``--keys-before`` other keys
(``scale``'s probes leave about that many finished jobs' keys), and reports the bytes per job
of each and the key table's share (``MEMORY STATS``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from redis.asyncio import Redis

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from op_costs import _git, machine  # noqa: E402
from services import RedisServer  # noqa: E402
from shardq_bench import _load, first_installed  # noqa: E402


async def _one(jobs: int, keys_before: int) -> dict[str, Any]:
    with RedisServer() as server:
        await first_installed(server.url)
        redis = Redis.from_url(server.url)
        try:
            for lo in range(0, keys_before, 10_000):
                pipe = redis.pipeline(transaction=False)
                for i in range(lo, min(keys_before, lo + 10_000)):
                    pipe.set(f"other:{i}", "x")
                await pipe.execute()
            loaded = await _load(server.url, jobs)
            keys = int((await redis.memory_stats())["keys.count"])
        finally:
            await redis.aclose()
    return {
        "keys_before": keys_before,
        "keys_after": keys,
        "bytes_per_job": round(loaded["bytes"], 1),
        "by_structure": loaded["breakdown"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=1_000_000, help="scheduled jobs per load")
    ap.add_argument("--keys-before", type=int, default=80_000, help="other keys, second load")
    ap.add_argument("--out", type=Path, default=None, help="JSON file to write")
    a = ap.parse_args()
    results = [asyncio.run(_one(a.jobs, n)) for n in (0, a.keys_before)]
    report = {
        "schema": "shardq-key-table/1",
        "command": " ".join(["python", "bench/key_table.py", *sys.argv[1:]]),
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": _git("rev-parse", "HEAD"),
        "machine": machine(),
        "params": {"jobs": a.jobs, "keys_before": a.keys_before},
        "results": results,
    }
    if a.out:
        a.out.write_text(json.dumps(report, indent=1) + "\n")
    for r in results:
        print(
            f"{r['keys_before']:>9,} keys before, {r['keys_after']:>9,} after: "
            f"{r['bytes_per_job']:6.1f} bytes per job, key table "
            f"{r['by_structure']['key_table']:5.1f}"
        )


if __name__ == "__main__":
    main()
