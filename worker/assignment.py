"""Following the coordinator's shard assignment for this worker (WorkerService stream).

While the coordinator is unreachable the worker keeps serving the shards it has: a
coordinator restart must not stop work. The open stream is also this worker's sign of life.
Runs until cancelled.

A coordinator that is starting, restarting or rolling is a normal event, not one to page
anyone for: retries (with backoff) log at INFO and DEBUG, one WARNING comes once it has been
unreachable for ``warn_after_s`` (10 s), and an INFO line says when it is back.
"""

from __future__ import annotations

import asyncio
import logging
import random
import socket
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

from shardq.v1 import workers_pb2, workers_pb2_grpc

log = logging.getLogger("shardq.worker")


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One assigned shard: where it is, and which of this worker's queues to claim there."""

    address: str
    #: Queues to claim from on this shard; empty means every queue this worker serves.
    queues: tuple[str, ...] = ()


OnChange = Callable[[dict[int, Endpoint]], None]

#: How long the coordinator may be unreachable before a WARNING says so (once per outage).
WARN_AFTER_S = 10.0


class Outage:
    """When the coordinator stopped answering, and what has been said about it: a first INFO,
    DEBUG for every retry, one WARNING past ``warn_after_s``, an INFO when it is back."""

    def __init__(self, target: str, warn_after_s: float) -> None:
        self.target = target
        self.warn_after_s = warn_after_s
        self.since: float | None = None
        self.warned = False

    def failed(self, why: str) -> None:
        now = time.monotonic()
        if self.since is None:
            self.since = now
            log.info("coordinator %s unreachable (%s); retrying, keeping current shards",
                     self.target, why)  # fmt: skip
        elif not self.warned and now - self.since >= self.warn_after_s:
            self.warned = True
            log.warning(
                "coordinator %s unreachable for %.0f s (%s); still retrying, keeping current "
                "shards", self.target, now - self.since, why,
            )  # fmt: skip
        else:
            log.debug("coordinator %s still unreachable (%s)", self.target, why)

    def answered(self) -> None:
        if self.since is not None:
            log.info(
                "coordinator %s is back after %.1f s", self.target, time.monotonic() - self.since
            )
        self.since = None
        self.warned = False


def _channel(target: str, ca_file: str) -> grpc.aio.Channel:
    if ca_file:
        creds = grpc.ssl_channel_credentials(Path(ca_file).read_bytes())
        return grpc.aio.secure_channel(target, creds)
    return grpc.aio.insecure_channel(target)


async def follow(
    target: str,
    token: str,
    worker_id: str,
    concurrency: int,
    on_change: OnChange,
    ca_file: str = "",
    queues: Sequence[str] = (),
    handlers: Collection[str] = (),
    warn_after_s: float = WARN_AFTER_S,
) -> None:
    """Follow the assignment of this worker, which serves ``queues`` with ``handlers``."""
    request = workers_pb2.WatchAssignmentRequest(
        worker_id=worker_id,
        hostname=socket.gethostname(),
        concurrency=concurrency,
        queues=list(queues),
        handlers=sorted(handlers),
    )
    metadata = (("authorization", f"Bearer {token}"),)
    delay = 0.1
    outage = Outage(target, warn_after_s)
    while True:
        async with _channel(target, ca_file) as channel:
            stub = workers_pb2_grpc.WorkerServiceStub(channel)
            try:
                async for assignment in stub.WatchAssignment(request, metadata=metadata):
                    delay = 0.1
                    outage.answered()
                    shards = {
                        s.shard_id: Endpoint(s.address, tuple(s.queues)) for s in assignment.shards
                    }
                    log.info(
                        "assignment v%d: %s",
                        assignment.map_version,
                        ", ".join(
                            f"shard {sid} ({','.join(e.queues) or 'all queues'})"
                            for sid, e in sorted(shards.items())
                        )
                        or "no shards",
                    )
                    on_change(shards)
            except grpc.aio.AioRpcError as exc:
                if exc.code() in (
                    grpc.StatusCode.UNAUTHENTICATED,
                    grpc.StatusCode.PERMISSION_DENIED,
                ):
                    raise
                outage.failed(exc.code().name)
            else:
                outage.failed("the assignment stream ended")
        await asyncio.sleep(random.uniform(0, delay))
        delay = min(delay * 2, 5.0)
