"""A caller's -1 in a count field is reported as -1, through a real coordinator.

JobSpec's priority, max_attempts and timeout_ms, the page sizes and TenantLimits.weight are
int32 on the wire (they were uint32: a JS client's -1 came out as 4294967295 in our
messages). Both encodings of -1 a client may send, the 10-byte varint of an int32 and the
5-byte one an older client generated from uint32 sends, arrive as -1; every such request is
INVALID_ARGUMENT with a BadRequest naming the field and quoting -1, never UNKNOWN/INTERNAL.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from shardq.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    common_pb2,
    jobs_pb2,
    jobs_pb2_grpc,
    schedules_pb2,
    schedules_pb2_grpc,
)
from tests.support.cluster import Cluster, running_cluster

TENANT = "signed"


@pytest.fixture
async def cluster(database_url: str) -> AsyncIterator[Cluster]:
    async with running_cluster(database_url) as c:
        yield c


def _violations(err: grpc.aio.AioRpcError) -> dict[str, str]:
    status = rpc_status.from_call(err)  # type: ignore[arg-type]
    assert status is not None, err
    out: dict[str, str] = {}
    for detail in status.details:
        bad = error_details_pb2.BadRequest()
        if detail.Unpack(bad):
            out.update({v.field: v.description for v in bad.field_violations})
    return out


async def _refused(call: Awaitable[Any]) -> tuple[grpc.aio.AioRpcError, dict[str, str]]:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    return info.value, _violations(info.value)


def _spec(**kw: Any) -> common_pb2.JobSpec:
    return common_pb2.JobSpec(handler="echo", payload=b"{}", **kw)


SUBMITS = [
    ("priority", {"priority": -1}, "job.priority"),
    ("max_attempts", {"max_attempts": -1}, "max_attempts"),
    ("timeout_ms", {"timeout_ms": -1}, "timeout_ms"),
]


@pytest.mark.parametrize(("name", "fields", "field"), SUBMITS, ids=[s[0] for s in SUBMITS])
async def test_a_negative_job_field_is_quoted_as_sent(
    cluster: Cluster, name: str, fields: dict[str, int], field: str
) -> None:
    md = (("authorization", f"Bearer {await cluster.token_for(TENANT)}"),)
    async with grpc.aio.insecure_channel(cluster.target) as ch:
        stub = jobs_pb2_grpc.JobServiceStub(ch)
        err, violations = await _refused(
            stub.SubmitJob(jobs_pb2.SubmitJobRequest(job=_spec(**fields)), metadata=md)
        )
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err
        named = [f for f in violations if f.endswith(field)]
        assert named, violations
        assert "-1" in violations[named[0]], violations
        assert "4294967295" not in (err.details() or ""), err.details()
        # The same -1 as a client generated from the old uint32 field encodes it (5 bytes).
        number = common_pb2.JobSpec.DESCRIPTOR.fields_by_name[name].number
        old_spec = _spec().SerializeToString() + bytes([number << 3]) + b"\xff\xff\xff\xff\x0f"
        raw = ch.unary_unary(
            "/shardq.v1.JobService/SubmitJob",
            request_serializer=lambda b: b,
            response_deserializer=jobs_pb2.SubmitJobResponse.FromString,
        )
        job_field = jobs_pb2.SubmitJobRequest.DESCRIPTOR.fields_by_name["job"].number
        body = bytes([(job_field << 3) | 2, len(old_spec)]) + old_spec
        err, violations = await _refused(raw(body, metadata=md))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err
        assert "-1" in violations[named[0]], violations


async def test_a_batch_item_with_a_negative_priority_quotes_it(cluster: Cluster) -> None:
    md = (("authorization", f"Bearer {await cluster.token_for(TENANT)}"),)
    async with grpc.aio.insecure_channel(cluster.target) as ch:
        reply = await jobs_pb2_grpc.JobServiceStub(ch).SubmitJobs(
            jobs_pb2.SubmitJobsRequest(jobs=[_spec(priority=-1), _spec(priority=3)]), metadata=md
        )
    bad, good = reply.items
    assert bad.error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert bad.error.field.endswith("priority") and "-1" in bad.error.message, bad.error
    assert not good.HasField("error") and good.job_id


async def test_a_negative_page_size_is_refused_naming_it(cluster: Cluster) -> None:
    md = (("authorization", f"Bearer {await cluster.token_for(TENANT)}"),)
    async with grpc.aio.insecure_channel(cluster.target) as ch:
        jobs = jobs_pb2_grpc.JobServiceStub(ch)
        schedules = schedules_pb2_grpc.ScheduleServiceStub(ch)
        calls: list[Callable[[], Awaitable[Any]]] = [
            lambda: jobs.ListJobs(
                jobs_pb2.ListJobsRequest(state=common_pb2.JOB_STATE_READY, page_size=-1),
                metadata=md,
            ),
            lambda: jobs.ListDeadJobs(jobs_pb2.ListDeadJobsRequest(page_size=-1), metadata=md),
            lambda: schedules.ListSchedules(
                schedules_pb2.ListSchedulesRequest(page_size=-1), metadata=md
            ),
        ]
        for call in calls:
            err, violations = await _refused(call())
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err
            assert "-1" in violations.get("page_size", ""), violations
        # 0 still means the default, and a size over the maximum is still clamped.
        for size in (0, 2**31 - 1):
            await jobs.ListJobs(
                jobs_pb2.ListJobsRequest(state=common_pb2.JOB_STATE_READY, page_size=size),
                metadata=md,
            )


async def test_a_negative_weight_and_template_priority_are_quoted(cluster: Cluster) -> None:
    admin = (("authorization", f"Bearer {cluster.admin_token}"),)
    md = (("authorization", f"Bearer {await cluster.token_for(TENANT)}"),)
    async with grpc.aio.insecure_channel(cluster.target) as ch:
        err, violations = await _refused(
            admin_pb2_grpc.AdminServiceStub(ch).SetTenantLimits(
                admin_pb2.SetTenantLimitsRequest(
                    tenant_id=TENANT, limits=common_pb2.TenantLimits(weight=-1)
                ),
                metadata=admin,
            )
        )
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err
        assert "-1" in violations.get("limits.weight", ""), violations
        schedule = schedules_pb2.Schedule(
            schedule_id="nightly", cron="0 6 * * *", job_template=_spec(priority=-1)
        )
        err, violations = await _refused(
            schedules_pb2_grpc.ScheduleServiceStub(ch).CreateSchedule(
                schedules_pb2.CreateScheduleRequest(schedule=schedule), metadata=md
            )
        )
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err
        assert "-1" in violations.get("schedule.job_template.priority", ""), violations


async def test_an_unsigned_field_says_what_a_huge_value_likely_meant(cluster: Cluster) -> None:
    """The fields left unsigned (uint64 counts of TenantLimits): -1 from a JS client arrives as
    2^64 - 1, and the message says so."""
    admin = (("authorization", f"Bearer {cluster.admin_token}"),)
    async with grpc.aio.insecure_channel(cluster.target) as ch:
        err, violations = await _refused(
            admin_pb2_grpc.AdminServiceStub(ch).SetTenantLimits(
                admin_pb2.SetTenantLimitsRequest(
                    tenant_id=TENANT, limits=common_pb2.TenantLimits(max_pending=2**64 - 1)
                ),
                metadata=admin,
            )
        )
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err
    assert "(-1 as a 64-bit unsigned value?)" in violations["limits.max_pending"], violations
