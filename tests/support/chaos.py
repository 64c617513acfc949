"""What the chaos tests share: worker processes that log their handler runs, a load across
tenants (``shardq soak``'s :class:`Load`), shard-loop processes, a coordinator process that
can be killed and restarted on its port, and the reconciliation at the end (the package's,
the one ``shardq soak`` prints)."""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import text

from shardq.client import RetryPolicy
from shardq.coordinator.tools.reconcile import Accepted, Key, Reconciliation, settle
from shardq.coordinator.tools.redis_server import free_port, parent_death_prefix
from shardq.coordinator.tools.soak import JobArgs, Load
from shardq.store.db import make_engine
from tests.support.chaos_handlers import LEDGER, LEDGER_DDL, runs_in
from tests.support.cluster import Cluster
from tests.support.procs import WorkerProcess, start_worker

HANDLERS = "tests.support.handlers,tests.support.chaos_handlers"


async def create_ledger(database_url: str) -> None:
    """The side-effect table of ``chaos.ledger`` (made before any worker runs)."""
    engine = make_engine(database_url)
    try:
        async with engine.begin() as conn:
            await conn.execute(text(LEDGER_DDL))
    finally:
        await engine.dispose()


def ledger_jobs(
    prefix: str, rng: random.Random, ms: tuple[int, int] = (20, 150), **options: Any
) -> Callable[[int], JobArgs]:
    """The n-th submit of a load: a ``chaos.ledger`` job ``{prefix}-{n}`` sleeping ``ms``."""

    def make(n: int) -> JobArgs:
        payload = {"n": n, "ms": rng.randint(*ms), "amount": 1 + n % 7}
        return "chaos.ledger", payload, {"request_id": f"{prefix}-{n}", **options}

    return make


@dataclass
class RunningLoad:
    """A :class:`Load` submitting in the background until :meth:`stop`."""

    load: Load
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _task: asyncio.Task[None] | None = None

    def start(self) -> RunningLoad:
        self._task = asyncio.create_task(self.load.run(self._stop))
        return self

    @property
    def accepted(self) -> Accepted:
        return self.load.accepted

    async def until_accepted(self, count: int, timeout_s: float = 60) -> None:
        async with asyncio.timeout(timeout_s):
            while len(self.load.accepted) < count:
                assert self._task is not None and not self._task.done(), "the load stopped"
                await asyncio.sleep(0.05)

    async def stop(self) -> Accepted:
        """Stop submitting, wait for the submits in flight (retries included), close."""
        self._stop.set()
        if self._task is not None:
            await self._task
        await self.load.close()
        return self.load.accepted


def load_on(
    target: str,
    token: str,
    job: Callable[[int], JobArgs],
    *,
    rate: float = 40,
    tenants: int = 4,
    retry: RetryPolicy | None = None,
    seed: int = 7,
) -> RunningLoad:
    """A load started on ``target`` with ``token`` (the admin's: it acts for every tenant)."""
    names = [f"t{i}" for i in range(tenants)]
    load = Load(target, token, names, rate, random.Random(seed), job=job, retry=retry)
    return RunningLoad(load).start()


@dataclass
class Chaos:
    """A test cluster whose workers are processes that log every handler run."""

    cluster: Cluster
    runs_file: str
    workers: list[WorkerProcess] = field(default_factory=list)
    _count: int = 0

    def start_worker(self, **flags: Any) -> WorkerProcess:
        self._count += 1
        flags.setdefault("concurrency", 8)
        w = start_worker(
            self.cluster,
            f"w-{self._count}",
            handlers=HANDLERS,
            test_chaos_runs_file=self.runs_file,
            **flags,
        )
        self.workers.append(w)
        return w

    def alive(self) -> list[WorkerProcess]:
        return [w for w in self.workers if w.proc.poll() is None]

    def stop_workers(self) -> None:
        for w in self.workers:
            w.stop()

    def runs(self) -> dict[Key, list[int]]:
        return runs_in(self.runs_file)

    def shard_addresses(self) -> list[str]:
        return [f"127.0.0.1:{p.port}" for p in self.cluster.shards]

    async def reconcile(
        self,
        accepted: Accepted,
        *,
        faults_ended_at: float,
        deadline_s: float = 90,
        may_die: Callable[[Key], bool] | None = None,
        database_url: str | None = None,
    ) -> Reconciliation:
        """Wait for every accepted job to end, reconcile, print the figures (``-s``)."""
        report = await settle(
            accepted,
            database_url=database_url or self.cluster.database_url,
            shards=self.shard_addresses(),
            key_prefix=self.cluster.settings.shard.key_prefix,
            faults_ended_at=faults_ended_at,
            deadline_s=deadline_s,
            side_effect_table=LEDGER,
            side_effect_handlers={"chaos.ledger", "chaos.ledger_gated"},
            runs=self.runs,
            may_die=may_die or (lambda _key: False),
        )
        print(report.render())
        return report


def chaos_of(cluster: Cluster, tmp_path: Path) -> Chaos:
    return Chaos(cluster, str(tmp_path / "runs"))


# --- shard loops as processes ----------------------------------------------------------------


@dataclass
class LoopProcess:
    name: str
    proc: subprocess.Popen[bytes]
    ops_port: int

    def role(self) -> str:
        """``leader``, ``standby``, or ``down`` when its /healthz does not answer."""
        try:
            url = f"http://127.0.0.1:{self.ops_port}/healthz"
            with urllib.request.urlopen(url, timeout=1) as r:
                return str(json.loads(r.read()).get("role", "down"))
        except OSError:
            return "down"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def start_loop(cluster: Cluster, shard_id: int, name: str, database_url: str) -> LoopProcess:
    """A ``shardq-shard`` process for one of ``cluster``'s shards, writing rows of ended jobs."""
    port = free_port()
    env = {
        **os.environ,
        "SHARDQ_REDIS_URL": cluster.shards[shard_id].url,
        "SHARDQ_SHARD_ID": str(shard_id),
        "SHARDQ_DATABASE_URL": database_url,
        "SHARDQ_KEY_PREFIX": cluster.settings.shard.key_prefix,
        "SHARDQ_LEADER_TTL_MS": "1000",
        "SHARDQ_REAP_INTERVAL_MS": "100",
        "SHARDQ_RECONCILE_INTERVAL_S": "1",
        "SHARDQ_INSTANCE_ID": name,
        "SHARDQ_METRICS_PORT": str(port),
        "SHARDQ_LOG_LEVEL": "WARNING",
    }
    cmd = [*parent_death_prefix(), sys.executable, "-m", "shardq.shard"]
    return LoopProcess(name, subprocess.Popen(cmd, env=env), port)


async def wait_for_leaders(loops: Sequence[LoopProcess], timeout_s: float = 30) -> LoopProcess:
    """The one leader among ``loops`` (of one shard), once there is exactly one."""
    async with asyncio.timeout(timeout_s):
        while True:
            roles = [await asyncio.to_thread(lp.role) for lp in loops]
            if roles.count("leader") == 1:
                return loops[roles.index("leader")]
            await asyncio.sleep(0.05)


# --- a coordinator process that can die and come back on its port ----------------------------


@dataclass
class CoordinatorProcess:
    """``python -m shardq.coordinator.server`` on a fixed port: kill -9 it, start it again."""

    database_url: str
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> CoordinatorProcess:
        env = {
            **os.environ,
            "SHARDQ_LISTEN": self.target,
            "SHARDQ_METRICS_PORT": str(free_port()),
            "SHARDQ_DATABASE_URL": self.database_url,
            "SHARDQ_KEY_PREFIX": "sq",
            "SHARDQ_SHUTDOWN_GRACE_S": "1",
            "SHARDQ_LOG_LEVEL": "WARNING",
        }
        cmd = [*parent_death_prefix(), sys.executable, "-m", "shardq.coordinator.server"]
        self.proc = subprocess.Popen(cmd, env=env)
        return self

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
