"""The per-item codes the shard's Lua scripts return (``shard/lua/_lib.lua`` spells the same)."""

from __future__ import annotations

from enum import IntEnum


class ItemCode(IntEnum):
    """One code per item of a script's reply; the Python API turns refusals into errors."""

    OK = 0
    DEDUPLICATED = 1
    CONFLICT = 2
    OVER_QUOTA = 3
    RATE_LIMITED = 4
    STALE_LEASE = 5
    CANCEL_REQUESTED = 6
    NOT_FOUND = 7
    ALREADY_TERMINAL = 8
    CANCELLED = 9
    #: Submitted with a shard-map version older than the shard's fence: reload and re-route.
    STALE_MAP = 10
    #: The job is being copied to another shard (a tenant move): ask again in a moment.
    MOVING = 11


#: Every code by its value (they run 0, 1, ... without a gap; ``tests/unit/test_records.py``
#: checks): indexing is a tenth of the time of ``ItemCode(value)``, paid per job of a batch.
CODES_BY_VALUE: tuple[ItemCode, ...] = tuple(ItemCode)


def item_code(raw: int | bytes | str) -> ItemCode:
    """The code a script answered (a RESP integer, or its text); ValueError for one no
    script answers, as ``ItemCode(value)`` raises."""
    value = int(raw)
    if not 0 <= value < len(CODES_BY_VALUE):
        raise ValueError(f"{value} is not a valid ItemCode")
    return CODES_BY_VALUE[value]
