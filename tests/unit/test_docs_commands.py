"""Every `shardq ...` command written in README.md and docs/*.md parses with today's CLI.

tests/integration/test_docs.py runs the blocks it can against a real `shardq dev`; the blocks
marked `not-run` (Kubernetes, a production cluster's addresses) are not run, so without this
test a renamed command or flag in them would drift unnoticed. Each `shardq` invocation in every
shell block, run or not, goes through the CLI's own argument parser.
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex

import pytest

from shardq.coordinator.cli import build_parser
from tests.support.docs import SHELL, Block, all_blocks

#: Shell operators that end one command and start the next.
_SEPARATORS = frozenset({"&&", "||", ";", "|", "&"})


def invocations(code: str) -> list[list[str]]:
    """The argument lists of each `shardq` command in a shell block (continuations joined,
    comments dropped, `$VAR`s kept as words)."""
    found: list[list[str]] = []
    pending = ""
    for line in code.replace("\\\n", " ").splitlines():
        lexer = shlex.shlex(pending + line, posix=True, punctuation_chars=";&|")
        lexer.whitespace_split = True
        lexer.commenters = "#"
        try:
            words = list(lexer)
        except ValueError:  # a quoted string that goes on to the next line
            pending += line + "\n"
            continue
        pending = ""
        command: list[str] = []
        for word in [*words, ";"]:
            if word in _SEPARATORS:
                if command[:1] == ["shardq"]:
                    found.append(command[1:])
                command = []
            elif not command and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", word):
                continue  # VAR=value before a command
            else:
                command.append(word)
    return found


FOUND = [
    (block, args)
    for block in all_blocks()
    if block.lang in SHELL
    for args in invocations(block.code)
]
CASES = [pytest.param(b, a, id=f"{b.id}:shardq {' '.join(a)}"[:120]) for b, a in FOUND]


def test_the_docs_hold_shardq_commands_in_blocks_run_and_not_run() -> None:
    not_run = [a for b, a in FOUND if b.not_run]
    assert len(FOUND) > 30 and len(not_run) > 10, "the extraction found too few commands"


@pytest.mark.parametrize(("block", "args"), CASES)
def test_each_documented_shardq_command_parses(block: Block, args: list[str]) -> None:
    parser = build_parser()
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            parser.parse_args(args)
    except SystemExit as exc:
        # --help exits 0 after printing; anything else is the parser refusing the command.
        assert exc.code == 0, f"{block.id}: `shardq {shlex.join(args)}`: {err.getvalue().strip()}"


def test_a_command_the_cli_does_not_have_is_caught() -> None:
    (args,) = invocations("shardq shards frobnicate 3  # a renamed command")
    with pytest.raises(SystemExit), contextlib.redirect_stderr(io.StringIO()):
        build_parser().parse_args(args)
    assert invocations("X=1 shardq a b && echo shardq | shardq c --d 'e f'") == [
        ["a", "b"],
        ["c", "--d", "e f"],
    ]
