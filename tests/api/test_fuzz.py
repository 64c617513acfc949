"""Fuzzing the gRPC API of a real cluster: every RPC, every kind of caller, hostile input.

Each example sends one generated request with one of five credentials (the fuzzing tenant's
token, the admin token, the worker token, no token, a garbage token) and checks that:

- the status is never UNKNOWN or INTERNAL (an unexpected exception in the coordinator),
- the status is one the API documents for that method (``ALLOWED``), and the one the caller's
  credentials call for (no token → UNAUTHENTICATED, a tenant naming another → PERMISSION_DENIED),
- INVALID_ARGUMENT always names the field (a ``BadRequest`` detail),
- batch items report documented codes.

The last test of the module then reads every key of every shard: each is shard-wide, a job or
key of the fuzzing tenant, or one of the victim tenant's keys seeded before the run and left
byte-for-byte unchanged. One cluster serves the whole module (its own event loop).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
import pytest_asyncio
from google.protobuf import message_factory
from google.protobuf.message import DecodeError
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis

from shardq.common.validation import TENANT_ID_RE
from shardq.coordinator import api
from shardq.shard.models import Failure
from shardq.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    common_pb2,
    jobs_pb2,
    jobs_pb2_grpc,
    schedules_pb2,
    schedules_pb2_grpc,
    tenants_pb2,
    tenants_pb2_grpc,
    workers_pb2,
    workers_pb2_grpc,
)
from tests.support.cluster import Cluster, running_cluster
from tests.support.postgres import sqlalchemy_url, throwaway_database

pytestmark = pytest.mark.asyncio(loop_scope="module")

FUZZ = "fuzz-tenant"
VICTIM = "victim"
WORKER_TOKEN = "worker-token-from-the-environment"
MAX_BATCH = 1_000  # CoordinatorSettings.max_batch_jobs default
MiB = 1 << 20

C = grpc.StatusCode
#: What any method may answer besides its own codes: a token refused, and the gate's caps
#: (a request over its size, calls in flight, failed authentications from one address).
AUTH = {C.UNAUTHENTICATED, C.PERMISSION_DENIED, C.RESOURCE_EXHAUSTED}
#: Every status each method may answer, as docs/api.md lists them (UNAVAILABLE aside: every
#: shard is up during the fuzz, so it would be a bug here).
ALLOWED: dict[str, set[grpc.StatusCode]] = {
    "SubmitJob": {C.OK, C.INVALID_ARGUMENT, C.ALREADY_EXISTS, C.RESOURCE_EXHAUSTED} | AUTH,
    "SubmitJobs": {C.OK, C.INVALID_ARGUMENT, C.RESOURCE_EXHAUSTED} | AUTH,
    "GetJob": {C.OK, C.INVALID_ARGUMENT, C.NOT_FOUND} | AUTH,
    "CancelJob": {C.OK, C.INVALID_ARGUMENT, C.NOT_FOUND, C.FAILED_PRECONDITION} | AUTH,
    "ListJobs": {C.OK, C.INVALID_ARGUMENT} | AUTH,
    "WatchJob": {C.OK, C.INVALID_ARGUMENT, C.NOT_FOUND} | AUTH,
    "ListDeadJobs": {C.OK, C.INVALID_ARGUMENT} | AUTH,
    "RequeueDeadJobs": {C.OK, C.INVALID_ARGUMENT} | AUTH,
    "CreateSchedule": {C.OK, C.INVALID_ARGUMENT, C.ALREADY_EXISTS, C.RESOURCE_EXHAUSTED} | AUTH,
    "ListSchedules": {C.OK, C.INVALID_ARGUMENT} | AUTH,
    "DeleteSchedule": {C.OK, C.INVALID_ARGUMENT, C.NOT_FOUND} | AUTH,
    "GetTenantStats": {C.OK, C.INVALID_ARGUMENT} | AUTH,
    "GetShardMap": {C.OK} | AUTH,
    "ListTenantStats": {C.OK, C.INVALID_ARGUMENT, C.NOT_FOUND} | AUTH,
    "WatchAssignment": {C.OK, C.INVALID_ARGUMENT} | AUTH,
    "SetTenantLimits": {C.OK, C.INVALID_ARGUMENT} | AUTH,
    "GetTenantLimits": {C.OK, C.INVALID_ARGUMENT} | AUTH,
    "Pause": {C.OK, C.INVALID_ARGUMENT} | AUTH,
    "Resume": {C.OK, C.INVALID_ARGUMENT} | AUTH,
    "ListShardStatus": {C.OK} | AUTH,
}
ADMIN_ONLY = {
    "GetShardMap", "ListTenantStats", "SetTenantLimits", "GetTenantLimits", "Pause", "Resume",
    "ListShardStatus",
}  # fmt: skip
WORKER_CALLS = {"WatchAssignment"}
#: Per-item codes of SubmitJobs: INVALID_ARGUMENT, ALREADY_EXISTS, RESOURCE_EXHAUSTED.
ITEM_CODES = {3, 6, 8}

FUZZ_SETTINGS = settings(
    max_examples=120,
    deadline=None,
    database=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.large_base_example,
        HealthCheck.filter_too_much,
    ],
)


class Fuzz:
    """The module's cluster and what the fuzz learned (a plain class: hypothesis prints its
    repr with every failing example, and a dataclass would print every victim key)."""

    def __init__(
        self,
        cluster: Cluster,
        channel: grpc.aio.Channel,
        tokens: dict[str, str],
        victim_jobs: list[str],
        victim_keys: dict[int, dict[bytes, bytes | None]],
    ) -> None:
        self.cluster = cluster
        self.channel = channel
        self.tokens = tokens
        self.victim_jobs = victim_jobs
        self.victim_keys = victim_keys
        #: Job IDs the fuzz created, so later examples hit real jobs too.
        self.jobs: list[str] = []
        self.schedules: list[str] = []
        self.calls = 0

    def __repr__(self) -> str:
        return f"<Fuzz {self.calls} calls, {len(self.jobs)} jobs>"

    def stub(self, method: str) -> Callable[..., Any]:
        for stub_cls in (
            jobs_pb2_grpc.JobServiceStub,
            schedules_pb2_grpc.ScheduleServiceStub,
            tenants_pb2_grpc.TenantServiceStub,
            admin_pb2_grpc.AdminServiceStub,
            workers_pb2_grpc.WorkerServiceStub,
        ):
            stub = stub_cls(self.channel)
            if hasattr(stub, method):
                return getattr(stub, method)  # type: ignore[no-any-return]
        raise KeyError(method)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def fuzz() -> AsyncIterator[Fuzz]:
    with throwaway_database() as url:
        async with running_cluster(sqlalchemy_url(url), worker_token=WORKER_TOKEN) as cluster:
            victim = await cluster.client(VICTIM)
            doomed = (await victim.submit("h", {"v": 0}, max_attempts=1)).job_id
            shard, _ = cluster.coordinator.pool.get(cluster.coordinator.shard_map.shard_for(VICTIM))
            (claimed,) = await shard.claim("w", 1, 60_000)
            assert claimed.job_id == doomed
            await shard.fail([Failure(claimed.job_id, claimed.fence, claimed.attempt, "boom")])
            victim_jobs = [
                doomed,
                (await victim.submit("h", {"v": 1})).job_id,
                (await victim.submit("h", {"v": 2}, delay=3600)).job_id,
            ]
            await victim.schedule("nightly", "0 3 * * *", "report", {})
            tokens = {
                "tenant": await cluster.token_for(FUZZ),
                "admin": cluster.admin_token,
                "worker": WORKER_TOKEN,
            }
            victim_keys = {i: await _dump(s.port, VICTIM) for i, s in enumerate(cluster.shards)}
            async with grpc.aio.insecure_channel(cluster.target) as channel:
                fz = Fuzz(cluster, channel, tokens, victim_jobs, victim_keys)
                # Real jobs of the fuzzing tenant from the start, in every listable state, so
                # job-ID fuzzing meets live jobs however few submits hypothesis gets through.
                own = await cluster.client(FUZZ)
                for n in range(10):
                    fz.jobs.append((await own.submit("h", {"n": n}, delay=n * 600)).job_id)
                yield fz


async def _dump(port: int, tenant: str) -> dict[bytes, bytes | None]:
    """Every key of ``tenant`` on one shard (its job hashes too), serialized by DUMP."""
    r = Redis(port=port)
    try:
        out = {}
        async for key in r.scan_iter(count=1000):
            if _tenant_of_key(key.decode()) == tenant or (
                key.startswith(b"sq:job:") and await r.hget(key, "t") == tenant.encode()
            ):
                out[key] = await r.dump(key)
        return out
    finally:
        await r.aclose()


#: Keys of the whole shard (some per queue); every other key names one tenant:
#: sq:<kind>:<tenant>[:...].
SHARD_WIDE = re.compile(
    r"sq:(due|scheduled|leases|fence|tenants|wake|promoter_wake|cron|weights|leader|load|mapfence"
    r"|jobformat|paused|qpaused|tqpaused|parked|outbox|identity|ring:\d+|credit:\d+"
    r"|(wake|qring|inring|qcredit):[A-Za-z0-9._-]{1,64})"
)
TENANT_KEY = re.compile(r"sq:[a-z_]+:([A-Za-z0-9._-]{1,64})(:.*)?", re.DOTALL)


def _tenant_of_key(key: str) -> str | None:
    if SHARD_WIDE.fullmatch(key) or key.startswith("sq:job:"):
        return None
    m = TENANT_KEY.fullmatch(key)
    return m.group(1) if m else "<unparsable>"


# -- strategies -------------------------------------------------------------------------------

NOW_MS = int(time.time() * 1000)
HORIZON_MS = 366 * 86_400_000
#: Beyond the horizon with days to spare: NOW_MS is taken at import, long before some tests run.
BEYOND_HORIZON_MS = NOW_MS + HORIZON_MS + 2 * 86_400_000
INT64 = st.one_of(
    st.integers(-(2**63), 2**63 - 1),
    st.sampled_from(
        [
            0,
            -1,
            1,
            2**63 - 1,
            -(2**63),
            NOW_MS,
            BEYOND_HORIZON_MS,
            HORIZON_MS + 1,
        ]
    ),
    st.integers(0, 10_000),
)
UINT32 = st.one_of(st.integers(0, 2**32 - 1), st.integers(0, 12), st.sampled_from([2**32 - 1]))
#: The int32 request fields (JobSpec's priority, max_attempts, timeout_ms, page sizes, weight):
#: what a JS caller's -1 is on the wire now, and the edges of the type.
INT32 = st.one_of(
    st.integers(-(2**31), 2**31 - 1), st.integers(-3, 12), st.sampled_from([-1, -(2**31)])
)
ODD_STRINGS = [
    "",
    "\x00",
    "a\x00b",
    " ",
    "é",
    "🦀",
    "²",
    "٣",
    "*",
    "sq:*",
    "{x}",
    "../../etc/passwd",
    "a" * 65,
    "a" * 129,
    "x" * 100_000,
    "-1",
    "99999999999",
    "9.0",
    "9.99999999999",
    "10.0",
    "1_0",
    " 1",
    FUZZ,
    VICTIM,
    "h",
]
TEXT = st.one_of(st.text(max_size=40), st.sampled_from(ODD_STRINGS))
IDS = st.one_of(TEXT, st.from_regex(r"[A-Za-z0-9._-]{1,64}", fullmatch=True))
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=10,
)
#: The largest payload the default 1 MiB limit accepts, and one byte more.
AT_LIMIT = b'"' + b"a" * (MiB - 2) + b'"'
BIG_PAYLOADS = [
    AT_LIMIT,
    AT_LIMIT + b" ",
    b"[" * 200_000,
    b"[" * 5_000 + b"]" * 5_000,
    b"x" * (3 * MiB),
    b"NaN",
    b'{"a": Infinity}',
    '{"a": 1}'.encode("utf-16"),
    b"\xef\xbb\xbf{}",
    b'"\xed\xa0\x80"',
    b"\x00",
    b"{}\x00",
    b"1" * 5_000,
]
PAYLOADS = st.one_of(
    st.just(b""),
    st.binary(max_size=64),
    JSON_VALUES.map(lambda v: json.dumps(v).encode()),
    st.sampled_from(BIG_PAYLOADS),
)
REQUEST_IDS = st.one_of(st.just(""), TEXT, st.sampled_from(["r1", "r2", "r3", "cron:x:1"]))
HANDLERS = st.one_of(TEXT, st.sampled_from(["h", "email.send", "a:b-c.d"]))
#: Queue names: valid ones (at the 64-character limit too), one past it, and TEXT's oddities.
QUEUES = st.one_of(
    st.just(""),
    TEXT,
    st.from_regex(r"[A-Za-z0-9._-]{1,64}", fullmatch=True),
    st.sampled_from(["default", "emails", "q" * 64, "q" * 65, "a:b", "a/b", "a b"]),
)
UINT64 = st.one_of(
    st.integers(0, 2**64 - 1),
    st.sampled_from([0, 1, 2**53 - 1, 2**53, 2**53 + 1, 2**63, 2**64 - 1]),
)
RATES = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 0.5, -1.0, 999_999_999.9, 1e9, 1e300, float("inf")]),
)
WEIGHTS = st.one_of(INT32, st.sampled_from([-1, 0, 1, 999, 1000, 1001]))
STATES = st.one_of(st.integers(0, 6), st.integers(-(2**31), 2**31 - 1))
PAGE_TOKENS = st.one_of(
    TEXT,
    st.sampled_from(["0", "5", "100", "9.0", "3.2", "2147483648", "9.2147483648", "-5"]),
    # The tokens of a listing that spans both sides of a tenant move, and near misses.
    st.sampled_from(["m0.", "m1.", "m0.9.0", "m1.5", "m2.0", "m", "m.", "m²", "m-1.0", "m1.x"]),
)


@st.composite
def hostile_job_specs(draw: st.DrawFn) -> common_pb2.JobSpec:
    spec = common_pb2.JobSpec()
    if draw(st.booleans()):
        spec.request_id = draw(REQUEST_IDS)
    if draw(st.integers(0, 9)):  # mostly present: a missing handler is one bad case of many
        spec.handler = draw(HANDLERS)
    spec.payload = draw(PAYLOADS)
    spec.priority = draw(INT32)
    when = draw(st.sampled_from(["none", "run_at", "delay"]))
    if when == "run_at":
        spec.run_at_unix_ms = draw(INT64)
    elif when == "delay":
        spec.delay_ms = draw(INT64)
    spec.max_attempts = draw(INT32)
    spec.timeout_ms = draw(INT32)
    if draw(st.booleans()):
        spec.queue = draw(QUEUES)
    if draw(st.booleans()):  # the job's retry policy: any int64s, any double (NaN, inf)
        spec.retry.base_ms = draw(INT64)
        spec.retry.max_ms = draw(INT64)
        spec.retry.jitter = draw(st.floats())
    return spec


@st.composite
def valid_job_specs(draw: st.DrawFn) -> common_pb2.JobSpec:
    """Jobs the server accepts, so that the other calls meet real jobs in every state."""
    spec = common_pb2.JobSpec(
        request_id=draw(st.one_of(st.just(""), st.from_regex(r"[a-z0-9]{1,12}", fullmatch=True))),
        handler=draw(st.sampled_from(["h", "email.send", "report:daily"])),
        payload=json.dumps(draw(JSON_VALUES)).encode(),
        priority=draw(st.integers(0, 9)),
        max_attempts=draw(st.integers(0, 5)),
        timeout_ms=draw(st.integers(0, 60_000)),
        queue=draw(st.sampled_from(["", "default", "emails"])),
    )
    if draw(st.booleans()):
        spec.delay_ms = draw(st.integers(0, 86_400_000))
    if draw(st.booleans()):
        spec.retry.base_ms = draw(st.integers(0, 60_000))
        spec.retry.max_ms = draw(st.sampled_from([0, 3_600_000]))
        spec.retry.jitter = draw(st.floats(0, 1))
    return spec


def job_specs() -> st.SearchStrategy[common_pb2.JobSpec]:
    return st.one_of(valid_job_specs(), hostile_job_specs())


CALLERS = st.sampled_from(["tenant", "tenant", "tenant", "admin", "worker", "none", "garbage"])
GARBAGE_TOKENS = st.one_of(
    st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=60),
    st.from_regex(r"sq_[0-9a-f]{12}_[A-Za-z0-9_-]{43}", fullmatch=True),
    st.sampled_from(["sq_", "Bearer", "sq_000000000000_" + "A" * 43]),
)


@st.composite
def credentials(draw: st.DrawFn, fz: Fuzz) -> tuple[str, tuple[tuple[str, str], ...]]:
    caller = draw(CALLERS)
    if caller == "none":
        return caller, draw(st.sampled_from([(), (("authorization", "Basic abc"),)]))
    token = draw(GARBAGE_TOKENS) if caller == "garbage" else fz.tokens[caller]
    scheme = draw(st.sampled_from(["Bearer", "bearer", "BEARER"]))
    return caller, (("authorization", f"{scheme} {token}"),)


@st.composite
def tenant_ids(draw: st.DrawFn, caller: str) -> str:
    """What a request's tenant_id says. The admin may act on any tenant, so it is only given
    the fuzzing tenant or invalid IDs (never the victim's, which it could rightly change)."""
    if caller == "admin":
        return draw(
            st.one_of(
                st.sampled_from(["", FUZZ]),
                TEXT.filter(lambda t: TENANT_ID_RE.fullmatch(t) is None),
            )
        )
    return draw(st.one_of(st.sampled_from(["", "", "", FUZZ, FUZZ, VICTIM]), TEXT))


@st.composite
def job_ids(draw: st.DrawFn, fz: Fuzz) -> str:
    known = fz.jobs[-50:] + fz.victim_jobs
    if known and draw(st.booleans()):
        return draw(st.sampled_from(known))
    return draw(IDS)


# -- one call ---------------------------------------------------------------------------------


@dataclass
class Outcome:
    code: grpc.StatusCode
    response: Any = None
    error: grpc.aio.AioRpcError | None = None


async def call(
    fz: Fuzz, method: str, request: Any, md: tuple[tuple[str, str], ...], stream: bool = False
) -> Outcome:
    fz.calls += 1
    rpc = fz.stub(method)
    try:
        if not stream:
            return Outcome(C.OK, await rpc(request, metadata=md, timeout=20))
        streaming_call = rpc(request, metadata=md, timeout=20)
        first = await streaming_call.read()
        if first is grpc.aio.EOF:
            return Outcome(await streaming_call.code())
        streaming_call.cancel()  # a job that is not terminal would stream on
        return Outcome(C.OK, first)
    except grpc.aio.AioRpcError as exc:
        return Outcome(exc.code(), error=exc)


def check(outcome: Outcome, method: str, caller: str, tenant_id: str) -> None:
    code = outcome.code
    detail = outcome.error.details() if outcome.error else ""
    assert code not in (C.UNKNOWN, C.INTERNAL), f"{method}: {code.name} {detail}"
    assert code in ALLOWED[method], f"{method}: undocumented {code.name} {detail}"
    if caller in ("none", "garbage"):
        # Garbage that is spelled as a token costs a lookup: after 20 from this address the
        # gate refuses them without one (coordinator.gate).
        throttled = code == C.RESOURCE_EXHAUSTED and "failed authentications" in detail
        assert code == C.UNAUTHENTICATED or throttled, (method, caller, code, detail)
    elif caller == "worker":
        expected = C.PERMISSION_DENIED if method not in WORKER_CALLS else code
        assert code == expected, (method, caller, code, detail)
    elif method in ADMIN_ONLY or method in WORKER_CALLS:
        assert (code == C.PERMISSION_DENIED) == (caller == "tenant"), (method, caller, code)
    elif caller == "tenant" and tenant_id not in ("", FUZZ):
        assert code == C.PERMISSION_DENIED, (method, tenant_id, code, detail)
    elif caller == "admin" and tenant_id == "":
        assert code == C.INVALID_ARGUMENT, (method, code, detail)
    if code == C.INVALID_ARGUMENT:
        assert _fields(outcome.error), f"{method}: INVALID_ARGUMENT names no field: {detail}"


def _fields(error: grpc.aio.AioRpcError | None) -> list[str]:
    status = rpc_status.from_call(error) if error is not None else None  # type: ignore[arg-type]
    out = []
    for d in status.details if status else ():
        bad = error_details_pb2.BadRequest()
        if d.Unpack(bad):
            out += [v.field for v in bad.field_violations if v.field]
    return out


def _remember_jobs(fz: Fuzz, outcome: Outcome) -> None:
    resp = outcome.response
    if isinstance(resp, jobs_pb2.SubmitJobResponse) and resp.job.tenant_id == FUZZ:
        fz.jobs.append(resp.job.job_id)
    elif isinstance(resp, jobs_pb2.SubmitJobsResponse):
        fz.jobs += [i.job_id for i in resp.items if i.job_id]


# -- the fuzz tests ---------------------------------------------------------------------------


@given(data=st.data())
@FUZZ_SETTINGS
async def test_submit_job_answers_only_documented_codes(fuzz: Fuzz, data: st.DataObject) -> None:
    caller, md = data.draw(credentials(fuzz))
    tenant = data.draw(tenant_ids(caller))
    req = jobs_pb2.SubmitJobRequest(tenant_id=tenant)
    if data.draw(st.integers(0, 9)):
        req.job.CopyFrom(data.draw(job_specs()))
    outcome = await call(fuzz, "SubmitJob", req, md)
    check(outcome, "SubmitJob", caller, tenant)
    _remember_jobs(fuzz, outcome)


@given(data=st.data())
@FUZZ_SETTINGS
async def test_submit_jobs_answers_only_documented_codes(fuzz: Fuzz, data: st.DataObject) -> None:
    caller, md = data.draw(credentials(fuzz))
    tenant = data.draw(tenant_ids(caller))
    specs = data.draw(st.lists(job_specs(), max_size=8))
    if data.draw(st.integers(0, 19)) == 0:  # over the batch limit
        specs = [common_pb2.JobSpec(handler="h")] * (MAX_BATCH + 1)
    req = jobs_pb2.SubmitJobsRequest(tenant_id=tenant, jobs=specs)
    outcome = await call(fuzz, "SubmitJobs", req, md)
    check(outcome, "SubmitJobs", caller, tenant)
    if outcome.code == C.OK:
        items = outcome.response.items
        assert [i.index for i in items] == list(range(len(specs)))
        for item in items:
            assert bool(item.job_id) != item.HasField("error"), item
            if item.HasField("error"):
                assert item.error.code in ITEM_CODES, item
                assert item.error.code != 3 or item.error.field, item
    _remember_jobs(fuzz, outcome)


JOB_CALLS = ["GetJob", "CancelJob", "WatchJob"]


@given(data=st.data(), method=st.sampled_from(JOB_CALLS))
@FUZZ_SETTINGS
async def test_calls_on_one_job_answer_only_documented_codes(
    fuzz: Fuzz, data: st.DataObject, method: str
) -> None:
    caller, md = data.draw(credentials(fuzz))
    tenant = data.draw(tenant_ids(caller))
    job_id = data.draw(job_ids(fuzz))
    request_type = {
        "GetJob": jobs_pb2.GetJobRequest,
        "CancelJob": jobs_pb2.CancelJobRequest,
        "WatchJob": jobs_pb2.WatchJobRequest,
    }[method]
    req = request_type(tenant_id=tenant, job_id=job_id)
    outcome = await call(fuzz, method, req, md, stream=method == "WatchJob")
    check(outcome, method, caller, tenant)
    if outcome.code == C.OK:
        job = outcome.response if method != "CancelJob" else outcome.response.job
        assert job.tenant_id == FUZZ and job.job_id == job_id


@given(data=st.data(), method=st.sampled_from(["ListJobs", "ListDeadJobs"]))
@FUZZ_SETTINGS
async def test_listings_answer_only_documented_codes(
    fuzz: Fuzz, data: st.DataObject, method: str
) -> None:
    caller, md = data.draw(credentials(fuzz))
    tenant = data.draw(tenant_ids(caller))
    page_size, token = data.draw(INT32), data.draw(st.one_of(st.just(""), PAGE_TOKENS))
    if method == "ListJobs":
        req: Any = jobs_pb2.ListJobsRequest(
            tenant_id=tenant, state=data.draw(STATES), page_size=page_size, page_token=token
        )
    else:
        req = jobs_pb2.ListDeadJobsRequest(tenant_id=tenant, page_size=page_size, page_token=token)
    outcome = await call(fuzz, method, req, md)
    check(outcome, method, caller, tenant)
    if outcome.code == C.OK:
        assert all(j.tenant_id == FUZZ for j in outcome.response.jobs)
        assert outcome.response.ByteSize() < 4 * MiB  # what a default gRPC client accepts


@given(data=st.data())
@FUZZ_SETTINGS
async def test_requeue_dead_jobs_answers_only_documented_codes(
    fuzz: Fuzz, data: st.DataObject
) -> None:
    caller, md = data.draw(credentials(fuzz))
    tenant = data.draw(tenant_ids(caller))
    ids = data.draw(st.lists(job_ids(fuzz), max_size=6))
    if data.draw(st.integers(0, 19)) == 0:
        ids = ["A"] * (MAX_BATCH + 1)
    req = jobs_pb2.RequeueDeadJobsRequest(
        tenant_id=tenant, job_ids=ids, all=data.draw(st.booleans())
    )
    check(await call(fuzz, "RequeueDeadJobs", req, md), "RequeueDeadJobs", caller, tenant)


CRONS = st.one_of(
    TEXT,
    st.sampled_from(
        [
            "* * * * *",
            "*/5 * * * *",
            "0 0 31 2 *",
            "0 0 31 4 *",
            "*/0 * * * *",
            "60 * * * *",
            "0 0 L * *",
            "0 0 * * 5#5",
            "0-59/99999999999999999999 * * * *",
            "* * * * * *",
            "@daily",
            "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15 * * * *",
        ]
    ),
)
ZONES = st.one_of(
    TEXT,
    st.sampled_from(
        ["", "UTC", "Europe/Paris", "America", "Etc", "__pycache__", "utc", "../x", "a" * 300]
    ),
)


@given(data=st.data())
@FUZZ_SETTINGS
async def test_create_schedule_answers_only_documented_codes(
    fuzz: Fuzz, data: st.DataObject
) -> None:
    caller, md = data.draw(credentials(fuzz))
    tenant = data.draw(tenant_ids(caller))
    req = schedules_pb2.CreateScheduleRequest(tenant_id=tenant)
    if data.draw(st.integers(0, 9)):
        sched = req.schedule
        sched.schedule_id = data.draw(st.one_of(IDS, st.sampled_from(["s1", "s2", "nightly"])))
        sched.cron = data.draw(CRONS)
        sched.time_zone = data.draw(ZONES)
        if data.draw(st.integers(0, 9)):
            sched.job_template.CopyFrom(data.draw(job_specs()))
        sched.next_run_at_unix_ms = data.draw(INT64)  # output only: ignored
    outcome = await call(fuzz, "CreateSchedule", req, md)
    check(outcome, "CreateSchedule", caller, tenant)
    if outcome.code == C.OK:
        fuzz.schedules.append(outcome.response.schedule.schedule_id)


@given(data=st.data(), method=st.sampled_from(["ListSchedules", "DeleteSchedule"]))
@FUZZ_SETTINGS
async def test_schedule_reads_and_deletes_answer_only_documented_codes(
    fuzz: Fuzz, data: st.DataObject, method: str
) -> None:
    caller, md = data.draw(credentials(fuzz))
    tenant = data.draw(tenant_ids(caller))
    if method == "ListSchedules":
        req: Any = schedules_pb2.ListSchedulesRequest(
            tenant_id=tenant, page_size=data.draw(INT32), page_token=data.draw(PAGE_TOKENS)
        )
    else:
        known = st.sampled_from(fuzz.schedules[-20:] or ["nightly"])
        req = schedules_pb2.DeleteScheduleRequest(
            tenant_id=tenant, schedule_id=data.draw(st.one_of(IDS, known, st.just("nightly")))
        )
    outcome = await call(fuzz, method, req, md)
    check(outcome, method, caller, tenant)
    if outcome.code == C.OK and method == "ListSchedules":
        assert outcome.response.ByteSize() < 4 * MiB


@given(data=st.data(), method=st.sampled_from(["GetTenantStats", "GetShardMap"]))
@FUZZ_SETTINGS
async def test_stats_and_the_shard_map_answer_only_documented_codes(
    fuzz: Fuzz, data: st.DataObject, method: str
) -> None:
    caller, md = data.draw(credentials(fuzz))
    tenant = data.draw(tenant_ids(caller))
    if method == "GetTenantStats":
        req: Any = tenants_pb2.GetTenantStatsRequest(tenant_id=tenant)
    else:
        req = admin_pb2.GetShardMapRequest()
    outcome = await call(fuzz, method, req, md)
    check(outcome, method, caller, tenant)
    if outcome.code == C.OK and method == "GetTenantStats":
        assert outcome.response.tenant_id == FUZZ


@given(data=st.data())
@FUZZ_SETTINGS
async def test_list_tenant_stats_answers_only_documented_codes(
    fuzz: Fuzz, data: st.DataObject
) -> None:
    caller, md = data.draw(credentials(fuzz))
    req = admin_pb2.ListTenantStatsRequest(
        page_size=data.draw(UINT32), page_token=data.draw(st.one_of(st.just(""), PAGE_TOKENS))
    )
    if data.draw(st.booleans()):
        req.shard_id = data.draw(st.one_of(st.integers(0, 3), UINT32))
    check(await call(fuzz, "ListTenantStats", req, md), "ListTenantStats", caller, "")


@given(data=st.data())
@FUZZ_SETTINGS
async def test_watch_assignment_checks_credentials_and_worker_ids(
    fuzz: Fuzz, data: st.DataObject
) -> None:
    caller, md = data.draw(credentials(fuzz))
    req = workers_pb2.WatchAssignmentRequest(
        worker_id=data.draw(IDS), hostname=data.draw(TEXT), concurrency=data.draw(UINT32)
    )
    outcome = await call(fuzz, "WatchAssignment", req, md, stream=True)
    check(outcome, "WatchAssignment", caller, "")
    if outcome.code == C.OK:
        assert outcome.response.map_version >= 1


@st.composite
def tenant_limits(draw: st.DrawFn) -> common_pb2.TenantLimits:
    """Limits at, inside and past every field's range (weight 0-1000, rate in [0, 1e9),
    counts up to 2^53)."""
    return common_pb2.TenantLimits(
        weight=draw(WEIGHTS),
        max_active=draw(UINT32),
        submit_rate_per_s=draw(RATES),
        submit_burst=draw(UINT32),
        max_pending=draw(UINT64),
        max_pending_bytes=draw(UINT64),
    )


def _admin_md(fz: Fuzz) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {fz.tokens['admin']}"),)


@given(data=st.data(), method=st.sampled_from(["SetTenantLimits", "GetTenantLimits"]))
@FUZZ_SETTINGS
async def test_tenant_limits_calls_answer_only_documented_codes(
    fuzz: Fuzz, data: st.DataObject, method: str
) -> None:
    caller, md = data.draw(credentials(fuzz))
    tenant = data.draw(tenant_ids(caller))
    if method == "SetTenantLimits":
        req: Any = admin_pb2.SetTenantLimitsRequest(tenant_id=tenant)
        if data.draw(st.integers(0, 9)):
            req.limits.CopyFrom(data.draw(tenant_limits()))
    else:
        req = admin_pb2.GetTenantLimitsRequest(tenant_id=tenant)
    outcome = await call(fuzz, method, req, md)
    check(outcome, method, caller, "")
    if caller == "admin" and not tenant:
        assert outcome.code == C.INVALID_ARGUMENT
    if outcome.code == C.OK and method == "SetTenantLimits":
        answer, asked = outcome.response, req.limits
        for name in ("max_active", "submit_rate_per_s", "submit_burst", "max_pending",
                     "max_pending_bytes", "weight"):  # fmt: skip
            if getattr(asked, name):
                assert getattr(answer, name) == getattr(asked, name), name
        assert 1 <= answer.weight <= 1000
        # Back to the defaults, so later submits of the fuzzing tenant are not all refused.
        reset = admin_pb2.SetTenantLimitsRequest(tenant_id=FUZZ)
        assert (await call(fuzz, "SetTenantLimits", reset, _admin_md(fuzz))).code == C.OK


@given(data=st.data(), method=st.sampled_from(["Pause", "Resume"]))
@FUZZ_SETTINGS
async def test_pause_and_resume_answer_only_documented_codes(
    fuzz: Fuzz, data: st.DataObject, method: str
) -> None:
    caller, md = data.draw(credentials(fuzz))
    tenant, queue = data.draw(tenant_ids(caller)), data.draw(QUEUES)
    request_type = admin_pb2.PauseRequest if method == "Pause" else admin_pb2.ResumeRequest
    outcome = await call(fuzz, method, request_type(tenant_id=tenant, queue=queue), md)
    check(outcome, method, caller, "")
    if caller == "admin" and not tenant and not queue:
        assert outcome.code == C.INVALID_ARGUMENT
    if outcome.code == C.OK and method == "Pause":
        undo = admin_pb2.ResumeRequest(tenant_id=tenant, queue=queue)
        assert (await call(fuzz, "Resume", undo, _admin_md(fuzz))).code == C.OK


# -- named bad cases ---------------------------------------------------------------------------


def _spec(**kw: Any) -> common_pb2.JobSpec:
    base: dict[str, Any] = {"handler": "h", "payload": b"{}"}
    return common_pb2.JobSpec(**(base | kw))


def _submit(**kw: Any) -> tuple[str, Any]:
    return "SubmitJob", jobs_pb2.SubmitJobRequest(job=_spec(**kw))


def _limits(**kw: Any) -> tuple[str, Any]:
    return "SetTenantLimits", admin_pb2.SetTenantLimitsRequest(
        tenant_id=FUZZ, limits=common_pb2.TenantLimits(**kw)
    )


def _schedule(**kw: Any) -> tuple[str, Any]:
    fields: dict[str, Any] = {"schedule_id": "s", "cron": "0 6 * * *", "job_template": _spec()}
    return "CreateSchedule", schedules_pb2.CreateScheduleRequest(
        schedule=schedules_pb2.Schedule(**(fields | kw))
    )


#: (name, caller, method, request, expected code, the field named or None)
NAMED_CASES: list[tuple[str, str, str, Any, grpc.StatusCode, str | None]] = [
    ("priority 10", "tenant", *_submit(priority=10), C.INVALID_ARGUMENT, "job.priority"),
    ("no job", "tenant", "SubmitJob", jobs_pb2.SubmitJobRequest(), C.INVALID_ARGUMENT, "job"),
    ("no handler", "tenant", *_submit(handler=""), C.INVALID_ARGUMENT, "job.handler"),
    ("bad handler", "tenant", *_submit(handler="a b"), C.INVALID_ARGUMENT, "job.handler"),
    ("bad request_id", "tenant", *_submit(request_id="a b"), C.INVALID_ARGUMENT,
     "job.request_id"),
    ("payload over the limit", "tenant", *_submit(payload=AT_LIMIT + b" "), C.INVALID_ARGUMENT,
     "job.payload"),
    ("payload at the limit", "tenant", *_submit(payload=AT_LIMIT), C.OK, None),
    ("payload not JSON", "tenant", *_submit(payload=b"{"), C.INVALID_ARGUMENT, "job.payload"),
    ("payload nested too deep", "tenant", *_submit(payload=b"[" * 100_000), C.INVALID_ARGUMENT,
     "job.payload"),
    ("payload UTF-16", "tenant", *_submit(payload='{"a":1}'.encode("utf-16")),
     C.INVALID_ARGUMENT, "job.payload"),
    ("payload NaN", "tenant", *_submit(payload=b"NaN"), C.INVALID_ARGUMENT, "job.payload"),
    ("negative delay", "tenant", *_submit(delay_ms=-1), C.INVALID_ARGUMENT, "job.delay_ms"),
    ("delay beyond the horizon", "tenant", *_submit(delay_ms=HORIZON_MS + 1), C.INVALID_ARGUMENT,
     "job.delay_ms"),
    ("run_at before 1970", "tenant", *_submit(run_at_unix_ms=-1), C.INVALID_ARGUMENT,
     "job.run_at_unix_ms"),
    ("run_at beyond the horizon", "tenant", *_submit(run_at_unix_ms=BEYOND_HORIZON_MS),
     C.INVALID_ARGUMENT, "job.run_at_unix_ms"),
    ("max_attempts too many", "tenant", *_submit(max_attempts=1_001), C.INVALID_ARGUMENT,
     "job.max_attempts"),
    ("timeout over a day", "tenant", *_submit(timeout_ms=86_400_001), C.INVALID_ARGUMENT,
     "job.timeout_ms"),
    ("too many jobs in SubmitJobs", "tenant", "SubmitJobs",
     jobs_pb2.SubmitJobsRequest(jobs=[_spec()] * (MAX_BATCH + 1)), C.INVALID_ARGUMENT, "jobs"),
    ("another tenant's tenant_id", "tenant", "GetJob",
     jobs_pb2.GetJobRequest(tenant_id=VICTIM, job_id="X"), C.PERMISSION_DENIED, None),
    ("admin without tenant_id", "admin", "GetJob", jobs_pb2.GetJobRequest(job_id="X"),
     C.INVALID_ARGUMENT, "tenant_id"),
    ("admin with a bad tenant_id", "admin", "GetJob",
     jobs_pb2.GetJobRequest(tenant_id="a:b", job_id="X"), C.INVALID_ARGUMENT, "tenant_id"),
    ("worker on a tenant call", "worker", "GetJob", jobs_pb2.GetJobRequest(job_id="X"),
     C.PERMISSION_DENIED, None),
    ("tenant on an admin call", "tenant", "GetShardMap", admin_pb2.GetShardMapRequest(),
     C.PERMISSION_DENIED, None),
    ("bad job_id", "tenant", "GetJob", jobs_pb2.GetJobRequest(job_id="a:b"), C.INVALID_ARGUMENT,
     "job_id"),
    ("unknown job", "tenant", "GetJob", jobs_pb2.GetJobRequest(job_id="NOSUCH"), C.NOT_FOUND,
     None),
    ("bad cron", "tenant", *_schedule(cron="61 * * * *"), C.INVALID_ARGUMENT, "schedule.cron"),
    ("cron that never fires", "tenant", *_schedule(cron="0 0 31 2 *"), C.INVALID_ARGUMENT,
     "schedule.cron"),
    ("bad time zone", "tenant", *_schedule(time_zone="Mars/Olympus"), C.INVALID_ARGUMENT,
     "schedule.time_zone"),
    ("time zone that is a directory", "tenant", *_schedule(time_zone="America"),
     C.INVALID_ARGUMENT, "schedule.time_zone"),
    ("schedule with an empty template handler", "tenant",
     *_schedule(job_template=_spec(handler="")), C.INVALID_ARGUMENT,
     "schedule.job_template.handler"),
    ("schedule template priority 10", "tenant", *_schedule(job_template=_spec(priority=10)),
     C.INVALID_ARGUMENT, "schedule.job_template.priority"),
    ("bad schedule_id", "tenant", *_schedule(schedule_id="a b"), C.INVALID_ARGUMENT,
     "schedule.schedule_id"),
    ("no schedule", "tenant", "CreateSchedule", schedules_pb2.CreateScheduleRequest(),
     C.INVALID_ARGUMENT, "schedule"),
    ("page_token garbage (jobs)", "tenant", "ListJobs",
     jobs_pb2.ListJobsRequest(state=common_pb2.JOB_STATE_SCHEDULED, page_token="garbage"),
     C.INVALID_ARGUMENT, "page_token"),
    ("page_token garbage (ready)", "tenant", "ListJobs",
     jobs_pb2.ListJobsRequest(state=common_pb2.JOB_STATE_READY, page_token="x.y"),
     C.INVALID_ARGUMENT, "page_token"),
    ("page_token a superscript digit", "tenant", "ListSchedules",
     schedules_pb2.ListSchedulesRequest(page_token="²"), C.INVALID_ARGUMENT, "page_token"),
    ("page_token garbage (tenant stats)", "admin", "ListTenantStats",
     admin_pb2.ListTenantStatsRequest(page_token="²"), C.INVALID_ARGUMENT, "page_token"),
    ("ListJobs with UNSPECIFIED state", "tenant", "ListJobs", jobs_pb2.ListJobsRequest(),
     C.INVALID_ARGUMENT, "state"),
    ("ListJobs with an unknown state number", "tenant", "ListJobs",
     jobs_pb2.ListJobsRequest(state=99), C.INVALID_ARGUMENT, "state"),  # type: ignore[arg-type]
    ("ListJobs of SUCCEEDED", "tenant", "ListJobs",
     jobs_pb2.ListJobsRequest(state=common_pb2.JOB_STATE_SUCCEEDED), C.INVALID_ARGUMENT, "state"),
    ("RequeueDeadJobs with both", "tenant", "RequeueDeadJobs",
     jobs_pb2.RequeueDeadJobsRequest(job_ids=["A"], all=True), C.INVALID_ARGUMENT, "job_ids"),
    ("RequeueDeadJobs with neither", "tenant", "RequeueDeadJobs",
     jobs_pb2.RequeueDeadJobsRequest(), C.INVALID_ARGUMENT, "job_ids"),
    ("RequeueDeadJobs with too many", "tenant", "RequeueDeadJobs",
     jobs_pb2.RequeueDeadJobsRequest(job_ids=["A"] * (MAX_BATCH + 1)), C.INVALID_ARGUMENT,
     "job_ids"),
    ("ListTenantStats of no such shard", "admin", "ListTenantStats",
     admin_pb2.ListTenantStatsRequest(shard_id=99), C.NOT_FOUND, None),
    ("WatchAssignment with a bad worker_id", "worker", "WatchAssignment",
     workers_pb2.WatchAssignmentRequest(worker_id="a b"), C.INVALID_ARGUMENT, "worker_id"),
    ("WatchAssignment by a tenant", "tenant", "WatchAssignment",
     workers_pb2.WatchAssignmentRequest(worker_id="w"), C.PERMISSION_DENIED, None),
    ("queue at 64 characters", "tenant", *_submit(queue="q" * 64), C.OK, None),
    ("queue of 65 characters", "tenant", *_submit(queue="q" * 65), C.INVALID_ARGUMENT,
     "job.queue"),
    ("queue with a colon", "tenant", *_submit(queue="a:b"), C.INVALID_ARGUMENT, "job.queue"),
    ("schedule template in another queue", "tenant",
     *_schedule(job_template=_spec(queue="emails")), C.INVALID_ARGUMENT,
     "schedule.job_template.queue"),
    ("weight at 1000", "admin", *_limits(weight=1000), C.OK, None),
    ("weight 1001", "admin", *_limits(weight=1001), C.INVALID_ARGUMENT, "limits.weight"),
    ("max_pending at 2^53", "admin", *_limits(max_pending=2**53), C.OK, None),
    ("max_pending 2^53 + 1", "admin", *_limits(max_pending=2**53 + 1), C.INVALID_ARGUMENT,
     "limits.max_pending"),
    ("max_pending_bytes 2^64 - 1", "admin", *_limits(max_pending_bytes=2**64 - 1),
     C.INVALID_ARGUMENT, "limits.max_pending_bytes"),
    ("rate just under 1e9", "admin", *_limits(submit_rate_per_s=999_999_999.9), C.OK, None),
    ("rate 1e9", "admin", *_limits(submit_rate_per_s=1e9), C.INVALID_ARGUMENT,
     "limits.submit_rate_per_s"),
    ("rate NaN", "admin", *_limits(submit_rate_per_s=float("nan")), C.INVALID_ARGUMENT,
     "limits.submit_rate_per_s"),
    ("rate infinite", "admin", *_limits(submit_rate_per_s=float("inf")), C.INVALID_ARGUMENT,
     "limits.submit_rate_per_s"),
    ("rate negative", "admin", *_limits(submit_rate_per_s=-0.5), C.INVALID_ARGUMENT,
     "limits.submit_rate_per_s"),
    ("limits back to the defaults", "admin", *_limits(), C.OK, None),
    ("SetTenantLimits without tenant_id", "admin", "SetTenantLimits",
     admin_pb2.SetTenantLimitsRequest(), C.INVALID_ARGUMENT, "tenant_id"),
    ("SetTenantLimits by a tenant", "tenant", *_limits(weight=2), C.PERMISSION_DENIED, None),
    ("GetTenantLimits with a bad tenant_id", "admin", "GetTenantLimits",
     admin_pb2.GetTenantLimitsRequest(tenant_id="a:b"), C.INVALID_ARGUMENT, "tenant_id"),
    ("GetTenantLimits by a worker", "worker", "GetTenantLimits",
     admin_pb2.GetTenantLimitsRequest(tenant_id=FUZZ), C.PERMISSION_DENIED, None),
    ("Pause with neither tenant nor queue", "admin", "Pause", admin_pb2.PauseRequest(),
     C.INVALID_ARGUMENT, "tenant_id"),
    ("Pause with a bad queue", "admin", "Pause", admin_pb2.PauseRequest(queue="a b"),
     C.INVALID_ARGUMENT, "queue"),
    ("Pause with a queue of 65 characters", "admin", "Pause",
     admin_pb2.PauseRequest(tenant_id=FUZZ, queue="q" * 65), C.INVALID_ARGUMENT, "queue"),
    ("Pause of a queue at 64 characters", "admin", "Pause",
     admin_pb2.PauseRequest(tenant_id=FUZZ, queue="q" * 64), C.OK, None),
    ("Resume with a bad tenant_id", "admin", "Resume", admin_pb2.ResumeRequest(tenant_id="a:b"),
     C.INVALID_ARGUMENT, "tenant_id"),
    ("Resume of what is not paused", "admin", "Resume",
     admin_pb2.ResumeRequest(queue="never-paused"), C.OK, None),
    ("Pause by a tenant", "tenant", "Pause", admin_pb2.PauseRequest(tenant_id=FUZZ),
     C.PERMISSION_DENIED, None),
    # Methods that carry no payload take 256 KiB at most (coordinator.api).
    ("ListJobs over 256 KiB", "tenant", "ListJobs",
     jobs_pb2.ListJobsRequest(page_token="p" * (256 << 10)), C.RESOURCE_EXHAUSTED, None),
    ("RequeueDeadJobs of 1,000 IDs fits", "tenant", "RequeueDeadJobs",
     jobs_pb2.RequeueDeadJobsRequest(job_ids=["0" * 26] * 1_000), C.OK, None),
]  # fmt: skip


@pytest.mark.parametrize(
    ("caller", "method", "request_msg", "code", "field_name"),
    [pytest.param(*case[1:], id=case[0]) for case in NAMED_CASES],
)
async def test_a_named_bad_request_gets_its_status_and_names_its_field(
    fuzz: Fuzz,
    caller: str,
    method: str,
    request_msg: Any,
    code: grpc.StatusCode,
    field_name: str | None,
) -> None:
    md = (("authorization", f"Bearer {fuzz.tokens[caller]}"),)
    stream = method in ("WatchJob", "WatchAssignment")
    outcome = await call(fuzz, method, request_msg, md, stream=stream)
    assert outcome.code == code, outcome.error
    if field_name is not None:
        assert field_name in _fields(outcome.error), outcome.error


# -- bytes that are not a request -------------------------------------------------------------

#: Every method of the API as (path, name, server-streaming, request type).
METHODS = [
    (f"/{svc.full_name}/{m.name}", m.name, m.server_streaming, m.input_type)
    for module in (jobs_pb2, schedules_pb2, tenants_pb2, admin_pb2, workers_pb2)
    for svc in module.DESCRIPTOR.services_by_name.values()
    for m in svc.methods
]
#: Not protobuf, or protobuf with a string field that is not UTF-8 (field 1 or 2 of every
#: request is a string, or a message whose field 2 is).
CORRUPT = [b"\xff\xff\xff", b"\x0a\x02\xc3\x28", b"\x12\x03\xff\xfe\xfd", b"\x08" + b"\xff" * 11]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def tolerant(fuzz: Fuzz) -> AsyncIterator[grpc.aio.Channel]:
    """A server with the services registered by api.add_services, on the fuzz's cluster."""
    server = grpc.aio.server()
    api.add_services(server, fuzz.cluster.coordinator)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield channel
    finally:
        await server.stop(0)


async def raw_call(
    channel: grpc.aio.Channel, path: str, body: bytes, md: Any, stream: bool
) -> grpc.StatusCode:
    try:
        if stream:
            streaming_call = channel.unary_stream(path)(body, metadata=md, timeout=20)
            first = await streaming_call.read()
            if first is grpc.aio.EOF:
                return await streaming_call.code()  # type: ignore[no-any-return]
            streaming_call.cancel()
        else:
            await channel.unary_unary(path)(body, metadata=md, timeout=20)
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    return C.OK


def _parses(input_type: Any, body: bytes) -> bool:
    try:
        message_factory.GetMessageClass(input_type).FromString(body)
    except DecodeError:
        return False
    return True


@pytest.mark.parametrize(
    ("path", "name", "stream", "input_type"), METHODS, ids=[m[1] for m in METHODS]
)
async def test_a_request_that_does_not_parse_is_invalid_argument(
    fuzz: Fuzz, tolerant: grpc.aio.Channel, path: str, name: str, stream: bool, input_type: Any
) -> None:
    caller = "worker" if name == "WatchAssignment" else "admin"
    md = (("authorization", f"Bearer {fuzz.tokens[caller]}"),)
    corrupt = [b for b in CORRUPT if not _parses(input_type, b)]
    assert len(corrupt) >= 2
    for body in corrupt:
        assert await raw_call(tolerant, path, body, md, stream) == C.INVALID_ARGUMENT, body


@given(data=st.data(), method=st.sampled_from(METHODS))
@FUZZ_SETTINGS
async def test_random_bytes_as_a_request_answer_only_documented_codes(
    fuzz: Fuzz, tolerant: grpc.aio.Channel, data: st.DataObject, method: tuple[Any, ...]
) -> None:
    path, name, stream, _ = method
    caller, md = data.draw(credentials(fuzz))
    if caller == "admin" and name == "SetTenantLimits":
        # Random bytes may spell a valid tenant_id, and the admin may rightly give any tenant
        # limits: that tenant's key would fail the last test. The structured fuzz covers it.
        md = (("authorization", f"Bearer {fuzz.tokens['tenant']}"),)
    body = data.draw(st.one_of(st.binary(max_size=300), st.sampled_from(CORRUPT)))
    code = await raw_call(tolerant, path, body, md, stream)
    assert code not in (C.UNKNOWN, C.INTERNAL), (name, body)
    assert code in ALLOWED[name] | {C.INVALID_ARGUMENT}, (name, code, body)


async def test_the_served_api_answers_invalid_argument_to_a_request_that_does_not_parse(
    fuzz: Fuzz,
) -> None:
    md = (("authorization", f"Bearer {fuzz.tokens['tenant']}"),)
    path = "/shardq.v1.JobService/GetJob"
    assert await raw_call(fuzz.channel, path, CORRUPT[1], md, False) == C.INVALID_ARGUMENT


# -- after the fuzz ---------------------------------------------------------------------------


async def test_after_the_fuzz_every_key_is_the_shards_or_the_fuzzing_tenants(fuzz: Fuzz) -> None:
    assert fuzz.calls > 1_000, "the fuzz tests did not run before this one"
    assert len(set(fuzz.jobs)) > 10, (
        f"only {len(fuzz.jobs)} jobs accepted: the fuzz met few real jobs"
    )
    for i, proc in enumerate(fuzz.cluster.shards):
        r = Redis(port=proc.port)
        try:
            async for raw in r.scan_iter(count=1000):
                key = raw.decode()
                if key.startswith("sq:job:"):
                    owner = (await r.hget(raw, "t") or b"").decode()
                else:
                    owner = _tenant_of_key(key) or FUZZ
                if owner != FUZZ:
                    assert owner == VICTIM, f"shard {i}: {key} belongs to {owner!r}"
                    assert raw in fuzz.victim_keys[i], f"shard {i}: new victim key {key}"
                    assert await r.dump(raw) == fuzz.victim_keys[i][raw], f"changed: {key}"
            now = await _dump(proc.port, VICTIM)
            assert set(now) == set(fuzz.victim_keys[i]), f"shard {i}: victim keys went missing"
        finally:
            await r.aclose()
