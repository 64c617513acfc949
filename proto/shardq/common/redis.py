"""The one way shardq opens a connection to a shard's Redis (coordinator, mover, worker)."""

from __future__ import annotations

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff


def redis_for(address: str, password: str) -> Redis:
    host, _, port = address.rpartition(":")
    return Redis(
        host=host or "127.0.0.1",
        port=int(port),
        password=password or None,
        socket_connect_timeout=1.0,
        socket_timeout=10.0,
        socket_keepalive=True,
        health_check_interval=15,
        # A down shard must answer UNAVAILABLE quickly, not after long retry sleeps.
        retry=Retry(ExponentialBackoff(cap=0.05, base=0.01), retries=1),
    )
