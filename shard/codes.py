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
