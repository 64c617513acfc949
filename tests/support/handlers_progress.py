"""Handlers of the progress and retry-policy tests (tests/integration/test_progress.py,
test_retry_policy.py), run by real worker processes (``--handlers``).

The progress handlers never wait on a clock: each step waits for a file the test creates once
it has seen the previous step's report, so the test decides when the handler goes on.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from shardq.worker import Context, Retry, handler


def _gate(payload: dict[str, Any], name: str) -> str:
    return os.path.join(payload["dir"], name)


async def _wait_for(path: str) -> None:
    while not await asyncio.to_thread(os.path.exists, path):
        await asyncio.sleep(0.02)


def _touch(path: str) -> None:
    with open(path, "w"):
        pass


@handler("progress.steps")
async def steps(ctx: Context, payload: dict[str, Any]) -> dict[str, Any]:
    """Reports 0.25, then 0.5 once file ``go1`` exists, then 1.0 once ``go2`` does."""
    await ctx.progress(0.25, "resized 1/4")
    await _wait_for(_gate(payload, "go1"))
    await ctx.progress(0.5, "resized 2/4")
    await _wait_for(_gate(payload, "go2"))
    await ctx.progress(1.0, "done")
    return {"ok": True}


@handler("progress.sync")
def sync_steps(ctx: Context, payload: dict[str, Any]) -> dict[str, Any]:
    """A plain handler (a thread): reports 0.5, then 0.75 once file ``go`` exists, and ends."""
    ctx.progress_sync(0.5, "half way")
    while not os.path.exists(_gate(payload, "go")):
        time.sleep(0.02)
    ctx.progress_sync(0.75, "three quarters")
    return {"ok": True}


@handler("progress.lost")
async def lost(ctx: Context, payload: dict[str, Any]) -> None:
    """Reports 0.1; once file ``go`` exists reports 0.9, notes that it did (file
    ``reported``) and runs until cancelled (its lease is lost by then)."""
    await ctx.progress(0.1, "before")
    await _wait_for(_gate(payload, "go"))
    await ctx.progress(0.9, "after the lease was lost")
    _touch(_gate(payload, "reported"))
    await asyncio.Event().wait()


@handler("progress.invalid")
async def invalid(ctx: Context, payload: dict[str, Any]) -> None:
    """Reports what the payload says: a bad value fails the attempt with the ValueError."""
    await ctx.progress(payload["fraction"], payload.get("message", ""))


@handler("retry.default")
async def fails(ctx: Context, payload: dict[str, Any]) -> None:
    """Always fails; no policy of its own (the server default, or the job's)."""
    raise RuntimeError("always fails")


@handler("retry.handler", retry=Retry(base=300.0, max=600.0, jitter=0.0, permanent=(ValueError,)))
async def fails_with_policy(ctx: Context, payload: dict[str, Any]) -> None:
    """Fails with a ValueError (permanent for this handler) or a RuntimeError (retried after
    its policy's exact 300 s, no jitter), as the payload says."""
    if payload.get("permanent"):
        raise ValueError("bad input, no retry will help")
    raise RuntimeError("transient")


@handler("progress.burst")
async def burst(ctx: Context, payload: dict[str, Any]) -> dict[str, Any]:
    """Reports 'first'; once file ``go1`` exists, 1,000 reports in a tight loop, then notes it
    (file ``reported``) and ends once ``go2`` exists."""
    await ctx.progress(0.0, "first")
    await _wait_for(_gate(payload, "go1"))
    for i in range(1, 1_001):
        await ctx.progress(i / 1_000, f"{i}/1000")
    _touch(_gate(payload, "reported"))
    await _wait_for(_gate(payload, "go2"))
    return {"reports": 1_001}
