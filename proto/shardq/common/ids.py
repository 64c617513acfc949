"""Job IDs: 26 characters, time-sortable (48-bit ms timestamp, then 80 random bits),
Crockford base32 like ULID. Globally unique, so a job keeps its ID when its tenant moves.
And the clients' request IDs: 128 random bits as 32 hex digits."""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

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
#: How many IDs' random bits one read of the OS's random source makes. One ``os.urandom``
#: per ID was a ``getrandom`` system call per job: a native profile of a coordinator serving
#: SubmitJobs of 100 put it at about a tenth of its busy samples, on an AMD EPYC machine (an
#: upper bound: such profiles over-sample system calls); in a client sending them, the
#: request IDs' were 12% of its samples. Read 64 at a time, it is 1/64 of that.
_RANDOM_BATCH = 64
#: Random values made ahead, each taken once (``deque.popleft`` is atomic: two threads never
#: get the same one): the job IDs' 80-bit ints and the request IDs' hex strings. A forked
#: child starts without them, or it would make the same IDs as its parent (the worker's
#: process pool forks from a forkserver; any program may fork).
_randoms: deque[int] = deque()
_hex_randoms: deque[str] = deque()
os.register_at_fork(after_in_child=_randoms.clear)
os.register_at_fork(after_in_child=_hex_randoms.clear)


def _more(made_ahead: deque[T], width: int, value: Callable[[bytes], T]) -> T:
    """One value of ``width`` random bytes; ``_RANDOM_BATCH - 1`` more left in ``made_ahead``."""
    raw = os.urandom(width * _RANDOM_BATCH)
    made_ahead.extend([value(raw[i : i + width]) for i in range(width, len(raw), width)])
    return value(raw[:width])


def _big_int(raw: bytes) -> int:
    return int.from_bytes(raw, "big")


def random_hex() -> str:
    """128 random bits as 32 hex digits (the spelling of ``uuid4().hex``): a request ID."""
    try:
        return _hex_randoms.popleft()
    except IndexError:
        return _more(_hex_randoms, 16, bytes.hex)


def new_job_id(now_ms: int | None = None) -> str:
    ms = (time.time_ns() // 1_000_000 if now_ms is None else now_ms) & ((1 << 48) - 1)
    last_ms, prefix = _last_time[0]
    if ms != last_ms:
        prefix = "".join([_PAIRS[(ms >> shift) & 1023] for shift in _TIME_SHIFTS])
        _last_time[0] = (ms, prefix)
    # Written out, not a comprehension over the shifts (a function call and a list): an ID
    # took 3.4 µs with the comprehension, 2.4 with one join of a tuple, on one machine.
    try:
        r = _randoms.popleft()
    except IndexError:
        r = _more(_randoms, 10, _big_int)
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
