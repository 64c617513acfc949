"""Queues end to end, with real coordinators, shards, shard loops and Postgres: worker groups
with their own handlers and queues, jobs handed back by a worker without their handler, and
metric labels that random handler names cannot grow."""

from __future__ import annotations

import asyncio
import logging
import re
import urllib.request
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import AbstractAsyncContextManager
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from shardq.client import JobState, job_spec
from shardq.worker import Worker
from tests.support.cluster import Cluster, running_cluster
from tests.support.procs import WorkerProcess, start_worker, wait_until_serving
from tests.support.workers import running_worker, shard_loops, wait_for_rows

TENANTS = [f"tenant-{i}" for i in range(6)]
MAIL = "tests.support.handlers_mail"
REPORTS = "tests.support.handlers_reports"


@pytest.fixture
async def cluster(database_url: str) -> AsyncIterator[Cluster]:
    async with running_cluster(database_url) as c, shard_loops(c):
        yield c


@pytest.fixture
async def one_shard(database_url: str) -> AsyncIterator[Cluster]:
    """One shard, so every worker of a queue claims on the shard where all the jobs are."""
    async with running_cluster(database_url, shard_count=1) as c, shard_loops(c):
        yield c


def worker_with(
    cluster: Cluster, handlers: Iterable[str], **kw: Any
) -> AbstractAsyncContextManager[Worker]:
    """An in-process worker that has only ``handlers`` (of the test handlers)."""
    return running_worker(cluster, handlers, **kw)


async def until(cond: Callable[[], Awaitable[bool]], what: str, timeout_s: float = 30) -> None:
    """Poll state another task or process owns (no event exists for it) until ``cond()``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not await cond():
        assert loop.time() < deadline, f"never: {what}"
        await asyncio.sleep(0.05)


def sample(worker: Worker, name: str, **labels: str) -> float:
    return worker.metrics.registry.get_sample_value(name, labels) or 0.0


def scrape(w: WorkerProcess) -> str:
    """The worker's /metrics, as Prometheus reads it."""
    with urllib.request.urlopen(f"http://127.0.0.1:{w.metrics_port}/metrics", timeout=5) as r:
        text: str = r.read().decode()
        return text


def series(text: str) -> list[str]:
    return [
        f"{s.name}{sorted(s.labels.items())}"
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


def total(text: str, name: str) -> float:
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    )


async def test_two_worker_groups_with_disjoint_handlers_and_queues_each_run_only_their_own_jobs(
    cluster: Cluster,
) -> None:
    groups = {
        "mail": [start_worker(cluster, f"mail-{i}", handlers=MAIL) for i in range(2)],
        "reports": [start_worker(cluster, "reports-0", handlers=REPORTS, queues="reports")],
    }
    everyone = [w for ws in groups.values() for w in ws]
    try:
        for w in everyone:
            await wait_until_serving(w)
        kinds = {"mail.send": ("mail", ""), "report.build": ("reports", "reports")}
        expected: dict[tuple[str, str], str] = {}
        for t in TENANTS:
            c = await cluster.client(t)
            specs = [
                job_spec(handler, {"n": n}, request_id=f"{handler}-{n}", queue=queue)
                for n in range(15)
                for handler, (_, queue) in kinds.items()
            ]
            items = await c.submit_many(specs)
            assert not [i for i in items if i.error is not None]
            expected.update({(t, s.request_id): s.handler for s in specs})
        rows = await wait_for_rows(cluster.database_url, len(expected))
        assert Counter((r["tenant_id"], r["request_id"]) for r in rows) == Counter(set(expected))
        names = {g: {w.worker_id for w in ws} for g, ws in groups.items()}
        for r in rows:
            assert (r["status"], r["attempts"]) == ("succeeded", 1), r
            group = kinds[expected[(r["tenant_id"], r["request_id"])]][0]
            assert r["worker_id"] in names[group], f"{r['request_id']} ran on {r['worker_id']}"
        for t in TENANTS:
            assert not (await (await cluster.client(t)).list_dead()).items
        # Nothing was even claimed by the other group: no worker handed a job back.
        for w in everyone:
            assert total(await asyncio.to_thread(scrape, w), "shardq_worker_unrunnable_total") == 0
            health = await asyncio.to_thread(w.health)
            assert health is not None
            claimed_queues = {q for qs in health["shard_queues"].values() for q in qs}
            assert claimed_queues == ({"reports"} if w in groups["reports"] else {"default"})
    finally:
        for w in everyone:
            w.stop()


async def test_a_worker_without_the_handler_hands_the_job_back_and_a_worker_with_it_runs_it(
    one_shard: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    cluster = one_shard
    c = await cluster.client("acme")
    with caplog.at_level(logging.WARNING, "shardq.worker"):
        async with worker_with(cluster, ["test.work"], worker_id="lacks-echo") as lacking:
            subs = [await c.submit("echo", {"n": n}, request_id=f"echo-{n}") for n in range(10)]

            async def all_handed_back() -> bool:
                return sample(lacking, "shardq_worker_unrunnable_total", queue="default") >= 10

            await until(all_handed_back, "the worker without echo hands back all 10 jobs")
            for s in subs:  # back to ready: neither run nor dead-lettered
                assert (await c.get(s.job_id)).state == JobState.READY
            async with worker_with(cluster, ["echo"], worker_id="has-echo"):
                finals = [await c.wait(s.job_id) for s in subs]
    assert [(f.state, f.attempts) for f in finals] == [(JobState.SUCCEEDED, 1)] * 10
    rows = await wait_for_rows(cluster.database_url, 10)
    assert {(r["worker_id"], r["status"], r["attempts"]) for r in rows} == {
        ("has-echo", "succeeded", 1)
    }
    said = [r for r in caplog.records if "no handler named" in r.msg]
    assert [r.args[0] for r in said] == ["echo"]  # type: ignore[index]
    assert (await c.tenant_stats()).unrunnable_total >= 10


async def test_random_handler_names_do_not_grow_a_workers_metric_series(
    one_shard: Cluster,
) -> None:
    cluster = one_shard
    c = await cluster.client("acme")
    # A long backoff: each job is handed back once, so the counts below are exactly the jobs.
    worker = start_worker(cluster, "mail-0", handlers=MAIL, unknown_handler_backoff_ms=600_000)
    try:
        await wait_until_serving(worker)
        sent = 0

        async def send(handlers: list[str]) -> str:
            """Submit jobs of ``handlers``; the scrape once every one of them settled."""
            nonlocal sent
            items = await c.submit_many([job_spec(h, {}) for h in handlers])
            assert not [i for i in items if i.error is not None]
            sent += len(handlers)
            text = ""

            async def settled() -> bool:
                nonlocal text
                text = await asyncio.to_thread(scrape, worker)
                done = total(text, "shardq_worker_unrunnable_total")
                done += total(text, "shardq_worker_job_duration_seconds_count")
                return done >= sent

            await until(settled, f"{sent} jobs settled")
            return text

        random_names = [f"random.{uuid.uuid4().hex}" for _ in range(500)]
        before = series(await send(["mail.send", random_names[0]]))
        after_text = await send(random_names[1:])
        after = series(after_text)
        print(f"series of one worker: {len(before)} before, {len(after)} after 500 random names")
        assert after == before
        assert not re.search(r"random\.[0-9a-f]{32}", after_text)
    finally:
        worker.stop()
