"""The coordinator through its real gRPC API: real redis-server shards, real Postgres."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from grpc_status import rpc_status
from redis.asyncio import Redis

from shardq.client import AsyncClient, JobState, RetryBackoff, Submitted, job_spec
from shardq.common.errors import InvalidArgument, ShardqError, Unauthenticated
from shardq.common.placement import slot_of
from shardq.coordinator import router
from shardq.coordinator.server import build_server, parse_args, settings_from
from shardq.coordinator.tokens import Principal
from shardq.shard.client import Turn
from shardq.shard.models import Failure, NewJob, TenantLimits
from shardq.v1 import common_pb2, jobs_pb2, jobs_pb2_grpc, workers_pb2, workers_pb2_grpc
from tests.support.cluster import Cluster, running_cluster


@pytest.fixture
async def cluster(database_url: str) -> AsyncIterator[Cluster]:
    async with running_cluster(database_url) as c:
        yield c


async def code_of(aw: object) -> grpc.StatusCode:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await aw  # type: ignore[misc]
    return info.value.code()


async def test_a_submitted_job_can_be_read_back(cluster: Cluster) -> None:
    c = await cluster.client("acme")
    sub = await c.submit("email.send", {"to": "a@example.com"}, priority=7, delay=60)
    assert not sub.deduplicated
    job = await c.get(sub.job_id)
    assert (job.tenant_id, job.handler, job.priority, job.state) == (
        "acme", "email.send", 7, JobState.SCHEDULED,
    )  # fmt: skip
    assert job.payload == {"to": "a@example.com"}
    assert job.shard_id == cluster.coordinator.shard_map.shard_for("acme")
    assert sub.job == job  # the answer (built without reading the job back) is what is stored


async def test_a_submit_answers_exactly_what_get_then_reads(cluster: Cluster) -> None:
    c = await cluster.client("acme")
    subs = await asyncio.gather(
        c.submit("h", {"n": 1}),
        c.submit("h", {"n": 2}, priority=9, max_attempts=3, timeout=1),
        c.submit("h", {"n": 3}, run_at=datetime.fromtimestamp(1, UTC)),  # due long ago: ready
        c.submit("h", {"n": 4}, queue="mail", retry=RetryBackoff(base=timedelta(seconds=2))),
        *(c.submit("h", {"n": i}, delay=timedelta(milliseconds=i)) for i in range(20)),  # coalesced
    )
    for sub in subs:
        assert sub.job == await c.get(sub.job_id)
    again = await c.submit("h", {"n": 1}, request_id=subs[0].job.request_id)
    assert again.deduplicated and again.job == subs[0].job


async def test_a_repeated_submit_answers_the_first_job_as_get_reads_it_now(
    cluster: Cluster,
) -> None:
    c = await cluster.client("acme")
    first = await c.submit("h", {"n": 1}, request_id="once", delay=60)
    await c.cancel(first.job_id)
    again = await c.submit("h", {"n": 1}, request_id="once", delay=60)
    assert again.deduplicated and again.job.job_id == first.job_id
    assert again.job == await c.get(first.job_id)
    assert again.job.state == JobState.CANCELLED
    items = await c.submit_many(
        [job_spec("h", {"n": 1}, request_id="once"), job_spec("h", {"n": 2}, delay=60)]
    )
    read = [await c.get(str(item.job_id)) for item in items]
    assert [(i.job_id, i.request_id, i.state, i.deduplicated) for i in items] == [
        (first.job_id, "once", JobState.CANCELLED, True),
        (read[1].job_id, read[1].request_id, JobState.SCHEDULED, False),
    ]
    assert [j.state for j in read] == [i.state for i in items]


async def test_fifty_concurrent_submits_of_one_request_id_make_one_job(cluster: Cluster) -> None:
    c = await cluster.client("acme")
    results = await asyncio.gather(
        *(c.submit("h", {"n": 1}, request_id="same-request") for _ in range(50))
    )
    assert len({r.job_id for r in results}) == 1
    assert sum(not r.deduplicated for r in results) == 1
    stats = await c.tenant_stats()
    assert stats.submitted_total == 1
    code = await code_of(c.submit("h", {"n": 2}, request_id="same-request"))
    assert code == grpc.StatusCode.ALREADY_EXISTS


async def test_a_batch_reports_each_item_and_one_bad_item_does_not_fail_it(
    cluster: Cluster,
) -> None:
    c = await cluster.client("acme")
    items = await c.submit_many(
        [
            job_spec("h", {"i": 0}, request_id="b0"),
            job_spec("h", {"i": 1}, request_id="b1", priority=12),
            job_spec("bad handler!", {}, request_id="b2"),
            job_spec("h", {"i": 0}, request_id="b0"),
            common_pb2.JobSpec(handler="h", payload=b"{not json", request_id="b4"),
        ]
    )
    assert [i.index for i in items] == [0, 1, 2, 3, 4]
    assert items[0].job_id and items[0].state == JobState.READY
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    errors = [(i.error.code, i.error.field) if i.error else None for i in items]
    assert errors[1:3] == [(invalid, "job.priority"), (invalid, "job.handler")]
    assert items[3].deduplicated and items[3].job_id == items[0].job_id
    assert errors[4] == (invalid, "job.payload")


async def test_a_tenant_cannot_see_or_touch_another_tenants_jobs(cluster: Cluster) -> None:
    a, b = await cluster.client("alpha"), await cluster.client("bravo")
    job = await a.submit("h", {})
    assert await code_of(b.get(job.job_id)) == grpc.StatusCode.NOT_FOUND
    assert await code_of(b.cancel(job.job_id)) == grpc.StatusCode.NOT_FOUND
    listed = await b.list_jobs(JobState.READY)
    assert not listed.items

    async def watch() -> None:
        async for _ in b.watch(job.job_id):
            pass

    assert await code_of(watch()) == grpc.StatusCode.NOT_FOUND
    nosy = await cluster.client("bravo", tenant_id="alpha")
    assert await code_of(nosy.get(job.job_id)) == grpc.StatusCode.PERMISSION_DENIED
    assert (await a.get(job.job_id)).state == JobState.READY


async def test_calls_without_a_valid_token_are_unauthenticated(cluster: Cluster) -> None:
    async with grpc.aio.insecure_channel(cluster.target) as channel:
        stub = jobs_pb2_grpc.JobServiceStub(channel)
        req = jobs_pb2.GetJobRequest(job_id="X")
        assert await code_of(stub.GetJob(req)) == grpc.StatusCode.UNAUTHENTICATED
        md = (("authorization", "Bearer sq_nope_nope"),)
        assert await code_of(stub.GetJob(req, metadata=md)) == grpc.StatusCode.UNAUTHENTICATED
    tenant = await cluster.client("acme")
    assert await code_of(tenant.shard_map()) == grpc.StatusCode.PERMISSION_DENIED
    admin = await cluster.client(None)
    assert (await admin.shard_map()).slot_count == 16384
    assert await code_of(admin.submit("h", {})) == grpc.StatusCode.INVALID_ARGUMENT


async def test_each_tenants_jobs_land_on_the_shard_its_slot_maps_to(
    database_url: str,
) -> None:
    async with running_cluster(database_url, shard_count=3) as cluster:
        smap = cluster.coordinator.shard_map
        tenants = [f"tenant-{i}" for i in range(60)]
        for t in tenants:
            c = await cluster.client(None, tenant_id=t)
            await c.submit("h", {})
        for t in tenants:
            expected = smap.slots[slot_of(t)]
            for sid, proc in enumerate(cluster.shards):
                r = Redis(port=proc.port)
                has = await r.exists(f"sq:counts:{t}")
                await r.aclose()
                assert bool(has) == (sid == expected), (t, sid, expected)


async def test_a_down_shard_answers_unavailable_and_others_keep_working(cluster: Cluster) -> None:
    smap = cluster.coordinator.shard_map
    tenants = {smap.shard_for(t): t for t in (f"t{i}" for i in range(50))}
    assert set(tenants) == {0, 1}
    cluster.shards[0].kill()
    down, up = await cluster.client(tenants[0]), await cluster.client(tenants[1])
    assert await code_of(down.submit("h", {})) == grpc.StatusCode.UNAVAILABLE
    assert (await up.submit("h", {})).job_id


async def test_over_quota_or_rate_is_resource_exhausted_with_a_retry_delay(
    database_url: str,
) -> None:
    limits = {"quota": TenantLimits(max_pending=3), "rated": TenantLimits(submit_rate_per_s=5)}
    async with running_cluster(database_url, tenant_limits=limits) as cluster:
        q = await cluster.client("quota")
        for i in range(3):
            await q.submit("h", {"i": i})
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await q.submit("h", {"i": 3})
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        status = rpc_status.from_call(info.value)
        assert status is not None
        retry = error_details_pb2.RetryInfo()
        assert any(d.Unpack(retry) for d in status.details)
        assert retry.retry_delay.ToMilliseconds() > 0
        other = await cluster.client("unlimited")
        for i in range(20):  # under the default quota: no false refusals
            await other.submit("h", {"i": i})
        r = await cluster.client("rated")
        codes = []
        for i in range(8):
            try:
                await r.submit("h", {"i": i})
                codes.append("ok")
            except grpc.aio.AioRpcError as exc:
                codes.append(exc.code().name)
        assert codes[:5] == ["ok"] * 5
        assert "RESOURCE_EXHAUSTED" in codes[5:]


async def test_cancel_list_and_watch_follow_the_job(cluster: Cluster) -> None:
    c = await cluster.client("acme")
    later = await c.submit("h", {}, delay=3600)
    listed = await c.list_jobs(JobState.SCHEDULED)
    assert [j.job_id for j in listed.items] == [later.job_id]
    cancelled = await c.cancel(later.job_id)
    assert cancelled.state == JobState.CANCELLED
    assert (await c.cancel(later.job_id)).state == JobState.CANCELLED
    states = [j.state async for j in c.watch(later.job_id)]
    assert states == [JobState.CANCELLED]
    assert await code_of(c.list_jobs(JobState.UNSPECIFIED)) == (grpc.StatusCode.INVALID_ARGUMENT)


async def test_dead_letters_are_listed_and_requeued(cluster: Cluster) -> None:
    c = await cluster.client("acme")
    sub = await c.submit("h", {}, max_attempts=1)
    shard_id = cluster.coordinator.shard_map.shard_for("acme")
    client, _ = cluster.coordinator.pool.get(shard_id)
    (claimed,) = await client.claim("w1", 1, 30_000)
    await client.fail([Failure(claimed.job_id, claimed.fence, claimed.attempt, "boom")])
    dead = await c.list_dead()
    assert [(j.job_id, j.error) for j in dead.items] == [(sub.job_id, "boom")]
    resp = await c.requeue_dead([sub.job_id, "NOSUCHJOB"])
    assert (resp.requeued, list(resp.not_found)) == (1, ["NOSUCHJOB"])
    assert (await c.get(sub.job_id)).state == JobState.READY
    # Neither IDs nor all: refused before any call (the field named), and by the server too.
    with pytest.raises(InvalidArgument, match="job_ids"):
        await c.requeue_dead()
    raw = jobs_pb2.RequeueDeadJobsRequest(tenant_id="acme")
    refused = c.stubs.jobs.RequeueDeadJobs(raw, metadata=c.metadata)
    assert await code_of(refused) == grpc.StatusCode.INVALID_ARGUMENT


async def test_schedules_are_created_listed_and_deleted(cluster: Cluster) -> None:
    c = await cluster.client("acme")
    tpl = ("report.build", {"kind": "daily"})
    s = await c.schedule("daily", "0 6 * * *", *tpl, timezone="Europe/Paris")
    assert s.next_run_at is not None and s.next_run_at > datetime.now(UTC)
    again = await c.schedule("daily", "0 6 * * *", *tpl, timezone="Europe/Paris")
    assert again.next_run_at == s.next_run_at
    other = c.schedule("daily", "0 7 * * *", *tpl)
    assert await code_of(other) == grpc.StatusCode.ALREADY_EXISTS
    bad = c.schedule("x", "61 * * * *", *tpl)
    assert await code_of(bad) == grpc.StatusCode.INVALID_ARGUMENT
    assert [x.schedule_id for x in await c.list_schedules()] == ["daily"]
    await c.delete_schedule("daily")
    assert await c.list_schedules() == []
    assert await code_of(c.delete_schedule("daily")) == grpc.StatusCode.NOT_FOUND


async def test_health_and_reflection_are_served(cluster: Cluster) -> None:
    channel = grpc.aio.insecure_channel(cluster.target)
    resp = await health_pb2_grpc.HealthStub(channel).Check(
        health_pb2.HealthCheckRequest(service="shardq.v1.JobService")
    )
    assert resp.status == health_pb2.HealthCheckResponse.SERVING
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)

    async def one() -> AsyncIterator[reflection_pb2.ServerReflectionRequest]:
        yield reflection_pb2.ServerReflectionRequest(list_services="")

    names = []
    async for r in stub.ServerReflectionInfo(one()):
        names = [s.name for s in r.list_services_response.service]
    assert "shardq.v1.JobService" in names
    await channel.close()


#: How long the coordinator stays down in the restart test: longer than the whole budget of
#: the client's old default policy (6 tries, at most 0.05+0.1+0.2+0.4+0.8 s of pauses), so
#: only a budget that covers a real restart rides it out.
RESTART_DOWN_S = 3.0


async def test_a_client_retrying_through_a_coordinator_restart_makes_no_duplicate(
    cluster: Cluster,
) -> None:
    """The default RetryPolicy rides out a coordinator restart, and a submit whose job the
    shard took but whose reply never left (the coordinator died in between) is answered by
    the retry with that same job: one job per request_id, however the restart falls."""
    coord = cluster.coordinator
    held = "restart-held"
    committed, gone = asyncio.Event(), asyncio.Event()
    submit = coord.router.submit

    async def submit_then_die(
        tenant: str, jobs: list[NewJob | ShardqError], *, coalesce: bool, turn: Turn | None = None
    ) -> list[router.Submitted | ShardqError]:
        out = await submit(tenant, jobs, coalesce=coalesce, turn=turn)
        if any(isinstance(j, NewJob) and j.request_id == held for j in jobs):
            committed.set()  # the job is on its shard; its reply will never be sent
            await gone.wait()
        return out

    coord.router.submit = submit_then_die  # type: ignore[method-assign]
    token = await cluster.token_for("acme")
    client = AsyncClient(cluster.target, token)  # the default RetryPolicy
    request_ids = [[f"restart-{p}-{i}" for i in range(30)] for p in range(3)]
    request_ids[0][10] = held

    async def produce(rids: list[str]) -> list[tuple[str, Submitted]]:
        return [(rid, await client.submit("h", {"rid": rid}, request_id=rid)) for rid in rids]

    producers = [asyncio.create_task(produce(rids)) for rids in request_ids]
    await asyncio.wait_for(committed.wait(), 30)
    await cluster.server.stop(0)
    await coord.stop()
    gone.set()
    await asyncio.sleep(RESTART_DOWN_S)
    settings = dataclasses.replace(cluster.settings, listen=cluster.target)
    server, _, new_coord, _ = await build_server(settings)
    await server.start()
    cluster.server, cluster.coordinator = server, new_coord
    answers = dict(
        pair for produced in await asyncio.wait_for(asyncio.gather(*producers), 60)
        for pair in produced
    )  # fmt: skip
    await client.close()
    every = {rid for rids in request_ids for rid in rids}
    assert set(answers) == every
    assert answers[held].deduplicated  # the retry found the job its lost reply was about
    assert len({a.job_id for a in answers.values()}) == len(every)
    c = await cluster.client("acme")
    assert (await c.tenant_stats()).submitted_total == len(every)
    assert (await c.get(answers[held].job_id)).request_id == held


async def first_assignment(
    channel: grpc.aio.Channel, token: str, worker_id: str = "w1"
) -> workers_pb2.Assignment:
    stub = workers_pb2_grpc.WorkerServiceStub(channel)
    call = stub.WatchAssignment(
        workers_pb2.WatchAssignmentRequest(worker_id=worker_id),
        metadata=(("authorization", f"Bearer {token}"),),
        timeout=10,
    )
    try:
        first = await call.read()
        assert first is not grpc.aio.EOF
        return first  # type: ignore[no-any-return]
    finally:
        call.cancel()


async def test_the_worker_token_from_the_environment_is_a_worker_and_nothing_more(
    database_url: str,
) -> None:
    secret = "worker-secret-from-a-kubernetes-secret"
    async with running_cluster(database_url, worker_token=secret) as cluster:
        async with grpc.aio.insecure_channel(cluster.target) as channel:
            assignment = await first_assignment(channel, secret)
            assert sorted(s.shard_id for s in assignment.shards) == [0, 1]
            for wrong in (secret[:-1], secret + "x", secret.upper()):
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await first_assignment(channel, wrong)
                assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
            # Tokens from the database keep working beside it.
            _, stored = await cluster.coordinator.tokens.create("worker")
            assert (await first_assignment(channel, stored, "w2")).map_version >= 1
            jobs = jobs_pb2_grpc.JobServiceStub(channel)
            md = (("authorization", f"Bearer {secret}"),)
            req = jobs_pb2.GetJobRequest(tenant_id="acme", job_id="X")
            assert await code_of(jobs.GetJob(req, metadata=md)) == grpc.StatusCode.PERMISSION_DENIED
        principal = await cluster.coordinator.authenticate(FakeContext(f"Bearer {secret}"))
        assert principal == Principal(role="worker", tenant_id=None, token_id="env")


async def test_without_a_worker_token_setting_no_empty_token_is_accepted(
    cluster: Cluster,
) -> None:
    assert cluster.settings.worker_token == ""
    for header in ("Bearer ", "Bearer", "bearer  "):
        with pytest.raises(Unauthenticated):
            await cluster.coordinator.authenticate(FakeContext(header))


def test_the_worker_token_comes_from_a_flag_or_shardq_worker_token(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = ["--database-url", "postgresql://db/shardq"]
    assert settings_from(parse_args(url)).worker_token == ""
    assert settings_from(parse_args([*url, "--worker-token", "abc"])).worker_token == "abc"
    monkeypatch.setenv("SHARDQ_WORKER_TOKEN", "from-env")
    assert settings_from(parse_args(url)).worker_token == "from-env"


class FakeContext:
    """Just enough of a ServicerContext for Coordinator.authenticate."""

    def __init__(self, authorization: str) -> None:
        self._md = (("authorization", authorization),)

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._md


async def test_pages_of_big_jobs_fit_what_a_grpc_client_accepts(cluster: Cluster) -> None:
    c = await cluster.client("acme")
    big = {"blob": "x" * 900_000}
    submitted = {
        "scheduled": {(await c.submit("h", big, delay=3600)).job_id for _ in range(5)},
        "ready": {(await c.submit("h", big)).job_id for _ in range(5)},
    }
    for name, state in (
        ("scheduled", JobState.SCHEDULED),
        ("ready", JobState.READY),
    ):
        seen: list[str] = []
        token = ""
        while True:  # 100 asked for, about 3 fit in a page under the 4 MiB default
            page = await c.list_jobs(state, page_size=100, page_token=token)
            # Received at all: the page fit the client's 4 MiB default receive limit.
            assert 1 <= len(page.items) <= 3
            seen += [j.job_id for j in page.items]
            token = page.next_page_token
            if not token:
                break
        assert sorted(seen) == sorted(submitted[name])
    for i in range(5):
        await c.schedule(f"s{i}", "0 6 * * *", "report", big)
    assert [s.schedule_id for s in await c.list_schedules()] == [f"s{i}" for i in range(5)]
