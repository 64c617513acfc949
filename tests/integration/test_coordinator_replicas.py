"""Two coordinator replicas on one database and one set of shards route the same way, before
and after the shard map changes."""

from __future__ import annotations

import asyncio

import grpc
from redis.asyncio import Redis

from shardq.v1 import common_pb2, jobs_pb2, jobs_pb2_grpc
from tests.support.cluster import running_cluster

TENANTS = [f"tenant-{i:03d}" for i in range(200)]


async def test_a_second_replica_routes_every_tenant_like_the_first_after_shards_are_added(
    database_url: str,
) -> None:
    async with (
        running_cluster(database_url, shard_count=2) as cluster,
        cluster.replica() as replica,
    ):
        first, second = cluster.coordinator, replica.coordinator
        before = first.shard_map
        assert second.shard_map.version == before.version

        for _ in range(2):
            cluster.add_shard_process()
        after = await first.store.sync_shards([f"127.0.0.1:{s.port}" for s in cluster.shards])
        assert after.version > before.version
        # Waited for, not timed: both replicas follow the change without a restart.
        await asyncio.gather(
            first.follower.wait_for_version(after.version, timeout_s=30),
            second.follower.wait_for_version(after.version, timeout_s=30),
        )

        placement = {t: after.shard_for(t) for t in TENANTS}
        assert {first.shard_map.shard_for(t) for t in TENANTS} == {0, 1, 2, 3}
        for t in TENANTS:
            assert first.shard_map.shard_for(t) == second.shard_map.shard_for(t) == placement[t]
        moved = [t for t in TENANTS if before.shard_for(t) != placement[t]]
        assert moved and all(placement[t] in (2, 3) for t in moved)

        md = (("authorization", f"Bearer {cluster.admin_token}"),)
        async with (
            grpc.aio.insecure_channel(cluster.target) as one,
            grpc.aio.insecure_channel(replica.target) as two,
        ):
            stubs = (jobs_pb2_grpc.JobServiceStub(one), jobs_pb2_grpc.JobServiceStub(two))
            for i, t in enumerate(TENANTS):
                # Submitted through one replica, read back through the other.
                via, back = stubs[i % 2], stubs[1 - i % 2]
                spec = common_pb2.JobSpec(handler="h", payload=b"{}", request_id=f"r-{t}")
                sub = await via.SubmitJob(
                    jobs_pb2.SubmitJobRequest(tenant_id=t, job=spec), metadata=md
                )
                got = await back.GetJob(
                    jobs_pb2.GetJobRequest(tenant_id=t, job_id=sub.job.job_id), metadata=md
                )
                assert sub.job.shard_id == got.shard_id == placement[t], t

        for shard_id, proc in enumerate(cluster.shards):  # and the jobs are where it says
            r = Redis(port=proc.port)
            try:
                for t in TENANTS:
                    assert bool(await r.exists(f"sq:counts:{t}")) == (placement[t] == shard_id)
            finally:
                await r.aclose()
