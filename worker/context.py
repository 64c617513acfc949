"""What a handler gets besides its payload."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from shardq.shard.records import MAX_PROGRESS_MESSAGE, ClaimedJob, JobProgress

#: Takes a checked progress report; False when the lease is no longer this worker's.
ReportFn = Callable[[JobProgress], bool]


@dataclass
class Context:
    """Job metadata, a logger, and ``session``: a SQLAlchemy session in the same database
    transaction as the job's result row, so what a handler writes through it is committed
    exactly once, together with the result (and rolled back with a failed attempt)."""

    job_id: str
    tenant_id: str
    request_id: str
    handler: str
    attempt: int
    max_attempts: int
    #: Unix ms by which this attempt must finish.
    deadline_ms: int
    shard_id: int
    log: logging.LoggerAdapter[logging.Logger]
    _session_factory: Callable[[], Any] | None = field(default=None, repr=False)
    _session: Any = field(default=None, repr=False)
    _report: ReportFn | None = field(default=None, repr=False)

    async def progress(self, fraction: float, message: str = "") -> None:
        """Report how far the job is: ``fraction`` from 0 to 1 and a short ``message``
        (at most 256 characters), shown by ``GetJob``/``WatchJob`` and kept in the result
        row. Cheap to call often: the worker sends the last value with its heartbeats, at
        most once a second (``--progress-interval-ms``). Raises ValueError for a value out
        of range. A report after the lease was lost is dropped (the shard refuses it)."""
        self.progress_sync(fraction, message)

    def progress_sync(self, fraction: float, message: str = "") -> None:
        """:meth:`progress` for plain (``def``) handlers, which run in threads."""
        report = check_progress(fraction, message)
        if self._report is not None:
            self._report(report)

    @property
    def session(self) -> Any:
        """AsyncSession for ``async def`` handlers, Session for plain ones (opened on use)."""
        if self._session is None:
            if self._session_factory is None:
                raise RuntimeError("no database session here (process-pool handler)")
            self._session = self._session_factory()
        return self._session

    @property
    def uses_session(self) -> bool:
        return self._session is not None


def check_progress(fraction: float, message: str) -> JobProgress:
    """A progress report, or ValueError saying what is wrong with it."""
    if isinstance(fraction, bool) or not isinstance(fraction, int | float):
        raise ValueError(f"progress fraction must be a number from 0 to 1, not {fraction!r}")
    if not (math.isfinite(fraction) and 0 <= fraction <= 1):
        raise ValueError(f"progress fraction must be from 0 to 1, not {fraction!r}")
    if not isinstance(message, str):
        raise ValueError(f"progress message must be a str, not {type(message).__name__}")
    if "\0" in message:  # Postgres keeps the message in JSONB, which refuses NUL
        raise ValueError("progress message must not contain NUL characters")
    try:
        message.encode()
    except UnicodeEncodeError as exc:
        raise ValueError(f"progress message is not valid text ({exc.reason})") from None
    if len(message) > MAX_PROGRESS_MESSAGE:
        raise ValueError(
            f"progress message is {len(message)} characters, at most {MAX_PROGRESS_MESSAGE}"
        )
    return JobProgress(float(fraction), message)


def make_context(
    job: ClaimedJob,
    shard_id: int,
    deadline_ms: int,
    session_factory: Callable[[], Any] | None,
    report: ReportFn | None = None,
) -> Context:
    log = logging.LoggerAdapter(
        logging.getLogger("shardq.handler"),
        {"job_id": job.job_id, "tenant": job.tenant, "handler": job.handler},
    )
    return Context(
        job_id=job.job_id,
        tenant_id=job.tenant,
        request_id=job.request_id,
        handler=job.handler,
        attempt=job.attempt,
        max_attempts=job.max_attempts,
        deadline_ms=deadline_ms,
        shard_id=shard_id,
        log=log,
        _session_factory=session_factory,
        _report=report,
    )
