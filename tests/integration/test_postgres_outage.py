"""The front door through a Postgres outage: a real cluster whose coordinator and worker reach
Postgres through a proxy that the test cuts for several seconds (many token-cache TTLs)."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from shardq.client import AsyncClient, Job, JobState, RetryPolicy
from shardq.coordinator.tokens import TokenStore
from shardq.store import db
from shardq.v1 import common_pb2, workers_pb2, workers_pb2_grpc
from tests.support.cluster import Cluster, running_cluster
from tests.support.outage import proxied_database
from tests.support.workers import running_worker, shard_loops, wait_for_rows

#: Token cache settings shrunk so that a few seconds of outage are many TTLs.
TOKEN_SETTINGS = {"token_cache_ttl_s": 0.3, "token_stale_max_s": 300.0, "token_retry_s": 0.2}
OUTAGE_S = 3.0


async def code_of(aw: object) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await aw  # type: ignore[misc]
    return info.value


async def assignment_for_probe(cluster: Cluster, token: str) -> workers_pb2.Assignment:
    """The first assignment of a new worker stream. The probe serves a queue of its own, so
    the shards it is dealt are not taken from the real worker's queue."""
    async with grpc.aio.insecure_channel(cluster.target) as channel:
        call = workers_pb2_grpc.WorkerServiceStub(channel).WatchAssignment(
            workers_pb2.WatchAssignmentRequest(worker_id="probe", queues=["probe-only"]),
            metadata=(("authorization", f"Bearer {token}"),),
            timeout=10,
        )
        try:
            first = await call.read()
        finally:
            call.cancel()
    assert isinstance(first, workers_pb2.Assignment)
    return first


async def active_request_ids(client: AsyncClient) -> set[str]:
    page = await client.list_jobs(JobState.ACTIVE, page_size=1000)
    return {j.request_id for j in page.items}


async def revoke_elsewhere(database_url: str, token: str) -> None:
    """Revoke ``token`` as an operator would, on a path to Postgres that is not cut."""
    engine = db.make_engine(database_url)
    try:
        assert await TokenStore(engine).revoke(token[3:15])
    finally:
        await engine.dispose()


async def submit_for(acme: AsyncClient, seconds: float) -> list[Job]:
    """Submit and read back one job after another for ``seconds``: every call must succeed."""
    loop = asyncio.get_running_loop()
    ends = loop.time() + seconds
    jobs: list[Job] = []
    while loop.time() < ends:
        n = len(jobs)
        sub = await acme.submit("test.work", {"n": n}, request_id=f"during-{n}")
        assert not sub.deduplicated
        got = await acme.get(sub.job_id)
        assert got.request_id == f"during-{n}"
        assert got.state != JobState.SUCCEEDED  # no row can be written: no ack
        jobs.append(got)
        await asyncio.sleep(0.02)
    return jobs


async def refused_with(cluster: Cluster, token: str) -> grpc.StatusCode:
    async with AsyncClient(cluster.target, token, retry=RetryPolicy(attempts=1)) as c:
        return (await code_of(c.submit("test.work", {}))).code()


async def until_refused(client: AsyncClient) -> grpc.StatusCode:
    """Call until a call fails; its code."""
    async with asyncio.timeout(30):
        while True:
            try:
                await client.tenant_stats()
            except grpc.aio.AioRpcError as exc:
                return exc.code()
            await asyncio.sleep(0.05)


async def test_submits_and_reads_go_on_while_postgres_is_cut_off_and_nothing_is_lost(
    database_url: str,
) -> None:
    async with (
        proxied_database(database_url) as (proxy, proxied_url),
        running_cluster(proxied_url, **TOKEN_SETTINGS) as cluster,
        shard_loops(cluster),
        running_worker(cluster, database_url=proxied_url, db_retry_cap_s=0.3),
    ):
        coord = cluster.coordinator
        acme = await cluster.client("acme")
        globex = await cluster.client("globex")
        # Before the cut: each token is checked once, a job runs to its end, one waits.
        done = await acme.submit("test.work", {"n": -1}, request_id="before")
        assert (await acme.wait(done.job_id)).state == JobState.SUCCEEDED
        later = await acme.submit("test.work", {}, request_id="later", delay=3600)
        await globex.submit("test.work", {"n": -2}, request_id="globex-before")
        _, unseen = await coord.tokens.create("tenant", "initech")  # valid, never presented
        stale_before = coord.tokens.stale_answers

        proxy.cut()
        await revoke_elsewhere(database_url, await cluster.token_for("globex"))
        during = await submit_for(acme, OUTAGE_S)
        assert coord.tokens.stale_answers > stale_before, "the cache was never past its TTL"

        # Reads of jobs that need nothing from Postgres, a batch, the worker's side.
        assert (await acme.get(later.job_id)).state == JobState.SCHEDULED
        scheduled = await acme.list_jobs(JobState.SCHEDULED)
        assert [j.job_id for j in scheduled.items] == [later.job_id]
        items = await acme.submit_many(
            [common_pb2.JobSpec(request_id="batch-during", handler="test.work", payload=b"{}")]
        )
        assert items[0].job_id and items[0].error is None
        async with asyncio.timeout(30):  # the worker claims on, and holds what it claimed
            while not {r for r in await active_request_ids(acme) if r.startswith("during-")}:
                await asyncio.sleep(0.05)
        probe = await assignment_for_probe(cluster, cluster.admin_token)
        assert len(probe.shards) == len(cluster.shards)

        # What needs Postgres: the result of a succeeded job, a token never checked here.
        err = await code_of(acme.get(done.job_id))
        assert err.code() == grpc.StatusCode.UNAVAILABLE
        assert "result" in (err.details() or "")
        assert await refused_with(cluster, unseen) == grpc.StatusCode.UNAVAILABLE
        junk = "sq_0123456789ab_" + "A" * 43
        assert await refused_with(cluster, junk) == grpc.StatusCode.UNAVAILABLE
        assert await refused_with(cluster, "sq_bad") == grpc.StatusCode.UNAUTHENTICATED
        # Revoked meanwhile, but this coordinator cannot know it yet: the bounded price.
        await globex.submit("test.work", {"n": -3}, request_id="globex-during")

        proxy.restore()
        # Once Postgres answers, the revocation is read and honoured; the unseen token works.
        assert await until_refused(globex) == grpc.StatusCode.UNAUTHENTICATED
        async with AsyncClient(cluster.target, unseen, retry=RetryPolicy(attempts=1)) as c:
            assert (await c.submit("test.work", {"n": -4}, request_id="initech-after")).job_id

        # Nothing accepted is lost: every job runs and gets its row, once.
        accepted = {"before", "globex-before", "batch-during", "globex-during", "initech-after"}
        accepted |= {j.request_id for j in during}
        rows = await wait_for_rows(database_url, len(accepted), timeout_s=90)
        assert sorted(str(r["request_id"]) for r in rows) == sorted(accepted)
        assert {r["status"] for r in rows} == {"succeeded"}
        assert (await acme.get(done.job_id)).result["n"] == -1
        last = during[-1]
        async with asyncio.timeout(30):
            while (job := await acme.get(last.job_id)).state != JobState.SUCCEEDED:
                await asyncio.sleep(0.05)  # the ack follows the row
        assert job.result["n"] == len(during) - 1
