"""Following the coordinator's shard assignment for this worker (WorkerService stream).

While the coordinator is unreachable the worker keeps serving the shards it has: a
coordinator restart must not stop work. The open stream is also this worker's sign of life.
Runs until cancelled.
"""

from __future__ import annotations

import asyncio
import logging
import random
import socket
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
    while True:
        async with _channel(target, ca_file) as channel:
            stub = workers_pb2_grpc.WorkerServiceStub(channel)
            try:
                async for assignment in stub.WatchAssignment(request, metadata=metadata):
                    delay = 0.1
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
                log.warning("assignment stream broke (%s); keeping current shards", exc.code())
        await asyncio.sleep(random.uniform(0, delay))
        delay = min(delay * 2, 5.0)
