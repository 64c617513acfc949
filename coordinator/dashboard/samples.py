"""The last hour of cluster totals, for the overview's charts.

The API reports counters (jobs submitted, completed, failed since each shard started
counting) and the lateness of the most overdue scheduled job, not their history. The
dashboard samples them every few seconds into a ring buffer in its own memory: bounded (an
hour at the sampling interval), and empty again after a restart of the dashboard. Sampling
runs only while an admin is logged in (it borrows that session's token: the dashboard holds
no credential of its own), and is one ``ListShardStatus`` call per interval.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("shardq.dashboard")

WINDOW_S = 3600


@dataclass(frozen=True, slots=True)
class Sample:
    at_s: float
    submitted: int
    completed: int
    failed: int
    lateness_ms: int


#: Bounds of the sampling interval: below, the ring of an hour grows large and is rebuilt
#: on every request; above, the charts have fewer than two points.
MIN_INTERVAL_S = 0.5
MAX_INTERVAL_S = 1800.0


class Samples:
    def __init__(self, interval_s: float) -> None:
        if not MIN_INTERVAL_S <= interval_s <= MAX_INTERVAL_S:  # NaN too
            raise ValueError(
                f"the sample interval must be {MIN_INTERVAL_S} to {MAX_INTERVAL_S} s, "
                f"not {interval_s}"
            )
        self.interval_s = interval_s
        self.ring: deque[Sample] = deque(maxlen=max(2, int(WINDOW_S / interval_s) + 1))

    def add(self, sample: Sample) -> None:
        self.ring.append(sample)

    def series(self) -> dict[str, list[Any]]:
        """Columns for the charts: time, rates per second between samples, lateness.

        A counter that went down (a tenant moved away, a shard left the map) gives no rate
        for that interval rather than a negative one."""
        out: dict[str, list[Any]] = {
            "t": [],
            "submitted": [],
            "completed": [],
            "failed": [],
            "lateness_ms": [],
        }
        items = list(self.ring)
        for before, after in itertools.pairwise(items):
            dt = after.at_s - before.at_s
            if dt <= 0:
                continue
            out["t"].append(round(after.at_s, 3))
            for name in ("submitted", "completed", "failed"):
                delta = getattr(after, name) - getattr(before, name)
                out[name].append(round(delta / dt, 3) if delta >= 0 else None)
            out["lateness_ms"].append(after.lateness_ms)
        return out

    async def run(self, read: Callable[[], Awaitable[Sample | None]]) -> None:
        """Sample forever with ``read`` (None: nobody to sample as; skipped)."""
        while True:
            started = time.monotonic()
            try:
                sample = await read()
                if sample is not None:
                    self.add(sample)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a coordinator away: the charts get a gap, not a crash
                log.warning("dashboard: sampling failed: %s", type(exc).__name__)
            await asyncio.sleep(max(0.0, self.interval_s - (time.monotonic() - started)))
