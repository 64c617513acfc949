"""``shardq shards ...``: the shard map in the database (init, sync, show, weight) and the
changes that move tenants live (pin, unpin, add, drain, remove). ``shardq shards map``, the
map as the coordinator serves it, is an API command (``cli/api/shards.py``)."""

from __future__ import annotations

import argparse
import os
from collections.abc import AsyncIterator

from redis.asyncio import Redis
from redis.exceptions import RedisError

from shardq.common import config
from shardq.common.placement import DRAINING
from shardq.common.redis import redis_for
from shardq.coordinator.cli.command import CommandError, Commands, arg
from shardq.coordinator.cli.ops.database import engine_for
from shardq.coordinator.cli.ops.placement import (
    PLACEMENT_ARGS,
    SKIP_CHECKS_ARG,
    change_placement,
    checker_for,
    pin,
    unpin,
)
from shardq.coordinator.cli.ops.render import map_as_json, print_map, report_change
from shardq.coordinator.cli.terminal import plural, print_json
from shardq.coordinator.placement import ShardMap
from shardq.coordinator.shardmap import MapNotInitialized, ShardMapStore
from shardq.shard import acl
from shardq.shard.client import ShardClient
from shardq.shard.models import ShardSettings

commands = Commands("database", groups={"shards": "the shard map: shards, weights, slots and pins"})

_ADDRESS_HELP = (
    "a shard's Redis host:port, or its Sentinel group sentinel://h1:26379,h2:26379/MASTER, "
    "once per shard in shard-ID order; or once with {i} in it, expanded for each of --shards "
    "(e.g. shardq-shard-{i}.shardq-shard:6379)"
)

_SHARD_ARGS = (
    arg("--address", action="append", required=True, metavar="HOST:PORT", help=_ADDRESS_HELP),
    arg("--shards", type=int, help="number of shards (default: number of --address)"),
    arg("--weight", action="append", type=int, help="each shard's weight, in order (default 1)"),
    SKIP_CHECKS_ARG,
)


def shard_addresses(args: argparse.Namespace) -> list[str]:
    addresses: list[str] = args.address
    count: int | None = args.shards
    if len(addresses) == 1 and "{i}" in addresses[0]:
        if count is None:
            raise CommandError("--shards is needed with an {i} address template")
        return [addresses[0].replace("{i}", str(i)) for i in range(count)]
    if count is not None and count != len(addresses):
        raise CommandError(f"--shards {count} but {len(addresses)} --address given")
    return addresses


async def _mark_existing(args: argparse.Namespace, smap: ShardMap | None) -> None:
    """Give the map's shards their identity markers if a map made before markers existed
    lacks them (best effort): a later re-point of those shards is then checked by them."""
    checker = checker_for(args)
    if checker is not None and smap is not None:
        await checker.mark_existing([(sid, i.address) for sid, i in sorted(smap.shards.items())])


async def _load_or_none(store: ShardMapStore) -> ShardMap | None:
    try:
        return await store.load()
    except MapNotInitialized:
        return None


@commands.add(
    "shards",
    "init",
    help="create the shard map (a no-op if it already matches)",
    args=(
        *_SHARD_ARGS,
        config.add_redis_password,
        config.add_key_prefix,
        config.add_shard_durability,
    ),
)
async def shards_init(args: argparse.Namespace) -> int:
    addresses = shard_addresses(args)
    async with engine_for(args) as engine:
        store = ShardMapStore(engine, checks=checker_for(args))
        before = await _load_or_none(store)
        await _mark_existing(args, before)
        if before is not None:
            current = [before.shards[i].address for i in sorted(before.shards)]
            if current != addresses:
                raise CommandError(
                    f"the shard map exists with {plural(len(current), 'shard')} "
                    f"({', '.join(current)}); "
                    "use `shardq shards sync` to change it"
                )
        after = await store.sync_shards(addresses, args.weight)
    report_change(before, after)
    return 0


@commands.add(
    "shards",
    "sync",
    help="make shards 0..N-1 have these addresses (and weights); new shards get their slots "
    "and the tenants on those slots move there live",
    args=(*_SHARD_ARGS, *PLACEMENT_ARGS),
)
async def shards_sync(args: argparse.Namespace) -> int:
    addresses = shard_addresses(args)
    async with engine_for(args) as engine:
        before = await _load_or_none(ShardMapStore(engine))
    if before is None:  # a first sync creates the map: no tenant anywhere yet
        async with engine_for(args) as engine:
            store = ShardMapStore(engine, checks=checker_for(args))
            after = await store.sync_shards(addresses, args.weight)
        report_change(before, after)
        return 0
    await _mark_existing(args, before)
    return await change_placement(args, lambda store: store.sync_shards(addresses, args.weight))


@commands.add(
    "shards",
    "show",
    help="print the shard map: shards, slot ranges, pins and moves",
    args=(arg("--json", action="store_true", help="print JSON"),),
)
async def shards_show(args: argparse.Namespace) -> int:
    async with engine_for(args) as engine:
        smap = await ShardMapStore(engine).load()
    if args.json:
        print_json(map_as_json(smap))
    else:
        print_map(smap)
    return 0


@commands.add(
    "shards",
    "weight",
    help="set one shard's weight and move the fewest slots to match (0 empties it)",
    args=(arg("shard_id", type=int), arg("weight", type=int)),
)
async def shards_weight(args: argparse.Namespace) -> int:
    async with engine_for(args) as engine:
        store = ShardMapStore(engine)
        before = await store.load()
        after = await store.set_weight(args.shard_id, args.weight)
    report_change(before, after)
    return 0


@commands.add(
    "shards",
    "pin",
    help="the same as `shardq tenants pin`",
    args=(arg("tenant_id"), arg("shard_id", type=int), *PLACEMENT_ARGS),
)
async def shards_pin(args: argparse.Namespace) -> int:
    return await pin(args)


@commands.add(
    "shards",
    "unpin",
    help="the same as `shardq tenants unpin`",
    args=(arg("tenant_id"), *PLACEMENT_ARGS),
)
async def shards_unpin(args: argparse.Namespace) -> int:
    return await unpin(args)


@commands.add(
    "shards",
    "add",
    help="add a shard (the next ID) and give it its share of slots, moving their tenants live",
    args=(
        arg("address", metavar="HOST:PORT"),
        arg("--weight", type=int, default=1),
        SKIP_CHECKS_ARG,
        *PLACEMENT_ARGS,
    ),
)
async def shards_add(args: argparse.Namespace) -> int:
    return await change_placement(args, lambda store: store.add_shard(args.address, args.weight))


@commands.add(
    "shards",
    "drain",
    help="give a shard's slots to the others, moving its tenants off it live",
    args=(arg("shard_id", type=int), *PLACEMENT_ARGS),
)
async def shards_drain(args: argparse.Namespace) -> int:
    return await change_placement(args, lambda store: store.set_state(args.shard_id, DRAINING))


@commands.add(
    "shards",
    "remove",
    help="take an empty shard (the last ID) out of the map; the slots it owns go to the others",
    args=(
        arg("shard_id", type=int),
        arg(
            "--forget-unreachable",
            action="store_true",
            help="remove it even though it cannot be reached (a mistyped `shards add`): any "
            "job it holds is lost",
        ),
        *PLACEMENT_ARGS,
    ),
)
async def shards_remove(args: argparse.Namespace) -> int:
    forget = args.forget_unreachable
    return await change_placement(
        args, lambda store: store.remove_shard(args.shard_id, forget_unreachable=forget)
    )


@commands.add(
    "shards",
    "set-address",
    help="point a shard at the Redis that now holds its data (it moved host with its "
    "volume, or a replica was promoted); no job moves",
    args=(
        arg("shard_id", type=int),
        arg("address", metavar="HOST:PORT"),
        SKIP_CHECKS_ARG,
        *PLACEMENT_ARGS,
    ),
)
async def shards_set_address(args: argparse.Namespace) -> int:
    async with engine_for(args) as engine:
        await _mark_existing(args, await _load_or_none(ShardMapStore(engine)))
    return await change_placement(
        args, lambda store: store.set_address(args.shard_id, args.address)
    )


@commands.add(
    "shards",
    "acl",
    help="give every shard of the map one Redis ACL user per role (worker, loop, coordinator, "
    "admin), each with only what it needs; passwords from SHARDQ_REDIS_PASSWORD_<ROLE>",
    args=(
        config.add_redis_password,
        config.add_key_prefix,
        arg(
            "--disable-default",
            action="store_true",
            help="then turn Redis's default user off (needs the admin user's password: run "
            "later commands with --redis-username <prefix>-admin)",
        ),
    ),
)
async def shards_acl(args: argparse.Namespace) -> int:
    passwords = _acl_passwords()
    if args.disable_default and "admin" not in passwords:
        raise CommandError(
            "--disable-default needs SHARDQ_REDIS_PASSWORD_ADMIN: without an admin user no one "
            "could change the shards' users again"
        )
    made = acl.users(args.key_prefix, passwords)
    async for shard_id, address, redis in _each_shard(args):
        try:
            how = await acl.apply(redis, made, args.disable_default)
        except RedisError as exc:
            raise CommandError(f"shard {shard_id} ({address}): {exc}") from None
        names = ", ".join(u.name for u in made)
        off = "; default user off" if args.disable_default else ""
        print(f"shard {shard_id} ({address}): {names}{off}; {how}")
    return 0


@commands.add(
    "shards",
    "finalize",
    help="after an upgrade, once every pod runs this release: let each shard of the map write "
    "the newest job format (hashes without their usual-valued fields, and no dedupe key while "
    "a job lives), which releases before 2026-12-05 do not read (docs/deploying.md, "
    "Upgrading). Idempotent; roll back to no older release afterwards",
    args=(config.add_redis_password, config.add_key_prefix),
)
async def shards_finalize(args: argparse.Namespace) -> int:
    settings = ShardSettings(key_prefix=args.key_prefix)
    async for shard_id, address, redis in _each_shard(args):
        try:
            before, after = await ShardClient(redis, settings).raise_job_format()
        except RedisError as exc:
            raise CommandError(f"shard {shard_id} ({address}): {exc}") from None
        done = f"{before} -> {after}" if after != before else f"{after} already"
        print(f"shard {shard_id} ({address}): job format {done}")
    return 0


async def _each_shard(args: argparse.Namespace) -> AsyncIterator[tuple[int, str, Redis]]:
    """Every shard of the map, in ID order, with a connection to its Redis (closed after)."""
    async with engine_for(args) as engine:
        smap = await ShardMapStore(engine).load()
    for shard_id, info in sorted(smap.shards.items()):
        redis = redis_for(info.address, args.redis_password, args.redis_username)
        try:
            yield shard_id, info.address, redis
        finally:
            await redis.aclose()


@commands.add(
    "shards",
    "acl-conf",
    kind="local",
    help="print the redis.conf `user` lines of the ACL users `shards acl` makes (passwords "
    "from SHARDQ_REDIS_PASSWORD_<ROLE>, written as SHA-256): for a Redis to include at start",
    args=(config.add_key_prefix,),
)
def shards_acl_conf(args: argparse.Namespace) -> int:
    passwords = _acl_passwords()
    print(acl.conf_lines(acl.users(args.key_prefix, passwords, hashed=True)), end="")
    return 0


def _acl_passwords() -> dict[str, str]:
    passwords = {
        role: os.environ[acl.password_variable(role)]
        for role in acl.ROLES
        if os.environ.get(acl.password_variable(role))
    }
    if not passwords:
        raise CommandError(
            "no passwords: set SHARDQ_REDIS_PASSWORD_WORKER, _LOOP, _COORDINATOR and _ADMIN "
            "(a role without one gets no user)"
        )
    return passwords
