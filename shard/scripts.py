"""Loads the Lua scripts of ``shard/lua/`` and registers them once per Redis client.

Each script is sent with the definitions of ``_lib.lua`` it uses before it (shared key
builders, codes and helpers: :func:`link`), so there is one file per atomic operation and no
copy of the shared parts. redis-py's ``register_script`` runs EVALSHA and reloads on NOSCRIPT,
so a flushed script cache or a restarted Redis is recovered from transparently.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

from redis.asyncio import Redis
from redis.commands.core import AsyncScript

#: One Lua file per atomic shard operation.
SCRIPT_NAMES = (
    "enqueue",
    "promote",
    "claim",
    "heartbeat",
    "ack",
    "fail",
    "reap",
    "release",
    "cancel",
    "requeue",
    "schedule_upsert",
    "schedule_delete",
    "schedule_advance",
    "leader",
    "leader_release",
    "map_fence",
    "job_format",
    "move_out",
    "move_in",
    "move_drop",
    "move_schedules_out",
    "move_finish",
    "move_counters",
    "set_limits",
    "pause",
    "resume",
    "upgrade_layout",
    "rows_written",
    "precheck",
    "prechecked",
)


#: A top-level definition of ``_lib.lua``: ``local function f(`` or ``local a, b = ...``.
_DEFINES = re.compile(r"local\s+(?:function\s+)?([\w\s,]+?)\s*(?:=|\()")
_NAME = re.compile(r"[A-Za-z_]\w*")


def _names(text: str) -> set[str]:
    """Every identifier of ``text`` outside its whole-line comments: a superset of the names
    it uses (a word in a string or a trailing comment only ever adds a definition)."""
    code = (line for line in text.splitlines() if not line.lstrip().startswith("--"))
    return set(_NAME.findall("\n".join(code)))


def _definitions(lib: str) -> list[tuple[set[str], str]]:
    """``lib``'s top-level definitions in order, each with the names it defines and its text
    (its comment lines above it, its body: the lines up to the next top-level statement)."""
    blocks: list[tuple[set[str], str]] = []
    comments: list[str] = []
    for line in lib.splitlines():
        if line.startswith("--") or not line.strip():
            comments.append(line)
        elif line.startswith("local "):
            match = _DEFINES.match(line)
            if match is None:
                raise ValueError(f"_lib.lua: a top-level line that defines nothing: {line!r}")
            names = {n.strip() for n in match.group(1).split(",")}
            blocks.append((names, "\n".join([*comments, line])))
            comments = []
        elif blocks and not comments:  # a body's next line (indented, or its `end`)
            names, text = blocks[-1]
            blocks[-1] = (names, text + "\n" + line)
        else:
            raise ValueError(f"_lib.lua: a top-level line outside a definition: {line!r}")
    return blocks


def link(lib: str, script: str) -> str:
    """``script`` after the definitions of ``lib`` it uses, directly or through others, in
    ``lib``'s order. Redis runs a script's whole text at each call: all 70 of ``_lib.lua``'s
    definitions were 52k of the server's instructions per call (a ``return 1`` after them
    costs 83k, alone 31k), a sixth of a call that enqueues one job."""
    blocks = _definitions(lib)
    needed: set[str] = set()
    wanted = _names(script)
    while wanted:
        name = wanted.pop()
        for names, text in blocks:
            if name in names and not names <= needed:
                needed |= names
                wanted |= _names(text) - needed
    kept = [text for names, text in blocks if names & needed]
    return "\n".join([*kept, script])


@cache
def source(name: str) -> str:
    """The full text sent to Redis for one script: the shared definitions it uses, then the
    script."""
    folder = resources.files("shardq.shard") / "lua"
    return link((folder / "_lib.lua").read_text(), (folder / f"{name}.lua").read_text())


def register_all(redis: Redis) -> dict[str, AsyncScript]:
    return {name: redis.register_script(source(name)) for name in SCRIPT_NAMES}
