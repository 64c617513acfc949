"""Redis ACL users, one per kind of process (``shardq shards acl``; docs/security.md).

Every user's keys are under the cluster's key prefix, and no user but the admin may run an
administrative command (CONFIG SET, FLUSHALL, KEYS, DEBUG, ACL, SHUTDOWN, MONITOR...):

==================  ===========================================================================
user                may
==================  ===========================================================================
``<p>-worker``      what a worker's scripts do (claim, heartbeat, ack, fail, release) on the
                    keys they touch, read the limits and pauses those scripts consult, and wait
                    for work. It cannot enqueue (no rate buckets or tenant index; it writes a
                    request ID's dedupe key only as its scripts end a job, at job format 3),
                    change a tenant's limits or pauses, touch schedules, the loop's lease or
                    the shard's identity, or run Lua the scripts do not send.
``<p>-loop``        every shardq key, with the commands of its scripts (promote, reap, cron,
                    rows) and load sampling
``<p>-coordinator`` every shardq key (submits, reads, cancels, moves, limits, pauses), plus the
                    shard checks' CONFIG GET and SCAN
``<p>-admin``       everything: the operator's ``shardq shards`` commands
==================  ===========================================================================

The worker's keys are not listed by hand: they are read from the Lua sources, following the
key builders (``k_<name>`` of ``_lib.lua``) that its scripts and the helpers they call use,
plus the keys Python hands those scripts (``WORKER_PASSED_KEYS``). A new key a worker script
touches is therefore granted with it, and ``tests/integration/test_redis_acl.py`` runs a
worker's every path under this user.

Handler code runs inside the worker process and can read its password: what the worker user
cannot do, a handler cannot do either. What it can still do is what a worker must be able to
do: change jobs on the shards it claims from.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from shardq.shard.keys import Keys

#: The scripts a worker runs.
WORKER_SCRIPTS = ("claim", "heartbeat", "ack", "fail", "release")
#: Key families those scripts only read (granted read-only to the worker).
WORKER_READ_ONLY = frozenset({"limits", "paused", "qpaused", "tqpaused"})
#: Keys the worker's Python code passes to its scripts or uses itself (``ShardClient``):
#: Keys method names.
WORKER_PASSED_KEYS = ("fence", "leases", "wait_mark")
#: Commands every shardq user needs to connect, run its scripts and wait for replicas.
BASE_COMMANDS = (
    "ping", "hello", "auth", "client|setname", "client|id", "select",
    "info", "role", "evalsha", "eval", "script|load", "script|exists", "wait", "incr",
)  # fmt: skip
#: Besides its scripts' commands: the idle wait.
WORKER_COMMANDS = ("blpop",)
#: What the loop and the coordinator may not run: administrative and whole-server commands.
DENIED = ("-@admin", "-@dangerous")
#: ... of which they need these (shard checks, status, load, failover detection).
ALLOWED_BACK = ("+info", "+role", "+config|get", "+client|setname")

ROLES = ("worker", "loop", "coordinator", "admin")


@dataclass(frozen=True, slots=True)
class User:
    role: str
    name: str
    rules: tuple[str, ...]


def password_variable(role: str) -> str:
    """The environment variable with a role's password (not a flag: ``ps`` shows flags)."""
    return f"SHARDQ_REDIS_PASSWORD_{role.upper()}"


def user_name(prefix: str, role: str) -> str:
    return f"{prefix}-{role}"


@cache
def _lua(name: str) -> str:
    return (resources.files("shardq.shard") / "lua" / f"{name}.lua").read_text()


@cache
def _builders() -> dict[str, str]:
    """Key builder name -> the pattern of the keys it spells, after the prefix and ``:``
    (``k_job`` -> ``job:*``, ``k_due`` -> ``due``)."""
    out = {}
    for m in re.finditer(
        r"^local function k_(\w+)\([^)]*\) return base \.\. (.+?) end$", _lua("_lib"), re.M
    ):
        parts = [p.strip() for p in m.group(2).split("..")]
        literal = parts[0].strip("'") if parts[0].startswith("'") else ""
        out[m.group(1)] = literal + ("*" if len(parts) > 1 else "")
    return out


@cache
def _helpers() -> dict[str, str]:
    """Each function of ``_lib.lua`` other than a key builder -> its body."""
    lib = _lua("_lib")
    starts = [
        (m.start(), m.group(1))
        for m in re.finditer(r"^(?:local )?function ([\w.]+)\s*\(", lib, re.M)
    ]
    bodies = {}
    for i, (at, name) in enumerate(starts):
        end = starts[i + 1][0] if i + 1 < len(starts) else len(lib)
        if not name.startswith("k_"):
            bodies[name] = lib[at:end].split("\n", 1)[-1]
    return bodies


def _families(text: str, seen: set[str]) -> set[str]:
    """The key builders ``text`` calls, directly or through ``_lib.lua``'s helpers."""
    found = set(re.findall(r"\bk_(\w+)\s*\(", text))
    for name, body in _helpers().items():
        if name not in seen and re.search(rf"(?<![\w.]){re.escape(name)}\s*\(", text):
            seen.add(name)
            found |= _families(body, seen)
    return found


def script_families(script: str) -> set[str]:
    """The key builder names a script's keys are spelled with (``_lib`` helpers followed)."""
    return _families(_lua(script), set())


def worker_key_rules(prefix: str) -> tuple[str, ...]:
    """The worker's key patterns: read-write on what its scripts change, read-only on what
    they consult."""
    builders = _builders()
    families: set[str] = set()
    for script in WORKER_SCRIPTS:
        families |= script_families(script)
    keys = Keys(prefix)
    rules = [f"~{keys.base()}"]  # KEYS[1] of every script: declared, never read or written
    for family in sorted(families):
        pattern = f"{prefix}:{builders[family]}"
        rules.append(f"%R~{pattern}" if family in WORKER_READ_ONLY else f"~{pattern}")
    rules += [f"~{getattr(keys, name)()}" for name in WORKER_PASSED_KEYS]
    return tuple(dict.fromkeys(rules))  # each once, in order


@cache
def _script_commands(scripts: tuple[str, ...]) -> tuple[str, ...]:
    """Every command the scripts (and ``_lib.lua``) call through ``redis.call``/``pcall``."""
    found: set[str] = set()
    for name in ("_lib", *scripts):
        found |= {c.lower() for c in re.findall(r"redis\.p?call\(\s*'(\w+)'", _lua(name))}
    return tuple(sorted(found))


def users(prefix: str, passwords: dict[str, str], hashed: bool = False) -> list[User]:
    """The ACL users of a cluster whose keys start with ``prefix``: each role given a
    password in ``passwords`` (a role without one is not made); ``hashed``: the password as
    its SHA-256 (``#<hex>``), for a file that should not hold it."""
    every_key = f"~{prefix}:*"
    made = []
    for role in ROLES:
        password = passwords.get(role)
        if not password:
            continue
        secret = f"#{hashlib.sha256(password.encode()).hexdigest()}" if hashed else f">{password}"
        head = ("reset", "on", secret, "resetchannels")
        if role == "worker":
            commands = (*BASE_COMMANDS, *WORKER_COMMANDS, *_script_commands(WORKER_SCRIPTS))
            rules = (*head, *worker_key_rules(prefix), "-@all", *(f"+{c}" for c in commands))
        elif role == "admin":
            rules = (*head, "~*", "&*", "+@all")
        else:
            rules = (*head, every_key, "+@all", *DENIED, *ALLOWED_BACK)
        made.append(User(role, user_name(prefix, role), rules))
    return made


def conf_lines(made: list[User]) -> str:
    """redis.conf ``user`` directives for ``made`` (the chart's shard pods include them)."""
    return "".join(f"user {u.name} {' '.join(u.rules)}\n" for u in made)


async def _set_user(redis: Redis, user: User) -> None:
    """ACL SETUSER with the user's rules, less those naming a command this server does not
    have (a rule added for a later Redis), which it refuses one at a time."""
    rules = list(user.rules)
    while True:
        try:
            await redis.execute_command("ACL", "SETUSER", user.name, *rules)  # type: ignore[no-untyped-call]
            return
        except ResponseError as exc:
            unknown = re.search(r"modifier '([^']+)': Unknown command", str(exc))
            if unknown is None or unknown.group(1) not in rules:
                raise
            rules.remove(unknown.group(1))


async def apply(redis: Redis, made: list[User], disable_default: bool) -> str:
    """Create or replace ``made`` on one Redis (logged in as an admin), optionally turn the
    ``default`` user off, and persist the users; how they were persisted."""
    for user in made:
        await _set_user(redis, user)
    if disable_default:
        await redis.execute_command("ACL", "SETUSER", "default", "off")  # type: ignore[no-untyped-call]
    try:
        await redis.execute_command("ACL", "SAVE")  # type: ignore[no-untyped-call]
        return "saved to its ACL file"
    except ResponseError:
        pass  # no aclfile configured
    try:
        await redis.execute_command("CONFIG", "REWRITE")  # type: ignore[no-untyped-call]
        return "written to its config file"
    except ResponseError:
        return "NOT persisted (no aclfile and no config file): they are lost on a restart"
