"""Everything ``shardq dev`` runs, started in the order data flows (Postgres and Redis, the
schema and shard map, the coordinator, the shard loops, the workers) and stopped the other way
round; ``<data-dir>/pids.json`` names every process while it runs."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from redis.asyncio import Redis

from shardq.client import AsyncClient, RetryPolicy
from shardq.common import config
from shardq.coordinator.tools.data_dir import ENV_FILE, Tokens, tokens_path
from shardq.coordinator.tools.dev.database import load_tokens, prepare_database
from shardq.coordinator.tools.dev.postgres import EmbeddedPostgres
from shardq.coordinator.tools.dev.processes import (
    Child,
    DevError,
    healthz,
    lost_port,
    port_is_free,
    start_child,
    tail,
    wait_or_kill,
)
from shardq.coordinator.tools.redis_server import RedisProcess, free_port
from shardq.shard.client import ShardClient
from shardq.shard.models import ShardSettings

#: The embedded Postgres's port, kept in the data dir from one start to the next.
POSTGRES_PORT_FILE = "postgres.port"
#: Starts of one child that may each lose its metrics port to another program.
PORT_ATTEMPTS = 3


class DevCluster:
    """Everything ``shardq dev`` starts, and the order it stops it in."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.data_dir = Path(args.data_dir).expanduser().resolve()
        self.logs = self.data_dir / "logs"
        self.target = f"127.0.0.1:{args.port}"
        self.database_url = ""
        self.tokens: Tokens | None = None
        self.postgres: EmbeddedPostgres | None = None
        self.redis: list[RedisProcess] = []
        self.children: list[Child] = []
        self._lock: IO[str] | None = None
        #: The dashboard's address once started ("" with --no-dashboard).
        self.dashboard_url = ""

    # Processes are started from the main thread only (see start_child).
    def spawn(self, name: str, module: str, env: dict[str, object], ops_port: int = 0) -> Child:
        child = start_child(name, module, env, self.logs / f"{name}.log", ops_port)
        self.children.append(child)
        self.write_pids()
        return child

    def respawn_lost_ports(self, pending: set[str]) -> None:
        """Start again, on a new port, each child not yet serving that exited because another
        program bound its metrics port first.

        free_port() lets the port go before the child binds it, so any other process on the
        machine can take it in between (a test run beside this one, say); a clash is the only
        early exit that a new start mends, so it is the only one retried, a few times."""
        for index, child in enumerate(self.children):
            lost = child.lost_ports
            if child.name not in pending or child.proc.poll() is None or lost >= PORT_ATTEMPTS:
                continue
            port = int(str(child.env.get("SHARDQ_METRICS_PORT", 0)))
            if not port or not lost_port(child.log, child.log_start, port):
                continue
            new_port = free_port()
            env = {**child.env, "SHARDQ_METRICS_PORT": new_port}
            ops_port = new_port if child.ops_port else 0
            again = start_child(child.name, child.module, env, child.log, ops_port)
            again.lost_ports = lost + 1
            self.children[index] = again
            self.write_pids()

    def pids(self) -> dict[str, int]:
        out = {f"redis-{i}": r.proc.pid for i, r in enumerate(self.redis) if r.proc is not None}
        if self.postgres is not None and self.postgres.proc is not None:
            out["postgres"] = self.postgres.proc.pid
        out.update({c.name: c.pid for c in self.children})
        return out

    def write_pids(self, running: bool = True) -> None:
        doc = {"dev": os.getpid(), "running": running, "processes": self.pids()}
        tmp = self.data_dir / "pids.json.tmp"
        tmp.write_text(json.dumps(doc, indent=2))
        tmp.replace(self.data_dir / "pids.json")

    def lock_data_dir(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(exist_ok=True)
        self._lock = open(self.data_dir / "dev.lock", "w")  # noqa: SIM115 - held while running
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise DevError(
                f"another `shardq dev` is running on {self.data_dir}; stop it or pass --data-dir"
            ) from exc

    def check_ports(self) -> None:
        ports = {"--port": [self.args.port]}
        ports["--redis-base-port"] = [
            self.args.redis_base_port + i for i in range(self.args.shards)
        ]
        for flag, wanted in ports.items():
            busy = [p for p in wanted if not port_is_free(p)]
            if busy:
                raise DevError(
                    f"port {', '.join(map(str, busy))} is in use; pick others with {flag}"
                )

    async def start(self, stopping: asyncio.Event) -> None:
        args = self.args
        if args.shards < 1 or args.workers < 0 or args.process_pool_size < 0:
            raise DevError(
                "--shards must be at least 1, --workers and --process-pool-size at least 0"
            )
        self.lock_data_dir()
        self.check_ports()
        self.tokens = load_tokens(tokens_path(self.data_dir), args)
        steps: list[Callable[[], Any]] = [
            self._start_database,
            self._start_redis,
            self._prepare_database,
            self._start_coordinator,
            self._start_shard_loops,
            self._start_workers,
            self._start_dashboard,
            self._wait_until_serving,
            self.write_env_file,
        ]
        for step in steps:
            if stopping.is_set():
                return
            result = step()
            if asyncio.iscoroutine(result):
                await result

    def _start_database(self) -> None:
        if self.args.database_url:
            self.database_url = self.args.database_url
            return
        self.postgres = EmbeddedPostgres(self.data_dir / "postgres", self.logs / "postgres.log")
        # The port of the last run, so the URL in shardq.env (and in any shell or tool the
        # user pointed at it) stays right across restarts; a new one only when it is taken.
        port_file = self.data_dir / POSTGRES_PORT_FILE
        with contextlib.suppress(OSError, ValueError):
            self.postgres.port = int(port_file.read_text())
        try:
            self.database_url = self.postgres.start()
        finally:
            self.write_pids()
        port_file.write_text(f"{self.postgres.port}\n")

    def _start_redis(self) -> None:
        for i in range(self.args.shards):
            log = self.logs / f"redis-{i}.log"
            proc = RedisProcess(
                port=self.args.redis_base_port + i,
                data_dir=self.data_dir / f"redis-{i}",
                appendonly=True,
                extra_args=["--logfile", str(log), "--loglevel", "notice"],
            )
            try:
                proc.start()
            except (RuntimeError, TimeoutError) as exc:
                raise DevError(f"redis-server for shard {i}: {exc} (log: {log})") from exc
            finally:
                self.redis.append(proc)
                self.write_pids()

    async def _prepare_database(self) -> None:
        assert self.tokens is not None
        await prepare_database(
            self.database_url,
            [f"127.0.0.1:{r.port}" for r in self.redis],
            self.tokens,
            tokens_path(self.data_dir),
            "the data dir" if self.postgres else self.database_url,
        )
        # Every process of a local cluster runs this release: its shards may write what only
        # releases since this one read, as a first install does (docs/deploying.md, Upgrading).
        settings = ShardSettings(key_prefix=self.args.key_prefix)
        for r in self.redis:
            redis = Redis.from_url(r.url)
            try:
                await ShardClient(redis, settings).raise_job_format()
            finally:
                await redis.aclose()

    def _common_env(self) -> dict[str, object]:
        return {
            "SHARDQ_DATABASE_URL": self.database_url,
            "SHARDQ_KEY_PREFIX": self.args.key_prefix,
            "SHARDQ_LOG_LEVEL": self.args.log_level,
        }

    def _start_coordinator(self) -> None:
        assert self.tokens is not None
        self.spawn(
            "coordinator",
            "shardq.coordinator.server",
            {
                **self._common_env(),
                "SHARDQ_LISTEN": self.target,
                "SHARDQ_WORKER_TOKEN": self.tokens.worker,
                "SHARDQ_SHUTDOWN_GRACE_S": 2,
                "SHARDQ_METRICS_PORT": free_port(),
            },
        )

    def _start_shard_loops(self) -> None:
        for i, r in enumerate(self.redis):
            port = free_port()
            env = {
                **self._common_env(),
                "SHARDQ_REDIS_URL": r.url,
                "SHARDQ_SHARD_ID": i,
                "SHARDQ_METRICS_PORT": port,
                "SHARDQ_INSTANCE_ID": f"dev-shard-{i}",
            }
            self.spawn(f"shard-{i}", "shardq.shard", env, port)

    def _start_workers(self) -> None:
        assert self.tokens is not None
        for i in range(self.args.workers):
            port = free_port()
            env = {
                **self._common_env(),
                "SHARDQ_HANDLERS": self.args.handlers,
                "SHARDQ_COORDINATOR": self.target,
                "SHARDQ_WORKER_TOKEN": self.tokens.worker,
                "SHARDQ_WORKER_ID": f"dev-worker-{i}",
                "SHARDQ_CONCURRENCY": self.args.concurrency,
                "SHARDQ_PROCESS_POOL_SIZE": self.args.process_pool_size,
                "SHARDQ_LEASE_MS": 10_000,
                "SHARDQ_DRAIN_GRACE_S": 5,
                "SHARDQ_METRICS_PORT": port,
            }
            self.spawn(f"worker-{i}", "shardq.worker", env, port)

    def _start_dashboard(self) -> None:
        """The web dashboard (``shardq dashboard``), on --dashboard-port or, when another
        program holds that port, on a free one: the ready banner prints its URL."""
        if self.args.no_dashboard:
            return
        port = self.args.dashboard_port
        if not port_is_free(port):
            port = free_port()
        self.dashboard_url = f"http://127.0.0.1:{port}/"
        env = {
            "SHARDQ_LOG_LEVEL": self.args.log_level,
            "SHARDQ_COORDINATOR": self.target,
            "SHARDQ_DASHBOARD_LISTEN": f"127.0.0.1:{port}",
        }
        # ops_port: its /healthz is what _wait_until_serving asks.
        self.spawn("dashboard", "shardq.coordinator.dashboard", env, port)

    def write_env_file(self) -> Path:
        """``<data-dir>/shardq.env``: where this cluster is and its tokens, for the ``shardq``
        command (its fallback after flags and variables) and for ``set -a; . FILE``."""
        assert self.tokens is not None
        tenant_token = sorted(self.tokens.tenants.items())[0][1]
        path = self.data_dir / ENV_FILE
        config.write_env_file(
            path,
            {
                "SHARDQ_DATABASE_URL": self.database_url,
                "SHARDQ_COORDINATOR": self.target,
                "SHARDQ_TOKEN": tenant_token,
                "SHARDQ_ADMIN_TOKEN": self.tokens.admin,
                "SHARDQ_KEY_PREFIX": self.args.key_prefix,
            },
            "Written by `shardq dev` on each start; the `shardq` command reads it when no flag\n"
            "or SHARDQ_* variable says otherwise. In a shell: set -a; . THIS_FILE; set +a\n"
            "SHARDQ_TOKEN is the first tenant's token; SHARDQ_ADMIN_TOKEN is the admin token.",
        )
        return path

    async def _wait_until_serving(self, timeout_s: float = 60.0) -> None:
        """Until the coordinator answers, every shard loop is up and every worker has shards."""
        assert self.tokens is not None
        deadline = time.monotonic() + timeout_s
        pending = {c.name for c in self.children}
        async with AsyncClient(
            self.target, self.tokens.admin, retry=RetryPolicy(attempts=1), timeout_s=2
        ) as client:
            while pending:
                self.respawn_lost_ports(pending)
                self.check_children()
                for child in self.children:
                    if child.name in pending and await self._serving(child, client):
                        pending.discard(child.name)
                if not pending:
                    return
                if time.monotonic() > deadline:
                    raise DevError(
                        f"not up within {timeout_s:.0f}s: {', '.join(sorted(pending))} "
                        f"(logs in {self.logs})"
                    )
                await asyncio.sleep(0.1)

    @staticmethod
    async def _serving(child: Child, client: AsyncClient) -> bool:
        if child.name == "coordinator":
            try:
                await client.shard_map()
            except Exception:  # not listening yet
                return False
            return True
        health = await asyncio.to_thread(healthz, child.ops_port)
        if health is None:
            return False
        return bool(health.get("shards")) if child.name.startswith("worker") else True

    def check_children(self) -> None:
        """Raise when a process exited on its own (with the end of its log)."""
        for child in self.children:
            code = child.proc.poll()
            if code is not None:
                raise DevError(
                    f"{child.name} exited with code {code}; the end of {child.log}:\n"
                    + tail(child.log)
                )
        for i, r in enumerate(self.redis):
            if r.proc is None or r.proc.poll() is not None:
                raise DevError(f"redis-server of shard {i} exited; see {self.logs}/redis-{i}.log")
        pg = self.postgres.proc if self.postgres is not None else None
        if pg is not None and pg.poll() is not None:
            raise DevError(f"postgres exited; see {self.logs}/postgres.log")

    def stop(self) -> None:
        """Stop everything, in the order data flows backwards: workers drain first."""
        order = ("worker-", "shard-", "coordinator")
        for prefix in order:
            group = [c for c in self.children if c.name.startswith(prefix)]
            for c in group:
                if c.proc.poll() is None:
                    c.proc.send_signal(signal.SIGTERM)
            for c in group:
                wait_or_kill(c.proc, 15)
        for r in self.redis:
            r.stop()
        if self.postgres is not None:
            self.postgres.stop()
        # A stopped cluster's settings would send the next `shardq` call to closed ports: the
        # file leaves with the cluster (the Postgres port stays in postgres.port for the next run).
        (self.data_dir / ENV_FILE).unlink(missing_ok=True)
        if self._lock is not None:
            self.write_pids(running=False)
            self._lock.close()
            self._lock = None
