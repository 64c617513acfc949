"""Settings from flags with ``SHARDQ_*`` environment variables as their defaults.

Every component reads its settings this way, so a flag and its variable always agree:
``--leader-ttl-ms`` is ``SHARDQ_LEADER_TTL_MS``. The flags several programs take are declared
here once each (``add_database_url``, ``add_redis_password``, ``add_key_prefix``,
``add_log_level``, ``add_api_connection``): name, default and variable in one place, and
docs/configuration.md lists them all.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import shlex
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

if TYPE_CHECKING:  # redis-py is the server extra's: the client's CLI commands load this module
    from shardq.common.redis import Durability

#: The programs' variables are ``SHARDQ_<FLAG>``; ``shardq dev`` uses ``SHARDQ_DEV_<FLAG>``.
ENV_PREFIX = "SHARDQ_"


def env_name(flag: str, env_prefix: str = ENV_PREFIX) -> str:
    return env_prefix + flag.lstrip("-").replace("-", "_").upper()


def add(
    parser: argparse.ArgumentParser,
    flag: str,
    default: Any,
    help: str,
    type: Any = str,
    *,
    env_prefix: str = ENV_PREFIX,
) -> None:
    """Add ``flag`` whose default comes from its variable (an empty one counts as unset), else
    ``default``; the help names both."""
    var = env_name(flag, env_prefix)
    raw = os.environ.get(var)
    if raw in (None, ""):
        raw = _FILE_VALUES.get(var)
    value = type(raw) if raw not in (None, "") else default
    parser.add_argument(flag, default=value, type=type, help=f"{help} [{var}; default {default!r}]")


# -- the env file: the last fallback of the `shardq` command ---------------------------------
#: Values of the env file :func:`use_env_file` read: below flags and variables, above defaults.
_FILE_VALUES: dict[str, str] = {}


def read_env_file(path: str | os.PathLike[str]) -> dict[str, str]:
    """``KEY=value`` lines (shell-quoted, so ``set -a; . FILE`` reads the same); ``#`` comments
    and blank lines skipped. A missing or unreadable file is empty."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        key, sep, raw = line.strip().partition("=")
        if not sep or key.startswith("#"):
            continue
        try:
            words = shlex.split(raw)
        except ValueError:
            continue
        out[key.strip()] = words[0] if words else ""
    return out


def use_env_file(path: str | os.PathLike[str]) -> dict[str, str]:
    """Take ``SHARDQ_*`` values from ``path`` for the flags declared after this call, where
    neither a flag nor a variable gives one (the ``shardq`` command, next to ``shardq dev``).
    Returns what it read."""
    values = {k: v for k, v in read_env_file(path).items() if k.startswith(ENV_PREFIX)}
    _FILE_VALUES.clear()
    _FILE_VALUES.update(values)
    return values


def env_file_value(var: str) -> str:
    """What the env file in use says for ``var`` ("" when nothing)."""
    return _FILE_VALUES.get(var, "")


def write_env_file(path: str | os.PathLike[str], values: dict[str, object], header: str) -> None:
    """Write ``values`` as ``KEY=value`` lines for :func:`read_env_file` and a shell, readable
    by this user only (it holds tokens), replacing the file at once."""
    lines = [f"# {line}" if line else "#" for line in header.splitlines()]
    lines += [f"{k}={shlex.quote(str(v))}" for k, v in values.items()]
    tmp = f"{os.fspath(path)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(tmp, path)


# -- flags of several programs, each declared once --------------------------------------------
# ``help`` says what this program does with the setting; name, default and variable stay here.


def add_database_url(
    parser: argparse.ArgumentParser,
    help: str = "Postgres URL (postgresql://user@host/db)",
    *,
    env_prefix: str = ENV_PREFIX,
) -> None:
    """``--database-url`` [SHARDQ_DATABASE_URL], no default (each program says if it needs one)."""
    add(parser, "--database-url", "", help, env_prefix=env_prefix)


def add_redis_password(
    parser: argparse.ArgumentParser, help: str = "password of the shards' Redis"
) -> None:
    """``--redis-password`` [SHARDQ_REDIS_PASSWORD], none by default, and the ACL user it is
    the password of, ``--redis-username`` [SHARDQ_REDIS_USERNAME] (``shardq shards acl``)."""
    add(parser, "--redis-password", "", help)
    add(
        parser,
        "--redis-username",
        "",
        "Redis ACL user to log in as (shardq shards acl makes one per role; empty: default)",
    )


def add_shard_durability(parser: argparse.ArgumentParser) -> None:
    """``--shard-replicas-to-ack``, ``--shard-replica-ack-timeout-ms`` and ``--shard-wait-aof``
    [SHARDQ_SHARD_REPLICAS_TO_ACK, ...]: how many replicas of a shard must hold a write before
    it is acknowledged. Every program that writes to shards takes them (coordinator, worker,
    shard loop, ``shardq shards``), and they should agree."""
    add(
        parser, "--shard-replicas-to-ack", 0, "replicas of a shard that must hold each write "
        "(WAIT) before it is acknowledged: a submit, ack, promote, reap, cron tick (0: off)", int,
    )  # fmt: skip
    add(
        parser, "--shard-replica-ack-timeout-ms", 1_000, "longest wait for those replicas; "
        "short of them the call fails UNAVAILABLE and is retried", int,
    )  # fmt: skip
    add(
        parser, "--shard-wait-aof", False, "wait with WAITAOF (Redis >= 7.2): the write is "
        "fsynced to the AOF of the primary and of the replicas, not only in their memory",
        flag_bool,
    )  # fmt: skip


def durability(args: argparse.Namespace) -> Durability:
    """The shard durability that :func:`add_shard_durability`'s flags ask for."""
    from shardq.common.redis import Durability  # noqa: PLC0415 - see the TYPE_CHECKING import

    # At most 5 s: the WAIT must end well inside the shard client's 10 s socket timeout, past
    # which redis-py would send the script again on a new connection.
    if args.shard_replicas_to_ack < 0 or not 1 <= args.shard_replica_ack_timeout_ms <= 5_000:
        raise SystemExit(
            "--shard-replicas-to-ack must be >= 0 and --shard-replica-ack-timeout-ms 1 to 5000"
        )
    return Durability(
        args.shard_replicas_to_ack, args.shard_replica_ack_timeout_ms, args.shard_wait_aof
    )


def flag_bool(text: str) -> bool:
    """A yes/no flag value from a variable: 1/0, true/false, yes/no, on/off."""
    value = str(text).strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise argparse.ArgumentTypeError(f"not a yes/no value: {text!r}")


def add_ops_http(parser: argparse.ArgumentParser, port: int, port_help: str) -> None:
    """``--metrics-port`` and ``--metrics-host`` [SHARDQ_METRICS_PORT, SHARDQ_METRICS_HOST].

    Loopback by default: /metrics names tenants and handlers, so outside the chart (whose
    pods set 0.0.0.0 for their probes and scrapes, behind a NetworkPolicy) it is reachable from
    this host only unless the operator says otherwise.
    """
    add(parser, "--metrics-port", port, port_help, int)
    add(parser, "--metrics-host", "127.0.0.1", "address /metrics, /healthz and /readyz bind to")


def add_key_prefix(parser: argparse.ArgumentParser, *, env_prefix: str = ENV_PREFIX) -> None:
    """``--key-prefix`` [SHARDQ_KEY_PREFIX]: every program of a cluster must agree on it."""
    add(parser, "--key-prefix", "shardq", "prefix of every Redis key", env_prefix=env_prefix)


def add_log_level(
    parser: argparse.ArgumentParser, help: str = "logging level", *, env_prefix: str = ENV_PREFIX
) -> None:
    """``--log-level`` [SHARDQ_LOG_LEVEL], INFO by default."""
    add(parser, "--log-level", "INFO", help, env_prefix=env_prefix)


def add_api_connection(parser: argparse.ArgumentParser) -> None:
    """How a user of the API reaches the coordinator: ``--coordinator``, ``--token``,
    ``--tenant``, ``--tls``, ``--ca-file``, and ``--cert-file``/``--key-file`` for a
    coordinator that requires client certificates (the ``shardq`` commands over gRPC; the
    files are read by ``shardq.common.tls.api_client_options``)."""
    add(parser, "--coordinator", "127.0.0.1:50051", "the coordinator's host:port")
    add(parser, "--token", "", "bearer token (a tenant's, or the admin token)")
    parser.add_argument(
        "--tenant", default="", help="tenant to act on (required with the admin token)"
    )
    parser.add_argument("--tls", action="store_true", help="connect with TLS (system CAs)")
    add(parser, "--ca-file", "", "PEM CA to verify the server (implies TLS)")
    add(
        parser, "--cert-file", "", "PEM client certificate for a coordinator that requires "
        "one (mTLS; implies TLS; with --key-file)",
    )  # fmt: skip
    add(parser, "--key-file", "", "PEM private key of --cert-file (unencrypted)")


def redis_url_with_password(url: str, password: str) -> str:
    """Put a password from the environment into a redis:// URL that has none."""
    if not password or "@" in url.split("//", 1)[-1]:
        return url
    scheme, rest = url.split("//", 1)
    return f"{scheme}//:{quote(password, safe='')}@{rest}"


class JsonFormatter(logging.Formatter):
    """One JSON object per line, with the job's IDs when a log call carries them (``extra=``).
    Payloads and tokens are never logged by shardq, so none can appear here."""

    #: who/action/target/outcome: the dashboard's audit line of an admin action.
    FIELDS = ("job_id", "tenant", "handler", "shard", "worker_id", "who", "action", "target",
              "outcome")  # fmt: skip

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": self.formatTime(record),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        out.update({f: getattr(record, f) for f in self.FIELDS if hasattr(record, f)})
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


class _GcPause:
    """Whether :func:`pause_gc_for_imports` holds the collector off (and not the process's
    own code: only this pause is lifted by :func:`resume_gc_after_imports`)."""

    held = False


def pause_gc_for_imports() -> None:
    """The collector off while a program imports its modules (``shardq._programs``): what
    they make lives as long as the process, and collecting it while it is made only walks it
    again and again. :func:`resume_gc_after_imports` turns it back on."""
    if gc.isenabled():
        gc.disable()
        _GcPause.held = True


def resume_gc_after_imports() -> None:
    """After :func:`pause_gc_for_imports`: what the imports made frozen, out of every later
    collection, and the collector back on. Does nothing without that pause (``main`` called
    inside another program: a test's, a service's, whatever its collector's state)."""
    if _GcPause.held:
        _GcPause.held = False
        gc.freeze()
        gc.enable()


def freeze_startup_heap() -> None:
    """Leave the objects made so far (modules, handlers, clients) out of every later garbage
    collection. A full collection walks every tracked object: ~64 ms for a worker's ~95k at
    start (measured on the 2-core bench machine), paused in the middle of the event loop,
    which made a delayed job's start or a submit that much late now and then. These objects
    live as long as the process; what is made afterwards is collected as before."""
    gc.collect()
    gc.freeze()


def setup_logging(level: str) -> None:
    """Structured logs on stderr for every shardq process."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    logging.basicConfig(level=level.upper(), handlers=[handler])
