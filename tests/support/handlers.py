"""Handlers used by the worker tests (imported by in-process and subprocess workers)."""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter
from typing import Any

from sqlalchemy import event as sa_event

from shardq.worker import Context, PermanentFailure, RetryLater, handler
from shardq.worker import examples as _examples  # noqa: F401 - registers echo, sleep, flaky, ledger.add

#: Runs of ``test.work`` started in this process, by request_id (in-process workers). Rows
#: cannot show a handler that ran twice (one row per key is the primary key): these can.
EXECUTIONS: Counter[str] = Counter()
#: A worker process given this variable appends one line per started run (its request_id).
EXECUTIONS_FILE = "SHARDQ_TEST_EXECUTIONS_FILE"


def executions_in(path: str) -> Counter[str]:
    """The runs recorded in an ``EXECUTIONS_FILE`` (a missing file: none)."""
    try:
        with open(path) as f:
            return Counter(line.strip() for line in f if line.strip())
    except FileNotFoundError:
        return Counter()


def _note_execution(request_id: str) -> None:
    EXECUTIONS[request_id] += 1
    if path := os.environ.get(EXECUTIONS_FILE):
        # One short O_APPEND write per line: lines of concurrent processes never interleave.
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, f"{request_id}\n".encode())
        finally:
            os.close(fd)


@handler("test.work")
async def work(ctx: Context, payload: dict[str, Any]) -> dict[str, Any]:
    _note_execution(ctx.request_id)
    await asyncio.sleep(payload.get("ms", 0) / 1000)
    return {"n": payload.get("n"), "attempt": ctx.attempt, "pid": os.getpid()}


@handler("test.clock")
async def clock(ctx: Context, payload: Any) -> dict[str, Any]:
    """When its run started, by this process' wall clock (unix ms)."""
    _note_execution(ctx.request_id)
    return {"started_ms": time.time() * 1000}


@handler("test.sync")
def sync_work(ctx: Context, payload: dict[str, Any]) -> dict[str, Any]:
    time.sleep(payload.get("ms", 0) / 1000)
    return {"n": payload.get("n"), "thread": True}


@handler("test.retry_later")
async def retry_later(ctx: Context, payload: dict[str, Any]) -> dict[str, Any]:
    if ctx.attempt == 1:
        raise RetryLater(payload.get("delay_s", 0.2))
    return {"attempt": ctx.attempt}


@handler("test.permanent")
async def permanent(ctx: Context, payload: Any) -> None:
    raise PermanentFailure("no point retrying")


@handler("test.always_fails")
async def always_fails(ctx: Context, payload: Any) -> None:
    raise ValueError("nope")


@handler("test.exit_after_commit")
def exit_after_commit(ctx: Context, payload: Any) -> dict[str, Any]:
    """Commits its result row through ``ctx.session``, then the process dies before the ack
    (an ``after_commit`` hook): the lost-ack story of docs/guarantees.md."""
    sa_event.listen(ctx.session, "after_commit", lambda _session: os._exit(9))
    return {"committed": True}


@handler("test.cpu", cpu_bound=True)
def cpu(ctx: dict[str, Any], payload: dict[str, Any]) -> dict[str, Any]:
    """Runs in the process pool: ctx is plain metadata there."""
    return {"sum": sum(range(payload["n"])), "pid": os.getpid(), "attempt": ctx["attempt"]}


@handler("test.unstorable_result")
async def unstorable_result(ctx: Context, payload: Any) -> dict[str, Any]:
    """Returns what JSONB cannot hold (a NUL character): the job fails, its row says why."""
    _note_execution(ctx.request_id)
    return {"bytes": "a\x00b"}


@handler("test.unstorable_error")
async def unstorable_error(ctx: Context, payload: Any) -> None:
    """Fails with a message a Postgres text column cannot hold as it is."""
    _note_execution(ctx.request_id)
    raise RuntimeError("bad\x00thing \ud800")
