"""Redis' instructions per job of each script on a job's way: enqueue, claim, heartbeat, ack.

    python bench/script_instructions.py [--jobs 2000] [--out FILE.json]
    python bench/script_instructions.py --shardq-python /tmp/base/.venv/bin/python ...
    python bench/script_instructions.py --single --jobs 300

One tenant's jobs, each new: enqueued in batches of 100 (a ``SubmitJobs`` call), claimed in
batches of 100 (a worker's claim), their leases extended and then acked in batches of 500 (a
worker's heartbeat and record batches), or with ``--single`` every step a job at a time (a
unary ``SubmitJob`` the coalescer found alone, a worker that claims each job as it comes),
through ``ShardClient`` on a ``redis-server`` run under valgrind's callgrind. Each step is
counted apart, in the instructions the whole server runs over its calls (reading the
commands, the scripts, the replies) per job: the same from one run to the next on a machine
whose timings swing ±20%, so two commits compare in one pair of runs (``--shardq-python``).
A count, not a time: see ``bench/enqueue_parts.py``. Needs ``valgrind``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from enqueue_calls import fresh_shard, parse_args, write_report  # noqa: E402
from redis.asyncio import Redis  # noqa: E402
from services import Callgrind, RedisServer  # noqa: E402

from shardq.shard.client import ShardClient  # noqa: E402
from shardq.shard.models import Lease, NewJob  # noqa: E402
from shardq.shard.records import ClaimedJob  # noqa: E402

#: A SubmitJobs call's, a worker's claim's, and its heartbeat and record batches' jobs.
BATCHES = (100, 100, 500)
LEASE_MS = 30_000


async def count(
    server: RedisServer, counter: Callgrind, jobs: int, batches: tuple[int, int, int] = BATCHES
) -> dict[str, float]:
    """Instructions per job of each step (``batches``: jobs per enqueue, claim, and heartbeat
    and ack call), on a flushed server and a fresh Lua VM."""
    submit_batch, claim_batch, record_batch = batches
    assert server.proc is not None
    pid = server.proc.pid
    redis = Redis.from_url(server.url)
    client = ShardClient(redis)
    try:
        await fresh_shard(redis, server.url)
        # Each script loaded (and its first call's one-off work done) before counting.
        await client.enqueue([NewJob("warm", "noop", b"0", "warm")])
        (warm,) = await client.claim("w0", 1, LEASE_MS)
        await client.heartbeat([Lease(warm.job_id, warm.fence)], LEASE_MS)
        await client.ack([Lease(warm.job_id, warm.fence)])
        out: dict[str, float] = {}

        counter.zero(pid)
        for _ in range(0, jobs, submit_batch):
            await client.enqueue(
                [NewJob("t0", "noop", b'{"n": 1}', uuid.uuid4().hex) for _ in range(submit_batch)]
            )
        out["enqueue"] = counter.read(pid) / jobs

        counter.zero(pid)
        claimed: list[ClaimedJob] = []
        while len(claimed) < jobs:
            got = await client.claim("w1", claim_batch, LEASE_MS)
            if not got:
                raise RuntimeError(f"claimed {len(claimed)} of {jobs} jobs")
            claimed += got
        out["claim"] = counter.read(pid) / jobs

        leases = [Lease(j.job_id, j.fence) for j in claimed]
        counter.zero(pid)
        for i in range(0, jobs, record_batch):
            await client.heartbeat(leases[i : i + record_batch], LEASE_MS)
        out["heartbeat"] = counter.read(pid) / jobs

        counter.zero(pid)
        for i in range(0, jobs, record_batch):
            codes = await client.ack(leases[i : i + record_batch])
            if any(c.name != "OK" for c in codes):
                raise RuntimeError(f"an ack was refused: {codes}")
        out["ack"] = counter.read(pid) / jobs
        return out
    finally:
        await redis.aclose()


def measure(jobs: int, batches: tuple[int, int, int] = BATCHES) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="shardq-callgrind-") as out_dir:
        counter = Callgrind(out_dir)
        with counter.redis_server() as server:
            got = asyncio.run(count(server, counter, jobs, batches))
    return {name: round(n) for name, n in got.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=2_000, help="jobs through every step")
    ap.add_argument("--single", action="store_true", help="every call of one job")
    a = parse_args(ap)
    batches = (1, 1, 1) if a.single else BATCHES
    report = write_report(
        a,
        "shardq-script-instructions/1",
        "bench/script_instructions.py",
        {
            "jobs": a.jobs,
            "submit_batch": batches[0],
            "claim_batch": batches[1],
            "record_batch": batches[2],
            "unit": "Redis instructions per job",
        },
        measure(a.jobs, batches),
    )
    for name, n in report["results"].items():
        print(f"{name:10} {n:10,} instructions/job")


if __name__ == "__main__":
    main()
