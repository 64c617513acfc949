"""A tenant cannot fill a shard: its pending payload bytes are capped (``max_pending_bytes``,
enforced by enqueue.lua), so on a shard with a 40 MB ``maxmemory`` one tenant pushing 1 MB
jobs is refused RESOURCE_EXHAUSTED with a retry delay at its quota while another tenant on the
same shard goes on submitting, and the shard stays under its memory limit. Through a real
coordinator process and a real redis-server."""

from __future__ import annotations

import grpc
import pytest
from redis.asyncio import Redis

from shardq.client import AsyncClient, RetryPolicy, TenantLimits
from shardq.client.retry import retry_delay_ms
from tests.integration.test_frontdoor_metrics import tokens
from tests.support.coordinator_proc import coordinator_process, one_shard

MB = 1_000_000
MAXMEMORY = 40 * 1024 * 1024


async def test_a_tenant_at_its_byte_quota_is_refused_and_its_neighbour_is_not(
    database_url: str,
) -> None:
    limited = ["--maxmemory", str(MAXMEMORY), "--maxmemory-policy", "noeviction"]
    async with one_shard(database_url, extra_args=limited) as (shard, admin_token):
        greedy_token, neighbour_token = await tokens(database_url, "greedy", "neighbour")
        payload = {"blob": "x" * MB}
        once = RetryPolicy(attempts=1)
        async with (
            coordinator_process(database_url, admin_token) as coordinator,
            AsyncClient(coordinator.target, admin_token, retry=once) as admin,
            AsyncClient(coordinator.target, greedy_token, retry=once) as greedy,
            AsyncClient(coordinator.target, neighbour_token, retry=once) as neighbour,
        ):
            await admin.set_tenant_limits(TenantLimits(max_pending_bytes=8 * MB), "greedy")
            accepted = 0
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                for i in range(100):
                    await greedy.submit("test.work", payload, delay=3600, request_id=f"g{i}")
                    accepted += 1
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert retry_delay_ms(refused.value) is not None  # a quota: retry once it drains
            assert accepted == 7  # each payload is a little over 1 MB of JSON
            for i in range(10):  # its neighbour is not held to the greedy tenant's bytes
                await neighbour.submit("test.work", payload, delay=3600, request_id=f"n{i}")
            stats = await greedy.tenant_stats()
            assert stats.pending_bytes <= 8 * MB
            probe = Redis(port=shard.port)
            used = int((await probe.info("memory"))["used_memory"])
            await probe.aclose()
            assert used < MAXMEMORY, used
