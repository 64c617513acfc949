"""The ``shardq`` command loads only what the command run needs: its table of first words
agrees with what the command modules declare, and ``--help`` or an API command does not
import the database or Redis libraries (bench/startup.py times it; this checks the cause)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from shardq.coordinator import cli

HEAVY = ("grpc", "sqlalchemy", "alembic", "redis", "psycopg")


def loaded_after(argv: list[str]) -> set[str]:
    """The top-level packages a ``shardq ARGV`` process has imported when it exits."""
    code = (
        "import json, sys\n"
        "from shardq.coordinator.cli import main\n"
        "try:\n"
        f"    main({argv!r})\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})), file=sys.stderr)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    return set(json.loads(done.stderr.strip().splitlines()[-1]))


def test_the_table_of_first_words_matches_the_modules_declarations() -> None:
    root = cli.build_parser()  # every module imported
    commands = [c for m in cli.all_modules() for c in m.commands.items]
    groups = {p: t for m in cli.all_modules() for p, t in m.commands.groups.items()}
    expected: dict[str, tuple[str, set[str]]] = {}
    for module in cli.all_modules():
        name = module.__name__.removeprefix("shardq.coordinator.cli.")
        for c in module.commands.items:
            word = c.path[0]
            text = groups.get((word,)) or c.help
            expected.setdefault(word, (text, set()))[1].add(name)
    table = {w: (text, set(mods)) for w, (text, mods) in cli.WORDS.items()}
    assert table == expected
    assert list(cli.WORDS) == list(dict.fromkeys(c.path[0] for c in commands))
    assert root.prog == "shardq"


@pytest.mark.parametrize(
    ("argv", "absent"),
    [
        (["--help"], HEAVY),
        (["get", "--help"], ("sqlalchemy", "alembic", "redis", "psycopg")),
        (["submit", "--help"], ("sqlalchemy", "alembic", "redis", "psycopg")),
    ],
)
def test_a_command_imports_only_what_it_needs(argv: list[str], absent: tuple[str, ...]) -> None:
    loaded = loaded_after(argv)
    assert not loaded & set(absent), sorted(loaded & set(absent))


def test_help_still_lists_every_first_word_with_its_help() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "shardq.coordinator.cli", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    for word in cli.WORDS:
        assert f"\n    {word}" in done.stdout, word
