"""The other worker group's handlers (``--handlers tests.support.handlers_reports``): reports,
on their own queue. Disjoint from tests.support.handlers_mail."""

from __future__ import annotations

import os
from typing import Any

from shardq.worker import Context, handler


@handler("report.build")
async def build(ctx: Context, payload: dict[str, Any]) -> dict[str, Any]:
    return {"n": payload.get("n"), "pid": os.getpid()}
