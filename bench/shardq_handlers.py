"""The benchmark's no-op handler for ``shardq-worker --handlers shardq_handlers``.

The payload is the job's number (a JSON integer). The handler's first and only action is the
same start record every peer's job writes (``bench/peers/_common.py``), so start times are
taken where the job really starts. It returns nothing: the worker still records a result row
in Postgres (status ``succeeded``, result ``null``) before it acks the job.
"""

from __future__ import annotations

from typing import Any

from _common import record_start

from shardq.worker import Context, handler

NOOP = "bench.noop"


@handler(NOOP)
async def noop(ctx: Context, payload: Any) -> None:
    record_start(int(payload))
