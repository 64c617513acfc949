"""shardq's side of the benchmark: the same scenarios as the peers, plus ``scale`` and
``multishard``, on a real shardq cluster started with shardq's own commands.

The protocol (the same as ``bench/peers/*_bench.py``; see ``bench/peers/_common.py``)
--------------------------------------------------------------------------------------
``run.py`` starts this script as a fresh process per request, with the project's Python
(``--shardq-python``, default ``.venv/bin/python`` at the repository root), writes ONE JSON
object to its stdin, and reads the LAST line of its stdout as ONE JSON object. Logs go to
stderr (its tail is kept when the process fails). Exit status 0, or the run counts as an error.

1. ``{"op": "describe"}`` → ``{"system": "shardq", "versions": {...}, "needs": ["redis",
   "postgres"], "scenarios": {name: "supported", ...}}``.
   It also answers ``tunings`` (the worker settings of each variant, ``TUNINGS``) and
   ``source`` (the directory shardq is imported from: ``run.py`` records its git commit).
2. ``{"op": "run", "scenario": NAME, "params": {...}, "redis_url": ..., "redis_urls": [one
   Redis server per shard], "postgres_url": ..., "workdir": ..., "repeat": K, "quick": bool,
   "tuning": "tuned" | "defaults"}`` → ``{"system": "shardq", "scenario": NAME, "versions":
   {...}, "metrics": {...}, "config": {...}}``. Without ``tuning``: ``tuned``.

The cluster of one run
----------------------
Every run gets a database of its own (``CREATE DATABASE`` on ``postgres_url``, dropped at the
end: the server is shared by all runs), and the cluster is built as an operator builds one:
``shardq migrate``, ``shardq shards init --address ...``, ``shardq tokens create``, then one
``shardq-shard`` loop per shard, one ``shardq-coordinator`` and (when the scenario runs jobs)
``WORKERS`` × ``shardq-worker --handlers shardq_handlers`` (``--concurrency`` as the run's
tuning says: shardq's default, 16, or the tuned 200). Jobs are submitted through the
gRPC API (``shardq.AsyncClient``: ``SubmitJob`` / ``SubmitJobs``). A job counts
as done when its result row is in Postgres: drain rates are measured to the moment the last
row is seen (polled every ``ROW_POLL_S``), not to the last start.

Figures per scenario (the same names as the peers where the scenario is shared):

- ``submit``: ``single_jobs_per_s`` (one unary SubmitJob at a time),
  ``unary_64_in_flight_jobs_per_s`` (64 unary calls in flight on one channel),
  ``batch_jobs_per_s`` (SubmitJobs of ``batch_size``, one call at a time) and
  ``batch_4_in_flight_jobs_per_s`` (4 such calls in flight). No workers running.
- ``drain``: ``jobs_per_s`` = (n − 1) / (last result row seen − first start), ``drain_s`` that
  span, ``start_jobs_per_s`` the peers' definition (first to last start),
  ``launch_to_first_start_s``.
- ``latency``: ``p50_ms``, ``p99_ms``, ``max_ms`` of start − submit.
- ``delayed``: ``p50_ms``, ``p99_ms``, ``max_ms``, ``min_ms``, ``early_jobs`` of start − run_at.
- ``fairness``: tenants A and B are two shardq tenants on the one shard.
- ``scale``: ``redis_bytes_per_scheduled_job`` with ``params.scheduled`` jobs scheduled on one
  shard; ``claim_us_per_job_*`` and ``promote_us_per_job_*`` on the empty and the loaded shard
  (through the shard's Python API, ``shardq.shard.client.ShardClient``: claim and promote are shard
  operations; the coordinator is not on their path).
- ``multishard``: ``jobs_per_s_<k>_shards`` for each k in ``params.shards`` (a drain, one
  tenant pinned to each shard, jobs split evenly).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import random
import secrets
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "peers"))

import psycopg  # noqa: E402
from _common import (  # noqa: E402
    CPU_GROUPS,
    TENANT_B_BASE,
    CpuMeter,
    count_starts,
    cpu_per_job_us,
    duplicate_starts,
    fairness_metrics,
    read_starts,
    serve,
    summary_ms,
    wait_first_start,
    wait_for_starts,
)
from redis.asyncio import Redis  # noqa: E402

from shardq.client import AsyncClient, RetryPolicy, job_spec  # noqa: E402
from shardq.coordinator.tools.redis_server import free_port, parent_death_prefix  # noqa: E402
from shardq.shard.client import ShardClient  # noqa: E402
from shardq.shard.models import ClaimedJob, Lease, NewJob  # noqa: E402
from shardq.v1 import common_pb2  # noqa: E402
from shardq.worker.settings import WorkerSettings  # noqa: E402

WORKERS = 2
#: shardq-worker's own defaults, read from its settings so they cannot drift from them.
WORKER_DEFAULTS: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(WorkerSettings)}
#: A checkout from before the recorder's linger (--shardq-python) recorded at once.
WORKER_DEFAULTS.setdefault("record_linger_ms", 0)
#: Tuned: the handlers each worker runs at once, at least one claim batch (100) so a claim is
#: never cut short by free slots while the worker is busy. BENCH_SHARDQ_CONCURRENCY overrides.
CONCURRENCY = int(os.environ.get("BENCH_SHARDQ_CONCURRENCY", "200"))
#: The worker settings of each variant ``run.py`` can ask for (the request's ``tuning``).
#: Only --concurrency differs: the claim and record batches are not flags, their defaults
#: hold in both, but a claim also stops at the free slots, so at 16 a claim takes <= 16.
TUNINGS: dict[str, dict[str, Any]] = {
    "defaults": {"concurrency": WORKER_DEFAULTS["concurrency"]},
    "tuned": {"concurrency": CONCURRENCY},
}
DEFAULT_TUNING = "tuned"  # a request without ``tuning`` (bench/move_lateness.py, ...)
NOOP = "bench.noop"
ROW_POLL_S = 0.01
WARMUP_BASE = 2_000_000_000
IN_FLIGHT = 64
#: SubmitJobs calls one producer keeps in flight for the pipelined batch figure.
BATCHES_IN_FLIGHT = 4
#: BENCH_SHARDQ_PROFILE=DIR runs every shardq process under ``py-spy record`` (raw stacks).
PROFILE_DIR = os.environ.get("BENCH_SHARDQ_PROFILE", "")
BIN = Path(sys.executable).parent


def _versions() -> dict[str, str]:
    return {
        "shardq": version("shardq"),
        "grpcio": version("grpcio"),
        "redis-py": version("redis"),
        "psycopg": version("psycopg"),
        "sqlalchemy": version("sqlalchemy"),
        "python": sys.version.split()[0],
    }


def tuning_of(req: dict[str, Any]) -> str:
    name = req.get("tuning") or DEFAULT_TUNING
    if name not in TUNINGS:
        raise ValueError(f"unknown tuning {name!r}; shardq has {sorted(TUNINGS)}")
    return str(name)


def concurrency_of(req: dict[str, Any]) -> int:
    return int(TUNINGS[tuning_of(req)]["concurrency"])


def concurrency_text(req: dict[str, Any]) -> str:
    concurrency = concurrency_of(req)
    claim = min(concurrency, WORKER_DEFAULTS["claim_batch"])
    return (
        f"{WORKERS} x `shardq-worker --handlers shardq_handlers --concurrency {concurrency}` "
        f"(asyncio; claims of up to {claim} jobs, result rows written and acked in batches of "
        f"up to {WORKER_DEFAULTS['record_batch']}, a batch under --concurrency gathered for up "
        f"to {WORKER_DEFAULTS['record_linger_ms']} ms), 1 x `shardq-coordinator`, 1 x "
        "`shardq-shard` loop per shard; log level WARNING"
    )


def tuning_statement(req: dict[str, Any]) -> dict[str, Any]:
    """The ``tuning`` of a run's config: the knobs set, next to shardq-worker's defaults."""
    concurrency = concurrency_of(req)
    return {
        "variant": tuning_of(req),
        "knobs": {
            "concurrency": concurrency,
            "claim_batch": min(concurrency, WORKER_DEFAULTS["claim_batch"]),
            "record_batch": WORKER_DEFAULTS["record_batch"],
            "record_linger_ms": WORKER_DEFAULTS["record_linger_ms"],
        },
        "library_defaults": {
            "concurrency": WORKER_DEFAULTS["concurrency"],
            "claim_batch": min(WORKER_DEFAULTS["concurrency"], WORKER_DEFAULTS["claim_batch"]),
            "record_batch": WORKER_DEFAULTS["record_batch"],
            "record_linger_ms": WORKER_DEFAULTS["record_linger_ms"],
        },
        "note": "--concurrency is the only setting that differs from shardq-worker's defaults. "
        f"claim_batch ({WORKER_DEFAULTS['claim_batch']}) and record_batch "
        f"({WORKER_DEFAULTS['record_batch']}) are fixed defaults, not flags, and "
        f"record_linger_ms its default ({WORKER_DEFAULTS['record_linger_ms']}); a claim takes at "
        "most the free slots, so at --concurrency 16 it takes <= 16. Every other setting is "
        "the default but SHARDQ_LOG_LEVEL=WARNING and the drain/shutdown graces (2 s: they "
        "only shorten stopping)",
    }


def processes_all(req: dict[str, Any], shards: int | str = 1) -> list[dict[str, Any]]:
    """Every process of the run (a run's config states them: the workers are not the only
    ones on the two cores)."""
    return [
        {"process": "shardq-worker", "count": WORKERS,
         "role": f"claims jobs, runs up to {concurrency_of(req)} handlers at once (asyncio), "
         "checks a job's earlier result row and writes its row in Postgres, acks in batches"},
        {"process": "shardq-coordinator", "count": 1,
         "role": "the gRPC API every submit goes through; assigns shards to the workers"},
        {"process": "shardq-shard", "count": shards,
         "role": "the shard loop (leader): promotes due delayed jobs, reaps expired leases, "
         "samples tenant load, writes rows of jobs that ended without a worker"},
        {"process": "redis-server", "count": shards, "role": "the shard: queues, jobs, schedules"},
        {"process": "postgres", "count": "1 postmaster + its background processes + 1 backend "
         "per connection (the workers', the coordinator's, the shard loops' and the bench "
         "driver's)",
         "role": "result rows (committed before each ack), tokens, the shard map"},
        {"process": "bench driver", "count": 1,
         "role": "the producer (a gRPC client); polls the result rows (not a worker)"},
    ]  # fmt: skip


# --- processes ----------------------------------------------------------------------------


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    ops_port: int = 0


def _env(values: dict[str, object]) -> dict[str, str]:
    """This environment without SHARDQ_* variables (as ``shardq dev`` does), plus ``values``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHARDQ_")}
    env["PYTHONUNBUFFERED"] = "1"
    env.update({k: str(v) for k, v in values.items()})
    return env


def _cli(*args: str, env: dict[str, str]) -> str:
    """Run ``shardq ARGS`` and return its stdout (raise with its stderr when it fails)."""
    proc = subprocess.run(
        [str(BIN / "shardq"), *args], env=env, capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"shardq {' '.join(args)} failed: {proc.stderr[-2000:]}")
    return proc.stdout


def _healthz(port: int) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as r:
            body: dict[str, Any] = json.loads(r.read())
            return body
    except (OSError, ValueError):
        return None


async def first_installed(url: str) -> None:
    """The shard at ``url`` with the job format a first install gives it (the chart's
    ``finalize`` hook), when the shardq measured has one: ``--shardq-python`` may run an
    older checkout's."""
    redis = Redis.from_url(url)
    try:
        raise_format = getattr(ShardClient(redis), "raise_job_format", None)
        if raise_format is not None:
            await raise_format()
    finally:
        await redis.aclose()


def _address(url: str) -> str:
    """host:port of a redis:// URL (the shard map stores addresses)."""
    rest = url.split("://", 1)[1].split("/", 1)[0]
    return rest.rsplit("@", 1)[-1]


@dataclass
class Cluster:
    """One run's shardq cluster: its own database, shard loops, coordinator, workers."""

    req: dict[str, Any]
    redis_urls: Sequence[str]
    tenants: Sequence[str]
    #: tenant -> shard ID to pin it to (multishard); others go where their slot maps.
    pins: dict[str, int] = field(default_factory=dict)
    procs: list[Proc] = field(default_factory=list)
    tokens: dict[str, str] = field(default_factory=dict)
    database: str = ""
    database_url: str = ""
    target: str = ""
    worker_token: str = field(default_factory=lambda: secrets.token_urlsafe(32))

    @property
    def workdir(self) -> Path:
        return Path(self.req["workdir"])

    @property
    def starts(self) -> str:
        return str(self.workdir / "starts.log")

    def __enter__(self) -> Cluster:
        try:
            self._create_database()
            self._prepare()
            self._start_shards_and_coordinator()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop(("worker-", "shard-", "coordinator"))
        self._drop_database()

    # -- database ---------------------------------------------------------------------------

    def _create_database(self) -> None:
        base = self.req["postgres_url"]
        if not base:
            raise RuntimeError("shardq needs postgres_url")
        self.database = f"shardq_bench_{os.getpid()}_{secrets.token_hex(3)}"
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{self.database}"')
        self.database_url = base.rsplit("/", 1)[0] + "/" + self.database

    def _drop_database(self) -> None:
        if not self.database:
            return
        with (
            contextlib.suppress(psycopg.Error),
            psycopg.connect(self.req["postgres_url"], autocommit=True) as conn,
        ):
            conn.execute(f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)')
        self.database = ""

    def _prepare(self) -> None:
        """Schema, shard map, tokens and pins, with shardq's own CLI (after the schema, the
        map and the tokens are made side by side: each command is a second of imports)."""
        env = _env({"SHARDQ_DATABASE_URL": self.database_url})
        _cli("migrate", env=env)
        addresses = [a for url in self.redis_urls for a in ("--address", _address(url))]

        def shard_map() -> None:
            # The bench's Redis runs without appendonly, like the peers': unchecked.
            _cli("shards", "init", *addresses, "--skip-checks", env=env)
            for tenant, shard_id in self.pins.items():
                _cli("tenants", "pin", tenant, str(shard_id), "--yes", env=env)

        def token(tenant: str) -> None:
            out = _cli("tokens", "create", "--tenant", tenant, "--name", "bench", "--json", env=env)
            self.tokens[tenant] = json.loads(out)["token"]

        with ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(shard_map), *(pool.submit(token, t) for t in self.tenants)]
            for future in futures:
                future.result()
        for url in self.redis_urls:
            asyncio.run(first_installed(url))

    # -- processes --------------------------------------------------------------------------

    def spawn(self, name: str, command: list[str], env: dict[str, object], ops: int = 0) -> Proc:
        path = self.workdir / f"{name}.log"
        if PROFILE_DIR:  # a py-spy profile of every shardq process, for the performance pass
            out_file = os.path.join(PROFILE_DIR, f"{self.workdir.name}-{name}.txt")
            command = [str(BIN / "py-spy"), "record", "--format", "raw", "--rate", "250",
                       "--nonblocking", "-o", out_file, "--", *command]  # fmt: skip
        with open(path, "ab") as out:
            popen = subprocess.Popen(
                [*parent_death_prefix(), *command],
                env=_env(env),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=str(HERE),
            )
        proc = Proc(name, popen, path, ops)
        self.procs.append(proc)
        return proc

    def _common(self) -> dict[str, object]:
        return {"SHARDQ_DATABASE_URL": self.database_url, "SHARDQ_LOG_LEVEL": "WARNING"}

    def _start_shards_and_coordinator(self) -> None:
        for i, url in enumerate(self.redis_urls):
            port = free_port()
            env = {
                **self._common(),
                "SHARDQ_REDIS_URL": url,
                "SHARDQ_SHARD_ID": i,
                "SHARDQ_METRICS_PORT": port,
                "SHARDQ_INSTANCE_ID": f"bench-shard-{i}",
            }
            self.spawn(f"shard-{i}", [str(BIN / "shardq-shard")], env, port)
        self.target = f"127.0.0.1:{free_port()}"
        env = {
            **self._common(),
            "SHARDQ_LISTEN": self.target,
            "SHARDQ_METRICS_PORT": -1,
            "SHARDQ_WORKER_TOKEN": self.worker_token,
            "SHARDQ_SHUTDOWN_GRACE_S": 2,
        }
        self.spawn("coordinator", [str(BIN / "shardq-coordinator")], env)
        asyncio.run(self._wait_coordinator())
        self._wait_health("shard-", lambda h: h.get("role") == "leader")

    async def _wait_coordinator(self, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        async with self.client(self.tenants[0], attempts=1) as client:
            while True:
                self.check_alive()
                try:
                    await client.tenant_stats()
                    return
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                await asyncio.sleep(0.05)

    def _wait_health(
        self, prefix: str, ready: Callable[[dict[str, Any]], bool], timeout_s: float = 60
    ) -> None:
        deadline = time.monotonic() + timeout_s
        for proc in (p for p in self.procs if p.name.startswith(prefix)):
            while True:
                self.check_alive()
                health = _healthz(proc.ops_port)
                if health is not None and ready(health):
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{proc.name} not ready in {timeout_s}s: {health}")
                time.sleep(0.02)

    def start_workers(self, wait: bool = True) -> float:
        """Start the workers; return the time they were launched."""
        launched = time.time()
        # Prepended, not replaced: the caller's PYTHONPATH (a handler module of its own) stays.
        pythonpath = os.pathsep.join(
            filter(None, [str(HERE), str(HERE / "peers"), os.environ.get("PYTHONPATH")])
        )
        for k in range(WORKERS):
            port = free_port()
            env = {
                **self._common(),
                "SHARDQ_HANDLERS": "shardq_handlers",
                "SHARDQ_COORDINATOR": self.target,
                "SHARDQ_WORKER_TOKEN": self.worker_token,
                "SHARDQ_WORKER_ID": f"bench-worker-{k}",
                "SHARDQ_CONCURRENCY": concurrency_of(self.req),
                "SHARDQ_DRAIN_GRACE_S": 2,
                "SHARDQ_METRICS_PORT": port,
                "BENCH_STARTS_FILE": self.starts,
                "PYTHONPATH": pythonpath,
            }
            self.spawn(f"worker-{k}", [str(BIN / "shardq-worker")], env, port)
        if wait:
            self._wait_health("worker-", lambda h: bool(h.get("shards")))
        return launched

    def cpu_meter(self) -> CpuMeter:
        """CPU of this cluster's processes by kind, its Redis servers and Postgres."""
        kinds = {"workers": "worker-", "coordinator": "coordinator", "shard_loops": "shard-"}
        sessions = {
            kind: [p.popen.pid for p in self.procs if p.name.startswith(prefix)]
            for kind, prefix in kinds.items()
        }
        return CpuMeter(sessions, self.redis_urls, postgres=True)

    def check_alive(self) -> None:
        for proc in self.procs:
            if proc.popen.poll() is not None:
                tail = proc.log.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{proc.name} exited with {proc.popen.returncode}:\n{tail}")

    def stop(self, order: Sequence[str]) -> None:
        """SIGTERM by group in ``order`` (workers first: they drain), SIGKILL the slow."""
        for prefix in order:
            group = [p for p in self.procs if p.name.startswith(prefix)]
            for p in group:
                if p.popen.poll() is None:
                    # py-spy writes its profile on SIGINT (it dies on SIGTERM); every shardq
                    # process treats SIGINT as SIGTERM.
                    os.killpg(p.popen.pid, signal.SIGINT if PROFILE_DIR else signal.SIGTERM)
            for p in group:
                try:
                    p.popen.wait(15)
                except subprocess.TimeoutExpired:
                    os.killpg(p.popen.pid, signal.SIGKILL)
                    p.popen.wait()
                self.procs.remove(p)

    # -- using it ---------------------------------------------------------------------------

    def client(self, tenant: str, attempts: int = 6) -> AsyncClient:
        return AsyncClient(
            self.target, self.tokens[tenant], retry=RetryPolicy(attempts=attempts), timeout_s=60
        )

    def result_rows(self) -> int:
        with psycopg.connect(self.database_url) as conn:
            row = conn.execute("SELECT count(*) FROM shardq_results").fetchone()
            return int(row[0]) if row else 0

    def wait_rows(self, count: int, timeout_s: float) -> float:
        """Poll until ``count`` result rows exist; return when that was first seen."""
        deadline = time.monotonic() + timeout_s
        with psycopg.connect(self.database_url, autocommit=True) as conn:
            while True:
                row = conn.execute("SELECT count(*) FROM shardq_results").fetchone()
                seen = int(row[0]) if row else 0
                if seen >= count:
                    return time.time()
                if time.monotonic() > deadline:
                    raise RuntimeError(f"only {seen}/{count} result rows in {timeout_s}s")
                self.check_alive()
                time.sleep(ROW_POLL_S)

    def claim_lateness(self, first_run_at_ms: int) -> list[float]:
        """Claim time − run_at (s) of every job due from ``first_run_at_ms`` on, from the
        result rows (``started_at`` is when the worker claimed the job)."""
        with psycopg.connect(self.database_url) as conn:
            rows = conn.execute(
                "SELECT extract(epoch FROM started_at - queued_at)::float8 FROM shardq_results "
                "WHERE queued_at >= to_timestamp(%s / 1000.0)",
                (first_run_at_ms,),
            ).fetchall()
        return [float(r[0]) for r in rows]

    def wait_starts(self, count: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while count_starts(self.starts) < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {count_starts(self.starts)}/{count} jobs started")
            self.check_alive()
            time.sleep(0.005)


def _spec(number: int, run_at_ms: int | None = None, priority: int = 0) -> common_pb2.JobSpec:
    spec = job_spec(NOOP, number, priority=priority)
    if run_at_ms is not None:
        spec.run_at_unix_ms = run_at_ms  # the exact ms the delayed scenario measures against
    return spec


async def _submit_batches(
    client: AsyncClient,
    numbers: Sequence[int],
    size: int,
    run_at_ms: Sequence[int] | None = None,
    priority: int = 0,
) -> list[float]:
    """SubmitJobs in batches of ``size``; each job's submit time; raise on a refused item."""
    times: list[float] = []
    for lo in range(0, len(numbers), size):
        chunk = numbers[lo : lo + size]
        at = run_at_ms[lo : lo + size] if run_at_ms is not None else [None] * len(chunk)
        times.extend([time.time()] * len(chunk))
        specs = [_spec(n, a, priority) for n, a in zip(chunk, at, strict=True)]
        items = await client.submit_many(specs)
        refused = [it for it in items if it.error]
        if refused:
            raise RuntimeError(f"{len(refused)} jobs refused, e.g. {refused[0]}")
    return times


def _config(req: dict[str, Any], shards: int | str = 1, **extra: Any) -> dict[str, Any]:
    return {
        "params": req["params"],
        # processes: the worker processes (the peers' figure); processes_all: every one.
        "concurrency": {"processes": WORKERS, "how": concurrency_text(req)},
        "tuning": tuning_statement(req),
        "processes_all": processes_all(req, shards),
        "done_means": "the job's result row is committed in Postgres (then it is acked)",
        "machine_note": "2 cores shared by every process of the cluster, Redis and Postgres",
        **extra,
    }


# --- scenarios ----------------------------------------------------------------------------


async def _timed(fn: Callable[[], Awaitable[None]]) -> float:
    t0 = time.perf_counter()
    await fn()
    return time.perf_counter() - t0


def submit(req: dict[str, Any]) -> dict[str, Any]:
    p = req["params"]
    n_single, n_batch, size = p["n_single"], p["n_batch"], p["batch_size"]
    with Cluster(req, req["redis_urls"][:1], ["bench"]) as cluster:

        async def go() -> dict[str, float]:
            async with cluster.client("bench") as client:
                await client.submit(NOOP, 0)  # the channel is open before timing starts

                async def singles() -> None:
                    for i in range(n_single):
                        await client.submit(NOOP, i)

                async def in_flight() -> None:
                    numbers = iter(range(n_single, 2 * n_single))

                    async def lane() -> None:
                        for i in numbers:
                            await client.submit(NOOP, i)

                    await asyncio.gather(*(lane() for _ in range(IN_FLIGHT)))

                async def batches() -> None:
                    await _submit_batches(client, range(2 * n_single, 2 * n_single + n_batch), size)

                async def batches_in_flight() -> None:
                    first = 2 * n_single + n_batch
                    lanes = [range(first + k, first + n_batch, BATCHES_IN_FLIGHT)
                             for k in range(BATCHES_IN_FLIGHT)]  # fmt: skip
                    await asyncio.gather(*(_submit_batches(client, lane, size) for lane in lanes))

                return {
                    "single_jobs_per_s": round(n_single / await _timed(singles), 1),
                    "unary_64_in_flight_jobs_per_s": round(n_single / await _timed(in_flight), 1),
                    "batch_jobs_per_s": round(n_batch / await _timed(batches), 1),
                    f"batch_{BATCHES_IN_FLIGHT}_in_flight_jobs_per_s": round(
                        n_batch / await _timed(batches_in_flight), 1
                    ),
                }

        metrics = asyncio.run(go())
    return {
        "metrics": metrics,
        "config": _config(
            req,
            producer="one process (asyncio, one gRPC channel), no workers running",
            single="unary SubmitJob, one call at a time",
            unary_64_in_flight=f"unary SubmitJob, {IN_FLIGHT} calls in flight, n_single jobs",
            bulk_api=f"SubmitJobs, {size} jobs per call, one call at a time (as the peers' "
            f"bulk calls); batch_{BATCHES_IN_FLIGHT}_in_flight: {BATCHES_IN_FLIGHT} calls in "
            "flight from the same producer",
        ),
    }


def _drain_run(
    cluster: Cluster, per_tenant: dict[str, Sequence[int]], size: int, timeout_s: float
) -> dict[str, float]:
    """Queue the jobs, start the workers, time until every result row is in Postgres."""

    async def queue() -> None:
        for tenant, numbers in per_tenant.items():
            async with cluster.client(tenant) as client:
                await _submit_batches(client, numbers, size)

    asyncio.run(queue())
    n = sum(len(v) for v in per_tenant.values())
    launched = cluster.start_workers(wait=False)
    meter = cluster.cpu_meter()
    wait_first_start(cluster.starts, cluster.check_alive, timeout_s)
    cpu_before = meter.mark()
    done_at = cluster.wait_rows(n, timeout_s)
    cpu = cpu_per_job_us(cpu_before, meter.mark(), n)
    stamps = sorted(read_starts(cluster.starts).values())
    if len(stamps) < n:
        raise RuntimeError(f"{n} result rows but {len(stamps)} start records")
    span = done_at - stamps[0]
    return {
        "jobs_per_s": round((n - 1) / span, 1),
        "drain_s": round(span, 3),
        "start_jobs_per_s": round((n - 1) / (stamps[-1] - stamps[0]), 1),
        "launch_to_first_start_s": round(stamps[0] - launched, 3),
        **cpu,
    }


def drain(req: dict[str, Any]) -> dict[str, Any]:
    p = req["params"]
    with Cluster(req, req["redis_urls"][:1], ["bench"]) as cluster:
        metrics = _drain_run(cluster, {"bench": range(p["n"])}, p["batch_size"], p["timeout_s"])
        rows = cluster.result_rows()
    return {
        "metrics": metrics,
        "config": _config(
            req,
            queued_with=f"SubmitJobs, {p['batch_size']} per call, before the workers start",
            rate="jobs_per_s and drain_s: first job start -> last result row seen in Postgres "
            f"(polled every {ROW_POLL_S * 1000:g} ms); start_jobs_per_s: first -> last start "
            "(the peers' definition)",
            result_rows=rows,
            duplicates=duplicate_starts(cluster.starts),
            cpu="cpu_us_per_job_*: CPU seconds (utime + stime, /proc) from the first job start "
            "to the last result row, per job, of each kind of process: workers, coordinator, "
            "shard_loops (each with its children), "
            + "; ".join(f"{k}: {v}" for k, v in CPU_GROUPS.items()),
        ),
    }


async def _warm_up(cluster: Cluster, client: AsyncClient) -> int:
    for k in range(4):
        await client.submit(NOOP, WARMUP_BASE + k)
    await asyncio.to_thread(cluster.wait_starts, 4, 60)
    await asyncio.sleep(0.3)
    return int(count_starts(cluster.starts))


def latency(req: dict[str, Any]) -> dict[str, Any]:
    p = req["params"]
    n = p["n"]
    submitted: dict[int, float] = {}
    with Cluster(req, req["redis_urls"][:1], ["bench"]) as cluster:
        cluster.start_workers()

        async def go() -> None:
            async with cluster.client("bench") as client:
                seen = await _warm_up(cluster, client)
                rng = random.Random(7)
                for i in range(n):
                    await asyncio.sleep(rng.uniform(p["gap_min_s"], p["gap_max_s"]))
                    submitted[i] = time.time()
                    await client.submit(NOOP, i)
                    seen += 1
                    if wait_for_starts(cluster.starts, seen, timeout=30, poll=0.0005) < seen:
                        cluster.check_alive()
                        raise RuntimeError(f"job {i} did not start within 30 s")

        asyncio.run(go())
        starts = read_starts(cluster.starts)
    waits = [starts[i] - submitted[i] for i in range(n)]
    return {
        "metrics": summary_ms(waits),
        "config": _config(
            req, submit="unary SubmitJob, wait until it starts, idle gap, repeat (4 warm-up jobs)"
        ),
    }


def delayed(req: dict[str, Any]) -> dict[str, Any]:
    p = req["params"]
    n, rate = p["n"], p["due_per_s"]
    with Cluster(req, req["redis_urls"][:1], ["bench"]) as cluster:
        cluster.start_workers()
        late_submits = 0

        async def go() -> tuple[list[int], float]:
            nonlocal late_submits
            async with cluster.client("bench") as client:
                await _warm_up(cluster, client)
                base_ms = int((time.time() + p["lead_s"]) * 1000)
                run_at = [base_ms + i * 1000 // rate for i in range(n)]
                t0 = time.perf_counter()
                size = 100
                for lo in range(0, n, size):
                    due = run_at[lo : lo + size]
                    await _submit_batches(client, range(lo, lo + len(due)), size, due)
                    late_submits += sum(1 for at in due if at < time.time() * 1000)
                return run_at, time.perf_counter() - t0

        run_at_ms, submit_s = asyncio.run(go())
        meter = cluster.cpu_meter()
        cpu_before = meter.mark()
        cluster.wait_starts(n + 4, p["lead_s"] + n / rate + p["timeout_s"])
        cpu = cpu_per_job_us(cpu_before, meter.mark(), n)
        cluster.wait_rows(n + 4, 60)
        starts = read_starts(cluster.starts)
        claimed = cluster.claim_lateness(run_at_ms[0])
    lateness = [starts[i] - run_at_ms[i] / 1000 for i in range(n)]
    metrics = summary_ms(lateness)
    metrics["early_jobs"] = sum(1 for x in lateness if x < 0)
    metrics["min_ms"] = round(min(lateness) * 1000, 3)
    metrics.update(cpu)
    return {
        "metrics": metrics,
        "config": _config(
            req,
            delay_api="SubmitJobs with run_at_unix_ms (whole ms), 100 per call",
            submit_s=round(submit_s, 3),
            submitted_after_run_at=late_submits,
            duplicates=duplicate_starts(cluster.starts),
            # Where the lateness comes from: promoted and claimed (the worker's claim time in
            # the result row) vs then started by the handler.
            claim_lateness=summary_ms(claimed),
            # How busy the machine is while the jobs come due (a late start is most often a
            # process waiting for a core).
            cpu="cpu_us_per_job_*: CPU seconds (utime + stime, /proc) from the last submit to "
            "the last start (the lead time, then the jobs coming due), per job, of each kind "
            "of process: workers, coordinator, shard_loops (each with its children), "
            + "; ".join(f"{k}: {v}" for k, v in CPU_GROUPS.items()),
        ),
    }


def fairness(req: dict[str, Any]) -> dict[str, Any]:
    """Also ``fairness_priority``: the same, with A's flood at priority ``a_priority`` (9)
    and B's jobs at ``b_priority`` (0), the case where a priority-first claim would serve
    all of A before any of B."""
    p = req["params"]
    n_a, n_b = p["n_a"], p["n_b"]
    a_priority, b_priority = p.get("a_priority", 0), p.get("b_priority", 0)
    with Cluster(req, req["redis_urls"][:1], ["bench-a", "bench-b"]) as cluster:

        async def flood() -> list[float]:
            async with cluster.client("bench-a") as client:
                return await _submit_batches(
                    client, range(n_a), p["batch_size"], priority=a_priority
                )

        a_times = asyncio.run(flood())
        cluster.start_workers(wait=False)
        b_times: list[float] = []

        async def tenant_b() -> None:
            async with cluster.client("bench-b") as client:
                await client.tenant_stats()  # connected before the first start
                await asyncio.to_thread(cluster.wait_starts, 1, 120)
                for k in range(n_b):
                    b_times.append(time.time())
                    await client.submit(NOOP, TENANT_B_BASE + k, priority=b_priority)
                    await asyncio.sleep(p["b_gap_s"])

        asyncio.run(tenant_b())
        cluster.wait_starts(n_a + n_b, p["timeout_s"])
        starts = read_starts(cluster.starts)
    metrics = fairness_metrics(starts, a_times, b_times)
    return {
        "metrics": metrics,
        "config": _config(
            req,
            queues=f"two shardq tenants (bench-a, bench-b) on one shard, A at priority "
            f"{a_priority}, B at {b_priority}: tenants are served round-robin whatever "
            "their priorities",
            a_submitted_with=f"SubmitJobs, {p['batch_size']} per call, before workers start",
            b_submitted="unary SubmitJob, b_gap_s apart, from the first job start on",
            duplicates=duplicate_starts(cluster.starts),
        ),
    }


class ShiftedClock:
    """The system clock moved ``shift_ms`` ahead: promotes jobs scheduled a little in the
    future (the probe) without waiting for them, while the far-future backlog stays put."""

    def __init__(self, shift_ms: int) -> None:
        self.shift_ms = shift_ms

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000 + self.shift_ms


async def _probe(url: str, n: int, tenant: str) -> dict[str, float]:
    """µs per job of claim (batches of 100) and promote (batches of 500) for ``n`` jobs."""
    redis = Redis.from_url(url)
    client = ShardClient(redis)
    ahead = ShardClient(redis, clock=ShiftedClock(120_000))
    try:
        await client.enqueue([NewJob(tenant, NOOP, b"0", uuid.uuid4().hex) for _ in range(n)])
        r0, t0 = await _script_usec(redis), time.perf_counter()
        claimed: list[ClaimedJob] = []
        while len(claimed) < n:
            got = await client.claim("bench-probe", 100, 60_000)
            if not got:
                raise RuntimeError(f"claimed {len(claimed)}/{n} probe jobs")
            claimed += got
        claim_s, claim_redis = time.perf_counter() - t0, await _script_usec(redis) - r0
        for lo in range(0, n, 500):
            await client.ack([_lease(j) for j in claimed[lo : lo + 500]])
        soon = client.clock.now_ms() + 60_000
        jobs = [NewJob(tenant, NOOP, b"0", uuid.uuid4().hex, run_at_ms=soon) for _ in range(n)]
        await client.enqueue(jobs)
        r0, t0 = await _script_usec(redis), time.perf_counter()
        promoted, _ = await ahead.promote()
        promote_s, promote_redis = time.perf_counter() - t0, await _script_usec(redis) - r0
        if promoted != n:
            raise RuntimeError(f"promoted {promoted}/{n} probe jobs")
        while got := await client.claim("bench-probe", 100, 60_000):  # leave the shard as found
            await client.ack([_lease(j) for j in got])
    finally:
        await redis.aclose()
    return {
        "claim_us": claim_s / n * 1e6,
        "promote_us": promote_s / n * 1e6,
        "claim_redis_us": claim_redis / n,
        "promote_redis_us": promote_redis / n,
    }


async def _script_usec(redis: Redis) -> int:
    """µs Redis has spent in EVALSHA so far (INFO commandstats): the server's share of a
    probe, apart from the client and the machine's scheduling."""
    stats = await redis.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("usec", 0))


def _lease(job: ClaimedJob) -> Lease:
    return Lease(job.job_id, job.fence)


async def _used_memory(redis: Redis) -> int:
    info = await redis.info("memory")
    return int(info["used_memory"])


async def _load(url: str, count: int) -> dict[str, Any]:
    """``count`` jobs scheduled an hour or more ahead, through the shard API, 500 per call."""
    redis = Redis.from_url(url)
    client = ShardClient(redis)
    try:
        before = await _used_memory(redis)
        table_before = await _key_table_bytes(redis)
        t0 = time.perf_counter()
        base = client.clock.now_ms() + 3_600_000
        step = 500
        for lo in range(0, count, step):
            jobs = [
                NewJob("bench-load", NOOP, str(i).encode(), uuid.uuid4().hex, run_at_ms=base + i)
                for i in range(lo, min(count, lo + step))
            ]
            await client.enqueue(jobs)
        load_s = time.perf_counter() - t0
        after = await _used_memory(redis)
        scheduled = await redis.zcard(client.keys.scheduled_by_tenant("bench-load"))
        breakdown = await _memory_breakdown(redis, client, count)
        # The keyspace's own table (an entry per key and its bucket array, which doubles as
        # the key count passes a power of two: up to 16 bytes per key at once) is part of
        # the figure, and shown apart: where a load crosses a doubling shows in it.
        breakdown["key_table"] = round((await _key_table_bytes(redis) - table_before) / count, 1)
    finally:
        await redis.aclose()
    if scheduled != count:
        raise RuntimeError(f"{scheduled} jobs scheduled, expected {count}")
    return {"bytes": (after - before) / count, "load_s": load_s, "breakdown": breakdown}


async def _key_table_bytes(redis: Redis) -> int:
    """Bytes of db 0's main hash table (``MEMORY STATS``: its entries and bucket array)."""
    stats = await redis.memory_stats()
    db0 = stats.get("db.0")
    return int(db0["overhead.hashtable.main"]) if isinstance(db0, dict) else 0


async def _memory_breakdown(redis: Redis, client: ShardClient, count: int) -> dict[str, float]:
    """Bytes per scheduled job by structure (``MEMORY USAGE``; a sample of job hashes and
    dedupe keys, the tenant's delayed ZSET whole), to show where the per-job memory goes."""
    k = client.keys
    ids = [i.decode() for i in await redis.zrange(k.scheduled_by_tenant("bench-load"), 0, 99)]
    jobs = [await redis.memory_usage(k.job(i)) or 0 for i in ids]
    dedupe = []
    for i in ids:
        request_id: bytes = await redis.hget(k.job(i), "r")  # type: ignore[misc]
        dedupe.append(await redis.memory_usage(k.dedupe("bench-load", request_id.decode())) or 0)
    tenant_zset = await redis.memory_usage(k.scheduled_by_tenant("bench-load"), samples=0) or 0
    return {
        "job_hash": round(sum(jobs) / len(jobs), 1),
        "dedupe_key": round(sum(dedupe) / len(dedupe), 1),
        "tenant_scheduled_zset_entry": round(tenant_zset / count, 1),
    }


def scale(req: dict[str, Any]) -> dict[str, Any]:
    count = req["params"]["scheduled"]
    url = req["redis_urls"][0]
    probe_n = 10_000 if not req.get("quick") else 500
    asyncio.run(first_installed(url))
    # The probe is run twice on each shard state: the first pass warms Redis' script cache
    # and the client's connection; the second is reported.
    asyncio.run(_probe(url, probe_n, "bench-probe"))
    empty = asyncio.run(_probe(url, probe_n, "bench-probe"))
    loaded_info = asyncio.run(_load(url, count))
    asyncio.run(_probe(url, probe_n, "bench-probe"))
    loaded = asyncio.run(_probe(url, probe_n, "bench-probe"))
    avg_payload = sum(len(str(i)) for i in range(count)) / count
    return {
        "metrics": {
            "redis_bytes_per_scheduled_job": round(loaded_info["bytes"], 1),
            "claim_us_per_job_empty": round(empty["claim_us"], 2),
            "claim_us_per_job_loaded": round(loaded["claim_us"], 2),
            "promote_us_per_job_empty": round(empty["promote_us"], 2),
            "promote_us_per_job_loaded": round(loaded["promote_us"], 2),
            "claim_loaded_over_empty": round(loaded["claim_us"] / empty["claim_us"], 3),
            "promote_loaded_over_empty": round(loaded["promote_us"] / empty["promote_us"], 3),
            "claim_redis_us_per_job_empty": round(empty["claim_redis_us"], 2),
            "claim_redis_us_per_job_loaded": round(loaded["claim_redis_us"], 2),
            "promote_redis_us_per_job_empty": round(empty["promote_redis_us"], 2),
            "promote_redis_us_per_job_loaded": round(loaded["promote_redis_us"], 2),
            "load_jobs_per_s": round(count / loaded_info["load_s"], 1),
        },
        "config": {
            "params": req["params"],
            "concurrency": {"processes": 1, "how": "this process, through shardq.shard.client"},
            "tuning": {
                **tuning_statement(req),
                "note": "no workers run in scale: the tuning does not apply, both variants "
                "measure the same thing",
            },
            "processes_all": [
                {
                    "process": "bench driver",
                    "count": 1,
                    "role": "enqueues, claims, promotes and acks through shardq.shard.client",
                },
                {"process": "redis-server", "count": 1, "role": "the shard"},
            ],
            "how": "jobs enqueued through shardq.shard.client.ShardClient (the shard's Python API; "
            "claim and promote are shard operations, the coordinator is not on their path); "
            f"claim and promote timed per job over {probe_n} probe jobs (claim: batches of "
            "100; promote: batches of 500), each measured on the empty shard and with the "
            "scheduled backlog, after one warm-up pass",
            "backlog": f"{count} jobs of one tenant scheduled 1 h ahead and later, "
            f"payload {avg_payload:.1f} bytes on average, 32-char request IDs",
            "bytes_per_job": "Redis used_memory growth / jobs: job hash, its entry on its "
            "tenant's delayed ZSET (and, before the due layout, on the shard's), the dedupe key "
            "(none at job format 3), and the key table's entries and buckets (key_table)",
            "bytes_per_job_by_structure": loaded_info["breakdown"],
        },
    }


def multishard(req: dict[str, Any]) -> dict[str, Any]:
    p = req["params"]
    urls = req["redis_urls"]
    metrics: dict[str, float] = {}
    per_k: dict[str, Any] = {}
    for k in p["shards"]:
        if len(urls) < k:
            raise RuntimeError(f"{k} shards asked, {len(urls)} Redis servers given")
        tenants = [f"bench-{i}" for i in range(k)]
        sub = {**req, "workdir": os.path.join(req["workdir"], f"{k}-shards")}
        os.makedirs(sub["workdir"], exist_ok=True)
        pins = {t: i for i, t in enumerate(tenants)}
        split: dict[str, Sequence[int]] = {t: range(i, p["n"], k) for i, t in enumerate(tenants)}
        with Cluster(sub, urls[:k], tenants, pins=pins) as cluster:
            run = _drain_run(cluster, split, 1000, 900)
        metrics[f"jobs_per_s_{k}_shards"] = run["jobs_per_s"]
        per_k[str(k)] = run
    return {
        "metrics": metrics,
        "config": _config(
            req,
            shards="1 per shard: " + ", ".join(map(str, p["shards"])) + " in turn",
            per_shard_count=per_k,
            layout="k redis-server processes (one per shard), k shard loops, one coordinator, "
            f"{WORKERS} workers; one tenant pinned to each shard, n jobs split evenly, queued "
            "before the workers start; rate to the last result row in Postgres",
            cpu_limit="2 cores for everything: the workers, k Redis servers, k shard loops, "
            "the coordinator and Postgres. More shards add Redis capacity but no CPU, so this "
            "shows the cost per shard (flat = no overhead from sharding), not scale-out",
        ),
    }


SCENARIOS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "submit": submit,
    "drain": drain,
    "latency": latency,
    "delayed": delayed,
    "scale": scale,
    "fairness": fairness,
    "fairness_priority": fairness,
    "multishard": multishard,
}


def main() -> None:
    import shardq  # noqa: PLC0415 -- only to say where the measured code is

    # The editable install links each file from its checkout: follow the link.
    source = os.path.dirname(os.path.realpath(shardq.__file__))
    serve("shardq", _versions(), dict(SCENARIOS), needs=("redis", "postgres"),
          described={"tunings": TUNINGS, "source": source})  # fmt: skip


if __name__ == "__main__":
    main()
