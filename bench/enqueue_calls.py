"""Redis work per enqueued job: commands and EVALSHA µs of ``enqueue.lua`` per job.

    python bench/enqueue_calls.py [--jobs 50000] [--rounds 2] [--out FILE.json]
    python bench/enqueue_calls.py --shardq-python /tmp/base/.venv/bin/python ...
    python bench/enqueue_calls.py --instructions --jobs 2000 --rounds 1
    python bench/enqueue_calls.py --instructions --jobs 300 --rounds 1 --batch 1

Batches of 100 (what ``SubmitJobs`` and the coordinator's coalescer send), ready or delayed an
hour, in two shapes: every batch from one tenant (a ``SubmitJobs`` call: one token, one
tenant), and every batch over 100 tenants (the coalescer's mix of unary calls). The commands
a script runs per job (``INFO commandstats``, EVALSHA itself left out) are exact, whatever the
machine; the µs are Redis' own time in the script, noisy on a shared machine (medians of
``--rounds``). A ``redis-server`` of its own, flushed before each round.

``--instructions``: the server runs under valgrind's callgrind and each shape is counted in
the instructions it runs per job over the batches instead (as ``bench/enqueue_parts.py``'s):
the same from one run to the next, so two commits compare in one pair of runs.

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
import tempfile
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NoReturn

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from op_costs import machine  # noqa: E402
from redis.asyncio import Redis  # noqa: E402
from services import Callgrind, RedisServer  # noqa: E402
from shardq_bench import first_installed  # noqa: E402

import shardq.shard.client  # noqa: E402
from shardq.shard.client import ShardClient  # noqa: E402
from shardq.shard.models import NewJob  # noqa: E402

BATCH = 100
SHAPES = {"one_tenant_per_batch": 1, "100_tenants_per_batch": 100}


async def fresh_shard(redis: Redis, url: str) -> None:
    """The shard at ``url`` emptied, on a fresh Lua VM (where its garbage collector's cycles
    fall would otherwise depend on the measures before), at a first install's job format."""
    await redis.flushall()
    await redis.script_flush()
    await first_installed(url)


async def one_round(
    server: RedisServer,
    jobs: int,
    tenants_per_batch: int,
    delayed: bool,
    counter: Callgrind | None = None,
    batch: int = BATCH,
) -> dict[str, float]:
    redis = Redis.from_url(server.url)
    client = ShardClient(redis)
    assert server.proc is not None
    try:
        await fresh_shard(redis, server.url)
        await client.enqueue([NewJob("warm", "noop", b"0", "warm")])  # loads the script
        await redis.config_resetstat()
        if counter:
            counter.zero(server.proc.pid)
        run_at = client.clock.now_ms() + 3_600_000 if delayed else None
        for lo in range(0, jobs, batch):
            await client.enqueue(
                [
                    NewJob(
                        f"t{(lo // batch + i) % tenants_per_batch}" if tenants_per_batch > 1
                        else f"t{(lo // batch) % 100}",
                        "noop", b"0", uuid.uuid4().hex, run_at_ms=run_at,
                    )
                    for i in range(batch)
                ]
            )  # fmt: skip
        # Counted before the INFO below, which is not the batches' work.
        instructions = counter.read(server.proc.pid) if counter else 0
        stats = await redis.info("commandstats")
    finally:
        await redis.aclose()
    calls = sum(s["calls"] for name, s in stats.items() if name != "cmdstat_evalsha")
    if counter:
        return {"commands": calls / jobs, "instructions": instructions / jobs}
    return {"commands": calls / jobs, "script_us": stats["cmdstat_evalsha"]["usec"] / jobs}


def measure(
    jobs: int, rounds: int, instructions: bool = False, batch: int = BATCH
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    cost, unit, digits = ("script_us", "script_us_per_job", 2)
    if instructions:
        cost, unit, digits = ("instructions", "instructions_per_job", 0)
    with tempfile.TemporaryDirectory(prefix="shardq-callgrind-") as out_dir:
        counter = Callgrind(out_dir) if instructions else None
        with counter.redis_server() if counter else RedisServer() as server:
            for shape, tenants in SHAPES.items():
                for state in ("ready", "delayed"):
                    got = [
                        asyncio.run(
                            one_round(server, jobs, tenants, state == "delayed", counter, batch)
                        )
                        for _ in range(rounds)
                    ]
                    out[f"{shape}/{state}"] = {
                        "commands_per_job": round(statistics.median(g["commands"] for g in got), 2),
                        unit: round(statistics.median(g[cost] for g in got), digits),
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
    ap.add_argument(
        "--batch",
        type=int,
        default=BATCH,
        help="jobs per script call (1: a unary SubmitJob the coalescer found alone; the "
        "100-tenant shape then takes its tenants a call each, in turn)",
    )
    ap.add_argument(
        "--instructions",
        action="store_true",
        help="count the server's instructions per job under callgrind instead of timing it",
    )
    a = parse_args(ap)
    report = write_report(
        a,
        "shardq-enqueue-calls/1",
        "bench/enqueue_calls.py",
        {"jobs": a.jobs, "rounds": a.rounds, "batch": a.batch, "instructions": a.instructions},
        measure(a.jobs, a.rounds, a.instructions, a.batch),
    )
    unit = "instructions_per_job" if a.instructions else "script_us_per_job"
    for name, r in report["results"].items():
        print(f"{name:32} {r['commands_per_job']:6.2f} commands/job  {r[unit]:10.2f} {unit}")


if __name__ == "__main__":
    main()
