"""A SubmitJobs call alone on its coordinator goes to the shard in pieces (``--submit-pieces``),
through the real gRPC API, a real redis-server shard and real Postgres: each job lands once,
in order, answered in order; with another call in flight it goes whole; a shard that lost its
scripts, refuses writes or is down, and a call given up halfway, leave the next call whole and
in order."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest
from redis.asyncio import Redis

from shardq.client import RetryPolicy, job_spec
from shardq.coordinator.server import parse_args, settings_from
from shardq.shard.keys import Keys
from shardq.v1 import common_pb2
from tests.support.cluster import Cluster, running_cluster


@pytest.fixture
async def cluster(database_url: str) -> AsyncIterator[Cluster]:
    async with running_cluster(database_url, shard_count=1) as c:
        yield c


@pytest.fixture
async def shard(cluster: Cluster) -> AsyncIterator[Redis]:
    r = Redis(port=cluster.shards[0].port)
    yield r
    await r.aclose()


async def commands_waiting(r: Redis) -> int:
    """Connections other than ``r``'s with a command read but not run (a CLIENT PAUSE)."""
    me = await r.client_id()
    clients = await r.client_list()
    return sum(
        1
        for c in clients
        if int(c["id"]) != me and (int(c.get("qbuf", 0)) > 0 or int(c.get("argv-mem", 0)) > 0)
    )


async def scripts_run(r: Redis) -> int:
    """EVALSHA calls the shard has run (the coordinator sends no other script unasked)."""
    stats = await r.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


def specs(prefix: str, n: int) -> list[common_pb2.JobSpec]:
    return [job_spec("h", {"i": i}, request_id=f"{prefix}{i}") for i in range(n)]


@pytest.mark.parametrize(
    ("pieces", "jobs", "scripts"),
    [(3, 100, 3), (3, 40, 2), (3, 31, 1), (1, 100, 1), (4, 1_000, 4)],
)
async def test_a_batch_alone_goes_in_its_pieces_each_job_once_and_in_order(
    database_url: str, pieces: int, jobs: int, scripts: int
) -> None:
    async with running_cluster(database_url, shard_count=1, submit_pieces=pieces) as cluster:
        r = Redis(port=cluster.shards[0].port)
        try:
            c = await cluster.client("acme")
            await c.submit("h", {})  # the scripts are loaded and the channel open
            before = await scripts_run(r)
            items = await c.submit_many(specs("p", jobs))
            assert await scripts_run(r) - before == scripts
            assert [(i.index, i.request_id, i.ok, i.deduplicated) for i in items] == [
                (k, f"p{k}", True, False) for k in range(jobs)
            ]
            ready = await r.lrange(Keys("sq").ready("acme", "default", 0), 0, -1)
            assert [x.decode() for x in ready[1:]] == [str(i.job_id) for i in items]
            again = await c.submit_many(specs("p", jobs))
            assert [(i.job_id, i.deduplicated) for i in again] == [(i.job_id, True) for i in items]
            assert (await c.tenant_stats()).submitted_total == jobs + 1
        finally:
            await r.aclose()


async def test_a_batch_in_pieces_answers_and_counts_each_job_new_deduplicated_or_refused(
    database_url: str,
) -> None:
    # The answer of a call in pieces is made a piece at a time, and the metrics counted as it
    # is: mixed items in each piece come back in order, each counted once by what it became.
    async with running_cluster(database_url, shard_count=1, submit_pieces=3) as cluster:
        c = await cluster.client("acme")
        await c.submit_many(specs("seen", 60))
        registry = cluster.coordinator.metrics_registry

        def counted() -> tuple[float | None, ...]:
            return (
                registry.get_sample_value("shardq_coordinator_jobs_submitted_total"),
                registry.get_sample_value("shardq_coordinator_dedupe_hits_total"),
                registry.get_sample_value(
                    "shardq_coordinator_submit_refused_total", {"code": "INVALID_ARGUMENT"}
                ),
            )

        assert counted() == (60, 0, None)
        batch = []
        for k in range(120):  # every third seen before, every seventh refused
            spec = job_spec("h", {"i": k}, request_id=f"seen{k}" if k % 3 == 0 else f"new{k}")
            if k % 7 == 0:
                spec.priority = 99
            batch.append(spec)
        items = await c.submit_many(batch)
        refused = [k for k in range(120) if k % 7 == 0]
        deduplicated = [k for k in range(60) if k % 3 == 0 and k % 7]  # seen0..seen59
        assert [i.index for i in items] == list(range(120))
        assert [k for k, i in enumerate(items) if not i.ok] == refused
        assert {items[k].error.field for k in refused} == {"job.priority"}  # type: ignore[union-attr]
        assert [k for k, i in enumerate(items) if i.deduplicated] == deduplicated
        assert [i.request_id for i in items if i.ok] == [
            s.request_id for k, s in enumerate(batch) if k % 7
        ]
        new = 120 - len(refused) - len(deduplicated)
        assert counted() == (60 + new, len(deduplicated), len(refused))


async def test_a_batch_goes_whole_while_another_is_in_flight(
    cluster: Cluster, shard: Redis
) -> None:
    c = await cluster.client("acme")
    await c.submit("h", {})
    gate = cluster.coordinator.gate
    before = await scripts_run(shard)
    await shard.client_pause(10_000, all=False)  # scripts wait: they may write
    try:
        first = asyncio.create_task(c.submit_many(specs("a", 100)))
        while gate.batch_calls < 1 or await commands_waiting(shard) < 1:
            await asyncio.sleep(0.01)
        second = asyncio.create_task(c.submit_many(specs("b", 100)))
        while await commands_waiting(shard) < 2:  # the second call's script has been sent
            await asyncio.sleep(0.01)
    finally:
        await shard.client_unpause()
    a, b = await first, await second
    assert await scripts_run(shard) - before == 3 + 1
    assert all(i.ok for i in a + b)
    assert (await c.tenant_stats()).submitted_total == 201


async def test_a_batch_to_a_shard_that_is_down_is_unavailable(cluster: Cluster) -> None:
    c = await cluster.client("acme", retry=RetryPolicy(attempts=1))
    await c.submit("h", {})
    cluster.shards[0].kill()
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await c.submit_many(specs("d", 100))
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE


def test_the_pieces_come_from_a_flag_or_its_variable_and_are_one_or_more(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = ["--database-url", "postgresql://db/shardq"]
    assert settings_from(parse_args(url)).submit_pieces == 3
    assert settings_from(parse_args([*url, "--submit-pieces", "1"])).submit_pieces == 1
    monkeypatch.setenv("SHARDQ_SUBMIT_PIECES", "5")
    assert settings_from(parse_args(url)).submit_pieces == 5
    with pytest.raises(SystemExit, match="--submit-pieces must be 1 or more"):
        settings_from(parse_args([*url, "--submit-pieces", "0"]))


async def test_a_batch_in_pieces_loads_the_script_where_the_shard_has_lost_it(
    cluster: Cluster, shard: Redis
) -> None:
    c = await cluster.client("acme")
    await c.submit("h", {})
    await shard.script_flush()  # as a restarted shard without its scripts
    items = await c.submit_many(specs("f", 100))
    assert all(i.ok and not i.deduplicated for i in items)
    assert (await c.tenant_stats()).submitted_total == 101


async def test_a_piece_refused_by_the_shard_fails_the_call_and_the_next_call_lands(
    cluster: Cluster, shard: Redis
) -> None:
    c = await cluster.client("acme", retry=RetryPolicy(attempts=1))
    await c.submit("h", {})
    await shard.config_set("maxmemory", "1")  # every script that may write: OOM
    try:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await c.submit_many(specs("o", 100))
        assert info.value.code() != grpc.StatusCode.OK
    finally:
        await shard.config_set("maxmemory", "0")
    items = await c.submit_many(specs("n", 100))
    assert [i.request_id for i in items if i.ok] == [f"n{k}" for k in range(100)]
    assert (await c.tenant_stats()).submitted_total == 101


async def test_a_call_given_up_while_its_pieces_wait_leaves_the_next_call_whole(
    cluster: Cluster, shard: Redis
) -> None:
    c = await cluster.client("acme", retry=RetryPolicy(attempts=1))
    await c.submit("h", {})
    hasty = await cluster.client("acme", retry=RetryPolicy(attempts=1), timeout_s=0.5)
    await shard.client_pause(10_000, all=False)
    try:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await hasty.submit_many(specs("g", 100))
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        gate = cluster.coordinator.gate
        while gate.batch_calls:  # the call's pieces have been cancelled, the row closed
            await asyncio.sleep(0.01)
    finally:
        await shard.client_unpause()
    items = await c.submit_many(specs("k", 100))
    assert [i.request_id for i in items if i.ok] == [f"k{n}" for n in range(100)]
    ready = await shard.lrange(Keys("sq").ready("acme", "default", 0), 0, -1)
    ids = [x.decode() for x in ready]
    assert ids[-100:] == [str(i.job_id) for i in items]  # in order, after what landed before
