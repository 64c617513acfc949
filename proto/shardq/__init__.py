"""shardq: a sharded, multi-tenant job scheduler.

The public surface is short. A service that submits jobs uses the client::

    from shardq import Client, AsyncClient, Job, JobState

    with Client("127.0.0.1:50051", token="sq_...") as c:
        job = c.wait(c.submit("email.send", {"to": "a@example.com"}).job_id, timeout=60)

A worker's handlers use :mod:`shardq.worker`::

    from shardq.worker import handler, Context, RetryLater, PermanentFailure

Everything else (``shardq.coordinator``, ``shardq.shard``, ``shardq.store``,
``shardq.common``, the generated ``shardq.v1``) is the cluster's own machinery: importable,
but not a promise. ``docs/architecture.md`` maps the rooms.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shardq.client import (
        AsyncClient,
        Client,
        Job,
        JobProgress,
        JobRequest,
        JobState,
        Page,
        RetryBackoff,
        RetryPolicy,
        Schedule,
        SubmitItem,
        Submitted,
        TenantLimits,
        TenantStats,
    )

__all__ = [
    "AsyncClient",
    "Client",
    "Job",
    "JobProgress",
    "JobRequest",
    "JobState",
    "Page",
    "RetryBackoff",
    "RetryPolicy",
    "Schedule",
    "SubmitItem",
    "Submitted",
    "TenantLimits",
    "TenantStats",
]


def __getattr__(name: str) -> Any:
    # Imported on first use: `import shardq.worker` (or the shard loop) must not pay for the
    # client's gRPC stubs, since every subpackage import runs this file first.
    if name in __all__:
        from shardq import client  # noqa: PLC0415

        return getattr(client, name)
    raise AttributeError(f"module 'shardq' has no attribute {name!r}")
