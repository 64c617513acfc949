"""A shard's job-hash format (``Keys.job_format``): ``enqueue.lua`` writes every field until it
is raised, then leaves ``pr``, ``ma`` and ``to`` out at their usual values; it is raised by
``shardq shards finalize`` (the real CLI, on a map of two real Redis shards), never lowered,
and a job written either way claims with the same values."""

from __future__ import annotations

import pytest
import redis as redis_lib
from redis.asyncio import Redis

from shardq.coordinator import cli
from shardq.coordinator.tools.redis_server import RedisProcess
from shardq.shard import ShardClient
from shardq.shard.records import (
    COMPACT_FORMAT,
    JOB_FORMAT,
    UNSTORED_MAX_ATTEMPTS,
    UNSTORED_TIMEOUT_MS,
)
from shardq.store import db
from tests.support.shard import LEASE, job

USUAL = {"pr", "ma", "to"}


async def _fields(redis: Redis, jid: str) -> set[str]:
    return {k.decode() for k in await redis.hkeys(f"sq:job:{jid}")}


async def test_a_shard_writes_every_field_until_its_format_is_raised(
    shard: ShardClient, redis: Redis
) -> None:
    await shard.enqueue([job("OLD")])
    assert await _fields(redis, "OLD") >= USUAL
    # The compact format alone: above it a job's ID is derived, not the one given here.
    assert await shard.raise_job_format(COMPACT_FORMAT) == (1, COMPACT_FORMAT)
    await shard.enqueue([job("NEW"), job("SET", priority=3, max_attempts=2, timeout_ms=1_000)])
    assert not USUAL & await _fields(redis, "NEW")
    assert await _fields(redis, "SET") >= USUAL  # values other than the usual are stored
    claimed = {c.job_id: c for c in await shard.claim("w1", 3, LEASE)}
    usual = (0, UNSTORED_MAX_ATTEMPTS, UNSTORED_TIMEOUT_MS)
    for jid in ("OLD", "NEW"):
        c = claimed[jid]
        assert (c.priority, c.max_attempts, c.timeout_ms) == usual, jid
        record = await shard.get_job("acme", jid)
        assert (record.priority, record.max_attempts, record.timeout_ms) == usual, jid
    c = claimed["SET"]
    assert (c.priority, c.max_attempts, c.timeout_ms) == (3, 2, 1_000)


async def test_the_format_is_raised_once_and_never_lowered(shard: ShardClient) -> None:
    assert await shard.raise_job_format(0) == (1, 1)  # 0 reads it: absent is 1
    assert await shard.raise_job_format(2) == (1, 2)
    assert await shard.raise_job_format(2) == (2, 2)
    assert await shard.raise_job_format(1) == (2, 2)


def test_shards_finalize_raises_every_shard_of_the_map_once(
    database_url: str,
    redis_proc: RedisProcess,
    other_redis: RedisProcess,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = db.psycopg_dsn(database_url)
    addresses = [f"127.0.0.1:{p.port}" for p in (redis_proc, other_redis)]
    common = ["--database-url", url, "--key-prefix", "sq"]
    assert cli.main(["migrate", "--database-url", url]) == 0
    init = ["shards", "init", *(a for addr in addresses for a in ("--address", addr))]
    assert cli.main([*init, "--skip-checks", "--database-url", url]) == 0
    capsys.readouterr()
    assert cli.main(["shards", "finalize", *common]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"shard {i} ({addr}): job format 1 -> {JOB_FORMAT}" for i, addr in enumerate(addresses)
    ]
    for proc in (redis_proc, other_redis):
        assert redis_lib.Redis.from_url(proc.url).get("sq:jobformat") == str(JOB_FORMAT).encode()
    assert cli.main(["shards", "finalize", *common]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"shard {i} ({addr}): job format {JOB_FORMAT} already" for i, addr in enumerate(addresses)
    ]


def test_shards_finalize_names_a_shard_it_cannot_reach(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url = db.psycopg_dsn(database_url)
    assert cli.main(["migrate", "--database-url", url]) == 0
    assert cli.main(["shards", "init", "--address", "127.0.0.1:1", "--skip-checks",
                     "--database-url", url]) == 0  # fmt: skip
    capsys.readouterr()
    assert cli.main(["shards", "finalize", "--database-url", url]) == 1
    assert "shard 0 (127.0.0.1:1)" in capsys.readouterr().err
