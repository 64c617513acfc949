"""When a shard's clock reaches a given time, told by this worker's monotonic clock.

Run-at times are the shard's (Redis TIME); a job promoted ahead of its run-at is claimed early
and must start on it, never before, whatever this host's clocks say. Each claim brackets the
shard's clock: it read ``now`` while the call was in flight, so when its reply arrives, this
host's monotonic clock minus the shard's is at most ``received - now`` (a slow reply only
loosens the bound). The tightest bound of the claims seen says when the shard reaches a
run-at: late by about the fastest claim's one-way time, never early.

The monotonic clock, not the wall clock: a wall clock stepped here (NTP, an operator) would
move every wake-up by the step. Two clocks still drift apart by their rates: a bound grows
by ``MAX_DRIFT`` (the most a Linux clock is slewed, 500 ppm) per ms of its age, so an old
tight bound stays safe and a newer claim's bound soon replaces it.
"""

from __future__ import annotations

import asyncio
import math
import time

#: The most two clocks' rates differ, in ms per ms (adjtime's largest slew: 500 ppm).
MAX_DRIFT = 0.0005


def monotonic_ms() -> float:
    return time.monotonic() * 1000


async def sleep_until(at_ms: float) -> None:
    """Sleep until :func:`monotonic_ms` reaches ``at_ms``: on it or after, never before."""
    left_ms = at_ms - monotonic_ms()
    while left_ms > 0:
        await asyncio.sleep(left_ms / 1000)
        # uvloop's timers count whole ms from the time its loop last read: one can end up to
        # a ms early. A whole ms then, not the rest: a sub-ms timer would end at once, again
        # and again (a spin).
        left_ms = math.ceil(at_ms - monotonic_ms())


class ShardClock:
    def __init__(self) -> None:
        self._bound: float | None = None
        self._at = 0.0

    def bound_ms(self) -> float | None:
        """This host's monotonic clock minus the shard's clock, at most (ms), now."""
        if self._bound is None:
            return None
        return self._bound + MAX_DRIFT * (monotonic_ms() - self._at)

    def observe(self, received_ms: float, shard_now_ms: int) -> None:
        """A claim whose reply arrived at ``received_ms`` (:func:`monotonic_ms`) read
        ``shard_now_ms`` on the shard while it was in flight."""
        bound = received_ms - shard_now_ms
        current = self.bound_ms()
        if current is None or bound <= current:
            self._bound, self._at = bound, received_ms

    def local_ms(self, shard_ms: int) -> float:
        """The :func:`monotonic_ms` by which the shard's clock has reached ``shard_ms``."""
        bound = self.bound_ms()
        if bound is None:
            raise RuntimeError("no claim observed yet")
        return shard_ms + bound
