"""What the commands that change where tenants live share (``shards sync|pin|unpin|add|drain|
remove``, ``tenants``, ``moves run``, ``rebalance``): their flags, the preview they ask about,
and the live moves of the tenants the change relocates."""

from __future__ import annotations

import argparse
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

from shardq.common import config
from shardq.coordinator.cli.command import arg
from shardq.coordinator.cli.ops.database import engine_for
from shardq.coordinator.cli.ops.render import describe_change
from shardq.coordinator.cli.terminal import confirm
from shardq.coordinator.mover import Mover, MoveReport, RedisShards
from shardq.coordinator.placement import ShardMap
from shardq.coordinator.shardmap import Preview, ShardMapStore
from shardq.shard.models import ShardSettings

PLACEMENT_ARGS = (
    config.add_redis_password,
    config.add_key_prefix,
    arg("--yes", "-y", action="store_true", help="do it without asking"),
    arg("--no-move", action="store_true", help="record the moves, do not run them now"),
    arg(
        "--map-only",
        action="store_true",
        help="change the map without reaching the shards: no tenant is moved (only for a "
        "cluster that holds no jobs yet)",
    ),
    arg(
        "--active-wait-s",
        type=float,
        default=300.0,
        help="how long the mover waits for a tenant's running jobs on the source (s)",
    ),
)


@asynccontextmanager
async def placement_store(args: argparse.Namespace) -> AsyncIterator[tuple[ShardMapStore, Mover]]:
    settings = ShardSettings(key_prefix=args.key_prefix)
    shards = RedisShards(args.redis_password, settings)
    try:
        async with engine_for(args) as engine:
            store = ShardMapStore(engine, None if args.map_only else shards)
            yield store, Mover(store, shards, active_wait_s=args.active_wait_s,
                               progress=_print_progress)  # fmt: skip
    finally:
        await shards.close()


def _print_progress(r: MoveReport) -> None:
    state = "done" if r.finished else f"waiting for {r.waiting_for}" if r.waiting_for else "..."
    print(f"  {r.tenant}: shard {r.from_shard_id} -> {r.to_shard_id}: {r.jobs} jobs, "
          f"{r.dedupe_keys} dedupe keys, {r.schedules} schedules; {state}", flush=True)  # fmt: skip


async def change_placement(
    args: argparse.Namespace, change: Callable[[ShardMapStore], Awaitable[Any]]
) -> int:
    """Show what ``change`` would do (its moves included), ask, do it, then run its moves."""
    async with placement_store(args) as (store, mover):
        before = await store.load()
        store.preview = True
        try:
            await change(store)
            after = before
        except Preview as preview:
            after = preview.after
        finally:
            store.preview = False
        lines = describe_change(before, after)
        if not lines:
            print(f"nothing to change (shard map version {before.version})")
            return 0
        print("\n".join(lines))
        if not confirm(args):
            print("nothing changed")
            return 1
        await change(store)
        smap = await store.load()
        print(f"shard map version {before.version} -> {smap.version}")
        return await run_moves(args, mover, smap, [t for t in smap.moves if t not in before.moves])


async def run_moves(
    args: argparse.Namespace, mover: Mover, smap: ShardMap, tenants: Sequence[str]
) -> int:
    """Move ``tenants`` now (unless ``--no-move``); 1 when any is left unfinished."""
    if not tenants:
        return 0
    if getattr(args, "no_move", False):
        print(f"{len(tenants)} moves recorded; run them with `shardq moves run`")
        return 0
    print(f"moving {len(tenants)} tenants (interrupt any time: `shardq moves run` resumes)")
    reports = await mover.run(tenants)
    left = [r for r in reports if not r.finished]
    for r in left:
        print(f"  {r.tenant}: not finished, waiting for {r.waiting_for}", file=sys.stderr)
    return 1 if left else 0


async def pin(args: argparse.Namespace) -> int:
    """``tenants pin``, ``tenants move`` and ``shards pin``."""
    return await change_placement(args, lambda store: store.pin(args.tenant_id, args.shard_id))


async def unpin(args: argparse.Namespace) -> int:
    """``tenants unpin`` and ``shards unpin``."""
    return await change_placement(args, lambda store: store.unpin(args.tenant_id))
