"""Shard assignment over every live worker of the cluster, whichever replica each talks to."""

from __future__ import annotations

import asyncio
import dataclasses

import grpc

from shardq.coordinator.server import build_server
from shardq.v1 import workers_pb2, workers_pb2_grpc
from tests.support.cluster import running_cluster


async def follow(target: str, token: str, worker_id: str, into: dict[str, list[int]]) -> None:
    async with grpc.aio.insecure_channel(target) as channel:
        stub = workers_pb2_grpc.WorkerServiceStub(channel)
        req = workers_pb2.WatchAssignmentRequest(worker_id=worker_id, concurrency=1)
        async for a in stub.WatchAssignment(req, metadata=(("authorization", f"Bearer {token}"),)):
            into[worker_id] = sorted(s.shard_id for s in a.shards)


async def until(cond: object, timeout_s: float = 15) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not cond():  # type: ignore[operator]
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


async def test_workers_on_two_replicas_share_the_shards_and_one_leaving_gives_its_back(
    database_url: str,
) -> None:
    async with running_cluster(database_url, worker_refresh_s=0.2) as cluster:
        settings = dataclasses.replace(cluster.settings, listen="127.0.0.1:0")
        server, port, coord, _ = await build_server(settings)
        await server.start()
        seen: dict[str, list[int]] = {}
        tasks = []
        try:
            tasks.append(
                asyncio.create_task(follow(cluster.target, cluster.admin_token, "w-a", seen))
            )
            await until(lambda: seen.get("w-a") == [0, 1])
            tasks.append(
                asyncio.create_task(follow(f"127.0.0.1:{port}", cluster.admin_token, "w-b", seen))
            )
            # Each replica only holds one stream, yet both deal over both workers.
            await until(lambda: sorted(seen.get("w-a", []) + seen.get("w-b", [])) == [0, 1]
                        and len(seen.get("w-a", [])) == 1)  # fmt: skip
            tasks[1].cancel()
            await asyncio.gather(tasks[1], return_exceptions=True)
            await until(lambda: seen.get("w-a") == [0, 1])
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await server.stop(0)
            await coord.stop()
