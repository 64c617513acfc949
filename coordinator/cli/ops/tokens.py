"""``shardq tokens ...``: bearer tokens for tenants, admins and workers, in the database."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime

from shardq.coordinator.cli.command import CommandError, Commands, arg
from shardq.coordinator.cli.ops.database import engine_for
from shardq.coordinator.cli.terminal import print_json, print_table
from shardq.coordinator.tokens import TokenStore

commands = Commands("database", groups={"tokens": "bearer tokens for tenants, admins and workers"})


@commands.add(
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


@commands.add("tokens", "revoke", help="revoke a token by its ID", args=(arg("token_id"),))
async def tokens_revoke(args: argparse.Namespace) -> int:
    async with engine_for(args) as engine:
        revoked = await TokenStore(engine).revoke(args.token_id)
    if not revoked:
        raise CommandError(f"no active token {args.token_id}")
    print(f"revoked {args.token_id} (coordinators stop accepting it within a few seconds)")
    return 0


def _utc(moment: datetime) -> str:
    return f"{moment.astimezone(UTC):%Y-%m-%d %H:%M:%SZ}"


@commands.add(
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
