"""Python client for the shardq.v1 API: :class:`Client` (blocking, on gRPC's sync stubs,
thread-safe) and :class:`AsyncClient` (asyncio), with the same methods and typed results.

Results are frozen dataclasses (:class:`Job`: ``state`` a :class:`JobState`, ``payload`` and
``result`` decoded JSON, times UTC datetimes). Submits always carry a request_id (one is made
before the first try when the caller gives none) and failed calls are retried as
:class:`RetryPolicy` says (UNAVAILABLE; RESOURCE_EXHAUSTED after the server's RetryInfo
delay) with that same request_id, so a retry can never create a second job. The generated
stubs stay reachable as ``client.stubs.jobs`` etc. (with ``metadata=client.metadata``).

    async with AsyncClient("localhost:50051", token="sq_...") as c:
        sub = await c.submit("email.send", {"to": "a@example.com"}, delay=timedelta(seconds=5))
        async for job in c.watch(sub.job_id):
            print(job.state.name)

Only :mod:`shardq.v1` and :mod:`shardq.common` are imported: the client needs none of the
server's dependencies (``pip install shardq``).
"""

from shardq.client.base import CHANNEL_OPTIONS, MAX_RECONNECT_BACKOFF_MS, AsyncStubs, Stubs
from shardq.client.clients import AsyncClient, Client
from shardq.client.model import (
    ItemError,
    Job,
    JobProgress,
    JobState,
    Page,
    RequeueResult,
    Schedule,
    SubmitItem,
    Submitted,
    TenantLimits,
    TenantStats,
)
from shardq.client.requests import (
    JobOptions,
    JobRequest,
    RetryBackoff,
    ScheduleOptions,
    encode_payload,
    job_spec,
)
from shardq.client.retry import RETRYABLE, RetryPolicy, retry_delay_ms

__all__ = [
    "CHANNEL_OPTIONS",
    "MAX_RECONNECT_BACKOFF_MS",
    "RETRYABLE",
    "AsyncClient",
    "AsyncStubs",
    "Client",
    "ItemError",
    "Job",
    "JobOptions",
    "JobProgress",
    "JobRequest",
    "JobState",
    "Page",
    "RequeueResult",
    "RetryBackoff",
    "RetryPolicy",
    "Schedule",
    "ScheduleOptions",
    "Stubs",
    "SubmitItem",
    "Submitted",
    "TenantLimits",
    "TenantStats",
    "encode_payload",
    "job_spec",
    "retry_delay_ms",
]
