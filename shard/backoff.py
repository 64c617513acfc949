"""Retry policies: how long a failed job waits before its next attempt.

The wait after attempt n failed is ``min(cap, base * 2^(n-1))``, of which a fraction
``jitter`` is drawn at random: the wait is uniform in ``[wait * (1 - jitter), wait]`` (jitter
1 is the AWS architecture blog's "Full Jitter", the server default). ``fail.lua`` computes it,
and nothing else does: it takes the policy of the worker's handler (or the server default), the
job's own policy from hash field ``rb`` over it, and the one random draw in [0, 1) that
``ShardClient.fail`` makes per failure. So precedence (job > handler > server default) and the
arithmetic live in one script, and the randomness in one line of Python.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

from shardq.common.errors import InvalidArgument

#: The longest wait a policy may ask for, in ms (366 days, the schedule horizon).
MAX_WAIT_MS: Final = 366 * 86_400_000


@dataclass(frozen=True, slots=True)
class Backoff:
    """A retry policy's waits. As the server default and as a handler's policy every field is
    in force; as a job's own policy (``NewJob.retry``, hash field ``rb``) a field 0 is unset
    and the handler's (else the server's) value applies, as ``shardq.v1.RetryBackoff`` says."""

    #: Wait after the first failed attempt, in ms; it doubles with every attempt.
    base_ms: int = 1_000
    #: The wait never grows past this, in ms (1 hour).
    cap_ms: int = 3_600_000
    #: Fraction of each wait drawn at random, 0 (none) to 1 (full jitter).
    jitter: float = 1.0

    def ceiling_ms(self, attempt: int) -> int:
        """The longest wait after the ``attempt``-th failed attempt (1-based): the wait before
        jitter. For checks and documentation; ``fail.lua`` computes the waits it uses."""
        if attempt < 1:
            raise ValueError("attempt is 1-based")
        # Bound the exponent so huge attempt counts cannot build huge integers (fail.lua too).
        return min(self.cap_ms, self.base_ms * (1 << min(attempt - 1, 40)))

    def to_arg(self) -> str:
        """``"<base_ms> <cap_ms> <jitter>"``: fail.lua's ARGV entry and hash field ``rb``
        (the jitter as ``repr``, which Lua's ``tonumber`` reads back exactly)."""
        return f"{self.base_ms} {self.cap_ms} {float(self.jitter)!r}"

    @classmethod
    def parse(cls, raw: bytes | str | None) -> Backoff | None:
        """The policy :meth:`to_arg` wrote; None for an empty or absent one."""
        if not raw:
            return None
        text = raw.decode() if isinstance(raw, bytes) else raw
        base, cap, jitter = text.split(" ")
        return cls(int(base), int(cap), float(jitter))

    @property
    def is_set(self) -> bool:
        """Any field set (a job's policy of zeros is no policy: not stored)."""
        return bool(self.base_ms or self.cap_ms or self.jitter)


def job_backoff(base_ms: int, max_ms: int, jitter: float, field: str = "retry") -> Backoff | None:
    """A job's own policy (0 = unset, per field) checked, or None when it sets nothing.

    Raises InvalidArgument naming ``{field}.base_ms``, ``.max_ms`` or ``.jitter``."""
    for name, value in (("base_ms", base_ms), ("max_ms", max_ms)):
        if not 0 <= value <= MAX_WAIT_MS:
            raise InvalidArgument(
                f"{value} is outside [0, {MAX_WAIT_MS}] (0: the handler's or server's)",
                field=f"{field}.{name}",
            )
    if base_ms and max_ms and max_ms < base_ms:
        raise InvalidArgument(f"{max_ms} is below base_ms {base_ms}", field=f"{field}.max_ms")
    if not (math.isfinite(jitter) and 0 <= jitter <= 1):
        raise InvalidArgument(f"{jitter} is outside [0, 1]", field=f"{field}.jitter")
    policy = Backoff(base_ms, max_ms, float(jitter))
    return policy if policy.is_set else None
