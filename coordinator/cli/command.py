"""What every ``shardq`` command shares: how it is declared (:class:`Commands`), the argparse
tree built from the declarations, and how one runs (sync or async) and reports failure.

A command is a function of the parsed arguments that returns the exit code, or a coroutine
that does. Its ``kind`` gives it the options of its audience:

- ``database``: the operator's commands on Postgres, with ``--database-url``; a failure prints
  ``shardq: error: ...`` and exits 1;
- ``api``: commands over gRPC, with ``--coordinator``, ``--token``, ``--tenant``, ``--tls``,
  ``--ca-file``, ``--cert-file``, ``--key-file`` and ``--json``; a failure prints
  ``error: CODE: message`` and exits 1, a TLS file that cannot be used
  ``shardq: error: --FLAG: ...`` and exits 2 (a usage error, as argparse's own);
- ``local``: neither (``shardq dev`` brings its own).
"""

from __future__ import annotations

import argparse
import inspect
import re
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from shardq.common import config
from shardq.common.errors import ShardqError
from shardq.common.tls import TlsFileError, refusal_hint

# Nothing here imports grpc, sqlalchemy or redis at start-up: `shardq --help` and each command
# load only what they use (bench/startup.py measures it). An exception can only be one of
# theirs when its module is loaded, which is how execute() tells them apart.
if TYPE_CHECKING:
    import grpc

Handler = Callable[[argparse.Namespace], int | Awaitable[int]]
#: Adds arguments to a command's parser: :func:`arg`, or a function such as
#: ``config.add_key_prefix`` that declares a flag several programs share.
AddArgs = Callable[[argparse.ArgumentParser], object]
Kind = Literal["database", "api", "local"]


def arg(*flags: str, **options: Any) -> AddArgs:
    """One ``parser.add_argument(*flags, **options)`` call, declared next to its command."""

    def add(parser: argparse.ArgumentParser) -> None:
        parser.add_argument(*flags, **options)

    return add


@dataclass(frozen=True)
class Command:
    path: tuple[str, ...]
    help: str
    run: Handler
    args: tuple[AddArgs, ...] = ()
    kind: Kind = "database"


class Commands:
    """The commands of one module, in the order ``--help`` lists them, and the help of the
    nouns they live under (``groups={"tokens": "bearer tokens ..."}``)."""

    def __init__(self, kind: Kind, groups: dict[str, str] | None = None) -> None:
        self.kind: Kind = kind
        self.groups = {tuple(path.split()): text for path, text in (groups or {}).items()}
        self.items: list[Command] = []

    def add(
        self, *path: str, help: str, args: Sequence[AddArgs] = (), kind: Kind | None = None
    ) -> Callable[[Handler], Handler]:
        """Register the decorated function as ``shardq <path...>``."""

        def register(run: Handler) -> Handler:
            self.items.append(Command(tuple(path), help, run, tuple(args), kind or self.kind))
            return run

        return register


class CommandError(Exception):
    """A failure to report as one line on stderr (exit code 1), never a traceback."""


def _database_parent() -> argparse.ArgumentParser:
    parent = argparse.ArgumentParser(add_help=False)
    config.add_database_url(parent)
    return parent


def _api_parent() -> argparse.ArgumentParser:
    parent = argparse.ArgumentParser(add_help=False)
    config.add_api_connection(parent)
    parent.add_argument("--json", action="store_true", help="print one JSON document")
    return parent


def parser_for(
    root: argparse.ArgumentParser,
    commands: Sequence[Command],
    groups: dict[tuple[str, ...], str],
) -> argparse.ArgumentParser:
    """Add ``commands`` under ``root``, with a parser per intermediate word (``groups``: their
    help), and return ``root``."""
    parents = {"database": [_database_parent()], "api": [_api_parent()], "local": []}
    subparsers: dict[tuple[str, ...], argparse._SubParsersAction[argparse.ArgumentParser]] = {
        (): root.add_subparsers(dest="command", metavar="COMMAND", required=True)
    }
    for cmd in commands:
        for depth in range(1, len(cmd.path)):
            prefix = cmd.path[:depth]
            if prefix not in subparsers:
                text = groups.get(prefix, "")
                group = subparsers[prefix[:-1]].add_parser(prefix[-1], help=text, description=text)
                subparsers[prefix] = group.add_subparsers(
                    dest=f"command_{depth}", metavar="COMMAND", required=True
                )
        parser = subparsers[cmd.path[:-1]].add_parser(
            cmd.path[-1], help=cmd.help, description=cmd.help, parents=parents[cmd.kind]
        )
        for add in cmd.args:
            add(parser)
        # Not "handler": that is an argument of submit and schedules create.
        parser.set_defaults(run_command=cmd.run, calls_api=cmd.kind == "api")
    return root


def execute(args: argparse.Namespace) -> int:
    """Run the command ``args`` chose (to the end of its coroutine); failures print one line."""
    try:
        result = args.run_command(args)
        if inspect.isawaitable(result):
            import asyncio  # noqa: PLC0415 - only the async commands pay for it

            result = asyncio.run(_await(result))
        return int(result)
    except TlsFileError as exc:
        print(f"shardq: error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        calls_api = getattr(args, "calls_api", False)
        line = _error_line(exc, calls_api=calls_api)
        if line is not None and calls_api:
            line = _with_tls_hint(line, args)
        if line is None:
            raise
        print(line, file=sys.stderr)
        return 1


def _error_line(exc: Exception, *, calls_api: bool) -> str | None:
    """The one line a failure prints, or None for an unexpected one (a traceback: a bug)."""
    grpc_mod = sys.modules.get("grpc")
    if grpc_mod is not None and isinstance(exc, grpc_mod.RpcError):
        code, details = _rpc_error(exc)
        return f"error: {code}: {details}"
    database = _database_error(exc)
    if not isinstance(exc, CommandError | ShardqError | ValueError) and database is None:
        return None
    if calls_api:
        return f"error: {_status_name(exc)}: {exc}"
    return f"shardq: error: {database or exc}"


def _with_tls_hint(line: str, args: argparse.Namespace) -> str:
    """``line`` and, when it is a connection closed in the TLS handshake, what that usually
    means: gRPC gives a client refused for its certificate no other reason."""
    over_tls = args.tls or args.ca_file or args.cert_file
    if not over_tls or not line.startswith("error: UNAVAILABLE: "):
        return line
    hint = refusal_hint(
        line, client_cert=bool(args.cert_file), cert_flags="--cert-file and --key-file"
    )
    return f"{line} ({hint})" if hint else line


def _status_name(exc: Exception) -> str:
    if isinstance(exc, ShardqError):
        try:
            from shardq.coordinator.errors import CODES  # noqa: PLC0415 - grpc is loaded by now
        except ModuleNotFoundError:  # a bare install (the client only): no server's errors
            # The client raises its errors by their status's name (InvalidArgument...).
            return re.sub(r"(?<=[a-z])(?=[A-Z])", "_", type(exc).__name__).upper()
        status = CODES.get(type(exc))
        if status is not None:
            return status.name
    return "INVALID_ARGUMENT"


def _database_error(exc: Exception) -> str | None:
    """What a database failure says, on one line; None when ``exc`` is not one."""
    if "sqlalchemy" not in sys.modules:
        return None
    from sqlalchemy.exc import OperationalError, ProgrammingError  # noqa: PLC0415

    if not isinstance(exc, ProgrammingError | OperationalError):
        return None
    # The driver's message only: its first line says it; SQL and hints follow.
    reason = str(exc.orig).strip().splitlines()[0]
    if isinstance(exc, ProgrammingError) and "does not exist" in reason:
        return f"the schema is missing or old ({reason}); run `shardq migrate` first"
    return f"database error: {reason}"


def _rpc_error(exc: grpc.RpcError) -> tuple[str, str]:
    import grpc  # noqa: PLC0415 - loaded already: exc is one of its errors

    if isinstance(exc, grpc.aio.AioRpcError | grpc.Call):
        code, details = exc.code(), exc.details()
    else:
        code, details = None, None
    # One line: a connection failure's details can span several.
    text = " ".join(str(details or exc).split())
    return (code.name if code is not None else "UNKNOWN"), text


async def _await(result: Awaitable[int]) -> int:
    return await result
