"""What the commands that change where tenants live share (``shards sync|pin|unpin|add|drain|
remove``, ``tenants``, ``moves run``, ``rebalance``): their flags, the preview they ask about,
and the live moves of the tenants the change relocates."""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

from redis.exceptions import RedisError

from shardq.common import config
from shardq.coordinator.cli.command import CommandError, arg
from shardq.coordinator.cli.ops.database import database_url, engine_for
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
from shardq.coordinator.moverd import MoverLease, lease_holder, run_under_lease
from shardq.coordinator.placement import ShardMap, TenantMove
from shardq.coordinator.shardcheck import ShardChecker
from shardq.coordinator.shardmap import MoverLeaseLost, Preview, ShardMapStore
from shardq.shard.models import ShardSettings

PLACEMENT_ARGS = (
    config.add_redis_password,
    config.add_key_prefix,
    config.add_shard_durability,
    arg("--yes", "-y", action="store_true", help="do it without asking"),
    arg(
        "--no-move",
        action="store_true",
        help="record the moves and return: the coordinators' mover runs them",
    ),
    arg(
        "--wait",
        action="store_true",
        help="watch this change's moves until done (run them here if no coordinator runs moves)",
    ),
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
    return ShardChecker(args.redis_password, shard_settings(args))


def shard_settings(args: argparse.Namespace) -> ShardSettings:
    """The shard settings of an operator command: its key prefix, and the durability it asks
    for (``--shard-replicas-to-ack``) where it takes that flag."""
    if not hasattr(args, "shard_replicas_to_ack"):
        return ShardSettings(
            key_prefix=args.key_prefix, redis_username=getattr(args, "redis_username", "")
        )
    return ShardSettings(
        key_prefix=args.key_prefix,
        durability=config.durability(args),
        redis_username=getattr(args, "redis_username", ""),
    )


@asynccontextmanager
async def placement_store(args: argparse.Namespace) -> AsyncIterator[tuple[ShardMapStore, Mover]]:
    settings = shard_settings(args)
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
    """Show what ``change`` would do (its moves included), ask, do it, then see its moves (and
    only its moves) through (:func:`settle`)."""
    async with placement_store(args) as (store, mover):
        before = await store.load()
        store.preview = True
        try:
            await change(store)
            after = before
        except Preview as preview:
            # Compared with the map the change started from: another command's change
            # committed since ``before`` was read is not this one's to show.
            before, after = preview.before or before, preview.after
        finally:
            store.preview = False
        lines = describe_change(before, after)
        if not lines:
            print(f"nothing to change (shard map version {before.version})")
            return await settle(args, store, mover, {})  # names any others pending
        print("\n".join(lines))
        if not confirm(args):
            print("nothing changed")
            return 1
        await change(store)
        # The version this change committed as, never the map's current one: a change that
        # found nothing left to do (another command made it while this one asked) has no
        # moves, and the current version may be another command's, with its moves.
        version = store.committed
        if version is None:
            print("nothing to change any more: the map already says so (another command "
                  "changed it meanwhile)")  # fmt: skip
            return await settle(args, store, mover, {})
        smap = await store.load()
        print(f"shard map version {version - 1} -> {version}")
        return await settle(args, store, mover, moves_of_change(smap, version))


def moves_of_change(smap: ShardMap, version: int) -> dict[str, TenantMove]:
    """The moves the change that committed as map ``version`` recorded (and not yet done)."""
    return {t: m for t, m in sorted(smap.moves.items()) if m.change_version == version}


async def settle(
    args: argparse.Namespace,
    store: ShardMapStore,
    mover: Mover,
    moves: Mapping[str, TenantMove],
    *,
    run_here: bool = False,
) -> int:
    """See ``moves`` (one command's) through: the cluster's mover runs them (``--wait``:
    watch until done), or, when no mover runs, this command does; 1 when any is left.

    Moves of other changes pending meanwhile are named, never run or waited for here.
    ``run_here`` (``moves run``): run them here whenever the lease is free."""
    smap = await store.load()
    others = sorted(t for t in smap.moves if t not in moves)
    if others:
        print(f"{plural(len(others), 'other move')} in progress, not this command's "
              f"({_names(others)}): `shardq moves list`")  # fmt: skip
    if not moves:
        return 0
    if getattr(args, "no_move", False):
        print(f"{plural(len(moves), 'move')} recorded; the coordinators' mover runs them "
              f"(`shardq moves wait {_names(list(moves), ' ')}` watches)")  # fmt: skip
        return 0
    dsn = database_url(args)
    holder = await lease_holder(dsn)
    if holder is not None and not getattr(args, "wait", False) and not run_here:
        watch = f"`shardq moves wait {_names(list(moves), ' ')}`"
        print(f"{plural(len(moves), 'move')} recorded: the cluster's mover ({holder.name}) runs "
              f"them; watch with {watch} (or `--wait`)")  # fmt: skip
        return 0
    return await run_or_watch(dsn, store, mover, moves)


def _names(tenants: Sequence[str], sep: str = ", ") -> str:
    return sep.join(tenants[:5]) + (f"{sep}..." if len(tenants) > 5 else "")


async def run_or_watch(
    dsn: str, store: ShardMapStore, mover: Mover, moves: Mapping[str, TenantMove]
) -> int:
    """Until ``moves`` are done: run them here while the mover lease is free, else watch the
    mover that holds it (a coordinator, or another command running its own moves)."""
    lease = MoverLease(dsn, f"shardq cli {socket.gethostname()}:{os.getpid()}")
    total, shown_holder, shown_left = len(moves), "", -1
    while True:
        smap = await store.load()
        left = [t for t, m in moves.items() if smap.moves.get(t) == m]
        if not left:
            # A move whose tenant is placed back on its source was aborted, not done.
            aborted = [t for t, m in moves.items() if smap.shard_for(t) != m.to_shard_id]
            if aborted:
                print(f"{plural(len(aborted), 'move')} aborted meanwhile ({_names(aborted)})")
            print(f"{plural(total - len(aborted), 'move')} done")
            return 0
        if not await lease_holder(dsn):
            resumes = "the coordinators' mover, or `shardq moves run`, resumes"
            print(f"moving {plural(len(left), 'tenant')} here (interrupt any time: {resumes})",
                  flush=True)  # fmt: skip
            try:
                reports = await run_under_lease(mover, lease, left)
            except MoverLeaseLost:
                # Its session ended (Postgres restarted, the connection cut, an operator's
                # pg_terminate_backend): another mover may hold the lease now. This pass has
                # stopped; what it did stays for whichever mover holds the lease next.
                print("the mover lease was lost: stopped moving here", flush=True)
                continue
            if reports is not None:
                unfinished = [r for r in reports if not r.finished]
                for r in unfinished:
                    print(f"  {r.tenant}: not finished, waiting for {r.waiting_for}",
                          file=sys.stderr)  # fmt: skip
                if unfinished:
                    return 1
                continue
        holder = await lease_holder(dsn)
        if holder is not None and holder.name != shown_holder:
            shown_holder = holder.name
            print(f"{holder.name} holds the mover lease and runs the moves; waiting for "
                  f"{plural(len(left), 'move')} of this command (interrupting stops the "
                  "waiting, not the moves)", flush=True)  # fmt: skip
        if len(left) != shown_left:
            shown_left = len(left)
            print(f"  {total - len(left)}/{total} moves done", flush=True)
        await asyncio.sleep(WATCH_POLL_S)


#: How often a command watching moves reads the map, in seconds.
WATCH_POLL_S = 0.5


async def pin(args: argparse.Namespace) -> int:
    """``tenants pin``, ``tenants move`` and ``shards pin``."""
    return await change_placement(args, lambda store: store.pin(args.tenant_id, args.shard_id))


async def unpin(args: argparse.Namespace) -> int:
    """``tenants unpin`` and ``shards unpin``."""
    return await change_placement(args, lambda store: store.unpin(args.tenant_id))
