"""``shardq``: the operator's command line (schema, shard map, tokens).

Each subcommand is one function registered with :func:`command`, which names its path
(``("shards", "sync")``) and arguments; :func:`build_parser` builds the argparse tree from the
table, so adding a subcommand is adding one decorated function in any module imported here.
Commands that touch Postgres get ``--database-url`` (``SHARDQ_DATABASE_URL``); plain
``postgresql://`` URLs are accepted. Every listing has ``--json`` for scripts.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.exc import OperationalError, ProgrammingError
from sqlalchemy.ext.asyncio import AsyncEngine

from coordinator import db
from coordinator.migrate import head_revision, upgrade
from coordinator.placement import SLOT_COUNT, ShardMap
from coordinator.shardmap import MapNotInitialized, ShardMapStore
from coordinator.tokens import TokenStore
from shard import config
from shard.errors import ShardqError

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


#: Every subcommand, in the order ``--help`` lists them.
COMMANDS: list[Command] = []
#: Help for the intermediate words of command paths (``shardq shards --help``).
GROUPS: dict[tuple[str, ...], str] = {
    ("shards",): "the shard map: shards, weights, slots and pins",
    ("tokens",): "bearer tokens for tenants, admins and workers",
}


def command(
    *path: str, help: str, args: Sequence[Arg] = (), needs_database: bool = True
) -> Callable[[Handler], Handler]:
    """Register the decorated function as ``shardq <path...>``; it returns the exit code."""

    def register(run: Handler) -> Handler:
        COMMANDS.append(Command(tuple(path), help, run, tuple(args), needs_database))
        return run

    return register


class CommandError(Exception):
    """A failure to report as one line on stderr (exit code 1), never a traceback."""


# -- plumbing ---------------------------------------------------------------------------------


def _database_parent() -> argparse.ArgumentParser:
    parent = argparse.ArgumentParser(add_help=False)
    config.add(parent, "--database-url", "", "Postgres URL (postgresql://user@host/db)")
    return parent


def build_parser(commands: Sequence[Command] | None = None) -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(
        prog="shardq", description="shardq operator commands: schema, shard map, tokens"
    )
    database = _database_parent()
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
            parents=[database] if cmd.needs_database else [],
        )
        for a in cmd.args:
            parser.add_argument(*a.flags, **a.options)
        parser.set_defaults(handler=cmd.run)
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
        result = args.handler(args)
        if inspect.isawaitable(result):
            result = asyncio.run(_await(result))
        return int(result)
    except (CommandError, ShardqError, ValueError, OperationalError, ProgrammingError) as exc:
        print(f"shardq: error: {_describe(exc)}", file=sys.stderr)
        return 1


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
    help="make shards 0..N-1 have these addresses (and weights); new shards get their slots",
    args=_SHARD_ARGS,
)
async def shards_sync(args: argparse.Namespace) -> int:
    addresses = shard_addresses(args)
    async with engine_for(args) as engine:
        store = ShardMapStore(engine)
        before = await _load_or_none(store)
        after = await store.sync_shards(addresses, args.weight)
    report_change(before, after)
    return 0


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


@command(
    "shards",
    "pin",
    help="send a tenant's new jobs to a given shard (existing jobs stay where they are)",
    args=(arg("tenant_id"), arg("shard_id", type=int)),
)
async def shards_pin(args: argparse.Namespace) -> int:
    async with engine_for(args) as engine:
        smap = await ShardMapStore(engine).pin(args.tenant_id, args.shard_id)
    print(f"{args.tenant_id} pinned to shard {args.shard_id} (map version {smap.version})")
    return 0


@command(
    "shards",
    "unpin",
    help="return a tenant to the shard its slot maps to",
    args=(arg("tenant_id"),),
)
async def shards_unpin(args: argparse.Namespace) -> int:
    async with engine_for(args) as engine:
        removed = await ShardMapStore(engine).unpin(args.tenant_id)
    print(f"{args.tenant_id} unpinned" if removed else f"{args.tenant_id} was not pinned")
    return 0


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


if __name__ == "__main__":
    sys.exit(main())
