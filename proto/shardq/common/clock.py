"""Injectable clocks. On the SystemClock a ShardClient lets the Lua scripts read the shard's
own clock (Redis TIME), so a job's times come from one clock; a FakeClock's ``now_ms`` is passed
to them instead, so tests drive time."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now_ms(self) -> int: ...


class SystemClock:
    """Wall-clock unix milliseconds (shared between machines, so it must be NTP-synced)."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000


class FakeClock:
    """A clock that moves only when told to (tests)."""

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self._now_ms = start_ms

    def now_ms(self) -> int:
        return self._now_ms

    def advance(self, ms: int) -> None:
        if ms < 0:
            raise ValueError("a clock does not go back")
        self._now_ms += ms

    def set(self, now_ms: int) -> None:
        self._now_ms = now_ms
