"""The event loop shardq's servers run on (the coordinator, the shard loop, the worker):
uvloop's where it is installed (``shardq[server]`` installs it, except on Windows), else
asyncio's own. ``SHARDQ_EVENT_LOOP=asyncio`` chooses asyncio's loop anyway (the benchmarks
compare the two that way); ``uvloop`` requires uvloop.

Why uvloop: a bare ``grpc.aio`` server spends about a quarter of its CPU per call in asyncio's
loop, which uvloop runs in C (docs/benchmarks.md, session 18, has the figures). grpcio's aio
stack runs on any asyncio loop, and redis-py, psycopg and SQLAlchemy only use the loop's
public API.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

CHOICES = ("uvloop", "asyncio")

log = logging.getLogger("shardq.loop")


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The new-loop function for ``asyncio.Runner``; None: asyncio's own loop."""
    choice = os.environ.get("SHARDQ_EVENT_LOOP", "").strip().lower()
    if choice not in ("", *CHOICES):
        raise SystemExit(f"SHARDQ_EVENT_LOOP={choice!r}: expected one of {', '.join(CHOICES)}")
    if choice == "asyncio":
        return None
    try:
        import uvloop  # noqa: PLC0415 (optional: not in the client's dependencies)
    except ImportError:
        if choice == "uvloop":
            raise SystemExit(
                "SHARDQ_EVENT_LOOP=uvloop: uvloop is not installed (pip install 'shardq[server]')"
            ) from None
        return None
    return uvloop.new_event_loop


def run_main(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)`` on the loop :func:`loop_factory` chooses."""
    try:
        factory = loop_factory()
    except SystemExit:
        main.close()  # never to run: not "never awaited" on top of the refusal
        raise
    log.info("event loop: %s", "asyncio" if factory is None else "uvloop")
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)
