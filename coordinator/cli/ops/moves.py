"""``shardq moves ...``: the tenant moves in progress (a placement change records them, then
runs them; ``moves run`` resumes what was interrupted)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from shardq.coordinator.cli.command import CommandError, Commands, arg
from shardq.coordinator.cli.ops.database import database_url, engine_for
from shardq.coordinator.cli.ops.placement import (
    PLACEMENT_ARGS,
    placement_store,
    run_or_watch,
    settle,
)
from shardq.coordinator.cli.terminal import confirm, print_json, print_table, when
from shardq.coordinator.moverd import lease_holder
from shardq.coordinator.placement import ShardMap, TenantMove
from shardq.coordinator.shardmap import ShardMapStore

commands = Commands("database", groups={"moves": "tenant moves in progress"})


@commands.add(
    "moves",
    "list",
    help="the tenant moves in progress",
    args=(arg("--json", action="store_true", help="print JSON"),),
)
async def moves_list(args: argparse.Namespace) -> int:
    async with engine_for(args) as engine:
        smap = await ShardMapStore(engine).load()
    holder = await lease_holder(database_url(args))
    rows = [(m.tenant_id, m.from_shard_id, m.to_shard_id, when(m.started_at_ms),
             m.change_version or "-") for _, m in sorted(smap.moves.items())]  # fmt: skip
    if args.json:
        names = ("tenant_id", "from", "to", "started", "change")
        print_json([dict(zip(names, r, strict=True)) for r in rows])
    else:
        print_table(["TENANT", "FROM", "TO", "STARTED", "CHANGE"], rows)
        if rows:
            # Who runs them: the holder of the mover lease (coordinator.moverd), if anyone.
            print(f"mover: {holder.name}" if holder else
                  "mover: none (no coordinator runs moves: `shardq moves run`)")  # fmt: skip
    return 0


@commands.add(
    "moves",
    "run",
    help="carry out the moves in progress (all, or these tenants'); safe to re-run",
    args=(arg("tenant_id", nargs="*"), *PLACEMENT_ARGS),
)
async def moves_run(args: argparse.Namespace) -> int:
    async with placement_store(args) as (store, mover):
        smap = await store.load()
        moves = _chosen(smap, args.tenant_id)
        if not moves:
            print("no moves in progress")
            return 0
        args.no_move = False
        return await settle(args, store, mover, moves, run_here=True)


def _chosen(smap: ShardMap, tenants: Sequence[str]) -> dict[str, TenantMove]:
    unknown = [t for t in tenants if t not in smap.moves]
    if unknown:
        raise CommandError(f"no move in progress for {', '.join(unknown)}")
    return {t: m for t, m in sorted(smap.moves.items()) if not tenants or t in tenants}


@commands.add(
    "moves",
    "wait",
    help="watch the moves in progress (all, or these tenants') until they are done; the "
    "coordinators' mover runs them (or this command, when none does)",
    args=(arg("tenant_id", nargs="*"), *PLACEMENT_ARGS),
)
async def moves_wait(args: argparse.Namespace) -> int:
    async with placement_store(args) as (store, mover):
        moves = _chosen(await store.load(), args.tenant_id)
        if not moves:
            print("no moves in progress")
            return 0
        return await run_or_watch(database_url(args), store, mover, moves)


@commands.add(
    "moves",
    "abort",
    help="undo the moves in progress (all, or these tenants') that have not copied anything "
    "yet: each tenant goes back to its source shard",
    args=(arg("tenant_id", nargs="*"), *PLACEMENT_ARGS),
)
async def moves_abort(args: argparse.Namespace) -> int:
    async with placement_store(args) as (store, _):
        before = await store.load()
        if not before.moves:
            print("no moves in progress")
            return 0
        tenants = args.tenant_id or None
        chosen = sorted(args.tenant_id or before.moves)
        print("\n".join(f"abort move of tenant {t}: back to shard {before.moves[t].from_shard_id}"
                        for t in chosen if t in before.moves))  # fmt: skip
        if not confirm(args):
            print("nothing changed")
            return 1
        after = await store.abort_moves(tenants)
    print(f"shard map version {before.version} -> {after.version}")
    return 0
