"""What one command to a shard's Redis costs its caller, with shardq's connection and with
redis-py's own checks before each send.

    python bench/redis_calls.py [--calls 3000] [--rounds 15] [--out FILE.json]

One process, on the event loop the servers run on (``shardq.common.loop``), against a
redis-server this script starts. Each command is sent one at a time, as a lone unary
``SubmitJob`` sends its shard call: ``PING``, and a one-job ``enqueue.lua`` through
``ShardClient.submit``. Two connection classes, alternated round by round on one Redis:

- ``shardq``: ``shardq.common.redis.ShardConnection``, which checks a pooled connection and
  writes the command in the caller's own turn of the event loop;
- ``redis_py_checks``: the same connection (hiredis packing) with redis-py 7.4's own
  ``can_read_destructive`` (a read under a zero timeout) and ``send_packed_command`` (the
  write under ``asyncio.wait_for``).

The caller's CPU (``time.process_time``) and wall time per command, the median of
``--rounds`` rounds (the machine's speed moves between rounds; alternating shares it out).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.connection import Connection

from shardq.common.loop import run_main
from shardq.common.redis import ShardConnection, _HiredisPacking, redis_for
from shardq.shard.client import ShardClient
from shardq.shard.models import NewJob

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from enqueue_calls import report_head  # noqa: E402
from services import RedisServer  # noqa: E402


class RedisPyChecks(_HiredisPacking, Connection):
    """shardq's packing, redis-py's own checks and send."""


CLASSES: dict[str, type[Connection]] = {
    "shardq": ShardConnection,
    "redis_py_checks": RedisPyChecks,
}


async def _round(call: Callable[[int], Awaitable[Any]], calls: int) -> tuple[float, float]:
    cpu, wall = time.process_time(), time.perf_counter()
    for i in range(calls):
        await call(i)
    return (
        (time.process_time() - cpu) / calls * 1e6,
        (time.perf_counter() - wall) / calls * 1e6,
    )


async def measure(address: str, calls: int, rounds: int) -> dict[str, Any]:
    clients: dict[str, Redis] = {}
    for name, cls in CLASSES.items():
        r = redis_for(address, "")
        r.connection_pool.connection_class = cls
        clients[name] = r
    shards = {name: ShardClient(r) for name, r in clients.items()}
    counter = iter(range(10**9))

    def ping(name: str) -> Callable[[int], Awaitable[Any]]:
        r: Any = clients[name]  # (redis-py's annotations: "Awaitable[bool] | bool")
        return lambda _: r.ping()

    def submit(name: str) -> Callable[[int], Awaitable[Any]]:
        shard = shards[name]
        return lambda _: shard.submit(
            NewJob(tenant="bench", handler="noop", payload=b"1", request_id=f"r{next(counter)}")
        )

    shapes = {"ping": ping, "enqueue_one_job": submit}
    samples: dict[str, dict[str, list[tuple[float, float]]]] = {
        shape: {name: [] for name in CLASSES} for shape in shapes
    }
    try:
        for shape, make in shapes.items():
            for name in CLASSES:
                await _round(make(name), 50)  # connected, scripts loaded
            for _ in range(rounds):
                for name in CLASSES:
                    samples[shape][name].append(await _round(make(name), calls))
    finally:
        for r in clients.values():
            await r.aclose()
    return {
        shape: {
            name: {
                "caller_cpu_us_per_call": round(statistics.median(c for c, _ in got), 1),
                "wall_us_per_call": round(statistics.median(w for _, w in got), 1),
                "caller_cpu_us_per_call_rounds": [round(c, 1) for c, _ in got],
            }
            for name, got in by_name.items()
        }
        for shape, by_name in samples.items()
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=3000, help="commands per round")
    ap.add_argument("--rounds", type=int, default=15, help="rounds per connection class")
    ap.add_argument("--out", type=Path, default=None, help="JSON file to write")
    a = ap.parse_args()
    with RedisServer() as redis:
        results = run_main(measure(f"127.0.0.1:{redis.port}", a.calls, a.rounds))
    report = {
        **report_head("shardq-redis-calls/1", "bench/redis_calls.py"),
        "params": {"calls": a.calls, "rounds": a.rounds},
        "results": results,
    }
    if a.out:
        a.out.write_text(json.dumps(report, indent=1) + "\n")
    for shape, by_name in results.items():
        for name, r in by_name.items():
            print(
                f"{shape:16} {name:16} caller CPU {r['caller_cpu_us_per_call']:7.1f} µs"
                f"  wall {r['wall_us_per_call']:7.1f} µs per call"
            )


if __name__ == "__main__":
    main()
