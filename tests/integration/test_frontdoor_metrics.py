"""The front door's metrics, scraped from a real coordinator process's /metrics after calls
that end OK, INVALID_ARGUMENT, UNAUTHENTICATED, deduplicated and refused in a batch, and
while a stream is open (coordinator/metrics.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from shardq.client import AsyncClient, JobState, RetryPolicy
from shardq.coordinator.tokens import TokenStore
from shardq.coordinator.tools.redis_server import RedisProcess, free_port, parent_death_prefix
from shardq.store import db
from shardq.v1 import common_pb2
from tests.support.coordinator_proc import (
    CoordinatorProcess,
    coordinator_process,
    prepare_database,
    wait_for,
)

JOBS = "shardq.v1.JobService"


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of a scrape by (name, labels)."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(
    scrape: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str
) -> float:
    return scrape.get((name, frozenset(labels.items())), 0.0)


def rpc(method: str, rpc_type: str = "unary", **more: str) -> dict[str, str]:
    return {"grpc_type": rpc_type, "grpc_service": JOBS, "grpc_method": method, **more}


async def tokens(database_url: str, *tenants: str) -> list[str]:
    engine = db.make_engine(database_url)
    try:
        return [(await TokenStore(engine).create("tenant", t))[1] for t in tenants]
    finally:
        await engine.dispose()


async def code_of(aw: object) -> grpc.StatusCode:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await aw  # type: ignore[misc]
    return info.value.code()


async def scrape(
    coordinator: CoordinatorProcess,
) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return samples(await coordinator.metrics())


def client(coordinator: CoordinatorProcess, token: str) -> AsyncClient:
    return AsyncClient(coordinator.target, token, retry=RetryPolicy(attempts=1))


async def test_calls_are_counted_per_method_and_code_and_submits_by_outcome(
    database_url: str,
) -> None:
    shards = [RedisProcess().start()]
    try:
        admin = await prepare_database(database_url, shards)
        (token,) = await tokens(database_url, "acme")
        async with (
            coordinator_process(database_url, admin) as coordinator,
            client(coordinator, token) as acme,
            client(coordinator, "sq_0123456789ab_" + "A" * 43) as stranger,
        ):
            first = await acme.submit("test.work", {"n": 1}, request_id="r1")  # OK, new
            again = await acme.submit("test.work", {"n": 1}, request_id="r1")  # OK, dedupe
            assert again.deduplicated and again.job_id == first.job_id
            bad = acme.submit("test.work", {}, priority=42)
            assert await code_of(bad) == grpc.StatusCode.INVALID_ARGUMENT
            assert await code_of(stranger.submit("test.work", {})) == (
                grpc.StatusCode.UNAUTHENTICATED
            )
            items = await acme.submit_many(
                [
                    common_pb2.JobSpec(request_id="b1", handler="test.work", payload=b"{}"),
                    common_pb2.JobSpec(request_id="b2", handler="test.work", payload=b"{}"),
                    common_pb2.JobSpec(request_id="b3", handler="test.work", priority=99),
                ]
            )
            assert [i.error is not None for i in items] == [False, False, True]

            m = await scrape(coordinator)
            assert value(m, "grpc_server_started_total", **rpc("SubmitJob")) == 4
            handled = "grpc_server_handled_total"
            assert value(m, handled, **rpc("SubmitJob", grpc_code="OK")) == 2
            assert value(m, handled, **rpc("SubmitJob", grpc_code="INVALID_ARGUMENT")) == 1
            assert value(m, handled, **rpc("SubmitJob", grpc_code="UNAUTHENTICATED")) == 1
            assert value(m, "grpc_server_handling_seconds_count", **rpc("SubmitJob")) == 4
            assert value(m, handled, **rpc("SubmitJobs", grpc_code="OK")) == 1
            buckets = "grpc_server_handling_seconds_bucket"
            assert value(m, buckets, **rpc("SubmitJob", le="+Inf")) == 4
            assert value(m, buckets, **rpc("SubmitJob", le="10.0")) == 4  # none took 10 s
            # Jobs, not calls: the batch's two new jobs and its refused item count too.
            assert value(m, "shardq_coordinator_jobs_submitted_total") == 3
            assert value(m, "shardq_coordinator_dedupe_hits_total") == 1
            refused = "shardq_coordinator_submit_refused_total"
            assert value(m, refused, code="INVALID_ARGUMENT") == 2
            # A caller that is not authenticated is no tenant's refusal (its call is counted).
            assert value(m, refused, code="UNAUTHENTICATED") == 0
            assert not any(dict(labels).get("tenant") for _, labels in m)

            # A stream is open while a client watches a job, and ends CANCELLED when it leaves.
            later = await acme.submit("test.work", {}, request_id="later", delay=3600)
            open_streams = "shardq_coordinator_streams_open"
            watch = {"grpc_service": JOBS, "grpc_method": "WatchJob"}

            async def watch_forever() -> None:
                async for _ in acme.watch(later.job_id):
                    pass

            watcher = asyncio.create_task(watch_forever())
            await wait_for(
                lambda: scrape(coordinator), lambda m: value(m, open_streams, **watch) == 1
            )
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            m = await wait_for(
                lambda: scrape(coordinator), lambda m: value(m, open_streams, **watch) == 0
            )
            stream = rpc("WatchJob", "server_stream", grpc_code="CANCELLED")
            assert value(m, handled, **stream) == 1
    finally:
        for redis in shards:
            redis.cleanup()


async def test_the_busiest_tenants_get_a_label_of_their_own_and_the_rest_count_as_other(
    database_url: str,
) -> None:
    shards = [RedisProcess().start()]
    try:
        admin = await prepare_database(database_url, shards)
        acme_token, globex_token = await tokens(database_url, "acme", "globex")
        async with (
            coordinator_process(database_url, admin, metrics_top_tenants=1) as coordinator,
            client(coordinator, acme_token) as acme,
            client(coordinator, globex_token) as globex,
        ):
            await acme.submit("test.work", {}, request_id="a1")
            await globex.submit("test.work", {}, request_id="g1")
            await globex.submit("test.work", {}, request_id="g2")
            await globex.submit("test.work", {}, request_id="g1")
            assert await code_of(globex.submit("test.work", {}, priority=42)) == (
                grpc.StatusCode.INVALID_ARGUMENT
            )
            m = await scrape(coordinator)
            submitted = "shardq_coordinator_jobs_submitted_total"
            assert value(m, submitted, tenant="acme") == 1
            assert value(m, submitted, tenant="other") == 2
            assert value(m, "shardq_coordinator_dedupe_hits_total", tenant="other") == 1
            refused = "shardq_coordinator_submit_refused_total"
            assert value(m, refused, tenant="other", code="INVALID_ARGUMENT") == 1
            assert value(m, submitted) == 0  # no series without the tenant label
    finally:
        for redis in shards:
            redis.cleanup()


DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "shardq.json"

#: PromQL words that are not metric names (functions are told apart by their "(").
PROMQL_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool"}
PROMQL_KEYWORDS |= {"and", "or", "unless", "offset"}


def dashboard_metric_names() -> set[str]:
    """Every metric name the dashboard's PromQL reads."""
    names: set[str] = set()
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        for target in panel.get("targets", []):
            expr = re.sub(r"\{[^}]*\}", "", target["expr"])  # label matchers
            expr = re.sub(r"\[[^\]]*\]", "", expr)  # ranges
            expr = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", expr)  # grouping
            for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", expr):
                followed_by = expr[match.end() :].lstrip()[:1]
                if followed_by != "(" and match.group() not in PROMQL_KEYWORDS:
                    names.add(match.group())
    return names


#: The sample names a family of each type exports (histograms' buckets, sums and counts).
SUFFIXES = {
    "counter": ("_total",),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count"),
    "summary": ("_sum", "_count", ""),
    "untyped": ("",),
}


def exported_names(text: str) -> set[str]:
    """Every sample name a scrape declares, with or without samples yet (a labelled counter
    nobody has incremented is declared by its # TYPE line alone)."""
    names = set()
    for family in text_string_to_metric_families(text):
        names |= {family.name + suffix for suffix in SUFFIXES.get(family.type, ("",))}
        names |= {s.name for s in family.samples}
    return names


def http_get(port: int, path: str) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
        body: bytes = r.read()
    return body.decode()


def scrape_when_up(port: int) -> str:
    """The /metrics text, or "" while the process is still starting (nothing listens yet:
    its jobs can finish before the shard loop has imported everything and bound its port)."""
    try:
        return http_get(port, "/metrics")
    except OSError:
        return ""


def spawn(module: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [*parent_death_prefix(), sys.executable, "-m", module], env={**os.environ, **env}
    )


@contextlib.contextmanager
def processes(*procs: subprocess.Popen[bytes]) -> Iterator[None]:
    try:
        yield
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)


async def test_every_metric_of_the_grafana_dashboard_is_exported_by_a_live_cluster(
    database_url: str,
) -> None:
    names = dashboard_metric_names()
    assert len(names) > 20 and "grpc_server_handled_total" in names, names
    shards = [RedisProcess().start()]
    try:
        admin = await prepare_database(database_url, shards)
        (token,) = await tokens(database_url, "acme")
        loop_port, worker_port = free_port(), free_port()
        common = {"SHARDQ_DATABASE_URL": database_url, "SHARDQ_KEY_PREFIX": "sq"}
        async with coordinator_process(database_url, admin) as coordinator:
            shard_loop = spawn(
                "shardq.shard",
                {
                    **common,
                    "SHARDQ_REDIS_URL": shards[0].url,
                    "SHARDQ_SHARD_ID": "0",
                    "SHARDQ_METRICS_PORT": str(loop_port),
                    "SHARDQ_LOAD_INTERVAL_S": "0.2",
                },
            )
            worker = spawn(
                "shardq.worker",
                {
                    **common,
                    "SHARDQ_HANDLERS": "tests.support.handlers",
                    "SHARDQ_COORDINATOR": coordinator.target,
                    "SHARDQ_WORKER_TOKEN": admin,
                    "SHARDQ_METRICS_PORT": str(worker_port),
                },
            )
            with processes(shard_loop, worker):
                async with client(coordinator, token) as acme:
                    jobs = [await acme.submit("test.work", {"n": n}) for n in range(5)]
                    for job in jobs:
                        done = await acme.wait(job.job_id)
                        assert done.state == JobState.SUCCEEDED
                    # The shard loop has sampled the tenant since (its gauges are set).
                    await wait_for(
                        lambda: asyncio.to_thread(scrape_when_up, loop_port),
                        lambda text: 'tenant="acme"' in text,
                    )
                exported = set()
                for port in (coordinator.ops_port, loop_port, worker_port):
                    exported |= exported_names(await asyncio.to_thread(http_get, port, "/metrics"))
                assert sorted(names - exported) == []
    finally:
        for redis in shards:
            redis.cleanup()
