"""The ``shardq`` commands of issue 12 against a real cluster: ``tenants limits``, ``tenants set``,
``pause``, ``resume`` (admin token) and ``submit --queue``, run as ``shardq.coordinator.cli.main``
in a thread; the operator's ``tenants pin|move|unpin`` stay beside them."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from shardq import client
from shardq.coordinator import cli
from shardq.shard.models import TenantLimits
from tests.support.cli import Shardq, cluster_of_its_own, one_error_line
from tests.support.cluster import Cluster

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def cluster() -> AsyncIterator[Cluster]:
    async with cluster_of_its_own() as c:
        yield c


@pytest.fixture
def shardq(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> Shardq:
    return Shardq(cluster, capsys, default_tenant=None)


def table(out: str) -> dict[str, list[str]]:
    """A printed table as first column -> the rest (header row included)."""
    rows = [line.split() for line in out.splitlines() if line.strip()]
    return {row[0]: row[1:] for row in rows}


async def test_tenants_limits_shows_the_defaults_of_a_tenant_never_set(shardq: Shardq) -> None:
    shown = await shardq("tenants", "limits", "fresh")
    assert shown.code == 0, shown.err
    rows = table(shown.out)
    assert rows["LIMIT"] == ["VALUE"]
    assert rows["weight"] == ["1"] and rows["max_pending"] == ["1000000"]
    assert rows["max_active"] == ["0", "(no", "limit)"]
    doc = (await shardq("tenants", "limits", "fresh", "--json")).json()
    assert doc == {
        "tenant_id": "fresh", "weight": 1, "max_active": 0, "submit_rate_per_s": 0.0,
        "submit_burst": 0, "max_pending": 1_000_000, "max_pending_bytes": 0,
        "result_retention_s": 0, "dedupe_window_s": 86_400, "max_watch_streams": 32,
    }  # fmt: skip


async def test_tenants_set_changes_only_the_flags_given_and_shows_before_and_after(
    shardq: Shardq, cluster: Cluster
) -> None:
    first = await shardq("tenants", "set", "acme", "--weight", "3", "--max-active", "4")
    assert first.code == 0, first.err
    rows = table(first.out)
    assert rows["LIMIT"] == ["BEFORE", "AFTER"]
    assert rows["weight"] == ["1", "->", "3"]
    assert rows["max_active"] == ["0", "(no", "limit)", "->", "4"]
    assert rows["max_pending"] == ["1000000", "1000000"]
    second = await shardq(
        "tenants", "set", "acme", "--rate", "2.5", "--burst", "10", "--max-pending", "50",
        "--max-pending-bytes", "4096", "--json",
    )  # fmt: skip
    doc = second.json()
    assert isinstance(doc, dict)
    assert doc["before"]["weight"] == 3 and doc["before"]["max_active"] == 4
    assert doc["after"] == {
        "weight": 3, "max_active": 4, "submit_rate_per_s": 2.5, "submit_burst": 10,
        "max_pending": 50, "max_pending_bytes": 4096, "result_retention_s": 0,
        "dedupe_window_s": 86_400, "max_watch_streams": 32,
    }  # fmt: skip
    shard = cluster.coordinator.pool.get(cluster.coordinator.shard_map.shard_for("acme"))[0]
    # The dedupe window is a default (the shard's own 24 h): not written into its limits.
    assert await shard.limits("acme") == TenantLimits(
        weight=3, max_active=4, submit_rate_per_s=2.5, submit_burst=10, max_pending=50,
        max_pending_bytes=4096,
    )  # fmt: skip
    back = await shardq("tenants", "set", "acme", "--max-pending", "0", "--json")
    assert back.json()["after"]["max_pending"] == 1_000_000  # type: ignore[index]


async def test_tenants_set_leaves_the_defaults_out_of_the_tenants_row(
    shardq: Shardq, cluster: Cluster
) -> None:
    """A change of one limit stores that one: the limits the tenant took from the server's
    defaults (the coordinator's max_pending, the 24 h dedupe window) stay defaults, which it
    follows when they change, rather than being written into its row as they are today."""
    run = await shardq("tenants", "set", "follower", "--weight", "2", "--json")
    assert run.code == 0, run.err
    doc = run.json()
    assert isinstance(doc, dict)
    assert doc["before"]["max_pending"] == doc["after"]["max_pending"] == 1_000_000
    admin = await cluster.client()
    assert await admin.tenant_limits("follower", stored_only=True) == client.TenantLimits(weight=2)
    effective = await admin.tenant_limits("follower")
    assert (effective.weight, effective.max_pending, effective.dedupe_window_s) == (
        2, 1_000_000, 86_400,
    )  # fmt: skip


async def test_tenants_set_refuses_nothing_to_change_and_bad_values_in_one_line(
    shardq: Shardq,
) -> None:
    line = one_error_line(await shardq("tenants", "set", "acme"), "INVALID_ARGUMENT")
    assert "--weight" in line
    line = one_error_line(await shardq("tenants", "set", "acme", "--weight", "1001"),
                          "INVALID_ARGUMENT")  # fmt: skip
    assert "limits.weight" in line
    one_error_line(await shardq("tenants", "set", "acme", "--max-active", "-1"), "INVALID_ARGUMENT")
    one_error_line(await shardq("tenants", "limits", "acme", tenant="acme"), "PERMISSION_DENIED")


async def test_pause_and_resume_a_tenant_a_queue_and_a_tenants_queue(
    shardq: Shardq, cluster: Cluster
) -> None:
    cases = [
        (["--tenant", "paused"], "tenant paused"),
        (["--queue", "reports"], "queue reports (every tenant)"),
        (["--tenant", "paused", "--queue", "emails"], "queue emails of tenant paused"),
    ]
    for flags, what in cases:
        run = await shardq("pause", *flags)
        assert (run.code, run.out.strip()) == (0, f"paused {what}"), run.err
    stats = (await shardq("stats", "paused", "--json")).json()
    assert isinstance(stats, dict)
    assert stats["paused"] is True and stats["paused_queues"] == ["emails", "reports"]
    shown = await shardq("stats", "paused")
    assert shown.out.splitlines()[0].split()[-2:] == ["UNRUNNABLE", "PAUSED"]
    assert shown.out.splitlines()[1].split()[-1] == "yes"
    for flags, _ in cases:
        named = dict(zip(flags[::2], flags[1::2], strict=True))
        run = await shardq("resume", *flags, "--json")
        target = {"tenant_id": named.get("--tenant", ""), "queue": named.get("--queue", "")}
        assert run.json() == {"resumed": target}
    after = (await shardq("stats", "paused", "--json")).json()
    assert isinstance(after, dict) and after["paused"] is False and after["paused_queues"] == []
    line = one_error_line(await shardq("pause"), "INVALID_ARGUMENT")
    assert "--tenant" in line
    one_error_line(await shardq("pause", "--queue", "a b"), "INVALID_ARGUMENT")
    one_error_line(await shardq("resume", "--tenant", "x", tenant="x"), "PERMISSION_DENIED")


async def test_submit_names_the_queue_and_get_shows_it(shardq: Shardq) -> None:
    sub = await shardq("submit", "email.send", "{}", "--queue", "emails", "--json", tenant="q")
    job = sub.json()["job"]  # type: ignore[index]
    assert job["queue"] == "emails"
    shown = await shardq("get", job["job_id"], tenant="q")
    fields = dict(line.split(None, 1) for line in shown.out.splitlines())
    assert fields["queue"] == "emails"
    line = one_error_line(await shardq("submit", "h", "--queue", "a:b", tenant="q"),
                          "INVALID_ARGUMENT")  # fmt: skip
    assert "job.queue" in line


async def test_the_operators_tenants_commands_stay_beside_the_api_ones() -> None:
    parser = cli.build_parser()
    for argv in (
        ["tenants", "pin", "acme", "1", "--database-url", "postgresql://x/y"],
        ["tenants", "unpin", "acme", "--database-url", "postgresql://x/y"],
        ["tenants", "move", "acme", "1", "--database-url", "postgresql://x/y"],
        ["tenants", "limits", "acme", "--token", "t"],
        ["tenants", "set", "acme", "--weight", "2", "--token", "t"],
    ):
        args = parser.parse_args(argv)
        assert callable(args.run_command), argv
    assert parser.parse_args(["tenants", "set", "acme", "--rate", "1.5"]).submit_rate_per_s == 1.5
