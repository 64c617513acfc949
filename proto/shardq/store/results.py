"""Result rows in Postgres: one per (tenant_id, request_id), written before the job is acked.

Writes are ``INSERT … ON CONFLICT (tenant_id, request_id) DO UPDATE … WHERE status = 'dead'``:
a row that is ``succeeded`` or ``cancelled`` is final, and a late or duplicate completion (a
zombie worker, a re-delivery) changes nothing. The one row that may be replaced is a ``dead``
one: by the success (or the cancel, or the next death) of the same job after it was requeued.
The worker writes the rows of the jobs it finishes; the shard loop those of jobs that ended
without a worker (``shard/rows.py``), and reads the statuses back (:meth:`ResultStore.statuses`)
to make Redis agree with the row (docs/guarantees.md, "Result rows").
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession
from sqlalchemy.orm import Session

from shardq.store.db import results


@dataclass(frozen=True, slots=True)
class ResultRow:
    """One finished job's row, keyed by (tenant_id, request_id). Times are unix ms (0: none)."""

    tenant_id: str
    request_id: str
    job_id: str
    shard_id: int
    handler: str
    status: str  # succeeded | dead | cancelled
    #: The attempt that finished the job (1 for a first run).
    attempts: int
    #: The fencing token of the lease the row was written under.
    fence: int
    worker_id: str
    queued_ms: int
    started_ms: int
    finished_ms: int
    result: Any = None
    error: str | None = None
    #: The handler's last progress report as JSON data (``shardq.v1.JobProgress``'s names);
    #: None when it reported none.
    progress: Any = None


#: Columns of a result row, and the ones a replaced ``dead`` row takes from the new one.
_COLUMNS = (
    "tenant_id", "request_id", "job_id", "shard_id", "handler", "status", "result", "error",
    "attempts", "fence", "worker_id", "queued_at", "started_at", "finished_at", "progress",
)  # fmt: skip
_KEPT = ("tenant_id", "request_id", "handler", "queued_at")
_SET = ", ".join(f"{c} = EXCLUDED.{c}" for c in _COLUMNS if c not in _KEPT)
#: The upsert as one fixed statement over one JSON parameter (the rows), not a multi-row
#: VALUES statement: nothing to compile per batch (in the profile of a drain, compiling and
#: converting the VALUES statement, whose text changes with every batch size, took most of a
#: worker's CPU), and one ``json.dumps`` in C where 15 array parameters cost psycopg a Python
#: dump per value (25 us of the worker's CPU per row: ``bench/op_costs.py``). Only a ``dead``
#: row is replaced. Times travel as unix ms (0 = NULL) to spare building datetime objects;
#: ``res`` and ``pg`` as JSON text (``res`` "null" for None: JSON null; ``pg`` null: SQL NULL,
#: never reported). ``{rows}`` is the parameter as the driver spells it: psycopg's own for the
#: worker's batches, SQLAlchemy's in a handler's session (a CAST, as ``:rows::json`` would not
#: be read as a parameter there).
_UPSERT = f"""
INSERT INTO shardq_results ({", ".join(_COLUMNS)})
SELECT t, r, j, s, h, st, res::jsonb, e, a, f, w,
       to_timestamp(NULLIF(q, 0) / 1000.0), to_timestamp(NULLIF(sa, 0) / 1000.0),
       to_timestamp(NULLIF(fa, 0) / 1000.0), pg::jsonb
FROM json_to_recordset(CAST({{rows}} AS json))
     AS u(t text, r text, j text, s int, h text, st text, res text, e text, a int, f bigint,
          w text, q bigint, sa bigint, fa bigint, pg text)
ON CONFLICT (tenant_id, request_id) DO UPDATE SET {_SET}
WHERE shardq_results.status = 'dead'
"""
_UPSERT_MANY = _UPSERT.format(rows="%(rows)s")
#: One row in a handler's own transaction: returns it when written, nothing when a final row
#: refused it (rowcount is not told through every driver path).
_UPSERT_RETURNING = sa.text(_UPSERT.format(rows=":rows") + "RETURNING shardq_results.status")
_STATUSES = """
SELECT tenant_id, request_id, status FROM shardq_results
WHERE (tenant_id, request_id) IN (SELECT * FROM unnest(%(t)s::text[], %(r)s::text[]))
"""
_DONE = """
SELECT tenant_id, request_id FROM shardq_results
WHERE (tenant_id, request_id) IN (SELECT * FROM unnest(%(t)s::text[], %(r)s::text[]))
  AND status <> 'dead'
"""


def _rows_param(rows: Sequence[ResultRow]) -> dict[str, str]:
    """The rows as :data:`_UPSERT_MANY`'s one parameter. The first row of a key wins: one
    statement may not update a row twice."""
    seen: set[tuple[str, str]] = set()
    out: list[dict[str, Any]] = []
    for row in rows:
        key = (row.tenant_id, row.request_id)
        if key in seen:
            continue
        seen.add(key)
        out.append(
            {
                "t": row.tenant_id, "r": row.request_id, "j": row.job_id, "s": row.shard_id,
                "h": row.handler, "st": row.status, "res": json.dumps(row.result),
                "e": storable(row.error), "a": row.attempts, "f": row.fence, "w": row.worker_id,
                "q": row.queued_ms, "sa": row.started_ms, "fa": row.finished_ms,
                "pg": None if row.progress is None else json.dumps(row.progress),
            }
        )  # fmt: skip
    return {"rows": json.dumps(out)}


class _Conn:
    """One autocommit psycopg connection for one kind of hot statement, opened on first use
    and dropped after any error (the next call opens a new one).

    Not the SQLAlchemy pool: a checkout there costs a ping, then BEGIN, the statement and
    COMMIT or ROLLBACK, four round trips where one autocommit statement (atomic by itself)
    needs one. The claim path waits for the already-done check before any handler starts,
    so those round trips were most of a job's idle-to-start time.
    """

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self._conn: psycopg.AsyncConnection[Any] | None = None
        #: Concurrent callers share one connection (psycopg queues their statements); the
        #: lock keeps two of them from opening one each.
        self._opening = asyncio.Lock()

    async def _connection(self) -> psycopg.AsyncConnection[Any]:
        async with self._opening:
            if self._conn is None or self._conn.closed:
                self._conn = await psycopg.AsyncConnection.connect(
                    self.dsn, autocommit=True, connect_timeout=5
                )
            return self._conn

    async def execute(self, sql: str, params: dict[str, Any]) -> list[Any]:
        conn = await self._connection()
        try:
            cur = await conn.execute(sql, params, prepare=True)
            return await cur.fetchall() if cur.description else []
        except BaseException:
            # A failed or cancelled statement leaves the connection in doubt: start afresh.
            if self._conn is conn:
                self._conn = None
            with contextlib.suppress(Exception):
                await conn.close()
            raise

    async def close(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            with contextlib.suppress(Exception):
                await conn.close()


class ResultStore:
    def __init__(self, dsn: str) -> None:
        self._writes = _Conn(dsn)
        self._checks = _Conn(dsn)

    async def write(self, rows: Sequence[ResultRow]) -> None:
        """Commit the rows in one statement (raises on a database error: the caller retries)."""
        if not rows:
            return
        await self._writes.execute(_UPSERT_MANY, _rows_param(rows))

    async def already_done(self, keys: Iterable[tuple[str, str]]) -> set[tuple[str, str]]:
        """The (tenant_id, request_id) keys among ``keys`` that have a final (non-dead) row."""
        keys = list(set(keys))
        if not keys:
            return set()
        params = {"t": [t for t, _ in keys], "r": [r for _, r in keys]}
        return {(t, r) for t, r in await self._checks.execute(_DONE, params)}

    async def statuses(self, keys: Iterable[tuple[str, str]]) -> dict[tuple[str, str], str]:
        """The status of each row among ``keys`` that exists."""
        keys = list(set(keys))
        if not keys:
            return {}
        params = {"t": [t for t, _ in keys], "r": [r for _, r in keys]}
        return {(t, r): st for t, r, st in await self._checks.execute(_STATUSES, params)}

    async def close(self) -> None:
        await self._writes.close()
        await self._checks.close()


async def write_in_session(session: AsyncSession, row: ResultRow) -> bool:
    """Add the result row to a handler's own transaction and commit both together. When the
    job's row is already final (another run recorded it: this one lost its lease and finished
    before it was stopped), the upsert changes nothing and the handler's writes are rolled
    back with it, so they never commit twice: False."""
    if (await session.execute(_UPSERT_RETURNING, _rows_param([row]))).first() is None:
        await session.rollback()
        return False
    await session.commit()
    return True


def write_in_sync_session(session: Session, row: ResultRow) -> bool:
    """:func:`write_in_session` for a thread handler's session."""
    if session.execute(_UPSERT_RETURNING, _rows_param([row])).first() is None:
        session.rollback()
        return False
    session.commit()
    return True


#: The NUL character as JSON writes it: ``\u0000`` after an even number of backslashes (after
#: an odd number it is the text "\u0000", which JSONB stores).
_JSON_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def to_json(value: Any) -> Any:
    """The handler's return value as JSON data: TypeError when it is not JSON data, ValueError
    when Postgres cannot store it (JSONB refuses the NUL character and unpaired surrogates).
    Refused here, the job fails with that error; written, its batch of rows would be refused
    whole, again on every try."""
    text = json.dumps(value, ensure_ascii=False)
    if "\\u0000" in text and _JSON_NUL.search(text):
        raise ValueError("the result cannot be stored: Postgres refuses the NUL character")
    try:
        text.encode()
    except UnicodeEncodeError as exc:
        raise ValueError(f"the result cannot be stored: {exc.reason} in a string") from None
    return json.loads(text)


def storable(text: str | None) -> str | None:
    """``text`` as a Postgres text column takes it: a NUL character written ``\\0`` and an
    unpaired surrogate as its escape (an error message can hold either; a row refused for it
    would hold its whole batch back on every try)."""
    if text is None:
        return None
    if "\x00" in text:
        text = text.replace("\x00", "\\0")
    try:
        text.encode()
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode()
    return text


async def read_result(engine: AsyncEngine, tenant_id: str, request_id: str) -> bytes | None:
    """The recorded result of a succeeded job, as JSON bytes (None: no row, or no result)."""
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                sa.select(sa.cast(results.c.result, sa.Text)).where(
                    results.c.tenant_id == tenant_id, results.c.request_id == request_id
                )
            )
        ).first()
    return row[0].encode() if row and row[0] is not None else None
