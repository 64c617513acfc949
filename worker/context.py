"""What a handler gets besides its payload."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from shardq.shard.records import ClaimedJob


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


def make_context(
    job: ClaimedJob,
    shard_id: int,
    deadline_ms: int,
    session_factory: Callable[[], Any] | None,
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
    )
