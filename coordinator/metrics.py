"""The front door's Prometheus metrics: every RPC, and what submits became.

RPCs are counted by :class:`RpcMetrics`, a gRPC aio server interceptor, under the names of the
go-grpc-prometheus / py-grpc-prometheus convention (so stock dashboards and alerts work):
``grpc_server_started_total``, ``grpc_server_handled_total`` (with ``grpc_code``, spelled as
Python's ``grpc.StatusCode`` names: ``OK``, ``INVALID_ARGUMENT``...) and the
``grpc_server_handling_seconds`` histogram, each labelled ``grpc_type``, ``grpc_service``,
``grpc_method``; plus ``shardq_coordinator_streams_open`` for server streams (WatchJob, a
worker's WatchAssignment). Only methods the server implements are counted: a client can send
any method name, and each would otherwise become a series of its own.

Submits are counted by :class:`SubmitMetrics`, called by the JobService: jobs accepted as new,
deduplicated ones, and refused ones by code. Without a tenant label by default (tenants are
unbounded); ``--metrics-top-tenants N`` gives the N busiest tenants a label of their own and
counts the rest as ``other``.

The interceptor is on the path of every call (issue 19 wants the coordinator's CPU per call
lower): a call costs a dictionary lookup, two clock reads and a few integer additions; the
metric families are built from those integers when /metrics is read.
"""

from __future__ import annotations

import bisect
import heapq
import inspect
import itertools
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

import grpc
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from shardq.coordinator.errors import CODES, translate
from shardq.v1 import admin_pb2, jobs_pb2, schedules_pb2, tenants_pb2, workers_pb2

#: Seconds. Finer at the low end than Prometheus' defaults: a submit takes about a millisecond.
HANDLING_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip

#: The label value of tenants outside the top N (``--metrics-top-tenants``).
OTHER = "other"

#: How often the top N tenants are chosen again from the submits of the last period, in s.
TOP_TENANTS_PERIOD_S = 60.0


def _declared_types() -> dict[str, str]:
    """The grpc_type label of each shardq.v1 method as its proto declares it: the gate
    (``coordinator.gate``) serves them all as request-streaming, which clients never see."""
    kinds = {
        (False, False): "unary",
        (False, True): "server_stream",
        (True, False): "client_stream",
        (True, True): "bidi_stream",
    }
    return {
        f"/{service.full_name}/{method.name}": kinds[
            method.client_streaming, method.server_streaming
        ]
        for module in (jobs_pb2, schedules_pb2, tenants_pb2, admin_pb2, workers_pb2)
        for service in module.DESCRIPTOR.services_by_name.values()
        for method in service.methods
    }


DECLARED_TYPES = _declared_types()

if TYPE_CHECKING:
    Handler = grpc.RpcMethodHandler[Any, Any]
else:  # generic only in the type stubs
    Handler = grpc.RpcMethodHandler


class _Method:
    """One method's counts, kept as plain numbers and turned into samples at scrape time."""

    __slots__ = ("buckets", "handled", "labels", "original", "started", "streams", "sum", "wrapped")

    def __init__(self, labels: tuple[str, str, str], original: Handler) -> None:
        #: (grpc_type, grpc_service, grpc_method)
        self.labels = labels
        self.started = 0
        self.handled: dict[grpc.StatusCode, int] = {}
        #: Calls per HANDLING_BUCKETS interval (not cumulative); the last is over the top.
        self.buckets = [0] * (len(HANDLING_BUCKETS) + 1)
        self.sum = 0.0
        self.streams = 0
        #: The handler this entry wraps, and its wrapped copy (cached: the server finds the same
        #: handler object for a method on every call).
        self.original = original
        self.wrapped: Handler = original


class RpcMetrics(grpc.aio.ServerInterceptor):
    """Counts and times every call of an implemented method (see the module docstring).

    Also a Prometheus collector: the counts are plain integers on the event loop's thread (no
    locks, no label lookups per call: prometheus_client's ``inc``/``observe`` took four
    times the instructions), and become metric families only when /metrics is read.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self._methods: dict[str, _Method] = {}
        registry.register(self)

    def describe(self) -> list[Metric]:
        return self.collect()

    def collect(self) -> list[Metric]:
        labels = ["grpc_type", "grpc_service", "grpc_method"]
        started = CounterMetricFamily(
            "grpc_server_started", "RPCs started on the server", labels=labels
        )
        handled = CounterMetricFamily(
            "grpc_server_handled",
            "RPCs completed on the server, whatever their status code",
            labels=[*labels, "grpc_code"],
        )
        handling = HistogramMetricFamily(
            "grpc_server_handling_seconds",
            "Time from the start of an RPC to its status, in seconds (streams: their lifetime)",
            labels=labels,
        )
        streams = GaugeMetricFamily(
            "shardq_coordinator_streams_open",
            "Server streams open now (WatchJob, WatchAssignment)",
            labels=labels[1:],
        )
        for m in list(self._methods.values()):
            started.add_metric(m.labels, m.started)
            for code, n in list(m.handled.items()):
                handled.add_metric([*m.labels, code.name], n)
            cumulative = list(itertools.accumulate(m.buckets))
            handling.add_metric(m.labels, list(zip(_LE, cumulative, strict=True)), sum_value=m.sum)
            if m.labels[0] != "unary":
                streams.add_metric(m.labels[1:], m.streams)
        return [started, handled, handling, streams]

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Handler | None:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler  # UNIMPLEMENTED: not counted (any name a client sends would count)
        name = handler_call_details.method
        m = self._methods.get(name)
        if m is None or m.original is not handler:
            m = self._methods[name] = self._method(name, handler)
        return m.wrapped

    def _method(self, full_name: str, handler: Handler) -> _Method:
        service, _, method = full_name.lstrip("/").rpartition("/")
        if full_name in DECLARED_TYPES:
            rpc_type = DECLARED_TYPES[full_name]
        elif handler.unary_unary is not None:
            rpc_type = "unary"
        elif handler.unary_stream is not None:
            rpc_type = "server_stream"
        elif handler.stream_unary is not None:
            rpc_type = "client_stream"
        else:
            rpc_type = "bidi_stream"
        m = _Method((rpc_type, service, method), handler)
        behavior = handler.unary_unary or handler.unary_stream
        behavior = behavior or handler.stream_unary or handler.stream_stream
        if inspect.iscoroutinefunction(behavior) or inspect.isasyncgenfunction(behavior):
            m.wrapped = self._wrap(handler, m)
        # else a sync handler (none of ours): not counted, left as it is
        return m

    def _wrap(self, handler: Handler, m: _Method) -> Handler:
        # grpc's handlers are namedtuples (RpcMethodHandler in the stubs has no _replace).
        h: Any = handler
        if h.unary_unary is not None:
            wrapped = h._replace(unary_unary=_unary(h.unary_unary, m))
        elif h.unary_stream is not None:
            wrapped = h._replace(unary_stream=_stream(h.unary_stream, m))
        elif h.stream_unary is not None:
            wrapped = h._replace(stream_unary=_unary(h.stream_unary, m))
        else:
            wrapped = h._replace(stream_stream=_stream(h.stream_stream, m))
        result: Handler = wrapped
        return result


#: The ``le`` label of each bucket, as prometheus_client spells it ("0.0005", "1.0", "+Inf").
_LE = [*(repr(float(b)) for b in HANDLING_BUCKETS), "+Inf"]


def _done(m: _Method, code: grpc.StatusCode, started: float) -> None:
    elapsed = time.perf_counter() - started
    m.buckets[bisect.bisect_left(HANDLING_BUCKETS, elapsed)] += 1
    m.sum += elapsed
    m.handled[code] = m.handled.get(code, 0) + 1


def _unary(behavior: Callable[..., Any], m: _Method) -> Callable[..., Any]:
    async def unary(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        m.started += 1
        started = time.perf_counter()
        try:
            response = await behavior(request, context)
        except BaseException as exc:
            _done(m, _failed(context, exc), started)
            raise
        # A handler may end a call by set_code without raising.
        _done(m, context.code() or grpc.StatusCode.OK, started)
        return response

    return unary


def _stream(behavior: Callable[..., Any], m: _Method) -> Callable[..., Any]:
    if not inspect.isasyncgenfunction(behavior):
        # A handler that writes with context.write (grpc_health's Watch): gRPC tells the two
        # kinds apart by the function, so the wrapper must be of the same kind.
        unary = _unary(behavior, m)

        async def writes(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            m.streams += 1
            try:
                return await unary(request, context)
            finally:
                m.streams -= 1

        return writes

    async def stream(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        m.started += 1
        m.streams += 1
        started = time.perf_counter()
        code = grpc.StatusCode.OK
        try:
            async for item in behavior(request, context):
                yield item
            code = context.code() or grpc.StatusCode.OK
        except BaseException as exc:
            code = _failed(context, exc)
            raise
        finally:
            m.streams -= 1
            _done(m, code, started)

    return stream


def _failed(context: grpc.aio.ServicerContext[Any, Any], exc: BaseException) -> grpc.StatusCode:
    """The status a call ended with, given the exception that left its handler."""
    if isinstance(exc, grpc.aio.AbortError):
        return context.code() or grpc.StatusCode.UNKNOWN  # abort() set it
    if isinstance(exc, BaseException) and type(exc).__name__ in ("CancelledError", "GeneratorExit"):
        return grpc.StatusCode.CANCELLED  # the client went away (or the server is stopping)
    return grpc.StatusCode.UNKNOWN  # what gRPC answers for an exception it is handed


class SubmitMetrics:
    """Jobs submitted, deduplicated and refused (by code), per tenant only for the top N.

    With ``top_tenants`` 0 (the default) no metric has a tenant label. Otherwise the first N
    tenants seen get their own label at once, and every ``period_s`` the N with the most
    submits in the period keep (or get) theirs; a tenant that drops out of the top loses its
    series (Prometheus sees them end; if it comes back, they start again from 0) and counts
    as ``other`` meanwhile. So there are at most N + 1 label values whatever the tenants.
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        top_tenants: int = 0,
        period_s: float = TOP_TENANTS_PERIOD_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.top_tenants = top_tenants
        tenant = ["tenant"] if top_tenants > 0 else []
        self.submitted = Counter(
            "shardq_coordinator_jobs_submitted",
            "Jobs accepted as new by SubmitJob and SubmitJobs",
            tenant,
            registry=registry,
        )
        self.dedupe_hits = Counter(
            "shardq_coordinator_dedupe_hits",
            "Submits answered with the job already submitted under their request_id",
            tenant,
            registry=registry,
        )
        self.refused = Counter(
            "shardq_coordinator_submit_refused",
            "Jobs refused by SubmitJob and SubmitJobs (after authentication), by status code",
            [*tenant, "code"],
            registry=registry,
        )
        self._period_s = period_s
        self._clock = clock
        self._next_pick = clock() + period_s
        #: Submits per tenant in the current period (only with top_tenants).
        self._counts: dict[str, int] = {}
        #: Tenants with a label of their own now.
        self._shown: set[str] = set()
        #: Label children by label values (``labels()`` locks and builds tuples every call).
        self._children: dict[tuple[Counter, tuple[str, ...]], Any] = {}
        if top_tenants <= 0:
            # Metrics without labels count themselves (labels() is for labelled ones).
            self._submitted = self.submitted
            self._dedupe_hits = self.dedupe_hits

    def one(self, tenant: str, deduplicated: bool) -> None:
        """One job accepted by SubmitJob (the hot path: no tenant label, no allocation)."""
        if self.top_tenants > 0:
            self.count(tenant, int(not deduplicated), int(deduplicated))
        elif deduplicated:
            self._dedupe_hits.inc()
        else:
            self._submitted.inc()

    def count(
        self, tenant: str, new: int, deduplicated: int, refused: Mapping[str, int] | None = None
    ) -> None:
        """One call's jobs: ``new`` accepted, ``deduplicated``, and refused ones by code name."""
        refused = refused or {}
        label: tuple[str, ...] = ()
        if self.top_tenants > 0:
            label = (self._label(tenant, new + deduplicated + sum(refused.values())),)
        if new:
            self._child(self.submitted, label).inc(new)
        if deduplicated:
            self._child(self.dedupe_hits, label).inc(deduplicated)
        for code, n in refused.items():
            self._child(self.refused, (*label, code)).inc(n)

    def _child(self, metric: Counter, values: tuple[str, ...]) -> Any:
        if not values:
            return metric
        key = (metric, values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*values)
        return child

    def _label(self, tenant: str, jobs: int) -> str:
        self._counts[tenant] = self._counts.get(tenant, 0) + jobs
        now = self._clock()
        if now >= self._next_pick:
            self._pick()
            self._next_pick = now + self._period_s
        if tenant in self._shown:
            return tenant
        if len(self._shown) < self.top_tenants:
            self._shown.add(tenant)
            return tenant
        return OTHER

    def _pick(self) -> None:
        """The busiest N of the period keep their labels; the others' series are removed."""
        top = set(heapq.nlargest(self.top_tenants, self._counts, key=self._counts.__getitem__))
        if len(top) < self.top_tenants:
            # Fewer tenants than N submitted: quiet ones keep their label (no churn).
            rest = sorted(self._shown - top)
            top |= set(rest[: self.top_tenants - len(top)])
        gone = self._shown - top
        for key in [k for k in self._children if k[1][0] in gone]:
            metric, values = key
            metric.remove(*values)
            del self._children[key]
        self._shown = top
        self._counts = {}


#: gRPC code numbers -> their names (``SubmitJobsItem.error.code`` is a number).
CODE_NAMES = {code.value[0]: code.name for code in grpc.StatusCode}


def code_name(exc: BaseException) -> str:
    """The name of the status code ``exc`` ends a call with (coordinator.errors decides)."""
    try:
        return CODES.get(type(translate(exc)), grpc.StatusCode.INTERNAL).name
    except Exception:
        return grpc.StatusCode.INTERNAL.name
