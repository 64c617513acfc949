"""``shardq``: the command line for operators (schema, shard map, tokens) and for people
using the API (submit, get, cancel, watch and list jobs, dead letters, schedules, stats).

One module per noun, grouped by audience (as Asynq's ``tools/asynq/cmd/``):

- ``ops/``: the operator's commands, on Postgres (and the shards' Redis, to move tenants)
  directly, with ``--database-url`` (``SHARDQ_DATABASE_URL``): ``migrate``, ``shards``,
  ``tenants``, ``moves``, ``rebalance``, ``tokens``;
- ``api/``: commands over gRPC through ``shardq.client``, with ``--coordinator``
  (``SHARDQ_COORDINATOR``), ``--token`` (``SHARDQ_TOKEN``), ``--tenant``, ``--tls`` and
  ``--ca-file``: ``jobs`` (submit, get, cancel, watch, jobs list), ``dead``, ``schedules``,
  ``stats``, ``tenants`` (``tenants limits``, ``tenants set``: beside the operator's
  ``tenants`` commands), ``pause`` (pause, resume), ``shards`` (``shards map``); their errors
  print one line,
  ``error: CODE: message``, and exit 1;
- ``tools.py``: ``dev`` and ``demo`` (``shardq.coordinator.tools``);
- ``command.py``: how a command is declared, parsed and run; ``terminal.py``: what they print
  and ask.

A new command is one function registered with its module's ``commands.add(...)``; a new noun
module goes in its audience's ``MODULES``. Every command has ``--json`` for scripts (one JSON
document on stdout).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from shardq.coordinator.cli import api, ops, tools
from shardq.coordinator.cli.command import Command, execute, parser_for

#: Every subcommand, in the order ``--help`` lists them.
COMMANDS: list[Command] = [*ops.COMMANDS, *api.COMMANDS, *tools.commands.items]
#: Help for the intermediate words of command paths (``shardq shards --help``).
GROUPS: dict[tuple[str, ...], str] = {
    path: text
    for module in (*ops.MODULES, *api.MODULES, tools)
    for path, text in module.commands.groups.items()
}


def build_parser(commands: Sequence[Command] | None = None) -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(
        prog="shardq",
        description="shardq: jobs, dead letters, schedules and stats through the API; "
        "schema, shard map and tokens in the database",
    )
    return parser_for(root, COMMANDS if commands is None else commands, GROUPS)


def main(argv: Sequence[str] | None = None) -> int:
    return execute(build_parser().parse_args(argv))
