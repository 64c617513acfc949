"""The retention purge (issue 15, item 6) in a real coordinator on a real Postgres: result rows
older than their tenant's retention go, in batches, newer ones and other tenants' stay, and
one replica purges at a time (a Postgres advisory lock).

Rows are aged by ``finished_at``; the tests write rows that finished hours or days ago
straight into ``shardq_results`` (a job cannot be made to have finished yesterday), with
the columns a worker writes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime, timedelta

import pytest
import pytest_asyncio
import sqlalchemy as sa

from shardq.coordinator.retention import PURGE_LOCK_KEY, RetentionPurger
from shardq.store.db import make_engine, results
from shardq.store.migrate import upgrade
from tests.support.cli import Shardq, one_error_line
from tests.support.cluster import Cluster, running_cluster
from tests.support.postgres import sqlalchemy_url, throwaway_database

pytestmark = pytest.mark.asyncio(loop_scope="module")

#: The cluster's default retention: 7 days.
DEFAULT_S = 7 * 86_400
BATCH = 4


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def cluster() -> AsyncIterator[Cluster]:
    with throwaway_database() as url:
        async with running_cluster(
            sqlalchemy_url(url),
            result_retention_s=DEFAULT_S,
            retention_batch_size=BATCH,
            retention_interval_s=0.2,
        ) as c:
            yield c


@pytest.fixture
def shardq(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> Shardq:
    return Shardq(cluster, capsys, default_tenant=None)


async def add_rows(
    cluster: Cluster, tenant: str, ages: Sequence[timedelta], tag: str = ""
) -> list[str]:
    """One succeeded row per age (finished that long ago); their request_ids."""
    now = datetime.now(UTC)
    rows = [
        {
            "tenant_id": tenant,
            "request_id": f"{tag}{tenant}-{i}",
            "job_id": f"j-{tag}{tenant}-{i}",
            "shard_id": 0,
            "handler": "test.work",
            "status": "succeeded",
            "result": {"i": i},
            "attempts": 1,
            "fence": i + 1,
            "worker_id": "w",
            "finished_at": now - age,
        }
        for i, age in enumerate(ages)
    ]
    async with cluster.coordinator.engine.begin() as conn:
        await conn.execute(sa.insert(results), rows)
    return [r["request_id"] for r in rows]


async def request_ids(cluster: Cluster, tenant: str) -> set[str]:
    async with cluster.coordinator.engine.connect() as conn:
        query = sa.select(results.c.request_id).where(results.c.tenant_id == tenant)
        return set((await conn.scalars(query)).all())


async def wait_for_rows(cluster: Cluster, tenant: str, wanted: set[str]) -> None:
    async with asyncio.timeout(60):
        while await request_ids(cluster, tenant) != wanted:
            await asyncio.sleep(0.1)


def metric(cluster: Cluster, name: str) -> float:
    return cluster.coordinator.metrics_registry.get_sample_value(name) or 0.0


async def test_rows_past_the_tenants_retention_go_in_batches_and_the_rest_stay(
    cluster: Cluster, shardq: Shardq
) -> None:
    run = await shardq("tenants", "set", "hourly", "--result-retention", "3600", "--json")
    assert run.code == 0, run.err
    doc = run.json()
    assert isinstance(doc, dict)
    assert doc["before"]["result_retention_s"] == DEFAULT_S
    assert doc["after"]["result_retention_s"] == 3600
    purged, batches = (
        metric(cluster, "shardq_results_purged_total"),
        metric(cluster, "shardq_results_purge_batches_total"),
    )
    hour = timedelta(hours=1)
    # All at once, so that one round finds them all: 10 old rows are 3 batches of 4.
    old = await add_rows(cluster, "hourly", [2 * hour] * 7 + [30 * hour] * 3, tag="old-")
    new = await add_rows(cluster, "hourly", [timedelta(minutes=50), timedelta(0)])
    # Another tenant on the default (7 days): 2 hours and 6 days old stay, 8 days go.
    default_kept = await add_rows(cluster, "weekly", [2 * hour, timedelta(days=6)])
    await wait_for_rows(cluster, "hourly", set(new))
    assert await request_ids(cluster, "weekly") == set(default_kept)
    assert set(old).isdisjoint(await request_ids(cluster, "hourly"))
    assert metric(cluster, "shardq_results_purged_total") - purged == len(old)
    assert metric(cluster, "shardq_results_purge_batches_total") - batches >= 3


async def test_the_server_default_applies_to_tenants_without_a_retention_of_their_own(
    cluster: Cluster,
) -> None:
    kept = await add_rows(cluster, "fallback", [timedelta(days=6, hours=23)])
    async with cluster.coordinator.engine.begin() as conn:
        await conn.execute(
            sa.insert(results),
            [
                {
                    "tenant_id": "fallback",
                    "request_id": "stale",
                    "job_id": "j-stale",
                    "handler": "test.work",
                    "status": "dead",
                    "error": "boom",
                    "attempts": 3,
                    "fence": 9,
                    "worker_id": "w",
                    "finished_at": datetime.now(UTC) - timedelta(days=8),
                }
            ],
        )
    await wait_for_rows(cluster, "fallback", set(kept))


async def test_a_long_retention_keeps_rows_the_default_would_purge(
    cluster: Cluster, shardq: Shardq
) -> None:
    year = 365 * 86_400
    run = await shardq("tenants", "set", "archive", "--result-retention", str(year))
    assert run.code == 0, run.err
    kept = await add_rows(cluster, "archive", [timedelta(days=30), timedelta(days=300)])
    gone = await add_rows(cluster, "archive-neighbour", [timedelta(days=30)])
    await wait_for_rows(cluster, "archive-neighbour", set())
    assert gone and await request_ids(cluster, "archive") == set(kept)


async def test_no_purge_runs_while_another_replica_holds_the_lock(cluster: Cluster) -> None:
    engine = make_engine(cluster.database_url)
    try:
        async with engine.connect() as other_replica:
            await other_replica.execute(
                sa.text("SELECT pg_advisory_lock(:k)"), {"k": PURGE_LOCK_KEY}
            )
            await other_replica.commit()
            old = await add_rows(cluster, "locked", [timedelta(days=10)] * 2)
            report = await cluster.coordinator.retention.purge_once()
            assert not report.ran and report.rows == 0
            assert await request_ids(cluster, "locked") == set(old)
            await other_replica.execute(
                sa.text("SELECT pg_advisory_unlock(:k)"), {"k": PURGE_LOCK_KEY}
            )
            await other_replica.commit()
        await wait_for_rows(cluster, "locked", set())
    finally:
        await engine.dispose()


async def test_a_negative_or_too_long_retention_is_refused_naming_the_field(
    shardq: Shardq,
) -> None:
    run = await shardq("tenants", "set", "acme", "--result-retention", "-5")
    assert "-5" in one_error_line(run, "INVALID_ARGUMENT")  # the wire type is unsigned
    run = await shardq("tenants", "set", "acme", "--result-retention", str(10**12))
    line = one_error_line(run, "INVALID_ARGUMENT")
    assert "limits.result_retention_s" in line


async def test_on_a_table_partitioned_by_tenant_the_purge_deletes_only_the_rows_it_found() -> None:
    """docs/scaling.md partitions the results by tenant hash; a ctid is unique within one
    partition only, and the purge (by ctid) must not delete the rows of other partitions that
    sit at the same ctids."""
    with throwaway_database() as url:
        db_url = sqlalchemy_url(url)
        await asyncio.to_thread(upgrade, db_url)
        engine = make_engine(db_url)
        try:
            async with engine.begin() as conn:
                await conn.execute(sa.text("ALTER TABLE shardq_results RENAME TO unpartitioned"))
                await conn.execute(
                    sa.text(
                        "CREATE TABLE shardq_results (LIKE unpartitioned INCLUDING DEFAULTS "
                        "INCLUDING CONSTRAINTS) PARTITION BY HASH (tenant_id)"
                    )
                )
                await conn.execute(
                    sa.text("ALTER TABLE shardq_results ADD PRIMARY KEY (tenant_id, request_id)")
                )
                for i in range(4):
                    await conn.execute(
                        sa.text(
                            f"CREATE TABLE shardq_results_{i} PARTITION OF shardq_results "
                            f"FOR VALUES WITH (MODULUS 4, REMAINDER {i})"
                        )
                    )
                now = datetime.now(UTC)
                tenants = {f"t{k}": timedelta(days=30 if k == 0 else 0) for k in range(8)}
                rows = [
                    {"tenant_id": t, "request_id": f"{t}-{i}", "job_id": f"j-{t}-{i}",
                     "shard_id": 0, "handler": "h", "status": "succeeded", "attempts": 1,
                     "fence": 1, "worker_id": "w", "finished_at": now - age}
                    for t, age in tenants.items()
                    for i in range(5)
                ]  # fmt: skip
                await conn.execute(sa.insert(results), rows)
                spread = await conn.scalar(
                    sa.text("SELECT count(DISTINCT tableoid) FROM shardq_results")
                )
            assert spread is not None and spread > 1  # the tenants share ctids across partitions
            report = await RetentionPurger(engine, default_retention_s=86_400).purge_once()
            async with engine.connect() as conn:
                left = (await conn.execute(sa.text("SELECT tenant_id FROM shardq_results"))).all()
            assert report.rows == 5
            assert sorted({t for (t,) in left}) == [f"t{k}" for k in range(1, 8)]
            assert len(left) == 35
        finally:
            await engine.dispose()
