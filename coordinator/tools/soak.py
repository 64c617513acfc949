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
(restarted on its port; the clients' default retry budget rides it out). With ``--replicas
N`` each shard is a primary, N replicas and three sentinels (its address in the shard map a
``sentinel://`` one, every process waiting for a replica after each write), and one more
fault: a failover (the shard's primary killed, a replica promoted by the sentinels, the old
primary back as a replica); ``redis-kill`` then kills a replica.

Recovery time counts from the end of the last fault (not of the load) to every accepted job
final; the report says how long before the end of the load that fault ended.

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
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import grpc
import redis

from shardq.client import AsyncClient, JobOptions, RetryPolicy
from shardq.common import config
from shardq.common.errors import ShardqError
from shardq.coordinator.tools.data_dir import tokens_path
from shardq.coordinator.tools.dev import DEFAULT_HANDLERS, DevError
from shardq.coordinator.tools.dev.cluster import DevCluster
from shardq.coordinator.tools.dev.database import prepare_database
from shardq.coordinator.tools.dev.processes import Child, healthz, port_is_free
from shardq.coordinator.tools.faults import CuttableProxy
from shardq.coordinator.tools.reconcile import Accepted, Reconciliation, settle
from shardq.coordinator.tools.redis_server import RedisProcess, SentinelProcess, free_port

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
#: Faults that need replicas (``--replicas``).
REPLICA_FAULTS = ("failover",)
#: Longest wait for the sentinels to promote a replica, in s.
FAILOVER_WAIT_S = 60.0


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
        default=None,
        help=f"the faults to draw from, comma-separated (default all: {','.join(FAULTS)}, "
        f"and {','.join(REPLICA_FAULTS)} with --replicas)",
    )
    parser.add_argument(
        "--replicas",
        type=int,
        default=0,
        help="replicas per shard, with three sentinels and --shard-replicas-to-ack 1 "
        "(default 0: a lone Redis per shard)",
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


@dataclass
class SentinelGroup:
    """One shard's Redis (the first started as its primary) and the sentinels watching it."""

    name: str
    nodes: list[RedisProcess]
    sentinels: list[SentinelProcess] = field(default_factory=list)

    @property
    def address(self) -> str:
        return f"sentinel://{','.join(s.address for s in self.sentinels)}/{self.name}"

    def primary_port(self) -> int | None:
        """The primary's port as the first sentinel that answers names it now (None: none
        answers)."""
        for s in self.sentinels:
            reply = self._ask(s, "GET-MASTER-ADDR-BY-NAME")
            if reply:
                return int(reply[1])
        return None

    def settled_on(self, port: int) -> bool:
        """Whether every sentinel names ``port`` as the primary, at one config epoch, with no
        failover in progress."""
        masters = self.masters()
        return (
            all(
                m is not None
                and int(m[b"port"]) == port
                and b"failover_in_progress" not in m[b"flags"]
                for m in masters
            )
            and len({m[b"config-epoch"] for m in masters if m is not None}) == 1
        )

    def masters(self) -> list[dict[bytes, bytes] | None]:
        """SENTINEL MASTER's fields for the shard, as each sentinel gives them (None: that one
        does not answer)."""
        out: list[dict[bytes, bytes] | None] = []
        for s in self.sentinels:
            m = self._ask(s, "MASTER")
            out.append(dict(zip(m[::2], m[1::2], strict=True)) if isinstance(m, list) else m)
        return out

    def _ask(self, sentinel: SentinelProcess, command: str) -> Any:
        """Sentinel's reply to ``SENTINEL <command> <shard>``, None when it does not answer."""
        # Untyped: redis-py's sync annotations say "Awaitable | Any" for every reply.
        client: Any = redis.Redis(port=sentinel.port, socket_timeout=2, socket_connect_timeout=1)
        try:
            return client.execute_command("SENTINEL", command, self.name)
        except redis.RedisError:
            return None
        finally:
            client.close()


def _wait(what: str, check: Callable[[], bool], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise DevError(f"{what}: not within {timeout_s:.0f} s")
        time.sleep(0.1)


def _role(port: int) -> str:
    """INFO replication's role ("master", "slave"), "" when it does not answer."""
    with contextlib.suppress(redis.RedisError):
        client: Any = redis.Redis(port=port, socket_timeout=2)
        try:
            return str(client.info("replication")["role"])
        finally:
            client.close()
    return ""


def _replicas_online(port: int) -> int:
    with contextlib.suppress(redis.RedisError):
        client: Any = redis.Redis(port=port, socket_timeout=2)
        try:
            info = client.info("replication")
        finally:
            client.close()
        return sum(
            1
            for k, v in info.items()
            if k.startswith("slave") and isinstance(v, dict) and v.get("state") == "online"
        )
    return 0


class SoakCluster(DevCluster):
    """``shardq dev``'s cluster, with what the faults need: every process restartable as it
    was started, a standby shard loop per shard, and Postgres behind a cuttable proxy."""

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args)
        self.specs: dict[str, tuple[str, dict[str, object], int]] = {}
        self.proxy: CuttableProxy | None = None
        #: The database past the proxy: the reconciliation reads it during a cut too.
        self.direct_url = ""
        #: With --replicas: per shard, its Redis and sentinels.
        self.groups: list[SentinelGroup] = []

    def _start_redis(self) -> None:
        super()._start_redis()
        replicas = getattr(self.args, "replicas", 0)
        if not replicas:
            return
        for i, primary in enumerate(self.redis):
            group = SentinelGroup(f"shard-{i}", [primary])
            self.groups.append(group)
            for j in range(replicas):
                args = ["--replicaof", "127.0.0.1", str(primary.port), "--loglevel", "notice"]
                args += ["--logfile", str(self.logs / f"redis-{i}-r{j}.log")]
                node = RedisProcess(data_dir=self.data_dir / f"redis-{i}-r{j}", extra_args=args)
                group.nodes.append(node.start())

            def synced(port: int = primary.port) -> bool:
                return _replicas_online(port) >= replicas

            def watched(g: SentinelGroup = group) -> bool:
                return g.primary_port() is not None

            _wait(f"shard {i}'s replicas in sync", synced)
            group.sentinels = [SentinelProcess(group.name, primary.port).start() for _ in range(3)]
            _wait(f"shard {i}'s sentinels", watched)
        self.write_pids()

    def _sentinels_ready(self) -> bool:
        """Every sentinel knows the two others and every replica (a failover needs that)."""
        return all(
            m is not None
            and int(m[b"num-other-sentinels"]) >= 2
            and int(m[b"num-slaves"]) >= len(g.nodes) - 1
            for g in self.groups
            for m in g.masters()
        )

    def _common_env(self) -> dict[str, object]:
        env = super()._common_env()
        if self.groups:
            env["SHARDQ_SHARD_REPLICAS_TO_ACK"] = 1
        return env

    def pids(self) -> dict[str, int]:
        out = super().pids()
        for i, g in enumerate(self.groups):
            for j, node in enumerate(g.nodes[1:]):
                if node.proc is not None:
                    out[f"redis-{i}-r{j}"] = node.proc.pid
            for j, s in enumerate(g.sentinels):
                if s.proc is not None:
                    out[f"sentinel-{i}-{j}"] = s.proc.pid
        return out

    def spawn(self, name: str, module: str, env: dict[str, object], ops_port: int = 0) -> Child:
        if module == "shardq.worker":
            env = {**env, "SHARDQ_LEASE_MS": LEASE_MS}
        self.specs[name] = (module, env, ops_port)
        return super().spawn(name, module, env, ops_port)

    async def _prepare_database(self) -> None:
        if self.groups:
            await asyncio.to_thread(
                _wait, "the sentinels to know each other and the replicas", self._sentinels_ready
            )
            assert self.tokens is not None
            await prepare_database(
                self.database_url,
                self.shard_addresses(),
                self.tokens,
                tokens_path(self.data_dir),
                "the data dir" if self.postgres else self.database_url,
            )
        else:
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
        # A loop takes a redis:// URL, or a sentinel:// address.
        urls = [g.address for g in self.groups] or [r.url for r in self.redis]
        for i, address in enumerate(urls):
            for role in ("a", "b"):  # a leader and a standby: either may lead
                port = free_port()
                env = {
                    **self._common_env(),
                    "SHARDQ_REDIS_URL": address,
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
        if self.groups:
            return [g.address for g in self.groups]
        return [f"127.0.0.1:{r.port}" for r in self.redis]

    def stop(self) -> None:
        for c in self.named("worker-"):  # none may be left frozen: it could not drain
            if c.proc.poll() is None:
                c.proc.send_signal(signal.SIGCONT)
        super().stop()
        for g in self.groups:
            for sentinel in g.sentinels:
                sentinel.cleanup()
            for node in g.nodes[1:]:  # the first is in self.redis, stopped above
                node.stop()


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
    what = f"shard {i}"
    if cluster.groups:
        # A replica: the primary's crash is the failover fault. (A primary restarted at once
        # on an AOF of appendfsync everysec comes back without its last second, and its
        # replicas resynchronise from it: the writes they had acknowledged go too.)
        group = cluster.groups[i]
        primary = await asyncio.to_thread(group.primary_port)
        shard = rng.choice([n for n in group.nodes if n.port != primary])
        what = f"shard {i} replica {shard.port}"
    shard.kill()
    shard.stop()  # closes what is left of the killed process
    await asyncio.sleep(0.5)
    shard.start()  # same port, same AOF dir; from this thread, for its parent-death signal
    cluster.write_pids()
    return what


async def failover(cluster: SoakCluster, rng: random.Random) -> str:
    """kill -9 of a shard's primary; once the sentinels have promoted a replica, the killed
    Redis comes back on its port and AOF dir, and the sentinels make it a replica."""
    i = rng.randrange(len(cluster.groups))
    group = cluster.groups[i]
    old = await asyncio.to_thread(group.primary_port)
    victims = [n for n in group.nodes if n.port == old]
    if not victims:
        return f"shard {i}: no sentinel named its primary (none killed)"
    (victim,) = victims
    victim.kill()
    victim.stop()
    deadline = time.monotonic() + FAILOVER_WAIT_S
    new: int | None = old
    while new in (old, None) and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
        new = await asyncio.to_thread(group.primary_port)
    # Back only once the failover is over for every sentinel (each names the new primary, at
    # one config epoch, none still failing over): one that still names the old primary when
    # it returns (its AOF intact, up as a primary) can turn the new one back into its replica.
    while time.monotonic() < deadline and new not in (old, None):
        if await asyncio.to_thread(group.settled_on, new):
            break
        await asyncio.sleep(0.2)
    victim.start()
    cluster.write_pids()
    # The fault lasts until the shard is whole again: the sentinels make a primary that comes
    # back a replica only after seeing it up for a while (~10 s with their defaults), and
    # until then a shard with one replica takes no acknowledged write.
    rejoined = False
    while not rejoined and time.monotonic() < deadline:
        rejoined = await asyncio.to_thread(_role, victim.port) == "slave"
        await asyncio.sleep(0 if rejoined else 0.2)
    if new in (old, None):
        return f"shard {i}: primary {old} killed, no replica promoted within {FAILOVER_WAIT_S:g} s"
    back = "back as a replica" if rejoined else f"not a replica within {FAILOVER_WAIT_S:g} s"
    return f"shard {i}: primary {old} -> {new}, {old} {back}"


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
    "failover": failover,
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


def _fault_kinds(args: argparse.Namespace) -> list[str]:
    """The faults --faults names, else every one this cluster can have."""
    if args.faults is None:
        return [*FAULTS, *(REPLICA_FAULTS if args.replicas > 0 else ())]
    return [k.strip() for k in args.faults.split(",") if k.strip()]


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
        replicas=args.replicas,
    )


async def _inject(
    cluster: SoakCluster, kinds: list[str], every_s: float, rng: random.Random,
    stop: asyncio.Event, done: Counter[str], last_end: list[float],
) -> None:  # fmt: skip
    """Inject a fault every ``every_s`` until ``stop``; ``last_end`` gets the monotonic time
    the last one ended (recovery is counted from it)."""
    while True:
        try:
            await asyncio.wait_for(stop.wait(), every_s)
            return
        except TimeoutError:
            pass
        kind = rng.choice(kinds)
        try:
            what = await FAULT_FUNCTIONS[kind](cluster, rng)
        finally:
            last_end[:] = [time.monotonic()]
        done[kind] += 1
        _say(f"soak: fault {kind}: {what}")


async def soak(args: argparse.Namespace, cluster: SoakCluster, seconds: float) -> Reconciliation:
    seed = args.seed if args.seed is not None else random.randrange(1 << 32)
    rng = random.Random(seed)
    kinds = _fault_kinds(args)
    assert cluster.tokens is not None
    tenants = [f"soak-t{i}" for i in range(args.tenants)]
    load = Load(cluster.target, cluster.tokens.admin, tenants, args.rate, random.Random(seed + 1))
    stop = asyncio.Event()
    faults: Counter[str] = Counter()
    last_fault_end: list[float] = []
    _say(
        f"soak: seed {seed}, {seconds:.0f} s, {args.rate:g} submits/s over {len(tenants)} "
        f"tenants, a fault every {args.fault_every_s:g} s from {', '.join(kinds)}"
    )
    started = time.monotonic()
    tasks = [
        asyncio.create_task(load.run(stop)),
        asyncio.create_task(
            _inject(cluster, kinds, args.fault_every_s, rng, stop, faults, last_fault_end)
        ),
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
        # From the last fault's end: the end of the load would leave out the time the
        # cluster took to come back from a fault that ended long before (or count none).
        faults_ended_at=last_fault_end[0] if last_fault_end else ended,
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
            "last fault": (
                f"ended {ended - last_fault_end[0]:.1f} s before the end of the load"
                if last_fault_end
                else "none (recovery counted from the end of the load)"
            ),
            "replicas": getattr(args, "replicas", 0),
        }
    )
    return report


async def run(args: argparse.Namespace) -> int:
    """``shardq soak``: 0 when the reconciliation is OK, 1 when not (or the cluster failed)."""
    seconds = args.seconds if args.seconds is not None else 60 * (args.minutes or 5)
    kinds = set(_fault_kinds(args))
    unknown = kinds - set(FAULTS) - set(REPLICA_FAULTS)
    why = ""
    if unknown:
        why = f"unknown faults {sorted(unknown)}"
    elif kinds & set(REPLICA_FAULTS) and args.replicas < 1:
        why = f"{', '.join(sorted(kinds & set(REPLICA_FAULTS)))} needs --replicas 1 or more"
    elif args.rate <= 0 or args.tenants < 1 or args.replicas < 0:
        why = "--rate and --tenants must be > 0, --replicas >= 0"
    if why:
        known = ", ".join((*FAULTS, *REPLICA_FAULTS))
        print(f"shardq soak: error: {why} (faults: {known})", file=sys.stderr)
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
