"""A tenant's dedupe window (issue 15, item 6) through a real cluster at a first install's job
format: set with ``shardq tenants set --dedupe-window``, applied by the shard from the
tenant's limits (a live job is the record; the script that ends it writes the dedupe key for
what is left of the window), and what a resubmit after the window gets: a new job at the
same derived ID, whose result is the first job's while that job's result row exists
(docs/guarantees.md, "At the edge of the dedupe window")."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
import pytest_asyncio
from redis.asyncio import Redis

from shardq.shard.client import MAX_DEDUPE_WINDOW_S, MIN_DEDUPE_WINDOW_S
from shardq.shard.keys import Keys
from shardq.v1 import common_pb2, jobs_pb2, jobs_pb2_grpc
from tests.support import handlers
from tests.support.cli import Shardq, cluster_of_its_own, one_error_line
from tests.support.cluster import Cluster
from tests.support.workers import running_worker, shard_loops

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def cluster() -> AsyncIterator[Cluster]:
    async with cluster_of_its_own() as c:
        yield c


@pytest.fixture
def shardq(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> Shardq:
    return Shardq(cluster, capsys, default_tenant=None)


async def submit(
    cluster: Cluster, tenant: str, request_id: str, payload: Any, run_at_unix_ms: int = 0
) -> jobs_pb2.SubmitJobResponse:
    """SubmitJob on the wire (the client's own retries aside), with the tenant's token."""
    token = await cluster.token_for(tenant)
    async with grpc.aio.insecure_channel(cluster.target) as channel:
        stub = jobs_pb2_grpc.JobServiceStub(channel)
        spec = common_pb2.JobSpec(
            request_id=request_id,
            handler="test.work",
            payload=json.dumps(payload).encode(),
            run_at_unix_ms=run_at_unix_ms,
        )
        resp: jobs_pb2.SubmitJobResponse = await stub.SubmitJob(
            jobs_pb2.SubmitJobRequest(job=spec), metadata=[("authorization", f"Bearer {token}")]
        )
        return resp


async def get_job(cluster: Cluster, tenant: str, job_id: str) -> common_pb2.Job:
    token = await cluster.token_for(tenant)
    async with grpc.aio.insecure_channel(cluster.target) as channel:
        stub = jobs_pb2_grpc.JobServiceStub(channel)
        job: common_pb2.Job = await stub.GetJob(
            jobs_pb2.GetJobRequest(job_id=job_id), metadata=[("authorization", f"Bearer {token}")]
        )
        return job


async def wait_for_state(
    cluster: Cluster, tenant: str, job_id: str, state: int, timeout_s: float = 60
) -> common_pb2.Job:
    async with asyncio.timeout(timeout_s):
        while (job := await get_job(cluster, tenant, job_id)).state != state:
            await asyncio.sleep(0.1)
    return job


async def cancel(cluster: Cluster, tenant: str, job_id: str) -> None:
    token = await cluster.token_for(tenant)
    async with grpc.aio.insecure_channel(cluster.target) as channel:
        stub = jobs_pb2_grpc.JobServiceStub(channel)
        await stub.CancelJob(
            jobs_pb2.CancelJobRequest(job_id=job_id),
            metadata=[("authorization", f"Bearer {token}")],
        )


async def dedupe_ttl_ms(cluster: Cluster, tenant: str, request_id: str) -> int:
    """PTTL of the tenant's dedupe key on its shard (-2: no key)."""
    shard_id = cluster.coordinator.shard_map.shard_for(tenant)
    redis = Redis(port=cluster.shards[shard_id].port)
    try:
        key = Keys(cluster.settings.shard.key_prefix).dedupe(tenant, request_id)
        return int(await redis.pttl(key))
    finally:
        await redis.aclose()


async def wind_on(cluster: Cluster, tenant: str, ms: int) -> None:
    """Every TTL on the tenant's shard shortened by ``ms``, a key whose TTL is at most that
    expired (in 1 ms): Redis's side of ``ms`` passing, without the wait."""
    shard_id = cluster.coordinator.shard_map.shard_for(tenant)
    redis = Redis(port=cluster.shards[shard_id].port)
    try:
        async for key in redis.scan_iter(count=1000):
            ttl = int(await redis.pttl(key))
            if ttl > 0:
                await redis.pexpire(key, max(1, ttl - ms))
    finally:
        await redis.aclose()


async def test_a_tenant_without_a_window_of_its_own_keeps_request_ids_for_24_hours(
    cluster: Cluster, shardq: Shardq
) -> None:
    first = await submit(cluster, "plain", "r-1", {"n": 1})
    assert await dedupe_ttl_ms(cluster, "plain", "r-1") == -2  # the live job is the record
    doc = (await shardq("tenants", "limits", "plain", "--json")).json()
    assert isinstance(doc, dict) and doc["dedupe_window_s"] == 86_400
    again = await submit(cluster, "plain", "r-1", {"n": 1})
    assert again.deduplicated and again.job.job_id == first.job.job_id
    await cancel(cluster, "plain", first.job.job_id)  # its end writes the key
    ttl = await dedupe_ttl_ms(cluster, "plain", "r-1")
    assert 86_400_000 - 60_000 < ttl <= 86_400_000
    ended = await submit(cluster, "plain", "r-1", {"n": 1})
    assert ended.deduplicated and ended.job.state == common_pb2.JOB_STATE_CANCELLED


async def test_a_window_set_with_the_cli_is_the_ttl_of_the_next_jobs_dedupe_keys(
    cluster: Cluster, shardq: Shardq
) -> None:
    run = await shardq("tenants", "set", "brief", "--dedupe-window", "3600", "--json")
    assert run.code == 0, run.err
    doc = run.json()
    assert isinstance(doc, dict)
    assert doc["before"]["dedupe_window_s"] == 86_400
    assert doc["after"]["dedupe_window_s"] == 3_600
    one = await submit(cluster, "brief", "r-1", {"n": 1})
    await cancel(cluster, "brief", one.job.job_id)
    assert 3_600_000 - 60_000 < await dedupe_ttl_ms(cluster, "brief", "r-1") <= 3_600_000
    back = await shardq("tenants", "set", "brief", "--dedupe-window", "0", "--json")
    assert back.json()["after"]["dedupe_window_s"] == 86_400  # type: ignore[index]
    two = await submit(cluster, "brief", "r-2", {"n": 2})
    await cancel(cluster, "brief", two.job.job_id)
    assert await dedupe_ttl_ms(cluster, "brief", "r-2") > 3_600_000


@pytest.mark.parametrize("window", [1, MIN_DEDUPE_WINDOW_S - 1, MAX_DEDUPE_WINDOW_S + 1])
async def test_a_window_outside_its_bounds_is_refused_naming_the_field(
    shardq: Shardq, window: int
) -> None:
    run = await shardq("tenants", "set", "bounds", "--dedupe-window", str(window))
    line = one_error_line(run, "INVALID_ARGUMENT")
    assert "limits.dedupe_window_s" in line and str(window) in line
    doc = (await shardq("tenants", "limits", "bounds", "--json")).json()
    assert isinstance(doc, dict) and doc["dedupe_window_s"] == 86_400


@pytest.mark.timeout(240)
async def test_a_resubmit_after_the_window_is_a_new_job_that_the_result_row_answers_for(
    cluster: Cluster, shardq: Shardq
) -> None:
    """Resubmitted due at once (its worker starts it and looks the row up alongside: the run
    is stopped or its end changes nothing) and delayed (the shard loop looks it up ahead of
    its run-at and marks it: the worker looks the row up first and acks it unrun)."""
    tenant, rid, later = "edge", "order-42", "order-43"
    run = await shardq("tenants", "set", tenant, "--dedupe-window", str(MIN_DEDUPE_WINDOW_S))
    assert run.code == 0, run.err
    async with shard_loops(cluster) as loops, running_worker(cluster, handlers=["test.work"]):
        first = await submit(cluster, tenant, rid, {"n": 1})
        first_later = await submit(cluster, tenant, later, {"n": 2})
        assert not first.deduplicated
        done = await wait_for_state(
            cluster, tenant, first.job.job_id, common_pb2.JOB_STATE_SUCCEEDED
        )
        done_later = await wait_for_state(
            cluster, tenant, first_later.job.job_id, common_pb2.JOB_STATE_SUCCEEDED
        )
        inside = await submit(cluster, tenant, rid, {"n": 1})
        assert inside.deduplicated and inside.job.job_id == first.job.job_id

        # Past the window: the shard's Redis lets the keys go. Their TTLs are the window's
        # rest; the window is then wound on rather than waited out (30 s, the longest wait of
        # the suite): every TTL on the shard shortened by it, as its passing would have done.
        for r in (rid, later):
            assert 0 < await dedupe_ttl_ms(cluster, tenant, r) <= MIN_DEDUPE_WINDOW_S * 1000
        await wind_on(cluster, tenant, MIN_DEDUPE_WINDOW_S * 1000)
        async with asyncio.timeout(10):
            for r in (rid, later):
                while await dedupe_ttl_ms(cluster, tenant, r) != -2:
                    await asyncio.sleep(0.05)
        after = await submit(cluster, tenant, rid, {"n": 1})
        assert not after.deduplicated
        # A new job, at the ID its tenant and request ID give (the first one's record in Redis
        # is replaced by it).
        assert after.job.job_id == first.job.job_id
        assert after.job.created_at_unix_ms > first.job.created_at_unix_ms
        run_at = int(time.time() * 1000) + 2_500  # past the walk's reach
        after_later = await submit(cluster, tenant, later, {"n": 2}, run_at_unix_ms=run_at)
        assert not after_later.deduplicated

        second = await wait_for_state(
            cluster, tenant, after.job.job_id, common_pb2.JOB_STATE_SUCCEEDED
        )
        second_later = await wait_for_state(
            cluster, tenant, after_later.job.job_id, common_pb2.JOB_STATE_SUCCEEDED
        )
        pre = loops[cluster.coordinator.shard_map.shard_for(tenant)].precheck
        assert pre is not None
        looked_up = pre.metrics.jobs.labels(shard=pre.metrics.shard_id, result="done")
        assert looked_up._value.get() == 1  # the delayed one: found done, marked
    # The first jobs' rows answered for the second ones. The one due at once did start; the
    # delayed one was acked without its handler.
    assert handlers.EXECUTIONS[rid] == 2
    assert handlers.EXECUTIONS[later] == 1
    assert json.loads(second.result) == json.loads(done.result)
    assert json.loads(second_later.result) == json.loads(done_later.result)
