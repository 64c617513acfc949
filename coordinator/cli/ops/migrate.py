"""``shardq migrate``: the schema, and with ``--roles`` a Postgres role per process."""

from __future__ import annotations

import argparse
import os

from shardq.coordinator.cli.command import CommandError, Commands, arg
from shardq.coordinator.cli.ops.database import database_url
from shardq.store import roles
from shardq.store.migrate import head_revision, upgrade

commands = Commands("database")


@commands.add(
    "migrate",
    help="create or upgrade the coordinator's tables (safe to repeat or race)",
    args=[
        arg(
            "--roles",
            action="store_true",
            help="also create the coordinator, worker and loop roles and give each only its "
            "tables (passwords from SHARDQ_DB_PASSWORD_COORDINATOR, _WORKER, _LOOP; a role "
            "without one is NOLOGIN)",
        ),
        arg(
            "--role-prefix",
            default="",
            help="what the role names start with (default: the database's name and _)",
        ),
    ],
)
def migrate(args: argparse.Namespace) -> int:
    url = database_url(args)
    upgrade(url)
    print(f"schema at revision {head_revision()}")
    if args.roles:
        passwords = {
            role: os.environ[roles.password_variable(role)]
            for role in roles.ROLES
            if os.environ.get(roles.password_variable(role))
        }
        try:
            applied = roles.apply_roles(
                url, args.role_prefix or roles.default_prefix(url), passwords
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        for a in applied:
            how = "can log in" if a.login else "NOLOGIN (no password given: grant it to a login)"
            print(f"role {a.name} ({a.role}): {how}")
    return 0
