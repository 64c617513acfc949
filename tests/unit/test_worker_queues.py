"""The worker's queues, its bounded metric labels and its once-per-interval log of missing
handlers, as pure logic (the end-to-end behaviour is in tests/integration/test_worker_queues.py)."""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

import pytest
from prometheus_client import generate_latest

from shardq.common.errors import InvalidArgument
from shardq.shard.records import ClaimedJob
from shardq.worker import WorkerSettings
from shardq.worker.metrics import OTHER, WorkerMetrics
from shardq.worker.runtime import ShardHandle
from shardq.worker.settings import parse_queues
from shardq.worker.unrunnable import MAX_NAMES_PER_INTERVAL, UnknownHandlers


def claimed(handler: str, queue: str = "default", tenant: str = "acme") -> ClaimedJob:
    return ClaimedJob(
        job_id="J1",
        fence=1,
        tenant=tenant,
        request_id="r-1",
        handler=handler,
        payload=b"{}",
        priority=0,
        run_at_ms=0,
        created_at_ms=0,
        attempt=1,
        max_attempts=3,
        timeout_ms=1_000,
        queue=queue,
    )


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_queues_are_parsed_in_order_without_duplicates() -> None:
    assert parse_queues("reports, default,reports,,") == ("reports", "default")
    assert parse_queues(["a.b", "c-d"]) == ("a.b", "c-d")
    assert WorkerSettings(database_url="x").queues == ("default",)


@pytest.mark.parametrize("raw", ["", " , ", "has space", "x" * 65, "a:b"])
def test_a_bad_or_empty_queue_list_is_refused_naming_queues(raw: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        parse_queues(raw)
    assert err.value.field == "queues"
    with pytest.raises(InvalidArgument):
        WorkerSettings(database_url="x", queues=(raw,))


def test_each_claim_call_starts_one_queue_further_so_every_queue_leads_equally() -> None:
    handle = ShardHandle(0, "127.0.0.1:1", client=None, queues=("a", "b", "c"))  # type: ignore[arg-type]
    orders = [handle.claim_order() for _ in range(9)]
    assert orders[:3] == [("a", "b", "c"), ("b", "c", "a"), ("c", "a", "b")]
    assert Counter(o[0] for o in orders) == {"a": 3, "b": 3, "c": 3}
    assert all(sorted(o) == ["a", "b", "c"] for o in orders)


def series(metrics: WorkerMetrics) -> list[str]:
    text = generate_latest(metrics.registry).decode()
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def test_handler_labels_are_the_workers_own_handlers_or_other() -> None:
    metrics = WorkerMetrics(handlers=["echo"], queues=["default"])
    metrics.claimed_many([claimed("echo"), claimed("nope-1"), claimed("nope-2")], now_ms=5)
    metrics.finished(claimed("nope-1"), "unrunnable", 0, dead=False)
    metrics.unrunnable_job(claimed("nope-1"))
    metrics.unrunnable_job(claimed("nope-3", queue="elsewhere"))
    lines = series(metrics)
    assert not [line for line in lines if "nope" in line]
    samples = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in lines}
    jobs = 'shardq_worker_jobs_total{handler="%s",outcome="%s",tenant="acme"}'
    assert samples[jobs % ("echo", "claimed")] == 1
    assert samples[jobs % (OTHER, "claimed")] == 2
    assert samples[jobs % (OTHER, "unrunnable")] == 1
    assert samples['shardq_worker_unrunnable_total{queue="default"}'] == 1
    assert samples['shardq_worker_unrunnable_total{queue="other"}'] == 1


def test_a_missing_handler_is_logged_once_per_interval_however_many_jobs_it_has(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    unknown = UnknownHandlers(WorkerMetrics(), interval_s=60, clock=clock)
    with caplog.at_level(logging.WARNING, "shardq.worker"):
        for _ in range(50):
            unknown.note(claimed("nope"))
            unknown.note(claimed("also.missing"))
        clock.now += 59
        unknown.note(claimed("nope"))
        logged = Counter(r.args[0] for r in caplog.records if r.args)  # type: ignore[index]
        assert logged == {"nope": 1, "also.missing": 1}
        clock.now += 1
        unknown.note(claimed("nope"))
    logged = Counter(r.args[0] for r in caplog.records if r.args)  # type: ignore[index]
    assert logged == {"nope": 2, "also.missing": 1}


def test_a_flood_of_random_names_is_logged_by_name_only_up_to_a_cap(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    unknown = UnknownHandlers(WorkerMetrics(), interval_s=60, clock=clock)
    extra = 25
    with caplog.at_level(logging.WARNING, "shardq.worker"):
        for i in range(MAX_NAMES_PER_INTERVAL + extra):
            unknown.note(claimed(f"random-{i}"))
        assert len(caplog.records) == MAX_NAMES_PER_INTERVAL
        clock.now += 60
        unknown.note(claimed("random-0"))
    summary: Any = caplog.records[MAX_NAMES_PER_INTERVAL]
    assert summary.args[0] == extra and "not logged by name" in summary.getMessage()
    assert caplog.records[-1].args[0] == "random-0"  # type: ignore[index]
