"""Shard assignment over every live worker of the cluster, whichever replica each talks to,
dealt per queue."""

from __future__ import annotations

import asyncio
import dataclasses

import grpc
import pytest

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


Endpoints = dict[int, tuple[str, ...]]


async def follow_queues(
    target: str,
    token: str,
    worker_id: str,
    queues: list[str],
    handlers: list[str],
    into: dict[str, Endpoints],
) -> None:
    """A worker's stream as shardq-worker opens it: what it serves, then its endpoints."""
    async with grpc.aio.insecure_channel(target) as channel:
        stub = workers_pb2_grpc.WorkerServiceStub(channel)
        req = workers_pb2.WatchAssignmentRequest(
            worker_id=worker_id, concurrency=4, queues=queues, handlers=handlers
        )
        async for a in stub.WatchAssignment(req, metadata=(("authorization", f"Bearer {token}"),)):
            into[worker_id] = {s.shard_id: tuple(s.queues) for s in a.shards}


async def test_shards_are_dealt_per_queue_and_every_replica_knows_who_runs_what(
    database_url: str,
) -> None:
    async with running_cluster(database_url, worker_refresh_s=0.2) as cluster:
        settings = dataclasses.replace(cluster.settings, listen="127.0.0.1:0")
        server, port, coord, _ = await build_server(settings)
        await server.start()
        one, two = cluster.target, f"127.0.0.1:{port}"
        token = cluster.admin_token
        seen: dict[str, Endpoints] = {}
        tasks: dict[str, asyncio.Task[None]] = {}

        def start(target: str, worker_id: str, queues: list[str], handlers: list[str]) -> None:
            tasks[worker_id] = asyncio.create_task(
                follow_queues(target, token, worker_id, queues, handlers, seen)
            )

        try:
            start(one, "mail-a", [], ["mail.send"])  # no queues: the default one
            start(two, "reports-a", ["reports"], ["report.build"])
            await until(lambda: seen.get("mail-a") == {0: ("default",), 1: ("default",)})
            await until(lambda: seen.get("reports-a") == {0: ("reports",), 1: ("reports",)})
            # Learned through Postgres from the other replica's stream.
            first = cluster.coordinator.registry
            await until(lambda: first.serves("reports", "report.build"))
            assert first.serves("default", "mail.send")
            assert not first.serves("default", "report.build")
            assert not first.serves("reports", "mail.send")
            assert not first.serves("nobody", "mail.send")

            # A second mail worker splits the default queue's shards; reports keeps both.
            start(two, "mail-b", ["default"], ["mail.send"])
            await until(
                lambda: (
                    seen.get("mail-a") == {0: ("default",)}
                    and seen.get("mail-b") == {1: ("default",)}
                )
            )
            assert seen["reports-a"] == {0: ("reports",), 1: ("reports",)}

            tasks.pop("reports-a").cancel()
            await until(lambda: not first.serves("reports", "report.build"))
        finally:
            for t in tasks.values():
                t.cancel()
            await asyncio.gather(*tasks.values(), return_exceptions=True)
            await server.stop(0)
            await coord.stop()


@pytest.mark.parametrize(
    ("queues", "handlers", "field"),
    [(["has space"], [], "queues"), (["default"], ["bad handler!"], "handlers")],
)
async def test_a_worker_with_a_bad_queue_or_handler_name_is_refused(
    database_url: str, queues: list[str], handlers: list[str], field: str
) -> None:
    async with running_cluster(database_url) as cluster:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await follow_queues(cluster.target, cluster.admin_token, "w-x", queues, handlers, {})
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert field in (err.value.details() or "")
        assert "w-x" not in cluster.coordinator.registry.snapshot()
