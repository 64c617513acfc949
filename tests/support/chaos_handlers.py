"""The chaos tests' handler: ``chaos.ledger`` logs each run (tenant, request_id, attempt) to
the file named by ``SHARDQ_TEST_CHAOS_RUNS_FILE`` and writes a side effect through
``ctx.session`` into ``chaos_ledger``, a table with no unique key, so that a side effect
committed twice shows as two rows instead of being hidden by a constraint."""

from __future__ import annotations

import asyncio
import os
from collections import defaultdict
from typing import Any

from sqlalchemy import text

from shardq.worker import Context, handler

#: (tenant_id, request_id), as the reconciliation names a job.
Key = tuple[str, str]
RUNS_FILE = "SHARDQ_TEST_CHAOS_RUNS_FILE"
LEDGER = "chaos_ledger"
LEDGER_DDL = f"""
CREATE TABLE IF NOT EXISTS {LEDGER} (
    id bigserial PRIMARY KEY,
    tenant_id text NOT NULL,
    request_id text NOT NULL,
    amount bigint NOT NULL
)"""


def _note_run(ctx: Context) -> None:
    if path := os.environ.get(RUNS_FILE):
        # One short O_APPEND write per line: lines of concurrent processes never interleave.
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, f"{ctx.tenant_id} {ctx.request_id} {ctx.attempt}\n".encode())
        finally:
            os.close(fd)


def runs_in(path: str) -> dict[Key, list[int]]:
    """The runs a ``RUNS_FILE`` recorded: per (tenant, request_id), each run's attempt."""
    out: dict[Key, list[int]] = defaultdict(list)
    try:
        with open(path) as f:
            for line in f:
                tenant, request_id, attempt = line.split()
                out[(tenant, request_id)].append(int(attempt))
    except FileNotFoundError:
        pass
    return dict(out)


@handler("chaos.ledger")
async def ledger(ctx: Context, payload: dict[str, Any]) -> dict[str, Any]:
    _note_run(ctx)
    await asyncio.sleep(payload.get("ms", 0) / 1000)
    await ctx.session.execute(
        text(f"INSERT INTO {LEDGER} (tenant_id, request_id, amount) VALUES (:t, :r, :a)"),
        {"t": ctx.tenant_id, "r": ctx.request_id, "a": payload.get("amount", 1)},
    )
    return {"n": payload.get("n"), "attempt": ctx.attempt}


#: In-process workers only: ``chaos.ledger_gated`` of a request_id sets the first event once
#: its write is in its transaction, and returns when the test sets the second.
GATES: dict[str, tuple[asyncio.Event, asyncio.Event]] = {}


@handler("chaos.ledger_gated")
async def ledger_gated(ctx: Context, payload: dict[str, Any]) -> dict[str, Any]:
    started, release = GATES[ctx.request_id]
    await ctx.session.execute(
        text(f"INSERT INTO {LEDGER} (tenant_id, request_id, amount) VALUES (:t, :r, :a)"),
        {"t": ctx.tenant_id, "r": ctx.request_id, "a": payload.get("amount", 1)},
    )
    started.set()
    await release.wait()
    return {"attempt": ctx.attempt}
