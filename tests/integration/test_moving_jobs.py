"""Jobs a mover has set aside (taken off the source's queues, not yet on the target: the
``moving`` state a mover killed mid-batch leaves until the next one resumes) stay the tenant's
jobs to the API: counted by GetTenantStats, listed by ListJobs, answered by GetJob, and
cancelled by CancelJob, at once and for good. Through the public API of a real coordinator on
real redis-server shards and Postgres, then the real ``shardq moves run``."""

from __future__ import annotations

from datetime import timedelta

from shardq.client import AsyncClient, JobState, job_spec
from shardq.shard.moving import ShardSide
from tests.integration.test_mover_failover import load_map
from tests.integration.test_tenant_moves_commands import shardq, tenants_on
from tests.support.cluster import running_cluster
from tests.support.coordinator_proc import wait_for

SCHEDULED, READY = JobState.SCHEDULED, JobState.READY


async def listing(client: AsyncClient, state: JobState) -> list[str]:
    """Every job ID ListJobs lists in ``state``, page after page."""
    found, token = [], ""
    while True:
        page = await client.list_jobs(state, page_size=2, page_token=token)
        found += [j.job_id for j in page]
        if not (token := page.next_page_token):
            return sorted(found)


async def test_jobs_set_aside_by_a_move_count_list_answer_and_cancel(database_url: str) -> None:
    async with running_cluster(database_url) as cluster:
        (tenant,) = tenants_on(cluster, 0, 1)
        client = await cluster.client(tenant)
        later = [job_spec("test.work", {"n": i}, delay=timedelta(hours=1)) for i in range(3)]
        now = [job_spec("test.work", {"n": i}) for i in range(3, 6)]
        ids = [str(s.job_id) for s in await client.submit_many([*later, *now])]
        scheduled, ready = ids[:3], ids[3:]
        recorded = await shardq(database_url, "tenants", "move", tenant, "1", "--no-move")
        assert recorded.code == 0, recorded.err

        async def moving() -> bool:
            return tenant in cluster.coordinator.shard_map.moves

        await wait_for(moving, bool, timeout_s=30, what="the coordinator seeing the move")
        # A mover takes every queued job of the tenant off the source, then dies.
        source = ShardSide(cluster.coordinator.pool.get(0)[0], tenant)
        assert await source.take(100) == 6
        assert sorted(await source.taken()) == sorted(ids)

        stats = await client.tenant_stats()
        assert (stats.scheduled, stats.ready) == (3, 3), stats
        # ListTenantStats counts each side apart: the set-aside jobs with the source.
        admin = await cluster.client()
        for shard_id, counts in ((0, (3, 3)), (1, (0, 0)), (None, (3, 3))):
            rows = [t for t in await admin.list_tenant_stats(shard_id) if t.tenant_id == tenant]
            assert (sum(r.scheduled for r in rows), sum(r.ready for r in rows)) == counts, rows
        listed = {state: await listing(client, state) for state in (SCHEDULED, READY)}
        assert listed == {SCHEDULED: sorted(scheduled), READY: sorted(ready)}
        assert [j.job_id for j in await client.list_jobs(SCHEDULED, page_size=2)] == sorted(
            scheduled
        )[:2]
        assert (await client.get(scheduled[0])).state == JobState.SCHEDULED
        assert (await client.get(ready[0])).state == JobState.READY

        for job_id in (scheduled[0], ready[0]):
            assert (await client.cancel(job_id)).state == JobState.CANCELLED
        stats = await client.tenant_stats()
        assert (stats.scheduled, stats.ready) == (2, 2), stats
        assert await listing(client, SCHEDULED) == sorted(scheduled[1:])

        # The next mover finishes the move: the cancelled jobs stay cancelled.
        run = await shardq(database_url, "moves", "run", tenant)
        assert run.code == 0, run.out + run.err
        assert (await load_map(database_url)).moves == {}
        for job_id in (scheduled[0], ready[0]):
            assert (await client.get(job_id)).state == JobState.CANCELLED
        stats = await client.tenant_stats()
        assert (stats.shard_id, stats.scheduled, stats.ready) == (1, 2, 2), stats


async def test_jobs_whose_payloads_fill_several_copies_all_arrive_whole(database_url: str) -> None:
    # 12 jobs of 40 KB: over a copy's 256 KB, so the mover copies (and drops) them in parts.
    async with running_cluster(database_url) as cluster:
        (tenant,) = tenants_on(cluster, 0, 1)
        client = await cluster.client(tenant)
        payloads = {f"r{i}": {"n": i, "blob": chr(ord("a") + i) * 40_000} for i in range(12)}
        items = await client.submit_many(
            [job_spec("test.work", p, request_id=rid) for rid, p in payloads.items()]
        )
        moved = await shardq(database_url, "tenants", "move", tenant, "1")
        assert moved.code == 0, moved.out + moved.err
        assert "12 jobs" in moved.out, moved.out
        assert (await load_map(database_url)).moves == {}
        for item in items:
            job = await client.get(str(item.job_id))
            assert job.payload == payloads[item.request_id]
        stats = await client.tenant_stats()
        assert (stats.shard_id, stats.ready) == (1, 12), stats
