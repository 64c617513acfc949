"""Per-operation costs of shardq on this machine: the inputs of the capacity model
(``bench/capacity.py``, ``docs/scaling.md``).

    python bench/op_costs.py --out bench/reference/2026-12-04-op-costs.json

Everything runs against real processes this script starts and stops itself:

- **Redis** (a ``redis-server`` on a free port, ``bench/services.py``): the real Lua scripts
  through shardq's own ``ShardClient``. Each operation is timed three ways: ``INFO
  commandstats`` (µs Redis spent inside EVALSHA, the script alone), the redis-server
  process's CPU time from ``/proc`` (the script plus reading the command and writing the
  reply: what a single-threaded Redis actually runs out of), and the client's wall time.
  ``--rounds`` rounds after a warm-up round, each on a flushed server; the median is kept.
- **Memory**: ``used_memory`` growth per ready, scheduled and *finished* job (the job hash
  kept for the retention and its dedupe key for the dedupe window), per dedupe key alone
  (after the job hash is gone), per idle tenant; ``MEMORY USAGE`` of samples splits it.
- **Load sampling**: the leading shard loop reads every tenant's counters every
  ``--load-interval-s`` (``shard/load.py``); its Redis and loop CPU per tenant per sample.
- **Postgres** (a throwaway cluster, ``initdb`` + ``pg_ctl`` with default settings as
  ``bench/run.py`` starts it, or a database on ``--postgres-url``): the real batch upsert
  (``ResultStore.write``) and already-done check (``ResultStore.already_done``) on an empty
  table, with ``--pg-rows`` rows, and with the same rows in a table partitioned by tenant hash;
  CPU of the Postgres backend from ``/proc``, WAL bytes, bytes per stored row; retention as
  the coordinator's purge deletes it (``RetentionPurger``) plus the VACUUM it leaves, against
  dropping a partition of the same rows.
- **A short real cluster** (``bench/shardq_bench.py``'s ``Cluster``: ``shardq migrate``,
  ``shardq-shard``, ``shardq-coordinator``, 2 ``shardq-worker`` on the bench's no-op handler):
  coordinator CPU per unary ``SubmitJob`` and per job of ``SubmitJobs`` of 100, worker,
  shard-loop, Redis and Postgres CPU per job, from each process's ``/proc`` CPU time.

Writes one JSON file (``schema: shardq-op-costs/1``): the commit, the files changed but not
committed, the machine (CPU model, cores, load average before and after), versions, and each
cost as ``{"value", "unit", "method", ...}``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from typing import Any, LiteralString

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import psycopg  # noqa: E402
from coordinator_processes import _cpu_s  # noqa: E402
from redis.asyncio import Redis  # noqa: E402
from services import PostgresServer, RedisServer  # noqa: E402
from shardq_bench import (  # noqa: E402
    NOOP,
    Cluster,
    ShiftedClock,
    _lease,
    _submit_batches,
    first_installed,
)

from shardq.coordinator.processes import children_of  # noqa: E402
from shardq.coordinator.retention import RetentionPurger  # noqa: E402
from shardq.shard.client import ShardClient  # noqa: E402
from shardq.shard.load import LoadSampler  # noqa: E402
from shardq.shard.models import ClaimedJob, NewJob  # noqa: E402
from shardq.store import db  # noqa: E402
from shardq.store.migrate import upgrade  # noqa: E402
from shardq.store.results import ResultRow, ResultStore  # noqa: E402

SCHEMA = "shardq-op-costs/1"
DEFAULT_OUT = HERE / "reference" / "2026-12-04-op-costs.json"
#: Jobs per script call, as the hot paths send them: the coordinator's coalescer and
#: SubmitJobs (enqueue), a worker's claim, a worker's ack and row batches, the promoter.
ENQUEUE_BATCH, CLAIM_BATCH, ACK_BATCH = 100, 100, 500
PAYLOAD = b'{"n": 1}'
WORKER = "bench-costs"
LEASE_MS = 600_000

Costs = dict[str, dict[str, Any]]


def cost(value: float, unit: str, method: str, **extra: Any) -> dict[str, Any]:
    return {"value": round(value, 3), "unit": unit, "method": method, **extra}


# --- machine -------------------------------------------------------------------------------


def _git(*args: str) -> str:
    done = subprocess.run(
        ["git", *args], cwd=HERE.parent, capture_output=True, text=True, check=False
    )
    return done.stdout.strip()


def machine() -> dict[str, Any]:
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    mem_kb = next(
        int(line.split()[1])
        for line in Path("/proc/meminfo").read_text().splitlines()
        if line.startswith("MemTotal")
    )
    return {
        "cpu_model": model,
        "cores": os.cpu_count(),
        "memory_gb": round(mem_kb / 1024**2, 1),
        "platform": platform.platform(),
        "loadavg_before": [round(x, 2) for x in os.getloadavg()],
        "note": "shared machine (2 cores, other engineers' test runs): CPU times per process "
        "are kept, since wall time there counts other work too",
    }


def _tree_cpu_s(pid: int) -> float:
    """CPU seconds of ``pid`` and its direct children (a coordinator's --processes)."""
    total = 0.0
    for p in (pid, *children_of(pid)):
        with contextlib.suppress(OSError, IndexError):
            total += _cpu_s([p])
    return total


# --- Redis operations ------------------------------------------------------------------------


@dataclass
class Snap:
    """What a phase is measured from: Redis' EVALSHA time, redis-server's CPU, wall clock."""

    script_us: int
    server_cpu_s: float
    wall_s: float
    own_cpu_s: float


async def snap(redis: Redis, pid: int) -> Snap:
    stats = await redis.info("commandstats")
    script_us = sum(
        int(v.get("usec", 0)) for k, v in stats.items() if k in ("cmdstat_evalsha", "cmdstat_eval")
    )
    return Snap(script_us, _cpu_s([pid]), time.perf_counter(), time.process_time())


def per_job(a: Snap, b: Snap, jobs: int) -> dict[str, float]:
    return {
        "script_us": (b.script_us - a.script_us) / jobs,
        "server_cpu_us": (b.server_cpu_s - a.server_cpu_s) * 1e6 / jobs,
        "client_wall_us": (b.wall_s - a.wall_s) * 1e6 / jobs,
        "client_cpu_us": (b.own_cpu_s - a.own_cpu_s) * 1e6 / jobs,
    }


async def timed(
    redis: Redis, pid: int, jobs: int, work: Callable[[], Awaitable[object]]
) -> dict[str, float]:
    a = await snap(redis, pid)
    await work()
    return per_job(a, await snap(redis, pid), jobs)


async def claim_all(shard: ShardClient, n: int) -> list[ClaimedJob]:
    claimed: list[ClaimedJob] = []
    while len(claimed) < n:
        got = await shard.claim(WORKER, CLAIM_BATCH, LEASE_MS)
        if not got:
            raise RuntimeError(f"claimed {len(claimed)}/{n} jobs")
        claimed += got
    return claimed


async def ack_all(shard: ShardClient, claimed: Sequence[ClaimedJob]) -> None:
    for lo in range(0, len(claimed), ACK_BATCH):
        await shard.ack([_lease(j) for j in claimed[lo : lo + ACK_BATCH]])


def jobs_of(tag: str, n: int, tenants: int, run_at_ms: int | None = None) -> list[NewJob]:
    return [
        NewJob(f"t{i % tenants}", NOOP, PAYLOAD, f"{tag}-{i}", run_at_ms=run_at_ms)
        for i in range(n)
    ]


async def one_round(
    server: RedisServer, n: int, tenants: int, tag: str
) -> dict[str, dict[str, float]]:
    """Every operation once on a flushed shard: n jobs each (n/5 single enqueues)."""
    assert server.proc is not None
    pid = server.proc.pid
    redis = Redis.from_url(server.url)
    shard = ShardClient(redis)
    ahead = ShardClient(redis, clock=ShiftedClock(120_000))
    out: dict[str, dict[str, float]] = {}
    try:
        await redis.flushall()
        ready = jobs_of(f"{tag}r", n, tenants)

        async def enqueue_batches(jobs: list[NewJob]) -> None:
            for lo in range(0, len(jobs), ENQUEUE_BATCH):
                await shard.enqueue(jobs[lo : lo + ENQUEUE_BATCH])

        out["enqueue"] = await timed(redis, pid, n, lambda: enqueue_batches(ready))
        claimed: list[ClaimedJob] = []

        async def claim() -> None:
            claimed.extend(await claim_all(shard, n))

        out["claim"] = await timed(redis, pid, n, claim)
        out["ack"] = await timed(redis, pid, n, lambda: ack_all(shard, claimed))

        singles = jobs_of(f"{tag}s", n // 5, tenants)

        async def enqueue_singles() -> None:
            for job in singles:
                await shard.enqueue([job])

        out["enqueue_single"] = await timed(redis, pid, len(singles), enqueue_singles)
        await ack_all(shard, await claim_all(shard, len(singles)))

        delayed = jobs_of(f"{tag}d", n, tenants, run_at_ms=shard.clock.now_ms() + 60_000)
        out["enqueue_delayed"] = await timed(redis, pid, n, lambda: enqueue_batches(delayed))
        out["promote"] = await timed(redis, pid, n, ahead.promote)
        await ack_all(shard, await claim_all(shard, n))
    finally:
        await redis.aclose()
    return out


async def redis_ops(server: RedisServer, args: argparse.Namespace) -> Costs:
    await one_round(server, min(args.jobs, 2_000), args.tenants, "warm")  # scripts, connections
    rounds = [await one_round(server, args.jobs, args.tenants, f"r{k}") for k in range(args.rounds)]
    what = {
        "enqueue": f"enqueue.lua, {ENQUEUE_BATCH} ready jobs per call (the coordinator's "
        "coalescer and SubmitJobs send batches)",
        "enqueue_single": "enqueue.lua, 1 job per call (a lone unary SubmitJob)",
        "enqueue_delayed": f"enqueue.lua, {ENQUEUE_BATCH} jobs per call, due in 60 s",
        "promote": "promote.lua, batches of 500 (ShardClient.promote, as the shard loop)",
        "claim": f"claim.lua, {CLAIM_BATCH} jobs per call (a worker's claim)",
        "ack": f"ack.lua, {ACK_BATCH} leases per call (a worker's ack batch)",
    }
    costs: Costs = {}
    for op, text in what.items():
        med = {m: statistics.median(r[op][m] for r in rounds) for m in rounds[0][op]}
        costs[f"redis_{op}_us"] = cost(
            med["server_cpu_us"],
            "µs of redis-server CPU per job",
            f"{text}; ShardClient on a flushed redis-server, {args.jobs} jobs "
            f"({args.jobs // 5} for single enqueues) over {args.tenants} tenants; median of "
            f"{args.rounds} rounds after a warm-up round. value: redis-server's CPU time from "
            "/proc (script + protocol); script_us: INFO commandstats EVALSHA usec",
            script_us=round(med["script_us"], 2),
            client_wall_us=round(med["client_wall_us"], 2),
            client_cpu_us=round(med["client_cpu_us"], 2),
            rounds=[{m: round(v, 2) for m, v in r[op].items()} for r in rounds],
        )
    return costs


# --- memory and tenants ----------------------------------------------------------------------


async def used(redis: Redis) -> int:
    return int((await redis.info("memory"))["used_memory"])


async def memory(server: RedisServer, args: argparse.Namespace) -> Costs:
    n, tenants = args.memory_jobs, 10
    redis = Redis.from_url(server.url)
    shard = ShardClient(redis)
    k = shard.keys
    try:
        await redis.flushall()
        await first_installed(server.url)
        m0 = await used(redis)
        later = jobs_of("m-s", n, tenants, run_at_ms=shard.clock.now_ms() + 3_600_000)
        for lo in range(0, n, 500):
            await shard.enqueue(later[lo : lo + 500])
        scheduled = (await used(redis) - m0) / n
        await redis.flushall()
        await first_installed(server.url)
        m0 = await used(redis)
        jobs = jobs_of("m", n, tenants)
        for lo in range(0, n, 500):
            await shard.enqueue(jobs[lo : lo + 500])
        ready = (await used(redis) - m0) / n
        claimed = await claim_all(shard, n)
        await ack_all(shard, claimed)
        finished = (await used(redis) - m0) / n
        sample = claimed[:200]
        hashes = [await redis.memory_usage(k.job(j.job_id)) or 0 for j in sample]
        dkeys = [k.dedupe(j.tenant, j.request_id) for j in sample]
        dedupes = [await redis.memory_usage(d) or 0 for d in dkeys]
        retention_ms = await redis.pttl(k.job(sample[0].job_id))
        dedupe_ms = await redis.pttl(dkeys[0])
        for lo in range(0, n, 1_000):  # as if the retention ran out before the dedupe window
            await redis.delete(*(k.job(j.job_id) for j in claimed[lo : lo + 1_000]))
        dedupe_only = (await used(redis) - m0) / n
        assert server.proc is not None
        idle = await idle_tenants(redis, shard, server.proc.pid, args.idle_tenants)
    finally:
        await redis.aclose()
    how = (
        f"used_memory growth over {n} jobs of {tenants} tenants (32-byte job IDs, request IDs "
        f"of ~10 chars, payload {len(PAYLOAD)} bytes), through ShardClient"
    )
    window = {"dedupe_window_s": round(dedupe_ms / 1000), "retention_s": round(retention_ms / 1000)}
    return {
        "mem_scheduled_job_bytes": cost(scheduled, "bytes per job", how + ", due in 1 h"),
        "mem_ready_job_bytes": cost(ready, "bytes per job", how + ", ready"),
        "mem_finished_job_bytes": cost(
            finished,
            "bytes per finished job",
            how + ", claimed and acked: the job hash kept for the retention (PEXPIRE in "
            "ack.lua) and the dedupe key kept for the dedupe window (set by enqueue.lua; at "
            "job format 3 by ack.lua, for what is left of the window)",
            job_hash_bytes=round(statistics.fmean(hashes), 1),
            dedupe_key_bytes=round(statistics.fmean(dedupes), 1),
            by_structure="MEMORY USAGE, mean of 200 finished jobs",
            **window,
        ),
        "mem_dedupe_key_bytes": cost(
            dedupe_only,
            "bytes per finished job",
            how + ", after the finished job hashes are deleted (a retention shorter than the "
            "dedupe window): the dedupe key alone",
            **window,
        ),
        **idle,
    }


async def idle_tenants(redis: Redis, shard: ShardClient, pid: int, count: int) -> Costs:
    """Bytes a tenant keeps once its jobs are gone, and the load sampler's cost per tenant."""
    await redis.flushall()
    m0 = await used(redis)
    jobs = [NewJob(f"idle-{i}", NOOP, PAYLOAD, f"r{i}") for i in range(count)]
    for lo in range(0, count, 500):
        await shard.enqueue(jobs[lo : lo + 500])
    claimed = await claim_all(shard, count)
    await ack_all(shard, claimed)
    k = shard.keys
    for lo in range(0, count, 1_000):
        chunk = claimed[lo : lo + 1_000]
        await redis.delete(*(k.job(j.job_id) for j in chunk))
        await redis.delete(*(k.dedupe(j.tenant, j.request_id) for j in chunk))
    idle = (await used(redis) - m0) / count
    sampler = LoadSampler(shard)
    await sampler.sample()  # the first sample writes every tenant's entry of the load hash
    sampled = (await used(redis) - m0) / count
    # The same steady state the loop is in: every tenant sampled again, every entry rewritten.
    stats0, cpu0, own0 = await redis.info("commandstats"), _cpu_s([pid]), time.process_time()
    await sampler.sample()
    stats1, cpu1, own1 = await redis.info("commandstats"), _cpu_s([pid]), time.process_time()
    cmd_us = sum(int(v.get("usec", 0)) for v in stats1.values()) - sum(
        int(v.get("usec", 0)) for v in stats0.values()
    )
    how = f"{count} tenants, one job each, submitted, claimed and acked; their job hashes and "
    return {
        "mem_idle_tenant_bytes": cost(
            sampled,
            "bytes per tenant",
            how + "dedupe keys deleted: what stays (the tenant's counts hash, its entries in "
            "the shard's tenant set and the load hash)",
            before_load_sample_bytes=round(idle, 1),
        ),
        "tenant_sample_redis_us": cost(
            (cpu1 - cpu0) * 1e6 / count,
            "µs of redis-server CPU per tenant per load sample",
            how + "LoadSampler.sample() of shard/load.py, the second pass (every entry "
            "rewritten); value from /proc, commands_us from INFO commandstats",
            commands_us=round(cmd_us / count, 3),
        ),
        "tenant_sample_loop_us": cost(
            (own1 - own0) * 1e6 / count,
            "µs of shard-loop CPU per tenant per load sample",
            "the same pass: this process's CPU time (the sampler runs in the leading shard loop)",
        ),
    }


# --- Postgres --------------------------------------------------------------------------------


def rows_of(n: int, tenants: int, now_ms: int) -> list[ResultRow]:
    return [
        ResultRow(
            tenant_id=f"t{i % tenants}",
            request_id=uuid.uuid4().hex,
            job_id=uuid.uuid4().hex,
            shard_id=0,
            handler=NOOP,
            status="succeeded",
            attempts=1,
            fence=i + 1,
            worker_id="bench-w",
            queued_ms=now_ms - 5,
            started_ms=now_ms - 2,
            finished_ms=now_ms,
        )
        for i in range(n)
    ]


class Pg:
    """The throwaway database: an admin connection to it, and CPU of its backends."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.conn = psycopg.connect(url, autocommit=True)

    def close(self) -> None:
        self.conn.close()

    def one(self, sql: LiteralString, params: Sequence[Any] = ()) -> Any:
        row = self.conn.execute(sql, params).fetchone()
        return row[0] if row else None

    def backends(self) -> dict[int, float]:
        """CPU seconds of every other backend connected to this database."""
        pids = self.conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid()"
        ).fetchall()
        out = {}
        for (pid,) in pids:
            with contextlib.suppress(OSError, IndexError):
                out[int(pid)] = _cpu_s([int(pid)])
        return out

    def own_cpu(self) -> float:
        return _cpu_s([int(self.one("SELECT pg_backend_pid()"))])

    def lsn(self) -> str:
        return str(self.one("SELECT pg_current_wal_lsn()"))

    def wal_since(self, lsn: str) -> int:
        return int(self.one("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s)", (lsn,)))


def cpu_delta(before: dict[int, float], after: dict[int, float]) -> float:
    """Backends that connected meanwhile count from 0 (their set-up is a few ms)."""
    return sum(v - before.get(pid, 0.0) for pid, v in after.items())


async def upserts(pg: Pg, dsn: str, n: int, tenants: int) -> dict[str, float]:
    """``ResultStore.write`` of n new rows in batches of ACK_BATCH, then the already-done
    check of them, CLAIM_BATCH keys per call; per row: wall, backend CPU, WAL."""
    store = ResultStore(dsn)
    try:
        await store.write(rows_of(10, tenants, time.time_ns() // 1_000_000))  # connect
        await store.already_done([("t0", "x")])
        rows = rows_of(n, tenants, time.time_ns() // 1_000_000)
        cpu0, lsn, t0 = pg.backends(), pg.lsn(), time.perf_counter()
        for lo in range(0, n, ACK_BATCH):
            await store.write(rows[lo : lo + ACK_BATCH])
        wall, wal, cpu1 = time.perf_counter() - t0, pg.wal_since(lsn), pg.backends()
        keys = [(r.tenant_id, r.request_id) for r in rows[: min(n, 5_000)]]
        t0 = time.perf_counter()
        for lo in range(0, len(keys), CLAIM_BATCH):
            found = await store.already_done(keys[lo : lo + CLAIM_BATCH])
            if len(found) != len(keys[lo : lo + CLAIM_BATCH]):
                raise RuntimeError("the already-done check missed rows just written")
        check_wall, cpu2 = time.perf_counter() - t0, pg.backends()
    finally:
        await store.close()
    return {
        "upsert_cpu_us": cpu_delta(cpu0, cpu1) * 1e6 / n,
        "upsert_wall_us": wall * 1e6 / n,
        "wal_bytes": wal / n,
        "check_cpu_us": cpu_delta(cpu1, cpu2) * 1e6 / len(keys),
        "check_wall_us": check_wall * 1e6 / len(keys),
    }


FILL = """
INSERT INTO {table} (tenant_id, request_id, job_id, shard_id, handler, status, result, attempts,
                     fence, worker_id, queued_at, started_at, finished_at)
SELECT 't' || (g %% %(tenants)s), md5('{tag}' || g), md5('{tag}j' || g), 0, 'bench.noop',
       'succeeded', 'null'::jsonb, 1, g, 'bench-w', f - interval '5 ms', f - interval '2 ms', f
FROM generate_series(1, %(n)s) AS g,
     LATERAL (SELECT now() - %(age)s::interval - g * interval '1 ms' AS f) AS t
"""


def fill(pg: Pg, table: str, n: int, tenants: int, age: str, tag: str) -> None:
    pg.conn.execute(
        FILL.format(table=table, tag=tag).encode(),
        {"n": n, "tenants": tenants, "age": age},
    )
    pg.conn.execute(f"VACUUM ANALYZE {table}".encode())


HASH_TABLE = """
ALTER TABLE shardq_results RENAME TO shardq_results_plain;
CREATE TABLE shardq_results (LIKE shardq_results_plain INCLUDING DEFAULTS INCLUDING CONSTRAINTS)
    PARTITION BY HASH (tenant_id);
ALTER TABLE shardq_results ADD PRIMARY KEY (tenant_id, request_id);
CREATE INDEX ON shardq_results (job_id);
CREATE INDEX ON shardq_results (tenant_id, finished_at);
"""


async def postgres(url: str, args: argparse.Namespace) -> Costs:
    """Result rows on a fresh database of the server at ``url`` (dropped at the end)."""
    name = f"shardq_costs_{secrets.token_hex(4)}"
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"'.encode())
    dburl = url.rsplit("/", 1)[0] + "/" + name
    try:
        upgrade(db.sqlalchemy_url(dburl))
        pg = Pg(dburl)
        try:
            return await _postgres(pg, dburl, args)
        finally:
            pg.close()
    finally:
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'.encode())


async def _postgres(pg: Pg, dburl: str, args: argparse.Namespace) -> Costs:
    n, big, tenants = args.pg_upserts, args.pg_rows, args.pg_tenants
    empty = await upserts(pg, dburl, n, tenants)
    fill(pg, "shardq_results", big, tenants, "0 s", "a")
    size = int(pg.one("SELECT count(*) FROM shardq_results"))
    total_bytes = int(pg.one("SELECT pg_total_relation_size('shardq_results')"))
    loaded = await upserts(pg, dburl, n, tenants)
    retention = await retention_costs(pg, dburl, args)
    for statement in HASH_TABLE.strip().split(";\n"):
        pg.conn.execute(statement.encode())
    for i in range(args.pg_partitions):
        pg.conn.execute(
            f"CREATE TABLE shardq_results_h{i} PARTITION OF shardq_results "
            f"FOR VALUES WITH (MODULUS {args.pg_partitions}, REMAINDER {i})".encode()
        )
    pg.conn.execute(b"INSERT INTO shardq_results SELECT * FROM shardq_results_plain")
    pg.conn.execute(b"VACUUM ANALYZE shardq_results")
    hashed = await upserts(pg, dburl, n, tenants)
    retention.update(await purge_partitioned(pg, dburl, args))
    sizes = f"{size:,} rows ({total_bytes / size:.0f} bytes per row with its 3 indexes)"
    common = (
        f"ResultStore.write (the worker's batch upsert, one statement over arrays) of {n} new "
        f"rows of {tenants} tenants, {ACK_BATCH} per statement, autocommit; Postgres default "
        "settings (fsync, synchronous_commit on). value: the backend's CPU time from /proc"
    )
    check = (
        f"ResultStore.already_done of those rows, {CLAIM_BATCH} keys per call (a claimed "
        "batch's check); backend CPU per key"
    )

    def both(figures: dict[str, float], where: str) -> Costs:
        return {
            "upsert": cost(
                figures["upsert_cpu_us"],
                "µs of Postgres backend CPU per row",
                f"{common}; {where}",
                wall_us=round(figures["upsert_wall_us"], 2),
                wal_bytes=round(figures["wal_bytes"], 1),
            ),
            "check": cost(
                figures["check_cpu_us"],
                "µs of Postgres backend CPU per key",
                f"{check}; {where}",
                wall_us=round(figures["check_wall_us"], 2),
            ),
        }

    e, lo, h = (
        both(empty, "empty table"),
        both(loaded, f"table of {sizes}"),
        both(hashed, f"the same {sizes} in a table partitioned by hash(tenant_id) into "
             f"{args.pg_partitions}"),
    )  # fmt: skip
    return {
        "pg_upsert_us": e["upsert"],
        "pg_upsert_loaded_us": lo["upsert"],
        "pg_upsert_hash_us": h["upsert"],
        "pg_check_us": e["check"],
        "pg_check_loaded_us": lo["check"],
        "pg_check_hash_us": h["check"],
        "pg_wal_bytes_per_row": cost(
            loaded["wal_bytes"],
            "bytes of WAL per row",
            f"pg_current_wal_lsn() over the upserts into the table of {sizes}",
        ),
        "pg_bytes_per_row": cost(
            total_bytes / size,
            "bytes per stored row",
            f"pg_total_relation_size / rows after generate_series filled {size:,} rows of "
            f"{tenants} tenants (32-char request and job IDs, a null result), VACUUM ANALYZE",
        ),
        **retention,
    }


async def retention_costs(pg: Pg, dburl: str, args: argparse.Namespace) -> Costs:
    """The purge's DELETE (and the VACUUM it leaves) of K old rows, against a DROP of a
    partition holding K rows."""
    k = args.pg_expired
    fill(pg, "shardq_results", k, 100, "3 days", "old")
    engine = db.make_engine(dburl)
    try:
        purger = RetentionPurger(engine, default_retention_s=86_400, batch_size=1_000)
        cpu0, lsn, t0 = pg.backends(), pg.lsn(), time.perf_counter()
        report = await purger.purge_once()
        wall, wal, cpu1 = time.perf_counter() - t0, pg.wal_since(lsn), pg.backends()
    finally:
        await engine.dispose()
    if report.rows != k:
        raise RuntimeError(f"the purge deleted {report.rows} rows, expected {k}")
    own0, t0 = pg.own_cpu(), time.perf_counter()
    pg.conn.execute(b"VACUUM shardq_results")
    vacuum_wall, vacuum_cpu = time.perf_counter() - t0, pg.own_cpu() - own0
    pg.conn.execute(
        b"CREATE TABLE bytime (LIKE shardq_results INCLUDING DEFAULTS) "
        b"PARTITION BY RANGE (finished_at)"
    )
    pg.conn.execute(
        b"CREATE TABLE bytime_old PARTITION OF bytime FOR VALUES FROM (MINVALUE) "
        b"TO (now() - interval '1 day')"
    )
    pg.conn.execute(
        b"CREATE TABLE bytime_new PARTITION OF bytime FOR VALUES FROM (now() - interval '1 day') "
        b"TO (MAXVALUE)"
    )
    pg.conn.execute(b"CREATE INDEX ON bytime (tenant_id, request_id)")
    pg.conn.execute(b"CREATE INDEX ON bytime (job_id)")
    pg.conn.execute(b"CREATE INDEX ON bytime (tenant_id, finished_at)")
    fill(pg, "bytime", k, 100, "3 days", "old")
    fill(pg, "bytime", k, 100, "0 s", "new")
    pg.conn.execute(b"DROP TABLE bytime_new")  # only the old partition's drop is measured
    own0, lsn, t0 = pg.own_cpu(), pg.lsn(), time.perf_counter()
    pg.conn.execute(b"DROP TABLE bytime_old")
    drop_wall, drop_cpu, drop_wal = time.perf_counter() - t0, pg.own_cpu() - own0, pg.wal_since(lsn)
    pg.conn.execute(b"DROP TABLE bytime")
    return {
        "pg_purge_us": cost(
            cpu_delta(cpu0, cpu1) * 1e6 / k,
            "µs of Postgres backend CPU per expired row",
            f"RetentionPurger.purge_once (the coordinator's purge: DELETE ... LIMIT 1000 per "
            f"transaction, per tenant) of {k:,} rows of 100 tenants finished 3 days ago, "
            "retention 1 day, in the unpartitioned table of the loaded measure (as today)",
            wall_us=round(wall * 1e6 / k, 2),
            wal_bytes=round(wal / k, 1),
        ),
        "pg_vacuum_us": cost(
            vacuum_cpu * 1e6 / k,
            "µs of Postgres backend CPU per expired row",
            "VACUUM of that table right after the purge (the dead rows' space and index "
            "entries; autovacuum does it otherwise)",
            wall_us=round(vacuum_wall * 1e6 / k, 2),
        ),
        "pg_drop_partition_ms": cost(
            drop_wall * 1e3,
            "ms per partition dropped",
            f"DROP TABLE of a range partition (by finished_at) holding the same {k:,} rows "
            "and its 3 indexes",
            cpu_ms=round(drop_cpu * 1e3, 2),
            wal_bytes=drop_wal,
            rows=k,
        ),
    }


async def purge_partitioned(pg: Pg, dburl: str, args: argparse.Namespace) -> Costs:
    """The same purge on the table partitioned by tenant hash: does it delete only the
    expired rows? Its DELETE matches rows by ctid alone, and a ctid names a row only
    within one partition."""
    k = max(1, args.pg_expired // 10)
    fill(pg, "shardq_results", k, 100, "3 days", "old2")
    before = int(pg.one("SELECT count(*) FROM shardq_results"))
    engine = db.make_engine(dburl)
    try:
        report = await RetentionPurger(engine, default_retention_s=86_400).purge_once()
    finally:
        await engine.dispose()
    gone = before - int(pg.one("SELECT count(*) FROM shardq_results"))
    return {
        "pg_purge_partitioned_deleted_per_expired": cost(
            gone / k,
            "rows deleted per expired row (1 = correct)",
            f"RetentionPurger.purge_once on the table partitioned by hash(tenant_id) into "
            f"{args.pg_partitions}, holding {k:,} rows past retention among {before:,}: rows "
            "gone / rows expired. Above 1: the purge deleted rows not yet expired (rows of "
            "other partitions at the same ctid)",
            expired=k,
            deleted=gone,
            purger_reported=report.rows,
        )
    }


# --- a short real cluster ---------------------------------------------------------------------


def cluster_costs(redis: RedisServer, pg_url: str, args: argparse.Namespace) -> Costs:
    redis.flush()
    assert redis.proc is not None
    with (
        tempfile.TemporaryDirectory(prefix="shardq-costs-") as workdir,
        Cluster({"workdir": workdir, "postgres_url": pg_url}, [redis.url], ["bench"]) as cluster,
    ):
        cluster.start_workers(wait=True)
        got = asyncio.run(_drive(cluster, redis.proc.pid, args))
    return got


async def _drive(cluster: Cluster, redis_pid: int, args: argparse.Namespace) -> Costs:
    pids = {p.name: p.popen.pid for p in cluster.procs}
    pg = Pg(cluster.database_url)
    shard = ShardClient(Redis.from_url(cluster.redis_urls[0]))
    marks: dict[str, tuple[dict[str, float], dict[int, float]]] = {}

    def mark(name: str) -> None:
        procs = {name: _tree_cpu_s(pid) for name, pid in pids.items()}
        procs["redis"] = _cpu_s([redis_pid])
        marks[name] = (procs, pg.backends())

    def spent(proc: str, a: str, b: str) -> float:
        """CPU seconds of ``proc`` (a name prefix; "postgres": the backends) from a to b."""
        if proc == "postgres":
            return cpu_delta(marks[a][1], marks[b][1])
        return sum(v - marks[a][0][k] for k, v in marks[b][0].items() if k.startswith(proc))

    warm, unary, batched = 200, args.unary_calls, args.batch_jobs
    try:
        async with cluster.client("bench") as client:
            await _submit_batches(client, range(warm), ENQUEUE_BATCH)
            await asyncio.to_thread(cluster.wait_rows, warm, 120)
            mark("start")
            next_n = iter(range(warm, warm + unary))

            async def lane() -> None:
                for n in next_n:
                    await client.submit(NOOP, n)

            await asyncio.gather(*(lane() for _ in range(args.in_flight)))
            mark("unary sent")
            await asyncio.to_thread(cluster.wait_rows, warm + unary, 120)
            mark("unary done")
            # Paused while SubmitJobs fill the queue, then drained: the workers' cost with
            # full claim and row batches, as under sustained load, apart from the trickle above.
            await shard.pause("bench")
            await _submit_batches(client, range(warm + unary, warm + unary + batched), 100)
            mark("batch sent")
            await shard.resume("bench")
            await asyncio.to_thread(cluster.wait_rows, warm + unary + batched, 300)
            mark("drained")
    finally:
        pg.close()
        await shard.redis.aclose()
    how = (
        "a short real cluster (bench/shardq_bench.py's Cluster: 1 shard, 1 shardq-shard, "
        "1 shardq-coordinator, 2 shardq-worker --concurrency 200 on the bench's no-op handler, "
        "whose own work is one 30-byte write); CPU time of each process from /proc"
    )
    trickle = f"; {unary:,} unary SubmitJob calls, {args.in_flight} in flight, drained as they came"
    drain = (
        f"; {batched:,} jobs sent in SubmitJobs of 100 with the tenant paused, then resumed "
        "and drained to their result rows (full claim and row batches)"
    )
    per_batched = 1e6 / batched
    return {
        "coordinator_unary_us": cost(
            spent("coordinator", "start", "unary sent") * 1e6 / unary,
            "µs of coordinator CPU per unary SubmitJob",
            how + trickle + "; the coordinator's CPU over those calls / calls",
        ),
        "coordinator_batch_us": cost(
            spent("coordinator", "unary done", "batch sent") * per_batched,
            "µs of coordinator CPU per job in SubmitJobs of 100",
            how + drain + "; the coordinator's CPU while they were sent / jobs",
        ),
        "worker_us": cost(
            spent("worker-", "batch sent", "drained") * per_batched,
            "µs of worker CPU per job",
            how + drain + "; both workers' CPU from the resume to the last row / jobs (claim, "
            "already-done check, handler, result row, ack)",
        ),
        "worker_trickle_us": cost(
            spent("worker-", "start", "unary done") * 1e6 / unary,
            "µs of worker CPU per job",
            how + trickle + "; both workers' CPU / jobs: claims of a few jobs each",
        ),
        "shard_loop_us": cost(
            spent("shard-", "start", "drained") * 1e6 / (unary + batched),
            "µs of shard-loop CPU per job",
            how + trickle + drain + "; the shard loop's CPU / jobs (immediate jobs: no "
            "promotion; its reaper, leader lease, load sampling)",
        ),
        "redis_pipeline_us": cost(
            spent("redis", "unary done", "drained") * per_batched,
            "µs of redis-server CPU per job",
            how + drain + "; redis-server's CPU from the first SubmitJobs to the last row / "
            "jobs: every script, wake-up and heartbeat of the real path",
        ),
        "redis_pipeline_trickle_us": cost(
            spent("redis", "start", "unary done") * 1e6 / unary,
            "µs of redis-server CPU per job",
            how + trickle + "; redis-server's CPU / jobs",
        ),
        "pg_pipeline_us": cost(
            spent("postgres", "unary done", "drained") * per_batched,
            "µs of Postgres backend CPU per job",
            how + drain + "; CPU of the backends connected to the cluster's database / jobs "
            "(result rows, already-done checks, the coordinator's and loop's reads)",
        ),
    }


# --- main ------------------------------------------------------------------------------------


def versions(redis: RedisServer, pg_url: str) -> dict[str, str]:
    with psycopg.connect(pg_url) as conn:
        row = conn.execute("SHOW server_version").fetchone()
    out = {
        "python": platform.python_version(),
        "redis_server": redis.info()["redis_version"],
        "postgres": str(row[0]) if row else "",
    }
    for package in ("shardq", "redis", "hiredis", "psycopg", "grpcio", "sqlalchemy"):
        with contextlib.suppress(Exception):
            out[package] = version(package)
    return out


def measure(args: argparse.Namespace) -> dict[str, Any]:
    started = datetime.now(UTC)
    result: dict[str, Any] = {
        "schema": SCHEMA,
        "command": "python bench/op_costs.py " + " ".join(sys.argv[1:]),
        "started_at": started.isoformat(timespec="seconds"),
        "commit": _git("rev-parse", "HEAD"),
        "uncommitted": _git(
            "status", "--porcelain", "--", "shard", "proto", "coordinator", "worker"
        ).splitlines(),
        "machine": machine(),
    }
    costs: Costs = {}
    own_pg = None if args.postgres_url else PostgresServer()
    with RedisServer() as redis, own_pg or contextlib.nullcontext():
        pg_url = args.postgres_url or (own_pg.url if own_pg else "")
        result["versions"] = versions(redis, pg_url)
        result["postgres_server"] = (
            "a throwaway cluster (initdb + pg_ctl, default settings), as bench/run.py starts"
            if own_pg
            else "the server at --postgres-url, a throwaway database on it"
        )
        steps: list[tuple[str, Callable[[], Costs]]] = [
            ("redis", lambda: asyncio.run(redis_ops(redis, args))),
            ("memory", lambda: asyncio.run(memory(redis, args))),
            ("postgres", lambda: asyncio.run(postgres(pg_url, args))),
            ("cluster", lambda: cluster_costs(redis, pg_url, args)),
        ]
        for name, step in steps:
            t0 = time.monotonic()
            costs.update(step())
            print(f"op_costs: {name} done in {time.monotonic() - t0:.1f} s", file=sys.stderr)
    result["machine"]["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    result["wall_s"] = round((datetime.now(UTC) - started).total_seconds(), 1)
    result["params"] = {k: v for k, v in vars(args).items() if k not in ("out", "postgres_url")}
    result["costs"] = costs
    return result


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON file to write")
    p.add_argument("--postgres-url", default="", help="use this server (a throwaway database "
                   "on it) instead of starting one with initdb")  # fmt: skip
    p.add_argument("--jobs", type=int, default=10_000, help="jobs per Redis operation per round")
    p.add_argument("--tenants", type=int, default=100, help="tenants the Redis jobs spread over")
    p.add_argument("--rounds", type=int, default=3, help="measured Redis rounds (median kept)")
    p.add_argument("--memory-jobs", type=int, default=50_000, help="jobs for the memory figures")
    p.add_argument("--idle-tenants", type=int, default=20_000, help="tenants for per-tenant cost")
    p.add_argument("--pg-upserts", type=int, default=20_000, help="rows upserted per measure")
    p.add_argument("--pg-rows", type=int, default=1_000_000, help="rows in the loaded table")
    p.add_argument("--pg-tenants", type=int, default=1_000, help="tenants of the result rows")
    p.add_argument("--pg-partitions", type=int, default=16, help="hash partitions")
    p.add_argument("--pg-expired", type=int, default=100_000, help="rows the retention drops")
    p.add_argument("--unary-calls", type=int, default=3_000, help="unary SubmitJob calls")
    p.add_argument("--in-flight", type=int, default=32, help="unary calls in flight")
    p.add_argument("--batch-jobs", type=int, default=20_000, help="jobs sent in SubmitJobs")
    args = p.parse_args(argv)
    result = measure(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"op_costs: wrote {args.out}", file=sys.stderr)
    for name, c in result["costs"].items():
        print(f"{name:28} {c['value']:>12,.2f}  {c['unit']}")


if __name__ == "__main__":
    main()
