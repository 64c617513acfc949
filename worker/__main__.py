"""``shardq-worker``: run handlers from a module on the shards the coordinator assigns."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from shardq.common import config, tls
from shardq.common.errors import InvalidArgument
from shardq.common.loop import run_main
from shardq.common.ops_http import OpsServer
from shardq.shard.models import ShardSettings
from shardq.worker import handlers as handler_registry
from shardq.worker.assignment import CoordinatorTls
from shardq.worker.metrics import WorkerMetrics
from shardq.worker.runtime import Worker, serve
from shardq.worker.settings import DEFAULT_QUEUE, WorkerSettings, default_worker_id, parse_queues


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="shardq-worker", description=__doc__)
    config.add(p, "--handlers", "", "module(s) with @handler functions, comma-separated")
    config.add(p, "--queues", DEFAULT_QUEUE, "queues to claim jobs from, comma-separated")
    config.add(p, "--coordinator", "", "coordinator host:port for shard assignment")
    config.add(p, "--worker-token", "", "token for the coordinator's WorkerService")
    config.add(p, "--tls-ca-file", "", "PEM CA to trust the coordinator's TLS certificate")
    config.add(
        p, "--tls-cert-file", "", "PEM client certificate for a coordinator that requires "
        "one (mTLS; implies TLS; with --tls-key-file)",
    )  # fmt: skip
    config.add(p, "--tls-key-file", "", "PEM private key of --tls-cert-file (unencrypted)")
    config.add(p, "--shards", "", "static shards instead: 0=host:port,1=host:port")
    config.add_database_url(p, "Postgres for result rows")
    config.add_redis_password(p)
    config.add_key_prefix(p)
    config.add_shard_durability(p)
    config.add(p, "--concurrency", 16, "handlers running at once", int)
    config.add(p, "--lease-ms", 30_000, "lease per claim; heartbeats every third", int)
    config.add(p, "--drain-grace-s", 30.0, "time in-flight jobs get on SIGTERM", float)
    config.add(p, "--process-pool-size", 0, "processes for cpu_bound handlers", int)
    config.add(
        p,
        "--unknown-handler-backoff-ms",
        5_000,
        "a job whose handler this worker lacks goes back to ready; ms it stays away from it",
        int,
    )
    config.add(
        p,
        "--progress-interval-ms",
        1_000,
        "a job's progress is written to its shard at most once per this many ms",
        int,
    )
    config.add(
        p,
        "--record-linger-ms",
        5,
        "a batch of results smaller than --concurrency waits up to this many ms for more "
        "before it is written and acked (0: at once)",
        int,
    )
    config.add(p, "--worker-id", default_worker_id(), "this worker's name")
    config.add_ops_http(p, 9092, "HTTP port for /metrics and /healthz (-1: off)")
    config.add_log_level(p)
    return p.parse_args(argv)


def parse_shards(raw: str) -> dict[int, str]:
    out = {}
    for item in filter(None, (x.strip() for x in raw.split(","))):
        sid, _, address = item.partition("=")
        if not address:
            raise SystemExit(f"shardq-worker: --shards entry {item!r} is not ID=host:port")
        out[int(sid)] = address
    return out


def coordinator_tls(args: argparse.Namespace) -> CoordinatorTls | None:
    """TLS to the coordinator from the flags, its files read now (a CA or a client
    certificate means TLS); None: plaintext. A file that cannot be used is a usage error."""
    try:
        root = tls.read_pem("--tls-ca-file", args.tls_ca_file) if args.tls_ca_file else None
        cert = tls.client_certificate(
            args.tls_cert_file, args.tls_key_file, "--tls-cert-file", "--tls-key-file"
        )
    except tls.TlsFileError as exc:
        # As argparse's own errors: one line, exit 2, before anything starts.
        print(f"shardq-worker: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    if root is None and cert is None:
        return None
    return CoordinatorTls(root, cert)


def health(worker: Worker) -> dict[str, object]:
    """/healthz: who this is, what it serves, and the queues it claims on each shard."""
    return {
        "worker_id": worker.settings.worker_id,
        "queues": list(worker.settings.queues),
        "shards": sorted(worker.shards),
        "shard_queues": {str(sid): list(h.queues) for sid, h in sorted(worker.shards.items())},
    }


async def run(args: argparse.Namespace) -> None:
    if not args.database_url:
        raise SystemExit("shardq-worker: --database-url (SHARDQ_DATABASE_URL) is required")
    channel_tls = coordinator_tls(args)
    handler_registry.add_working_folder_to_path()
    try:
        specs = handler_registry.load(args.handlers)
    except handler_registry.HandlersNotFound as exc:
        # A mistyped or unreachable --handlers is a usage error: one line, argparse's code.
        print(f"shardq-worker: error: --handlers: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    if not specs:
        raise SystemExit("shardq-worker: no handlers (give --handlers MODULE)")
    try:
        settings = WorkerSettings(
            database_url=args.database_url,
            concurrency=args.concurrency,
            lease_ms=args.lease_ms,
            drain_grace_s=args.drain_grace_s,
            redis_password=args.redis_password,
            process_pool_size=args.process_pool_size,
            worker_id=args.worker_id,
            shard=ShardSettings(
                key_prefix=args.key_prefix,
                durability=config.durability(args),
                redis_username=args.redis_username,
            ),
            queues=parse_queues(args.queues),
            unknown_handler_backoff_ms=args.unknown_handler_backoff_ms,
            progress_interval_ms=args.progress_interval_ms,
            record_linger_ms=args.record_linger_ms,
        )
    except InvalidArgument as exc:
        raise SystemExit(f"shardq-worker: {exc}") from exc
    metrics = WorkerMetrics()
    worker = Worker(settings, specs, metrics)
    ops = None
    if args.metrics_port >= 0:
        ops = OpsServer(metrics.registry, lambda: (True, health(worker)), host=args.metrics_host)
        await ops.start(args.metrics_port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    logging.getLogger("shardq.worker").info(
        "worker %s: queues %s, handlers %s",
        settings.worker_id,
        ", ".join(settings.queues),
        ", ".join(sorted(specs)),
    )
    config.freeze_startup_heap()
    try:
        await serve(
            worker,
            shards=parse_shards(args.shards) if args.shards else None,
            coordinator=args.coordinator,
            token=args.worker_token,
            tls=channel_tls,
            stop=stop,
        )
    finally:
        if ops is not None:
            await ops.stop()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    config.setup_logging(args.log_level)
    run_main(run(args))


if __name__ == "__main__":
    main()
