"""Tracing (issue 15, item 4) through a real cluster: the client puts the submitter's W3C trace
context on the job, the coordinator checks and stores it, and a worker process's claim and
run spans (and the handler's own) join the submitter's trace. Off, nothing is stored and
OpenTelemetry is not even imported.

The submitter is this process, with the OpenTelemetry SDK and an in-memory exporter (the
in-process coordinator's SubmitJob span lands there too); the worker is a process of its own,
whose handler module (tests/support/handlers_tracing.py) exports its spans to a file."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import pytest_asyncio
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState
from redis.asyncio import Redis

from shardq.common import tracing
from shardq.shard.keys import Keys
from shardq.v1 import common_pb2, jobs_pb2, jobs_pb2_grpc
from tests.support.cluster import Cluster, running_cluster
from tests.support.postgres import sqlalchemy_url, throwaway_database
from tests.support.procs import start_worker, wait_until_serving

pytestmark = pytest.mark.asyncio(loop_scope="module")

EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="module", autouse=True)
def otel_in_this_process() -> Iterator[None]:
    """The SDK with an in-memory exporter, and shardq's tracing on, for this module only."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
    trace.set_tracer_provider(provider)
    assert tracing.enable()
    yield
    tracing.enable(False)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def cluster() -> AsyncIterator[Cluster]:
    with throwaway_database() as url:
        async with running_cluster(sqlalchemy_url(url)) as c:
            yield c


def metadata(token: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {token}")]


async def get_job(cluster: Cluster, tenant: str, job_id: str) -> common_pb2.Job:
    token = await cluster.token_for(tenant)
    async with grpc.aio.insecure_channel(cluster.target) as channel:
        stub = jobs_pb2_grpc.JobServiceStub(channel)
        job: common_pb2.Job = await stub.GetJob(
            jobs_pb2.GetJobRequest(job_id=job_id), metadata=metadata(token)
        )
        return job


async def job_hash(cluster: Cluster, tenant: str, job_id: str) -> dict[bytes, bytes]:
    """The job's hash on its shard, as enqueue.lua wrote it."""
    shard_id = cluster.coordinator.shard_map.shard_for(tenant)
    redis = Redis(port=cluster.shards[shard_id].port)
    try:
        key = Keys(cluster.settings.shard.key_prefix).job(job_id)
        raw: dict[bytes, bytes] = await redis.hgetall(key)
        return raw
    finally:
        await redis.aclose()


def worker_spans(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.timeout(180)
async def test_one_trace_runs_from_the_submitters_span_to_the_handlers_span(
    cluster: Cluster, tmp_path: Path
) -> None:
    spans_file = tmp_path / "worker-spans.jsonl"
    worker = start_worker(
        cluster,
        "traced-1",
        handlers="tests.support.handlers_tracing",
        otel="true",
        test_spans_file=str(spans_file),
    )
    try:
        await wait_until_serving(worker, shards=len(cluster.shards))
        client = await cluster.client("shop")
        EXPORTER.clear()
        with trace.get_tracer("tests").start_as_current_span("checkout") as submitter:
            sub = await client.submit("test.traced", {"order": 7}, request_id="order-7")
        ctx = submitter.get_span_context()
        trace_id, parent_id = f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}"

        stored = (await job_hash(cluster, "shop", sub.job_id))[b"tc"].decode()
        flags = f"{int(ctx.trace_flags):02x}"
        assert stored == f"00-{trace_id}-{parent_id}-{flags}"  # the traceparent alone: compact

        async with asyncio.timeout(90):
            while (await get_job(cluster, "shop", sub.job_id)).state != (
                common_pb2.JOB_STATE_SUCCEEDED
            ):
                await asyncio.sleep(0.1)
            while not any(s["name"] == "traced work" for s in worker_spans(spans_file)):
                await asyncio.sleep(0.1)
    finally:
        worker.stop()

    spans = {s["name"]: s for s in worker_spans(spans_file)}
    claim, run, work = spans["shardq claim"], spans["shardq run test.traced"], spans["traced work"]
    assert {claim["trace_id"], run["trace_id"], work["trace_id"]} == {trace_id}
    assert claim["parent_id"] == parent_id and run["parent_id"] == parent_id
    assert work["parent_id"] == run["span_id"]
    assert run["attributes"]["shardq.job_id"] == sub.job_id
    assert run["attributes"]["shardq.tenant"] == "shop"
    (submit_span,) = [s for s in EXPORTER.get_finished_spans() if s.name == "shardq SubmitJob"]
    assert submit_span.context is not None and submit_span.parent is not None
    assert f"{submit_span.context.trace_id:032x}" == trace_id
    assert f"{submit_span.parent.span_id:016x}" == parent_id


async def test_a_submit_outside_any_span_stores_no_trace_context(cluster: Cluster) -> None:
    client = await cluster.client("shop")
    sub = await client.submit("test.traced", {"order": 8}, request_id="order-8")
    assert b"tc" not in await job_hash(cluster, "shop", sub.job_id)


async def test_a_tracestate_longer_than_the_server_keeps_is_dropped_not_fatal(
    cluster: Cluster,
) -> None:
    """W3C allows 32 tracestate entries, more bytes than a job keeps: the submit goes on
    with the traceparent alone."""
    state = TraceState([(f"vendor{n:02d}", "v" * 20) for n in range(32)])
    ctx = SpanContext(
        0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331, is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED), trace_state=state,
    )  # fmt: skip
    assert len(state.to_header()) > tracing.MAX_VALUE_BYTES
    client = await cluster.client("shop")
    with trace.use_span(NonRecordingSpan(ctx)):
        sub = await client.submit("test.traced", {"order": 10}, request_id="order-10")
    stored = (await job_hash(cluster, "shop", sub.job_id))[b"tc"].decode()
    assert stored.startswith("00-0af7651916cd43dd8448eb211c80319c-") and "\n" not in stored


#: A service's process: SHARDQ_OTEL as given, opentelemetry importable or not (``sys.modules``
#: set to None for it is what a venv without shardq[otel] looks like to an import).
SUBMITTER = textwrap.dedent("""
    import asyncio, sys
    if sys.argv[4] == "without":
        sys.modules["opentelemetry"] = None
    from shardq.client import AsyncClient

    async def main() -> None:
        async with AsyncClient(sys.argv[1], sys.argv[2]) as c:
            sub = await c.submit("test.traced", {"order": 9}, request_id=sys.argv[3])
        loaded = sorted(m for m in sys.modules if m.startswith("opentelemetry."))
        print(sub.job_id, len(loaded))

    asyncio.run(main())
""")


@pytest.mark.parametrize(
    ("otel_env", "installed"), [("true", "without"), ("", "with")], ids=["no-extra", "off"]
)
async def test_without_the_extra_or_switched_off_nothing_is_stored_nor_imported(
    cluster: Cluster, otel_env: str, installed: str
) -> None:
    token = await cluster.token_for("plain")
    rid = f"order-{installed}"
    env = {**os.environ, tracing.ENV: otel_env}
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", SUBMITTER, cluster.target, token, rid, installed],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    job_id, loaded = done.stdout.split()
    assert loaded == "0"  # no opentelemetry module imported in the submitting process
    assert b"tc" not in await job_hash(cluster, "plain", job_id)
    if installed == "without":
        assert "opentelemetry-api is not installed" in done.stderr


@pytest.mark.parametrize(
    "trace_context",
    [
        {"traceparent": "not-a-traceparent"},
        {"tracestate": "k=v"},
        {"traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01", "baggage": "k=v"},
        {"traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01", "tracestate": "k=" * 300},
    ],
    ids=["malformed", "state-alone", "other-key", "too-long"],
)
async def test_a_bad_trace_context_is_refused_naming_the_field(
    cluster: Cluster, trace_context: dict[str, str]
) -> None:
    token = await cluster.token_for("shop")
    spec = common_pb2.JobSpec(
        request_id="bad-trace", handler="test.traced", payload=b"{}", trace_context=trace_context
    )
    async with grpc.aio.insecure_channel(cluster.target) as channel:
        stub = jobs_pb2_grpc.JobServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.SubmitJob(jobs_pb2.SubmitJobRequest(job=spec), metadata=metadata(token))
    assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "job.trace_context" in (err.value.details() or "")
