"""A real ``shardq-coordinator`` process (``python -m shardq.coordinator.server``) over
redis-server shards and a migrated database, with its gRPC port and its ops port (/metrics,
/healthz, /readyz) as probes and Prometheus would see them."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from redis.asyncio import Redis

from shardq.coordinator.shardmap import ShardMapStore
from shardq.coordinator.tokens import TokenStore
from shardq.coordinator.tools.redis_server import RedisProcess, free_port, parent_death_prefix
from shardq.shard.client import ShardClient
from shardq.shard.models import ShardSettings
from shardq.shard.records import JOB_FORMAT
from shardq.store import db
from shardq.store.migrate import upgrade


@dataclass
class CoordinatorProcess:
    proc: subprocess.Popen[bytes]
    port: int
    ops_port: int
    admin_token: str
    database_url: str

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def http(self, path: str) -> tuple[int, bytes]:
        """(status, body) of GET ``path`` on the ops port; (0, b"") when nothing answers."""
        try:
            url = f"http://127.0.0.1:{self.ops_port}{path}"
            with urllib.request.urlopen(url, timeout=5) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()
        except OSError:
            return 0, b""

    async def readyz(self) -> tuple[int, dict[str, Any]]:
        status, body = await asyncio.to_thread(self.http, "/readyz")
        assert status in (200, 503), (status, body)
        detail: dict[str, Any] = json.loads(body)
        return status, detail

    async def metrics(self) -> str:
        status, body = await asyncio.to_thread(self.http, "/metrics")
        assert status == 200, status
        return body.decode()

    async def health(self, service: str = "") -> int:
        """The grpc.health.v1 status of ``service`` ("": the whole server)."""
        async with grpc.aio.insecure_channel(self.target) as channel:
            stub: Any = health_pb2_grpc.HealthStub(channel)  # the aio stub is untyped
            reply = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
        return int(reply.status)

    async def watch_health(self, seen: list[int], service: str = "") -> None:
        """Append each status grpc.health.v1's Watch sends for ``service`` until cancelled."""
        async with grpc.aio.insecure_channel(self.target) as channel:
            stub: Any = health_pb2_grpc.HealthStub(channel)
            async for reply in stub.Watch(health_pb2.HealthCheckRequest(service=service)):
                seen.append(int(reply.status))

    def check_alive(self) -> None:
        assert self.proc.poll() is None, f"the coordinator exited with {self.proc.returncode}"


async def first_installed(shards: Sequence[RedisProcess], job_format: int = JOB_FORMAT) -> None:
    """Each of ``shards`` at ``job_format``: what a first install's hook leaves (1: a shard an
    older release made and no ``shards finalize`` raised)."""
    for shard in shards:
        async with Redis.from_url(shard.url) as r:
            await ShardClient(r, ShardSettings(key_prefix="sq")).raise_job_format(job_format)


async def prepare_database(database_url: str, shards: Sequence[RedisProcess]) -> str:
    """Migrate, write the shard map of ``shards`` (each at a first install's job format); the
    admin token."""
    await first_installed(shards)
    await asyncio.to_thread(upgrade, database_url)
    engine = db.make_engine(database_url)
    try:
        await ShardMapStore(engine).sync_shards([f"127.0.0.1:{s.port}" for s in shards])
        _, admin = await TokenStore(engine).create("admin")
    finally:
        await engine.dispose()
    return admin


@asynccontextmanager
async def one_shard(database_url: str, **redis: Any) -> AsyncIterator[tuple[RedisProcess, str]]:
    """A redis-server (``RedisProcess(**redis)``) as the one shard of ``database_url``'s map;
    (it, the admin token). Stopped and removed after."""
    shard = RedisProcess(**redis).start()
    try:
        yield shard, await prepare_database(database_url, [shard])
    finally:
        shard.cleanup()


@asynccontextmanager
async def coordinator_process(
    database_url: str,
    admin_token: str,
    *,
    timeout_s: float = 60,
    **env: object,
) -> AsyncIterator[CoordinatorProcess]:
    """A coordinator on ``database_url`` (its shard map says where the shards are), up when its
    /healthz answers; ``env`` adds ``SHARDQ_<NAME>`` variables. Stopped with SIGTERM after."""
    port, ops_port = free_port(), free_port()
    variables = {
        **os.environ,
        "SHARDQ_LISTEN": f"127.0.0.1:{port}",
        "SHARDQ_METRICS_PORT": str(ops_port),
        "SHARDQ_DATABASE_URL": database_url,
        "SHARDQ_KEY_PREFIX": "sq",
        "SHARDQ_SHUTDOWN_GRACE_S": "1",
        "SHARDQ_LOG_LEVEL": os.environ.get("SHARDQ_TEST_COORDINATOR_LOG_LEVEL", "WARNING"),
    }
    variables.update({f"SHARDQ_{k.upper()}": str(v) for k, v in env.items()})
    proc = _spawn(variables)
    coordinator = CoordinatorProcess(proc, port, ops_port, admin_token, database_url)
    try:
        async with asyncio.timeout(timeout_s):
            while (await asyncio.to_thread(coordinator.http, "/healthz"))[0] != 200:
                coordinator.check_alive()
                await asyncio.sleep(0.1)
        yield coordinator
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                await asyncio.to_thread(proc.wait, 15)
            except subprocess.TimeoutExpired:
                proc.kill()
                await asyncio.to_thread(proc.wait, 5)


def _spawn(env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [*parent_death_prefix(), sys.executable, "-m", "shardq.coordinator.server"], env=env
    )


async def wait_for(
    probe: Any, predicate: Any, timeout_s: float = 30, what: str = "the condition"
) -> Any:
    """Call ``await probe()`` until ``predicate(value)``; the value. Fails after ``timeout_s``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        value = await probe()
        if predicate(value):
            return value
        assert loop.time() < deadline, f"{what} did not happen within {timeout_s}s: {value}"
        await asyncio.sleep(0.1)
