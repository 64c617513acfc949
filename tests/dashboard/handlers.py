"""Handlers of the dashboard's browser tests: each waits on a file the test controls, so a job's
states can be watched one by one without any timing."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from shardq.worker import Context, PermanentFailure, handler


@handler("dash.gate")
async def gate(ctx: Context, payload: dict[str, Any]) -> dict[str, Any]:
    """Runs until the file ``payload["release"]`` exists."""
    release = Path(payload["release"])
    # The test's file: there is no event to wait on across the two.
    while not await asyncio.to_thread(release.exists):
        await asyncio.sleep(0.05)
    return {"released": True, "attempt": ctx.attempt}


@handler("dash.flaky")
async def flaky(ctx: Context, payload: dict[str, Any]) -> dict[str, Any]:
    """Fails for good while the file ``payload["fail_while"]`` exists, else succeeds."""
    if await asyncio.to_thread(Path(payload["fail_while"]).exists):
        raise PermanentFailure("told to fail by the test")
    return {"ok": True}
