"""The chart runs the components as the code defines them: every command line it renders
parses with the component's real argument parser, and every SHARDQ_* variable it sets is a
setting that component reads. This catches drift between the chart and the code."""

from __future__ import annotations

import argparse
from collections.abc import Callable

import pytest

from shardq.common.config import env_name
from shardq.coordinator import cli
from shardq.coordinator import server as coordinator_server
from shardq.shard import __main__ as shard_main
from shardq.store import roles
from shardq.worker import __main__ as worker_main
from tests.helm.conftest import VALUES_FILES, Rendered
from tests.helm.test_chart import pod_specs

Render = Callable[[str], Rendered]


def _flags(parser: argparse.ArgumentParser) -> set[str]:
    out = set()
    for action in parser._actions:
        out |= {env_name(o) for o in action.option_strings if o.startswith("--")}
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                out |= _flags(sub)
    return out


PARSE: dict[str, Callable[[list[str]], object]] = {
    "shardq": lambda argv: cli.build_parser().parse_args(argv),
    "shardq-coordinator": coordinator_server.parse_args,
    "shardq-shard": shard_main.parse_args,
    "shardq-worker": worker_main.parse_args,
}
#: Set on every container by the chart's common env; the one-shot CLI has no use for them.
CLI_IGNORES = {"SHARDQ_KEY_PREFIX", "SHARDQ_LOG_LEVEL", "SHARDQ_REDIS_PASSWORD"} | {
    # Read from the environment, not flags, by `shardq migrate --roles` (store/roles.py).
    roles.password_variable(role)
    for role in roles.ROLES
}


def _env_names(program: str) -> set[str]:
    parsers: dict[str, Callable[[], argparse.ArgumentParser]] = {
        "shardq": cli.build_parser,
        "shardq-coordinator": lambda: _parser_of(coordinator_server.parse_args),
        "shardq-shard": shard_main.build_parser,
        "shardq-worker": lambda: _parser_of(worker_main.parse_args),
    }
    return _flags(parsers[program]())


def _parser_of(parse: Callable[[list[str]], object]) -> argparse.ArgumentParser:
    captured: list[argparse.ArgumentParser] = []
    original = argparse.ArgumentParser.parse_args

    def capture(self: argparse.ArgumentParser, *a: object, **k: object) -> argparse.Namespace:
        captured.append(self)
        return argparse.Namespace()

    argparse.ArgumentParser.parse_args = capture  # type: ignore[method-assign,assignment]
    try:
        parse([])
    finally:
        argparse.ArgumentParser.parse_args = original  # type: ignore[method-assign]
    return captured[0]


@pytest.mark.parametrize("name", VALUES_FILES)
def test_every_rendered_command_parses_and_every_variable_is_read(
    render: Render, name: str
) -> None:
    problems = []
    seen = set()
    for doc, spec in pod_specs(render(name)):
        for c in spec.get("initContainers", []) + spec["containers"]:
            command = [*c.get("command", []), *c.get("args", [])]
            if not command or command[0] not in PARSE:
                continue
            program = command[0]
            seen.add(program)
            where = f"{doc['kind']}/{doc['metadata']['name']}/{c['name']}"
            try:
                PARSE[program](command[1:])
            except SystemExit:
                problems.append(f"{where}: {program} refuses {command[1:]}")
            known = _env_names(program) | (CLI_IGNORES if program == "shardq" else set())
            env = c.get("env", [])
            # Variables only substituted into others by Kubernetes, as $(NAME), are fine.
            substituted = {
                e["name"]
                for e in env
                if any(f"$({e['name']})" in str(o.get("value", "")) for o in env)
            }
            for var in (e["name"] for e in env):
                if var.startswith("SHARDQ_") and var not in known | substituted:
                    problems.append(f"{where}: {program} does not read {var}")
    assert not problems, "\n".join(problems)
    assert {"shardq-coordinator", "shardq-shard"} <= seen
