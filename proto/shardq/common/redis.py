"""The one way shardq opens a connection to a shard's Redis (coordinator, mover, worker, shard
loop, CLI).

A shard's address is either one Redis, ``host:port``, or a Redis Sentinel group that watches a
primary and its replicas, ``sentinel://h1:26379,h2:26379,h3:26379/shard-0`` (the master's name
after the slash). For the second, every connection asks the sentinels which Redis is the
primary now, a pool in use asks them again at least once a second (``MASTER_CHECK_INTERVAL_S``)
and then hands out no connection to a Redis they no longer name, and a connection that finds
it gone (refused, reset) or demoted (a ``READONLY`` reply) is dropped and asks again: a
failover is followed without a restart or a map change.
The shard's password (``--redis-password``) is given to the sentinels too.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import hiredis
from redis.asyncio import Redis
from redis.asyncio.connection import AbstractConnection, Connection
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import (
    MasterNotFoundError,
    Sentinel,
    SentinelConnectionPool,
    SentinelManagedConnection,
)
from redis.backoff import ExponentialBackoff
from redis.exceptions import DataError, RedisError, ResponseError
from redis.typing import EncodableT

from shardq.common.errors import InvalidArgument, Unavailable

SENTINEL_SCHEME = "sentinel://"
#: The sentinels' port when an address leaves it out (Redis Sentinel's own default).
SENTINEL_PORT = 26379
#: The longest a pool on a Sentinel group goes, while in use, without asking the sentinels
#: which Redis is the primary: how long a primary they replaced but could not demote (cut off
#: from them, not from shardq) may still get shardq's commands.
MASTER_CHECK_INTERVAL_S = 1.0


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


class Packed(bytes):
    """A whole command already packed into RESP (:func:`pack`), given as the one argument
    after its name: a shard connection (``redis_for``) sends it as it is. Packed ahead, a
    command whose sending waits for others (``shard.client.Row``) goes out at once when its
    place comes."""


def pack(*args: EncodableT) -> Packed:
    """``args`` (the command's name first) packed into RESP, as a shard connection packs."""
    return Packed(_packed(args))


def _packed(args: tuple[EncodableT, ...]) -> bytes:
    try:
        # (hiredis's stub declares a one-element tuple where it takes any length)
        return bytes(hiredis.pack_command(args))  # type: ignore[arg-type]
    except TypeError as exc:  # redis-py's error for a value it cannot send
        raise DataError(str(exc)) from exc


def packs_ahead(client: Redis) -> bool:
    """Whether ``client``'s connections send a :class:`Packed` command as it is."""
    return issubclass(client.connection_pool.connection_class, _HiredisPacking)


class _HiredisPacking:
    """Commands packed into RESP by hiredis (C), not by redis-py's asyncio ``pack_command``.

    redis-py's synchronous client packs with hiredis when it is installed; its asyncio client
    always packs in Python, and does so by joining the growing buffer once per argument: a
    submit of 100 jobs is one EVALSHA of ~1,500 arguments, and packing it took longer than
    the rest of the coordinator's work for those jobs (``bench/op_costs.py``; 6.4 ms vs
    0.9 ms per command here). The bytes are the same (``tests/unit/test_redis_packing.py``).
    """

    def pack_command(self, *args: EncodableT) -> list[bytes]:
        if len(args) == 2 and type(args[1]) is Packed:
            return [args[1]]
        # As redis-py does: a command name given with its subcommand ("CONFIG GET") is split.
        if isinstance(args[0], str):
            args = (*args[0].encode().split(), *args[1:])
        elif isinstance(args[0], bytes) and b" " in args[0]:
            args = (*args[0].split(), *args[1:])
        return [_packed(args)]


class _InLineSend(AbstractConnection):
    """A command sent in the calling task's own turn of the event loop, not two turns later.

    For every command, redis-py's asyncio client (7.4) first checks the idle connection it
    takes from the pool by a read under a zero timeout (a turn of the loop, a timer and a
    cancelled read), then writes under ``asyncio.wait_for`` (a task of its own: another turn
    and another timer). On an AMD EPYC machine a PING cost its caller 110 µs of CPU with
    both, 83 without, and a one-job ``enqueue.lua`` 212 and 179 (``bench/redis_calls.py``).
    What the two guard against is kept:

    - the check still finds a connection with something to read or at its end (a reply left
      unread, the server gone): what has come in by this turn of the loop, where redis-py's
      read sees what has come in by the next one. Either way the connection is closed and
      opened again;
    - a write is still bounded by the socket timeout: a write that leaves more buffered than
      the transport's high-water mark (Redis not reading) waits for the buffer to drain
      through redis-py's own timed path, and a connection not open, due its health check or
      with unsent bytes takes redis-py's path whole.

    Where the parser is not the hiredis one this reads, redis-py's own check runs.
    """

    async def can_read_destructive(self) -> bool:
        parser: Any = self._parser
        reader = getattr(parser, "_reader", None)
        stream = getattr(parser, "_stream", None)
        if (
            not isinstance(reader, hiredis.Reader)
            or not isinstance(stream, asyncio.StreamReader)
            or not getattr(parser, "_connected", False)
        ):
            # (closed: raises, as ever)
            return bool(await super().can_read_destructive())  # type: ignore[no-untyped-call]
        # StreamReader has no public peek: its buffer holds what the transport delivered.
        buffered = len(stream._buffer)  # type: ignore[attr-defined]
        return reader.has_data() or buffered > 0 or stream.at_eof()

    async def send_packed_command(
        self, command: bytes | str | Iterable[bytes], check_health: bool = True
    ) -> None:
        writer = self._writer
        if (
            writer is None
            or not self.is_connected
            or (check_health and self._health_check_due())
            or writer.transport.is_closing()
            or writer.transport.get_write_buffer_size() > 0
        ):
            await super().send_packed_command(command, check_health)
            return
        if isinstance(command, str):
            command = command.encode()
        try:
            writer.writelines([command] if isinstance(command, bytes) else command)
        except BaseException:
            # As redis-py: a command half written leaves a connection no reply can be read on.
            await self.disconnect(nowait=True)
            raise
        if writer.transport.get_write_buffer_size() > writer.transport.get_write_buffer_limits()[1]:
            # Paused: wait for the buffer under the socket timeout, with redis-py's handling
            # of a timeout or a lost connection (an empty command writes nothing more).
            await super().send_packed_command([], check_health=False)

    def _health_check_due(self) -> bool:
        # redis-py sets next_health_check from the loop's time: CLOCK_MONOTONIC on both
        # loops, as time.monotonic() (which, unlike get_running_loop() on Python 3.11, makes
        # no getpid() system call).
        return bool(self.health_check_interval) and time.monotonic() > self.next_health_check


class ShardConnection(_HiredisPacking, _InLineSend, Connection):
    """A connection to one Redis (``host:port``)."""


class ShardSentinelConnection(_HiredisPacking, _InLineSend, SentinelManagedConnection):
    """A connection to the primary its Sentinel group names."""


class _ShardSentinelPool(SentinelConnectionPool):
    """A sentinel-backed pool that leaves an old primary once the sentinels name another, and
    closes its sentinels' connections when closed.

    redis-py's pool asks the sentinels only when it opens a connection, and drops a connection
    only when it breaks or meets READONLY. A failover whose old primary the sentinels could not
    demote (cut off from them, not from shardq) left every open connection on it: reads of
    stale data, and writes to a primary nobody else follows. So when it hands out a connection
    the pool also asks the sentinels, if ``MASTER_CHECK_INTERVAL_S`` has passed since it last
    did, and a connection to any other Redis than the one they name is closed first (it
    reconnects to the primary). The question is asked in line, by the call that finds it due
    (the calls handed a connection meanwhile wait for the answer), not by a background task:
    a pool that listened to ``+switch-master`` in a task of its own left sentinel connections
    open behind closed pools, and was taken out (issue #18)."""

    def __init__(self, service_name: str, sentinel_manager: Sentinel, **kwargs: Any) -> None:
        super().__init__(service_name, sentinel_manager, **kwargs)  # type: ignore[no-untyped-call]
        #: When (time.monotonic()) the next handout asks the sentinels again.
        self._check_due = 0.0
        self._check_lock = asyncio.Lock()

    async def get_master_address(self) -> tuple[str, int]:
        # Every connect asks too (redis-py's SentinelManagedConnection): that counts as a check.
        address: tuple[str, int] = await super().get_master_address()  # type: ignore[no-untyped-call]
        self._check_due = time.monotonic() + MASTER_CHECK_INTERVAL_S
        return address

    async def ensure_connection(self, connection: AbstractConnection) -> None:
        if time.monotonic() >= self._check_due:
            # One call asks; the calls handed a connection meanwhile wait for its answer (else
            # they would go on to a primary the answer may be about to leave).
            async with self._check_lock:
                if time.monotonic() >= self._check_due:
                    try:
                        await self.get_master_address()  # a switch drops the idle connections
                    except MasterNotFoundError:
                        # No sentinel answers: none can have switched the primary either, so
                        # the one known stays in use (a new connection still needs them).
                        self._check_due = time.monotonic() + MASTER_CHECK_INTERVAL_S
        known = self.master_address
        if (
            known is not None
            and connection.is_connected
            and (getattr(connection, "host", None), getattr(connection, "port", None)) != known
        ):
            # In use at the switch (idle ones were dropped then): to a Redis no longer primary.
            await connection.disconnect()
        await super().ensure_connection(connection)

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


def log_redis_error(log: logging.Logger, shard: str, action: str, exc: RedisError) -> None:
    """Log a failed call to a shard's Redis as what it was. Redis that answered with an error
    *refused* (ERROR): an address that is a replica's (READONLY), the shard's ACL (NOPERM), a
    script's error; saying "unavailable" then sends an operator to the network. Anything else
    (refused connection, timeout, a failover under way) is *unavailable* (WARNING)."""
    if isinstance(exc, ResponseError):
        log.error("%s refused %s: %s", shard, action, exc)
    else:
        log.warning("%s unavailable: %s", shard, exc)
