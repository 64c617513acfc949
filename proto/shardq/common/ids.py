"""Job IDs: 26 characters, time-sortable (48-bit ms timestamp, then 80 random bits),
Crockford base32 like ULID. Globally unique, so a job keeps its ID when its tenant moves."""

from __future__ import annotations

import os
import time

_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def new_job_id(now_ms: int | None = None) -> str:
    ms = time.time_ns() // 1_000_000 if now_ms is None else now_ms
    value = (ms & ((1 << 48) - 1)) << 80 | int.from_bytes(os.urandom(10), "big")
    out = []
    for _ in range(26):
        out.append(_ALPHABET[value & 31])
        value >>= 5
    return "".join(reversed(out))
