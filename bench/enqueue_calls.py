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
from typing import Any, NoReturn

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from op_costs import machine  # noqa: E402
from redis.asyncio import Redis  # noqa: E402
from services import RedisServer  # noqa: E402
from shardq_bench import first_installed  # noqa: E402

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
        await first_installed(url)
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


def parse_args(ap: argparse.ArgumentParser) -> argparse.Namespace:
    """``ap``'s arguments plus ``--out`` and ``--shardq-python``, parsed; with
    ``--shardq-python``, the script runs again under that Python instead (:func:`run_with`)."""
    ap.add_argument("--out", type=Path, default=None, help="JSON file to write")
    ap.add_argument("--shardq-python", default="", help="measure with this Python's shardq")
    a = ap.parse_args()
    if a.shardq_python:
        run_with(a.shardq_python)
    return a


def run_with(shardq_python: str) -> NoReturn:
    """Run this script again, with the same arguments but ``--shardq-python``, under
    ``shardq_python`` (another checkout's venv, so its shardq is measured); exit as it does."""
    argv, rest = sys.argv[1:], []
    while argv:
        arg = argv.pop(0)
        if arg == "--shardq-python":
            argv.pop(0)
        elif not arg.startswith("--shardq-python="):
            rest.append(arg)
    sys.exit(subprocess.run([shardq_python, sys.argv[0], *rest], check=False).returncode)


def report_head(schema: str, script: str) -> dict[str, Any]:
    """What every report of a ``--shardq-python`` measure starts with: its schema, the
    command, when, the commit of the shardq measured, and the machine."""
    return {
        "schema": schema,
        "command": " ".join(["python", script, *sys.argv[1:]]),
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": commit_of_shardq(),
        "machine": machine(),
    }


def write_report(
    a: argparse.Namespace, schema: str, script: str, params: dict[str, Any], results: Any
) -> dict[str, Any]:
    """A measure's report (:func:`report_head`, its parameters and results), written as JSON
    to ``--out`` when given."""
    report = {**report_head(schema, script), "params": params, "results": results}
    if a.out:
        a.out.write_text(json.dumps(report, indent=1) + "\n")
    return report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=50_000, help="jobs per round and shape")
    ap.add_argument("--rounds", type=int, default=2, help="rounds per shape (median kept)")
    a = parse_args(ap)
    report = write_report(
        a,
        "shardq-enqueue-calls/1",
        "bench/enqueue_calls.py",
        {"jobs": a.jobs, "rounds": a.rounds, "batch": BATCH},
        measure(a.jobs, a.rounds),
    )
    for name, r in report["results"].items():
        print(f"{name:32} {r['commands_per_job']:6.2f} commands/job  "
              f"{r['script_us_per_job']:6.2f} µs/job")  # fmt: skip


if __name__ == "__main__":
    main()
