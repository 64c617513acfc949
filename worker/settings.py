"""Worker settings. Every field has a flag and a ``SHARDQ_*`` variable (see worker/__main__.py)."""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass, field

from shardq.shard.models import ShardSettings


def default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


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
