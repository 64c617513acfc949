"""Job format 3 (``FOLDED_FORMAT``) on a real Redis: a job's ID is derived from (tenant,
request_id), its hash holds the digest and is its request ID's dedupe record while it lives;
every way a job ends writes the dedupe key for what is left of the window; keys of the older
formats still deduplicate; the readers of dedupe records (a move's router, its cron check) find
a live job by its derived ID, in Python and in Lua alike."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import grpc
import pytest
from redis.asyncio import Redis

from shardq.shard import FakeClock, ItemCode, ShardClient, TenantLimits
from shardq.shard.client import MIN_DEDUPE_WINDOW_S
from shardq.shard.cron import tick_request_id
from shardq.shard.models import Failure, Lease, ScheduleSpec
from shardq.shard.moving import ShardSide
from shardq.shard.records import FOLDED_FORMAT, DedupeEntry, JobState, derived_job_id
from tests.integration.test_tenant_moves_commands import shardq, tenants_on
from tests.support.cluster import running_cluster
from tests.support.shard import DIGEST, LEASE, job

DAY = 86_400_000
J1 = derived_job_id("acme", "rJ1")


@pytest.fixture
async def folded(shard: ShardClient) -> ShardClient:
    assert await shard.raise_job_format(FOLDED_FORMAT) == (1, FOLDED_FORMAT)
    return shard


def test_a_derived_id_is_26_hex_digits_one_per_tenant_and_request() -> None:
    assert len(J1) == 26 and int(J1, 16) >= 0 and J1.lower() == J1
    # Another request ID or another tenant: another ID.
    assert len({J1, derived_job_id("acme", "rJ2"), derived_job_id("globex", "rJ1")}) == 3


async def test_a_job_takes_the_id_of_its_request_and_no_dedupe_key_while_it_lives(
    folded: ShardClient, redis: Redis
) -> None:
    changed = job("J1")._replace(payload=b'{"x": 1}')
    first, again, conflict, elsewhere = await folded.enqueue(
        [job("J1"), job("J1"), changed, job("J1", tenant="globex")]
    )
    assert (first.code, first.job_id) == (ItemCode.OK, J1)  # the given "J1" is not used
    assert await redis.hget(f"sq:job:{J1}", "d") == DIGEST.encode()
    assert not await redis.exists("sq:dedupe:acme:rJ1")
    assert (again.code, again.job_id, again.state) == (ItemCode.DEDUPLICATED, J1, "ready")
    assert (conflict.code, conflict.job_id) == (ItemCode.CONFLICT, J1)
    assert (elsewhere.code, elsewhere.job_id) == (ItemCode.OK, derived_job_id("globex", "rJ1"))
    record = await folded.get_job("acme", J1)
    assert (record.request_id, record.digest, record.state) == ("rJ1", DIGEST, JobState.READY)
    # One job made, whatever was sent again.
    assert (await folded.counts("acme")).submitted == 1


async def _ack(shard: ShardClient, _clock: FakeClock) -> None:
    (c,) = await shard.claim("w1", 1, LEASE)
    assert await shard.ack([Lease(c.job_id, c.fence)]) == [ItemCode.OK]


async def _fail_dead(shard: ShardClient, _clock: FakeClock) -> None:
    (c,) = await shard.claim("w1", 1, LEASE)
    (res,) = await shard.fail([Failure(c.job_id, c.fence, 1, "boom", permanent=True)])
    assert res.state == "dead"


async def _cancel(shard: ShardClient, _clock: FakeClock) -> None:
    assert await shard.cancel("acme", J1) == (ItemCode.OK, JobState.CANCELLED)


async def _reap_dead(shard: ShardClient, clock: FakeClock) -> None:
    await shard.claim("w1", 1, LEASE)
    clock.advance(LEASE)
    assert await shard.reap() == (0, 1)


async def _release_cancelled(shard: ShardClient, _clock: FakeClock) -> None:
    (c,) = await shard.claim("w1", 1, LEASE)
    assert (await shard.cancel("acme", J1))[0] is ItemCode.CANCEL_REQUESTED
    assert await shard.release([Lease(c.job_id, c.fence)]) == [ItemCode.CANCELLED]


ENDINGS: dict[str, Callable[[ShardClient, FakeClock], Awaitable[None]]] = {
    "ack": _ack,
    "fail": _fail_dead,
    "cancel": _cancel,
    "reap": _reap_dead,
    "release": _release_cancelled,
}


@pytest.mark.parametrize("ending", sorted(ENDINGS))
async def test_every_end_writes_the_dedupe_key_for_what_is_left_of_the_window(
    folded: ShardClient, redis: Redis, clock: FakeClock, ending: str
) -> None:
    (made,) = await folded.enqueue([job("J1", max_attempts=1)])
    clock.advance(3_600_000)  # an hour after its submit
    await ENDINGS[ending](folded, clock)
    assert await redis.get("sq:dedupe:acme:rJ1") == f"{J1} {DIGEST}".encode()
    left = DAY - (clock.now_ms() - made.created_at_ms)
    assert left - 60_000 < await redis.pttl("sq:dedupe:acme:rJ1") <= left
    (again,) = await folded.enqueue([job("J1", max_attempts=1)])
    assert (again.code, again.job_id) == (ItemCode.DEDUPLICATED, J1)


async def test_a_tenants_own_window_counts_from_the_submit_and_a_spent_one_writes_no_key(
    folded: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    await folded.set_limits("acme", TenantLimits(dedupe_window_s=MIN_DEDUPE_WINDOW_S))
    await folded.enqueue([job("J1"), job("J2")])
    clock.advance(1_000)
    (c1,) = await folded.claim("w1", 1, LEASE)
    await folded.ack([Lease(c1.job_id, c1.fence)])
    left = MIN_DEDUPE_WINDOW_S * 1000 - 1_000
    assert left - 60_000 < await redis.pttl("sq:dedupe:acme:rJ1") <= left
    clock.advance(MIN_DEDUPE_WINDOW_S * 1000)  # J2 outlives its window: still deduplicated
    (live,) = await folded.enqueue([job("J2")])
    assert (live.code, live.state) == (ItemCode.DEDUPLICATED, "ready")
    (c2,) = await folded.claim("w1", 1, LEASE)
    await folded.ack([Lease(c2.job_id, c2.fence)])
    assert not await redis.exists("sq:dedupe:acme:rJ2")
    # Ended, past its window: a resubmit is a new job, at the same ID (the retained hash of
    # the first is replaced), as it would be a new job with a new ID below this format.
    (new,) = await folded.enqueue([job("J2")])
    assert (new.code, new.job_id, new.state) == (ItemCode.OK, c2.job_id, "ready")
    record = await folded.get_job("acme", c2.job_id)
    assert (record.state, record.attempts, record.created_at_ms) == (
        JobState.READY,
        0,
        clock.now_ms(),
    )
    assert (await folded.counts("acme")).submitted == 3


async def test_a_dead_job_past_its_window_is_replaced_and_leaves_the_dead_set(
    folded: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    await folded.enqueue([job("J1")])
    (c,) = await folded.claim("w1", 1, LEASE)
    await folded.fail([Failure(c.job_id, c.fence, 1, "boom", permanent=True)])
    assert (await folded.counts("acme")).dead == 1
    clock.advance(DAY)
    await redis.delete("sq:dedupe:acme:rJ1")  # what Redis does at its TTL (real time here)
    (again,) = await folded.enqueue([job("J1")])
    assert (again.code, again.job_id) == (ItemCode.OK, J1)
    assert (await folded.counts("acme")).dead == 0
    assert not await redis.zscore("sq:dead:acme", J1)
    (c,) = await folded.claim("w1", 1, LEASE)
    assert (c.job_id, c.attempt) == (J1, 1)


async def test_a_job_cancelled_while_ready_is_replaced_without_its_stale_list_entry(
    folded: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    await folded.enqueue([job("J1", priority=5)])
    await folded.cancel("acme", J1)
    assert await redis.lrange("sq:ready:acme:default:5", 0, -1) == [J1.encode()]  # lazily
    clock.advance(DAY)
    await redis.delete("sq:dedupe:acme:rJ1")
    score = await redis.zscore("sq:outbox", J1)
    assert score is not None
    await folded.rows_written([(J1, int(score), "cancelled")])
    (again,) = await folded.enqueue([job("J1", queue="other")])
    assert again.code is ItemCode.OK
    assert await redis.lrange("sq:ready:acme:default:5", 0, -1) == []
    assert await folded.claim("w1", 1, LEASE) == []  # the default queue has none
    (c,) = await folded.claim("w1", 1, LEASE, queues=["other"])
    assert c.job_id == J1


async def test_an_ended_job_whose_row_is_not_written_yet_still_answers(
    folded: ShardClient, redis: Redis, clock: FakeClock
) -> None:
    await folded.enqueue([job("J1")])
    await folded.cancel("acme", J1)  # on the outbox until the shard loop writes its row
    clock.advance(DAY)
    await redis.delete("sq:dedupe:acme:rJ1")
    (again,) = await folded.enqueue([job("J1")])
    assert (again.code, again.state) == (ItemCode.DEDUPLICATED, "cancelled")


async def test_one_ack_of_two_tenants_gives_each_key_its_own_tenants_window(
    folded: ShardClient, redis: Redis
) -> None:
    await folded.set_limits("brief", TenantLimits(dedupe_window_s=MIN_DEDUPE_WINDOW_S))
    await folded.enqueue([job("J1", tenant="brief"), job("J1", tenant="acme")])
    claimed = await folded.claim("w1", 2, LEASE)
    assert len(claimed) == 2
    await folded.ack([Lease(c.job_id, c.fence) for c in claimed])
    assert 0 < await redis.pttl("sq:dedupe:brief:rJ1") <= MIN_DEDUPE_WINDOW_S * 1000
    assert DAY - 60_000 < await redis.pttl("sq:dedupe:acme:rJ1") <= DAY


async def test_a_dedupe_key_of_an_older_format_still_answers_after_the_raise(
    shard: ShardClient, redis: Redis
) -> None:
    (old,) = await shard.enqueue([job("OLD")])
    assert old.job_id == "OLD" and await redis.exists("sq:dedupe:acme:rOLD")
    await shard.raise_job_format(FOLDED_FORMAT)
    (again,) = await shard.enqueue([job("OLD")])
    assert (again.code, again.job_id, again.state) == (ItemCode.DEDUPLICATED, "OLD", "ready")
    assert not await redis.exists(f"sq:job:{derived_job_id('acme', 'rOLD')}")
    # An old job ends as it did: its key was written at its submit and stays as it was.
    ttl = await redis.pttl("sq:dedupe:acme:rOLD")
    (c,) = await shard.claim("w1", 1, LEASE)
    await shard.ack([Lease(c.job_id, c.fence)])
    assert ttl - 60_000 < await redis.pttl("sq:dedupe:acme:rOLD") <= ttl


async def test_dedupe_entries_find_a_live_job_by_its_derived_id_and_an_ended_one_by_its_key(
    folded: ShardClient, redis: Redis
) -> None:
    await folded.enqueue([job("J1"), job("J2")])
    (c,) = await folded.claim("w1", 1, LEASE)
    await folded.ack([Lease(c.job_id, c.fence)])
    await redis.delete(f"sq:job:{c.job_id}")  # past its retention: only the key is left
    entries = await folded.dedupe_entries("acme", ["rJ1", "rJ2", "rJ3"])
    assert entries == [
        DedupeEntry(J1, DIGEST),
        DedupeEntry(derived_job_id("acme", "rJ2"), DIGEST),
        None,
    ]
    assert c.job_id == J1  # the ended one was J1, FIFO


async def test_a_cron_tick_fired_here_is_seen_by_lua_and_python_alike(
    folded: ShardClient, redis: Redis
) -> None:
    spec = ScheduleSpec("every-minute", "* * * * *", "h", b"{}")
    schedule = await folded.upsert_schedule("acme", spec)
    rid = tick_request_id("every-minute", schedule.next_tick_ms)
    side = ShardSide(folded, "acme")
    assert not await side.fired("every-minute", schedule.next_tick_ms)
    await folded.enqueue([job("T")._replace(request_id=rid, handler="h")])
    assert await side.fired("every-minute", schedule.next_tick_ms)  # Python's derivation
    assert await side.take_schedules() == 1
    raw = await redis.hget("sq:movingsched:acme", "every-minute")
    assert raw is not None and raw.decode().split(" ")[1] == "1"  # Lua's derivation
    (copy,) = await side.taken_schedules()
    assert copy.next_tick_ms > schedule.next_tick_ms  # the target starts at the next tick


async def test_a_move_raises_its_target_to_the_sources_format_and_keeps_live_jobs_deduplicated(
    database_url: str,
) -> None:
    """Shard 1 as a shard added after ``shards finalize`` is (format 1); its tenants' live jobs
    come from shard 0, at format 3, without dedupe keys: the target must find them by ID."""
    async with running_cluster(database_url, job_format=1) as cluster:
        source, target = (cluster.coordinator.pool.get(i)[0] for i in (0, 1))
        assert await source.raise_job_format(FOLDED_FORMAT) == (1, FOLDED_FORMAT)
        (tenant,) = tenants_on(cluster, 0, 1)
        client = await cluster.client(tenant)
        first = await client.submit("test.work", {"n": 1}, request_id="order-1", delay=3600)
        assert first.job_id == derived_job_id(tenant, "order-1")
        moved = await shardq(database_url, "tenants", "move", tenant, "1")
        assert moved.code == 0, moved.err
        assert await target.raise_job_format(0) == (FOLDED_FORMAT, FOLDED_FORMAT)
        assert (await target.get_job(tenant, first.job_id)).digest  # copied with its record
        again = await client.submit("test.work", {"n": 1}, request_id="order-1", delay=3600)
        assert (again.job_id, again.deduplicated) == (first.job_id, True)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await client.submit("test.work", {"n": 2}, request_id="order-1", delay=3600)
        assert refused.value.code() == grpc.StatusCode.ALREADY_EXISTS
