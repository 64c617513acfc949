"""Example handlers shipped with shardq (``--handlers shardq.worker.examples``), which
``shardq dev`` runs. Their jobs name no queue, so they wait in ``default``, the queue a worker
serves unless given ``--queues``.

- ``echo``: returns its payload.
- ``sleep``: ``{"ms": N}`` sleeps N ms, then returns ``{"slept_ms": N}``.
- ``flaky``: ``{"fail_times": K}`` fails its first K attempts, then succeeds.
- ``fail``: always fails (ends in the dead-letter set).
- ``ledger.add``: ``{"account": "a", "amount": 5}`` writes a row through ``ctx.session``, in
  the same transaction as the job's result row: exactly once, however often it is delivered.
"""

from __future__ import annotations

import asyncio
from typing import Any

from sqlalchemy import text

from shardq.worker import Context, handler


@handler("echo")
async def echo(ctx: Context, payload: Any) -> Any:
    return payload


@handler("sleep")
async def sleep(ctx: Context, payload: dict[str, Any]) -> dict[str, Any]:
    ms = int(payload.get("ms", 100))
    await asyncio.sleep(ms / 1000)
    return {"slept_ms": ms}


@handler("flaky")
async def flaky(ctx: Context, payload: dict[str, Any]) -> dict[str, Any]:
    if ctx.attempt <= int(payload.get("fail_times", 1)):
        raise RuntimeError(f"flaky: attempt {ctx.attempt} fails on purpose")
    return {"succeeded_on_attempt": ctx.attempt}


@handler("fail", max_attempts=3)
async def fail(ctx: Context, payload: Any) -> None:
    raise RuntimeError("this handler always fails")


LEDGER_DDL = """
CREATE TABLE IF NOT EXISTS shardq_example_ledger (
    tenant_id text NOT NULL,
    request_id text NOT NULL,
    account text NOT NULL,
    amount bigint NOT NULL,
    PRIMARY KEY (tenant_id, request_id)
)"""


@handler("ledger.add")
async def ledger_add(ctx: Context, payload: dict[str, Any]) -> dict[str, Any]:
    session = ctx.session
    # Serialize the one-time CREATE: concurrent CREATE TABLE IF NOT EXISTS can still collide.
    await session.execute(text("SELECT pg_advisory_xact_lock(7301)"))
    await session.execute(text(LEDGER_DDL))
    await session.execute(
        text("INSERT INTO shardq_example_ledger VALUES (:t, :r, :a, :n)"),
        {"t": ctx.tenant_id, "r": ctx.request_id, "a": payload["account"], "n": payload["amount"]},
    )
    if payload.get("then_fail"):
        raise RuntimeError("failing after the write: the write must roll back")
    return {"account": payload["account"], "added": payload["amount"]}
