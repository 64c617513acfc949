"""Readiness of a real coordinator process: gRPC health (the whole server and each service)
and the ops port's /readyz follow its shards and Postgres, as the background checker sees
them (coordinator/health.py); /healthz stays the liveness answer throughout."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from grpc_health.v1 import health_pb2

from shardq.client import AsyncClient, RetryPolicy
from shardq.coordinator.server import SERVICE_NAMES
from shardq.coordinator.tokens import TokenStore
from shardq.coordinator.tools.redis_server import RedisProcess
from shardq.store import db
from tests.support.coordinator_proc import (
    CoordinatorProcess,
    coordinator_process,
    prepare_database,
    wait_for,
)
from tests.support.outage import proxied_database

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def shard(detail: dict[str, Any], shard_id: int) -> dict[str, Any]:
    entries: list[dict[str, Any]] = [s for s in detail["shards"] if s["id"] == shard_id]
    (entry,) = entries
    return entry


async def every_service(coordinator: CoordinatorProcess) -> set[int]:
    return {await coordinator.health(name) for name in ("", *SERVICE_NAMES)}


def crash(redis: RedisProcess) -> None:
    redis.kill()
    redis.stop()  # reaps it and closes its pipe; the port stays the shard's


async def test_one_shard_down_is_detail_every_shard_down_is_not_serving_until_they_return(
    database_url: str,
) -> None:
    shards = [RedisProcess().start(), RedisProcess().start()]
    try:
        admin = await prepare_database(database_url, shards)
        async with coordinator_process(database_url, admin) as coordinator:
            status, detail = await coordinator.readyz()
            assert status == 200 and detail["ready"], detail
            assert [(s["id"], s["ok"]) for s in detail["shards"]] == [(0, True), (1, True)]
            assert shard(detail, 1)["address"] == f"127.0.0.1:{shards[1].port}"
            assert detail["postgres"]["ok"] is True
            assert await every_service(coordinator) == {SERVING}
            watched: list[int] = []  # what a client watching the whole server is told
            watcher = asyncio.create_task(coordinator.watch_health(watched))

            crash(shards[0])
            status, detail = await wait_for(
                coordinator.readyz,
                lambda r: not shard(r[1], 0)["ok"],
                what="shard 0 reported down",
            )
            assert status == 200 and detail["ready"], detail  # the other shard still serves
            assert shard(detail, 0)["error"] and shard(detail, 1)["ok"], detail
            assert await every_service(coordinator) == {SERVING}

            crash(shards[1])
            status, detail = await wait_for(
                coordinator.readyz, lambda r: r[0] == 503, what="not ready with every shard down"
            )
            assert not detail["ready"] and "every shard" in detail["reason"], detail
            assert [s["ok"] for s in detail["shards"]] == [False, False]
            assert await every_service(coordinator) == {NOT_SERVING}
            # Liveness is another question: the process answers, so it is not restarted.
            assert (await asyncio.to_thread(coordinator.http, "/healthz"))[0] == 200

            for redis in shards:
                redis.start()
            status, detail = await wait_for(
                coordinator.readyz, lambda r: r[0] == 200, what="ready again"
            )
            assert [s["ok"] for s in detail["shards"]] == [True, True], detail
            assert await every_service(coordinator) == {SERVING}
            await wait_for(
                lambda: asyncio.sleep(0, watched), lambda w: w[-1:] == [SERVING], what="watch"
            )
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
            assert watched == [SERVING, NOT_SERVING, SERVING]
    finally:
        for redis in shards:
            redis.cleanup()


#: A token cache shrunk so that an outage outlives it within a test.
STALE_MAX_S = 5.0


async def test_postgres_down_is_reported_at_once_and_not_serving_only_past_the_token_bound(
    database_url: str,
) -> None:
    shards = [RedisProcess().start()]
    try:
        admin = await prepare_database(database_url, shards)
        async with (
            proxied_database(database_url) as (proxy, proxied_url),
            coordinator_process(
                proxied_url, admin, token_stale_max_s=STALE_MAX_S, token_cache_ttl_s=0.3
            ) as coordinator,
        ):
            engine = db.make_engine(database_url)
            try:
                _, token = await TokenStore(engine).create("tenant", "acme")
            finally:
                await engine.dispose()
            async with AsyncClient(coordinator.target, token, retry=RetryPolicy(attempts=1)) as c:
                await c.submit("test.work", {}, request_id="before")  # the token is cached

                proxy.cut()
                status, detail = await wait_for(
                    coordinator.readyz,
                    lambda r: r[1]["postgres"]["ok"] is False,
                    what="Postgres reported down",
                )
                since = detail["postgres"]["since"]
                assert detail["postgres"]["error"], detail
                assert detail["postgres"]["not_ready_after_s"] == STALE_MAX_S
                # Still in the Service: cached tokens keep the front door open meanwhile.
                assert status == 200 and detail["ready"], detail
                assert await coordinator.health() == SERVING
                assert (await c.submit("test.work", {}, request_id="during")).job_id

                # Not ready only once the outage has outlasted what cached tokens may cover.
                seen = []
                while True:
                    status, detail = await coordinator.readyz()
                    seen.append((time.time() - since, status))
                    if status == 503:
                        break
                    assert seen[-1][0] < STALE_MAX_S + 30, seen
                    await asyncio.sleep(0.2)
                assert seen[-1][0] >= STALE_MAX_S, seen  # not a moment before the bound
                assert "Postgres" in detail["reason"] and detail["postgres"]["since"] == since
                assert await coordinator.health() == NOT_SERVING

                proxy.restore()
                status, detail = await wait_for(
                    coordinator.readyz, lambda r: r[0] == 200, what="ready again"
                )
                assert detail["postgres"]["ok"] is True and detail["postgres"]["since"] > since
                assert await coordinator.health() == SERVING
    finally:
        for redis in shards:
            redis.cleanup()
