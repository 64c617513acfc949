"""First claims started at once, and delayed jobs looked up ahead of their run-at
(``shard/precheck.py``): a worker starts a never-claimed job at once and looks its row up
alongside, stopping the run if a final row is there; the leading shard loop marks the
never-claimed delayed jobs a final row answers for, whose first claim is looked up first.

Real Redis (a fake clock), real Postgres; the walk is driven a pass at a time, the worker is a
real one in this process.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
from redis.asyncio import Redis

from shardq.shard import Failure, FakeClock, NewJob, ShardClient, precheck
from shardq.shard.keys import Keys
from shardq.shard.precheck import Prechecker, PrecheckSettings
from shardq.shard.records import PrecheckPage
from shardq.store.db import psycopg_dsn
from shardq.store.results import ResultRow, ResultStore
from tests.support import handlers
from tests.support.cluster import Cluster, running_cluster
from tests.support.shard import LEASE, NOW, job
from tests.support.workers import result_rows, running_worker

AHEAD = PrecheckSettings().ahead_ms


def row(tenant: str, request_id: str, status: str = "succeeded") -> ResultRow:
    return ResultRow(
        tenant_id=tenant, request_id=request_id, job_id="EARLIER", shard_id=0, handler="h",
        status=status, attempts=1, fence=1, worker_id="w0", queued_ms=1, started_ms=2,
        finished_ms=3, result={"by": "the earlier job"},
    )  # fmt: skip


async def marked(redis: Redis, settings_prefix: str, *jids: str) -> dict[str, bool]:
    keys = Keys(settings_prefix)
    return {j: await redis.hget(keys.job(j), "ck") == b"d" for j in jids}


def count(pre: Prechecker, result: str) -> float:
    return pre.metrics.jobs.labels(shard=pre.metrics.shard_id, result=result)._value.get()


# --- the walk -------------------------------------------------------------------------------


async def test_a_walk_marks_the_delayed_jobs_due_soon_that_a_final_row_answers_for(
    shard: ShardClient, redis: Redis, result_store: ResultStore
) -> None:
    await result_store.write([row("acme", "rDONE"), row("acme", "rDEAD", "dead")])
    await shard.enqueue(
        [
            job("SOON", delay_ms=AHEAD // 2),
            job("DONE", delay_ms=AHEAD // 2),  # a resubmit after the window: its row exists
            job("DEAD", delay_ms=AHEAD // 2),  # a dead row is replaced by a later run
            job("LATER", delay_ms=AHEAD * 3),  # out of reach this pass
            job("NOW"),  # ready already: its worker looks it up
        ]
    )
    pre = Prechecker(shard, result_store)
    await pre.walk()
    prefix = shard.settings.key_prefix
    assert await marked(redis, prefix, "SOON", "DONE", "DEAD", "LATER", "NOW") == {
        "SOON": False, "DONE": True, "DEAD": False, "LATER": False, "NOW": False,
    }  # fmt: skip
    assert (count(pre, "clean"), count(pre, "done")) == (2, 1)
    # The next pass reads on from where this one stopped: nothing is looked up twice.
    await pre.walk()
    assert (count(pre, "clean"), count(pre, "done")) == (2, 1)


async def test_a_walk_goes_through_more_equal_run_ats_than_one_call_reads(
    shard: ShardClient, redis: Redis, result_store: ResultStore
) -> None:
    jids = [f"J{i}" for i in range(11)]
    await shard.enqueue([job(j, run_at_ms=NOW + 500) for j in jids])
    await shard.enqueue([job("K", run_at_ms=NOW + 501)])
    await result_store.write([row("acme", f"r{j}") for j in jids[::2]])
    pre = Prechecker(shard, result_store, PrecheckSettings(batch=3))
    await pre.walk()
    found = await marked(redis, shard.settings.key_prefix, *jids, "K")
    assert [j for j, m in found.items() if m] == jids[::2]
    assert (count(pre, "clean"), count(pre, "done")) == (6, 6)


async def test_a_walk_goes_through_many_tenants_a_page_of_entries_at_a_time(
    shard: ShardClient, redis: Redis, result_store: ResultStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tenants passed a few at a call, and calls that stop inside a tenant's range: every job
    due in reach is read once, whatever tenant it belongs to."""
    monkeypatch.setattr(precheck, "TENANTS_PER_CALL", 2)
    tenants = [f"t{n}" for n in range(5)]
    soon = [job(f"{t}x{i}", tenant=t, delay_ms=100 + 10 * i) for t in tenants for i in range(4)]
    await shard.enqueue([*soon, job("FAR", tenant="t0", delay_ms=AHEAD * 5)])
    await result_store.write([row(j.tenant, j.request_id) for j in soon] + [row("t0", "rFAR")])
    calls = []
    page_of = shard.precheck_page

    async def counted(*args: Any, **kwargs: Any) -> PrecheckPage:
        calls.append(args[2])
        return await page_of(*args, **kwargs)

    monkeypatch.setattr(shard, "precheck_page", counted)
    pre = Prechecker(shard, result_store, PrecheckSettings(batch=3))
    await pre.walk()
    ids = [j.job_id for j in soon]
    assert all((await marked(redis, shard.settings.key_prefix, *ids)).values())
    assert not (await marked(redis, shard.settings.key_prefix, "FAR"))["FAR"]
    assert count(pre, "done") == 20
    assert all(len(c) <= 2 for c in calls) and len(calls) >= 20 // 3
    await pre.walk()  # the next pass reads on from where this one ended
    assert count(pre, "done") == 20


async def test_a_job_claimed_once_is_neither_listed_nor_marked_and_its_next_claim_looks_up(
    shard: ShardClient, redis: Redis, clock: FakeClock, result_store: ResultStore
) -> None:
    await shard.enqueue([job("J1", delay_ms=100)])
    await Prechecker(shard, result_store).walk()
    clock.advance(100)
    await shard.promote()
    (first,) = await shard.claim("w1", 1, LEASE)
    assert first.at_once  # never claimed, not found done ahead: the worker starts it at once
    # It fails and waits for its retry: scheduled again, but its run may have written a row.
    await shard.fail([Failure("J1", first.fence, 1, "boom", retry_at_ms=NOW + 1_000)])
    page = await shard.precheck_page(NOW, NOW + AHEAD, ["acme"])
    assert (page.tenants_done, page.offset, page.jobs) == (1, 0, [])
    assert await shard.mark_prechecked(["J1"]) == 0
    clock.advance(1_000)
    await shard.promote()
    (second,) = await shard.claim("w1", 1, LEASE)
    assert (second.attempt, second.at_once) == (2, False)


async def test_a_first_claim_starts_at_once_unless_the_walk_found_the_job_done(
    shard: ShardClient,
) -> None:
    await shard.enqueue([job("J1"), job("J2")])  # ready at once: no walk reads them
    assert await shard.mark_prechecked(["J2"]) == 1
    claimed = await shard.claim("w1", 2, LEASE)
    assert {c.job_id: c.at_once for c in claimed} == {"J1": True, "J2": False}


async def test_a_failing_database_leaves_jobs_unmarked_and_the_next_pass_marks_them(
    shard: ShardClient, redis: Redis, result_store: ResultStore
) -> None:
    await shard.enqueue([job("J1", delay_ms=500)])
    await result_store.write([row("acme", "rJ1")])
    down = ResultStore("postgresql://nobody@127.0.0.1:1/none?connect_timeout=1")
    try:
        with pytest.raises(psycopg.OperationalError):
            await Prechecker(shard, down).walk()
    finally:
        await down.close()
    pre = Prechecker(shard, result_store)
    assert not (await marked(redis, shard.settings.key_prefix, "J1"))["J1"]
    await pre.walk()
    assert (await marked(redis, shard.settings.key_prefix, "J1"))["J1"]


# --- the worker -----------------------------------------------------------------------------


@pytest.fixture
async def cluster(database_url: str) -> AsyncIterator[Cluster]:
    async with running_cluster(database_url, shard_count=1) as c:
        yield c


@pytest.mark.timeout(120)
@pytest.mark.parametrize("found_ahead", [False, True], ids=["started", "marked-by-the-walk"])
async def test_a_first_claim_whose_row_turns_up_is_stopped_and_acked_without_a_second_row(
    cluster: Cluster, found_ahead: bool
) -> None:
    """A first claim can have a final row: the same request_id submitted again after its
    dedupe window, once the first job ended, or a Redis that lost acknowledged writes (a
    failover without replica acks) losing the claim of a run that committed its row. The
    worker starts it at once, finds the row alongside, and stops the run; a job the walk
    marked as found done is looked up first, and its handler never starts."""
    tenant, rid = "acme", f"lost-claim-{found_ahead}"
    store = ResultStore(psycopg_dsn(cluster.database_url))
    try:
        await store.write([row(tenant, rid)])
    finally:
        await store.close()
    redis = Redis(port=cluster.shards[0].port)
    try:
        client = ShardClient(redis, cluster.settings.shard)
        payload = json.dumps({"n": 2, "ms": 60_000}).encode()
        new = NewJob(tenant=tenant, handler="test.work", payload=payload, request_id=rid)
        (res,) = await client.enqueue([new])
        if found_ahead:
            assert await client.mark_prechecked([res.job_id]) == 1
        handlers.EXECUTIONS[rid] = 0
        async with running_worker(cluster, handlers=["test.work"]):
            # Acked long before the handler's minute is up: its run was stopped.
            async with asyncio.timeout(45):
                while (await client.get_job(tenant, res.job_id)).state != "succeeded":
                    await asyncio.sleep(0.05)
        # Started without a lookup first, unless marked.
        assert handlers.EXECUTIONS[rid] == (0 if found_ahead else 1)
        (found,) = await result_rows(cluster.database_url)
        assert (found["job_id"], found["result"]) == ("EARLIER", {"by": "the earlier job"})
    finally:
        await redis.aclose()


async def test_a_first_claim_whose_handler_returned_is_not_looked_up_and_its_row_stands(
    cluster: Cluster,
) -> None:
    """The lookup alongside a first claim can only stop a run still going: a handler that
    returns in its first step (``echo``) is not looked up, and its late completion meets the
    final row, which stands. One that awaits (``test.work``) is looked up as before."""
    tenant = "acme"
    store = ResultStore(psycopg_dsn(cluster.database_url))
    try:
        await store.write([row(tenant, "quick"), row(tenant, "slow")])
    finally:
        await store.close()
    looked_up: list[tuple[str, str]] = []
    redis = Redis(port=cluster.shards[0].port)
    try:
        client = ShardClient(redis, cluster.settings.shard)
        async with running_worker(cluster, handlers=["echo", "test.work"]) as worker:
            real = worker.results.already_done

            async def spy(keys: Any) -> set[tuple[str, str]]:
                keys = list(keys)
                looked_up.extend(keys)
                return await real(keys)

            worker.results.already_done = spy  # type: ignore[method-assign]
            quick, slow = await client.enqueue([
                NewJob(tenant=tenant, handler="echo", payload=b"{}", request_id="quick"),
                NewJob(tenant=tenant, handler="test.work", payload=b'{"ms": 60000}',
                       request_id="slow"),
            ])  # fmt: skip
            async with asyncio.timeout(45):
                for res in (quick, slow):
                    while (await client.get_job(tenant, res.job_id)).state != "succeeded":
                        await asyncio.sleep(0.05)
        assert (tenant, "quick") not in looked_up
        assert (tenant, "slow") in looked_up
        rows = {r["request_id"]: r for r in await result_rows(cluster.database_url)}
        assert {rid: r["job_id"] for rid, r in rows.items()} == {
            "quick": "EARLIER",
            "slow": "EARLIER",
        }
    finally:
        await redis.aclose()
