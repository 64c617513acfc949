"""The handler of the tracing tests, and the OpenTelemetry SDK set up as a service's handler
module would: spans of a worker process go, one JSON document a line, to the file named by
``SHARDQ_TEST_SPANS_FILE`` (the test reads them back from there)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from shardq.worker import Context, handler

#: The variable naming the file a worker process appends its spans to.
SPANS_FILE = "SHARDQ_TEST_SPANS_FILE"


class JsonLinesExporter(SpanExporter):
    """Each span as one line: name, trace and span IDs, parent span ID (hex), attributes."""

    def __init__(self, path: str) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with open(self.path, "a") as f:
            for s in spans:
                ctx, parent = s.get_span_context(), s.parent
                assert ctx is not None
                doc = {
                    "name": s.name,
                    "trace_id": f"{ctx.trace_id:032x}",
                    "span_id": f"{ctx.span_id:016x}",
                    "parent_id": f"{parent.span_id:016x}" if parent is not None else "",
                    "attributes": dict(s.attributes or {}),
                }
                f.write(json.dumps(doc) + "\n")
        return SpanExportResult.SUCCESS


if path := os.environ.get(SPANS_FILE):
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(JsonLinesExporter(path)))
    trace.set_tracer_provider(provider)


@handler("test.traced")
async def traced(ctx: Context, payload: dict[str, Any]) -> dict[str, Any]:
    """Opens a span of its own: a child of the worker's run span, in the submitter's trace."""
    with trace.get_tracer("tests.handlers").start_as_current_span("traced work"):
        return {"order": payload.get("order")}
