"""Retry delays: exponential backoff with full jitter (AWS architecture blog's "Full Jitter")."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Backoff:
    #: Delay ceiling before the first retry, in ms; it doubles with every attempt.
    base_ms: int = 1_000
    #: The ceiling never grows past this, in ms (1 hour).
    cap_ms: int = 3_600_000

    def ceiling_ms(self, attempt: int) -> int:
        """Upper bound of the delay after the ``attempt``-th failed attempt (1-based)."""
        if attempt < 1:
            raise ValueError("attempt is 1-based")
        # Bound the exponent so huge attempt counts cannot build huge integers.
        return min(self.cap_ms, self.base_ms * (1 << min(attempt - 1, 40)))

    def delay_ms(self, attempt: int, rng: random.Random | None = None) -> int:
        """A delay drawn uniformly from ``[0, ceiling]``: retries of many jobs spread out."""
        return (rng or random).randint(0, self.ceiling_ms(attempt))
