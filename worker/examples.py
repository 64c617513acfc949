"""Example handlers shipped with shardq (``--handlers shardq.worker.examples``), which
``shardq dev`` runs. Their jobs name no queue, so they wait in ``default``, the queue a worker
serves unless given ``--queues``.

- ``echo``: returns its payload.
- ``sleep``: ``{"ms": N}`` sleeps N ms, then returns ``{"slept_ms": N}``.
- ``flaky``: ``{"fail_times": K}`` fails its first K attempts, then succeeds.
- ``fail``: always fails (ends in the dead-letter set).
- ``email.send``: ``{"to": "a@example.com"}`` pretends to send a mail and returns
  ``{"sent": True, "to": ...}``; no ``to`` is a permanent failure (straight to the dead set).
- ``report.build``: ``{"day": "2025-01-01"}`` a CPU-bound report, run in the worker's process
  pool (``cpu_bound=True``; ``shardq dev`` gives each worker ``--process-pool-size 2``).
- ``ledger.add``: ``{"account": "a", "amount": 5}`` writes a row through ``ctx.session``, in
  the same transaction as the job's result row: exactly once, however often it is delivered.
"""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

from sqlalchemy import text

from shardq.worker import Context, PermanentFailure, handler


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


@handler("email.send", timeout_s=30, max_attempts=5)
async def email_send(ctx: Context, payload: dict[str, Any]) -> dict[str, Any]:
    if "to" not in payload:
        raise PermanentFailure("no recipient")
    await asyncio.sleep(0.01)  # the mail server, in a real handler (ctx.request_id: its key)
    return {"sent": True, "to": payload["to"]}


@handler("report.build", cpu_bound=True)
def report_build(ctx: dict[str, Any], payload: dict[str, Any]) -> dict[str, Any]:
    # A process-pool handler gets a plain dict (job_id, tenant_id, attempt), no session.
    digest = str(payload.get("day", "")).encode()
    for _ in range(20_000):  # CPU work that would stall the worker's event loop
        digest = hashlib.sha256(digest).digest()
    return {"day": payload.get("day"), "checksum": digest.hex()[:16]}


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
