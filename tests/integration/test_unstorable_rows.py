"""A result or an error Postgres cannot store as it is (a NUL character, an unpaired
surrogate) neither loses its job's row nor holds back the rows of the jobs recorded with it:
the result fails the job with a clear error, the error is written escaped, and every other
job of the batch is recorded once, its handler run once."""

from __future__ import annotations

import pytest

from shardq.client import JobState
from tests.support import handlers
from tests.support.cluster import running_cluster
from tests.support.workers import running_worker, wait_for_rows


@pytest.mark.timeout(180)
async def test_a_result_or_an_error_postgres_refuses_as_it_is_still_gets_its_row(
    database_url: str,
) -> None:
    async with running_cluster(database_url, shard_count=1) as cluster:
        acme = await cluster.client("acme")
        # Submitted before the worker starts: one claim, one batch of rows for all of them.
        subs = [
            await acme.submit("test.unstorable_result", {}, request_id="u-result", max_attempts=1),
            await acme.submit("test.unstorable_error", {}, request_id="u-error", max_attempts=1),
            *[
                await acme.submit("test.work", {"n": n}, request_id=f"ok-{n}", max_attempts=1)
                for n in range(10)
            ],
        ]
        for rid in ("u-result", "u-error", *(f"ok-{n}" for n in range(10))):
            handlers.EXECUTIONS[rid] = 0
        async with running_worker(cluster, concurrency=20):
            rows = {r["request_id"]: r for r in await wait_for_rows(cluster.database_url, 12)}
            jobs = [await acme.wait(s.job_id, timeout=60) for s in subs]
    assert rows["u-result"]["status"] == "dead"
    assert "cannot be stored" in rows["u-result"]["error"]
    assert "NUL" in rows["u-result"]["error"]
    assert rows["u-error"]["status"] == "dead"
    assert "bad\\0thing \\ud800" in rows["u-error"]["error"]
    assert {rows[f"ok-{n}"]["status"] for n in range(10)} == {"succeeded"}
    assert [j.state for j in jobs] == [JobState.DEAD] * 2 + [JobState.SUCCEEDED] * 10
    # Each handler ran once: no batch was refused and re-run for want of its rows.
    assert {rid: handlers.EXECUTIONS[rid] for rid in rows} == dict.fromkeys(rows, 1)
