"""The placement rule every part of shardq (and every client in another language) shares.

A tenant's slot is a fixed hash of its ID; the shard map (:mod:`shardq.coordinator.placement`)
says which shard owns each slot, with pins and moves overriding it. The slot count and the
hash never change, so growing the cluster moves slots, never rehashes tenants.
"""

from __future__ import annotations

import mmh3

#: Number of slots. Fixed forever: changing it (or the hash below) would move every tenant.
SLOT_COUNT = 16384

#: Shard states. A draining shard keeps its jobs but is given no slots (its weight counts as 0).
ACTIVE, DRAINING = "active", "draining"
SHARD_STATES = (ACTIVE, DRAINING)


def slot_of(tenant_id: str) -> int:
    """The slot of ``tenant_id``: unsigned 32-bit MurmurHash3 (seed 0) of its UTF-8 bytes.

    Fixed forever, like :data:`SLOT_COUNT`: every coordinator replica and every worker must
    compute the same slot for a tenant, and changing the function would move every tenant.
    """
    return mmh3.hash(tenant_id.encode(), 0, signed=False) % SLOT_COUNT
