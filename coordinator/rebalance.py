"""``shardq rebalance``: even out the shards' load by moving slots and pinning hot tenants.

A tenant's load is what keeps a shard busy: jobs submitted per second over the shard loop's
last sample (``shard.load``), plus its backlog (ready and active jobs) spread over a minute,
so a tenant with a deep queue counts even while it submits nothing. A shard's load is the
sum of its tenants'.

The plan is greedy and deterministic: while the busiest and the idlest active shard differ
by more than ``tolerance`` of the mean, take the unit of the busiest shard that best halves
the gap — a slot (all its tenants go along), or one tenant pinned on its own when its slot
holds others — and give it to the idlest. Each slot given away is paired with an empty slot
of the receiving shard given back, so every shard keeps its number of slots and a later
``shards sync`` (which balances slot *counts* by weight) does not undo the plan.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field

from shardq.common.placement import slot_of
from shardq.coordinator.placement import ShardMap
from shardq.shard.models import TenantLoad

#: Seconds of backlog counted as one job per second of load.
BACKLOG_HORIZON_S = 60.0


def tenant_load(load: TenantLoad) -> float:
    return load.submit_per_s + (load.ready + load.active) / BACKLOG_HORIZON_S


@dataclass
class Plan:
    #: slot -> new owner (given away, and the empty ones given back).
    slot_moves: dict[int, int] = field(default_factory=dict)
    #: tenant -> shard it is pinned to.
    pins: dict[str, int] = field(default_factory=dict)
    before: dict[int, float] = field(default_factory=dict)
    after: dict[int, float] = field(default_factory=dict)
    #: One line per step, for people.
    steps: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.slot_moves and not self.pins


def plan(
    smap: ShardMap,
    loads: Mapping[int, Mapping[str, TenantLoad]],
    tolerance: float = 0.1,
    max_steps: int = 64,
    *,
    repin: bool = False,
) -> Plan:
    """Slot moves and pins that even out ``loads`` (shard -> tenant -> load) under ``smap``.

    A tenant an operator pinned stays where it is pinned (its load counts there) unless
    ``repin``: then the plan may pin it elsewhere."""
    return _Planner(smap, loads, repin).run(tolerance, max_steps)


Unit = tuple[float, str, int | str]


class _Planner:
    def __init__(
        self, smap: ShardMap, loads: Mapping[int, Mapping[str, TenantLoad]], repin: bool
    ) -> None:
        self.repin = repin
        self.active = sorted(s for s, info in smap.shards.items() if info.effective_weight > 0)
        self.weight: dict[str, float] = defaultdict(float)
        for per_tenant in loads.values():
            for tenant, load in per_tenant.items():
                if tenant not in smap.moves:  # a moving tenant already goes where it is placed
                    self.weight[tenant] += tenant_load(load)
        self.shard_load = dict.fromkeys(smap.shards, 0.0)
        for tenant, w in self.weight.items():
            self.shard_load[smap.placed_on(tenant)] += w
        self.owner = list(smap.slots)
        self.pinned = dict(smap.pins)
        # What a shard can give: the slots of its unpinned tenants, or one tenant of a slot.
        self.by_slot: dict[int, list[str]] = defaultdict(list)
        for tenant in self.weight:
            if tenant not in self.pinned:
                self.by_slot[slot_of(tenant)].append(tenant)
        self.out = Plan(before=dict(self.shard_load))

    def run(self, tolerance: float, max_steps: int) -> Plan:
        active = self.active
        mean = sum(self.shard_load[s] for s in active) / len(active) if active else 0.0
        for _ in range(max_steps if len(active) > 1 else 0):
            hot = max(active, key=lambda s: (self.shard_load[s], -s))
            cold = min(active, key=lambda s: (self.shard_load[s], s))
            gap = self.shard_load[hot] - self.shard_load[cold]
            if mean <= 0 or gap <= tolerance * mean:
                break
            best = self._best(hot, gap)
            if best is None or best[0] >= gap or not self._give(best, hot, cold):
                break  # nothing that fits would narrow the gap
        self.out.after = dict(self.shard_load)
        return self.out

    def _best(self, hot: int, gap: float) -> Unit | None:
        """The unit of ``hot`` whose move leaves the smallest gap (a slot before a pin)."""
        candidates: list[Unit] = []
        for slot, tenants in self.by_slot.items():
            if self.owner[slot] != hot:
                continue
            candidates.append((abs(gap - 2 * self._slot_load(slot)), "slot", slot))
            if len(tenants) > 1:
                candidates += [(abs(gap - 2 * self.weight[t]), "pin", t) for t in tenants]
        candidates += [
            (abs(gap - 2 * self.weight[t]), "pin", t)
            for t, s in self.pinned.items()
            if s == hot and self.weight.get(t, 0) > 0 and (self.repin or t in self.out.pins)
        ]
        fits = [c for c in candidates if 0 < self._load_of(c) < gap]
        return min(fits, key=lambda c: (c[0], c[1] == "pin"), default=None)

    def _slot_load(self, slot: int) -> float:
        return sum(self.weight[t] for t in self.by_slot[slot])

    def _load_of(self, unit: Unit) -> float:
        _, kind, key = unit
        return self._slot_load(int(key)) if kind == "slot" else self.weight[str(key)]

    def _give(self, unit: Unit, hot: int, cold: int) -> bool:
        _, kind, key = unit
        load = self._load_of(unit)
        if kind == "slot":
            slot = int(key)
            spare = _empty_slot(self.owner, cold, self.by_slot)
            if spare is None:
                return False
            self.owner[slot], self.owner[spare] = cold, hot
            self.out.slot_moves[slot], self.out.slot_moves[spare] = cold, hot
            names = ", ".join(sorted(self.by_slot[slot]))
            self.out.steps.append(
                f"slot {slot} ({names}; load {load:.1f}) shard {hot} -> {cold}, "
                f"empty slot {spare} back"
            )
        else:
            tenant = str(key)
            self.pinned[tenant] = self.out.pins[tenant] = cold
            siblings = self.by_slot.get(slot_of(tenant), [])
            if tenant in siblings:
                siblings.remove(tenant)
            self.out.steps.append(f"pin tenant {tenant} (load {load:.1f}) shard {hot} -> {cold}")
        self.shard_load[hot] -= load
        self.shard_load[cold] += load
        return True


def _empty_slot(owner: list[int], shard_id: int, by_slot: Mapping[int, list[str]]) -> int | None:
    for slot in range(len(owner) - 1, -1, -1):
        if owner[slot] == shard_id and not by_slot.get(slot):
            return slot
    return None
