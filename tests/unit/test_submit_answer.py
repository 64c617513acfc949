"""A unary SubmitJob's answer for a job it made is built from what was sent, field for field as
the record of the new job reads (``JobRecord.of_new``, itself checked against what
``enqueue.lua`` writes in ``test_records.py``)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from shardq.coordinator import convert
from shardq.shard.codes import ItemCode
from shardq.shard.records import EnqueueResult, JobRecord, JobState, PreparedJob, limit_defaults
from shardq.v1 import common_pb2, jobs_pb2

TRACE = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=20)
prepared_jobs = st.builds(
    PreparedJob,
    tenant=text,
    job_id=text,
    request_id=text,
    handler=text,
    payload=st.binary(max_size=40),
    priority=st.integers(0, 9),
    run_at_ms=st.none() | st.integers(0, 2**48),
    delay_ms=st.none() | st.integers(0, 2**31),
    max_attempts=st.integers(1, 1_000),
    timeout_ms=st.integers(1, 2**31),
    digest=text,
    queue=st.sampled_from(["default", "mail", "q-1"]),
    limit_defaults=st.just(limit_defaults(0, 0, 0.0, 0)),
    retry=st.sampled_from(["", "500 60000 0.5"]),
    trace_context=st.sampled_from(["", TRACE]),
)
results = st.builds(
    EnqueueResult,
    code=st.just(ItemCode.OK),
    job_id=text,
    state=st.sampled_from([JobState.READY, JobState.SCHEDULED]),
    retry_after_ms=st.just(0),
    created_at_ms=st.integers(0, 2**48),
    run_at_ms=st.integers(0, 2**48),
)


@given(prepared_jobs, results, st.integers(0, 2**31 - 1))
def test_the_answer_of_a_new_job_is_its_record_as_a_message(
    job: PreparedJob, result: EnqueueResult, shard_id: int
) -> None:
    response = jobs_pb2.SubmitJobResponse()
    convert.new_job_into(response.job, job, result, shard_id)
    expected = convert.job_to_pb(JobRecord.of_new(job, result), shard_id)
    assert response.job == expected
    assert response.job.SerializeToString(deterministic=True) == expected.SerializeToString(
        deterministic=True
    )
    assert not response.deduplicated


def test_a_field_the_record_of_a_new_job_sets_is_not_left_out() -> None:
    """Every field ``job_to_pb`` sets away from its zero value for a new job is one
    ``new_job_into`` sets: a field added to the record (and the message) shows here."""
    job = PreparedJob(
        "acme", "J1", "req-1", "email.send", b"{}", 7, 1, 0, 3, 9_000, "d", "mail",
        limit_defaults(1, 1, 1.0, 1), "500 60000 0.5", TRACE,
    )  # fmt: skip
    result = EnqueueResult(ItemCode.OK, "J1", JobState.SCHEDULED, 0, 1_000, 2_000)
    expected = convert.job_to_pb(JobRecord.of_new(job, result), 4)
    got = common_pb2.Job()
    convert.new_job_into(got, job, result, 4)
    assert [f.name for f, _ in got.ListFields()] == [f.name for f, _ in expected.ListFields()]
