"""Delayed jobs that come due while their tenant moves start on time: a job the mover has set
aside (off the source's queues, where nothing runs it) when it comes due arrives on the target
ready, without waiting for the target's shard loop; and the mover copies what it sets aside
at once and due soonest first, so a due job never waits for the copies of others.

On real redis-server shards: the copy step alone (move_in.lua, on a fake clock), then a real
coordinator, Postgres and ``shardq moves run`` with no shard loop running anywhere (so nothing
but the move itself can make a job ready), then the mover's copies as they land."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from shardq.client import JobState, job_spec
from shardq.coordinator.mover import Mover, RedisShards
from shardq.coordinator.shardmap import ShardMapStore
from shardq.shard import FakeClock, ShardClient
from shardq.shard.moving import DedupeCopy, JobCopy, ScheduleCopy, ShardSide
from shardq.shard.records import JobState as ShardState
from tests.integration.test_lua_move import target, target_redis
from tests.integration.test_tenant_moves_commands import shardq, tenants_on
from tests.support.cluster import running_cluster
from tests.support.shard import LEASE, NOW, job

__all__ = ["target", "target_redis"]  # fixtures


async def test_a_job_due_while_set_aside_is_ready_on_the_target_right_after_the_copy(
    shard: ShardClient, target: ShardClient, clock: FakeClock
) -> None:
    await shard.enqueue([job("J1", delay_ms=5_000), job("J2", delay_ms=60_000)])
    src, dst = ShardSide(shard, "acme"), ShardSide(target, "acme")
    assert await src.take(10) == 2
    clock.advance(6_000)  # J1 comes due while the mover has it set aside
    assert await dst.put(jobs=await src.read_jobs(await src.taken())) == (2, 0, 0)

    # No promote on the target: J1 is claimable straight after the copy, J2 still waits.
    j1, j2 = await target.get_job("acme", "J1"), await target.get_job("acme", "J2")
    assert (j1.state, j2.state) == (ShardState.READY, ShardState.SCHEDULED)
    assert j1.run_at_ms == NOW + 5_000  # its run-at as it was
    counts = await target.counts("acme")
    assert (counts.ready, counts.scheduled) == (1, 1), counts
    assert [c.job_id for c in await target.claim("w1", 10, LEASE)] == ["J1"]
    # Repeating the copy (a re-run mover) adds nothing, and J2 becomes ready when due.
    assert await dst.put(jobs=await src.read_jobs(["J1", "J2"])) == (0, 0, 0)
    clock.advance(60_000)
    assert (await target.promote())[0] == 1
    assert [c.job_id for c in await target.claim("w1", 10, LEASE)] == ["J2"]


def at(delay_s: float) -> datetime:
    return datetime.now(UTC) + timedelta(seconds=delay_s)


async def test_a_job_that_came_due_before_its_move_is_ready_on_the_target_with_no_loop(
    database_url: str,
) -> None:
    async with running_cluster(database_url) as cluster:  # no shard loop runs here
        (tenant,) = tenants_on(cluster, 0, 1)
        client = await cluster.client(tenant)
        items = await client.submit_many(
            [job_spec("test.work", {"n": 0}, run_at=at(0.2))]
            + [job_spec("test.work", {"n": i}, delay=timedelta(hours=1)) for i in range(1, 4)]
        )
        due, later = str(items[0].job_id), [str(i.job_id) for i in items[1:]]
        run_at = (await client.get(due)).run_at
        assert run_at is not None
        while run_at.timestamp() >= time.time():
            await asyncio.sleep(0.05)  # until it is due (still scheduled: no loop promotes it)
        assert (await client.get(due)).state == JobState.SCHEDULED

        run = await shardq(database_url, "tenants", "move", tenant, "1")
        assert run.code == 0, run.out + run.err

        assert (await client.get(due)).state == JobState.READY
        assert {(await client.get(j)).state for j in later} == {JobState.SCHEDULED}
        stats = await client.tenant_stats()
        assert (stats.shard_id, stats.ready, stats.scheduled) == (1, 1, 3), stats


class Recorder:
    """Each copy the target gets, with what the source holds set aside at that moment."""

    def __init__(self, source: ShardSide) -> None:
        self.source = source
        self.copies: list[tuple[list[str], list[str]]] = []

    def wrap(self, put: Any) -> Any:
        async def recorded(
            side: ShardSide,
            jobs: Sequence[JobCopy] = (),
            dedupe: Sequence[DedupeCopy] = (),
            schedules: Sequence[ScheduleCopy] = (),
        ) -> tuple[int, int, int]:
            if jobs and any(j.state in (ShardState.SCHEDULED, ShardState.READY) for j in jobs):
                aside = await self.source.taken()
                self.copies.append(([j.job_id for j in jobs], aside))
            result: tuple[int, int, int] = await put(side, jobs, dedupe, schedules)
            return result

        return recorded


@pytest.mark.timeout(120)
async def test_the_mover_copies_what_it_sets_aside_at_once_and_due_soonest_first(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with running_cluster(database_url) as cluster:
        (tenant,) = tenants_on(cluster, 0, 1)
        client = await cluster.client(tenant)
        # 120 jobs due in an hour or more, submitted before one due in a minute (whatever
        # their job IDs), and one ready job.
        later = [job_spec("test.work", {"n": i}, delay=timedelta(hours=1, seconds=i))
                 for i in range(120)]  # fmt: skip
        items = await client.submit_many(later)
        soon = await client.submit("test.work", {"n": -1}, delay=timedelta(minutes=1))
        ready = await client.submit("test.work", {"n": -2})
        recorded = await shardq(database_url, "tenants", "move", tenant, "1", "--no-move")
        assert recorded.code == 0, recorded.err

        shards = RedisShards(settings=cluster.settings.shard)
        store: ShardMapStore = cluster.coordinator.store
        smap = await store.load()
        source = ShardSide(shards.client(smap.shards[0]), tenant)
        recorder = Recorder(source)
        monkeypatch.setattr(ShardSide, "put", recorder.wrap(ShardSide.put))
        try:
            reports = await Mover(store, shards, copy_batch=50).run([tenant])
        finally:
            await shards.close()
        assert [r.finished for r in reports] == [True]

        copies = [ids for ids, _ in recorder.copies]
        assert sorted(j for ids in copies for j in ids) == sorted(
            [str(i.job_id) for i in items] + [str(soon.job_id), str(ready.job_id)]
        )
        # Nothing set aside waits for the copy of another job: each copy carries every job
        # set aside at that moment.
        for ids, aside in recorder.copies:
            assert sorted(ids) == aside
        # The soonest due scheduled job goes in the first copy, before any of the later ones.
        assert str(soon.job_id) in copies[0]
        stats = await client.tenant_stats()
        assert (stats.shard_id, stats.scheduled, stats.ready) == (1, 121, 1), stats
