"""Job IDs: 26 characters, time-sortable (48-bit ms timestamp, then 80 random bits),
Crockford base32 like ULID. Globally unique, so a job keeps its ID when its tenant moves."""

from __future__ import annotations

import os
import time

_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
#: Every 10-bit value as its two digits: 13 lookups make an ID, not 26 (a submit of 100 jobs
#: makes 100 IDs, and the digit loop was a tenth of the coordinator's work per job).
_PAIRS = [a + b for a in _ALPHABET for b in _ALPHABET]
_SHIFTS = range(120, -1, -10)


def new_job_id(now_ms: int | None = None) -> str:
    ms = time.time_ns() // 1_000_000 if now_ms is None else now_ms
    value = (ms & ((1 << 48) - 1)) << 80 | int.from_bytes(os.urandom(10), "big")
    return "".join([_PAIRS[(value >> shift) & 1023] for shift in _SHIFTS])
