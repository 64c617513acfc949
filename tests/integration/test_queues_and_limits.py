"""Queues, tenant limits, pause and resume through the real gRPC API: redis-server shards,
Postgres, a coordinator (restarted where it matters), and the shards' own client to claim as
a worker would."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator

import grpc
import psycopg
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from shardq.client import JobState, job_spec
from shardq.client import TenantLimits as Limits
from shardq.coordinator import cli
from shardq.coordinator.server import build_server, parse_args, settings_from
from shardq.shard.client import ShardClient
from shardq.shard.models import Lease, TenantLimits
from shardq.store import db
from shardq.v1 import workers_pb2, workers_pb2_grpc
from tests.support.cluster import Cluster, running_cluster

C = grpc.StatusCode


@pytest.fixture
async def cluster(database_url: str) -> AsyncIterator[Cluster]:
    async with running_cluster(database_url) as c:
        yield c


async def failure(aw: object) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await aw  # type: ignore[misc]
    return info.value


def fields_of(error: grpc.aio.AioRpcError) -> list[str]:
    status = rpc_status.from_call(error)  # type: ignore[arg-type]
    out = []
    for detail in status.details if status else ():
        bad = error_details_pb2.BadRequest()
        if detail.Unpack(bad):
            out += [v.field for v in bad.field_violations]
    return out


def tenants_on(cluster: Cluster, shard_id: int, count: int, prefix: str = "t") -> list[str]:
    smap = cluster.coordinator.shard_map
    names = (f"{prefix}{i}" for i in range(10_000))
    return [t for t in names if smap.shard_for(t) == shard_id][:count]


def shard_of(cluster: Cluster, tenant: str) -> ShardClient:
    return cluster.coordinator.pool.get(cluster.coordinator.shard_map.shard_for(tenant))[0]


async def claim_all(shard: ShardClient, queues: tuple[str, ...] = ("default",)) -> list[str]:
    """Claim every job the shard hands out now from ``queues``: their tenants' IDs."""
    out: list[str] = []
    while True:
        claimed = await shard.claim("w-test", 100, 60_000, queues=queues)
        if not claimed:
            return out
        out += [c.tenant for c in claimed]


def stored_row(cluster: Cluster, tenant: str) -> dict[str, object] | None:
    with psycopg.connect(db.psycopg_dsn(cluster.database_url)) as conn:
        cur = conn.execute(
            "SELECT weight, max_active, submit_rate_per_s, submit_burst, max_pending,"
            " max_pending_bytes FROM shardq_tenant_limits WHERE tenant_id = %s",
            (tenant,),
        )
        row = cur.fetchone()
        if row is None:
            return None
        names = [d.name for d in cur.description or ()]
        return dict(zip(names, row, strict=True))


# -- queues -----------------------------------------------------------------------------------


async def test_a_job_keeps_the_queue_it_was_submitted_to(cluster: Cluster) -> None:
    c = await cluster.client("acme")
    emails = await c.submit("email.send", {}, queue="emails")
    plain = await c.submit("email.send", {})
    assert (emails.job.queue, plain.job.queue) == ("emails", "default")
    assert (await c.get(emails.job_id)).queue == "emails"
    assert (await c.get(plain.job_id)).queue == "default"
    items = await c.submit_many([job_spec("h", {}, queue="reports"), job_spec("h", {})])
    assert [(await c.get(str(i.job_id))).queue for i in items] == ["reports", "default"]
    listed = await c.list_jobs(JobState.READY, page_size=10)
    assert {j.job_id: j.queue for j in listed.items}[emails.job_id] == "emails"
    assert (job_spec("h", queue="x").queue, job_spec("h").queue) == ("x", "")


async def test_a_worker_claims_only_from_the_queues_it_serves(cluster: Cluster) -> None:
    (tenant,) = tenants_on(cluster, 0, 1)
    c = await cluster.client(tenant)
    await c.submit("email.send", {}, queue="emails")
    await c.submit("report.build", {})
    shard = shard_of(cluster, tenant)
    claimed = await shard.claim("w-emails", 10, 60_000, queues=("emails",))
    assert [(j.handler, j.queue) for j in claimed] == [("email.send", "emails")]


async def test_a_bad_queue_name_is_invalid_argument_naming_job_queue(cluster: Cluster) -> None:
    c = await cluster.client("acme")
    for bad in ("a b", "a:b", "q" * 65, "é"):
        error = await failure(c.submit("h", {}, queue=bad))
        assert error.code() == C.INVALID_ARGUMENT and fields_of(error) == ["job.queue"], bad
    at_the_limit = await c.submit("h", {}, queue="q" * 64)
    assert at_the_limit.job.queue == "q" * 64
    items = await c.submit_many([job_spec("h", {}, queue="a b"), job_spec("h", {}, queue="ok")])
    assert items[0].error and items[0].error.code == C.INVALID_ARGUMENT
    assert items[0].error.field == "job.queue"
    assert items[1].job_id


async def test_a_schedule_makes_jobs_in_the_default_queue_only(cluster: Cluster) -> None:
    c = await cluster.client("acme")
    made = await c.schedule("daily", "0 6 * * *", "h", {}, queue="default")
    assert made.schedule_id == "daily"
    error = await failure(c.schedule("other", "0 6 * * *", "h", {}, queue="x"))
    assert error.code() == C.INVALID_ARGUMENT
    assert fields_of(error) == ["schedule.job_template.queue"]


# -- limits -----------------------------------------------------------------------------------


async def test_set_tenant_limits_stores_them_pushes_them_and_answers_them_with_defaults(
    cluster: Cluster,
) -> None:
    admin = await cluster.client(None)
    wanted = Limits(max_active=4, submit_rate_per_s=2.5, max_pending_bytes=10_000)
    answered = await admin.set_tenant_limits(wanted, "acme")
    assert answered == Limits(
        weight=1,  # the shard's own default
        max_active=4,
        submit_rate_per_s=2.5,
        max_pending=1_000_000,  # the coordinator's default
        max_pending_bytes=10_000,
        dedupe_window_s=86_400,  # the server's dedupe window
        max_watch_streams=32,  # the coordinator's --max-streams-per-tenant
    )
    assert await admin.tenant_limits("acme") == answered
    assert stored_row(cluster, "acme") == {
        "weight": 0, "max_active": 4, "submit_rate_per_s": 2.5, "submit_burst": 0,
        "max_pending": 0, "max_pending_bytes": 10_000,
    }  # fmt: skip
    pushed = await shard_of(cluster, "acme").limits("acme")
    assert pushed == TenantLimits(max_active=4, submit_rate_per_s=2.5, max_pending_bytes=10_000)
    mine = await (await cluster.client("acme")).tenant_stats()
    assert mine.limits == answered


async def test_a_tenant_never_given_limits_reads_the_defaults(cluster: Cluster) -> None:
    admin = await cluster.client(None)
    assert await admin.tenant_limits("nobody") == Limits(
        weight=1, max_pending=1_000_000, dedupe_window_s=86_400, max_watch_streams=32
    )
    assert stored_row(cluster, "nobody") is None


async def test_a_submit_over_max_pending_is_refused_and_another_tenant_of_the_shard_is_not(
    cluster: Cluster,
) -> None:
    capped, neighbour = tenants_on(cluster, 0, 2)
    admin = await cluster.client(None)
    await admin.set_tenant_limits(Limits(max_pending=2), capped)
    c = await cluster.client(capped)
    await c.submit("h", {"n": 1})
    await c.submit("h", {"n": 2}, delay=60)
    error = await failure(c.submit("h", {"n": 3}))
    assert error.code() == C.RESOURCE_EXHAUSTED
    status = rpc_status.from_call(error)  # type: ignore[arg-type]
    assert status is not None
    retry = error_details_pb2.RetryInfo()
    assert any(d.Unpack(retry) for d in status.details)
    assert retry.retry_delay.ToMilliseconds() > 0
    other = await cluster.client(neighbour)
    for i in range(5):
        await other.submit("h", {"n": i})
    assert (await c.tenant_stats()).submitted_total == 2


async def test_max_pending_bytes_counts_payload_bytes(cluster: Cluster) -> None:
    admin = await cluster.client(None)
    payload = b'"' + b"x" * 98 + b'"'  # 100 bytes
    await admin.set_tenant_limits(Limits(max_pending_bytes=250), "bytes")
    c = await cluster.client("bytes")
    await c.submit("h", payload)
    await c.submit("h", payload)
    assert (await failure(c.submit("h", payload))).code() == C.RESOURCE_EXHAUSTED
    stats = await c.tenant_stats()
    assert (stats.pending_bytes, stats.ready) == (200, 2)


async def test_a_zero_field_goes_back_to_the_default(database_url: str) -> None:
    async with running_cluster(
        database_url, default_limits=TenantLimits(max_pending=3, submit_burst=7)
    ) as cluster:
        admin = await cluster.client(None)
        set_ = await admin.set_tenant_limits(Limits(max_pending=10), "acme")
        assert (set_.max_pending, set_.submit_burst) == (10, 7)
        back = await admin.set_tenant_limits(Limits(), "acme")
        assert (back.max_pending, back.submit_burst, back.weight) == (3, 7, 1)
        assert await shard_of(cluster, "acme").limits("acme") == TenantLimits()
        c = await cluster.client("acme")
        for i in range(3):
            await c.submit("h", {"n": i})
        assert (await failure(c.submit("h", {"n": 3}))).code() == C.RESOURCE_EXHAUSTED


async def test_a_stored_limit_wins_over_the_environments_default(database_url: str) -> None:
    settings = settings_from(
        parse_args(
            [
                "--database-url", database_url,
                "--tenant-limits", '{"*": {"max_pending": 50}, "acme": {"rate_per_s": 100}}',
            ]
        )
    )  # fmt: skip
    # The flags' defaults under it: 256 MiB of pending payload (--max-pending-bytes).
    assert settings.default_limits == TenantLimits(max_pending=50, max_pending_bytes=256 << 20)
    assert settings.tenant_limits == {"acme": TenantLimits(submit_rate_per_s=100)}
    async with running_cluster(
        database_url,
        default_limits=TenantLimits(max_pending=2),
        tenant_limits={"acme": TenantLimits(max_pending=3)},
    ) as cluster:
        admin = await cluster.client(None)
        assert (await admin.tenant_limits("acme")).max_pending == 3
        assert (await admin.tenant_limits("other")).max_pending == 2
        c = await cluster.client("acme")
        for i in range(3):
            await c.submit("h", {"n": i})
        assert (await failure(c.submit("h", {"n": 3}))).code() == C.RESOURCE_EXHAUSTED
        await admin.set_tenant_limits(Limits(max_pending=4), "acme")
        await c.submit("h", {"n": 3})
        assert (await failure(c.submit("h", {"n": 4}))).code() == C.RESOURCE_EXHAUSTED


def test_the_environments_limits_refuse_what_they_cannot_apply() -> None:
    url = ["--database-url", "postgresql://db/shardq"]
    for bad in (
        '{"acme": {"weight": 3}}',  # claims read it from the shard: SetTenantLimits only
        '{"acme": {"max_actve": 3}}',
        '{"a b": {"max_pending": 3}}',
        '{"acme": {"max_pending": -1}}',
        '{"acme": {"max_pending": 1.5}}',
        '{"acme": {"submit_rate_per_s": "fast"}}',
        '["acme"]',
        "{not json",
    ):
        with pytest.raises(SystemExit) as info:
            settings_from(parse_args([*url, "--tenant-limits", bad]))
        assert str(info.value).startswith("shardq-coordinator: "), bad


async def test_limits_out_of_range_are_invalid_argument_naming_the_field(
    cluster: Cluster,
) -> None:
    admin = await cluster.client(None)
    for field, bad in (
        ("weight", 1001),
        ("submit_rate_per_s", -1.0),
        ("submit_rate_per_s", float("inf")),
        ("submit_rate_per_s", float("nan")),
        ("submit_rate_per_s", 1e9),
        ("max_pending", 2**53 + 1),
        ("max_pending_bytes", 2**64 - 1),
        ("dedupe_window_s", 29),
        ("dedupe_window_s", 7 * 86_400 + 1),
        ("result_retention_s", 100 * 365 * 86_400 + 1),
    ):
        limits = Limits(**{field: bad})  # type: ignore[arg-type]  # each field in turn
        error = await failure(admin.set_tenant_limits(limits, "acme"))
        assert error.code() == C.INVALID_ARGUMENT, (field, bad)
        assert fields_of(error) == [f"limits.{field}"], (field, bad)
    assert stored_row(cluster, "acme") is None
    at_the_limits = Limits(
        weight=1000, max_active=2**32 - 1, submit_rate_per_s=999_999_999.5, submit_burst=2**32 - 1,
        max_pending=2**53, max_pending_bytes=2**53, result_retention_s=100 * 365 * 86_400,
        dedupe_window_s=7 * 86_400, max_watch_streams=2**32 - 1,
    )  # fmt: skip
    assert await admin.set_tenant_limits(at_the_limits, "acme") == at_the_limits
    error = await failure(admin.set_tenant_limits(Limits(), "a b"))
    assert (error.code(), fields_of(error)) == (C.INVALID_ARGUMENT, ["tenant_id"])
    tenant = await cluster.client("acme")
    for call in (
        tenant.set_tenant_limits(Limits(weight=5), "acme"),
        tenant.tenant_limits("acme"),
        tenant.pause("acme"),
        tenant.resume("acme"),
    ):
        assert (await failure(call)).code() == C.PERMISSION_DENIED


async def test_limits_survive_a_coordinator_restart(cluster: Cluster) -> None:
    admin = await cluster.client(None)
    limits = Limits(weight=3, max_pending=1)
    answered = await admin.set_tenant_limits(limits, "acme")
    c = await cluster.client("acme")
    await c.submit("h", {"n": 1})
    await cluster.close_clients()
    await cluster.server.stop(0)
    await cluster.coordinator.stop()
    settings = dataclasses.replace(cluster.settings, listen=cluster.target)
    server, _, coord, _ = await build_server(settings)
    await server.start()
    cluster.server, cluster.coordinator = server, coord
    admin = await cluster.client(None)
    assert await admin.tenant_limits("acme") == answered
    assert await shard_of(cluster, "acme").limits("acme") == TenantLimits(weight=3, max_pending=1)
    c = await cluster.client("acme")
    assert (await failure(c.submit("h", {"n": 2}))).code() == C.RESOURCE_EXHAUSTED
    assert (await c.tenant_stats()).limits == answered


async def test_limits_and_pauses_set_while_a_tenant_moves_reach_both_shards(
    cluster: Cluster,
) -> None:
    (tenant,) = tenants_on(cluster, 0, 1)
    c = await cluster.client(tenant)
    await c.submit("h", {"n": 1})
    words = ["tenants", "move", tenant, "1", "--no-move"]
    flags = ["--database-url", cluster.database_url, "--key-prefix", "sq", "--yes"]
    assert await asyncio.to_thread(cli.main, [*words, *flags]) == 0
    smap = await cluster.coordinator.follower.refresh()
    assert smap.moves[tenant].from_shard_id == 0
    admin = await cluster.client(None)
    await admin.set_tenant_limits(Limits(max_active=2, weight=5), tenant)
    await admin.pause(tenant)
    source, target = (cluster.coordinator.pool.get(i)[0] for i in (0, 1))
    for shard in (source, target):
        assert await shard.limits(tenant) == TenantLimits(max_active=2, weight=5)
        assert (await shard.paused(tenant)).tenant
    stats = await c.tenant_stats()
    assert stats.paused and stats.limits.max_active == 2 and stats.shard_id == 1
    await admin.resume(tenant)
    assert (await c.tenant_stats()).paused is False
    assert await asyncio.to_thread(cli.main, ["moves", "run", *flags]) == 0
    await cluster.coordinator.follower.refresh()
    assert await target.limits(tenant) == TenantLimits(max_active=2, weight=5)
    assert (await c.tenant_stats()).limits.weight == 5


# -- pause and resume -------------------------------------------------------------------------


async def test_a_paused_tenant_has_nothing_claimed_until_resumed(cluster: Cluster) -> None:
    paused, running = tenants_on(cluster, 0, 2, prefix="p")
    shard = cluster.coordinator.pool.get(0)[0]
    for tenant in (paused, running):
        c = await cluster.client(tenant)
        for i in range(3):
            await c.submit("h", {"n": i})
    admin = await cluster.client(None)
    await admin.pause(paused)
    await admin.pause(paused)  # again: a no-op
    assert sorted(await claim_all(shard)) == [running] * 3
    while await shard.wait_for_work(0.01):
        pass  # no wake-up left over from the submits
    stats = await (await cluster.client(paused)).tenant_stats()
    assert (stats.paused, stats.ready) == (True, 3)
    await admin.resume(paused)
    assert await shard.wait_for_work(10)  # resume woke the waiting workers
    assert await claim_all(shard) == [paused] * 3
    assert (await (await cluster.client(paused)).tenant_stats()).paused is False


async def test_a_queue_paused_for_every_tenant_stops_on_every_shard(cluster: Cluster) -> None:
    tenants = [*tenants_on(cluster, 0, 1, prefix="q"), *tenants_on(cluster, 1, 1, prefix="q")]
    for tenant in tenants:
        c = await cluster.client(tenant)
        await c.submit("h", {}, queue="reports")
        await c.submit("h", {}, queue="emails")
    admin = await cluster.client(None)
    await admin.pause(queue="reports")
    shards = [cluster.coordinator.pool.get(i)[0] for i in (0, 1)]
    for shard in shards:
        assert await claim_all(shard, ("reports",)) == []
        assert len(await claim_all(shard, ("emails",))) == 1
    stats = await (await cluster.client(tenants[0])).tenant_stats()
    assert (stats.paused, list(stats.paused_queues)) == (False, ["reports"])
    await admin.resume(queue="reports")
    for shard, tenant in zip(shards, tenants, strict=True):
        assert await claim_all(shard, ("reports",)) == [tenant]


async def test_one_tenants_queue_pauses_alone(cluster: Cluster) -> None:
    one, other = tenants_on(cluster, 1, 2, prefix="o")
    for tenant in (one, other):
        c = await cluster.client(tenant)
        await c.submit("h", {}, queue="emails")
        await c.submit("h", {})
    admin = await cluster.client(None)
    await admin.pause(one, "emails")
    shard = cluster.coordinator.pool.get(1)[0]
    assert await claim_all(shard, ("emails",)) == [other]
    assert sorted(await claim_all(shard)) == sorted([one, other])
    listed = await admin.list_tenant_stats(shard_id=1)
    by_tenant = {t.tenant_id: t for t in listed.items}
    assert list(by_tenant[one].paused_queues) == ["emails"]
    assert list(by_tenant[other].paused_queues) == []
    await admin.resume(one, "emails")
    assert await claim_all(shard, ("emails",)) == [one]


async def test_pause_needs_a_target_with_valid_names(cluster: Cluster) -> None:
    admin = await cluster.client(None)
    for tenant, queue, field in (
        ("", "", "tenant_id"), ("a b", "", "tenant_id"), ("", "q:x", "queue"),
        ("acme", "q" * 65, "queue"),
    ):  # fmt: skip
        for call in (admin.pause(tenant, queue), admin.resume(tenant, queue)):
            error = await failure(call)
            assert (error.code(), fields_of(error)) == (C.INVALID_ARGUMENT, [field])


# -- statistics -------------------------------------------------------------------------------


async def test_stats_show_limits_pauses_pending_bytes_and_unrunnable_jobs(
    cluster: Cluster,
) -> None:
    (tenant,) = tenants_on(cluster, 0, 1, prefix="s")
    admin = await cluster.client(None)
    await admin.set_tenant_limits(Limits(weight=2), tenant)
    c = await cluster.client(tenant)
    await c.submit("h", b"[1,2,3]")
    await c.submit("h", b"{}", delay=60)
    shard = cluster.coordinator.pool.get(0)[0]
    (claimed,) = await shard.claim("w-without-h", 10, 60_000)
    await shard.release([Lease(claimed.job_id, claimed.fence)], avoid_ms=60_000)
    await admin.pause(tenant, "emails")
    await admin.pause(queue="reports")
    try:
        stats = await c.tenant_stats()
        assert stats.limits == Limits(
            weight=2, max_pending=1_000_000, dedupe_window_s=86_400, max_watch_streams=32
        )
        assert (stats.pending_bytes, stats.unrunnable_total) == (9, 1)
        assert (stats.paused, list(stats.paused_queues)) == (False, ["emails", "reports"])
        listed = await admin.list_tenant_stats(shard_id=0)
        (row,) = [t for t in listed.items if t.tenant_id == tenant]
        assert row == stats
    finally:
        await admin.resume(queue="reports")


# -- --reject-unknown-handlers ----------------------------------------------------------------


async def test_unknown_handlers_are_accepted_unless_the_coordinator_rejects_them(
    cluster: Cluster,
) -> None:
    assert cluster.settings.reject_unknown_handlers is False
    c = await cluster.client("acme")
    assert (await c.submit("nobody.has.this", {})).job_id


async def introduce_worker(
    cluster: Cluster, queues: list[str], handlers: list[str], worker_id: str
) -> grpc.aio.UnaryStreamCall:  # type: ignore[type-arg]
    """Open a worker's assignment stream; returns once the coordinator has answered."""
    token = await cluster.coordinator.tokens.create("worker")
    channel = grpc.aio.insecure_channel(cluster.target)
    stub = workers_pb2_grpc.WorkerServiceStub(channel)
    call = stub.WatchAssignment(
        workers_pb2.WatchAssignmentRequest(
            worker_id=worker_id, queues=queues, handlers=handlers, concurrency=1
        ),
        metadata=(("authorization", f"Bearer {token[1]}"),),
    )
    first = await call.read()
    assert first is not grpc.aio.EOF
    return call


async def test_with_reject_unknown_handlers_a_submit_needs_a_live_worker_with_the_handler(
    database_url: str,
) -> None:
    async with running_cluster(database_url, reject_unknown_handlers=True) as cluster:
        c = await cluster.client("acme")
        error = await failure(c.submit("email.send", {}, queue="emails"))
        assert error.code() == C.FAILED_PRECONDITION
        assert "job.handler" in (error.details() or "") and "email.send" in (error.details() or "")
        stream = await introduce_worker(cluster, ["emails"], ["email.send"], "w-emails")
        try:
            assert (await c.submit("email.send", {}, queue="emails")).job.queue == "emails"
            other_queue = await failure(c.submit("email.send", {}))
            assert other_queue.code() == C.FAILED_PRECONDITION
            items = await c.submit_many(
                [
                    job_spec("email.send", {}, queue="emails"),
                    job_spec("report.build", {}, queue="emails"),
                    job_spec("bad handler!", {}, queue="emails"),
                ]
            )
            assert items[0].job_id
            errors = [i.error for i in items]
            assert errors[1] and errors[2]
            assert (errors[1].code, errors[1].field) == (C.FAILED_PRECONDITION, "job.handler")
            assert "report.build" in errors[1].message
            assert (errors[2].code, errors[2].field) == (C.INVALID_ARGUMENT, "job.handler")
        finally:
            stream.cancel()


async def test_the_reject_unknown_handlers_switch_comes_from_a_flag_or_its_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = ["--database-url", "postgresql://db/shardq"]
    assert settings_from(parse_args(url)).reject_unknown_handlers is False
    assert settings_from(parse_args([*url, "--reject-unknown-handlers"])).reject_unknown_handlers
    monkeypatch.setenv("SHARDQ_REJECT_UNKNOWN_HANDLERS", "true")
    assert settings_from(parse_args(url)).reject_unknown_handlers is True
    monkeypatch.setenv("SHARDQ_REJECT_UNKNOWN_HANDLERS", "maybe")
    with pytest.raises(SystemExit):
        parse_args(url)
