"""When the client tries a call again: :class:`RetryPolicy` (the caller's budget) and
:class:`Attempts` (one call's tries against it). Pure but for the clock: the blocking and the
asyncio client run the same decisions and differ only in how they sleep.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Any, Protocol, cast

import grpc
from google.protobuf.message import DecodeError
from google.rpc import error_details_pb2, status_pb2

#: Codes worth retrying: the call did not reach a shard, or the coordinator went away under
#: it (a server stopping cancels its calls; a cancel of our own raises CancelledError instead).
#: Every call is safe to repeat: submits carry a fixed request_id, the rest only read or are
#: idempotent.
RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED})


class RpcFailure(Protocol):
    """What a failed call tells, sync (``grpc.RpcError`` + ``grpc.Call``) or asyncio
    (``grpc.aio.AioRpcError``) alike."""

    def code(self) -> grpc.StatusCode: ...

    def trailing_metadata(self) -> Any: ...


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How a call that failed retryably is tried again.

    Retried: ``UNAVAILABLE`` and ``CANCELLED`` (:data:`RETRYABLE`) after an exponential,
    jittered pause; ``RESOURCE_EXHAUSTED`` (a tenant over its rate or quota) after the delay
    the server gives (its ``RetryInfo`` detail, else its ``retry-after-ms`` trailer) when
    ``retry_resource_exhausted`` is set (the default) and the budget has room for it. Tries
    go on until one succeeds, fails otherwise, or the budget is spent: ``deadline_s`` seconds
    from the start of the first try (the last retry starts at the deadline at the latest), or
    ``attempts`` tries if that is set. Every try of a submit carries the same request_id, so
    no retry can make a second job.

    The default budget (20 s) outlasts a coordinator restart (5-7 s) plus gRPC's reconnect
    backoff (at most ``MAX_RECONNECT_BACKOFF_MS`` on the client's channel).
    ``RetryPolicy(attempts=1)`` never retries.
    """

    #: Time budget of a call, in seconds from the start of its first try: no retry starts
    #: after it. Each try still has the client's ``timeout_s``.
    deadline_s: float = 20.0
    #: Most tries in all, the first included; 0: no limit but ``deadline_s``.
    attempts: int = 0
    #: First pause, in seconds; doubles after each try up to ``cap_s``. Each pause is drawn
    #: between half and all of that (jitter: clients that failed together do not retry
    #: together).
    base_s: float = 0.1
    cap_s: float = 2.0
    #: Retry ``RESOURCE_EXHAUSTED`` after the delay the server asks for. Off: such an error
    #: goes to the caller at once, as backpressure of its own to handle.
    retry_resource_exhausted: bool = True

    def pause_s(self, attempt: int) -> float:
        """The pause after try number ``attempt`` (0 for the first) failed retryably."""
        ceiling = min(self.cap_s, self.base_s * 2 ** min(attempt, 64))
        return random.uniform(ceiling / 2, ceiling)

    def pause_after(self, exc: RpcFailure, attempt: int) -> float | None:
        """The pause before trying again after ``exc`` ended try number ``attempt`` (0 for the
        first), or None when it is not to be retried (the budget aside)."""
        code = exc.code()
        if code in RETRYABLE:
            return self.pause_s(attempt)
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED and self.retry_resource_exhausted:
            delay_ms = retry_delay_ms(exc)
            if delay_ms is None:
                return None  # no delay given: nothing says a retry could succeed
            # A little over the delay: the tokens are due by then, and clients that were
            # refused together do not come back together.
            return delay_ms / 1000 * random.uniform(1.0, 1.1)
        return None


def status_code(exc: BaseException) -> grpc.StatusCode | None:
    """The status of a failed call (sync or asyncio), None for any other exception."""
    if isinstance(exc, grpc.RpcError) and callable(getattr(exc, "code", None)):
        code: grpc.StatusCode = exc.code()
        return code
    return None


class Attempts:
    """The tries of one call against its :class:`RetryPolicy`, from its first try."""

    def __init__(self, policy: RetryPolicy) -> None:
        self.policy = policy
        self.started = time.monotonic()
        self.tries = 0

    def pause_after(self, exc: Exception) -> float:
        """The seconds to wait before the next try after ``exc`` ended one; re-raises ``exc``
        when it is not to be retried or the budget is spent."""
        code = status_code(exc)
        if code is None:
            raise exc
        failure = cast(RpcFailure, exc)  # status_code() found its code()
        policy = self.policy
        pause = policy.pause_after(failure, self.tries)
        self.tries += 1
        left = policy.deadline_s - (time.monotonic() - self.started)
        if pause is None or left <= 0 or 0 < policy.attempts <= self.tries:
            raise exc
        if pause > left:
            if code not in RETRYABLE:
                raise exc  # the server asks for a longer wait than the budget has
            pause = left  # one last try, at the deadline
        return pause


def retry_delay_ms(exc: RpcFailure) -> int | None:
    """The server's suggested delay of a RESOURCE_EXHAUSTED error, if it gave one: the
    ``RetryInfo`` detail of the status, else the ``retry-after-ms`` trailer."""
    fallback = None
    for key, value in exc.trailing_metadata() or ():
        if key == "grpc-status-details-bin" and isinstance(value, bytes):
            delay = _retry_info_ms(value)
            if delay is not None:
                return delay
        elif key == "retry-after-ms":
            try:
                fallback = max(0, int(value))
            except ValueError:
                continue
    return fallback


def _retry_info_ms(raw: bytes) -> int | None:
    """The delay of the ``google.rpc.RetryInfo`` detail in a serialized ``google.rpc.Status``."""
    try:
        status = status_pb2.Status.FromString(raw)
    except DecodeError:
        return None
    for detail in status.details:
        info = error_details_pb2.RetryInfo()
        if detail.Unpack(info):
            delay: int = info.retry_delay.ToMilliseconds()
            return max(0, delay)
    return None
