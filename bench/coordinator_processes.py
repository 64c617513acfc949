"""Unary SubmitJob through ``shardq-coordinator --processes 1`` and ``--processes 2``.

One Redis shard, a throwaway database on the machine's Postgres, no workers. Producers are
separate processes (``--producers``), each with its own connection and ``--in-flight`` calls
in flight: one process's channels to one target share a connection, which SO_REUSEPORT would
pin to one coordinator process. The runs alternate (1, 2, 1, 2, ...) and the medians are
printed with the coordinator's CPU per call (its processes' user + system time / calls).
``--event-loops uvloop asyncio`` alternates the coordinator's event loop as well
(``SHARDQ_EVENT_LOOP``); ``--processes 1`` runs one process only.

    python bench/coordinator_processes.py --seconds 10 --repeat 3
    python bench/coordinator_processes.py --processes 1 --event-loops uvloop asyncio
    python bench/coordinator_processes.py --processes 1 --batch 100 --producers 1 --in-flight 4

``--batch N``: each call a ``SubmitJobs`` of N jobs (``coordinator_cpu_us_per_job``).

Each run also reports the shard's side per job: ``redis_cpu_us_per_job`` (the redis-server
process's CPU) and ``redis_script_us_per_job`` (its time inside ``EVALSHA``, from ``INFO
commandstats``). The latter is wall time: a Redis that waits for a core in the middle of a
script counts the wait, so on a busy machine it can pass the CPU figure; where it does not,
the difference is the CPU spent reading the commands and writing the replies and the AOF.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import secrets
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import psycopg
import redis

from shardq.client import AsyncClient, RetryPolicy, job_spec
from shardq.coordinator.processes import children_of
from shardq.coordinator.shardmap import ShardMapStore
from shardq.coordinator.tokens import TokenStore
from shardq.coordinator.tools.redis_server import RedisProcess, free_port, parent_death_prefix
from shardq.store import db
from shardq.store.migrate import upgrade

POSTGRES = os.environ.get("BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


def _producer(
    target: str, token: str, seconds: float, in_flight: int, batch: int, out: object
) -> None:
    async def go() -> int:
        done = 0
        own = [("grpc.use_local_subchannel_pool", 1)]
        async with AsyncClient(
            target, token, retry=RetryPolicy(attempts=3), channel_options=own
        ) as client:
            await client.submit("bench.noop", {})
            end = time.monotonic() + seconds

            async def lane() -> None:
                nonlocal done
                while time.monotonic() < end:
                    if batch:
                        specs = [job_spec("bench.noop", {"n": done + i}) for i in range(batch)]
                        items = await client.submit_many(specs)
                        if not all(it.ok for it in items):
                            raise RuntimeError(f"refused: {items[0]}")
                        done += batch
                    else:
                        await client.submit("bench.noop", {"n": done})
                        done += 1

            await asyncio.gather(*(lane() for _ in range(in_flight)))
        return done

    out.put(asyncio.run(go()))  # type: ignore[attr-defined]


def _cpu_s(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    return children_of(pid) or [pid]


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1):
            return True
    except OSError:
        return False


def _script_usec(port: int) -> float:
    """The shard's time inside EVALSHA since its last CONFIG RESETSTAT, in µs of wall time:
    the scripts' run, without reading and answering the commands (and with any wait for a
    core in the middle of one)."""
    with redis.Redis(port=port) as r:
        stats = r.info("commandstats").get("cmdstat_evalsha", {})
    return float(stats.get("usec", 0))


def run_once(
    url: str,
    token: str,
    processes: int,
    event_loop: str,
    args: argparse.Namespace,
    shard: RedisProcess,
) -> dict[str, float]:
    port, ops = free_port(), free_port()
    env = {
        **os.environ,
        **({"SHARDQ_EVENT_LOOP": event_loop} if event_loop else {}),
        "SHARDQ_LISTEN": f"127.0.0.1:{port}",
        "SHARDQ_METRICS_PORT": str(ops),
        "SHARDQ_DATABASE_URL": url,
        "SHARDQ_LOG_LEVEL": "WARNING",
        "SHARDQ_PROCESSES": str(processes),
        "SHARDQ_RUN_MOVES": "false",
    }
    coordinator = subprocess.Popen(
        [*parent_death_prefix(), sys.executable, "-m", "shardq.coordinator.server"], env=env
    )
    try:
        deadline = time.monotonic() + 60
        while not _healthy(ops):
            if time.monotonic() > deadline or coordinator.poll() is not None:
                raise RuntimeError("the coordinator did not start")
            time.sleep(0.1)
        time.sleep(1)  # every child up (the first's /healthz answers first)
        pids = _children(coordinator.pid) if processes > 1 else [coordinator.pid]
        queue: multiprocessing.Queue[int] = multiprocessing.Queue()
        producers = [
            multiprocessing.Process(
                target=_producer,
                args=(f"127.0.0.1:{port}", token, args.seconds, args.in_flight, args.batch, queue),
            )
            for _ in range(args.producers)
        ]
        assert shard.proc is not None
        with redis.Redis(port=shard.port) as r:
            r.config_resetstat()
        cpu0, t0 = _cpu_s(pids), time.monotonic()
        redis_cpu0 = _cpu_s([shard.proc.pid])
        for p in producers:
            p.start()
        jobs = sum(queue.get(timeout=args.seconds + 60) for _ in producers)
        for p in producers:
            p.join()
        elapsed, cpu = time.monotonic() - t0, _cpu_s(pids) - cpu0
        redis_cpu = _cpu_s([shard.proc.pid]) - redis_cpu0
        calls = jobs / args.batch if args.batch else jobs
        return {
            "jobs_per_s": jobs / elapsed,
            "coordinator_cpu_us_per_call": cpu / calls * 1e6,
            "coordinator_cpu_us_per_job": cpu / jobs * 1e6,
            "redis_cpu_us_per_job": redis_cpu / jobs * 1e6,
            "redis_script_us_per_job": _script_usec(shard.port) / jobs,
        }
    finally:
        coordinator.terminate()
        coordinator.wait(30)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=10.0, help="length of each run")
    p.add_argument("--producers", type=int, default=2, help="producer processes")
    p.add_argument("--in-flight", type=int, default=32, help="calls in flight per producer")
    p.add_argument("--repeat", type=int, default=3, help="rounds of (1, 2) processes")
    p.add_argument(
        "--batch", type=int, default=0, help="SubmitJobs of this many jobs (default: SubmitJob)"
    )
    p.add_argument("--processes", type=int, nargs="+", default=[1, 2], help="process counts")
    p.add_argument(
        "--event-loops", nargs="+", default=[""], help="SHARDQ_EVENT_LOOP values (default: unset)"
    )
    p.add_argument("--out", type=Path, default=None, help="JSON file to write")
    args = p.parse_args()
    shard = RedisProcess().start()
    name = f"shardq_bench_procs_{secrets.token_hex(3)}"
    with psycopg.connect(POSTGRES, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = db.sqlalchemy_url(POSTGRES.rsplit("/", 1)[0] + "/" + name)
    try:
        upgrade(url)

        async def prepare() -> str:
            engine = db.make_engine(url)
            try:
                await ShardMapStore(engine).sync_shards([f"127.0.0.1:{shard.port}"])
                return (await TokenStore(engine).create("tenant", "bench"))[1]
            finally:
                await engine.dispose()

        # Imported here: op_costs imports this module.
        from enqueue_calls import commit_of_shardq  # noqa: PLC0415
        from op_costs import machine  # noqa: PLC0415

        token = asyncio.run(prepare())
        runs: dict[str, list[dict[str, float]]] = {}
        for _ in range(args.repeat):
            for processes in args.processes:
                for loop in args.event_loops:
                    key = f"processes_{processes}" + (f"_{loop}" if loop else "")
                    runs.setdefault(key, []).append(
                        run_once(url, token, processes, loop, args, shard)
                    )
        report: dict[str, dict[str, Any]] = {
            key: {
                **{k: round(statistics.median(r[k] for r in rs), 1) for k in rs[0]},
                "runs": [{k: round(v, 1) for k, v in r.items()} for r in rs],
            }
            for key, rs in runs.items()
        }
        report["config"] = {
            "producers": args.producers,
            "in_flight_each": args.in_flight,
            "batch": args.batch,
            "seconds": args.seconds,
            "repeat": args.repeat,
            "cpus": os.cpu_count(),
            "command": " ".join(["python", "bench/coordinator_processes.py", *sys.argv[1:]]),
            "commit": commit_of_shardq(),
            "machine": machine(),
        }
        print(json.dumps(report, indent=2))
        if args.out:
            args.out.write_text(json.dumps(report, indent=1) + "\n")
    finally:
        with psycopg.connect(POSTGRES, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        shard.cleanup()


if __name__ == "__main__":
    main()
