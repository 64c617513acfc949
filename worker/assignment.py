"""Following the coordinator's shard assignment for this worker (WorkerService stream).

While the coordinator is unreachable the worker keeps serving the shards it has: a
coordinator restart must not stop work. The open stream is also this worker's sign of life.
Runs until cancelled.

A coordinator that is starting, restarting or rolling is a normal event, not one to page
anyone for: retries (with backoff) log at INFO and DEBUG, one WARNING comes once it has been
unreachable for ``warn_after_s`` (10 s), and an INFO line says when it is back.

Over TLS (:class:`CoordinatorTls`, read once at start) the worker may present a client
certificate, for a coordinator that requires one (``--tls-client-ca-file``). A coordinator
that refuses the worker's certificate, or its lack of one, only closes the connection: the
retries say what that usually means, and go on (a certificate may be fixed on either side).
"""

from __future__ import annotations

import asyncio
import logging
import random
import socket
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

import grpc

from shardq.common.tls import refusal_hint
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


@dataclass(frozen=True, slots=True)
class CoordinatorTls:
    """TLS to the coordinator: the CA that verifies it (None: the system's) and the client
    certificate, (key, chain) PEM, this worker presents to a coordinator that requires one."""

    root_certificates: bytes | None = None
    client_cert: tuple[bytes, bytes] | None = field(default=None, repr=False)

    def credentials(self) -> grpc.ChannelCredentials:
        key, chain = self.client_cert or (None, None)
        return grpc.ssl_channel_credentials(self.root_certificates, key, chain)


def _channel(target: str, tls: CoordinatorTls | None) -> grpc.aio.Channel:
    if tls is not None:
        return grpc.aio.secure_channel(target, tls.credentials())
    return grpc.aio.insecure_channel(target)


def _why(exc: grpc.aio.AioRpcError, tls: CoordinatorTls | None) -> str:
    """What a failed stream says in the log: its code, gRPC's details (one line) and, for a
    TLS connection closed in its handshake, the likely reason."""
    details = " ".join((exc.details() or "").split())
    why = f"{exc.code().name}: {details}" if details else exc.code().name
    if tls is None:
        return why
    hint = refusal_hint(
        details,
        client_cert=tls.client_cert is not None,
        cert_flags="--tls-cert-file and --tls-key-file",
    )
    return f"{why}; {hint}" if hint else why


async def follow(
    target: str,
    token: str,
    worker_id: str,
    concurrency: int,
    on_change: OnChange,
    tls: CoordinatorTls | None = None,
    queues: Sequence[str] = (),
    handlers: Collection[str] = (),
    warn_after_s: float = WARN_AFTER_S,
) -> None:
    """Follow the assignment of this worker, which serves ``queues`` with ``handlers``
    (plaintext without ``tls``)."""
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
        async with _channel(target, tls) as channel:
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
                outage.failed(_why(exc, tls))
            else:
                outage.failed("the assignment stream ended")
        await asyncio.sleep(random.uniform(0, delay))
        delay = min(delay * 2, 5.0)
