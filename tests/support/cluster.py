"""A real cluster in the test process: redis-server shards, a migrated Postgres database, the
shard map, tokens, and a gRPC coordinator on a free port."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import grpc
from grpc_health.v1 import health

from coordinator.app import Coordinator, CoordinatorSettings
from coordinator.client import AsyncClient, RetryPolicy
from coordinator.migrate import upgrade
from coordinator.server import build_server
from coordinator.shardmap import ShardMapStore
from coordinator.tokens import TokenStore
from shard.models import ShardSettings
from shard.redis_server import RedisProcess


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
async def running_cluster(
    database_url: str, shard_count: int = 2, **settings: Any
) -> AsyncIterator[Cluster]:
    shards = [RedisProcess().start() for _ in range(shard_count)]
    try:
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
            yield cluster
        finally:
            await cluster.close_clients()
            # A test may have replaced them (a coordinator restart): stop the current ones.
            await cluster.server.stop(0)
            await cluster.coordinator.stop()
    finally:
        for s in shards:
            s.cleanup()
