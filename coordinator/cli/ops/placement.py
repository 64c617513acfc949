"""What the commands that change where tenants live share (``shards sync|pin|unpin|add|drain|
remove``, ``tenants``, ``moves run``, ``rebalance``): their flags, the preview they ask about,
and the live moves of the tenants the change relocates."""

from __future__ import annotations

import argparse
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

from redis.exceptions import RedisError

from shardq.common import config
from shardq.coordinator.cli.command import CommandError, arg
from shardq.coordinator.cli.ops.database import engine_for
from shardq.coordinator.cli.ops.render import describe_change
from shardq.coordinator.cli.terminal import confirm, plural
from shardq.coordinator.errors import SHARD_ID_ATTR
from shardq.coordinator.mover import (
    Mover,
    MoveReport,
    MovesFailed,
    RedisShards,
    describe_shard_error,
)
from shardq.coordinator.placement import ShardMap
from shardq.coordinator.shardcheck import ShardChecker
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


#: The flag of the commands that give the map a new or changed address (init, sync, add,
#: set-address): each is checked first (``coordinator.shardcheck``).
SKIP_CHECKS_ARG = arg(
    "--skip-checks",
    action="store_true",
    help="do not check the new addresses first (a Redis that refuses INFO): an address that "
    "is down, not Redis, without appendonly, evicting or holding other data is then taken "
    "as is (see docs/operating.md)",
)


def checker_for(args: argparse.Namespace) -> ShardChecker | None:
    """The address checks a command makes, None with ``--skip-checks``."""
    if getattr(args, "skip_checks", False):
        return None
    return ShardChecker(args.redis_password, ShardSettings(key_prefix=args.key_prefix))


@asynccontextmanager
async def placement_store(args: argparse.Namespace) -> AsyncIterator[tuple[ShardMapStore, Mover]]:
    settings = ShardSettings(key_prefix=args.key_prefix)
    shards = RedisShards(args.redis_password, settings)
    try:
        async with engine_for(args) as engine:
            store = ShardMapStore(engine, None if args.map_only else shards, checker_for(args))
            yield store, Mover(store, shards, active_wait_s=args.active_wait_s,
                               progress=_print_progress)  # fmt: skip
    except MovesFailed as exc:
        raise CommandError(str(exc)) from None
    except (RedisError, OSError) as exc:
        # A shard that cannot be reached (or is not Redis): one line naming it, no traceback.
        if getattr(exc, SHARD_ID_ATTR, None) is None:
            raise
        raise CommandError(describe_shard_error(exc)) from None
    finally:
        await shards.close()


def _print_progress(r: MoveReport) -> None:
    state = "done" if r.finished else f"waiting for {r.waiting_for}" if r.waiting_for else "..."
    counts = ((r.jobs, "job"), (r.dedupe_keys, "dedupe key"), (r.schedules, "schedule"))
    moved = ", ".join(plural(n, noun) for n, noun in counts)
    print(f"  {r.tenant}: shard {r.from_shard_id} -> {r.to_shard_id}: {moved}; {state}", flush=True)


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
        print(f"{plural(len(tenants), 'move')} recorded; run them with `shardq moves run`")
        return 0
    moving = plural(len(tenants), "tenant")
    print(f"moving {moving} (interrupt any time: `shardq moves run` resumes)")
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
