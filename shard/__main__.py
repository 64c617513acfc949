"""``shardq-shard``: run one shard's loop next to its Redis."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal

from prometheus_client import CollectorRegistry
from redis.asyncio import Redis

from shardq.common import config
from shardq.common.loop import run_main
from shardq.common.ops_http import OpsServer
from shardq.common.redis import is_sentinel, redis_for
from shardq.shard.client import ShardClient
from shardq.shard.loop import LoopMetrics, LoopSettings, ShardLoop, default_instance_id
from shardq.shard.models import ShardSettings
from shardq.shard.precheck import Prechecker, PrecheckMetrics, PrecheckSettings
from shardq.shard.rows import RowMetrics, RowSettings, TerminalRows
from shardq.store.db import psycopg_dsn, sqlalchemy_url
from shardq.store.results import ResultStore

log = logging.getLogger("shardq.shard")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The flags, each numeric one held to its range (argparse's exit 2, the flag named)."""
    p = build_parser()
    args = p.parse_args(argv)
    for flag, low, high in _BOUNDS:
        value = getattr(args, flag.removeprefix("--").replace("-", "_"))
        if not low <= value <= high:
            shown = f"{value:g}" if isinstance(value, float) else value
            p.error(f"{flag} must be {_range_text(low, high)} (got {shown})")
    return args


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="shardq-shard", description=__doc__)
    config.add(
        p, "--redis-url", "redis://127.0.0.1:6379/0", "this shard's Redis, or its Sentinel "
        "group: sentinel://h1:26379,h2:26379/MASTER (the primary is asked for, failovers followed)",
    )  # fmt: skip
    config.add_redis_password(p, "password for the shard's Redis")
    config.add(p, "--shard-id", 0, "this shard's ID (metrics labels)", int)
    config.add_key_prefix(p)
    config.add_shard_durability(p)
    config.add_database_url(
        p, "results database: the loop writes the rows of jobs that end without a worker"
    )
    config.add(
        p, "--reconcile-interval-s", 30.0, "pause between passes comparing dead jobs with their "
        "rows (0: off)", float,
    )  # fmt: skip
    config.add(
        p, "--precheck-ahead-ms", 1_000, "how far ahead of their run-at delayed jobs' result rows "
        "are looked up, so that workers start them without a lookup (0: off)", int,
    )  # fmt: skip
    config.add(
        p, "--promote-ahead-ms", 20, "delayed jobs due within this long are promoted already; "
        "their workers start them on their run-at (0: promote on the run-at)", int,
    )  # fmt: skip
    config.add(p, "--leader-ttl-ms", 5_000, "leader lease length", int)
    config.add(p, "--reap-interval-ms", 1_000, "how often expired leases are reaped", int)
    config.add(p, "--load-interval-s", 10.0, "how often tenant load is sampled (0: off)", float)
    config.add(p, "--load-top-tenants", 50, "tenants with their own gauges on /metrics", int)
    config.add(p, "--instance-id", default_instance_id(), "name of this loop in the lease")
    config.add_ops_http(p, 9091, "HTTP port for /metrics and /healthz (0: any)")
    config.add_log_level(p)
    return p


#: Each numeric flag's accepted values: a negative interval or a lease of 0 would not run a
#: loop that works, and a promotion hours ahead would hold workers' slots for hours.
_BOUNDS: tuple[tuple[str, float, float], ...] = (
    ("--shard-id", 0, float("inf")),
    ("--reconcile-interval-s", 0, float("inf")),
    ("--precheck-ahead-ms", 0, float("inf")),
    ("--promote-ahead-ms", 0, 10_000),
    ("--leader-ttl-ms", 1, float("inf")),
    ("--reap-interval-ms", 1, float("inf")),
    ("--load-interval-s", 0, float("inf")),
    ("--load-top-tenants", 0, float("inf")),
)


def _range_text(low: float, high: float) -> str:
    return f"{low:g} or more" if high == float("inf") else f"{low:g} to {high:g}"


async def serve(args: argparse.Namespace) -> None:
    redis: Redis
    if is_sentinel(args.redis_url):
        redis = redis_for(args.redis_url, args.redis_password, args.redis_username)
    else:
        url = config.redis_url_with_password(args.redis_url, args.redis_password)
        redis = Redis.from_url(
            url,
            username=args.redis_username or None,
            health_check_interval=10,
            socket_keepalive=True,
        )
    shard_settings = ShardSettings(
        key_prefix=args.key_prefix,
        durability=config.durability(args),
        redis_username=args.redis_username,
    )
    shard = ShardClient(redis, shard_settings)
    registry = CollectorRegistry()
    store = (
        ResultStore(psycopg_dsn(sqlalchemy_url(args.database_url))) if args.database_url else None
    )
    rows = precheck = None
    if store is not None:
        settings = RowSettings(reconcile_interval_s=args.reconcile_interval_s)
        metrics = RowMetrics(registry, str(args.shard_id))
        rows = TerminalRows(shard, store, args.shard_id, settings, metrics)
        precheck = Prechecker(
            shard,
            store,
            PrecheckSettings(ahead_ms=args.precheck_ahead_ms),
            PrecheckMetrics(registry, str(args.shard_id)),
        )
    else:
        # Not fatal: nothing is lost (the IDs wait on the outbox until a loop with a database
        # writes their rows), but until then those jobs have no row. Say so loudly.
        log.warning(
            "no --database-url (SHARDQ_DATABASE_URL): jobs that end without a worker (reaped "
            "dead, cancelled) get no result row until a shard loop with one runs"
        )
    loop = ShardLoop(
        shard,
        LoopSettings(
            leader_ttl_ms=args.leader_ttl_ms,
            reap_interval_ms=args.reap_interval_ms,
            promote_ahead_ms=args.promote_ahead_ms,
            instance_id=args.instance_id,
            load_interval_s=args.load_interval_s,
            load_top_tenants=args.load_top_tenants,
        ),
        LoopMetrics(registry, str(args.shard_id)),
        rows,
        precheck,
    )
    ops = OpsServer(
        registry,
        lambda: (
            loop.role != "disconnected",
            {"role": loop.role, "instance_id": args.instance_id, "shard_id": args.shard_id},
        ),
        host=args.metrics_host,
    )
    port = await ops.start(args.metrics_port)
    logging.getLogger("shardq.shard").info("ops endpoint on port %d", port)
    running = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        running.add_signal_handler(sig, loop.stop)
    config.freeze_startup_heap()
    try:
        await loop.run()
    finally:
        await ops.stop()
        if store is not None:
            await store.close()
        await redis.aclose()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    config.setup_logging(args.log_level)
    run_main(serve(args))


if __name__ == "__main__":
    main()
