"""The key layout: one prefix for every key, and Lua's key builders spelled like ``Keys``."""

from __future__ import annotations

import inspect
import re
from importlib import resources

import pytest

from shardq.shard.keys import JOB_FIELDS, STATES, TERMINAL_STATES, Keys
from shardq.shard.records import (
    COMPACT_FORMAT,
    DEFAULT_QUEUE,
    FOLDED_FORMAT,
    JOB_FORMAT,
    UNSTORED_MAX_ATTEMPTS,
    UNSTORED_TIMEOUT_MS,
)
from shardq.shard.scripts import SCRIPT_NAMES

#: Lua builder name (``k_<name>`` in _lib.lua) -> the Keys method that spells the same key.
LUA_TO_PYTHON = {
    "job": "job",
    "due": "due",
    "tscheduled": "scheduled_by_tenant",
    "tactive": "active_by_tenant",
    "ready": "ready",
    "tprio": "priorities",
    "tqueues": "queues",
    "ring": "ring",
    "inring": "in_ring",
    "credit": "credit",
    "limits": "limits",
    "paused": "paused",
    "qpaused": "paused_queues",
    "tqpaused": "paused_tenant_queues",
    "parked": "parked",
    "leases": "leases",
    "fence": "fence",
    "dead": "dead",
    "dedupe": "dedupe",
    "counts": "counts",
    "tenants": "tenants",
    "bucket": "bucket",
    "wake": "wake",
    "promoter_wake": "promoter_wake",
    "schedules": "schedules",
    "cron": "cron",
    "map_fence": "map_fence",
    "job_format": "job_format",
    "moving": "moving",
    "moving_schedules": "moving_schedules",
    "moved_counts": "moved_counts",
    "outbox": "outbox",
    "old_ready": "old_ready",
    "old_ring": "old_ring",
    "old_credit": "old_credit",
    "old_weights": "old_weights",
    "old_wake": "old_wake",
    "old_scheduled": "old_scheduled",
}
#: Keys methods with no Lua builder: passed in KEYS by their only scripts, or (load, identity)
#: used by no script at all (wait_mark: written by ShardClient before each WAIT).
PYTHON_ONLY = {"base", "identity", "leader", "load", "moved_in", "wait_mark"}

#: One sample value per parameter name; distinct so a swapped argument shows in the key.
SAMPLES: dict[str, object] = {
    "job_id": "JOBID",
    "tenant": "TENANT",
    "priority": 7,
    "queue": "QUEUE",
    "request_id": "REQ",
    "move_id": "MOVEID",
}

LIB = (resources.files("shardq.shard") / "lua" / "_lib.lua").read_text()
BUILDER_RE = re.compile(
    r"^local function k_(\w+)\(([^)]*)\) return base \.\. (.+?) end$", re.MULTILINE
)


def key_methods() -> list[str]:
    return sorted(
        name
        for name, member in inspect.getmembers(Keys, inspect.isfunction)
        if not name.startswith("_")
    )


def call(keys: Keys, name: str) -> str:
    method = getattr(keys, name)
    params = inspect.signature(method).parameters
    return str(method(*(SAMPLES[p] for p in params)))


def lua_builders() -> dict[str, tuple[list[str], str]]:
    """``k_`` name -> (parameter names, the concatenation after ``base ..``) from _lib.lua."""
    out = {}
    for name, params, expr in BUILDER_RE.findall(LIB):
        out[name] = ([p.strip() for p in params.split(",") if p.strip()], expr)
    return out


def eval_concat(expr: str, env: dict[str, str]) -> str:
    """Evaluate a Lua concatenation of single-quoted literals and parameter names."""
    parts = []
    for term in (t.strip() for t in expr.split("..")):
        if term.startswith("'") and term.endswith("'"):
            parts.append(term[1:-1])
        else:
            parts.append(env[term])
    return "".join(parts)


@pytest.mark.parametrize("name", key_methods())
def test_every_key_starts_with_the_configured_prefix(name: str) -> None:
    assert call(Keys("pfx"), name).startswith("pfx:")
    assert call(Keys(), name).startswith("shardq:")


def test_the_default_prefix_is_shardq() -> None:
    assert Keys().base() == "shardq:"


def test_no_two_key_methods_spell_the_same_key() -> None:
    keys = [call(Keys("p"), name) for name in key_methods()]
    assert len(set(keys)) == len(keys)


def test_every_lua_builder_is_mapped_and_every_key_method_has_a_builder_or_is_passed_in() -> None:
    assert set(lua_builders()) == set(LUA_TO_PYTHON)
    assert set(LUA_TO_PYTHON.values()) | PYTHON_ONLY == set(key_methods())


@pytest.mark.parametrize(("lua_name", "py_name"), sorted(LUA_TO_PYTHON.items()))
def test_the_lua_key_builder_spells_the_same_key_as_keys(lua_name: str, py_name: str) -> None:
    params, expr = lua_builders()[lua_name]
    method = getattr(Keys("sq"), py_name)
    py_params = list(inspect.signature(method).parameters)
    assert len(params) == len(py_params), "same arguments in the same order"
    samples = [SAMPLES[p] for p in py_params]
    env = {lua: str(value) for lua, value in zip(params, samples, strict=True)}
    lua_key = Keys("sq").base() + eval_concat(expr, env)
    assert lua_key == method(*samples)


def test_lua_scripts_derive_keys_only_through_the_lib_builders() -> None:
    folder = resources.files("shardq.shard") / "lua"
    for name in SCRIPT_NAMES:
        text = (folder / f"{name}.lua").read_text()
        assert "base .." not in text, f"{name}.lua builds a key itself"
        assert "KEYS[1] .." not in text, f"{name}.lua builds a key itself"


@pytest.mark.parametrize("queue", ["0", "9", "default"])
def test_no_key_of_the_queue_layout_spells_a_key_of_the_previous_layout(queue: str) -> None:
    # A queue may be named "0".."9": its ring, credit and wake keys must still never be the
    # previous layout's ring:{p}, credit:{p} and wake, which upgrade_layout.lua deletes.
    k = Keys("p")
    old = {k.old_ring(p) for p in range(10)} | {k.old_credit(p) for p in range(10)}
    old |= {k.old_weights(), k.old_wake()} | {k.old_ready("t", p) for p in range(10)}
    new = {k.ring(queue), k.in_ring(queue), k.credit(queue), k.wake(queue)}
    new |= {k.ready("t", queue, p) for p in range(10)} | {k.priorities("t", queue)}
    assert not new & old


def test_the_job_state_field_documents_every_state() -> None:
    assert TERMINAL_STATES.issubset(STATES)
    for state in STATES:
        assert state in JOB_FIELDS["s"]


def test_lua_reads_a_missing_job_field_as_python_does() -> None:
    """A job hash leaves out fields at their usual value (``shard.records``): the queue, max
    attempts and timeout that Lua assumes for a missing field are Python's."""
    lua = dict(re.findall(r"^local ([A-Z_]+) = '([^']*)'$", LIB, re.MULTILINE))
    assert lua["DEFAULT_QUEUE"] == DEFAULT_QUEUE
    assert lua["UNSTORED_MAX_ATTEMPTS"] == str(UNSTORED_MAX_ATTEMPTS)
    assert lua["UNSTORED_TIMEOUT_MS"] == str(UNSTORED_TIMEOUT_MS)


def test_lua_and_python_name_the_same_job_formats() -> None:
    lua = {k: int(v) for k, v in re.findall(r"^local ([A-Z_]+_FORMAT) = (\d+)$", LIB, re.M)}
    assert lua == {"COMPACT_FORMAT": COMPACT_FORMAT, "FOLDED_FORMAT": FOLDED_FORMAT}
    # The format Python raises a shard to is the newest either side knows.
    assert max(lua.values()) == JOB_FORMAT
