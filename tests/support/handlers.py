"""Handlers used by the worker tests (imported by in-process and subprocess workers)."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from shardq.worker import Context, PermanentFailure, RetryLater, handler
from shardq.worker import examples as _examples  # noqa: F401 - registers echo, sleep, flaky, ledger.add


@handler("test.work")
async def work(ctx: Context, payload: dict[str, Any]) -> dict[str, Any]:
    await asyncio.sleep(payload.get("ms", 0) / 1000)
    return {"n": payload.get("n"), "attempt": ctx.attempt, "pid": os.getpid()}


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


@handler("test.cpu", cpu_bound=True)
def cpu(ctx: dict[str, Any], payload: dict[str, Any]) -> dict[str, Any]:
    """Runs in the process pool: ctx is plain metadata there."""
    return {"sum": sum(range(payload["n"])), "pid": os.getpid(), "attempt": ctx["attempt"]}
