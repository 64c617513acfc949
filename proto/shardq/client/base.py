"""What the blocking and the asyncio client share besides the requests and the retries: the
channel's options and credentials, the bearer token, and the state of a watch."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, overload

import grpc

from shardq.client.model import Job
from shardq.client.requests import Requests
from shardq.client.retry import Attempts, RetryPolicy, status_code
from shardq.v1 import (
    admin_pb2_grpc,
    common_pb2,
    jobs_pb2,
    jobs_pb2_grpc,
    schedules_pb2_grpc,
    tenants_pb2_grpc,
)

#: Longest wait between the channel's attempts to reconnect to a coordinator that went away,
#: in ms. gRPC's default grows to 120 s (1 s, 1.6 s, 2.6 s, 4.1 s, 6.6 s... apart), so a client
#: could stay away for seconds after a restarted coordinator is back; capped, it sees it
#: within about 2 s, well inside ``RetryPolicy``'s budget.
MAX_RECONNECT_BACKOFF_MS = 2_000
#: Options of every client channel (``Client(channel_options=...)`` adds or overrides).
CHANNEL_OPTIONS: tuple[tuple[str, Any], ...] = (
    ("grpc.max_reconnect_backoff_ms", MAX_RECONNECT_BACKOFF_MS),
    # Pings on an idle connection (the server allows one every 10 s): a watch whose
    # coordinator's host vanished without closing the connection is found dead in ~30 s
    # and opened again, instead of waiting forever for a message.
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
)


@dataclass(frozen=True, slots=True)
class Stubs:
    """The generated stubs of the API on the client's channel, for calls the client does not
    wrap; pass ``metadata=client.metadata`` (the bearer token) to each call."""

    jobs: jobs_pb2_grpc.JobServiceStub
    schedules: schedules_pb2_grpc.ScheduleServiceStub
    tenants: tenants_pb2_grpc.TenantServiceStub
    admin: admin_pb2_grpc.AdminServiceStub


@dataclass(frozen=True, slots=True)
class AsyncStubs:
    """:class:`Stubs` on an asyncio channel: each call is awaited."""

    jobs: jobs_pb2_grpc.JobServiceAsyncStub
    schedules: schedules_pb2_grpc.ScheduleServiceAsyncStub
    tenants: tenants_pb2_grpc.TenantServiceAsyncStub
    admin: admin_pb2_grpc.AdminServiceAsyncStub


@overload
def stubs_on(channel: grpc.aio.Channel) -> AsyncStubs: ...
@overload
def stubs_on(channel: grpc.Channel) -> Stubs: ...
def stubs_on(channel: grpc.Channel | grpc.aio.Channel) -> Stubs | AsyncStubs:
    """The API's stubs on ``channel`` (the generated classes serve either kind)."""
    kind = AsyncStubs if isinstance(channel, grpc.aio.Channel) else Stubs
    return kind(
        jobs_pb2_grpc.JobServiceStub(channel),  # type: ignore[arg-type]
        schedules_pb2_grpc.ScheduleServiceStub(channel),  # type: ignore[arg-type]
        tenants_pb2_grpc.TenantServiceStub(channel),  # type: ignore[arg-type]
        admin_pb2_grpc.AdminServiceStub(channel),  # type: ignore[arg-type]
    )


class ClientBase:
    """Connection settings, the token and the request builder of a client."""

    def __init__(
        self,
        token: str,
        *,
        tls: bool = False,
        root_certificates: bytes | None = None,
        client_cert: tuple[bytes, bytes] | None = None,
        retry: RetryPolicy | None = None,
        timeout_s: float = 30.0,
        tenant_id: str = "",
        channel_options: Sequence[tuple[str, Any]] = (),
    ) -> None:
        self.credentials: grpc.ChannelCredentials | None = None
        # A client certificate means TLS too: never a plaintext channel carrying the token.
        if tls or root_certificates is not None or client_cert is not None:
            key, chain = client_cert if client_cert else (None, None)
            self.credentials = grpc.ssl_channel_credentials(root_certificates, key, chain)
        self.channel_options = list({**dict(CHANNEL_OPTIONS), **dict(channel_options)}.items())
        #: The bearer token as call metadata: what a raw stub call needs.
        self.metadata: tuple[tuple[str, str], ...] = (("authorization", f"Bearer {token}"),)
        self.retry = retry or RetryPolicy()
        #: Deadline of each try of a unary call, in seconds.
        self.timeout_s = timeout_s
        self.requests = Requests(tenant_id)

    @property
    def tenant_id(self) -> str:
        return self.requests.tenant_id

    def attempts(self) -> Attempts:
        return Attempts(self.retry)


class Watching:
    """One watch of a job: its request, its deadline (``timeout``, None: none) and its
    tries. A stream that breaks retryably is opened again (the retry budget counts from the
    first failure after a message was received: a job quiet for minutes still gets all of it);
    a job that reached a terminal state ends it."""

    def __init__(self, client: ClientBase, job_id: str, timeout: timedelta | float | None) -> None:
        self.client = client
        self.request: jobs_pb2.WatchJobRequest = client.requests.watch(job_id)
        self.job_id = job_id
        if isinstance(timeout, timedelta):
            timeout = timeout.total_seconds()
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.tries = client.attempts()
        self.received = False

    def timeout(self) -> float | None:
        """The deadline of the next stream, in seconds from now."""
        if self.deadline is None:
            return None
        return max(0.0, self.deadline - time.monotonic())

    def seen(self, msg: common_pb2.Job) -> Job:
        self.received = True
        return Job.from_proto(msg)

    def pause_after(self, exc: Exception) -> float:
        """The wait before opening the stream again; raises TimeoutError past the deadline,
        ``exc`` itself when it is not retryable."""
        if self.deadline is not None and (
            time.monotonic() >= self.deadline
            or status_code(exc) == grpc.StatusCode.DEADLINE_EXCEEDED
        ):
            raise TimeoutError(f"job {self.job_id} did not end within the timeout") from exc
        if self.received:  # the stream worked: a fresh budget from this failure on
            self.tries, self.received = self.client.attempts(), False
        pause = self.tries.pause_after(exc)
        left = self.timeout()
        return pause if left is None else min(pause, left)
