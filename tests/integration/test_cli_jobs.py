"""The ``shardq`` commands for people (submit, get, cancel, watch, jobs, dead, schedules, stats,
shards map) against a real cluster, run as ``shardq.coordinator.cli.main`` in a thread (the client
is blocking) and once as a subprocess."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from shardq.coordinator.tools.redis_server import free_port
from shardq.shard.models import ClaimedJob, Failure, Lease
from tests.support.cli import Shardq, cluster_of_its_own, one_error_line
from tests.support.cluster import Cluster

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def cluster() -> AsyncIterator[Cluster]:
    async with cluster_of_its_own() as c:
        yield c


@pytest.fixture
def shardq(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> Shardq:
    return Shardq(cluster, capsys, default_tenant="acme")


async def test_submit_get_and_cancel_a_job(shardq: Shardq) -> None:
    sub = await shardq(
        "submit", "email.send", '{"to": "a@example.com"}', "--priority", "7",
        "--delay-ms", "3600000", "--json",
    )  # fmt: skip
    assert sub.code == 0, sub.err
    doc = sub.json()
    assert isinstance(doc, dict) and doc["deduplicated"] is False
    job = doc["job"]
    assert (job["state"], job["priority"], job["payload"]) == (
        "scheduled", 7, {"to": "a@example.com"},
    )  # fmt: skip

    shown = await shardq("get", job["job_id"])
    assert shown.code == 0
    fields = dict(line.split(None, 1) for line in shown.out.splitlines())
    assert (fields["state"], fields["handler"]) == ("scheduled", "email.send")

    cancelled = await shardq("cancel", job["job_id"])
    assert cancelled.out.strip() == f"{job['job_id']}  cancelled"
    again = await shardq("get", job["job_id"], "--json")
    assert again.json()["state"] == "cancelled"  # type: ignore[index]


async def test_a_request_id_deduplicates_and_a_conflict_is_one_error_line(shardq: Shardq) -> None:
    first = await shardq("submit", "h", '{"n": 1}', "--request-id", "order-17")
    job_id = first.out.split()[0]
    assert first.out.strip() == f"{job_id}  ready"
    second = await shardq("submit", "h", '{"n": 1}', "--request-id", "order-17")
    assert second.out.startswith(f"{job_id}  ready (deduplicated")
    conflict = await shardq("submit", "h", '{"n": 2}', "--request-id", "order-17")
    assert "request_id" in one_error_line(conflict, "ALREADY_EXISTS")


async def test_errors_print_one_line_with_the_status_code(shardq: Shardq) -> None:
    one_error_line(await shardq("get", "NOSUCHJOB"), "NOT_FOUND")
    line = one_error_line(await shardq("submit", "h", "--priority", "12"), "INVALID_ARGUMENT")
    assert "job.priority" in line
    line = one_error_line(await shardq("submit", "h", "{not json"), "INVALID_ARGUMENT")
    assert "PAYLOAD_JSON" in line
    one_error_line(await shardq("get", "X", token="sq_nope"), "UNAUTHENTICATED")
    one_error_line(await shardq("get", "X", token=""), "UNAUTHENTICATED")
    one_error_line(await shardq("shards", "map"), "PERMISSION_DENIED")
    nobody = f"127.0.0.1:{free_port()}"
    one_error_line(await shardq("get", "X", coordinator=nobody), "UNAVAILABLE")


async def test_jobs_list_pages_through_one_state(shardq: Shardq) -> None:
    ids = [
        (await shardq("submit", "h", "{}", "--delay-ms", str(60_000 * (i + 1)), tenant="pager"))
        .out.split()[0]
        for i in range(3)
    ]  # fmt: skip
    first = await shardq("jobs", "list", "--state", "scheduled", "--page-size", "2", tenant="pager")
    lines = first.out.splitlines()
    assert lines[0].split()[:3] == ["JOB_ID", "STATE", "HANDLER"]
    assert [line.split()[0] for line in lines[1:3]] == ids[:2]
    assert lines[-1].startswith("more: --page-token ")
    token = lines[-1].split()[-1]
    rest = await shardq(
        "jobs", "list", "--state", "scheduled", "--page-size", "2", "--page-token", token,
        "--json", tenant="pager",
    )  # fmt: skip
    doc = rest.json()
    assert isinstance(doc, dict)
    assert [j["job_id"] for j in doc["jobs"]] == ids[2:] and doc["next_page_token"] == ""
    empty = await shardq("jobs", "list", "--state", "dead", "--json", tenant="pager")
    assert empty.json() == {"jobs": [], "next_page_token": ""}


async def claim(cluster: Cluster, tenant: str, job_id: str) -> ClaimedJob:
    """Claim this job as a worker would (other tenants' ready jobs are handed back)."""
    client, _ = cluster.coordinator.pool.get(cluster.coordinator.shard_map.shard_for(tenant))
    claimed = await client.claim("w1", 100, 30_000)
    others = [Lease(c.job_id, c.fence) for c in claimed if c.job_id != job_id]
    await client.release(others)
    (mine,) = [c for c in claimed if c.job_id == job_id]
    return mine


async def fail(cluster: Cluster, tenant: str, job: ClaimedJob, error: str) -> None:
    client, _ = cluster.coordinator.pool.get(cluster.coordinator.shard_map.shard_for(tenant))
    await client.fail([Failure(job.job_id, job.fence, job.attempt, error)])


async def test_dead_jobs_are_listed_and_requeued(shardq: Shardq, cluster: Cluster) -> None:
    sub = await shardq("submit", "h", "{}", "--max-attempts", "1", tenant="deadly")
    job_id = sub.out.split()[0]
    await fail(cluster, "deadly", await claim(cluster, "deadly", job_id), "boom\nline 2")
    listed = await shardq("dead", "list", tenant="deadly")
    assert "LAST_ERROR" in listed.out
    assert job_id in listed.out and "boom line 2" in listed.out
    requeued = await shardq("dead", "requeue", job_id, "NOSUCHJOB", tenant="deadly")
    assert requeued.out.splitlines() == ["requeued 1 job", "not dead or unknown: NOSUCHJOB"]
    everything = await shardq("dead", "requeue", "--all", "--json", tenant="deadly")
    assert everything.json() == {"requeued_count": 0, "not_found_job_ids": []}
    one_error_line(await shardq("dead", "requeue", tenant="deadly"), "INVALID_ARGUMENT")
    shown = await shardq("get", job_id, "--json", tenant="deadly")
    assert shown.json()["state"] == "ready"  # type: ignore[index]


async def test_watch_prints_each_change_until_the_job_ends(
    shardq: Shardq, cluster: Cluster
) -> None:
    sub = await shardq("submit", "h", "{}", "--max-attempts", "1", tenant="watched")
    job_id = sub.out.split()[0]
    watching = asyncio.create_task(shardq("watch", job_id, tenant="watched"))
    await asyncio.sleep(0.5)
    claimed = await claim(cluster, "watched", job_id)
    await asyncio.sleep(1.0)  # the watch polls at most every 0.5 s
    await fail(cluster, "watched", claimed, "boom")
    run = await asyncio.wait_for(watching, 10)
    states = [line.split()[1] for line in run.out.splitlines()]
    assert states == ["ready", "active", "dead"], run.out
    assert run.out.splitlines()[-1].endswith("boom")
    again = await shardq("watch", job_id, "--json", tenant="watched")
    doc = again.json()
    assert isinstance(doc, list) and [j["state"] for j in doc] == ["dead"]


async def test_schedules_are_created_listed_and_deleted(shardq: Shardq) -> None:
    made = await shardq(
        "schedules", "create", "daily", "0 6 * * *", "report.build", '{"kind": "daily"}',
        "--tz", "Europe/Paris",
    )  # fmt: skip
    assert made.code == 0 and made.out.startswith("schedule daily: next run at 20")
    listed = await shardq("schedules", "list")
    assert listed.out.splitlines()[1].split()[:7] == [
        "daily", "0", "6", "*", "*", "*", "Europe/Paris",
    ]  # fmt: skip
    doc = (await shardq("schedules", "list", "--json")).json()
    assert isinstance(doc, list)
    assert doc[0]["payload"] == {"kind": "daily"} and doc[0]["timezone"] == "Europe/Paris"
    line = one_error_line(
        await shardq("schedules", "create", "x", "0 0 31 2 *", "h"), "INVALID_ARGUMENT"
    )
    assert "schedule.cron" in line
    assert (await shardq("schedules", "delete", "daily")).out.strip() == "deleted schedule daily"
    one_error_line(await shardq("schedules", "delete", "daily"), "NOT_FOUND")


async def test_stats_for_a_tenant_and_for_every_tenant(shardq: Shardq, cluster: Cluster) -> None:
    await shardq("submit", "h", "{}", tenant="counted")
    mine = await shardq("stats", tenant="counted")
    header, row = mine.out.splitlines()
    assert header.split()[:4] == ["TENANT", "SHARD", "SCHEDULED", "READY"]
    assert row.split()[0] == "counted" and row.split()[3] == "1"
    admin = cluster.admin_token
    one = await shardq("stats", "counted", "--json", token=admin)
    assert one.json()["ready"] == 1  # type: ignore[index]
    every = await shardq("stats", "--all", "--json", token=admin)
    doc = every.json()
    assert isinstance(doc, list) and "counted" in {t["tenant_id"] for t in doc}
    one_error_line(await shardq("stats", "--all", tenant="counted"), "PERMISSION_DENIED")
    one_error_line(await shardq("stats", token=admin), "INVALID_ARGUMENT")


async def test_an_admin_acts_for_a_tenant_with_tenant(shardq: Shardq, cluster: Cluster) -> None:
    admin = cluster.admin_token
    sub = await shardq("submit", "h", "{}", "--tenant", "acme", "--json", token=admin)
    job = sub.json()["job"]  # type: ignore[index]
    assert job["tenant_id"] == "acme"
    assert (await shardq("get", job["job_id"], tenant="acme")).code == 0


async def test_shards_map_shows_the_served_map(shardq: Shardq, cluster: Cluster) -> None:
    shown = await shardq("shards", "map", token=cluster.admin_token)
    lines = shown.out.splitlines()
    assert lines[0].startswith("shard map version 1 (16384 slots)")
    assert lines[2].split() == ["SHARD", "ADDRESS", "WEIGHT", "STATE", "SLOTS"]
    assert [line.split()[0] for line in lines[3:5]] == ["0", "1"]
    assert sum(int(line.split()[-1]) for line in lines[3:5]) == 16384
    doc = (await shardq("shards", "map", "--json", token=cluster.admin_token)).json()
    assert isinstance(doc, dict) and [s["state"] for s in doc["shards"]] == ["active", "active"]


async def test_the_module_runs_as_a_program_with_settings_from_the_environment(
    cluster: Cluster,
) -> None:
    env = dict(
        os.environ,
        SHARDQ_COORDINATOR=cluster.target,
        SHARDQ_TOKEN=await cluster.token_for("acme"),
    )
    proc = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "shardq.coordinator.cli", "get", "NOSUCHJOB"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: NOT_FOUND: ") and proc.stderr.count("\n") == 1
