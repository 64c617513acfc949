"""Loads the Lua scripts of ``shard/lua/`` and registers them once per Redis client.

Each script is sent with ``_lib.lua`` prepended (shared key builders, codes and helpers), so
there is one file per atomic operation and no copy of the shared parts. redis-py's
``register_script`` runs EVALSHA and reloads on NOSCRIPT, so a flushed script cache or a
restarted Redis is recovered from transparently.
"""

from __future__ import annotations

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


@cache
def source(name: str) -> str:
    """The full text sent to Redis for one script: the shared prelude, then the script."""
    folder = resources.files("shardq.shard") / "lua"
    lib = (folder / "_lib.lua").read_text()
    return lib + "\n" + (folder / f"{name}.lua").read_text()


def register_all(redis: Redis) -> dict[str, AsyncScript]:
    return {name: redis.register_script(source(name)) for name in SCRIPT_NAMES}
