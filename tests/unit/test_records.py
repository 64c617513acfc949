"""The records at the Python↔Lua boundary: field orders, decoding, and the script headers that
document the same orders (shard/records.py against shard/lua/*.lua)."""

from __future__ import annotations

import dataclasses
import re
from importlib import resources
from typing import Any

import pytest

from shardq.shard.backoff import Backoff
from shardq.shard.codes import ItemCode, item_code
from shardq.shard.keys import JOB_FIELDS
from shardq.shard.records import (
    CLAIM_REPLY,
    CLAIM_STRIDE,
    ENQUEUE_ARGV,
    ENQUEUE_STRIDE,
    STATES,
    TERMINAL_STATES,
    ClaimedJob,
    DedupeEntry,
    EnqueueResult,
    FailResult,
    JobField,
    JobProgress,
    JobRecord,
    JobState,
    PreparedJob,
    limit_defaults,
)

PREPARED = PreparedJob(
    tenant="acme",
    job_id="J1",
    request_id="req-1",
    handler="email.send",
    payload=b'{"to": "a@example.com"}',
    priority=7,
    run_at_ms=1_700_000_000_123,
    delay_ms=0,
    max_attempts=3,
    timeout_ms=9_000,
    digest="0123456789abcdef",
    queue="mail",
    limit_defaults=limit_defaults(1_000, 4_096, 2.5, 10),
    retry="500 60000 0.5",
    trace_context="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
)

#: One value per field of the job hash, as HGETALL returns them; distinct where types allow.
FULL_HASH: dict[bytes, bytes] = {
    b"t": b"acme",
    b"r": b"req-1",
    b"h": b"email.send",
    b"p": b"{}",
    b"pr": b"7",
    b"s": b"active",
    b"ra": b"1001",
    b"ca": b"1000",
    b"at": b"2",
    b"ma": b"5",
    b"to": b"9000",
    b"f": b"42",
    b"w": b"worker-1",
    b"sa": b"1002",
    b"fa": b"1003",
    b"e": b"boom",
    b"cx": b"1",
    b"q": b"mail",
    b"xw": b"worker-2",
    b"xu": b"1004",
    b"rb": b"500 0 0.25",
    b"pg": b"1005 0.4 resized 4/10",
}

#: Header lines of an ARGV or reply entry list: "--   j=3   request_id   (string)   -> 'r'".
ENTRY_RE = re.compile(r"^--\s+j=(\d+)\s+(\w+)\s+\([^)]*\)\s*(?:(?:->|<-) '(\w+)')?", re.MULTILINE)

#: Record attributes whose hash field is named otherwise (a claim answers the attempt number).
HASH_FIELD_OF = {
    "attempt": JobField.ATTEMPTS,
    # The claim's own time, not 'sa': a job promoted ahead gets its run-at as 'sa'.
    "started_at_ms": None,
}


def lua(name: str) -> str:
    return (resources.files("shardq.shard") / "lua" / f"{name}.lua").read_text()


def header_entries(name: str) -> list[tuple[int, str, str | None]]:
    """(j, name, hash field or None) of each documented entry, in the order written."""
    return [(int(j), n, f or None) for j, n, f in ENTRY_RE.findall(lua(name))]


def hash_field(attribute: str) -> JobField | None:
    if attribute in HASH_FIELD_OF:
        return HASH_FIELD_OF[attribute]
    return JobField.__members__.get(attribute.upper())


# --- JobState -------------------------------------------------------------------------------


def test_job_states_equal_the_strings_the_scripts_write() -> None:
    assert JobState.SUCCEEDED == "succeeded"
    assert STATES == ("scheduled", "ready", "active", "succeeded", "dead", "cancelled")
    assert JobState.UNKNOWN not in STATES
    assert set(TERMINAL_STATES) == {"succeeded", "dead", "cancelled"}
    assert all(s.terminal == (s in ("succeeded", "dead", "cancelled")) for s in JobState)
    assert f"{JobState.DEAD} jobs" == "dead jobs"


@pytest.mark.parametrize(
    ("raw", "state"),
    [
        (b"ready", JobState.READY),
        ("cancelled", JobState.CANCELLED),
        (b"", JobState.UNKNOWN),
        ("", JobState.UNKNOWN),
        (None, JobState.UNKNOWN),
        (b"exploded", JobState.UNKNOWN),
    ],
)
def test_a_state_parses_from_a_reply_or_a_hash(raw: bytes | str | None, state: JobState) -> None:
    assert JobState.parse(raw) is state


def test_every_state_a_script_writes_is_a_job_state() -> None:
    written = set()
    for path in (resources.files("shardq.shard") / "lua").iterdir():
        code = "\n".join(ln for ln in path.read_text().splitlines() if not ln.startswith("--"))
        written |= set(re.findall(r"'HSET', .*'s', '(\w+)'", code))
        written |= set(re.findall(r"state = '(\w+)'", code))
    assert written == set(STATES)


# --- the job hash ----------------------------------------------------------------------------


def test_every_record_attribute_but_the_id_is_one_hash_field() -> None:
    attributes = [f.name for f in dataclasses.fields(JobRecord)]
    assert attributes[0] == "job_id"
    assert [f.attribute for f in JobField] == attributes[1:]
    assert len({f.value for f in JobField}) == len(JobField)
    assert set(JOB_FIELDS) == {f.value for f in JobField}


def test_a_full_hash_reads_into_every_attribute() -> None:
    rec = JobRecord.from_hash("J1", FULL_HASH)
    assert rec == JobRecord(
        job_id="J1", tenant="acme", request_id="req-1", handler="email.send", payload=b"{}",
        priority=7, state=JobState.ACTIVE, run_at_ms=1001, created_at_ms=1000, attempts=2,
        max_attempts=5, timeout_ms=9000, fence=42, worker_id="worker-1", started_at_ms=1002,
        finished_at_ms=1003, last_error="boom", cancel_requested=True, queue="mail",
        avoid_worker_id="worker-2", avoid_until_ms=1004, retry=Backoff(500, 0, 0.25),
        progress=JobProgress(0.4, "resized 4/10", 1005),
    )  # fmt: skip
    assert rec.state is JobState.ACTIVE


def test_fields_missing_from_the_hash_read_as_zero_empty_false_or_the_usual_value() -> None:
    # A job just enqueued: no worker, start, finish, error, cancel or hand-back yet.
    later = (b"w", b"sa", b"fa", b"e", b"cx", b"xw", b"xu", b"rb", b"pg")
    fresh = {k: v for k, v in FULL_HASH.items() if k not in later}
    rec = JobRecord.from_hash("J1", fresh | {b"s": b"ready", b"at": b"0", b"f": b"0"})
    assert (rec.worker_id, rec.started_at_ms, rec.finished_at_ms) == ("", 0, 0)
    assert (rec.last_error, rec.cancel_requested, rec.state) == ("", False, JobState.READY)
    assert (rec.queue, rec.avoid_worker_id, rec.avoid_until_ms) == ("mail", "", 0)
    assert (rec.retry, rec.progress, rec.next_attempt_at_ms) == (None, None, 0)
    bare = JobRecord.from_hash("J2", {b"t": b"acme", b"pr": b""})
    assert bare == JobRecord(
        job_id="J2", tenant="acme", request_id="", handler="", payload=b"", priority=0,
        state=JobState.UNKNOWN, run_at_ms=0, created_at_ms=0, attempts=0, max_attempts=5,
        timeout_ms=300_000, fence=0, worker_id="", started_at_ms=0, finished_at_ms=0, last_error="",
        cancel_requested=False, queue="default", avoid_worker_id="", avoid_until_ms=0,
    )  # fmt: skip


def test_cancel_requested_is_only_the_flag_one() -> None:
    assert not JobRecord.from_hash("J1", FULL_HASH | {b"cx": b"0"}).cancel_requested


# --- enqueue.lua -----------------------------------------------------------------------------


def test_to_argv_writes_every_field_in_the_declared_order() -> None:
    argv = PREPARED.to_argv()
    assert len(argv) == ENQUEUE_STRIDE == 15
    by_name = dict(zip(ENQUEUE_ARGV, argv, strict=True))
    assert by_name["limit_defaults"] == "1000 4096 2.5 10"  # as enqueue.lua splits it
    assert PreparedJob(**by_name) == PREPARED
    assert by_name == PREPARED._asdict()


def test_a_job_without_a_run_at_sends_an_empty_one_and_its_delay() -> None:
    # enqueue.lua reads '' as "none": run-at = the shard's now + delay_ms.
    delayed = PREPARED._replace(run_at_ms=None, delay_ms=5_000)
    by_name = dict(zip(ENQUEUE_ARGV, delayed.to_argv(), strict=True))
    assert (by_name["run_at_ms"], by_name["delay_ms"]) == ("", 5_000)


def test_an_integral_rate_is_sent_as_a_float() -> None:
    assert limit_defaults(0, 0, 0, 0) == "0 0 0.0 0"


def test_enqueue_lua_reads_the_fields_in_the_order_to_argv_writes_them() -> None:
    entries = header_entries("enqueue")
    assert [j for j, _, _ in entries] == list(range(1, ENQUEUE_STRIDE + 1))
    assert tuple(name for _, name, _ in entries) == ENQUEUE_ARGV
    for _, name, field in entries:
        expected = hash_field(name)
        assert field == (expected.value if expected else None), name
    assert f"local STRIDE = {ENQUEUE_STRIDE}" in lua("enqueue")
    # The code reads request_id as the third entry of a job, digest as the tenth.
    assert "argv[i], argv[i + 1], argv[i + 2], argv[i + 3], argv[i + 4]" in lua("enqueue")


def test_an_enqueue_reply_carries_the_times_of_a_job_it_made() -> None:
    # The shard's now (1,000), then code, job ID and one value per job.
    made, due, again, limited = EnqueueResult.from_reply(
        [1_000, 0, b"J1", 1_500, 0, b"J2", 1_000, 1, b"J1", b"", 4, b"", 250]
    )
    assert made == EnqueueResult(ItemCode.OK, "J1", JobState.SCHEDULED, 0, 1_000, 1_500)
    # Due at the shard's now (or before): ready.
    assert due == EnqueueResult(ItemCode.OK, "J2", JobState.READY, 0, 1_000, 1_000)
    assert (again.code, again.state, again.created_at_ms) == (ItemCode.DEDUPLICATED, "", 0)
    assert again.accepted and again.deduplicated
    assert (limited.accepted, limited.retry_after_ms, limited.job_id) == (False, 250, "")


def test_an_enqueue_reply_of_no_job_is_the_shards_now_alone() -> None:
    assert EnqueueResult.from_reply([1_000]) == []


@pytest.mark.parametrize("flat", [[], [1_000, 0, b"J1"], [1_000, 0, b"J1", 1_500, 0]])
def test_an_enqueue_reply_cut_short_is_an_error(flat: list[Any]) -> None:
    with pytest.raises(ValueError, match="3 per job"):
        EnqueueResult.from_reply(flat)


@pytest.mark.parametrize(
    "entry",
    [
        [0, b"J1", 1_500],
        [0, b"J1", 900],
        [1, b"J1", b""],
        [2, b"J2", b"succeeded"],
        [1, b"J3", b"a-state-no-script-writes"],
        [3, b"", 1_000],
        [4, b"", 250],
        [10, b"", 7],
    ],
)
def test_an_enqueue_reply_reads_the_same_as_bytes_decoded_or_as_text(entry: list[Any]) -> None:
    # hiredis answers integers and bytes (a job made is read inline); decoded responses and
    # integers sent as text take the general path: one answer either way.
    flat = [1_000, *entry]
    (as_bytes,) = EnqueueResult.from_reply(flat)
    (decoded,) = EnqueueResult.from_reply([v.decode() if isinstance(v, bytes) else v for v in flat])
    (as_text,) = EnqueueResult.from_reply(
        [str(v).encode() if isinstance(v, int) else v for v in flat]
    )
    assert as_bytes == decoded == as_text
    assert [type(v) for v in as_bytes] == [type(v) for v in decoded] == [type(v) for v in as_text]
    assert type(as_bytes) is EnqueueResult and type(as_bytes.code) is ItemCode
    assert type(as_bytes.state) is JobState


@pytest.mark.parametrize("code", [-1, len(ItemCode), 99])
def test_an_enqueue_reply_with_a_code_no_script_answers_is_an_error(code: int) -> None:
    for entry in ([code, b"J1", b"ready"], [str(code).encode(), b"J1", b"ready"]):
        with pytest.raises(ValueError, match="not a valid ItemCode"):
            EnqueueResult.from_reply([1_000, *entry])


def test_a_record_of_a_new_job_is_what_enqueue_lua_writes() -> None:
    result = EnqueueResult(ItemCode.OK, "J1", JobState.SCHEDULED, 0, 1_000, 1_700_000_000_123)
    # enqueue.lua's HSET of a new job, from the ARGV of PREPARED and the shard's now = 1000.
    written = {
        b"t": b"acme", b"r": b"req-1", b"h": b"email.send", b"p": PREPARED.payload,
        b"pr": b"7", b"s": b"scheduled", b"ra": b"1700000000123", b"ca": b"1000", b"at": b"0",
        b"ma": b"3", b"to": b"9000", b"f": b"0", b"q": b"mail", b"rb": b"500 60000 0.5",
        b"tc": PREPARED.trace_context.encode(),
    }  # fmt: skip
    assert JobRecord.of_new(PREPARED, result) == JobRecord.from_hash("J1", written)
    # A job of the default queue has no 'q' field; one without a retry policy no 'rb', one
    # submitted untraced no 'tc'.
    default = PREPARED._replace(queue="default", retry="", trace_context="")
    without_q = {k: v for k, v in written.items() if k not in (b"q", b"rb", b"tc")}
    assert JobRecord.of_new(default, result) == JobRecord.from_hash("J1", without_q)


def test_a_dedupe_value_names_the_first_job_and_its_digest() -> None:
    assert DedupeEntry.from_value(b"J1 0123abcd") == DedupeEntry("J1", "0123abcd")


# --- claim.lua and fail.lua -------------------------------------------------------------------


def claim_reply(*jobs: ClaimedJob) -> list[Any]:
    """A claim reply as redis-py hands it over: strings as bytes, Lua numbers as ints."""
    flat: list[Any] = []
    for j in jobs:
        flat += [
            j.job_id.encode(), j.fence, j.tenant.encode(), j.request_id.encode(),
            j.handler.encode(), j.payload, str(j.priority).encode(), str(j.run_at_ms).encode(),
            str(j.created_at_ms).encode(), j.attempt, str(j.max_attempts).encode(),
            str(j.timeout_ms).encode(), j.queue.encode(), j.started_at_ms,
            j.trace_context.encode(), b"1" if j.at_once else b"0",
        ]  # fmt: skip
    return flat


def claimed(n: int) -> ClaimedJob:
    return ClaimedJob(
        job_id=f"J{n}", fence=10 + n, tenant=f"t{n}", request_id=f"req-{n}", handler=f"h{n}",
        payload=b'{"n": %d}' % n, priority=n, run_at_ms=1_000 + n, created_at_ms=900 + n,
        attempt=1 + n, max_attempts=5 + n, timeout_ms=9_000 + n, queue=f"q{n}",
        started_at_ms=1_100 + n, trace_context=f"00-{n:032x}-{n:016x}-01" if n % 2 else "",
        at_once=n % 2 == 0,
    )  # fmt: skip


def test_a_claim_reply_of_several_jobs_reads_into_one_record_each() -> None:
    jobs = [claimed(n) for n in range(3)]
    flat = claim_reply(*jobs)
    assert len(flat) == 3 * CLAIM_STRIDE
    assert ClaimedJob.from_reply(flat) == jobs
    assert ClaimedJob.from_reply([]) == []


def test_a_claim_reply_cut_short_is_refused() -> None:
    with pytest.raises(ValueError, match="16 per job"):
        ClaimedJob.from_reply([b"J1", 1])


def test_claim_lua_answers_the_fields_in_the_order_from_reply_reads_them() -> None:
    entries = header_entries("claim")
    assert [j for j, _, _ in entries] == list(range(1, CLAIM_STRIDE + 1))
    assert tuple(name for _, name, _ in entries) == CLAIM_REPLY
    for _, name, field in entries:
        expected = hash_field(name)
        assert field == (expected.value if expected else None), name
    assert "out[n + 13], out[n + 14], out[n + 15], out[n + 16] =" in lua("claim")
    assert "out[n + 17]" not in lua("claim")


def test_a_fail_reply_reads_its_state() -> None:
    assert FailResult.from_reply([0, b"dead"]) == FailResult(ItemCode.OK, JobState.DEAD)
    assert FailResult.from_reply([5, b""]).state is JobState.UNKNOWN


@pytest.mark.parametrize("raw", [*ItemCode, b"3", "11"])
def test_a_code_reads_from_its_value_or_its_text(raw: int | bytes | str) -> None:
    assert item_code(raw) is ItemCode(int(raw))


@pytest.mark.parametrize("raw", [-1, len(ItemCode), 99, b"x"])
def test_a_code_no_script_answers_is_refused(raw: int | bytes) -> None:
    with pytest.raises(ValueError):
        item_code(raw)


# --- the job's retry policy and progress ------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "progress"),
    [
        (b"1005 0.4 resized 4/10", JobProgress(0.4, "resized 4/10", 1005)),
        (b"7 1.0 ", JobProgress(1.0, "", 7)),
        (b"7 0.0 two  spaces\nand a line", JobProgress(0.0, "two  spaces\nand a line", 7)),
        (b"", None),
        (None, None),
    ],
)
def test_a_progress_field_reads_back_what_heartbeat_lua_wrote(
    raw: bytes | None, progress: JobProgress | None
) -> None:
    assert JobProgress.parse(raw) == progress
    if progress is not None:
        # heartbeat.lua writes '<now> ' .. to_arg(): the report survives the round trip.
        assert JobProgress.parse(f"{progress.updated_at_ms} {progress.to_arg()}") == progress


@pytest.mark.parametrize(
    ("state", "attempts", "expected"),
    [("scheduled", b"1", 1001), ("scheduled", b"0", 0), ("ready", b"1", 0), ("active", b"2", 0)],
)
def test_next_attempt_is_the_run_at_of_a_scheduled_job_that_has_failed(
    state: str, attempts: bytes, expected: int
) -> None:
    rec = JobRecord.from_hash("J1", FULL_HASH | {b"s": state.encode(), b"at": attempts})
    assert rec.next_attempt_at_ms == expected
