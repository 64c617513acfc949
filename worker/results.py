"""Result rows in Postgres: one per (tenant_id, request_id), written before the job is acked.

Writes never overwrite a finished result: a late or duplicate completion (a zombie worker, a
re-delivery) hits ``ON CONFLICT`` and changes nothing. The one row that may be replaced is a
``dead`` one, by the success of the same job after it was requeued.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession
from sqlalchemy.orm import Session

from coordinator.db import results
from shard.models import ClaimedJob


def _ts(ms: int) -> datetime | None:
    return datetime.fromtimestamp(ms / 1000, tz=UTC) if ms else None


@dataclass(frozen=True, slots=True)
class ResultRow:
    job: ClaimedJob
    shard_id: int
    status: str  # succeeded | dead | cancelled
    worker_id: str
    started_ms: int
    finished_ms: int
    result: Any = None
    error: str | None = None

    def values(self) -> dict[str, Any]:
        j = self.job
        return {
            "tenant_id": j.tenant,
            "request_id": j.request_id,
            "job_id": j.job_id,
            "shard_id": self.shard_id,
            "handler": j.handler,
            "status": self.status,
            "result": self.result,
            "error": self.error,
            "attempts": j.attempt,
            "fence": j.fence,
            "worker_id": self.worker_id,
            "queued_at": _ts(j.run_at_ms),
            "started_at": _ts(self.started_ms),
            "finished_at": _ts(self.finished_ms),
        }


def upsert(rows: Sequence[ResultRow]) -> sa.Insert:
    """One statement for many rows; only a ``dead`` row may be replaced."""
    stmt = insert(results).values([r.values() for r in rows])
    excluded = stmt.excluded
    return stmt.on_conflict_do_update(
        index_elements=[results.c.tenant_id, results.c.request_id],
        set_={
            "job_id": excluded.job_id,
            "shard_id": excluded.shard_id,
            "status": excluded.status,
            "result": excluded.result,
            "error": excluded.error,
            "attempts": excluded.attempts,
            "fence": excluded.fence,
            "worker_id": excluded.worker_id,
            "started_at": excluded.started_at,
            "finished_at": excluded.finished_at,
        },
        where=results.c.status == "dead",
    )


class ResultStore:
    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    async def write(self, rows: Sequence[ResultRow]) -> None:
        """Commit the rows in one transaction (raises on a database error: the caller retries)."""
        if not rows:
            return
        async with self.engine.begin() as conn:
            await conn.execute(upsert(rows))

    async def already_done(self, jobs: Iterable[ClaimedJob]) -> set[tuple[str, str]]:
        """(tenant, request_id) of these jobs that already have a final (non-dead) row."""
        keys = list({(j.tenant, j.request_id) for j in jobs})
        if not keys:
            return set()
        async with self.engine.connect() as conn:
            return await _done(conn, keys)


async def _done(conn: AsyncConnection, keys: list[tuple[str, str]]) -> set[tuple[str, str]]:
    stmt = sa.select(results.c.tenant_id, results.c.request_id).where(
        sa.tuple_(results.c.tenant_id, results.c.request_id).in_(keys),
        results.c.status != "dead",
    )
    return {(t, r) for t, r in (await conn.execute(stmt)).all()}


async def write_in_session(session: AsyncSession, row: ResultRow) -> None:
    """Add the result row to a handler's own transaction and commit both together."""
    await session.execute(upsert([row]))
    await session.commit()


def write_in_sync_session(session: Session, row: ResultRow) -> None:
    session.execute(upsert([row]))
    session.commit()


def to_json(value: Any) -> Any:
    """The handler's return value as JSON data (raises TypeError when it cannot be)."""
    return json.loads(json.dumps(value))
