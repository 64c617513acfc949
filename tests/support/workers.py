"""Shard loops and workers for a test cluster, in the test's own event loop."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

import sqlalchemy as sa
from redis.asyncio import Redis

from shardq.shard import ShardClient, ShardSettings
from shardq.shard.loop import LoopSettings, ShardLoop
from shardq.shard.precheck import Prechecker, PrecheckSettings
from shardq.shard.rows import RowSettings, TerminalRows
from shardq.store.db import make_engine, psycopg_dsn, results
from shardq.store.results import ResultStore
from shardq.worker import Worker, WorkerSettings, serve
from shardq.worker.handlers import REGISTRY
from tests.support import handlers as _handlers  # noqa: F401 - registers the test handlers
from tests.support.cluster import Cluster

FAST_LOOP = LoopSettings(leader_ttl_ms=2_000, reap_interval_ms=100)
#: The rows of ended jobs drained every 50 ms, a reconciler pass every 200 ms.
FAST_ROWS = RowSettings(outbox_interval_ms=50, reconcile_interval_s=0.2)
#: Delayed jobs looked up every 50 ms, as far ahead as shardq-shard's default.
FAST_PRECHECK = PrecheckSettings(interval_ms=50)


@asynccontextmanager
async def shard_loops(
    cluster: Cluster,
    settings: LoopSettings = FAST_LOOP,
    rows: RowSettings = FAST_ROWS,
    precheck: PrecheckSettings = FAST_PRECHECK,
) -> AsyncIterator[list[ShardLoop]]:
    """The shard loops of the cluster's shards, writing the rows of ended jobs and looking
    delayed jobs up ahead of their run-at, as ``shardq-shard`` with a database does."""
    clients, loops, tasks, stores = [], [], [], []
    for shard_id, proc in enumerate(cluster.shards):
        redis = Redis(port=proc.port)
        client = ShardClient(redis, cluster.settings.shard)
        store = ResultStore(psycopg_dsn(cluster.database_url))
        stores.append(store)
        loop = ShardLoop(
            client,
            settings,
            rows=TerminalRows(client, store, shard_id, rows),
            precheck=Prechecker(client, store, precheck),
        )
        clients.append(client)
        loops.append(loop)
        tasks.append(asyncio.create_task(loop.run()))
    try:
        yield loops
    finally:
        for lp in loops:
            lp.stop()
        await asyncio.gather(*tasks, return_exceptions=True)
        for c in clients:
            await c.redis.aclose()
        for st in stores:
            await st.close()


def worker_settings(cluster: Cluster, **kw: Any) -> WorkerSettings:
    base = WorkerSettings(
        database_url=cluster.database_url,
        concurrency=8,
        lease_ms=1_000,
        drain_grace_s=2.0,
        idle_block_s=1.0,
        shard=ShardSettings(key_prefix=cluster.settings.shard.key_prefix),
    )
    return replace(base, **kw)


@asynccontextmanager
async def running_worker(
    cluster: Cluster, handlers: Iterable[str] | None = None, **kw: Any
) -> AsyncIterator[Worker]:
    """A worker in this process, following the coordinator's assignment, with every test
    handler or only ``handlers``."""
    chosen = REGISTRY if handlers is None else {name: REGISTRY[name] for name in handlers}
    worker = Worker(worker_settings(cluster, **kw), chosen)
    stop = asyncio.Event()
    task = asyncio.create_task(
        serve(worker, coordinator=cluster.target, token=cluster.admin_token, stop=stop)
    )
    try:
        yield worker
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


async def result_rows(database_url: str) -> list[dict[str, Any]]:
    engine = make_engine(database_url)
    try:
        async with engine.connect() as conn:
            rows = (await conn.execute(sa.select(results))).mappings().all()
            return [dict(r) for r in rows]
    finally:
        await engine.dispose()


async def wait_for_rows(
    database_url: str, count: int, timeout_s: float = 60
) -> list[dict[str, Any]]:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        rows = await result_rows(database_url)
        if len(rows) >= count:
            return rows
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"{len(rows)} result rows after {timeout_s}s, wanted {count}")
        await asyncio.sleep(0.1)
