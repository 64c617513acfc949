"""The recorder's gathering of outcomes into one batch (``Worker._gather``), driven step by
step on the event loop: no database is reached, no time is measured. A trickle of jobs through
a real worker is in tests/integration/test_worker.py."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable

import pytest

from shardq.common.errors import InvalidArgument
from shardq.worker import WorkerSettings
from shardq.worker.runtime import Outcome, Running, Worker
from shardq.worker.settings import MAX_RECORD_LINGER_MS
from tests.unit.test_worker_queues import claimed

#: Never connected to: the tests here stop short of writing a batch.
UNUSED_DATABASE = "postgresql://127.0.0.1:1/unused"


MakeWorker = Callable[..., Worker]


@pytest.fixture
async def make_worker() -> AsyncIterator[MakeWorker]:
    made: list[Worker] = []

    def make(**kw: int) -> Worker:
        w = Worker(WorkerSettings(database_url=UNUSED_DATABASE, **kw), {})
        made.append(w)
        return w

    yield make
    for w in made:  # never started: what its constructor made, not Worker.close()
        await w.results.close()
        await w.engine.dispose()
        w._threads.shutdown()


def outcome(n: int) -> Outcome:
    job = dataclasses.replace(claimed("h"), job_id=f"J{n}", request_id=f"r-{n}")
    return Outcome(Running(0, "127.0.0.1:1", job, 0), "success")


async def steps(n: int = 5) -> None:
    """Let the other tasks run a few steps, with no time passing for a timer."""
    for _ in range(n):
        await asyncio.sleep(0)


async def test_without_a_linger_a_batch_is_what_waits_at_once(make_worker: MakeWorker) -> None:
    w = make_worker(record_linger_ms=0)
    first, waiting = outcome(1), outcome(2)
    w._done(waiting)
    batch = [first]
    await w._gather(batch)
    assert batch == [first, waiting]


async def test_a_small_batch_waits_for_the_outcomes_that_come_within_the_linger(
    make_worker: MakeWorker,
) -> None:
    w = make_worker(record_linger_ms=50, concurrency=8)
    batch = [outcome(1)]
    gathering = asyncio.create_task(w._gather(batch))
    await steps()
    later = outcome(2)
    w._done(later)  # after the gathering began: only the wait takes it in
    await gathering
    assert [o.run.job.job_id for o in batch] == ["J1", "J2"]


async def test_the_wait_ends_once_concurrency_outcomes_are_gathered(
    make_worker: MakeWorker,
) -> None:
    # A linger as long as allowed: a wait that ran its course would still be waiting below.
    w = make_worker(record_linger_ms=MAX_RECORD_LINGER_MS, concurrency=3)
    batch = [outcome(1)]
    gathering = asyncio.create_task(w._gather(batch))
    await steps()
    w._done(outcome(2))
    await steps()
    w._done(outcome(3))
    await steps()
    assert gathering.done(), "3 outcomes at --concurrency 3 should end the wait"
    assert [o.run.job.job_id for o in batch] == ["J1", "J2", "J3"]


async def test_a_batch_of_record_batch_outcomes_does_not_wait(make_worker: MakeWorker) -> None:
    w = make_worker(record_linger_ms=MAX_RECORD_LINGER_MS, concurrency=8, record_batch=2)
    for n in (2, 3, 4):
        w._done(outcome(n))
    batch = [outcome(1)]
    await w._gather(batch)  # no wait: record_batch is reached
    assert [o.run.job.job_id for o in batch] == ["J1", "J2"]
    assert w._outcomes.qsize() == 2


@pytest.mark.parametrize("value", [-1, MAX_RECORD_LINGER_MS + 1])
def test_a_linger_out_of_range_is_refused_naming_it(value: int) -> None:
    with pytest.raises(InvalidArgument) as err:
        WorkerSettings(database_url=UNUSED_DATABASE, record_linger_ms=value)
    assert err.value.field == "record_linger_ms"
