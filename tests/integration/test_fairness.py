"""Fairness between tenants as a user meets it: jobs submitted through the gRPC API, run by a
real ``shardq-worker`` process, read back from the result rows.

The claim rule (docs/guarantees.md): on a shard, tenants take turns first (weighted), then
priority within the tenant, then FIFO. Assertions are on the order jobs started (their rank
among all starts), never on how long anything took; the waits are printed for the reader.
"""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from shardq.client import AsyncClient, TenantLimits, job_spec
from tests.support.cluster import Cluster, running_cluster
from tests.support.procs import WorkerProcess, start_worker, wait_until_serving
from tests.support.workers import result_rows, wait_for_rows

pytestmark = pytest.mark.slow


@pytest.fixture
async def cluster(database_url: str) -> AsyncIterator[Cluster]:
    async with running_cluster(database_url, shard_count=1) as c:
        yield c


async def _submit(
    client: AsyncClient, tenant: str, n: int, priority: int = 0, **payload: Any
) -> None:
    for lo in range(0, n, 500):
        specs = [
            job_spec(
                "test.work", {"n": k, **payload}, request_id=f"{tenant}-{k}", priority=priority
            )
            for k in range(lo, min(n, lo + 500))
        ]
        items = await client.submit_many(specs)
        assert not [i for i in items if i.error is not None], items[0]


async def _admin(cluster: Cluster) -> AsyncClient:
    return await cluster.client()


def _starts(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Result rows in the order their jobs started (job ID breaks ties: IDs sort by time)."""
    return sorted(rows, key=lambda r: (r["started_at"], r["job_id"]))


async def _run_worker(cluster: Cluster, name: str, **flags: Any) -> WorkerProcess:
    worker = start_worker(cluster, name, **flags)
    await wait_until_serving(worker)
    return worker


async def test_a_priority_9_flood_does_not_delay_another_tenants_priority_0_jobs(
    cluster: Cluster,
) -> None:
    a, b = await cluster.client("flood-a"), await cluster.client("calm-b")
    await _submit(a, "flood-a", 5_000, priority=9)
    await _submit(b, "calm-b", 50, priority=0)
    worker = await _run_worker(cluster, "fair-1", concurrency=16)
    try:
        rows = _starts(await wait_for_rows(cluster.database_url, 5_050, timeout_s=240))
    finally:
        worker.stop()
    ranks_b = [k for k, r in enumerate(rows) if r["tenant_id"] == "calm-b"]
    first = rows[0]["started_at"]
    a_drain_s = (max(r["started_at"] for r in rows) - first).total_seconds()
    waits_b = sorted((rows[k]["started_at"] - first).total_seconds() for k in ranks_b)
    p99_b = waits_b[min(len(waits_b) - 1, int(0.99 * len(waits_b)))]
    print(f"\nB's p99 wait {p99_b * 1000:.0f} ms; A's whole drain {a_drain_s * 1000:.0f} ms")
    # Round-robin: B's 50 jobs start among the first ~100 (plus what one claim batch and the
    # worker's concurrency can reorder), never behind A's 5,000.
    assert len(ranks_b) == 50
    assert max(ranks_b) < 300, ranks_b[-5:]


async def test_weights_3_to_1_share_the_claims_3_to_1(cluster: Cluster) -> None:
    admin = await _admin(cluster)
    await admin.set_tenant_limits(TenantLimits(weight=3), "heavy")
    heavy, light = await cluster.client("heavy"), await cluster.client("light")
    await _submit(heavy, "heavy", 3_000)
    await _submit(light, "light", 3_000)
    worker = await _run_worker(cluster, "fair-2", concurrency=16)
    try:
        rows = _starts(await wait_for_rows(cluster.database_url, 6_000, timeout_s=240))
    finally:
        worker.stop()
    # While both are backlogged (the first 2,000 starts): 3 of heavy's per 1 of light's.
    first = [r["tenant_id"] for r in rows[:2_000]]
    ratio = first.count("heavy") / first.count("light")
    print(f"\nheavy:light over the first 2,000 starts = {ratio:.2f}")
    assert 3 * 0.9 <= ratio <= 3 * 1.1


async def test_a_tenant_capped_at_4_active_never_runs_more_while_another_uses_the_rest(
    cluster: Cluster,
) -> None:
    admin = await _admin(cluster)
    await admin.set_tenant_limits(TenantLimits(max_active=4), "capped")
    capped, free = await cluster.client("capped"), await cluster.client("free")
    await _submit(capped, "capped", 60, ms=40)
    await _submit(free, "free", 600, ms=40)
    worker = await _run_worker(cluster, "fair-3", concurrency=16)
    samples: list[tuple[int, int]] = []
    try:
        while len(await result_rows(cluster.database_url)) < 660:
            stats = [await c.tenant_stats() for c in (capped, free)]
            samples.append((stats[0].active, stats[1].active))
            await asyncio.sleep(0.01)
    finally:
        worker.stop()
    print(f"\n{len(samples)} samples; capped active max {max(s[0] for s in samples)}, "
          f"free active max {max(s[1] for s in samples)}")  # fmt: skip
    assert max(s[0] for s in samples) <= 4
    # The worker's other slots went to the uncapped tenant.
    assert max(s[1] for s in samples) > 4
    assert statistics.mean(s[0] for s in samples if s[0]) > 1


async def test_nothing_of_a_paused_tenant_starts_and_after_resume_it_all_runs(
    cluster: Cluster,
) -> None:
    admin = await _admin(cluster)
    await admin.pause("paused")
    paused, other = await cluster.client("paused"), await cluster.client("other")
    await _submit(paused, "paused", 100)
    worker = await _run_worker(cluster, "fair-4", concurrency=8)
    try:
        # The worker is busy meanwhile: another tenant's jobs run to the end.
        await _submit(other, "other", 200)
        rows = await wait_for_rows(cluster.database_url, 200, timeout_s=120)
        assert {r["tenant_id"] for r in rows} == {"other"}
        assert (await paused.tenant_stats()).ready == 100
        await admin.resume("paused")
        rows = await wait_for_rows(cluster.database_url, 300, timeout_s=120)
    finally:
        worker.stop()
    done = [r for r in rows if r["tenant_id"] == "paused"]
    assert sorted(r["request_id"] for r in done) == sorted(f"paused-{k}" for k in range(100))
    assert {r["status"] for r in rows} == {"succeeded"}
