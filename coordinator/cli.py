"""``shardq``: the command line for operators (schema, shard map, tokens) and for people
using the API (submit, get, cancel, watch and list jobs, dead letters, schedules, stats).

Each subcommand is one function registered with :func:`command`, which names its path
(``("shards", "sync")``) and arguments; :func:`build_parser` builds the argparse tree from the
table, so adding a subcommand is adding one decorated function in any module imported here.
Commands that touch Postgres get ``--database-url`` (``SHARDQ_DATABASE_URL``); plain
``postgresql://`` URLs are accepted. Commands that call the API get ``--coordinator``
(``SHARDQ_COORDINATOR``), ``--token`` (``SHARDQ_TOKEN``), ``--tenant``, ``--tls`` and
``--ca-file``; their errors print one line, ``error: CODE: message``, and exit 1. Every
command has ``--json`` for scripts (one JSON document on stdout).
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import grpc
from google.protobuf import json_format
from google.protobuf.message import Message
from sqlalchemy.exc import OperationalError, ProgrammingError
from sqlalchemy.ext.asyncio import AsyncEngine

from shardq.client import Client, RetryPolicy, job_spec
from shardq.common import config
from shardq.common.errors import InvalidArgument, ShardqError, Unauthenticated
from shardq.common.placement import DRAINING, SLOT_COUNT
from shardq.coordinator import rebalance
from shardq.coordinator.errors import CODES
from shardq.coordinator.mover import Mover, MoveReport, RedisShards
from shardq.coordinator.placement import ShardMap
from shardq.coordinator.shardmap import MapNotInitialized, Preview, ShardMapStore
from shardq.coordinator.tokens import TokenStore
from shardq.coordinator.tools import demo, dev
from shardq.shard.models import ShardSettings
from shardq.store import db
from shardq.store.migrate import head_revision, upgrade
from shardq.v1 import admin_pb2, common_pb2

Handler = Callable[[argparse.Namespace], int | Awaitable[int]]


@dataclass(frozen=True)
class Arg:
    """One ``parser.add_argument(*flags, **options)`` call, declared next to its command."""

    flags: tuple[str, ...]
    options: dict[str, Any] = field(default_factory=dict)


def arg(*flags: str, **options: Any) -> Arg:
    return Arg(flags, options)


@dataclass(frozen=True)
class Command:
    path: tuple[str, ...]
    help: str
    run: Handler
    args: tuple[Arg, ...] = ()
    needs_database: bool = True
    #: Calls the coordinator's API: gets the connection options, errors as gRPC codes.
    calls_api: bool = False


#: Every subcommand, in the order ``--help`` lists them.
COMMANDS: list[Command] = []
#: Help for the intermediate words of command paths (``shardq shards --help``).
GROUPS: dict[tuple[str, ...], str] = {
    ("shards",): "the shard map: shards, weights, slots and pins",
    ("tokens",): "bearer tokens for tenants, admins and workers",
    ("jobs",): "a tenant's jobs",
    ("dead",): "a tenant's dead-letter set",
    ("schedules",): "a tenant's recurring schedules",
    ("tenants",): "where tenants live: pin, unpin, move (their jobs move live)",
    ("moves",): "tenant moves in progress",
}


def command(
    *path: str,
    help: str,
    args: Sequence[Arg] = (),
    needs_database: bool = True,
    calls_api: bool = False,
) -> Callable[[Handler], Handler]:
    """Register the decorated function as ``shardq <path...>``; it returns the exit code."""

    def register(run: Handler) -> Handler:
        COMMANDS.append(
            Command(
                tuple(path), help, run, tuple(args), needs_database and not calls_api, calls_api
            )
        )
        return run

    return register


class CommandError(Exception):
    """A failure to report as one line on stderr (exit code 1), never a traceback."""


# -- plumbing ---------------------------------------------------------------------------------


def _database_parent() -> argparse.ArgumentParser:
    parent = argparse.ArgumentParser(add_help=False)
    config.add(parent, "--database-url", "", "Postgres URL (postgresql://user@host/db)")
    return parent


def _api_parent() -> argparse.ArgumentParser:
    parent = argparse.ArgumentParser(add_help=False)
    config.add(parent, "--coordinator", "127.0.0.1:50051", "the coordinator's host:port")
    config.add(parent, "--token", "", "bearer token (a tenant's, or the admin token)")
    parent.add_argument(
        "--tenant", default="", help="tenant to act on (required with the admin token)"
    )
    parent.add_argument("--tls", action="store_true", help="connect with TLS (system CAs)")
    parent.add_argument("--ca-file", default="", help="PEM CA to verify the server (implies TLS)")
    parent.add_argument("--json", action="store_true", help="print one JSON document")
    return parent


def build_parser(commands: Sequence[Command] | None = None) -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(
        prog="shardq",
        description="shardq: jobs, dead letters, schedules and stats through the API; "
        "schema, shard map and tokens in the database",
    )
    database = _database_parent()
    api = _api_parent()
    groups: dict[tuple[str, ...], argparse._SubParsersAction[argparse.ArgumentParser]] = {
        (): root.add_subparsers(dest="command", metavar="COMMAND", required=True)
    }
    for cmd in COMMANDS if commands is None else commands:
        for depth in range(1, len(cmd.path)):
            prefix = cmd.path[:depth]
            if prefix not in groups:
                text = GROUPS.get(prefix, "")
                group = groups[prefix[:-1]].add_parser(prefix[-1], help=text, description=text)
                groups[prefix] = group.add_subparsers(
                    dest=f"command_{depth}", metavar="COMMAND", required=True
                )
        parser = groups[cmd.path[:-1]].add_parser(
            cmd.path[-1],
            help=cmd.help,
            description=cmd.help,
            parents=[database] if cmd.needs_database else [api] if cmd.calls_api else [],
        )
        for a in cmd.args:
            parser.add_argument(*a.flags, **a.options)
        # Not "handler": that is an argument of submit and schedules create.
        parser.set_defaults(run_command=cmd.run, calls_api=cmd.calls_api)
    return root


def database_url(args: argparse.Namespace) -> str:
    url = str(getattr(args, "database_url", "") or "")
    if not url:
        raise CommandError("no database: pass --database-url or set SHARDQ_DATABASE_URL")
    return db.sqlalchemy_url(url)


@asynccontextmanager
async def engine_for(args: argparse.Namespace) -> AsyncIterator[AsyncEngine]:
    engine = db.make_engine(database_url(args))
    try:
        yield engine
    finally:
        await engine.dispose()


def print_json(value: object) -> None:
    print(json.dumps(value, indent=2, default=str))


def print_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    for row in cells:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


def _describe(exc: BaseException) -> str:
    if isinstance(exc, ProgrammingError | OperationalError):
        # The driver's message only: its first line says it; SQL and hints follow.
        reason = str(exc.orig).strip().splitlines()[0]
        if isinstance(exc, ProgrammingError) and "does not exist" in reason:
            return f"the schema is missing or old ({reason}); run `shardq migrate` first"
        return f"database error: {reason}"
    return str(exc)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        result = args.run_command(args)
        if inspect.isawaitable(result):
            result = asyncio.run(_await(result))
        return int(result)
    except grpc.RpcError as exc:
        code, details = _rpc_error(exc)
        print(f"error: {code}: {details}", file=sys.stderr)
        return 1
    except (CommandError, ShardqError, ValueError, OperationalError, ProgrammingError) as exc:
        if getattr(args, "calls_api", False):
            status = CODES.get(type(exc)) if isinstance(exc, ShardqError) else None
            code = (status or grpc.StatusCode.INVALID_ARGUMENT).name
            print(f"error: {code}: {exc}", file=sys.stderr)
        else:
            print(f"shardq: error: {_describe(exc)}", file=sys.stderr)
        return 1


def _rpc_error(exc: grpc.RpcError) -> tuple[str, str]:
    if isinstance(exc, grpc.aio.AioRpcError | grpc.Call):
        code, details = exc.code(), exc.details()
    else:
        code, details = None, None
    # One line: a connection failure's details can span several.
    text = " ".join(str(details or exc).split())
    return (code.name if code is not None else "UNKNOWN"), text


async def _await(result: Awaitable[int]) -> int:
    return await result


# -- shardq migrate ---------------------------------------------------------------------------


@command("migrate", help="create or upgrade the coordinator's tables (safe to repeat or race)")
def migrate(args: argparse.Namespace) -> int:
    upgrade(database_url(args))
    print(f"schema at revision {head_revision()}")
    return 0


# -- shardq shards ... ------------------------------------------------------------------------

_ADDRESS_HELP = (
    "a shard's Redis host:port, once per shard in shard-ID order; or once with {i} in it, "
    "expanded for each of --shards (e.g. shardq-shard-{i}.shardq-shard:6379)"
)
_PLACEMENT_ARGS = (
    arg(
        "--redis-password",
        default=os.environ.get("SHARDQ_REDIS_PASSWORD", ""),
        help="password of the shards' Redis [SHARDQ_REDIS_PASSWORD]",
    ),
    arg(
        "--key-prefix",
        default=os.environ.get("SHARDQ_KEY_PREFIX", "shardq"),
        help="the shards' key prefix [SHARDQ_KEY_PREFIX; default 'shardq']",
    ),
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


_SHARD_ARGS = (
    arg("--address", action="append", required=True, metavar="HOST:PORT", help=_ADDRESS_HELP),
    arg("--shards", type=int, help="number of shards (default: number of --address)"),
    arg("--weight", action="append", type=int, help="each shard's weight, in order (default 1)"),
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
        f"{len(after.shards)} shards, {moved} slots assigned anew"
    )


async def _load_or_none(store: ShardMapStore) -> ShardMap | None:
    try:
        return await store.load()
    except MapNotInitialized:
        return None


@command(
    "shards", "init", help="create the shard map (a no-op if it already matches)", args=_SHARD_ARGS
)
async def shards_init(args: argparse.Namespace) -> int:
    addresses = shard_addresses(args)
    async with engine_for(args) as engine:
        store = ShardMapStore(engine)
        before = await _load_or_none(store)
        if before is not None:
            current = [before.shards[i].address for i in sorted(before.shards)]
            if current != addresses:
                raise CommandError(
                    f"the shard map exists with {len(current)} shards ({', '.join(current)}); "
                    "use `shardq shards sync` to change it"
                )
        after = await store.sync_shards(addresses, args.weight)
    report_change(before, after)
    return 0


@command(
    "shards",
    "sync",
    help="make shards 0..N-1 have these addresses (and weights); new shards get their slots "
    "and the tenants on those slots move there live",
    args=(*_SHARD_ARGS, *_PLACEMENT_ARGS),
)
async def shards_sync(args: argparse.Namespace) -> int:
    addresses = shard_addresses(args)
    async with engine_for(args) as engine:
        before = await _load_or_none(ShardMapStore(engine))
    if before is None:  # a first sync creates the map: no tenant anywhere yet
        async with engine_for(args) as engine:
            after = await ShardMapStore(engine).sync_shards(addresses, args.weight)
        report_change(before, after)
        return 0
    return await change_placement(args, lambda store: store.sync_shards(addresses, args.weight))


@command(
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


@command(
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


# -- placement changes that move tenants --------------------------------------------------


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


def describe_change(before: ShardMap, after: ShardMap) -> list[str]:
    """What a change does, line by line, for the confirmation prompt."""
    lines = []
    for sid in sorted(after.shards.keys() - before.shards.keys()):
        lines.append(f"add shard {sid} at {after.shards[sid].address}")
    for sid in sorted(before.shards.keys() - after.shards.keys()):
        lines.append(f"remove shard {sid} ({before.shards[sid].address})")
    for sid in sorted(before.shards.keys() & after.shards.keys()):
        a, b = before.shards[sid], after.shards[sid]
        if (a.weight, a.state) != (b.weight, b.state):
            lines.append(f"shard {sid}: weight {a.weight} -> {b.weight}, {a.state} -> {b.state}")
    flows: dict[tuple[int, int], int] = {}
    for old, new in zip(before.slots, after.slots, strict=True):
        if old != new:
            flows[(old, new)] = flows.get((old, new), 0) + 1
    lines += [f"{n} slots shard {a} -> {b}" for (a, b), n in sorted(flows.items())]
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


def confirm(args: argparse.Namespace, question: str = "Go ahead?") -> bool:
    if args.yes:
        return True
    if not sys.stdin.isatty():
        raise CommandError("not a terminal: pass --yes to confirm")
    return input(f"{question} [y/N] ").strip().lower() in ("y", "yes")


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
        return await _run_moves(args, mover, smap, [t for t in smap.moves if t not in before.moves])


async def _run_moves(
    args: argparse.Namespace, mover: Mover, smap: ShardMap, tenants: Sequence[str]
) -> int:
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


@command(
    "tenants",
    "pin",
    help="place a tenant on a shard whatever its slot says, moving its jobs there live",
    args=(arg("tenant_id"), arg("shard_id", type=int), *_PLACEMENT_ARGS),
)
async def tenants_pin(args: argparse.Namespace) -> int:
    return await _pin(args)


async def _pin(args: argparse.Namespace) -> int:
    return await change_placement(args, lambda store: store.pin(args.tenant_id, args.shard_id))


@command(
    "shards",
    "pin",
    help="the same as `shardq tenants pin`",
    args=(arg("tenant_id"), arg("shard_id", type=int), *_PLACEMENT_ARGS),
)
async def shards_pin(args: argparse.Namespace) -> int:
    return await _pin(args)


@command(
    "tenants",
    "move",
    help="move a tenant (and its jobs, live) to a shard: pins it there",
    args=(arg("tenant_id"), arg("shard_id", type=int), *_PLACEMENT_ARGS),
)
async def tenants_move(args: argparse.Namespace) -> int:
    return await _pin(args)


@command(
    "tenants",
    "unpin",
    help="return a tenant to the shard its slot maps to, moving its jobs back live",
    args=(arg("tenant_id"), *_PLACEMENT_ARGS),
)
async def tenants_unpin(args: argparse.Namespace) -> int:
    return await _unpin(args)


async def _unpin(args: argparse.Namespace) -> int:
    return await change_placement(args, lambda store: store.unpin(args.tenant_id))


@command(
    "shards",
    "unpin",
    help="the same as `shardq tenants unpin`",
    args=(arg("tenant_id"), *_PLACEMENT_ARGS),
)
async def shards_unpin(args: argparse.Namespace) -> int:
    return await _unpin(args)


@command(
    "shards",
    "add",
    help="add a shard (the next ID) and give it its share of slots, moving their tenants live",
    args=(
        arg("address", metavar="HOST:PORT"),
        arg("--weight", type=int, default=1),
        *_PLACEMENT_ARGS,
    ),
)
async def shards_add(args: argparse.Namespace) -> int:
    return await change_placement(args, lambda store: store.add_shard(args.address, args.weight))


@command(
    "shards",
    "drain",
    help="give a shard's slots to the others, moving its tenants off it live",
    args=(arg("shard_id", type=int), *_PLACEMENT_ARGS),
)
async def shards_drain(args: argparse.Namespace) -> int:
    return await change_placement(args, lambda store: store.set_state(args.shard_id, DRAINING))


@command(
    "shards",
    "remove",
    help="take a drained, empty shard (the last ID) out of the map",
    args=(arg("shard_id", type=int), *_PLACEMENT_ARGS),
)
async def shards_remove(args: argparse.Namespace) -> int:
    return await change_placement(args, lambda store: store.remove_shard(args.shard_id))


@command(
    "moves",
    "list",
    help="the tenant moves in progress",
    args=(arg("--json", action="store_true", help="print JSON"),),
)
async def moves_list(args: argparse.Namespace) -> int:
    async with engine_for(args) as engine:
        smap = await ShardMapStore(engine).load()
    rows = [(m.tenant_id, m.from_shard_id, m.to_shard_id, _when(m.started_at_ms))
            for _, m in sorted(smap.moves.items())]  # fmt: skip
    if args.json:
        print_json(
            [dict(zip(("tenant_id", "from", "to", "started"), r, strict=True)) for r in rows]
        )
    else:
        print_table(["TENANT", "FROM", "TO", "STARTED"], rows)
    return 0


@command(
    "moves",
    "run",
    help="carry out the moves in progress (all, or these tenants'); safe to re-run",
    args=(arg("tenant_id", nargs="*"), *_PLACEMENT_ARGS),
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
        return await _run_moves(args, mover, smap, tenants)


@command(
    "rebalance",
    help="even out the shards' load: --plan shows slot moves and pins, --apply makes them",
    args=(
        arg("--plan", action="store_true", help="show the plan and change nothing"),
        arg("--apply", action="store_true", help="make the plan's changes (asks unless --yes)"),
        arg("--tolerance", type=float, default=0.1, help="stop within this share of the mean"),
        *_PLACEMENT_ARGS,
    ),
)
async def rebalance_cmd(args: argparse.Namespace) -> int:
    if args.plan == args.apply:
        raise CommandError("give --plan or --apply")
    async with placement_store(args) as (store, mover):
        smap = await store.load()
        loads = {sid: await mover.shards.client(info).tenant_loads()
                 for sid, info in sorted(smap.shards.items())}  # fmt: skip
        the_plan = rebalance.plan(smap, loads, args.tolerance)
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
        after = await store.load()
        print(f"shard map version {smap.version} -> {after.version}")
        return await _run_moves(args, mover, after, [t for t in after.moves if t not in smap.moves])


# -- shardq tokens ... ------------------------------------------------------------------------


@command(
    "tokens",
    "create",
    help="create a bearer token and print it (it is shown this once)",
    args=(
        arg("--tenant", metavar="TENANT_ID", help="a token acting for this tenant only"),
        arg("--admin", action="store_true", help="an admin token (every tenant, the shard map)"),
        arg("--worker", action="store_true", help="a worker token (assignments, claiming jobs)"),
        arg("--name", default="", help="a note saying what the token is for"),
        arg("--json", action="store_true", help="print JSON"),
    ),
)
async def tokens_create(args: argparse.Namespace) -> int:
    chosen = [
        r
        for r, on in (("tenant", args.tenant), ("admin", args.admin), ("worker", args.worker))
        if on
    ]
    if len(chosen) != 1:
        raise CommandError("give exactly one of --tenant TENANT_ID, --admin or --worker")
    role = chosen[0]
    async with engine_for(args) as engine:
        token_id, token = await TokenStore(engine).create(role, args.tenant, args.name)
    if args.json:
        print_json({"token_id": token_id, "token": token, "role": role, "tenant_id": args.tenant})
    else:
        who = f"tenant {args.tenant}" if args.tenant else role
        print(f"created {role} token {token_id} for {who}; store it now, it is not shown again:")
        print(token)
    return 0


@command("tokens", "revoke", help="revoke a token by its ID", args=(arg("token_id"),))
async def tokens_revoke(args: argparse.Namespace) -> int:
    async with engine_for(args) as engine:
        revoked = await TokenStore(engine).revoke(args.token_id)
    if not revoked:
        raise CommandError(f"no active token {args.token_id}")
    print(f"revoked {args.token_id} (coordinators stop accepting it within a few seconds)")
    return 0


def _utc(moment: datetime) -> str:
    return f"{moment.astimezone(UTC):%Y-%m-%d %H:%M:%SZ}"


@command(
    "tokens",
    "list",
    help="list tokens (IDs and roles; never the tokens themselves)",
    args=(
        arg("--json", action="store_true", help="print JSON"),
        arg("--active", action="store_true", help="leave out revoked tokens"),
    ),
)
async def tokens_list(args: argparse.Namespace) -> int:
    async with engine_for(args) as engine:
        found = await TokenStore(engine).list(include_revoked=not args.active)
    if args.json:
        print_json(
            [
                {
                    "token_id": t.token_id,
                    "role": t.role,
                    "tenant_id": t.tenant_id,
                    "name": t.name,
                    "created_at": t.created_at.isoformat(),
                    "revoked_at": t.revoked_at.isoformat() if t.revoked_at else None,
                }
                for t in found
            ]
        )
        return 0
    print_table(
        ["TOKEN_ID", "ROLE", "TENANT", "NAME", "CREATED", "REVOKED"],
        [
            [
                t.token_id,
                t.role,
                t.tenant_id or "-",
                t.name,
                _utc(t.created_at),
                _utc(t.revoked_at) if t.revoked_at else "-",
            ]
            for t in found
        ],
    )
    return 0


# -- the API: jobs, dead letters, schedules, stats ---------------------------------------------

STATE_NAMES = {
    "scheduled": common_pb2.JOB_STATE_SCHEDULED,
    "ready": common_pb2.JOB_STATE_READY,
    "active": common_pb2.JOB_STATE_ACTIVE,
    "dead": common_pb2.JOB_STATE_DEAD,
}
_PAGE_ARGS = (
    arg("--page-size", type=int, default=0, help="most items (server default 100, max 1000)"),
    arg("--page-token", default="", help="next_page_token of the previous page"),
)


def api_client(args: argparse.Namespace) -> Client:
    """A blocking client from the connection options (close it after use)."""
    if not args.token:
        raise Unauthenticated("no token: pass --token or set SHARDQ_TOKEN")
    root = None
    if args.ca_file:
        try:
            with open(args.ca_file, "rb") as f:
                root = f.read()
        except OSError as exc:
            raise InvalidArgument(f"cannot read {args.ca_file}: {exc}", field="ca_file") from exc
    return Client(
        args.coordinator,
        args.token,
        tls=bool(args.tls or root),
        root_certificates=root,
        tenant_id=args.tenant,
        retry=RetryPolicy(attempts=3, cap_s=0.5),
    )


def _when(ms: int) -> str:
    return f"{datetime.fromtimestamp(ms / 1000, UTC):%Y-%m-%d %H:%M:%SZ}" if ms else "-"


def state_name(state: int) -> str:
    return common_pb2.JobState.Name(state).removeprefix("JOB_STATE_").lower()  # type: ignore[arg-type]


def _json_value(raw: bytes) -> Any:
    """A payload or result as the JSON it holds (its text when it is not JSON)."""
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace")


def message_dict(msg: Message) -> dict[str, Any]:
    return json_format.MessageToDict(
        msg, always_print_fields_with_no_presence=True, preserving_proto_field_name=True
    )


def job_dict(job: common_pb2.Job) -> dict[str, Any]:
    out = message_dict(job)
    out["state"] = state_name(job.state)
    out["payload"] = _json_value(job.payload)
    out["result"] = _json_value(job.result)
    return out


def print_job(job: common_pb2.Job) -> None:
    rows: list[tuple[str, object]] = [
        ("job_id", job.job_id),
        ("tenant", job.tenant_id),
        ("state", state_name(job.state) + (" (cancel requested)" if job.cancel_requested else "")),
        ("handler", job.handler),
        ("priority", job.priority),
        ("attempts", f"{job.attempts} of {job.max_attempts}"),
        ("run_at", _when(job.run_at_unix_ms)),
        ("created_at", _when(job.created_at_unix_ms)),
        ("started_at", _when(job.started_at_unix_ms)),
        ("finished_at", _when(job.finished_at_unix_ms)),
        ("worker", job.worker_id or "-"),
        ("request_id", job.request_id),
        ("shard", job.shard_id),
        ("payload", job.payload.decode("utf-8", "replace")),
    ]
    if job.last_error:
        rows.append(("last_error", job.last_error))
    if job.result:
        rows.append(("result", job.result.decode("utf-8", "replace")))
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key.ljust(width)}  {value}")


def print_jobs(jobs: Sequence[common_pb2.Job], next_page_token: str, dead: bool = False) -> None:
    headers = ["JOB_ID", "STATE", "HANDLER", "PRIO", "ATTEMPTS", "RUN_AT", "CREATED"]
    rows: list[list[object]] = [
        [
            j.job_id,
            state_name(j.state),
            j.handler,
            j.priority,
            f"{j.attempts}/{j.max_attempts}",
            _when(j.run_at_unix_ms),
            _when(j.created_at_unix_ms),
        ]
        for j in jobs
    ]
    if dead:
        headers.append("LAST_ERROR")
        for row, j in zip(rows, jobs, strict=True):
            row.append(" ".join(j.last_error.split())[:60])
    print_table(headers, rows)
    if next_page_token:
        print(f"\nmore: --page-token {next_page_token}")


def _payload_arg(text: str | None, what: str = "PAYLOAD_JSON") -> bytes:
    if text is None:
        return b""
    try:
        json.loads(text)
    except ValueError as exc:
        raise InvalidArgument(f"not JSON ({exc})", field=what) from exc
    return text.encode()


@command(
    "submit",
    help="submit a job",
    calls_api=True,
    args=(
        arg("handler", metavar="HANDLER"),
        arg("payload", metavar="PAYLOAD_JSON", nargs="?", help="JSON handed to the handler"),
        arg("--priority", type=int, default=0, help="0 to 9, 9 most urgent (default 0)"),
        arg("--delay-ms", type=int, help="run this many ms from now"),
        arg("--run-at-ms", type=int, help="run at this unix time in ms"),
        arg("--max-attempts", type=int, default=0, help="attempts before dead (server default)"),
        arg("--request-id", help="idempotency key (default: a new one)"),
    ),
)
def submit(args: argparse.Namespace) -> int:
    if args.delay_ms is not None and args.run_at_ms is not None:
        raise InvalidArgument("give --delay-ms or --run-at-ms, not both", field="delay_ms")
    payload = _payload_arg(args.payload)
    with api_client(args) as client:
        sub = client.submit(
            args.handler,
            payload,
            request_id=args.request_id,
            priority=args.priority,
            delay_ms=args.delay_ms,
            run_at_ms=args.run_at_ms,
            max_attempts=args.max_attempts,
        )
    if args.json:
        print_json({"job": job_dict(sub.job), "deduplicated": sub.deduplicated})
    else:
        note = " (deduplicated: this request_id was submitted before)" if sub.deduplicated else ""
        print(f"{sub.job_id}  {state_name(sub.job.state)}{note}")
    return 0


@command("get", help="show one job", calls_api=True, args=(arg("job_id", metavar="JOB_ID"),))
def get(args: argparse.Namespace) -> int:
    with api_client(args) as client:
        job = client.get(args.job_id)
    if args.json:
        print_json(job_dict(job))
    else:
        print_job(job)
    return 0


@command(
    "cancel",
    help="cancel a job (an active one finishes its attempt, then ends cancelled)",
    calls_api=True,
    args=(arg("job_id", metavar="JOB_ID"),),
)
def cancel(args: argparse.Namespace) -> int:
    with api_client(args) as client:
        job = client.cancel(args.job_id)
    if args.json:
        print_json(job_dict(job))
    elif job.cancel_requested and job.state != common_pb2.JOB_STATE_CANCELLED:
        print(f"{job.job_id}  cancel requested: it is active and ends cancelled")
    else:
        print(f"{job.job_id}  {state_name(job.state)}")
    return 0


@command(
    "watch",
    help="follow a job until it succeeds, dies or is cancelled (a line per change)",
    calls_api=True,
    args=(arg("job_id", metavar="JOB_ID"),),
)
def watch(args: argparse.Namespace) -> int:
    updates = []
    with api_client(args) as client:
        for job in client.watch(args.job_id):
            updates.append(job)
            if not args.json:
                error = f"  {' '.join(job.last_error.split())[:80]}" if job.last_error else ""
                print(
                    f"{datetime.now(UTC):%H:%M:%S}  {state_name(job.state):<9}  "
                    f"attempt {job.attempts}/{job.max_attempts}{error}",
                    flush=True,
                )
    if args.json:
        print_json([job_dict(j) for j in updates])
    return 0


@command(
    "jobs",
    "list",
    help="list a page of the tenant's jobs in one state",
    calls_api=True,
    args=(arg("--state", required=True, choices=sorted(STATE_NAMES)), *_PAGE_ARGS),
)
def jobs_list(args: argparse.Namespace) -> int:
    with api_client(args) as client:
        page = client.list_jobs(STATE_NAMES[args.state], args.page_size, args.page_token)
    if args.json:
        print_json(
            {"jobs": [job_dict(j) for j in page.jobs], "next_page_token": page.next_page_token}
        )
    else:
        print_jobs(page.jobs, page.next_page_token)
    return 0


@command(
    "dead",
    "list",
    help="list a page of the tenant's dead jobs, most recently dead first",
    calls_api=True,
    args=_PAGE_ARGS,
)
def dead_list(args: argparse.Namespace) -> int:
    with api_client(args) as client:
        page = client.list_dead(args.page_size, args.page_token)
    if args.json:
        print_json(
            {"jobs": [job_dict(j) for j in page.jobs], "next_page_token": page.next_page_token}
        )
    else:
        print_jobs(page.jobs, page.next_page_token, dead=True)
    return 0


@command(
    "dead",
    "requeue",
    help="move dead jobs back to ready with fresh attempts",
    calls_api=True,
    args=(
        arg("job_ids", metavar="JOB_ID", nargs="*", help="dead jobs to requeue"),
        arg("--all", action="store_true", help="every dead job of the tenant"),
    ),
)
def dead_requeue(args: argparse.Namespace) -> int:
    if bool(args.job_ids) == args.all:
        raise InvalidArgument("give JOB_IDs or --all", field="job_ids")
    with api_client(args) as client:
        resp = client.requeue_dead(args.job_ids, all=args.all)
    if args.json:
        print_json(message_dict(resp))
    else:
        print(f"requeued {resp.requeued_count}")
        if resp.not_found_job_ids:
            print(f"not dead or unknown: {' '.join(resp.not_found_job_ids)}")
    return 0


@command(
    "schedules",
    "create",
    help="create a recurring schedule (the same definition again is a no-op)",
    calls_api=True,
    args=(
        arg("schedule_id", metavar="ID"),
        arg("cron", metavar="CRON", help='5-field cron expression, e.g. "0 6 * * *"'),
        arg("handler", metavar="HANDLER"),
        arg("payload", metavar="PAYLOAD", nargs="?", help="JSON handed to each job"),
        arg("--tz", default="UTC", help="IANA time zone of the cron expression (default UTC)"),
        arg("--priority", type=int, default=0, help="priority of each job (0 to 9)"),
    ),
)
def schedules_create(args: argparse.Namespace) -> int:
    template = job_spec(args.handler, _payload_arg(args.payload, "PAYLOAD"), priority=args.priority)
    template.ClearField("request_id")  # each tick gets its own
    with api_client(args) as client:
        sched = client.create_schedule(args.schedule_id, args.cron, template, args.tz)
    if args.json:
        print_json(schedule_dict(sched))
    else:
        print(f"schedule {sched.schedule_id}: next run at {_when(sched.next_run_at_unix_ms)}")
    return 0


def schedule_dict(s: Any) -> dict[str, Any]:
    out = message_dict(s)
    out["job_template"]["payload"] = _json_value(s.job_template.payload)
    return out


@command("schedules", "list", help="list the tenant's schedules", calls_api=True)
def schedules_list(args: argparse.Namespace) -> int:
    with api_client(args) as client:
        found = client.list_schedules()
    if args.json:
        print_json([schedule_dict(s) for s in found])
        return 0
    print_table(
        ["ID", "CRON", "TIME_ZONE", "HANDLER", "NEXT_RUN"],
        [
            [
                s.schedule_id,
                s.cron,
                s.time_zone,
                s.job_template.handler,
                _when(s.next_run_at_unix_ms),
            ]
            for s in found
        ],
    )
    return 0


@command(
    "schedules",
    "delete",
    help="delete a schedule (jobs it created stay)",
    calls_api=True,
    args=(arg("schedule_id", metavar="ID"),),
)
def schedules_delete(args: argparse.Namespace) -> int:
    with api_client(args) as client:
        client.delete_schedule(args.schedule_id)
    if args.json:
        print_json({"deleted": args.schedule_id})
    else:
        print(f"deleted schedule {args.schedule_id}")
    return 0


_STATS_HEADERS = [
    "TENANT", "SHARD", "SCHEDULED", "READY", "ACTIVE", "DEAD", "SUBMITTED", "COMPLETED", "FAILED",
]  # fmt: skip


def _stats_row(t: common_pb2.TenantStats) -> list[object]:
    return [
        t.tenant_id, t.shard_id, t.scheduled, t.ready, t.active, t.dead,
        t.submitted_total, t.completed_total, t.failed_total,
    ]  # fmt: skip


@command(
    "stats",
    help="a tenant's queue depths and totals (admin: --all for every tenant)",
    calls_api=True,
    args=(
        arg("tenant_id", metavar="TENANT", nargs="?", help="tenant (default: the token's)"),
        arg("--all", action="store_true", help="every tenant of every shard (admin token)"),
    ),
)
def stats(args: argparse.Namespace) -> int:
    if args.tenant_id:
        args.tenant = args.tenant_id
    with api_client(args) as client:
        if args.all:
            found: list[common_pb2.TenantStats] = []
            token = ""
            while True:
                page = client.list_tenant_stats(page_size=1000, page_token=token)
                found += page.tenants
                token = page.next_page_token
                if not token:
                    break
        else:
            found = [client.tenant_stats()]
    if args.json:
        docs = [message_dict(t) for t in found]
        print_json(docs if args.all else docs[0])
    else:
        print_table(_STATS_HEADERS, [_stats_row(t) for t in found])
    return 0


def shard_map_dict(m: admin_pb2.ShardMap) -> dict[str, Any]:
    out = message_dict(m)
    for shard in out["shards"]:
        shard["state"] = shard["state"].removeprefix("SHARD_STATE_").lower()
    return out


@command(
    "shards",
    "map",
    help="the shard map as the coordinator serves it (admin token)",
    calls_api=True,
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
                [mv.tenant_id, mv.from_shard_id, mv.to_shard_id, _when(mv.started_at_unix_ms)]
                for mv in m.moves_in_progress
            ],
        )
    return 0


# -- shardq dev, shardq demo (coordinator/dev.py, coordinator/demo.py) ------------------------

command(
    "dev",
    help="run a whole local cluster (Redis shards, Postgres, coordinator, shard loops, "
    "workers) until Ctrl-C",
    args=[arg(*flags, **options) for flags, options in dev.ARGS],
    needs_database=False,
)(dev.run)
command(
    "demo",
    help="submit a mixed workload (tenants, priorities, delays, retries, a dead letter, "
    "a schedule) to a running cluster, with the admin token",
    args=[arg(*flags, **options) for flags, options in demo.ARGS],
    calls_api=True,
)(demo.run)


if __name__ == "__main__":
    sys.exit(main())
