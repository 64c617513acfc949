"""Trace context from the submitting service to the handler: W3C ``traceparent``/``tracestate``
carried on the job, with OpenTelemetry spans where it is on (the ``shardq[otel]`` extra).

Off by default. It is on in a process where the variable ``SHARDQ_OTEL`` is true (or that
called :func:`enable`) and ``opentelemetry-api`` can be imported; the spans go wherever that
process's OpenTelemetry SDK sends them (its ``TracerProvider``, which the service, the worker's
handler modules or ``opentelemetry-instrument`` set up: shardq sets up no exporter).

- The client calls :func:`inject` on every job it builds: when on, the current span's context
  goes into ``JobSpec.trace_context``; when off, that is one boolean test, and nothing of
  OpenTelemetry is imported.
- The coordinator checks what arrives and stores it on the job as one short hash field
  (:func:`encode`; nothing when absent), whether or not its own tracing is on, and opens a
  span for ``SubmitJob`` when on.
- The worker gets it back from its claim and, when on, opens a ``claim`` span and a ``run``
  span around the handler, both children of the submitter's span: the handler's own spans
  join the submitter's trace.

The module is in ``shardq.common`` because the client, the coordinator and the worker all use
it, and it imports no other room of shardq.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any

from shardq.common.errors import InvalidArgument

log = logging.getLogger(__name__)

#: The variable that turns tracing on in a process (``true``, ``1``, ``yes``, ``on``).
ENV = "SHARDQ_OTEL"
#: The keys a job's trace context may have (W3C Trace Context, level 1).
KEYS = ("traceparent", "tracestate")
#: Longest value of either key, in bytes (a tracestate holds at most 32 members; 512 is what
#: the W3C recommends propagating at least).
MAX_VALUE_BYTES = 512
#: The field the coordinator names when a trace context is refused.
FIELD = "job.trace_context"

_TRACEPARENT = re.compile(r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")
_TRUE = {"1", "true", "yes", "on"}


class _Otel:
    """The OpenTelemetry API, imported once tracing is found on."""

    def __init__(self) -> None:
        # Here, not at the top: a process with tracing off never imports OpenTelemetry.
        from opentelemetry import trace  # noqa: PLC0415
        from opentelemetry.trace.propagation.tracecontext import (  # noqa: PLC0415
            TraceContextTextMapPropagator,
        )

        self.trace = trace
        # W3C trace context only: the global propagator may add baggage, which a job does not
        # carry (keys other than traceparent and tracestate are refused).
        self.propagator = TraceContextTextMapPropagator()
        self.kinds = {
            "producer": trace.SpanKind.PRODUCER,
            "server": trace.SpanKind.SERVER,
            "consumer": trace.SpanKind.CONSUMER,
            "internal": trace.SpanKind.INTERNAL,
        }

    def tracer(self) -> Any:
        return self.trace.get_tracer("shardq")


class _Switch:
    #: None until first asked; then False (off) or the OpenTelemetry pieces this module uses.
    otel: _Otel | bool | None = None


_switch = _Switch()


def enable(on: bool = True) -> bool:
    """Turn tracing on (or off) in this process, whatever ``SHARDQ_OTEL`` says. True when on:
    False asked for, or opentelemetry-api is not installed (``pip install 'shardq[otel]'``)."""
    _switch.otel = _load() if on else False
    return isinstance(_switch.otel, _Otel)


def enabled() -> bool:
    """Whether tracing is on in this process (decided on the first call, from ``SHARDQ_OTEL``)."""
    if _switch.otel is None:
        _switch.otel = _load() if os.environ.get(ENV, "").strip().lower() in _TRUE else False
    return isinstance(_switch.otel, _Otel)


def _load() -> _Otel | bool:
    try:
        return _Otel()
    except ImportError:
        log.warning(
            "%s is set but opentelemetry-api is not installed (pip install 'shardq[otel]'): "
            "tracing stays off",
            ENV,
        )
        return False


def inject(carrier: MutableMapping[str, str]) -> None:
    """Put the current span's W3C trace context into ``carrier`` (a ``JobSpec.trace_context``)
    when tracing is on and a span is current; nothing otherwise."""
    otel = _switch.otel
    if otel is None:
        enabled()
        otel = _switch.otel
    if isinstance(otel, _Otel):
        otel.propagator.inject(carrier)
        # W3C lets a tracestate hold 32 entries, more than the server keeps: drop it rather
        # than fail the submit (the traceparent alone links the trace).
        state = carrier.get("tracestate")
        if state is not None and (len(state.encode()) > MAX_VALUE_BYTES or "\n" in state):
            del carrier["tracestate"]


def encode(trace_context: Mapping[str, str]) -> str:
    """A job's trace context as the shard stores it (job hash field ``tc``): ``traceparent``,
    then ``\\n`` and ``tracestate`` if there is one; '' for none. InvalidArgument naming
    ``job.trace_context`` for keys other than :data:`KEYS`, a value over
    :data:`MAX_VALUE_BYTES`, a ``tracestate`` without ``traceparent``, or a ``traceparent``
    that is not ``version-trace_id-parent_id-flags`` in lowercase hex."""
    if not trace_context:
        return ""
    for key, value in trace_context.items():
        if key not in KEYS:
            raise InvalidArgument(
                f"{key!r} is not a trace context key (give traceparent and tracestate)",
                field=FIELD,
            )
        if len(value.encode()) > MAX_VALUE_BYTES or "\n" in value:
            raise InvalidArgument(
                f"{key} is over {MAX_VALUE_BYTES} bytes or spans lines", field=FIELD
            )
    parent = trace_context.get("traceparent", "")
    if not _TRACEPARENT.fullmatch(parent):
        raise InvalidArgument(
            f"traceparent {parent!r} is not a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>)",
            field=FIELD,
        )
    state = trace_context.get("tracestate", "")
    return f"{parent}\n{state}" if state else parent


def parent(trace_context: Mapping[str, str]) -> str:
    """:func:`encode` of ``trace_context``, or '' where it would refuse it (a span that cannot
    have it as parent has none; the submit itself refuses it, naming the field)."""
    try:
        return encode(trace_context)
    except InvalidArgument:
        return ""


def decode(stored: str) -> dict[str, str]:
    """The ``traceparent``/``tracestate`` mapping :func:`encode` made ``stored`` from."""
    if not stored:
        return {}
    parent, _, state = stored.partition("\n")
    return {"traceparent": parent, "tracestate": state} if state else {"traceparent": parent}


@contextlib.contextmanager
def _no_span() -> Iterator[None]:
    yield


def span(
    name: str, stored: str, kind: str = "internal", attributes: Mapping[str, Any] | None = None
) -> contextlib.AbstractContextManager[Any]:
    """A span named ``name``, child of the trace context ``stored`` (as :func:`encode` made it),
    current inside the ``with``; an exception leaving it is recorded on it. A context manager
    that does nothing when tracing is off or ``stored`` is '' (a job submitted untraced)."""
    if not stored or not enabled():
        return _no_span()
    otel = _switch.otel
    assert isinstance(otel, _Otel)
    context = otel.propagator.extract(decode(stored))
    return otel.tracer().start_as_current_span(  # type: ignore[no-any-return]
        name, context=context, kind=otel.kinds[kind], attributes=dict(attributes or {})
    )


def record(
    name: str,
    stored: str,
    start_ns: int,
    kind: str = "internal",
    attributes: Mapping[str, Any] | None = None,
) -> None:
    """A span that began at ``start_ns`` (``time.time_ns()``) and ends now, child of
    ``stored``: for a step already done, like the claim a batch of jobs shared. Nothing when
    tracing is off or ``stored`` is ''."""
    if not stored or not enabled():
        return
    otel = _switch.otel
    assert isinstance(otel, _Otel)
    context = otel.propagator.extract(decode(stored))
    otel.tracer().start_span(
        name,
        context=context,
        kind=otel.kinds[kind],
        attributes=dict(attributes or {}),
        start_time=start_ns,
    ).end()
