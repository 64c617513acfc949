"""One worker group's handlers (``--handlers tests.support.handlers_mail``): mail, on the
default queue. Disjoint from tests.support.handlers_reports."""

from __future__ import annotations

import os
from typing import Any

from shardq.worker import Context, handler


@handler("mail.send")
async def send(ctx: Context, payload: dict[str, Any]) -> dict[str, Any]:
    return {"n": payload.get("n"), "pid": os.getpid()}
