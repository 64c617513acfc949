"""``shardq-coordinator``: build and run the gRPC server."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import ProcessCollector

from shardq.common import config
from shardq.common.loop import run_main
from shardq.common.ops_http import OpsServer
from shardq.coordinator import api, processes
from shardq.coordinator.api import REQUEST_OVERHEAD_BYTES
from shardq.coordinator.app import Coordinator, CoordinatorSettings
from shardq.coordinator.gate import GateSettings
from shardq.coordinator.limits import parse_tenant_limits
from shardq.coordinator.tokens import DEFAULT_STALE_MAX_S
from shardq.shard.client import MAX_RETENTION_S
from shardq.shard.models import ShardSettings, TenantLimits
from shardq.store import db
from shardq.v1 import (
    admin_pb2,
    jobs_pb2,
    schedules_pb2,
    tenants_pb2,
    workers_pb2,
)

log = logging.getLogger("shardq.coordinator")

SERVICE_NAMES = (
    jobs_pb2.DESCRIPTOR.services_by_name["JobService"].full_name,
    schedules_pb2.DESCRIPTOR.services_by_name["ScheduleService"].full_name,
    tenants_pb2.DESCRIPTOR.services_by_name["TenantService"].full_name,
    admin_pb2.DESCRIPTOR.services_by_name["AdminService"].full_name,
    workers_pb2.DESCRIPTOR.services_by_name["WorkerService"].full_name,
)


#: Default of --max-pending-bytes (256 MiB): no tenant fills a shard on its own by default (the
#: chart's shards have a 768 MB maxmemory); a tenant that needs more is given it by an admin.
DEFAULT_MAX_PENDING_BYTES = 256 * 1024 * 1024

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def _credentials(s: CoordinatorSettings) -> grpc.ServerCredentials | None:
    if not s.tls_cert_file and not s.tls_key_file:
        return None
    key, cert = Path(s.tls_key_file).read_bytes(), Path(s.tls_cert_file).read_bytes()
    ca = Path(s.tls_client_ca_file).read_bytes() if s.tls_client_ca_file else None
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=ca, require_client_auth=ca is not None
    )


async def build_server(
    settings: CoordinatorSettings,
) -> tuple[grpc.aio.Server, int, Coordinator, health.aio.HealthServicer]:
    """A started coordinator and its (not yet started) server bound to ``settings.listen``."""
    coord = Coordinator(settings)
    server = grpc.aio.server(
        # Counts and times every call (coordinator.metrics; its cost: docs/operating.md), then
        # checks it before its request is read (coordinator.gate).
        interceptors=[coord.rpc_metrics, coord.gate],
        options=[
            ("grpc.max_receive_message_length", settings.max_request_bytes),
            # One of --processes N shares its port on purpose; alone, a second coordinator
            # started on a port in use must fail, not silently take half its connections.
            ("grpc.so_reuseport", 1 if processes.is_child() else 0),
            ("grpc.keepalive_permit_without_calls", 1),
            # Pings find dead peers, e.g. a frozen worker whose assignment stream looks open.
            ("grpc.keepalive_time_ms", 20_000),
            ("grpc.keepalive_timeout_ms", 10_000),
            ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
        ],
    )
    api.add_services(server, coord)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection((*SERVICE_NAMES, reflection.SERVICE_NAME), server)
    creds = _credentials(settings)
    try:
        if creds is None:
            port = server.add_insecure_port(settings.listen)
        else:
            port = server.add_secure_port(settings.listen, creds)
    except RuntimeError:  # grpc's "Failed to bind", its own detail already logged
        raise SystemExit(
            f"shardq-coordinator: cannot listen on {settings.listen}: the address is in use "
            "(another coordinator?) or not this host's"
        ) from None
    # Bound first: a coordinator that cannot listen starts nothing (no mover, no purge).
    await coord.start()

    async def follow_readiness(ready: bool) -> None:
        # "" (the whole server, what a Kubernetes grpc probe asks) and each service alike:
        # every service needs the same shards and database (coordinator.health).
        status = SERVING if ready else NOT_SERVING
        for name in (*SERVICE_NAMES, ""):
            await health_servicer.set(name, status)

    await follow_readiness(coord.readiness.ready)
    coord.readiness.on_change(follow_readiness)
    return server, port, coord, health_servicer


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="shardq-coordinator", description=__doc__)
    config.add(p, "--listen", "0.0.0.0:50051", "gRPC host:port")
    config.add_database_url(p, "Postgres URL (shard map, tokens, results)")
    config.add_key_prefix(p)
    config.add_redis_password(p)
    config.add_shard_durability(p)
    config.add(p, "--tls-cert-file", "", "PEM certificate chain for gRPC TLS")
    config.add(p, "--tls-key-file", "", "PEM private key for gRPC TLS")
    config.add(p, "--tls-client-ca-file", "", "PEM CA: require client certificates from it")
    config.add(p, "--worker-token", "", "a worker token accepted besides the database's")
    config.add(
        p,
        "--token-cache-ttl-s",
        5.0,
        "seconds a token's lookup is reused (how long a token revoked elsewhere still works here)",
        float,
    )
    config.add(
        p,
        "--token-stale-max-s",
        DEFAULT_STALE_MAX_S,
        "while Postgres is unreachable, seconds after its last lookup a cached token still works",
        float,
    )
    config.add(p, "--max-pending", 1_000_000, "default per-tenant pending-job quota", int)
    config.add(
        p,
        "--max-pending-bytes",
        DEFAULT_MAX_PENDING_BYTES,
        "default per-tenant pending payload bytes (0: none)",
        int,
    )
    config.add(p, "--rate-per-s", 0.0, "default per-tenant submit rate (0: none)", float)
    config.add(p, "--submit-burst", 0, "default per-tenant submit burst (0: max(1, rate))", int)
    config.add(
        p, "--tenant-limits", "", 'JSON defaults over the four above: {"*": {...}, "acme": {...}}'
    )
    _add_switch(
        p,
        "--reject-unknown-handlers",
        "refuse a submit whose handler no live worker of its queue has (FAILED_PRECONDITION)",
    )
    config.add(p, "--max-payload-bytes", 1_048_576, "largest payload accepted", int)
    config.add(
        p,
        "--max-request-bytes",
        16 * 1024 * 1024,
        "largest request read, in bytes: a whole SubmitJobs call (other methods take less)",
        int,
    )
    config.add(
        p,
        "--max-calls-per-tenant",
        GateSettings().max_calls_per_tenant,
        "unary calls of one tenant in flight on this process",
        int,
    )
    config.add(
        p,
        "--max-batch-calls",
        GateSettings().max_batch_calls,
        "SubmitJobs calls in flight on this process (each may hold --max-request-bytes)",
        int,
    )
    config.add(
        p,
        "--submit-pieces",
        CoordinatorSettings().submit_pieces,
        "scripts a SubmitJobs call alone on this process is sent to its shard in, so that "
        "the coordinator prepares one while Redis runs another (1: one per call)",
        int,
    )
    config.add(
        p,
        "--max-streams-per-tenant",
        GateSettings().max_streams_per_tenant,
        "WatchJob streams of one tenant open on this process",
        int,
    )
    config.add(p, "--max-streams", GateSettings().max_streams, "streams open on this process", int)
    config.add(
        p,
        "--result-retention-s",
        0,
        "seconds a finished job's result row is kept where its tenant's limits do not say "
        "(0: forever)",
        int,
    )
    config.add(p, "--retention-batch-size", 1_000, "result rows one purge statement deletes", int)
    config.add(p, "--retention-interval-s", 60.0, "seconds between two retention purges", float)
    config.add_ops_http(p, 9090, "HTTP port for /metrics, /healthz and /readyz (-1: off)")
    config.add(
        p,
        "--metrics-top-tenants",
        0,
        "tenants with their own label on the submit metrics, the busiest N (0: no tenant label)",
        int,
    )
    config.add(p, "--shutdown-grace-s", 10.0, "time in-flight calls get on SIGTERM", float)
    config.add(
        p,
        "--processes",
        1,
        "coordinator processes sharing --listen (SO_REUSEPORT), to use more than one core; "
        "process i serves /metrics on --metrics-port + i",
        int,
    )
    # On unless turned off: a recorded move then always finishes (coordinator.moverd).
    var = config.env_name("--run-moves")
    raw = os.environ.get(var, "").strip().lower()
    if raw and raw not in SWITCH_VALUES:
        raise SystemExit(f"shardq-coordinator: {var}={raw!r} is not true or false")
    p.add_argument(
        "--run-moves",
        action=argparse.BooleanOptionalAction,
        default=SWITCH_VALUES[raw] if raw else True,
        help="take part in running pending tenant moves (one replica at a time holds the "
        f"mover lease) [{var}; default on]",
    )
    config.add_log_level(p)
    return p.parse_args(argv)


def _add_switch(p: argparse.ArgumentParser, flag: str, help: str) -> None:
    """An on/off flag whose variable says ``true``/``1``/``yes``/``on`` (or the opposite)."""
    var = config.env_name(flag)
    raw = os.environ.get(var, "").strip().lower()
    if raw not in SWITCH_VALUES:
        raise SystemExit(f"shardq-coordinator: {var}={raw!r} is not true or false")
    p.add_argument(
        flag, action="store_true", default=SWITCH_VALUES[raw], help=f"{help} [{var}; default off]"
    )


#: What a switch's variable may say; empty counts as unset (off).
SWITCH_VALUES = {
    "": False, "0": False, "false": False, "no": False, "off": False,
    "1": True, "true": True, "yes": True, "on": True,
}  # fmt: skip


def settings_from(args: argparse.Namespace) -> CoordinatorSettings:
    if not args.database_url:
        raise SystemExit("shardq-coordinator: --database-url (SHARDQ_DATABASE_URL) is required")
    flags = TenantLimits(
        max_pending=args.max_pending,
        max_pending_bytes=args.max_pending_bytes,
        submit_rate_per_s=args.rate_per_s,
        submit_burst=args.submit_burst,
    )
    if args.metrics_top_tenants < 0:
        raise SystemExit("shardq-coordinator: --metrics-top-tenants must be 0 or more")
    if not 0 <= args.result_retention_s <= MAX_RETENTION_S:
        raise SystemExit(
            f"shardq-coordinator: --result-retention-s must be 0 to {MAX_RETENTION_S} seconds"
        )
    if args.retention_batch_size < 1 or not args.retention_interval_s > 0:
        raise SystemExit(
            "shardq-coordinator: --retention-batch-size must be 1 or more and "
            "--retention-interval-s more than 0"
        )
    for flag in ("token_cache_ttl_s", "token_stale_max_s"):
        if not getattr(args, flag) >= 0:  # also NaN
            name = "--" + flag.replace("_", "-")
            raise SystemExit(f"shardq-coordinator: {name} must be 0 or more seconds")
    for flag in (
        "max_request_bytes",
        "max_calls_per_tenant",
        "max_batch_calls",
        "submit_pieces",
        "max_streams_per_tenant",
        "max_streams",
    ):
        if getattr(args, flag) < 1:
            raise SystemExit(f"shardq-coordinator: --{flag.replace('_', '-')} must be 1 or more")
    if args.max_request_bytes < args.max_payload_bytes + REQUEST_OVERHEAD_BYTES:
        raise SystemExit(
            "shardq-coordinator: --max-request-bytes must hold a job of --max-payload-bytes "
            f"(at least {args.max_payload_bytes + REQUEST_OVERHEAD_BYTES})"
        )
    try:
        default_limits, tenant_limits = parse_tenant_limits(args.tenant_limits, flags)
    except ValueError as exc:  # json.JSONDecodeError is one
        raise SystemExit(f"shardq-coordinator: {exc}") from None
    return CoordinatorSettings(
        listen=args.listen,
        database_url=db.sqlalchemy_url(args.database_url),
        redis_password=args.redis_password,
        tls_cert_file=args.tls_cert_file,
        tls_key_file=args.tls_key_file,
        tls_client_ca_file=args.tls_client_ca_file,
        worker_token=args.worker_token,
        max_request_bytes=args.max_request_bytes,
        submit_pieces=args.submit_pieces,
        gate=GateSettings(
            max_calls_per_tenant=args.max_calls_per_tenant,
            max_batch_calls=args.max_batch_calls,
            max_streams_per_tenant=args.max_streams_per_tenant,
            max_streams=args.max_streams,
        ),
        default_limits=default_limits,
        tenant_limits=tenant_limits,
        reject_unknown_handlers=args.reject_unknown_handlers,
        token_cache_ttl_s=args.token_cache_ttl_s,
        token_stale_max_s=args.token_stale_max_s,
        metrics_top_tenants=args.metrics_top_tenants,
        run_moves=args.run_moves,
        result_retention_s=args.result_retention_s,
        retention_batch_size=args.retention_batch_size,
        retention_interval_s=args.retention_interval_s,
        shard=ShardSettings(
            key_prefix=args.key_prefix,
            max_payload_bytes=args.max_payload_bytes,
            durability=config.durability(args),
            redis_username=args.redis_username,
        ),
    )


async def serve(args: argparse.Namespace) -> None:
    server, port, coord, health_servicer = await build_server(settings_from(args))
    await server.start()
    log.info("coordinator listening on port %d", port)
    ops = None
    if args.metrics_port >= 0:
        # Plain-HTTP health beside the gRPC one: kubelet gRPC probes cannot speak TLS.
        # /healthz is liveness (the event loop answers); /readyz is the checker's answer.
        ProcessCollector(registry=coord.metrics_registry)
        ops = OpsServer(
            coord.metrics_registry,
            lambda: (True, {"map_version": coord.shard_map.version}),
            host=args.metrics_host,
            ready=coord.readiness.report,
        )
        await ops.start(args.metrics_port)
        log.info("ops endpoint (/metrics, /healthz, /readyz) on port %d", ops.port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    config.freeze_startup_heap()
    await stop.wait()
    log.info("shutting down: draining in-flight calls for up to %.1fs", args.shutdown_grace_s)
    await health_servicer.enter_graceful_shutdown()
    await server.stop(args.shutdown_grace_s)
    await coord.stop()
    if ops is not None:
        await ops.stop()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    config.setup_logging(args.log_level)
    if args.processes < 1:
        raise SystemExit("shardq-coordinator: --processes must be 1 or more")
    if args.processes > 1:
        if args.listen.rpartition(":")[2] == "0":
            raise SystemExit("shardq-coordinator: --processes needs a fixed --listen port")
        settings_from(args)  # refuse bad flags here, once, rather than in every child
        raise SystemExit(
            processes.supervise(
                sys.argv[1:] if argv is None else argv, args.processes, args.metrics_port
            )
        )
    run_main(serve(args))


if __name__ == "__main__":
    main()
