"""``shardq rebalance``: even out the shards' load, from each shard's measured tenant load."""

from __future__ import annotations

import argparse

from shardq.coordinator import rebalance
from shardq.coordinator.cli.command import CommandError, Commands, arg
from shardq.coordinator.cli.ops.placement import (
    PLACEMENT_ARGS,
    moves_of_change,
    placement_store,
    settle,
)
from shardq.coordinator.cli.terminal import confirm, print_table

commands = Commands("database")


@commands.add(
    "rebalance",
    help="even out the shards' load: --plan shows slot moves and pins, --apply makes them",
    args=(
        arg("--plan", action="store_true", help="show the plan and change nothing"),
        arg("--apply", action="store_true", help="make the plan's changes (asks unless --yes)"),
        arg("--tolerance", type=float, default=0.1, help="stop within this share of the mean"),
        arg(
            "--repin",
            action="store_true",
            help="let the plan move tenants pinned before (kept where pinned without it)",
        ),
        *PLACEMENT_ARGS,
    ),
)
async def rebalance_cmd(args: argparse.Namespace) -> int:
    if args.plan == args.apply:
        raise CommandError("give --plan or --apply")
    async with placement_store(args) as (store, mover):
        smap = await store.load()
        loads = {sid: await mover.shards.client(info).tenant_loads()
                 for sid, info in sorted(smap.shards.items())}  # fmt: skip
        the_plan = rebalance.plan(smap, loads, args.tolerance, repin=args.repin)
        print_table(
            ["SHARD", "LOAD NOW", "LOAD AFTER"],
            [(s, f"{the_plan.before.get(s, 0):.1f}", f"{the_plan.after.get(s, 0):.1f}")
             for s in sorted(smap.shards)],
        )  # fmt: skip
        if the_plan.empty:
            print("balanced: nothing to move")
            return 0
        print("\n".join(the_plan.steps))
        if args.plan:
            return 0
        if not confirm(args):
            print("nothing changed")
            return 1
        await store.place(the_plan.slot_moves, the_plan.pins)
        if store.committed is None:  # another command placed them meanwhile: no moves here
            print("nothing to change any more: the map already says so (another command "
                  "changed it meanwhile)")  # fmt: skip
            return await settle(args, store, mover, {})
        after = await store.load()
        print(f"shard map version {store.committed - 1} -> {store.committed}")
        return await settle(args, store, mover, moves_of_change(after, store.committed))
