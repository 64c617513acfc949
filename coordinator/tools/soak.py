"""``shardq soak``: a local cluster under a steady load across tenants while faults are injected
at random, ending with the reconciliation of every accepted submit
(:mod:`shardq.coordinator.tools.reconcile`); exit code 1 when it is not OK.

It starts its own cluster (``shardq dev``'s :class:`DevCluster`, in a fresh temporary data dir
unless ``--data-dir``), because its faults need the processes in hand: the shards' Redis, two
shard loops per shard (a leader and a standby), the coordinator and the workers, with
Postgres reached through a proxy the soak can cut. ``--database-url`` gives it a Postgres of
your own (else the embedded one); the reconciliation reads it directly, past the proxy.

The faults, one every ``--fault-every-s`` seconds, drawn with ``--seed``: a worker killed
(kill -9, restarted a second later), a worker frozen past its lease (SIGSTOP, SIGCONT), a
shard's redis-server killed (kill -9, restarted on its port and AOF dir), Postgres cut off
for 10 s, a shard loop leader killed (its standby takes over), the coordinator killed
(restarted on its port; the clients' default retry budget rides it out).

The load: ``--rate`` submits a second over ``--tenants`` tenants, each with its own
request_id, through the client's default :class:`RetryPolicy`: ``sleep`` jobs, ``ledger.add``
jobs (a row through ``ctx.session``: the side effect counted), delayed ``echo`` jobs, and
``sleep`` jobs with ``max_attempts=1`` (a worker's death makes them ``dead``, with their row).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import grpc

from shardq.client import AsyncClient, JobOptions, RetryPolicy
from shardq.common import config
from shardq.common.errors import ShardqError
from shardq.coordinator.tools.dev import DEFAULT_HANDLERS, DevError
from shardq.coordinator.tools.dev.cluster import DevCluster
from shardq.coordinator.tools.dev.processes import Child, healthz, port_is_free
from shardq.coordinator.tools.faults import CuttableProxy
from shardq.coordinator.tools.reconcile import Accepted, Reconciliation, settle
from shardq.coordinator.tools.redis_server import free_port

#: The workers' lease in the soak: short, so a frozen worker's jobs come back within seconds.
LEASE_MS = 4_000
POSTGRES_CUT_S = 10.0
LEDGER_TABLE = "shardq_example_ledger"
FAULTS = (
    "worker-kill",
    "worker-freeze",
    "redis-kill",
    "postgres-cut",
    "loop-kill",
    "coordinator-kill",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``shardq soak``'s arguments (the CLI registers them)."""
    length = parser.add_mutually_exclusive_group()
    length.add_argument("--minutes", type=float, default=None, help="how long to load (default 5)")
    length.add_argument("--seconds", type=float, default=None, help="how long, in seconds")
    parser.add_argument("--seed", type=int, default=None, help="the faults' and load's seed")
    parser.add_argument("--tenants", type=int, default=10, help="tenants to load (default 10)")
    parser.add_argument(
        "--rate", type=float, default=20.0, help="submits a second, all tenants (default 20)"
    )
    parser.add_argument(
        "--fault-every-s", type=float, default=15.0, help="seconds between faults (default 15)"
    )
    parser.add_argument(
        "--faults",
        default=",".join(FAULTS),
        help=f"the faults to draw from, comma-separated (default all: {','.join(FAULTS)})",
    )
    parser.add_argument(
        "--settle-s",
        type=float,
        default=180.0,
        help="after the load, how long every job may take to end (default 180)",
    )
    parser.add_argument("--shards", type=int, default=2, help="Redis shards (default 2)")
    parser.add_argument("--workers", type=int, default=3, help="worker processes (default 3)")
    parser.add_argument(
        "--data-dir", default="", help="working folder (default: a new temporary one, removed)"
    )
    config.add_database_url(
        parser, "Postgres to use (empty: an embedded pgserver)", env_prefix="SHARDQ_SOAK_"
    )


class SoakCluster(DevCluster):
    """``shardq dev``'s cluster, with what the faults need: every process restartable as it
    was started, a standby shard loop per shard, and Postgres behind a cuttable proxy."""

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args)
        self.specs: dict[str, tuple[str, dict[str, object], int]] = {}
        self.proxy: CuttableProxy | None = None
        #: The database past the proxy: the reconciliation reads it during a cut too.
        self.direct_url = ""

    def spawn(self, name: str, module: str, env: dict[str, object], ops_port: int = 0) -> Child:
        if module == "shardq.worker":
            env = {**env, "SHARDQ_LEASE_MS": LEASE_MS}
        self.specs[name] = (module, env, ops_port)
        return super().spawn(name, module, env, ops_port)

    async def _prepare_database(self) -> None:
        await super()._prepare_database()
        # Everything started from here on reaches Postgres through the proxy.
        self.direct_url = self.database_url
        parts = urlsplit(self.database_url)
        self.proxy = CuttableProxy(parts.hostname or "127.0.0.1", parts.port or 5432)
        await self.proxy.start()
        userinfo, at, _ = parts.netloc.rpartition("@")
        netloc = f"{userinfo}{at}127.0.0.1:{self.proxy.port}"
        self.database_url = urlunsplit(parts._replace(netloc=netloc))

    def _start_shard_loops(self) -> None:
        for i, r in enumerate(self.redis):
            for role in ("a", "b"):  # a leader and a standby: either may lead
                port = free_port()
                env = {
                    **self._common_env(),
                    "SHARDQ_REDIS_URL": r.url,
                    "SHARDQ_SHARD_ID": i,
                    "SHARDQ_METRICS_PORT": port,
                    "SHARDQ_INSTANCE_ID": f"soak-shard-{i}{role}",
                }
                self.spawn(f"shard-{i}{role}", "shardq.shard", env, port)

    def named(self, prefix: str) -> list[Child]:
        return [c for c in self.children if c.name.startswith(prefix)]

    def kill(self, child: Child) -> None:
        if child.proc.poll() is None:
            child.proc.kill()
        child.proc.wait(10)

    def restart(self, child: Child) -> Child:
        """``child`` again, as it was first started (same ports, same environment)."""
        self.kill(child)
        self.children.remove(child)
        module, env, ops_port = self.specs[child.name]
        return self.spawn(child.name, module, env, ops_port)

    def shard_addresses(self) -> list[str]:
        return [f"127.0.0.1:{r.port}" for r in self.redis]

    def stop(self) -> None:
        for c in self.named("worker-"):  # none may be left frozen: it could not drain
            if c.proc.poll() is None:
                c.proc.send_signal(signal.SIGCONT)
        super().stop()


Fault = Callable[[SoakCluster, random.Random], Awaitable[str]]
#: One submit: its handler, payload and options (``request_id`` among them).
JobArgs = tuple[str, Any, JobOptions]


async def worker_kill(cluster: SoakCluster, rng: random.Random) -> str:
    victim = rng.choice(cluster.named("worker-"))
    cluster.kill(victim)
    await asyncio.sleep(1)
    cluster.restart(victim)
    return victim.name


async def worker_freeze(cluster: SoakCluster, rng: random.Random) -> str:
    victim = rng.choice(cluster.named("worker-"))
    victim.proc.send_signal(signal.SIGSTOP)
    try:
        await asyncio.sleep(LEASE_MS / 1000 + 2)  # past its lease: its jobs go to others
    finally:
        victim.proc.send_signal(signal.SIGCONT)
    return victim.name


async def redis_kill(cluster: SoakCluster, rng: random.Random) -> str:
    i = rng.randrange(len(cluster.redis))
    shard = cluster.redis[i]
    shard.kill()
    shard.stop()  # closes what is left of the killed process
    await asyncio.sleep(0.5)
    shard.start()  # same port, same AOF dir; from this thread, for its parent-death signal
    cluster.write_pids()
    return f"shard {i}"


async def postgres_cut(cluster: SoakCluster, rng: random.Random) -> str:
    assert cluster.proxy is not None
    cluster.proxy.cut()
    try:
        await asyncio.sleep(POSTGRES_CUT_S)
    finally:
        cluster.proxy.restore()
    return f"{POSTGRES_CUT_S:.0f} s"


async def loop_kill(cluster: SoakCluster, rng: random.Random) -> str:
    i = rng.randrange(len(cluster.redis))
    loops = cluster.named(f"shard-{i}")
    roles = [await asyncio.to_thread(healthz, c.ops_port) for c in loops]
    leaders = [c for c, h in zip(loops, roles, strict=True) if h and h.get("role") == "leader"]
    victim = leaders[0] if leaders else rng.choice(loops)
    cluster.kill(victim)
    await asyncio.sleep(1)
    cluster.restart(victim)  # back as the standby
    return victim.name + ("" if leaders else " (no leader seen)")


async def coordinator_kill(cluster: SoakCluster, rng: random.Random) -> str:
    (coordinator,) = cluster.named("coordinator")
    cluster.kill(coordinator)
    await asyncio.sleep(1)
    cluster.restart(coordinator)
    return "coordinator"


FAULT_FUNCTIONS: dict[str, Fault] = {
    "worker-kill": worker_kill,
    "worker-freeze": worker_freeze,
    "redis-kill": redis_kill,
    "postgres-cut": postgres_cut,
    "loop-kill": loop_kill,
    "coordinator-kill": coordinator_kill,
}


class Load:
    """Submits at ``rate`` a second over ``tenants``, each submit with its own request_id and
    the client's default retry policy (or ``retry``); what was accepted goes to ``accepted``.
    ``job`` makes the n-th submit (default: the soak's mix of the example handlers)."""

    def __init__(
        self,
        target: str,
        token: str,
        tenants: list[str],
        rate: float,
        rng: random.Random,
        *,
        job: Callable[[int], JobArgs] | None = None,
        retry: RetryPolicy | None = None,
    ) -> None:
        self.clients = {
            t: AsyncClient(target, token, tenant_id=t, retry=retry or RetryPolicy())
            for t in tenants
        }
        self.make_job = job or self.job
        self.tenants = tenants
        self.rate = rate
        self.rng = rng
        self.accepted = Accepted()
        self.refused: Counter[str] = Counter()
        self.submitted = 0
        #: Request IDs of the jobs given max_attempts=1: the only ones a fault may kill.
        self.mortal: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    def job(self, n: int) -> JobArgs:
        """The n-th submit: handler, payload, options (its request_id among them)."""
        rid = f"soak-{n}"
        roll = self.rng.random()
        if roll < 0.5:
            return "sleep", {"ms": self.rng.randint(5, 200)}, {"request_id": rid}
        if roll < 0.8:
            payload = {"account": f"acct-{n % 7}", "amount": 1 + n % 5}
            return "ledger.add", payload, {"request_id": rid}
        if roll < 0.9:
            delay = timedelta(milliseconds=self.rng.randint(500, 5_000))
            return "echo", {"n": n}, {"request_id": rid, "delay": delay}
        ms = self.rng.randint(50, 500)
        self.mortal.add(rid)
        return "sleep", {"ms": ms}, {"request_id": rid, "max_attempts": 1}

    async def _submit(self, tenant: str, n: int) -> None:
        handler, payload, options = self.make_job(n)
        try:
            sub = await self.clients[tenant].submit(handler, payload, **options)
        except grpc.aio.AioRpcError as exc:
            self.refused[exc.code().name] += 1
        except ShardqError as exc:
            self.refused[type(exc).__name__] += 1
        else:
            self.accepted.add(tenant, str(options["request_id"]), sub.job_id)

    async def run(self, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        start = loop.time()
        while not stop.is_set():
            due = start + self.submitted / self.rate
            if due > loop.time():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), due - loop.time())
                continue
            tenant = self.rng.choice(self.tenants)
            task = asyncio.create_task(self._submit(tenant, self.submitted))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            self.submitted += 1
        await asyncio.gather(*self._tasks)

    async def close(self) -> None:
        await asyncio.gather(*(c.close() for c in self.clients.values()))


def _say(text: str) -> None:
    print(text, flush=True)


def _cluster_args(args: argparse.Namespace, data_dir: str) -> argparse.Namespace:
    """The ``shardq dev`` settings of the soak's cluster: free ports, the example handlers."""
    base = free_port()
    while not all(port_is_free(base + i) for i in range(args.shards)):
        base = free_port()
    return argparse.Namespace(
        shards=args.shards,
        workers=args.workers,
        port=free_port(),
        data_dir=data_dir,
        redis_base_port=base,
        database_url=args.database_url,
        token=[],
        admin_token="",
        handlers=DEFAULT_HANDLERS,
        key_prefix="shardq",
        concurrency=16,
        process_pool_size=0,
        log_level="WARNING",
        no_dashboard=True,  # nothing of the soak's reads it; a process less to share the cores
        dashboard_port=0,
    )


async def _inject(
    cluster: SoakCluster, kinds: list[str], every_s: float, rng: random.Random,
    stop: asyncio.Event, done: Counter[str],
) -> None:  # fmt: skip
    while True:
        try:
            await asyncio.wait_for(stop.wait(), every_s)
            return
        except TimeoutError:
            pass
        kind = rng.choice(kinds)
        what = await FAULT_FUNCTIONS[kind](cluster, rng)
        done[kind] += 1
        _say(f"soak: fault {kind}: {what}")


async def soak(args: argparse.Namespace, cluster: SoakCluster, seconds: float) -> Reconciliation:
    seed = args.seed if args.seed is not None else random.randrange(1 << 32)
    rng = random.Random(seed)
    kinds = [k.strip() for k in args.faults.split(",") if k.strip()]
    assert cluster.tokens is not None
    tenants = [f"soak-t{i}" for i in range(args.tenants)]
    load = Load(cluster.target, cluster.tokens.admin, tenants, args.rate, random.Random(seed + 1))
    stop = asyncio.Event()
    faults: Counter[str] = Counter()
    _say(
        f"soak: seed {seed}, {seconds:.0f} s, {args.rate:g} submits/s over {len(tenants)} "
        f"tenants, a fault every {args.fault_every_s:g} s from {', '.join(kinds)}"
    )
    started = time.monotonic()
    tasks = [
        asyncio.create_task(load.run(stop)),
        asyncio.create_task(_inject(cluster, kinds, args.fault_every_s, rng, stop, faults)),
    ]
    try:
        while time.monotonic() - started < seconds:
            await asyncio.sleep(min(30.0, max(0.0, seconds - (time.monotonic() - started))))
            _say(
                f"soak: {time.monotonic() - started:.0f} s, {len(load.accepted)} accepted, "
                f"{sum(load.refused.values())} refused, {sum(faults.values())} faults"
            )
        stop.set()
        await asyncio.gather(*tasks)
    finally:
        stop.set()
        for t in tasks:
            t.cancel()
        await load.close()
    ended = time.monotonic()
    _say(f"soak: load and faults stopped; waiting up to {args.settle_s:g} s for every job to end")
    report = await settle(
        load.accepted,
        database_url=cluster.direct_url,
        shards=cluster.shard_addresses(),
        key_prefix="shardq",
        faults_ended_at=ended,
        deadline_s=args.settle_s,
        side_effect_table=LEDGER_TABLE,
        side_effect_handlers={"ledger.add"},
        # Five attempts outlast the faults of a soak: only max_attempts=1 jobs may die.
        may_die=lambda key: key[1] in load.mortal,
    )
    report.extra.update(
        {
            "seed": seed,
            "load": f"{ended - started:.0f} s, {load.submitted} submits, {len(tenants)} tenants",
            "submits refused": dict(load.refused) or 0,
            "faults": ", ".join(f"{k} {n}" for k, n in sorted(faults.items())) or "none",
        }
    )
    return report


async def run(args: argparse.Namespace) -> int:
    """``shardq soak``: 0 when the reconciliation is OK, 1 when not (or the cluster failed)."""
    seconds = args.seconds if args.seconds is not None else 60 * (args.minutes or 5)
    unknown = {k.strip() for k in args.faults.split(",") if k.strip()} - set(FAULTS)
    if unknown or args.rate <= 0 or args.tenants < 1:
        why = f"unknown faults {sorted(unknown)}" if unknown else "--rate and --tenants must be > 0"
        print(f"shardq soak: error: {why} (faults: {', '.join(FAULTS)})", file=sys.stderr)
        return 2
    data_dir = args.data_dir or tempfile.mkdtemp(prefix="shardq-soak-")
    cluster = SoakCluster(_cluster_args(args, data_dir))
    never = asyncio.Event()
    try:
        await cluster.start(never)
        _say(f"soak: cluster up in {data_dir} (logs in {cluster.logs})")
        report = await soak(args, cluster, seconds)
    except DevError as exc:
        print(f"shardq soak: error: {exc}", file=sys.stderr)
        return 1
    finally:
        cluster.stop()
        if cluster.proxy is not None:
            await cluster.proxy.stop()
        if not args.data_dir:
            shutil.rmtree(data_dir, ignore_errors=True)
    _say(report.render())
    return 0 if report.ok else 1
