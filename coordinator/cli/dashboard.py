"""``shardq dashboard``: the web dashboard (``shardq.coordinator.dashboard``), the same
program as ``shardq-dashboard``. Next to a running ``shardq dev`` it needs no flag: the
coordinator's address comes from the env file ``shardq dev`` writes."""

from __future__ import annotations

import argparse

from shardq.coordinator.cli.command import Commands

commands = Commands("local")


def _arguments(parser: argparse.ArgumentParser) -> None:
    # Imported here: the flags' module brings uvicorn and Starlette, which only this command
    # needs (the CLI imports a word's modules only when that word is run).
    from shardq.coordinator.dashboard import server  # noqa: PLC0415

    server.add_arguments(parser)


@commands.add(
    "dashboard",
    help="serve the web dashboard (a client of the coordinator's API) until Ctrl-C",
    args=(_arguments,),
)
def run_dashboard(args: argparse.Namespace) -> int:
    from shardq.coordinator.dashboard import server  # noqa: PLC0415

    return server.run(args)
