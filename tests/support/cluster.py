"""A real cluster in the test process: redis-server shards, a migrated Postgres database, the
shard map, tokens, and a gRPC coordinator on a free port (and more replicas on demand)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import grpc
from grpc_health.v1 import health
from sqlalchemy import text

from shardq.client import AsyncClient, RetryPolicy
from shardq.coordinator.app import Coordinator, CoordinatorSettings
from shardq.coordinator.server import build_server
from shardq.coordinator.shardmap import ShardMapStore
from shardq.coordinator.tokens import TokenStore
from shardq.coordinator.tools.redis_server import RedisProcess
from shardq.shard.models import ShardSettings
from shardq.shard.records import JOB_FORMAT
from shardq.store.migrate import upgrade
from tests.support.coordinator_proc import first_installed


@dataclass
class Cluster:
    shards: list[RedisProcess]
    database_url: str
    settings: CoordinatorSettings
    server: grpc.aio.Server
    port: int
    coordinator: Coordinator
    health: health.aio.HealthServicer
    admin_token: str
    tokens: dict[str, str] = field(default_factory=dict)
    _clients: list[AsyncClient] = field(default_factory=list)

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def token_for(self, tenant: str) -> str:
        if tenant not in self.tokens:
            _, self.tokens[tenant] = await self.coordinator.tokens.create("tenant", tenant)
        return self.tokens[tenant]

    async def client(self, tenant: str | None = None, **kw: Any) -> AsyncClient:
        """A client with the tenant's token (the admin token when tenant is None)."""
        token = self.admin_token if tenant is None else await self.token_for(tenant)
        kw.setdefault("retry", RetryPolicy(attempts=1))
        c = AsyncClient(self.target, token, **kw)
        self._clients.append(c)
        return c

    async def close_clients(self) -> None:
        await asyncio.gather(*(c.close() for c in self._clients))
        self._clients.clear()

    @asynccontextmanager
    async def replica(self) -> AsyncIterator[Replica]:
        """Another coordinator on the same database and shards, on a port of its own."""
        server, port, coord, _ = await build_server(self.settings)
        await server.start()
        try:
            await wait_until_listening(coord, 2)
            yield Replica(server, port, coord)
        finally:
            await server.stop(0)
            await coord.stop()

    def add_shard_process(self) -> RedisProcess:
        """A new redis-server, stopped with the cluster; add it to the map with sync_shards."""
        proc = RedisProcess().start()
        self.shards.append(proc)
        return proc


@dataclass
class Replica:
    server: grpc.aio.Server
    port: int
    coordinator: Coordinator

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"


async def wait_until_listening(coord: Coordinator, listeners: int, timeout_s: float = 5.0) -> None:
    """Wait until ``listeners`` connections of the database LISTEN for shard-map changes.

    A coordinator stopped while its follower is still opening that connection can leak it
    (a ResourceWarning in a later test); a cluster is "up" once it listens.
    """
    query = text(
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE datname = current_database() AND query ILIKE 'LISTEN %'"
    )
    async with asyncio.timeout(timeout_s):
        while True:
            async with coord.engine.connect() as conn:
                if (await conn.execute(query)).scalar_one() >= listeners:
                    return
            await asyncio.sleep(0.02)


@asynccontextmanager
async def running_cluster(
    database_url: str, shard_count: int = 2, job_format: int = JOB_FORMAT, **settings: Any
) -> AsyncIterator[Cluster]:
    """``job_format``: each shard's, as a first install's hook leaves it (1: a shard that an
    older release made and no ``shards finalize`` raised)."""
    # The cluster keeps this list: shards added later (add_shard_process) are cleaned up too.
    shards = [RedisProcess().start() for _ in range(shard_count)]
    try:
        await first_installed(shards, job_format)
        await asyncio.to_thread(upgrade, database_url)
        cs = CoordinatorSettings(
            listen="127.0.0.1:0",
            database_url=database_url,
            map_poll_interval_s=0.2,
            shard=ShardSettings(key_prefix="sq"),
        )
        cs = replace(cs, **settings)
        coord_store = Coordinator(cs)  # only for its engine: create the map and admin token
        await ShardMapStore(coord_store.engine).sync_shards([f"127.0.0.1:{s.port}" for s in shards])
        _, admin_token = await TokenStore(coord_store.engine).create("admin")
        await coord_store.engine.dispose()
        server, port, coord, health_servicer = await build_server(cs)
        await server.start()
        cluster = Cluster(
            shards, database_url, cs, server, port, coord, health_servicer, admin_token
        )
        try:
            await wait_until_listening(coord, 1)
            yield cluster
        finally:
            await cluster.close_clients()
            # A test may have replaced them (a coordinator restart): stop the current ones.
            await cluster.server.stop(0)
            await cluster.coordinator.stop()
    finally:
        for s in shards:
            s.cleanup()
