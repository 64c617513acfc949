"""What each part of ``enqueue.lua`` costs a job: the script timed whole, and again with one
part taken out at a time.

    python bench/enqueue_parts.py [--jobs 10000] [--rounds 5] [--out FILE.json]

Batches of 100 ready jobs of one tenant (a ``SubmitJobs`` call), each job new, on a shard at
the job format a first install gets, through ``ShardClient.enqueue``. A part is taken out by
editing the script's text (the edits below; the script stops if one no longer applies, so a
changed ``enqueue.lua`` shows here), and the edited script is registered under its own SHA.
What is left when all of them are out is the script's own Lua: reading the ARGV, building
keys, the HSET's field table and the reply. A part's cost (``part_us_per_job``) is the whole
script's time minus the time without it (for ``all_parts_out``: the five parts together).
The µs are Redis' own time inside ``EVALSHA`` (``INFO commandstats``, wall time), per job;
the variants alternate within each round and the median of ``--rounds`` is kept. The
commands each variant ran per job are counted too (exact, whatever the machine). A
``redis-server`` of its own, flushed before each measure.

``--shardq-python``: run the measure with another checkout's venv (its shardq), to compare
two commits; the JSON records the commit of the shardq measured.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from enqueue_calls import BATCH, parse_args, write_report  # noqa: E402
from redis.asyncio import Redis  # noqa: E402
from services import RedisServer  # noqa: E402
from shardq_bench import first_installed  # noqa: E402

from shardq.shard.client import ShardClient  # noqa: E402
from shardq.shard.models import NewJob  # noqa: E402
from shardq.shard.scripts import source  # noqa: E402

#: Each part: the text of ``enqueue.lua`` (with ``_lib.lua`` before it) that does it, and what
#: stands in for it when it is taken out.
PARTS: dict[str, tuple[str, str]] = {
    # One EXISTS of the request ID's dedupe key and of the job hash at its derived ID: for a
    # new request ID (these jobs) neither exists, and nothing more is read.
    "seen_check": (
        "if redis.call('EXISTS', dkey, job_key) > 0 then",
        "if false then",
    ),
    "derived_id_sha1": (
        "return string.sub(redis.sha1hex(t .. ':' .. rid), 1, 26)",
        "return string.sub(t .. ':' .. rid .. '00000000000000000000000000', 1, 26)",
    ),
    "job_hash_write": (
        "redis.call('HSET', job_key, unpack(fields))",
        "",
    ),
    # The batch's ready jobs are gathered per ready list and pushed at the end, one RPUSH a
    # list: taken out, the gathering (Lua) stays.
    "ready_push": (
        "\npush_gathered()\n",
        "\n",
    ),
}
#: Every part out at once: what is left is the script's own Lua.
ALL_OUT = "all_parts_out"


def variant_source(out: list[str]) -> str:
    """``enqueue.lua``'s text with the parts ``out`` taken out."""
    text = source("enqueue")
    for part in out:
        old, new = PARTS[part]
        if text.count(old) != 1:
            raise SystemExit(f"enqueue.lua changed: the part {part!r} is not found once in it")
        text = text.replace(old, new)
    return text


async def one_measure(url: str, jobs: int, out: list[str]) -> tuple[float, float]:
    """Redis' µs inside EVALSHA per job, and the commands the script ran per job, for the
    script with the parts ``out`` taken out."""
    redis = Redis.from_url(url)
    client = ShardClient(redis)
    client._scripts["enqueue"] = redis.register_script(variant_source(out))
    try:
        await redis.flushall()
        await first_installed(url)
        await client.enqueue([NewJob("warm", "noop", b"0", "warm")])  # loads the script
        await redis.config_resetstat()
        for _ in range(0, jobs, BATCH):
            await client.enqueue(
                [NewJob("t0", "noop", b'{"n": 1}', uuid.uuid4().hex) for _ in range(BATCH)]
            )
        stats = await redis.info("commandstats")
    finally:
        await redis.aclose()
    commands = sum(st["calls"] for name, st in stats.items() if name != "cmdstat_evalsha")
    return float(stats["cmdstat_evalsha"]["usec"]) / jobs, commands / jobs


def measure(jobs: int, rounds: int) -> dict[str, Any]:
    variants: dict[str, list[str]] = {"whole": [], **{p: [p] for p in PARTS}, ALL_OUT: [*PARTS]}
    got: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
    with RedisServer() as server:
        for _ in range(rounds):
            for name, out in variants.items():
                got[name].append(asyncio.run(one_measure(server.url, jobs, out)))
    whole = statistics.median(us for us, _ in got["whole"])
    results: dict[str, Any] = {}
    for name, values in got.items():
        median = statistics.median(us for us, _ in values)
        results[name] = {
            "script_us_per_job": round(median, 2),
            # What the part costs: the whole script's time minus the time without it.
            "part_us_per_job": round(whole - median, 2),
            # The Redis commands the script ran per job (exact: a part taken out shows here).
            "commands_per_job": round(statistics.median(c for _, c in values), 3),
            "rounds": [round(us, 2) for us, _ in values],
        }
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=10_000, help="jobs per measure")
    ap.add_argument("--rounds", type=int, default=5, help="rounds of every variant (median kept)")
    a = parse_args(ap)
    report = write_report(
        a,
        "shardq-enqueue-parts/1",
        "bench/enqueue_parts.py",
        {"jobs": a.jobs, "rounds": a.rounds, "batch": BATCH},
        measure(a.jobs, a.rounds),
    )
    for name, r in report["results"].items():
        print(f"{name:18} {r['script_us_per_job']:6.2f} µs/job  part {r['part_us_per_job']:6.2f}")


if __name__ == "__main__":
    main()
