"""How the operator's commands show a shard map (``shardq shards show``) and a change to it
(the lines a placement change asks about, the version line after it)."""

from __future__ import annotations

from typing import Any

from shardq.common.placement import SLOT_COUNT
from shardq.coordinator.cli.terminal import plural, print_table
from shardq.coordinator.placement import ShardMap


def map_as_json(smap: ShardMap) -> dict[str, Any]:
    counts = smap.slot_counts()
    return {
        "version": smap.version,
        "slot_count": SLOT_COUNT,
        "shards": [
            {
                "shard_id": s.shard_id,
                "address": s.address,
                "weight": s.weight,
                "state": s.state,
                "slots": counts.get(s.shard_id, 0),
            }
            for s in sorted(smap.shards.values(), key=lambda s: s.shard_id)
        ],
        "slot_ranges": [
            {"first": first, "last": last, "shard_id": sid}
            for first, last, sid in smap.slot_ranges()
        ],
        "pins": dict(sorted(smap.pins.items())),
        "moves": [
            {
                "tenant_id": m.tenant_id,
                "from_shard_id": m.from_shard_id,
                "to_shard_id": m.to_shard_id,
                "started_at_ms": m.started_at_ms,
            }
            for m in sorted(smap.moves.values(), key=lambda m: m.tenant_id)
        ],
    }


def print_map(smap: ShardMap) -> None:
    counts = smap.slot_counts()
    print(f"shard map version {smap.version} ({SLOT_COUNT} slots)\n")
    print_table(
        ["SHARD", "ADDRESS", "WEIGHT", "STATE", "SLOTS", "SHARE", "PINNED"],
        [
            [
                s.shard_id,
                s.address,
                s.weight,
                s.state,
                counts.get(s.shard_id, 0),
                f"{100 * counts.get(s.shard_id, 0) / SLOT_COUNT:.1f}%",
                len(smap.tenants_pinned_to(s.shard_id)),
            ]
            for s in sorted(smap.shards.values(), key=lambda s: s.shard_id)
        ],
    )
    print("\nslot ranges:")
    print_table(["FIRST", "LAST", "SHARD"], smap.slot_ranges())
    if smap.pins:
        print("\npins:")
        print_table(["TENANT", "SHARD"], sorted(smap.pins.items()))
    if smap.moves:
        print("\nmoves in progress:")
        print_table(
            ["TENANT", "FROM", "TO", "STARTED_AT_MS"],
            [
                [m.tenant_id, m.from_shard_id, m.to_shard_id, m.started_at_ms]
                for m in sorted(smap.moves.values(), key=lambda m: m.tenant_id)
            ],
        )


def report_change(before: ShardMap | None, after: ShardMap) -> None:
    if before is not None and before.version == after.version:
        print(f"shard map unchanged at version {after.version}")
        return
    moved = (
        SLOT_COUNT
        if before is None
        else sum(a != b for a, b in zip(before.slots, after.slots, strict=True))
    )
    print(
        f"shard map version {before.version if before else 0} -> {after.version}: "
        f"{plural(len(after.shards), 'shard')}, {plural(moved, 'slot')} assigned anew"
    )


def describe_change(before: ShardMap, after: ShardMap) -> list[str]:
    """What a change does, line by line, for the confirmation prompt."""
    lines = []
    for sid in sorted(after.shards.keys() - before.shards.keys()):
        lines.append(f"add shard {sid} at {after.shards[sid].address}")
    for sid in sorted(before.shards.keys() - after.shards.keys()):
        lines.append(f"remove shard {sid} ({before.shards[sid].address})")
    for sid in sorted(before.shards.keys() & after.shards.keys()):
        a, b = before.shards[sid], after.shards[sid]
        if a.address != b.address:
            lines.append(
                f"shard {sid}: address {a.address} -> {b.address} (the same data at a new "
                "address; no job moves)"
            )
        if (a.weight, a.state) != (b.weight, b.state):
            lines.append(f"shard {sid}: weight {a.weight} -> {b.weight}, {a.state} -> {b.state}")
    flows: dict[tuple[int, int], int] = {}
    for old, new in zip(before.slots, after.slots, strict=True):
        if old != new:
            flows[(old, new)] = flows.get((old, new), 0) + 1
    lines += [f"{plural(n, 'slot')} shard {a} -> {b}" for (a, b), n in sorted(flows.items())]
    for tenant in sorted(before.pins.keys() | after.pins.keys()):
        if before.pins.get(tenant) != after.pins.get(tenant):
            where = after.pins.get(tenant)
            lines.append(
                f"pin {tenant} to shard {where}" if where is not None else f"unpin {tenant}"
            )
    new_moves = [m for t, m in sorted(after.moves.items()) if t not in before.moves]
    lines += [f"move tenant {m.tenant_id}: shard {m.from_shard_id} -> {m.to_shard_id} (live)"
              for m in new_moves]  # fmt: skip
    return lines
