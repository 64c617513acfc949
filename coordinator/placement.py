"""Tenant placement: tenant → slot → shard, and the slot balancing behind adding shards.

Pure functions and values, no I/O: :mod:`shardq.coordinator.shardmap` loads and stores the
map, this module decides. The rule itself (slot count, hash) is :mod:`shardq.common.placement`.
The slot count is fixed forever (as in Redis Cluster), so growing the cluster moves slots
between shards and never rehashes tenants: adding a shard to N moves about 1/(N+1) of the
slots, and so about 1/(N+1) of the tenants.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TypeVar

from shardq.common.placement import ACTIVE, DRAINING, SLOT_COUNT, slot_of

K = TypeVar("K")
V = TypeVar("V")


@dataclass(frozen=True, slots=True)
class ShardInfo:
    shard_id: int
    #: ``host:port`` of the shard's Redis, as the coordinator and workers reach it.
    address: str
    #: Relative share of the slots; 0 gives the shard none (it keeps only its pins).
    weight: int = 1
    #: ``active`` or ``draining`` (see :data:`SHARD_STATES`).
    state: str = ACTIVE

    @property
    def effective_weight(self) -> int:
        """The weight slot balancing uses: a draining shard gets no slots whatever its weight."""
        return 0 if self.state == DRAINING else self.weight


@dataclass(frozen=True, slots=True)
class TenantMove:
    """A tenant being moved between shards; new work goes to ``to_shard_id`` from the start."""

    tenant_id: str
    from_shard_id: int
    to_shard_id: int
    started_at_ms: int
    #: The map version the change that recorded this move committed as (0: unknown, a move
    #: recorded before moves carried it): the moves of one command share it.
    change_version: int = 0


def _frozen(mapping: Mapping[K, V]) -> Mapping[K, V]:
    return MappingProxyType(dict(mapping))


@dataclass(frozen=True, slots=True)
class ShardMap:
    """One version of the shard map: every replica and worker that holds ``version`` agrees."""

    version: int
    shards: Mapping[int, ShardInfo]
    #: ``slots[s]`` is the shard that owns slot ``s``; exactly :data:`SLOT_COUNT` entries.
    slots: tuple[int, ...]
    #: Tenants placed explicitly (a hot tenant on its own shard); they override the slot table.
    pins: Mapping[str, int] = field(default_factory=dict)
    #: Tenants being migrated; they override pins and slots (new work goes to the target).
    moves: Mapping[str, TenantMove] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.slots) != SLOT_COUNT:
            raise ValueError(f"a shard map needs {SLOT_COUNT} slots, got {len(self.slots)}")
        # Read-only views, so a map handed to many subscribers cannot be changed by one.
        object.__setattr__(self, "shards", _frozen(self.shards))
        object.__setattr__(self, "pins", _frozen(self.pins))
        object.__setattr__(self, "moves", _frozen(self.moves))

    def shard_for(self, tenant_id: str) -> int:
        """Where ``tenant_id``'s new work goes: its move target, else its pin, else its slot's."""
        move = self.moves.get(tenant_id)
        if move is not None:
            return move.to_shard_id
        return self.placed_on(tenant_id)

    def placed_on(self, tenant_id: str) -> int:
        """The shard the placement (pin, else slot) gives ``tenant_id``, moves aside.

        Every move's target is where its tenant is placed, so once a move ends and its mark
        is dropped, :meth:`shard_for` still answers the same.
        """
        pinned = self.pins.get(tenant_id)
        if pinned is not None:
            return pinned
        return self.slots[slot_of(tenant_id)]

    def shards_for(self, tenant_id: str) -> tuple[int, ...]:
        """Every shard that may hold ``tenant_id``'s jobs: the target first, then a move's source.

        Reads (get, cancel, dedupe checks) during a move look at both sides.
        """
        target = self.shard_for(tenant_id)
        move = self.moves.get(tenant_id)
        if move is not None and move.from_shard_id != target:
            return (target, move.from_shard_id)
        return (target,)

    def losing_shards(self, after: ShardMap) -> set[int]:
        """Shards that some tenant's placement leaves between this map and ``after``: the
        previous owners of slots that changed hands, and of pins that were added, changed or
        removed. Their tenants may have to move."""
        lost = {old for old, new in zip(self.slots, after.slots, strict=True) if old != new}
        for tenant in self.pins.keys() | after.pins.keys():
            if self.pins.get(tenant) != after.pins.get(tenant):
                lost.add(self.placed_on(tenant))
        return lost & set(self.shards)

    def address_of(self, shard_id: int) -> str:
        return self.shards[shard_id].address

    def slot_counts(self) -> dict[int, int]:
        """Slots owned per shard, with 0 for shards that own none."""
        counts = dict.fromkeys(self.shards, 0)
        for owner in self.slots:
            counts[owner] = counts.get(owner, 0) + 1
        return counts

    def slot_ranges(self) -> list[tuple[int, int, int]]:
        """The slot table as runs of ``(first_slot, last_slot_inclusive, shard_id)``."""
        ranges: list[tuple[int, int, int]] = []
        start = 0
        for slot in range(1, SLOT_COUNT + 1):
            if slot == SLOT_COUNT or self.slots[slot] != self.slots[start]:
                ranges.append((start, slot - 1, self.slots[start]))
                start = slot
        return ranges

    def owns_nothing(self, shard_id: int) -> bool:
        """No slot or pin sends work to ``shard_id`` and no move involves it (drained)."""
        return (
            shard_id not in self.slots
            and not self.tenants_pinned_to(shard_id)
            and not self.tenants_moving_from(shard_id)
            and not self.tenants_moving_to(shard_id)
        )

    def tenants_pinned_to(self, shard_id: int) -> list[str]:
        return sorted(t for t, s in self.pins.items() if s == shard_id)

    def tenants_moving_from(self, shard_id: int) -> list[TenantMove]:
        return sorted(
            (m for m in self.moves.values() if m.from_shard_id == shard_id),
            key=lambda m: m.tenant_id,
        )

    def tenants_moving_to(self, shard_id: int) -> list[TenantMove]:
        return sorted(
            (m for m in self.moves.values() if m.to_shard_id == shard_id),
            key=lambda m: m.tenant_id,
        )

    def weights(self) -> dict[int, int]:
        """Effective weights (draining shards count as 0), the input of :func:`balance_slots`."""
        return {sid: info.effective_weight for sid, info in self.shards.items()}


def slot_targets(weights: Mapping[int, int]) -> dict[int, int]:
    """How many slots each shard should own: proportional to weight, summing to SLOT_COUNT.

    Largest-remainder rounding; ties go to the lower shard ID, so every caller computes the
    same targets from the same weights.
    """
    if any(w < 0 for w in weights.values()):
        raise ValueError(f"shard weights must be >= 0, got {dict(weights)}")
    total = sum(weights.values())
    if total <= 0:
        raise ValueError("at least one shard needs a weight above 0 to own slots")
    targets = {sid: SLOT_COUNT * w // total for sid, w in weights.items()}
    left = SLOT_COUNT - sum(targets.values())
    by_remainder = sorted(weights, key=lambda sid: (-(SLOT_COUNT * weights[sid] % total), sid))
    for sid in by_remainder[:left]:
        targets[sid] += 1
    return targets


def balance_slots(current: Sequence[int] | None, weights: Mapping[int, int]) -> list[int]:
    """A slot table with each shard's share proportional to its weight, moving as few slots
    as possible from ``current``.

    With ``current=None`` shards get contiguous ranges in shard-ID order. Otherwise only
    slots over a shard's target move (and every slot of a shard absent from ``weights``, e.g.
    a removed one), and only to shards under their target: the number of slots moved is the
    least any balanced table could need. An over-target shard gives up its highest slots and
    under-target shards take the lowest free ones in shard-ID order, so runs stay long and
    the result is the same on every replica.
    """
    targets = slot_targets(weights)
    order = sorted(targets)
    if current is None:
        table: list[int] = []
        for sid in order:
            table.extend([sid] * targets[sid])
        return table
    if len(current) != SLOT_COUNT:
        raise ValueError(f"current slot table has {len(current)} slots, not {SLOT_COUNT}")

    table = list(current)
    owned: dict[int, list[int]] = {}
    for slot, sid in enumerate(table):
        owned.setdefault(sid, []).append(slot)
    free: list[int] = []
    for sid, slots in owned.items():
        excess = len(slots) - targets.get(sid, 0)
        if excess > 0:
            free.extend(slots[-excess:])
    free.sort()
    cursor = 0
    for sid in order:
        deficit = targets[sid] - len(owned.get(sid, ()))
        for slot in free[cursor : cursor + max(deficit, 0)]:
            table[slot] = sid
        cursor += max(deficit, 0)
    return table
