"""What each part of ``enqueue.lua`` costs a job: the script timed whole, and again with one
part taken out at a time.

    python bench/enqueue_parts.py [--jobs 10000] [--rounds 5] [--out FILE.json]
    python bench/enqueue_parts.py --instructions --jobs 2000 --rounds 1
    python bench/enqueue_parts.py --instructions --jobs 2000 --rounds 1 --coordinator-limits
    python bench/enqueue_parts.py --instructions --jobs 2000 --rounds 1 --rate-limit

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

``--instructions``: run the ``redis-server`` under valgrind's callgrind and count, instead of
the µs, the instructions it runs per job over the batches (``instructions_per_job``, and each
part's): reading the commands, the script, the replies. A count, not a time, but the same
from one run to the next on a machine whose timings swing ±20%, so a change of a few percent
shows (``--jobs 2000 --rounds 1`` is enough: callgrind runs Redis ~50x slower).

``--coordinator-limits``: each job carries the admission limit every job of a coordinator at
its defaults carries (``CoordinatorSettings.default_limits``: ``max_pending``), so the script
checks the tenant's pending jobs as it does for a ``SubmitJobs`` call; without it, no limit.

``--rate-limit``: each job carries a submit rate limit (``RATE_LIMIT``) high enough that every
job gets a token, so the script takes one from the tenant's bucket per job, as for a tenant
whose submits are rate limited.

``--shardq-python``: run the measure with another checkout's venv (its shardq), to compare
two commits; the JSON records the commit of the shardq measured.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import statistics
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from enqueue_calls import BATCH, fresh_shard, parse_args, write_report  # noqa: E402
from redis.asyncio import Redis  # noqa: E402
from services import Callgrind, RedisServer  # noqa: E402

from shardq.coordinator.app import CoordinatorSettings  # noqa: E402
from shardq.shard.client import ShardClient  # noqa: E402
from shardq.shard.models import NO_LIMITS, NewJob, TenantLimits  # noqa: E402
from shardq.shard.scripts import source  # noqa: E402

#: ``--rate-limit``'s limits: a bucket no batch of the measure empties.
RATE_LIMIT = TenantLimits(submit_rate_per_s=1e8, submit_burst=1_000_000_000)

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
        "redis.call('HSET', job_key, unpack(fields, 1, n))",
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


async def one_measure(
    server: RedisServer,
    jobs: int,
    out: list[str],
    counter: Callgrind | None,
    limits: TenantLimits = NO_LIMITS,
) -> tuple[float, float]:
    """The cost per job of the script with the parts ``out`` taken out, and the commands it
    ran per job. The cost: Redis' µs inside EVALSHA, or with ``counter`` the instructions
    the whole server ran over the batches."""
    redis = Redis.from_url(server.url)
    client = ShardClient(redis)
    client._scripts["enqueue"] = redis.register_script(variant_source(out))
    assert server.proc is not None
    try:
        await fresh_shard(redis, server.url)
        await client.enqueue([NewJob("warm", "noop", b"0", "warm")])  # loads the script
        await redis.config_resetstat()
        if counter:
            counter.zero(server.proc.pid)
        for _ in range(0, jobs, BATCH):
            await client.enqueue(
                [
                    NewJob("t0", "noop", b'{"n": 1}', uuid.uuid4().hex, limits=limits)
                    for _ in range(BATCH)
                ]
            )
        # Counted before the INFO below, which is not the batches' work.
        instructions = counter.read(server.proc.pid) if counter else 0
        stats = await redis.info("commandstats")
    finally:
        await redis.aclose()
    commands = sum(st["calls"] for name, st in stats.items() if name != "cmdstat_evalsha")
    cost = instructions if counter else float(stats["cmdstat_evalsha"]["usec"])
    return cost / jobs, commands / jobs


def measure(
    jobs: int, rounds: int, instructions: bool = False, limits: TenantLimits = NO_LIMITS
) -> dict[str, Any]:
    variants: dict[str, list[str]] = {"whole": [], **{p: [p] for p in PARTS}, ALL_OUT: [*PARTS]}
    got: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
    unit = "instructions_per_job" if instructions else "script_us_per_job"
    with tempfile.TemporaryDirectory(prefix="shardq-callgrind-") as out_dir:
        counter = Callgrind(out_dir) if instructions else None
        with counter.redis_server() if counter else RedisServer() as server:
            for _ in range(rounds):
                for name, out in variants.items():
                    got[name].append(asyncio.run(one_measure(server, jobs, out, counter, limits)))
    whole = statistics.median(cost for cost, _ in got["whole"])
    digits = 0 if instructions else 2
    results: dict[str, Any] = {}
    for name, values in got.items():
        median = statistics.median(cost for cost, _ in values)
        results[name] = {
            unit: round(median, digits),
            # What the part costs: the whole script's cost minus the cost without it.
            "part_" + unit: round(whole - median, digits),
            # The Redis commands the script ran per job (exact: a part taken out shows here).
            "commands_per_job": round(statistics.median(c for _, c in values), 3),
            "rounds": [round(cost, digits) for cost, _ in values],
        }
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=10_000, help="jobs per measure")
    ap.add_argument("--rounds", type=int, default=5, help="rounds of every variant (median kept)")
    ap.add_argument(
        "--instructions",
        action="store_true",
        help="count the server's instructions per job under callgrind instead of timing it",
    )
    ap.add_argument(
        "--coordinator-limits",
        action="store_true",
        help="each job with the admission limit of a coordinator at its defaults",
    )
    ap.add_argument(
        "--rate-limit",
        action="store_true",
        help="each job with a submit rate limit (every job gets a token)",
    )
    a = parse_args(ap)
    limits = CoordinatorSettings().default_limits if a.coordinator_limits else NO_LIMITS
    if a.rate_limit:
        limits = dataclasses.replace(
            limits,
            submit_rate_per_s=RATE_LIMIT.submit_rate_per_s,
            submit_burst=RATE_LIMIT.submit_burst,
        )
    report = write_report(
        a,
        "shardq-enqueue-parts/1",
        "bench/enqueue_parts.py",
        {
            "jobs": a.jobs,
            "rounds": a.rounds,
            "batch": BATCH,
            "instructions": a.instructions,
            "limits": dataclasses.asdict(limits),
        },
        measure(a.jobs, a.rounds, a.instructions, limits),
    )
    unit = "instructions_per_job" if a.instructions else "script_us_per_job"
    for name, r in report["results"].items():
        print(f"{name:18} {r[unit]:10.2f} {unit}  part {r['part_' + unit]:10.2f}")


if __name__ == "__main__":
    main()
