"""The operator's commands: they talk to Postgres (and, to move tenants, to the shards' Redis)
directly, with ``--database-url``; no coordinator has to run. One module per noun."""

from __future__ import annotations

from shardq.coordinator.cli.command import Command
from shardq.coordinator.cli.ops import migrate, moves, rebalance, shards, tenants, tokens

#: In the order ``shardq --help`` lists them.
MODULES = (migrate, shards, tenants, moves, rebalance, tokens)
COMMANDS: list[Command] = [c for m in MODULES for c in m.commands.items]
