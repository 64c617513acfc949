"""The event loop shardq's servers run on (the coordinator, the shard loop, the worker):
uvloop's where it is installed (``shardq[server]`` installs it, except on Windows), else
asyncio's own. ``SHARDQ_EVENT_LOOP=asyncio`` chooses asyncio's loop anyway (the benchmarks
compare the two that way); ``uvloop`` requires uvloop.

Why uvloop: about a quarter of the coordinator's CPU per unary call is asyncio's loop (a
native profile, docs/benchmarks.md, session 16), which uvloop runs in C: the call costs 16%
less CPU on it (session 18). grpcio's aio stack runs on any asyncio loop, and redis-py,
psycopg and SQLAlchemy only use the loop's public API. Its timers count whole ms, so code that
must not wake early checks the clock itself (``shardq.worker.shardclock.sleep_until``).
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
    # DEBUG: a refusal at start (a bad flag, a missing module) stays the one line on stderr.
    log.debug("event loop: %s", "asyncio" if factory is None else "uvloop")
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)
