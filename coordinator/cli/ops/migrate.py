"""``shardq migrate``: the schema."""

from __future__ import annotations

import argparse

from shardq.coordinator.cli.command import Commands
from shardq.coordinator.cli.ops.database import database_url
from shardq.store.migrate import head_revision, upgrade

commands = Commands("database")


@commands.add("migrate", help="create or upgrade the coordinator's tables (safe to repeat or race)")
def migrate(args: argparse.Namespace) -> int:
    upgrade(database_url(args))
    print(f"schema at revision {head_revision()}")
    return 0
