"""The front door's gate: what a call to a shardq.v1 method must pass before a byte of its
request is read.

gRPC reads a unary call's whole request (up to the server's receive limit) before it runs the
handler, and a server interceptor sees only the method name and the metadata, not the peer.
So the gate serves every shardq.v1 method as a request-streaming one (the wire is the same:
one length-prefixed message; measured, no dearer per call) and reads the request itself,
after these checks:

1. **Authentication** of the bearer token; the handler finds the principal in
   :data:`PRINCIPAL`. A refused call costs its headers: a 60 MB SubmitJobs without a token is
   answered while gRPC holds no more than its flow-control window of it.
2. **Failed-authentication throttling**, of the failures that cost a database query: a
   well-formed token the cache does not know (a missing, malformed or cached-invalid token
   is refused for free; a token last read as valid is no guess). Per peer address, a bucket
   of such failures (burst ``auth_failures_burst``, refilled at ``auth_failures_per_s``):
   once it is empty, that peer's unknown tokens are refused RESOURCE_EXHAUSTED without a
   lookup (a client behind the same NAT as a guesser keeps working with its known token).
   For the whole process, a bucket of the same failures (``unknown_tokens_*``): once it is
   empty, an unknown token gets UNAVAILABLE (retried by clients) without a lookup.
   Together they bound the queries random tokens cost, from one peer or from many; valid
   tokens never use up either bucket.
3. **Concurrency caps.** Unary calls in flight per tenant (``max_calls_per_tenant``);
   SubmitJobs calls in flight on the process (``max_batch_calls``: each may hold up to the
   server's receive limit in memory, so this bounds what batches can cost); streams
   (WatchJob) per tenant (its ``max_watch_streams`` limit, else ``max_streams_per_tenant``)
   and streams of any kind on the process. Over a cap the call is
   refused RESOURCE_EXHAUSTED with a short retry delay, before its request is read.

The caps per tenant apply to tenant tokens; admin and worker tokens (the operator, the
dashboard, the cluster's own workers) meet the process-wide caps only. Everything is counted
per process: N coordinator replicas admit N times the caps.

The size of a request is checked after it is read, by the deserializer of each method
(``coordinator.api``): gRPC Python has one receive limit per server, which is the byte cap
of a whole SubmitJobs call; other methods refuse anything larger than they can need.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, Metric

from shardq.common.errors import (
    InvalidArgument,
    ResourceExhausted,
    ShardqError,
    Unauthenticated,
    Unavailable,
)
from shardq.coordinator.errors import Ctx, abort
from shardq.coordinator.tokens import Principal, well_formed

if TYPE_CHECKING:
    Handler = grpc.RpcMethodHandler[Any, Any]
else:  # generic only in the type stubs
    Handler = grpc.RpcMethodHandler

#: Who the current call acts as, set by the gate before the handler runs (each call runs in
#: a task of its own, so the value is the call's).
PRINCIPAL: ContextVar[Principal | None] = ContextVar("shardq_principal", default=None)

#: The methods the gate guards: every shardq.v1 service (health and reflection stay open,
#: as a Kubernetes probe carries no token).
GATED_PREFIX = "/shardq.v1."
#: Calls that may each carry up to the server's receive limit (``max_batch_calls``).
BATCH_METHODS = frozenset({"/shardq.v1.JobService/SubmitJobs"})
#: Most peers whose failures are remembered; the least recently failing are forgotten.
MAX_PEERS = 10_000
#: The retry delay given with a concurrency refusal, in ms: calls in flight end quickly.
BUSY_RETRY_MS = 100


@dataclass(frozen=True, slots=True)
class GateSettings:
    #: Unary calls of one tenant in flight on this process.
    max_calls_per_tenant: int = 512
    #: SubmitJobs calls in flight on this process.
    max_batch_calls: int = 16
    #: WatchJob streams of one tenant open on this process.
    max_streams_per_tenant: int = 32
    #: Streams of any kind (WatchJob, workers' WatchAssignment) open on this process.
    max_streams: int = 10_000
    #: Failed authentications a peer may have at once, and refilled per second.
    auth_failures_burst: int = 20
    auth_failures_per_s: float = 1.0
    #: Well-formed tokens unknown to the database the process looks up at once, and per s.
    unknown_tokens_burst: int = 200
    unknown_tokens_per_s: float = 20.0


class Bucket:
    """A token bucket: ``burst`` at most, ``rate`` per second. Hand-written: ten lines with
    no I/O on the event loop's thread, where a rate-limit library would bring locks or a
    storage backend for nothing."""

    __slots__ = ("at", "burst", "level", "rate")

    def __init__(self, burst: int, rate: float, now: float) -> None:
        self.burst, self.rate = float(burst), rate
        self.level, self.at = float(burst), now

    def _fill(self, now: float) -> None:
        self.level = min(self.burst, self.level + (now - self.at) * self.rate)
        self.at = now

    def wait_s(self, now: float) -> float:
        """0 when a token is there, else the seconds until one is."""
        self._fill(now)
        if self.level >= 1:
            return 0.0
        return (1 - self.level) / self.rate if self.rate > 0 else float("inf")

    def take(self, now: float) -> None:
        self._fill(now)
        self.level = max(0.0, self.level - 1)

    def give(self) -> None:
        self.level = min(self.burst, self.level + 1)


def bearer_token(metadata: Any) -> str | None:
    """The token of an ``authorization: Bearer <token>`` header, if the call has one."""
    for key, value in metadata or ():
        if key == "authorization":
            scheme, _, token = str(value).partition(" ")
            return token.strip() if scheme.lower() == "bearer" else None
    return None


def peer_host(peer: str) -> str:
    """The address part of gRPC's peer string: ``ipv4:10.0.0.7:5123`` → ``10.0.0.7``,
    ``ipv6:[::1]:5123`` → ``::1``; a Unix socket's peers are all one local peer."""
    scheme, _, rest = peer.partition(":")
    if scheme not in ("ipv4", "ipv6"):
        return scheme
    host = rest.rpartition(":")[0] or rest
    return host.strip("[]")


class Gate(grpc.aio.ServerInterceptor):
    """See the module docstring. ``check`` authenticates a token (raising Unauthenticated or
    Unavailable), ``known`` whether a token needs no throttling (``TokenStore.known``)."""

    def __init__(
        self,
        check: Callable[[str | None], Awaitable[Principal]],
        known: Callable[[str], bool],
        settings: GateSettings,
        registry: CollectorRegistry | None = None,
        lookups: Callable[[], int] = lambda: 0,
        stream_cap: Callable[[str], Awaitable[int]] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._check = check
        self._known = known
        self.settings = settings
        self._clock = clock
        self._lookups = lookups
        self._stream_cap = stream_cap
        self._peers: OrderedDict[str, Bucket] = OrderedDict()
        s = settings
        self._unknown = Bucket(s.unknown_tokens_burst, s.unknown_tokens_per_s, clock())
        self._calls: dict[str, int] = {}
        self._streams: dict[str, int] = {}
        self.batch_calls = 0
        self.streams = 0
        #: Refusals, by reason: counted here, exported by :meth:`collect`.
        self.refused: dict[str, int] = {}
        self._gated: dict[str, tuple[Handler, Handler]] = {}
        if registry is not None:
            registry.register(self)

    # -- the interceptor -------------------------------------------------------------------

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Handler | None:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or not method.startswith(GATED_PREFIX):
            return handler
        cached = self._gated.get(method)
        if cached is None or cached[0] is not handler:
            cached = self._gated[method] = (handler, self._wrap(method, handler))
        return cached[1]

    def _wrap(self, method: str, handler: Handler) -> Handler:
        h: Any = handler
        batch = method in BATCH_METHODS
        if h.unary_unary is not None:
            return grpc.stream_unary_rpc_method_handler(
                self._unary(h.unary_unary, batch),
                request_deserializer=h.request_deserializer,
                response_serializer=h.response_serializer,
            )
        if h.unary_stream is not None:
            return grpc.stream_stream_rpc_method_handler(
                self._stream(h.unary_stream),
                request_deserializer=h.request_deserializer,
                response_serializer=h.response_serializer,
            )
        return handler  # a client-streaming method (none in shardq.v1) is left as it is

    def _unary(
        self, behavior: Callable[[Any, Ctx], Awaitable[Any]], batch: bool
    ) -> Callable[[Any, Ctx], Awaitable[Any]]:
        async def gated(_requests: Any, context: Ctx) -> Any:
            try:
                principal = await self.admit(context)
                release = self._enter_call(principal, batch)
            except ShardqError as exc:
                await abort(context, exc)
            try:
                PRINCIPAL.set(principal)
                request = await _read_one(context)
                return await behavior(request, context)
            finally:
                release()

        return gated

    def _stream(
        self, behavior: Callable[[Any, Ctx], AsyncIterator[Any]]
    ) -> Callable[[Any, Ctx], AsyncIterator[Any]]:
        async def gated(_requests: Any, context: Ctx) -> AsyncIterator[Any]:
            try:
                principal = await self.admit(context)
                release = await self._enter_stream(principal)
            except ShardqError as exc:
                await abort(context, exc)
            try:
                PRINCIPAL.set(principal)
                request = await _read_one(context)
                async for item in behavior(request, context):
                    yield item
            finally:
                release()

        return gated

    # -- the checks ------------------------------------------------------------------------

    async def admit(self, context: Ctx) -> Principal:
        """The call's principal, or the ShardqError that refuses it (see the module doc)."""
        token = bearer_token(context.invocation_metadata())
        if not token or not well_formed(token) or self._known(token):
            # Refused or answered without a query, or a token last read as valid: not a guess.
            if not token:
                self._count("missing_token")
            return await self._counted(token)
        peer = peer_host(context.peer())
        now = self._clock()
        bucket = self._peers.get(peer)
        wait = bucket.wait_s(now) if bucket is not None else 0.0
        if wait:
            self._count("auth_throttled")
            raise ResourceExhausted(
                "too many failed authentications from this address; retry later",
                retry_after_ms=max(1, round(wait * 1000)),
            )
        if self._unknown.wait_s(now):
            self._count("unknown_tokens_busy")
            raise Unavailable("too many unknown tokens are being tried: this one cannot be "
                              "checked now; retry")  # fmt: skip
        # Charged before the lookup, refunded if the token is valid: calls that arrive while
        # the first lookups are under way must see them counted.
        peer_bucket = self._charge(peer, now)
        try:
            principal = await self._counted(token)
        except Unauthenticated:
            raise  # a failed guess: it stays charged
        except BaseException:
            self._refund(peer_bucket)  # the database's trouble, not the caller's guess
            raise
        self._refund(peer_bucket)
        return principal

    async def _counted(self, token: str | None) -> Principal:
        try:
            return await self._check(token)
        except Unauthenticated:
            if token:
                self._count("invalid_token")
            raise

    def _charge(self, peer: str, now: float) -> Bucket:
        """One lookup of an unknown token, charged to the peer and to the process."""
        bucket = self._peers.pop(peer, None)
        if bucket is None:
            s = self.settings
            bucket = Bucket(s.auth_failures_burst, s.auth_failures_per_s, now)
        bucket.take(now)
        self._peers[peer] = bucket  # the most recent last
        while len(self._peers) > MAX_PEERS:
            self._peers.popitem(last=False)
        self._unknown.take(now)
        return bucket

    def _refund(self, bucket: Bucket) -> None:
        bucket.give()
        self._unknown.give()

    def _enter_call(self, principal: Principal, batch: bool) -> Callable[[], None]:
        s = self.settings
        tenant = principal.tenant_id if principal.role == "tenant" else None
        if tenant is not None and self._calls.get(tenant, 0) >= s.max_calls_per_tenant:
            self._count("tenant_calls")
            raise ResourceExhausted(
                f"the tenant has {s.max_calls_per_tenant} calls in flight on this coordinator,"
                " the most it may; retry",
                retry_after_ms=BUSY_RETRY_MS,
            )
        if batch and self.batch_calls >= s.max_batch_calls:
            self._count("batch_calls")
            raise ResourceExhausted(
                f"{s.max_batch_calls} SubmitJobs calls are in flight on this coordinator, the "
                "most it takes at once; retry",
                retry_after_ms=BUSY_RETRY_MS,
            )
        if tenant is not None:
            self._calls[tenant] = self._calls.get(tenant, 0) + 1
        if batch:
            self.batch_calls += 1

        def release() -> None:
            if batch:
                self.batch_calls -= 1
            if tenant is not None:
                _decrement(self._calls, tenant)

        return release

    async def _enter_stream(self, principal: Principal) -> Callable[[], None]:
        s = self.settings
        tenant = principal.tenant_id if principal.role == "tenant" else None
        cap = s.max_streams_per_tenant
        if tenant is not None and self._stream_cap is not None:
            cap = await self._stream_cap(tenant)  # its max_watch_streams, else the default
        # No await from the check to the count: two streams opening at once cannot both pass.
        if tenant is not None and self._streams.get(tenant, 0) >= cap:
            self._count("tenant_streams")
            raise ResourceExhausted(
                f"the tenant has {cap} streams open on this coordinator, the most it may; "
                "close one or retry",
                retry_after_ms=1_000,
            )
        if self.streams >= s.max_streams:
            self._count("streams")
            raise ResourceExhausted(
                f"{s.max_streams} streams are open on this coordinator, the most it keeps; retry",
                retry_after_ms=1_000,
            )
        self.streams += 1
        if tenant is not None:
            self._streams[tenant] = self._streams.get(tenant, 0) + 1

        def release() -> None:
            self.streams -= 1
            if tenant is not None:
                _decrement(self._streams, tenant)

        return release

    def _count(self, reason: str) -> None:
        self.refused[reason] = self.refused.get(reason, 0) + 1

    # -- metrics ---------------------------------------------------------------------------

    def describe(self) -> list[Metric]:
        return self.collect()

    def collect(self) -> list[Metric]:
        refused = CounterMetricFamily(
            "shardq_coordinator_gate_refused",
            "Calls the gate refused before reading their request, by reason",
            labels=["reason"],
        )
        for reason, n in list(self.refused.items()):
            refused.add_metric([reason], n)
        lookups = CounterMetricFamily(
            "shardq_coordinator_token_lookups",
            "Tokens looked up in the database (answers not served from the cache)",
        )
        lookups.add_metric([], self._lookups())
        return [refused, lookups]


async def _read_one(context: Ctx) -> Any:
    """The call's one request message (what gRPC's deserializer made of it)."""
    request = await context.read()
    if request is grpc.aio.EOF:
        # Only a client that half-closes without a message gets here.
        await abort(context, InvalidArgument("the call carried no request message"))
    return request


def _decrement(counts: dict[str, int], key: str) -> None:
    left = counts[key] - 1
    if left:
        counts[key] = left
    else:
        del counts[key]  # a tenant with nothing in flight holds no entry
