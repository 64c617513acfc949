"""What ``shardq dev`` puts in its database before it starts the coordinator: the schema
(``shardq migrate``), the shard map (``shardq shards sync``) and the tokens, which it keeps in
``<data-dir>/tokens.json`` (:mod:`shardq.coordinator.tools.data_dir`) so a restart reuses them."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import secrets
from pathlib import Path

from shardq.common import validation
from shardq.common.errors import InvalidArgument
from shardq.coordinator.cli.terminal import plural
from shardq.coordinator.shardmap import MapNotInitialized, ShardMapStore
from shardq.coordinator.tokens import TokenStore
from shardq.coordinator.tools.data_dir import Tokens, read_tokens, write_tokens
from shardq.coordinator.tools.dev.processes import DevError
from shardq.store import db
from shardq.store.migrate import upgrade


def parse_token_args(items: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        tenant, sep, token = item.partition("=")
        if not sep or not token:
            raise DevError(f"--token {item!r} is not TENANT=TOKEN")
        try:
            validation.tenant_id(tenant)
        except InvalidArgument as exc:
            raise DevError(f"--token {item!r}: {exc}") from exc
        out[tenant] = token
    return out


def load_tokens(path: Path, args: argparse.Namespace) -> Tokens:
    """The flags' tokens, else the ones a previous run stored, else new ones."""
    stored = read_tokens(path)
    given = parse_token_args(args.token)
    tenants = given or dict(stored.tenants) or {"demo": ""}
    return Tokens(
        admin=args.admin_token or stored.admin,
        worker=stored.worker or secrets.token_urlsafe(32),
        tenants=tenants,
    )


async def register_tokens(store: TokenStore, tokens: Tokens) -> None:
    """Make every token valid in the database: generate the missing, register the given."""

    async def ensure(role: str, tenant: str | None, token: str) -> str:
        if token:
            principal = await store.authenticate(token)
            if principal is not None:
                if (principal.role, principal.tenant_id) != (role, tenant):
                    raise DevError(f"token {principal.token_id} belongs to another role or tenant")
                return token
            try:
                await store.create(role, tenant, name="shardq dev", token=token)
            except InvalidArgument as exc:
                raise DevError(f"{'admin' if role == 'admin' else tenant} token: {exc}") from exc
            return token
        return (await store.create(role, tenant, name="shardq dev"))[1]

    tokens.admin = await ensure("admin", None, tokens.admin)
    for tenant in sorted(tokens.tenants):
        tokens.tenants[tenant] = await ensure("tenant", tenant, tokens.tenants[tenant])


async def prepare_database(
    database_url: str, addresses: list[str], tokens: Tokens, tokens_file: Path, map_place: str
) -> None:
    """Migrate, make the shard map list ``addresses``, register ``tokens`` and store them in
    ``tokens_file``. ``map_place`` says where the shard map lives, for the error that refuses
    another shard count."""
    try:
        await asyncio.to_thread(upgrade, database_url)
    except Exception as exc:
        raise DevError(f"cannot migrate {database_url}: {exc}") from exc
    engine = db.make_engine(db.sqlalchemy_url(database_url))
    try:
        store = ShardMapStore(engine)
        with contextlib.suppress(MapNotInitialized):
            count = len((await store.load()).shards)
            # Growing the map moves slots, and the tenants on them would leave their
            # queued jobs behind: a local cluster keeps its shard count.
            if count != len(addresses):
                raise DevError(
                    f"this cluster has {plural(count, 'shard')} (its shard map is in {map_place}); "
                    f"pass --shards {count}, or another --data-dir (and database)"
                )
        await store.sync_shards(addresses)
        await register_tokens(TokenStore(engine), tokens)
    finally:
        await engine.dispose()
    write_tokens(tokens_file, tokens)
