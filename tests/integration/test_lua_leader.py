"""leader.lua and leader_release.lua: the shard loop's leader lease, whole keyspace and TTLs."""

from __future__ import annotations

import asyncio

from redis.asyncio import Redis

from shardq.shard import ShardClient
from tests.support.state import dump, ttls

TTL = 10_000


async def test_a_free_lease_is_granted_with_its_ttl(shard: ShardClient, redis: Redis) -> None:
    assert await shard.acquire_leader("i1", TTL) is True
    assert await dump(redis) == {"sq:leader": "i1"}
    assert 0 < (await ttls(redis))["sq:leader"] <= TTL


async def test_the_holder_keeps_its_lease_and_renews_the_ttl(
    shard: ShardClient, redis: Redis
) -> None:
    await shard.acquire_leader("i1", 1_000)
    assert await shard.acquire_leader("i1", 60_000) is True
    assert await dump(redis) == {"sq:leader": "i1"}
    assert 1_000 < await redis.pttl("sq:leader") <= 60_000


async def test_another_instance_is_refused_while_the_lease_is_held_and_changes_nothing(
    shard: ShardClient, redis: Redis
) -> None:
    await shard.acquire_leader("i1", TTL)
    assert await shard.acquire_leader("i2", 60_000) is False
    assert await dump(redis) == {"sq:leader": "i1"}
    assert await redis.pttl("sq:leader") <= TTL


async def test_another_instance_takes_over_once_the_lease_expires(
    shard: ShardClient, redis: Redis
) -> None:
    await shard.acquire_leader("i1", 20)
    await asyncio.sleep(0.05)
    assert await shard.acquire_leader("i2", TTL) is True
    assert await dump(redis) == {"sq:leader": "i2"}


async def test_the_holder_releases_its_lease_and_a_standby_takes_over_at_once(
    shard: ShardClient, redis: Redis
) -> None:
    await shard.acquire_leader("i1", TTL)
    assert await shard.release_leader("i1") is True
    assert await dump(redis) == {}
    assert await shard.acquire_leader("i2", TTL) is True


async def test_releasing_a_lease_held_by_another_is_refused_and_changes_nothing(
    shard: ShardClient, redis: Redis
) -> None:
    await shard.acquire_leader("i1", TTL)
    assert await shard.release_leader("i2") is False
    assert await dump(redis) == {"sq:leader": "i1"}
    assert 0 < await redis.pttl("sq:leader") <= TTL


async def test_releasing_a_free_lease_is_refused_and_writes_nothing(
    shard: ShardClient, redis: Redis
) -> None:
    assert await shard.release_leader("i1") is False
    assert await dump(redis) == {}
