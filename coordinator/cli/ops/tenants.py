"""``shardq tenants ...``: where tenants live. Pinning a tenant to a shard, or unpinning it,
moves its jobs there live (``cli/ops/placement.py``)."""

from __future__ import annotations

import argparse

from shardq.coordinator.cli.command import Commands, arg
from shardq.coordinator.cli.ops.placement import PLACEMENT_ARGS, pin, unpin

commands = Commands(
    "database",
    groups={
        "tenants": "where tenants live: pin, unpin, move (their jobs move live), on the "
        "database; their limits: limits, set, through the API"
    },
)


@commands.add(
    "tenants",
    "pin",
    help="place a tenant on a shard whatever its slot says, moving its jobs there live",
    args=(arg("tenant_id"), arg("shard_id", type=int), *PLACEMENT_ARGS),
)
async def tenants_pin(args: argparse.Namespace) -> int:
    return await pin(args)


@commands.add(
    "tenants",
    "move",
    help="move a tenant (and its jobs, live) to a shard: pins it there",
    args=(arg("tenant_id"), arg("shard_id", type=int), *PLACEMENT_ARGS),
)
async def tenants_move(args: argparse.Namespace) -> int:
    return await pin(args)


@commands.add(
    "tenants",
    "unpin",
    help="return a tenant to the shard its slot maps to, moving its jobs back live",
    args=(arg("tenant_id"), *PLACEMENT_ARGS),
)
async def tenants_unpin(args: argparse.Namespace) -> int:
    return await unpin(args)
