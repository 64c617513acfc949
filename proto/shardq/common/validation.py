"""Input checks for everything that reaches a shard. Each raises InvalidArgument naming the field.

IDs that end up inside Redis keys are restricted to characters that cannot change a key's
meaning (no ``:``, ``{``, ``*``, spaces or control characters).
"""

from __future__ import annotations

import re

from shardq.common.errors import InvalidArgument

TENANT_ID_RE = re.compile(r"[A-Za-z0-9._-]{1,64}")
REQUEST_ID_RE = re.compile(r"[A-Za-z0-9._:@/+=-]{1,128}")
HANDLER_RE = re.compile(r"[A-Za-z0-9._:-]{1,128}")
SCHEDULE_ID_RE = re.compile(r"[A-Za-z0-9._-]{1,64}")
JOB_ID_RE = re.compile(r"[0-9A-Za-z]{1,64}")
WORKER_ID_RE = re.compile(r"[A-Za-z0-9._:@-]{1,128}")
#: A queue's name ends up in Redis keys (``ready:{tenant}:{queue}:{priority}``): as a tenant ID.
QUEUE_RE = re.compile(r"[A-Za-z0-9._-]{1,64}")

MIN_PRIORITY, MAX_PRIORITY = 0, 9
#: Largest attempt count a job may ask for.
MAX_ATTEMPTS_LIMIT = 1_000
#: Longest handler timeout a job may ask for, in ms (24 h).
MAX_TIMEOUT_MS = 86_400_000


def _matches(pattern: re.Pattern[str], value: object, field: str, what: str) -> str:
    if not isinstance(value, str) or pattern.fullmatch(value) is None:
        raise InvalidArgument(f"{value!r} is not a valid {what} ({pattern.pattern})", field=field)
    return value


def tenant_id(value: object, field: str = "tenant_id") -> str:
    return _matches(TENANT_ID_RE, value, field, "tenant ID")


def request_id(value: object, field: str = "request_id") -> str:
    return _matches(REQUEST_ID_RE, value, field, "request ID")


def handler(value: object, field: str = "handler") -> str:
    return _matches(HANDLER_RE, value, field, "handler name")


def names(tenant: object, handler_name: object, request: object) -> None:
    """A job's tenant ID, handler name and request ID, checked in one call where checking each
    is two: the shard API checks all three for every job. A bad one raises as its own check
    does, the tenant's first."""
    if (
        isinstance(tenant, str)
        and isinstance(handler_name, str)
        and isinstance(request, str)
        and TENANT_ID_RE.fullmatch(tenant)
        and HANDLER_RE.fullmatch(handler_name)
        and REQUEST_ID_RE.fullmatch(request)
    ):
        return
    tenant_id(tenant)
    handler(handler_name)
    request_id(request)


def schedule_id(value: object, field: str = "schedule_id") -> str:
    return _matches(SCHEDULE_ID_RE, value, field, "schedule ID")


def job_id(value: object, field: str = "job_id") -> str:
    return _matches(JOB_ID_RE, value, field, "job ID")


def worker_id(value: object, field: str = "worker_id") -> str:
    return _matches(WORKER_ID_RE, value, field, "worker ID")


def queue(value: object, field: str = "queue") -> str:
    return _matches(QUEUE_RE, value, field, "queue name")


def int_in_range(value: object, low: int, high: int, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        message = f"{value!r} is outside [{low}, {high}]"
        if isinstance(value, int) and value > high:
            message += _negative_hint(value)
        raise InvalidArgument(message, field=field)
    return value


def _negative_hint(value: int) -> str:
    """What a huge value of an unsigned field (uint32, uint64) was likely meant to be: a client
    in JavaScript or Java that sends -1 there sends the type's largest value, and quoting only
    that would puzzle its author."""
    for bits in (32, 64):
        if 2 ** (bits - 1) <= value < 2**bits:
            return f" ({value - 2**bits} as a {bits}-bit unsigned value?)"
    return ""


def priority(value: object, field: str = "priority") -> int:
    return int_in_range(value, MIN_PRIORITY, MAX_PRIORITY, field)


def payload(value: object, max_bytes: int, field: str = "payload") -> bytes:
    if not isinstance(value, bytes | bytearray):
        raise InvalidArgument("must be bytes (a JSON document)", field=field)
    if len(value) > max_bytes:
        raise InvalidArgument(f"{len(value)} bytes is over the {max_bytes}-byte limit", field=field)
    return bytes(value)
