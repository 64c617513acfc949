"""``shardq moves ...``: the tenant moves in progress (a placement change records them, then
runs them; ``moves run`` resumes what was interrupted)."""

from __future__ import annotations

import argparse

from shardq.coordinator.cli.command import CommandError, Commands, arg
from shardq.coordinator.cli.ops.database import engine_for
from shardq.coordinator.cli.ops.placement import PLACEMENT_ARGS, placement_store, run_moves
from shardq.coordinator.cli.terminal import confirm, print_json, print_table, when
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
    rows = [(m.tenant_id, m.from_shard_id, m.to_shard_id, when(m.started_at_ms))
            for _, m in sorted(smap.moves.items())]  # fmt: skip
    if args.json:
        print_json(
            [dict(zip(("tenant_id", "from", "to", "started"), r, strict=True)) for r in rows]
        )
    else:
        print_table(["TENANT", "FROM", "TO", "STARTED"], rows)
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
        tenants = args.tenant_id or sorted(smap.moves)
        unknown = [t for t in tenants if t not in smap.moves]
        if unknown:
            raise CommandError(f"no move in progress for {', '.join(unknown)}")
        if not tenants:
            print("no moves in progress")
            return 0
        args.no_move = False
        return await run_moves(args, mover, smap, tenants)


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
