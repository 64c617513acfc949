"""shardq's errors: one base, one subclass per canonical status code.

:mod:`shardq.coordinator.errors` maps each class to its gRPC status code in one place;
everything below the coordinator raises these and never a gRPC error of its own. The client
(:mod:`shardq.client`) raises the same classes, so a caller catches one set of errors.
"""

from __future__ import annotations


class ShardqError(Exception):
    """Base of every error shardq reports to a caller. ``field`` names the offending input."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.message = message
        self.field = field


class InvalidArgument(ShardqError):
    """The request is malformed; nothing was written."""


class NotFound(ShardqError):
    """No such job, schedule or tenant visible to the caller."""


class AlreadyExists(ShardqError):
    """The request_id was used before with another handler or payload."""


class FailedPrecondition(ShardqError):
    """The object is not in a state that allows the operation (e.g. cancel a finished job)."""


class ResourceExhausted(ShardqError):
    """Over a quota or a rate; retry after ``retry_after_ms`` (None: a retry cannot help, as
    for a request over a size limit)."""

    def __init__(
        self, message: str, *, retry_after_ms: int | None, field: str | None = None
    ) -> None:
        super().__init__(message, field=field)
        self.retry_after_ms = retry_after_ms


class Unavailable(ShardqError):
    """A shard, the database or the coordinator cannot be reached now; retrying may succeed."""


class Unauthenticated(ShardqError):
    """No valid credentials."""


class PermissionDenied(ShardqError):
    """Valid credentials that do not allow this call."""


class LeaseLost(ShardqError):
    """The caller's fencing token is stale: another claim owns the job now."""
