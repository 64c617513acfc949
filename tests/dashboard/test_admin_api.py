"""The API the dashboard added, through a real coordinator: ``GetJob`` by request_id and
``AdminService.ListShardStatus``, with their unhappy paths."""

from __future__ import annotations

from datetime import timedelta

import grpc
import pytest

from shardq.v1 import admin_pb2, jobs_pb2
from tests.support.cluster import running_cluster


async def test_get_job_by_request_id(database_url: str) -> None:
    async with running_cluster(database_url) as cluster:
        acme = await cluster.client("acme")
        globex = await cluster.client("globex")
        job_id = (await acme.submit("echo", {"n": 1}, request_id="order-17")).job_id
        await globex.submit("echo", {"n": 2}, request_id="order-17")

        def get(**fields: str) -> jobs_pb2.GetJobRequest:
            return jobs_pb2.GetJobRequest(**fields)

        found = await acme.stubs.jobs.GetJob(get(request_id="order-17"), metadata=acme.metadata)
        assert (found.job_id, found.tenant_id, found.request_id) == (job_id, "acme", "order-17")

        cases = [
            (get(request_id="order-18"), grpc.StatusCode.NOT_FOUND, "request_id"),
            (get(job_id=job_id, request_id="order-17"), grpc.StatusCode.INVALID_ARGUMENT, "both"),
            (get(request_id="bad id!"), grpc.StatusCode.INVALID_ARGUMENT, "request_id"),
            (get(tenant_id="globex", request_id="order-17"), grpc.StatusCode.PERMISSION_DENIED, ""),
        ]
        for request, code, word in cases:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await acme.stubs.jobs.GetJob(request, metadata=acme.metadata)
            assert err.value.code() == code, request
            assert word in (err.value.details() or ""), err.value.details()


async def test_list_shard_status(database_url: str) -> None:
    async with running_cluster(database_url, shard_count=2) as cluster:
        acme = await cluster.client("acme")
        for n in range(3):
            await acme.submit("echo", {"n": n})
        await acme.submit("echo", {"n": 9}, delay=timedelta(hours=1))
        # More tenants than shards: a shard's gauges are sums over several tenants.
        for t in range(6):
            await (await cluster.client(f"t{t}")).submit("echo", {"t": t})
        admin = await cluster.client()
        request = admin_pb2.ListShardStatusRequest()
        resp = await admin.stubs.admin.ListShardStatus(request, metadata=admin.metadata)
        assert [s.shard_id for s in resp.shards] == [0, 1]
        assert all(s.reachable and s.used_memory_bytes > 0 for s in resp.shards)
        assert sum(s.ready for s in resp.shards) == 3 + 6
        assert sum(s.scheduled for s in resp.shards) == 1
        assert sum(s.submitted_total for s in resp.shards) == 4 + 6
        assert sum(s.tenant_count for s in resp.shards) == 7
        assert not resp.moves

        # One shard down: reported, and the call still answers.
        cluster.shards[1].cleanup()
        resp = await admin.stubs.admin.ListShardStatus(request, metadata=admin.metadata)
        assert [s.reachable for s in resp.shards] == [True, False]
        assert resp.shards[1].error

        with pytest.raises(grpc.aio.AioRpcError) as err:
            await acme.stubs.admin.ListShardStatus(request, metadata=acme.metadata)
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
