"""Job IDs: 26 characters, time-sortable (48-bit ms timestamp, then 80 random bits),
Crockford base32 like ULID. Globally unique, so a job keeps its ID when its tenant moves."""

from __future__ import annotations

import os
import time

_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
#: Every 10-bit value as its two digits: 13 lookups make an ID, not 26 (a submit of 100 jobs
#: makes 100 IDs, and the digit loop was a tenth of the coordinator's work per job).
_PAIRS = [a + b for a in _ALPHABET for b in _ALPHABET]
#: The first 10 digits are the 48-bit timestamp alone (bits 129-80 of the 26 digits' 130),
#: the last 16 the 80 random bits alone.
_TIME_SHIFTS = range(40, -1, -10)
#: The timestamp's digits, for the last ms an ID was made in (the IDs of one batch share
#: them), as one tuple in a one-slot list: read and replaced whole, whatever thread calls.
_last_time: list[tuple[int, str]] = [(-1, "")]


def new_job_id(now_ms: int | None = None) -> str:
    ms = (time.time_ns() // 1_000_000 if now_ms is None else now_ms) & ((1 << 48) - 1)
    last_ms, prefix = _last_time[0]
    if ms != last_ms:
        prefix = "".join([_PAIRS[(ms >> shift) & 1023] for shift in _TIME_SHIFTS])
        _last_time[0] = (ms, prefix)
    # Written out, not a comprehension over the shifts (a function call and a list): an ID
    # took 3.4 µs with the comprehension, 2.4 with one join of a tuple, on one machine.
    r = int.from_bytes(os.urandom(10), "big")
    p = _PAIRS
    return "".join(
        (
            prefix,
            p[r >> 70],
            p[(r >> 60) & 1023],
            p[(r >> 50) & 1023],
            p[(r >> 40) & 1023],
            p[(r >> 30) & 1023],
            p[(r >> 20) & 1023],
            p[(r >> 10) & 1023],
            p[r & 1023],
        )
    )
