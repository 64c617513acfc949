"""``--shard-replicas-to-ack``: a write is acknowledged only once the replicas hold it, a
repeat included: with the replica connected but acknowledging nothing (stopped), a submit and
its retry on a connection of its own (a fresh pool) are both refused as UNAVAILABLE
(NotReplicated), and once the replica catches up the repeat answers with the one job."""

from __future__ import annotations

import asyncio
import signal

import pytest
from redis.asyncio import Redis

from shardq.common.errors import Unavailable
from shardq.common.redis import Durability, NotReplicated, redis_for
from shardq.coordinator.tools.redis_server import RedisProcess
from shardq.shard import NewJob, ShardClient
from shardq.shard.models import ShardSettings
from shardq.shard.records import JobState

SETTINGS = ShardSettings(key_prefix="sq", durability=Durability(replicas=1, timeout_ms=300))


async def in_sync(primary: RedisProcess) -> None:
    r = Redis(port=primary.port)
    try:
        async with asyncio.timeout(30):
            while "online" not in str((await r.info("replication")).get("slave0", "")):
                await asyncio.sleep(0.05)
    finally:
        await r.aclose()


async def test_a_repeat_on_another_connection_is_not_acknowledged_while_replicas_lag() -> None:
    primary = RedisProcess().start()
    replica = RedisProcess(extra_args=["--replicaof", "127.0.0.1", str(primary.port)]).start()
    first = ShardClient(redis_for(f"127.0.0.1:{primary.port}", ""), SETTINGS)
    again = ShardClient(redis_for(f"127.0.0.1:{primary.port}", ""), SETTINGS)
    try:
        await in_sync(primary)
        async with asyncio.timeout(30):  # the replica's first acknowledgements
            while True:
                try:
                    await first.submit(NewJob("acme", "h", b"{}", request_id="ok"))
                    break
                except NotReplicated:
                    await asyncio.sleep(0.1)
        assert replica.proc is not None
        replica.proc.send_signal(signal.SIGSTOP)  # connected, acknowledging nothing
        try:
            job = NewJob("acme", "h", b"{}", request_id="lagging")
            with pytest.raises(NotReplicated) as caught:
                await first.submit(job)
            assert isinstance(caught.value, Unavailable)  # UNAVAILABLE: the caller retries
            with pytest.raises(NotReplicated):  # the retry, on a connection of its own
                await again.submit(job)
        finally:
            replica.proc.send_signal(signal.SIGCONT)
        # Once the replica catches up, the repeat is acknowledged: the one job of before.
        (entry,) = await first.dedupe_entries("acme", ["lagging"])
        assert entry is not None
        assert (await again.submit(job)).job_id == entry.job_id
    finally:
        await first.redis.aclose()
        await again.redis.aclose()
        replica.cleanup()
        primary.cleanup()


async def test_a_waiting_claim_waits_for_the_replicas_too_and_hands_back_what_they_miss() -> None:
    """A claim queued behind its wake-up wait (``claim(wait_s=...)``) is a write like any
    other: with the replica stopped it is refused (NotReplicated) and its job handed back
    uncounted; once the replica acknowledges again, the next waiting claim takes the job."""
    primary = RedisProcess().start()
    replica = RedisProcess(extra_args=["--replicaof", "127.0.0.1", str(primary.port)]).start()
    shard = ShardClient(redis_for(f"127.0.0.1:{primary.port}", ""), SETTINGS)
    try:
        await in_sync(primary)
        async with asyncio.timeout(30):
            while True:
                try:
                    job = await shard.submit(NewJob("acme", "h", b"{}", request_id="w"))
                    break
                except NotReplicated:
                    await asyncio.sleep(0.1)
        assert replica.proc is not None
        replica.proc.send_signal(signal.SIGSTOP)
        try:
            with pytest.raises(NotReplicated):
                await shard.claim("w1", 1, 60_000, wait_s=5)
        finally:
            replica.proc.send_signal(signal.SIGCONT)
        back = await shard.get_job("acme", job.job_id)
        assert (back.state, back.attempts) == (JobState.READY, 0)
        async with asyncio.timeout(30):
            while True:
                try:
                    claimed = await shard.claim("w1", 1, 60_000, wait_s=1)
                except NotReplicated:
                    await asyncio.sleep(0.1)
                    continue
                if claimed:
                    break
        assert [c.job_id for c in claimed] == [job.job_id]
    finally:
        await shard.redis.aclose()
        replica.cleanup()
        primary.cleanup()
