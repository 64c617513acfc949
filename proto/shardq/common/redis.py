"""The one way shardq opens a connection to a shard's Redis (coordinator, mover, worker, shard
loop, CLI).

A shard's address is either one Redis, ``host:port``, or a Redis Sentinel group that watches a
primary and its replicas, ``sentinel://h1:26379,h2:26379,h3:26379/shard-0`` (the master's name
after the slash). For the second, every connection asks the sentinels which Redis is the
primary now, and a connection that finds it gone (refused, reset) or demoted (a
``READONLY`` reply) is dropped and asks again: a failover is followed without a restart or a
map change.
The shard's password (``--redis-password``) is given to the sentinels too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import hiredis
from redis.asyncio import Redis
from redis.asyncio.connection import Connection
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool, SentinelManagedConnection
from redis.backoff import ExponentialBackoff
from redis.exceptions import DataError, RedisError
from redis.typing import EncodableT

from shardq.common.errors import InvalidArgument, Unavailable

SENTINEL_SCHEME = "sentinel://"
#: The sentinels' port when an address leaves it out (Redis Sentinel's own default).
SENTINEL_PORT = 26379


@dataclass(frozen=True, slots=True)
class SentinelAddress:
    """A parsed ``sentinel://host:port,.../master-name``."""

    sentinels: tuple[tuple[str, int], ...]
    master: str


def is_sentinel(address: str) -> bool:
    return address.startswith(SENTINEL_SCHEME)


def _host_port(text: str, default_port: int | None, address: str) -> tuple[str, int]:
    """``host:port``, ``[v6]:port`` or (with a default port) ``host``, ``[v6]``. Refused: an
    IPv6 address without brackets (``::1`` would read as host ``:`` and port 1) and a user or
    password in the host (``pw@host``: the password goes in its own setting)."""
    bad = InvalidArgument(f"{address!r}: {text!r} is not host:port", field="address")
    if text.startswith("["):
        host, close, rest = text[1:].partition("]")
        if not close or (rest and not rest.startswith(":")):
            raise bad
        port = rest[1:]
    else:
        host, sep, port = text.rpartition(":")
        if not sep:
            host, port = text, ""
        if ":" in host:
            raise InvalidArgument(
                f"{address!r}: {text!r}: write an IPv6 address in brackets, [::1]:6379",
                field="address",
            )
    if "@" in host:
        raise InvalidArgument(
            f"{address!r}: no user or password in the address (--redis-password sets it)",
            field="address",
        )
    if not port and default_port is not None:
        port = str(default_port)
    if not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
        raise bad
    return host or "127.0.0.1", int(port)


def parse_sentinel(address: str) -> SentinelAddress:
    """The sentinels and master name of a ``sentinel://`` address; InvalidArgument naming
    what is wrong."""
    hosts, sep, master = address[len(SENTINEL_SCHEME) :].partition("/")
    if not sep or not master or "/" in master:
        raise InvalidArgument(
            f"{address!r}: a sentinel address names its master after one slash "
            "(sentinel://h1:26379,h2:26379/shard-0)",
            field="address",
        )
    parts = [h.strip() for h in hosts.split(",") if h.strip()]
    if not parts:
        raise InvalidArgument(f"{address!r}: names no sentinel", field="address")
    return SentinelAddress(tuple(_host_port(p, SENTINEL_PORT, address) for p in parts), master)


class _HiredisPacking:
    """Commands packed into RESP by hiredis (C), not by redis-py's asyncio ``pack_command``.

    redis-py's synchronous client packs with hiredis when it is installed; its asyncio client
    always packs in Python, and does so by joining the growing buffer once per argument: a
    submit of 100 jobs is one EVALSHA of ~1,500 arguments, and packing it took longer than
    the rest of the coordinator's work for those jobs (``bench/op_costs.py``; 6.4 ms vs
    0.9 ms per command here). The bytes are the same (``tests/unit/test_redis_packing.py``).
    """

    def pack_command(self, *args: EncodableT) -> list[bytes]:
        # As redis-py does: a command name given with its subcommand ("CONFIG GET") is split.
        if isinstance(args[0], str):
            args = (*args[0].encode().split(), *args[1:])
        elif isinstance(args[0], bytes) and b" " in args[0]:
            args = (*args[0].split(), *args[1:])
        try:
            # (hiredis's stub declares a one-element tuple where it takes any length)
            return [hiredis.pack_command(args)]  # type: ignore[arg-type]
        except TypeError as exc:  # redis-py's error for a value it cannot send
            raise DataError(str(exc)) from exc


class ShardConnection(_HiredisPacking, Connection):
    """A connection to one Redis (``host:port``)."""


class ShardSentinelConnection(_HiredisPacking, SentinelManagedConnection):
    """A connection to the primary its Sentinel group names."""


class _ShardSentinelPool(SentinelConnectionPool):
    """A sentinel-backed pool that also closes its sentinels' connections when closed.

    It follows a failover as redis-py's does: a connection asks the sentinels for the primary
    when it connects, and one that breaks or meets READONLY is dropped and asks again. (A
    pool that also listened to ``+switch-master`` made the failover chaos test flaky on a
    fresh machine — sentinel connections left open, submits refused past their retries —
    and was taken back out: docs/operating.md, issue #18.)"""

    async def disconnect(self, inuse_connections: bool = True) -> None:
        await super().disconnect(inuse_connections)
        # inuse_connections=False is the pool following a failover (idle connections to the
        # old primary dropped); True is aclose(): the sentinels' clients go with the pool.
        if inuse_connections:
            for sentinel in self.sentinel_manager.sentinels:
                await sentinel.aclose()


def redis_for(address: str, password: str, username: str = "") -> Redis:
    """A client of the shard at ``address`` (``host:port`` or ``sentinel://...``), logged in
    as the ACL user ``username`` (empty: ``default``)."""
    options = dict(
        username=username or None,
        password=password or None,
        socket_connect_timeout=1.0,
        socket_timeout=10.0,
        socket_keepalive=True,
        health_check_interval=15,
        # A down shard must answer UNAVAILABLE quickly, not after long retry sleeps. For a
        # sentinel address the one retry also re-asks the sentinels for the primary.
        retry=Retry(ExponentialBackoff(cap=0.05, base=0.01), retries=1),
    )
    if is_sentinel(address):
        parsed = parse_sentinel(address)
        sentinel = Sentinel(  # type: ignore[no-untyped-call]
            list(parsed.sentinels),
            sentinel_kwargs={
                "password": password or None,
                "socket_connect_timeout": 1.0,
                "socket_timeout": 2.0,
            },
            **options,
        )
        client: Redis = sentinel.master_for(
            parsed.master,
            connection_pool_class=_ShardSentinelPool,
            connection_class=ShardSentinelConnection,
        )
        return client
    host, port = _host_port(address, None, address)
    client = Redis(host=host, port=port, **options)  # type: ignore[arg-type]
    # (Redis() takes no connection class; its pool makes every connection from this one)
    client.connection_pool.connection_class = ShardConnection
    return client


# -- acknowledged means replicated --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Durability:
    """How many replicas must hold a write before shardq acknowledges it
    (``--shard-replicas-to-ack``, ``--shard-replica-ack-timeout-ms``, ``--shard-wait-aof``)."""

    #: Replicas that must have the write (WAIT's numreplicas); 0: the primary alone.
    replicas: int = 0
    #: Longest wait for them, in ms; a shortfall then fails the call (UNAVAILABLE).
    timeout_ms: int = 1_000
    #: WAITAOF (Redis/Valkey >= 7.2) instead of WAIT: the write is in the AOF of the primary
    #: and of ``replicas`` replicas (fsynced), not only in their memory.
    aof: bool = False

    def command(self) -> tuple[str | int, ...]:
        if self.aof:
            return ("WAITAOF", 1, self.replicas, self.timeout_ms)
        return ("WAIT", self.replicas, self.timeout_ms)

    def check(self, reply: object) -> None:
        """Raise :class:`NotReplicated` unless ``reply`` (WAIT's or WAITAOF's) is enough."""
        if isinstance(reply, list):
            local, replicas = int(reply[0]), int(reply[1])
        else:
            local, replicas = 1, int(reply)  # type: ignore[call-overload]
        if replicas < self.replicas or local < 1:
            what = "fsynced by" if self.aof else "acknowledged by"
            raise NotReplicated(
                f"the shard's write was {what} {replicas} of {self.replicas} replica(s) within "
                f"{self.timeout_ms} ms (a failover could lose it); retry with the same "
                "request_id"
            )


class NotReplicated(Unavailable, RedisError):
    """A write the primary applied but fewer replicas than asked confirmed in time.

    Not acknowledged: the caller retries (a submit with the same request_id is deduplicated, an
    ack is answered by the already-done check). Both an :class:`Unavailable` (the coordinator
    answers UNAVAILABLE) and a ``RedisError`` (code that handles a shard's errors handles it)."""

    #: The script's reply, when the primary applied it and only the wait fell short (a
    #: claim's jobs, which the claimer hands back); None when nothing was applied.
    reply: Any = None
