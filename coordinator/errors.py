"""The one place that turns shardq errors into gRPC status codes.

Handlers raise :class:`shard.errors.ShardqError` subclasses (or let a Redis/Postgres
connection error through); :func:`to_status` decides the code and message. Nothing a client
sends may end as UNKNOWN or INTERNAL: an unexpected exception is logged with its traceback
and answered INTERNAL without the traceback, and the API fuzz tests hunt for those.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, NoReturn, overload

import grpc
import psycopg
import sqlalchemy.exc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import InvalidResponse, RedisError
from redis.exceptions import ResponseError as RedisResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from shardq.common import errors as e

log = logging.getLogger("shardq.coordinator")

if TYPE_CHECKING:
    Ctx = grpc.aio.ServicerContext[Any, Any]
else:  # generic only in the type stubs
    Ctx = grpc.aio.ServicerContext


class _CodeTable(dict[type[e.ShardqError], grpc.StatusCode]):
    """The code of an error class: its own, else that of the nearest class it inherits from
    (``NotReplicated`` is an ``Unavailable``, ``AddressRefused`` a ``FailedPrecondition``).
    Looked up by exact type, such subclasses were answered INTERNAL, which no client retries:
    submits refused during a failover instead of retried."""

    def __missing__(self, key: type[e.ShardqError]) -> grpc.StatusCode:
        for cls in getattr(key, "__mro__", ())[1:]:
            if dict.__contains__(self, cls):
                code: grpc.StatusCode = dict.__getitem__(self, cls)
                return code
        raise KeyError(key)

    @overload  # type: ignore[override]
    def get(self, key: object, default: None = None, /) -> grpc.StatusCode | None: ...
    @overload
    def get(self, key: object, default: grpc.StatusCode, /) -> grpc.StatusCode: ...
    def get(self, key: object, default: grpc.StatusCode | None = None, /) -> grpc.StatusCode | None:
        try:
            return self[key]  # type: ignore[index]
        except KeyError:
            return default


CODES = _CodeTable(
    {
        e.InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
        e.NotFound: grpc.StatusCode.NOT_FOUND,
        e.AlreadyExists: grpc.StatusCode.ALREADY_EXISTS,
        e.FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
        e.ResourceExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED,
        e.Unavailable: grpc.StatusCode.UNAVAILABLE,
        e.Unauthenticated: grpc.StatusCode.UNAUTHENTICATED,
        e.PermissionDenied: grpc.StatusCode.PERMISSION_DENIED,
        e.LeaseLost: grpc.StatusCode.FAILED_PRECONDITION,
    }
)

#: Trailing metadata key carrying the retry delay, for clients that do not parse details.
RETRY_AFTER_KEY = "retry-after-ms"


#: Set on an error a shard's Redis raised (``coordinator.router.ShardRedis``): the shard's ID
#: and address, so the client is told which shard ("shard 2 unreachable") and the log where.
SHARD_ID_ATTR = "shardq_shard_id"
SHARD_ADDRESS_ATTR = "shardq_shard_address"


def shard_named(exc: BaseException) -> str:
    """The words for the shard an error is tagged with ("shard 2"), else "a shard"."""
    shard_id = getattr(exc, SHARD_ID_ATTR, None)
    return "a shard" if shard_id is None else f"shard {shard_id}"


def translate(exc: BaseException) -> e.ShardqError:
    """Any exception as the ShardqError a client should see."""
    if isinstance(exc, e.ShardqError):
        return exc
    if isinstance(exc, RedisResponseError) and str(exc).startswith("OOM"):
        return e.ResourceExhausted("the shard is out of memory", retry_after_ms=5_000)
    shard = _shard_error(exc)
    if shard is not None:
        return shard
    if isinstance(exc, sqlalchemy.exc.OperationalError | sqlalchemy.exc.InterfaceError):
        return e.Unavailable("the database cannot be reached")
    if isinstance(exc, psycopg.OperationalError):
        return e.Unavailable("the database cannot be reached")
    raise exc


def _shard_error(exc: BaseException) -> e.Unavailable | None:
    """A shard that cannot be reached, or is not in a state to answer, else None.

    Only network errors: another OSError (a file that cannot be opened) is a bug, not a shard
    that is down, and must not tell the client to retry. A Redis error of any other kind (a
    protocol error from something that is not Redis, READONLY from a replica, MISCONF) is the
    shard's state too, not the request's. The address stays in the log: clients are not told
    where the cluster's internals live.
    """
    where = shard_named(exc)
    tagged = getattr(exc, SHARD_ID_ATTR, None) is not None
    address = getattr(exc, SHARD_ADDRESS_ATTR, "?")
    unreachable = RedisConnectionError | RedisTimeoutError | InvalidResponse
    if isinstance(exc, unreachable | ConnectionError | TimeoutError):
        if not tagged:
            return e.Unavailable("a shard cannot be reached")
        log.warning("%s (%s) unreachable: %s", where, address, exc)
        return e.Unavailable(f"{where} unreachable")
    if isinstance(exc, RedisError) and tagged:
        log.warning("%s (%s) answered with an error: %r", where, address, exc)
        return e.Unavailable(f"{where} unavailable: it answered with an error")
    return None


def item_code(exc: e.ShardqError) -> int:
    """The numeric gRPC code, for per-item errors of batch calls."""
    return int(CODES.get(type(exc), grpc.StatusCode.INTERNAL).value[0])


#: Longest message sent back. Messages quote the offending value, and a client may send
#: megabytes: the status travels in trailing metadata, which gRPC clients cap at 8 KiB by
#: default (over it the client sees an error of its own instead of ours).
MAX_MESSAGE_CHARS = 1_000


def shorten(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    return text if len(text) <= limit else f"{text[: limit - 20]}... ({len(text)} chars)"


def _status(exc: e.ShardqError) -> status_pb2.Status:
    code = CODES.get(type(exc), grpc.StatusCode.INTERNAL)
    status = status_pb2.Status(code=int(code.value[0]), message=shorten(str(exc)))
    if isinstance(exc, e.ResourceExhausted) and exc.retry_after_ms is not None:
        delay = duration_pb2.Duration()
        delay.FromMilliseconds(exc.retry_after_ms)
        detail = any_pb2.Any()
        detail.Pack(error_details_pb2.RetryInfo(retry_delay=delay))
        status.details.append(detail)
    if exc.field:
        detail = any_pb2.Any()
        detail.Pack(
            error_details_pb2.BadRequest(
                field_violations=[
                    error_details_pb2.BadRequest.FieldViolation(
                        field=shorten(exc.field, 200), description=shorten(exc.message)
                    )
                ]
            )
        )
        if status.code == code_pb2.INVALID_ARGUMENT:
            status.details.append(detail)
    return status


async def abort(context: Ctx, exc: BaseException) -> NoReturn:
    """End the call with the status that ``exc`` stands for."""
    try:
        err = translate(exc)
    except Exception:
        log.exception("unexpected error")
        await context.abort(grpc.StatusCode.INTERNAL, "internal error")
        raise AssertionError("unreachable") from None
    if isinstance(err, e.ResourceExhausted) and err.retry_after_ms is not None:
        context.set_trailing_metadata(((RETRY_AFTER_KEY, str(err.retry_after_ms)),))
    await context.abort_with_status(rpc_status.to_status(_status(err)))
    raise AssertionError("unreachable")
