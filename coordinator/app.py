"""The coordinator's state: settings, the shard map it follows, a client per shard and the
tenant router over them (:mod:`coordinator.router`), auth.

Stateless in the sense that matters: everything durable is in Postgres (shard map, tokens,
results) or the shards' Redis; any number of replicas give the same answers.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import socket
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry
from sqlalchemy.ext.asyncio import AsyncEngine

from shardq.common import validation
from shardq.common.errors import InvalidArgument, PermissionDenied, Unauthenticated, Unavailable
from shardq.coordinator import limits, retention, tokens
from shardq.coordinator.errors import Ctx
from shardq.coordinator.gate import PRINCIPAL, Gate, GateSettings, bearer_token
from shardq.coordinator.health import DEFAULT_INTERVAL_S, DEFAULT_TIMEOUT_S, ReadinessChecker
from shardq.coordinator.metrics import RpcMetrics, SubmitMetrics
from shardq.coordinator.mover import RedisShards
from shardq.coordinator.moverd import MoverDaemon
from shardq.coordinator.placement import ShardMap
from shardq.coordinator.registry import WorkerRegistry
from shardq.coordinator.router import ShardPool, TenantRouter
from shardq.coordinator.shardmap import ShardMapFollower, ShardMapStore
from shardq.coordinator.tokens import Principal, TokenStore
from shardq.shard.models import ShardSettings, TenantLimits
from shardq.store import db
from shardq.store.results import read_result

log = logging.getLogger("shardq.coordinator")

#: A result read-back not answered within this many seconds is UNAVAILABLE.
RESULT_READ_TIMEOUT_S = 5.0
#: How long a tenant's stream cap (``max_watch_streams``) is reused before it is read again.
STREAM_CAP_TTL_S = 5.0

#: Who the worker token from the environment (``CoordinatorSettings.worker_token``) acts as.
ENV_WORKER = Principal(role="worker", tenant_id=None, token_id="env")


@dataclass(frozen=True, slots=True)
class CoordinatorSettings:
    #: host:port the gRPC server binds (``SHARDQ_LISTEN``); port 0 picks a free one.
    listen: str = "0.0.0.0:50051"
    #: Postgres holding the shard map, tokens and results (``SHARDQ_DATABASE_URL``).
    database_url: str = ""
    #: Password of every shard's Redis (``SHARDQ_REDIS_PASSWORD``); empty for none.
    redis_password: str = ""
    #: PEM files for TLS; both empty means plaintext. A client CA file requires client certs.
    tls_cert_file: str = ""
    tls_key_file: str = ""
    tls_client_ca_file: str = ""
    #: A worker token given by the deployment (``SHARDQ_WORKER_TOKEN``), accepted besides
    #: the tokens in the database; empty for none. Lets workers start before anyone has run
    #: ``shardq tokens create --worker``.
    worker_token: str = ""
    #: Most jobs in one SubmitJobs call, and IDs in one RequeueDeadJobs call.
    max_batch_jobs: int = 1_000
    #: Scripts a SubmitJobs call that is alone on this process is sent to its shard in, each
    #: of at least ``MIN_PIECE_JOBS`` jobs (``coordinator.api``); 1: one script per call.
    submit_pieces: int = 3
    #: The server's receive limit, in bytes: the largest whole SubmitJobs call. SubmitJob and
    #: CreateSchedule take a payload's worth, other methods far less (``coordinator.api``).
    max_request_bytes: int = 16 * 1024 * 1024
    #: Caps checked before a call's request is read (``coordinator.gate``).
    gate: GateSettings = field(default_factory=GateSettings)
    #: Admission limits (rate, burst, pending jobs and bytes) a tenant gets where neither its
    #: ``tenant_limits`` entry nor its stored limits (SetTenantLimits) set them: the flags
    #: with SHARDQ_TENANT_LIMITS' ``"*"`` entry over them (see :mod:`coordinator.limits`).
    default_limits: TenantLimits = field(
        default_factory=lambda: TenantLimits(max_pending=1_000_000)
    )
    #: Per tenant, SHARDQ_TENANT_LIMITS' entry: defaults over ``default_limits``.
    tenant_limits: Mapping[str, TenantLimits] = field(default_factory=dict)
    #: Refuse a submit whose handler no live worker serving its queue has
    #: (``--reject-unknown-handlers``): FAILED_PRECONDITION naming the handler.
    reject_unknown_handlers: bool = False
    #: Most recurring schedules per tenant.
    max_schedules_per_tenant: int = 1_000
    #: How often the shard-map version is polled besides LISTEN/NOTIFY, in seconds.
    map_poll_interval_s: float = 0.5
    #: How long a token's lookup is reused, in seconds: the delay before a token revoked
    #: elsewhere stops working here (``--token-cache-ttl-s``).
    token_cache_ttl_s: float = 5.0
    #: While Postgres cannot be reached, how long after its last successful lookup a token's
    #: cached answer is still used, in seconds (``--token-stale-max-s``; 0: not past the TTL).
    token_stale_max_s: float = tokens.DEFAULT_STALE_MAX_S
    #: After a failed token lookup, how long no lookup is tried (cached answers are served).
    token_retry_s: float = tokens.DEFAULT_RETRY_S
    #: A worker whose assignment stream no replica has refreshed for this long is gone, in s.
    worker_ttl_s: float = 10.0
    #: How often each replica refreshes its workers and re-reads the live set, in s.
    worker_refresh_s: float = 1.0
    #: The shards' data-plane settings (key prefix, dedupe window, payload limit...).
    shard: ShardSettings = field(default_factory=ShardSettings)
    #: Seconds a finished job's result row is kept where the tenant's limits do not say
    #: (``--result-retention-s``; 0: kept forever).
    result_retention_s: int = 0
    #: The retention purge (shardq.coordinator.retention): rows deleted per statement, and seconds
    #: between two rounds (``--retention-batch-size``, ``--retention-interval-s``).
    retention_batch_size: int = 1_000
    retention_interval_s: float = 60.0
    #: Tenants with a label of their own on the submit metrics, the busiest this many; the
    #: rest count as ``other`` (``--metrics-top-tenants``; 0: no tenant label at all).
    metrics_top_tenants: int = 0
    #: Seconds between two readiness checks of Postgres and the shards (coordinator.health).
    health_interval_s: float = DEFAULT_INTERVAL_S
    #: Seconds one readiness check (SELECT 1, a shard's PING) may take before it fails.
    health_timeout_s: float = DEFAULT_TIMEOUT_S
    #: Take part in running the pending tenant moves (``--run-moves``, coordinator.moverd):
    #: one replica at a time holds the mover lease. Off here, for coordinators built in
    #: code (tests, tools); the ``shardq-coordinator`` flag is on by default.
    run_moves: bool = False
    #: How often a replica tries to take the mover lease, and the holder checks it, in s.
    mover_poll_s: float = 0.5


class Coordinator:
    def __init__(self, settings: CoordinatorSettings) -> None:
        self.settings = settings
        self.engine: AsyncEngine = db.make_engine(settings.database_url)
        self.store = ShardMapStore(self.engine)
        self.follower = ShardMapFollower(
            self.store, db.psycopg_dsn(settings.database_url), settings.map_poll_interval_s
        )
        self.tokens = TokenStore(
            self.engine,
            cache_ttl_s=settings.token_cache_ttl_s,
            stale_max_s=settings.token_stale_max_s,
            retry_s=settings.token_retry_s,
        )
        #: Tenants' limits as admins set them (the source of truth the shards are given).
        self.limits = limits.LimitsStore(self.engine)
        #: limits_for's answer per tenant with a ``tenant_limits`` entry (the settings do not
        #: change): one object, so the shard client checks it once, not per job.
        self._overlaid: dict[str, TenantLimits] = {}
        self.pool = ShardPool(settings.redis_password, settings.shard)
        #: Where each tenant's work goes (both sides of a move); the services' way to shards.
        self.router = TenantRouter(self.pool, self.follower)
        self.registry = WorkerRegistry(
            self.engine, settings.worker_ttl_s, settings.worker_refresh_s
        )
        #: Reads of results (GetJob, WatchJob), each bounded by RESULT_READ_TIMEOUT_S.
        self._reads = db.Uncancellable()
        #: /metrics of the front door: every RPC (an interceptor) and what submits became.
        self.metrics_registry = CollectorRegistry()
        self.rpc_metrics = RpcMetrics(self.metrics_registry)
        self.submit_metrics = SubmitMetrics(self.metrics_registry, settings.metrics_top_tenants)
        #: Authentication, failed-auth throttling and concurrency caps, before any request
        #: is read (an interceptor, after rpc_metrics so that its refusals are counted).
        self.gate = Gate(
            self.check_token,
            self.token_known,
            settings.gate,
            self.metrics_registry,
            lambda: self.tokens.lookups,
            self.stream_cap,
        )
        #: Each tenant's stream cap as last read: tenant -> (cap, when read).
        self._stream_caps: OrderedDict[str, tuple[int, float]] = OrderedDict()
        #: Deletes result rows past their tenant's retention (one replica at a time).
        self.retention = retention.RetentionPurger(
            self.engine,
            default_retention_s=settings.result_retention_s,
            batch_size=settings.retention_batch_size,
            interval_s=settings.retention_interval_s,
            on_batch=retention.PurgeMetrics(self.metrics_registry).batch,
        )
        #: Readiness (gRPC health, /readyz), checked in the background.
        self.readiness = ReadinessChecker(
            self.engine,
            lambda: self.shard_map,
            self.pool,
            postgres_grace_s=max(settings.token_stale_max_s, settings.token_cache_ttl_s),
            interval_s=settings.health_interval_s,
            timeout_s=settings.health_timeout_s,
        )
        #: The in-cluster mover (``--run-moves``): runs pending moves while holding the lease.
        self.moverd = (
            MoverDaemon(
                self.store,
                settings.database_url,
                RedisShards(settings.redis_password, settings.shard),
                f"coordinator {socket.gethostname()}:{os.getpid()}",
                self.metrics_registry,
                poll_s=settings.mover_poll_s,
            )
            if settings.run_moves
            else None
        )

    async def start(self) -> None:
        self.registry.start()
        await self.follower.start()
        self.pool.update(self.follower.current)
        self.follower.on_change(self.pool.update)
        await self.readiness.start()
        self.retention.start()
        if self.moverd is not None:
            self.moverd.start()

    async def stop(self) -> None:
        if self.moverd is not None:
            await self.moverd.stop()
        await self.retention.stop()
        await self.readiness.stop()
        await self.registry.stop()
        await self.follower.stop()
        await self.pool.close()
        await self.tokens.drain()
        await self._reads.drain()
        await self.engine.dispose()

    @property
    def shard_map(self) -> ShardMap:
        return self.follower.current

    def limits_for(self, tenant: str) -> TenantLimits:
        """The coordinator's defaults for ``tenant`` (its SHARDQ_TENANT_LIMITS entry over
        ``default_limits``): what its shard uses where the tenant's stored limits say nothing."""
        entry = self.settings.tenant_limits.get(tenant)
        if entry is None:
            return self.settings.default_limits
        # Made once per tenant: a new object per job cost 5 µs to make and 10 to check again
        # (ShardClient.prepare checks a job's limits once per object in a row).
        overlaid = self._overlaid.get(tenant)
        if overlaid is None:
            overlaid = self._overlaid[tenant] = limits.overlay(self.settings.default_limits, entry)
        return overlaid

    async def stored_limits(self, tenant: str) -> TenantLimits:
        """The tenant's limits as stored (0 where its row, if any, sets nothing)."""
        return await self.limits.get(tenant) or TenantLimits()

    async def stream_cap(self, tenant: str) -> int:
        """WatchJob streams the tenant may keep open on this process: its stored
        ``max_watch_streams``, else ``--max-streams-per-tenant``. Read at most once per
        STREAM_CAP_TTL_S per tenant (a stream opens far less often than a submit); while
        Postgres cannot be reached, the last value read, else the default."""
        now = time.monotonic()
        cached = self._stream_caps.get(tenant)
        if cached is not None and now - cached[1] < STREAM_CAP_TTL_S:
            return cached[0]
        default = self.settings.gate.max_streams_per_tenant
        try:
            async with asyncio.timeout(RESULT_READ_TIMEOUT_S):
                stored = await self._reads.run(self.stored_limits(tenant))
        except tokens.UNREACHABLE:  # TimeoutError among them
            return cached[0] if cached is not None else default
        cap = stored.max_watch_streams or default
        self._stream_caps[tenant] = (cap, now)
        self._stream_caps.move_to_end(tenant)
        while len(self._stream_caps) > tokens.CACHE_MAX_ENTRIES:
            self._stream_caps.popitem(last=False)
        return cap

    def forget_stream_cap(self, tenant: str) -> None:
        """A limit set through this process applies here at once (elsewhere within
        STREAM_CAP_TTL_S)."""
        self._stream_caps.pop(tenant, None)

    def with_defaults(self, tenant: str, stored: TenantLimits) -> TenantLimits:
        """``stored`` with this coordinator's defaults, then the shard's, where it sets nothing."""
        return limits.effective(
            limits.overlay(self.limits_for(tenant), stored),
            result_retention_s=self.settings.result_retention_s,
            dedupe_window_s=self.settings.shard.dedupe_ttl_ms // 1000,
            max_watch_streams=self.settings.gate.max_streams_per_tenant,
        )

    async def authenticate(self, context: Ctx) -> Principal:
        """Who the call acts as: the gate (``coordinator.gate``) has checked its token before
        the call's request was read."""
        principal = PRINCIPAL.get()
        if principal is None:  # a call the gate does not guard (none today)
            principal = await self.check_token(bearer_token(context.invocation_metadata()))
        return principal

    def token_known(self, token: str) -> bool:
        """Whether ``token`` is not a guess to throttle (``TokenStore.known``)."""
        return self._is_env_worker_token(token) or self.tokens.known(token)

    async def check_token(self, token: str | None) -> Principal:
        """The principal ``token`` stands for; Unauthenticated when it stands for none."""
        if not token:
            raise Unauthenticated("missing 'authorization: Bearer <token>' metadata")
        if self._is_env_worker_token(token):
            return ENV_WORKER
        principal = await self.tokens.authenticate(token)
        if principal is None:
            raise Unauthenticated("the token is not valid")
        return principal

    def _is_env_worker_token(self, token: str) -> bool:
        expected = self.settings.worker_token
        # compare_digest takes the same time wherever the first difference is.
        return bool(expected) and hmac.compare_digest(token.encode(), expected.encode())

    async def tenant_of(
        self,
        context: Ctx,
        requested: str,
    ) -> str:
        """The tenant a tenant-scoped call acts on, after authentication and authorization."""
        principal = await self.authenticate(context)
        if principal.role == "admin":
            if not requested:
                raise InvalidArgument("required with the admin token", field="tenant_id")
            return validation.tenant_id(requested)
        if principal.role != "tenant" or principal.tenant_id is None:
            raise PermissionDenied("this token may not act on tenants' jobs")
        if requested and requested != principal.tenant_id:
            raise PermissionDenied("the token belongs to another tenant")
        return principal.tenant_id

    async def require_role(
        self,
        context: Ctx,
        *roles: str,
    ) -> Principal:
        principal = await self.authenticate(context)
        if principal.role not in roles:
            needed = " or ".join(roles)
            article = "an" if needed[0] in "aeiou" else "a"
            raise PermissionDenied(f"this call needs {article} {needed} token")
        return principal

    async def result_of(self, tenant: str, request_id: str) -> bytes | None:
        """The recorded result of a succeeded job, as JSON bytes.

        While Postgres cannot be reached this is UNAVAILABLE rather than the job without its
        result: an empty ``result`` would read as a handler that returned nothing
        (docs/guarantees.md, "While Postgres is away")."""
        try:
            # Bounded like a token lookup: a partitioned database can leave a connection
            # attempt hanging for minutes. The read goes on in the background (a cancelled
            # pool checkout can lose its connection) and stop() waits for it.
            async with asyncio.timeout(RESULT_READ_TIMEOUT_S):
                return await self._reads.run(read_result(self.engine, tenant, request_id))
        except tokens.UNREACHABLE as exc:  # TimeoutError among them
            raise Unavailable(
                "the job succeeded, but its result cannot be read while the database cannot "
                "be reached; retry"
            ) from exc
