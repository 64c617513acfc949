"""``shardq-shard``: run one shard's loop next to its Redis."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal

from prometheus_client import CollectorRegistry
from redis.asyncio import Redis

from shardq.common import config
from shardq.common.ops_http import OpsServer
from shardq.shard.client import ShardClient
from shardq.shard.loop import LoopMetrics, LoopSettings, ShardLoop, default_instance_id
from shardq.shard.models import ShardSettings


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="shardq-shard", description=__doc__)
    config.add(p, "--redis-url", "redis://127.0.0.1:6379/0", "this shard's Redis")
    config.add_redis_password(p, "password for the shard's Redis")
    config.add(p, "--shard-id", 0, "this shard's ID (metrics labels)", int)
    config.add_key_prefix(p)
    config.add(p, "--leader-ttl-ms", 5_000, "leader lease length", int)
    config.add(p, "--reap-interval-ms", 1_000, "how often expired leases are reaped", int)
    config.add(p, "--load-interval-s", 10.0, "how often tenant load is sampled (0: off)", float)
    config.add(p, "--load-top-tenants", 50, "tenants with their own gauges on /metrics", int)
    config.add(p, "--instance-id", default_instance_id(), "name of this loop in the lease")
    config.add(p, "--metrics-port", 9091, "HTTP port for /metrics and /healthz (0: any)", int)
    config.add_log_level(p)
    return p.parse_args(argv)


async def serve(args: argparse.Namespace) -> None:
    url = config.redis_url_with_password(args.redis_url, args.redis_password)
    redis = Redis.from_url(url, health_check_interval=10, socket_keepalive=True)
    shard = ShardClient(redis, ShardSettings(key_prefix=args.key_prefix))
    registry = CollectorRegistry()
    loop = ShardLoop(
        shard,
        LoopSettings(
            leader_ttl_ms=args.leader_ttl_ms,
            reap_interval_ms=args.reap_interval_ms,
            instance_id=args.instance_id,
            load_interval_s=args.load_interval_s,
            load_top_tenants=args.load_top_tenants,
        ),
        LoopMetrics(registry, str(args.shard_id)),
    )
    ops = OpsServer(
        registry,
        lambda: (
            loop.role != "disconnected",
            {"role": loop.role, "instance_id": args.instance_id, "shard_id": args.shard_id},
        ),
    )
    port = await ops.start(args.metrics_port)
    logging.getLogger("shardq.shard").info("ops endpoint on port %d", port)
    running = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        running.add_signal_handler(sig, loop.stop)
    try:
        await loop.run()
    finally:
        await ops.stop()
        await redis.aclose()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    config.setup_logging(args.log_level)
    asyncio.run(serve(args))


if __name__ == "__main__":
    main()
