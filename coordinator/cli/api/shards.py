"""``shardq shards map``: the shard map as the coordinator serves it (admin token). The
operator's ``shards`` commands, which change the map in the database, are in
``cli/ops/shards.py``."""

from __future__ import annotations

import argparse
from typing import Any

from shardq.coordinator.cli.api.render import message_dict
from shardq.coordinator.cli.api.request import api_client
from shardq.coordinator.cli.command import Commands
from shardq.coordinator.cli.terminal import print_json, print_table, when
from shardq.v1 import admin_pb2

commands = Commands("api")


def shard_map_dict(m: admin_pb2.ShardMap) -> dict[str, Any]:
    out = message_dict(m)
    for shard in out["shards"]:
        shard["state"] = shard["state"].removeprefix("SHARD_STATE_").lower()
    return out


@commands.add(
    "shards",
    "map",
    help="the shard map as the coordinator serves it (admin token)",
)
def shards_map(args: argparse.Namespace) -> int:
    with api_client(args) as client:
        m = client.shard_map()
    if args.json:
        print_json(shard_map_dict(m))
        return 0
    slots: dict[int, int] = {}
    for r in m.slot_ranges:
        slots[r.shard_id] = slots.get(r.shard_id, 0) + r.end_slot - r.start_slot + 1
    print(f"shard map version {m.version} ({m.slot_count} slots)\n")
    print_table(
        ["SHARD", "ADDRESS", "WEIGHT", "STATE", "SLOTS"],
        [
            [
                s.shard_id,
                s.address,
                s.weight,
                admin_pb2.ShardState.Name(s.state).removeprefix("SHARD_STATE_").lower(),
                slots.get(s.shard_id, 0),
            ]
            for s in m.shards
        ],
    )
    if m.pins:
        print("\npins:")
        print_table(["TENANT", "SHARD"], [[p.tenant_id, p.shard_id] for p in m.pins])
    if m.moves_in_progress:
        print("\nmoves in progress:")
        print_table(
            ["TENANT", "FROM", "TO", "STARTED"],
            [
                [mv.tenant_id, mv.from_shard_id, mv.to_shard_id, when(mv.started_at_unix_ms)]
                for mv in m.moves_in_progress
            ],
        )
    return 0
