"""Each script goes to Redis with only the ``_lib.lua`` definitions it uses (scripts.link).

A definition left out by mistake would show only when the branch that calls it runs: a Lua
name with no local in scope reads the global of that name, nil in Redis. So every linked
script is compiled by Lua 5.1's own compiler (Redis's Lua) and its listing read: a script may
read only the globals Redis gives a script, and set none.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from shardq.shard import scripts

#: The globals the scripts may read: Redis's own and the Lua libraries Redis loads.
REDIS_GLOBALS = {
    "redis", "KEYS", "ARGV", "cjson", "cmsgpack", "bit", "struct",
    "string", "table", "math", "tonumber", "tostring", "type", "pairs", "ipairs", "next",
    "select", "unpack", "pcall", "error", "assert", "rawget", "rawequal",
}  # fmt: skip

_GLOBAL = re.compile(r"\b(GETGLOBAL|SETGLOBAL)\b.*; (\S+)$", re.MULTILINE)


def luac() -> str:
    """Debian's lua5.1 compiler (``.ci/setup`` installs it); ``/usr/bin`` where a test run's
    PATH holds basic tools only."""
    found = shutil.which("luac5.1") or shutil.which("luac5.1", path="/usr/bin:/usr/local/bin")
    if found is None:
        pytest.fail("no luac5.1: apt-get install lua5.1 (bash .ci/setup does)")
    return found


def globals_of(text: str, tmp_path: Path) -> set[tuple[str, str]]:
    """The (GETGLOBAL | SETGLOBAL, name) pairs of the compiled ``text``."""
    path = tmp_path / "script.lua"
    path.write_text(text)
    listing = subprocess.run(
        [luac(), "-p", "-l", str(path)], capture_output=True, text=True, check=True
    ).stdout
    return {(m.group(1), m.group(2)) for m in _GLOBAL.finditer(listing)}


@pytest.mark.parametrize("name", scripts.SCRIPT_NAMES)
def test_a_linked_script_reads_no_global_but_redis_s_and_sets_none(
    name: str, tmp_path: Path
) -> None:
    found = globals_of(scripts.source(name), tmp_path)
    assert {g for op, g in found if op == "SETGLOBAL"} == set()
    assert {g for op, g in found if op == "GETGLOBAL"} <= REDIS_GLOBALS


def test_the_check_finds_a_definition_left_out(tmp_path: Path) -> None:
    # The same check on a script linked without the definition it calls: the compiler
    # reads the helper as a global, and the test above would fail.
    lib = "local base = KEYS[1]\nlocal function k_job(id) return base .. 'job:' .. id end\n"
    found = globals_of("return redis.call('EXISTS', k_job(ARGV[1]))", tmp_path)
    assert ("GETGLOBAL", "k_job") in found
    assert ("GETGLOBAL", "k_job") not in globals_of(
        scripts.link(lib, "return redis.call('EXISTS', k_job(ARGV[1]))"), tmp_path
    )


LIB = """\
-- The header.
local base = KEYS[1]
local function k_a(x) return base .. 'a:' .. x end
-- b's comment.
local function k_b(x) return base .. 'b:' .. x end

-- Both codes in one statement.
local OK, NOT_FOUND = 0, 7
local function uses_a(x)
  -- k_b named in a comment only
  return redis.call('GET', k_a(x))
end
local unused = {}
"""


def test_link_keeps_what_the_script_uses_through_others_in_the_lib_s_order() -> None:
    linked = scripts.link(LIB, "if uses_a(ARGV[1]) then return NOT_FOUND end")
    assert linked == (
        "-- The header.\n"
        "local base = KEYS[1]\n"
        "local function k_a(x) return base .. 'a:' .. x end\n"
        "\n"
        "-- Both codes in one statement.\n"
        "local OK, NOT_FOUND = 0, 7\n"
        "local function uses_a(x)\n"
        "  -- k_b named in a comment only\n"
        "  return redis.call('GET', k_a(x))\n"
        "end\n"
        "if uses_a(ARGV[1]) then return NOT_FOUND end"
    )


def test_link_of_a_script_that_uses_nothing_is_the_script() -> None:
    assert scripts.link(LIB, "return redis.call('GET', KEYS[2])") == (
        "return redis.call('GET', KEYS[2])"
    )


def test_a_lib_line_outside_any_definition_is_refused() -> None:
    with pytest.raises(ValueError, match="outside a definition"):
        scripts.link("local x = 1\n\nredis.call('DEL', KEYS[1])\n", "return x")
    with pytest.raises(ValueError, match="defines nothing"):
        scripts.link("local = 1\n", "return 1")
