"""Redis work per enqueued job: commands and EVALSHA µs of ``enqueue.lua`` per job.

    python bench/enqueue_calls.py [--jobs 50000] [--rounds 2] [--out FILE.json]
    python bench/enqueue_calls.py --shardq-python /tmp/base/.venv/bin/python ...

Batches of 100 (what ``SubmitJobs`` and the coordinator's coalescer send), ready or delayed an
hour, in two shapes: every batch from one tenant (a ``SubmitJobs`` call: one token, one
tenant), and every batch over 100 tenants (the coalescer's mix of unary calls). The commands
a script runs per job (``INFO commandstats``, EVALSHA itself left out) are exact, whatever the
machine; the µs are Redis' own time in the script, noisy on a shared machine (medians of
``--rounds``). A ``redis-server`` of its own, flushed before each round.

``--shardq-python``: run the measure with another checkout's venv (its shardq), to compare
two commits in one run; the JSON records the commit of the shardq measured.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from op_costs import machine  # noqa: E402
from redis.asyncio import Redis  # noqa: E402
from services import RedisServer  # noqa: E402

import shardq.shard.client  # noqa: E402
from shardq.shard.client import ShardClient  # noqa: E402
from shardq.shard.models import NewJob  # noqa: E402

BATCH = 100
SHAPES = {"one_tenant_per_batch": 1, "100_tenants_per_batch": 100}


async def one_round(url: str, jobs: int, tenants_per_batch: int, delayed: bool) -> dict[str, float]:
    redis = Redis.from_url(url)
    client = ShardClient(redis)
    try:
        await redis.flushall()
        await client.enqueue([NewJob("warm", "noop", b"0", "warm")])  # loads the script
        await redis.config_resetstat()
        run_at = client.clock.now_ms() + 3_600_000 if delayed else None
        for lo in range(0, jobs, BATCH):
            await client.enqueue(
                [
                    NewJob(
                        f"t{(lo // BATCH + i) % tenants_per_batch}" if tenants_per_batch > 1
                        else f"t{(lo // BATCH) % 100}",
                        "noop", b"0", uuid.uuid4().hex, run_at_ms=run_at,
                    )
                    for i in range(BATCH)
                ]
            )  # fmt: skip
        stats = await redis.info("commandstats")
    finally:
        await redis.aclose()
    calls = sum(s["calls"] for name, s in stats.items() if name != "cmdstat_evalsha")
    return {"commands": calls / jobs, "script_us": stats["cmdstat_evalsha"]["usec"] / jobs}


def measure(jobs: int, rounds: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with RedisServer() as server:
        for shape, tenants in SHAPES.items():
            for state in ("ready", "delayed"):
                got = [
                    asyncio.run(one_round(server.url, jobs, tenants, state == "delayed"))
                    for _ in range(rounds)
                ]
                out[f"{shape}/{state}"] = {
                    "commands_per_job": round(statistics.median(g["commands"] for g in got), 2),
                    "script_us_per_job": round(statistics.median(g["script_us"] for g in got), 2),
                    "rounds": [{k: round(v, 2) for k, v in g.items()} for g in got],
                }
    return out


def commit_of_shardq() -> str:
    """The commit of the checkout the imported shardq comes from (editable installs)."""
    tree = Path(shardq.shard.client.__file__).resolve().parent
    done = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=tree, capture_output=True, text=True, check=False
    )
    return done.stdout.strip()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=50_000, help="jobs per round and shape")
    ap.add_argument("--rounds", type=int, default=2, help="rounds per shape (median kept)")
    ap.add_argument("--out", type=Path, default=None, help="JSON file to write")
    ap.add_argument("--shardq-python", default="", help="measure with this Python's shardq")
    a = ap.parse_args()
    if a.shardq_python:
        argv = [a.shardq_python, __file__, "--jobs", str(a.jobs), "--rounds", str(a.rounds)]
        if a.out:
            argv += ["--out", str(a.out)]
        sys.exit(subprocess.run(argv, check=False).returncode)
    report: dict[str, Any] = {
        "schema": "shardq-enqueue-calls/1",
        "command": " ".join(["python", "bench/enqueue_calls.py", *sys.argv[1:]]),
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": commit_of_shardq(),
        "machine": machine(),
        "params": {"jobs": a.jobs, "rounds": a.rounds, "batch": BATCH},
        "results": measure(a.jobs, a.rounds),
    }
    text = json.dumps(report, indent=1)
    if a.out:
        a.out.write_text(text + "\n")
    for name, r in report["results"].items():
        print(f"{name:32} {r['commands_per_job']:6.2f} commands/job  "
              f"{r['script_us_per_job']:6.2f} µs/job")  # fmt: skip


if __name__ == "__main__":
    main()
