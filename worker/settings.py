"""Worker settings. Every field has a flag and a ``SHARDQ_*`` variable (see worker/__main__.py)."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field

from shardq.common import validation
from shardq.common.errors import InvalidArgument
from shardq.shard.client import MAX_CLAIM_QUEUES
from shardq.shard.models import ShardSettings
from shardq.shard.records import DEFAULT_QUEUE

__all__ = [
    "DEFAULT_QUEUE",
    "MAX_RECORD_LINGER_MS",
    "WorkerSettings",
    "default_worker_id",
    "parse_queues",
]

#: The longest ``record_linger_ms``.
MAX_RECORD_LINGER_MS = 1_000


def default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def parse_queues(raw: str | Iterable[str]) -> tuple[str, ...]:
    """Queues from ``a,b`` (or a list), each checked, duplicates dropped, order kept."""
    items = raw.split(",") if isinstance(raw, str) else raw
    queues = tuple(dict.fromkeys(validation.queue(q.strip(), "queues") for q in items if q.strip()))
    if not queues:
        raise InvalidArgument("a worker serves at least one queue", field="queues")
    if len(queues) > MAX_CLAIM_QUEUES:
        raise InvalidArgument(f"{len(queues)} queues, at most {MAX_CLAIM_QUEUES}", field="queues")
    return queues


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    #: Postgres for result rows (``SHARDQ_DATABASE_URL``).
    database_url: str
    #: Handlers running at once in this process (``SHARDQ_CONCURRENCY``).
    concurrency: int = 16
    #: Lease a claim takes, in ms; heartbeats renew it every third of it.
    lease_ms: int = 30_000
    #: Most jobs claimed in one call (also bounded by free slots).
    claim_batch: int = 100
    #: Most results written (and acked) in one transaction.
    record_batch: int = 500
    #: A batch of results smaller than ``concurrency`` waits up to this long for more before
    #: it is written and acked, in ms; 0: at once (``SHARDQ_RECORD_LINGER_MS``).
    record_linger_ms: int = 5
    #: Longest one BLPOP for new work blocks, in s (a safety net; wake-ups come at once).
    idle_block_s: float = 5.0
    #: On SIGTERM, how long in-flight handlers may finish before being handed back, in s.
    drain_grace_s: float = 30.0
    #: Pause between retries of a failed result write (Postgres down), in s; it doubles.
    db_retry_base_s: float = 0.2
    db_retry_cap_s: float = 5.0
    #: Password of the shards' Redis (``SHARDQ_REDIS_PASSWORD``).
    redis_password: str = ""
    #: Threads for plain (sync) handlers; processes for cpu_bound ones.
    thread_pool_size: int = 32
    process_pool_size: int = 0
    worker_id: str = field(default_factory=default_worker_id)
    shard: ShardSettings = field(default_factory=ShardSettings)
    #: Queues claimed from (``SHARDQ_QUEUES``); the order rotates on every claim call, so no
    #: queue starves another.
    queues: tuple[str, ...] = (DEFAULT_QUEUE,)
    #: A job whose handler this worker lacks goes back to ready, and this worker may not claim
    #: it again for this long, in ms (``SHARDQ_UNKNOWN_HANDLER_BACKOFF_MS``).
    unknown_handler_backoff_ms: int = 5_000
    #: Each missing handler's name is logged at most once per this interval, in s.
    unknown_handler_log_interval_s: float = 60.0
    #: A job's progress (``ctx.progress``) is written to its shard at most once per this
    #: interval, in ms; the last report wins (``SHARDQ_PROGRESS_INTERVAL_MS``).
    progress_interval_ms: int = 1_000

    def __post_init__(self) -> None:
        object.__setattr__(self, "queues", parse_queues(self.queues))
        validation.int_in_range(
            self.unknown_handler_backoff_ms, 0, validation.MAX_TIMEOUT_MS,
            "unknown_handler_backoff_ms",
        )  # fmt: skip
        validation.int_in_range(
            self.progress_interval_ms, 1, validation.MAX_TIMEOUT_MS, "progress_interval_ms"
        )
        # A second at most: it is how late a row and an ack may come (the batch's leases are
        # heartbeated meanwhile).
        validation.int_in_range(self.record_linger_ms, 0, MAX_RECORD_LINGER_MS, "record_linger_ms")
