"""Checks of a Redis address before the shard map names it (``shards init|sync|add|
set-address``), and the identity marker that ties a Redis to one shard ID.

A map change that commits an address nobody can use wedges every tenant it moves there: the
mover cannot copy, submits to the target fail, and the next change waits for those moves. So
each new or changed address is checked first, and the change is refused with one line naming
the address and the check it failed, before anything is written:

- it answers PING within ``timeout_s`` (not a closed port, not an HTTP server);
- Redis ``>= MIN_REDIS_VERSION`` (``LMOVE`` in ``claim.lua`` is 6.2);
- a primary, not a replica (writes to a replica fail);
- ``appendonly yes``: without it a restart loses every job since the last snapshot;
- ``maxmemory-policy noeviction``: any other policy deletes jobs silently under memory
  pressure, where noeviction refuses the write (RESOURCE_EXHAUSTED, a retry);
- its keyspace is empty, or ours: marked with a shard's identity (``Keys.identity``), or only
  keys under the key prefix;
- with ``--shard-replicas-to-ack N``, at least N replicas connected (else every write fails).

A ``sentinel://`` address is checked at the primary its sentinels name now; the identity
marker is written there and replicated, so it holds whichever replica is promoted later.

The settings are read from ``INFO`` (``aof_enabled``, ``maxmemory_policy``), which managed
Redis services allow where they rename or forbid ``CONFIG``. Where ``INFO`` itself is refused,
the checks cannot be made, and the message says so (``--skip-checks`` adds the address
unchecked, see docs/operating.md).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from redis.asyncio.sentinel import MasterNotFoundError
from redis.exceptions import AuthenticationError, RedisError, ResponseError

from shardq.common.errors import FailedPrecondition
from shardq.common.redis import redis_for
from shardq.shard.client import ShardClient
from shardq.shard.models import ShardSettings
from shardq.shard.moving import mark_identity, shard_identity

#: The oldest Redis the Lua scripts run on: ``LMOVE`` (claim.lua) is Redis 6.2.
MIN_REDIS_VERSION = (6, 2, 0)
#: How long one address may take to answer all the checks, in seconds.
CHECK_TIMEOUT_S = 3.0
#: Keys looked at per SCAN call when a Redis holds keys but no identity marker.
SCAN_COUNT = 1_000


class AddressRefused(FailedPrecondition):
    """An address failed a check; nothing was committed."""


@dataclass(frozen=True, slots=True)
class AddressChange:
    """One address a map change introduces: a new shard's, or an existing shard's new one."""

    shard_id: int
    address: str
    #: An existing shard gets this address (a re-point): it must hold that shard's data.
    repoint: bool = False
    #: The shard owns no slot or pin and takes part in no move: pointing it at an empty
    #: Redis loses nothing.
    emptied: bool = True


@dataclass(frozen=True, slots=True)
class AddressReport:
    address: str
    redis_version: str
    #: The shard whose data the Redis holds (its identity marker), None when unmarked.
    identity: int | None
    #: Keys in database 0.
    keys: int


def _version(text: str) -> tuple[int, ...]:
    parts = []
    for part in text.split(".")[:3]:
        digits = "".join(ch for ch in part if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


class ShardChecker:
    """Checks addresses as the shard map's store asks (``ShardMapStore(checks=...)``), and
    marks them with the shard ID they are given."""

    def __init__(
        self,
        password: str = "",
        settings: ShardSettings | None = None,
        timeout_s: float = CHECK_TIMEOUT_S,
    ) -> None:
        self.password = password
        self.settings = settings or ShardSettings()
        self.timeout_s = timeout_s

    @contextlib.asynccontextmanager
    async def _client(self, address: str) -> Any:
        client = ShardClient(
            redis_for(address, self.password, self.settings.redis_username), self.settings
        )
        try:
            yield client
        finally:
            await client.redis.aclose()

    async def inspect(self, address: str) -> AddressReport:
        """Every check of one address; :class:`AddressRefused` naming the first it fails."""
        try:
            async with asyncio.timeout(self.timeout_s), self._client(address) as shard:
                return await self._inspect(address, shard)
        except TimeoutError:
            raise AddressRefused(f"{address}: no answer within {self.timeout_s:g} s") from None
        except AuthenticationError as exc:
            raise AddressRefused(f"{address}: authentication failed ({_one_line(exc)})") from None
        except MasterNotFoundError as exc:  # a sentinel:// address: no sentinel names a primary
            raise AddressRefused(
                f"{address}: no sentinel answers with a primary for it ({_one_line(exc)})"
            ) from None
        except ConnectionError as exc:  # the builtin: raised by asyncio for a refused port
            raise AddressRefused(f"{address}: cannot connect ({_one_line(exc)})") from None
        except RedisError as exc:
            # redis-py's ConnectionError (refused, reset) and its protocol errors ("Protocol
            # error, got "H" as reply type byte": an HTTP server) alike.
            what = "cannot connect" if "connecting" in str(exc) else "does not answer as Redis"
            raise AddressRefused(f"{address}: {what} ({_one_line(exc)})") from None
        except OSError as exc:
            raise AddressRefused(f"{address}: cannot connect ({_one_line(exc)})") from None

    async def _inspect(self, address: str, shard: ShardClient) -> AddressReport:
        r: Any = shard.redis
        if not await r.ping():
            raise AddressRefused(f"{address}: does not answer PING")
        try:
            info: dict[str, Any] = await r.info("everything")
        except ResponseError as exc:
            raise AddressRefused(
                f"{address}: the checks could not be made: INFO is refused ({_one_line(exc)}); "
                "`--skip-checks` adds it unchecked (see docs/operating.md)"
            ) from None
        version = str(info.get("redis_version", "0"))
        if _version(version) < MIN_REDIS_VERSION:
            need = ".".join(map(str, MIN_REDIS_VERSION))
            raise AddressRefused(f"{address}: Redis {version} is too old (shardq needs >= {need})")
        if info.get("role", "master") != "master":
            raise AddressRefused(
                f"{address}: is a replica (role {info.get('role')}): promote it first "
                "(REPLICAOF NO ONE)"
            )
        if str(info.get("aof_enabled", "0")) != "1":
            raise AddressRefused(
                f"{address}: appendonly is off: a restart would lose jobs (set appendonly yes)"
            )
        policy = str(info.get("maxmemory_policy", ""))
        if policy != "noeviction":
            raise AddressRefused(
                f"{address}: maxmemory-policy is {policy or 'unknown'}: Redis would delete jobs "
                "when full (set maxmemory-policy noeviction)"
            )
        self._check_replicas(address, info, version)
        identity = await shard_identity(shard)
        keys = int(await r.dbsize())
        if identity is None and keys:
            await self._only_ours(address, r)
        return AddressReport(address, version, identity, keys)

    def _check_replicas(self, address: str, info: dict[str, Any], version: str) -> None:
        """With ``--shard-replicas-to-ack N``: every write waits for N replicas, so a primary
        with fewer connected would refuse every submit (UNAVAILABLE): refuse it here."""
        wanted = self.settings.durability
        if not wanted.replicas:
            return
        if wanted.aof and _version(version) < (7, 2, 0):
            raise AddressRefused(
                f"{address}: Redis {version} has no WAITAOF (7.2): drop --shard-wait-aof"
            )
        connected = int(info.get("connected_slaves", 0))
        if connected < wanted.replicas:
            raise AddressRefused(
                f"{address}: has {connected} connected replica(s) where --shard-replicas-to-ack "
                f"asks for {wanted.replicas}: every write would fail (start the replicas first)"
            )

    async def _only_ours(self, address: str, r: Any) -> None:
        base = self.settings.key_prefix + ":"
        async for key in r.scan_iter(count=SCAN_COUNT):
            name = key.decode(errors="replace") if isinstance(key, bytes) else str(key)
            if not name.startswith(base):
                raise AddressRefused(
                    f"{address}: holds keys that are not shardq's under prefix {base!r} "
                    f"(e.g. {name[:60]!r}): give shardq an empty Redis"
                )

    async def check(self, changes: Sequence[AddressChange], *, mark: bool) -> None:
        """Check every change's address (all at once); refuse with every failure on one line.
        With ``mark``, then write each address's identity marker (the change commits next)."""
        results = await asyncio.gather(*(self._admit(c) for c in changes), return_exceptions=True)
        failed = [str(r) for r in results if isinstance(r, BaseException)]
        for r in results:
            if isinstance(r, BaseException) and not isinstance(r, AddressRefused):
                raise r
        if failed:
            raise AddressRefused("; ".join(failed))
        if mark:
            for change in changes:
                await self.mark(change.address, change.shard_id)

    async def _admit(self, change: AddressChange) -> None:
        report = await self.inspect(change.address)
        sid = change.shard_id
        if report.identity is not None and report.identity != sid:
            raise AddressRefused(
                f"{change.address}: holds the data of shard {report.identity}, not of shard {sid}"
            )
        if change.repoint and report.identity is None and not change.emptied:
            raise AddressRefused(
                f"{change.address}: holds no data of shard {sid} (no identity marker): a new "
                f"address must hold the same data (drain shard {sid} first to point it at "
                "another Redis)"
            )

    async def mark(self, address: str, shard_id: int) -> None:
        async with asyncio.timeout(self.timeout_s), self._client(address) as shard:
            found = await mark_identity(shard, shard_id)
            # The marker is what tells this shard's data from another's after a failover:
            # with --shard-replicas-to-ack it must be on the replicas before the map names
            # the address (NotReplicated, UNAVAILABLE, otherwise: the change is not made).
            await shard.wait_for_replicas()
        if found != shard_id:
            raise AddressRefused(f"{address}: holds the data of shard {found}, not {shard_id}")

    async def mark_existing(self, shards: Sequence[tuple[int, str]]) -> None:
        """Mark the map's shards that are not marked yet (maps made before markers existed):
        best effort, a shard that cannot be reached now is marked by a later change."""

        async def one(shard_id: int, address: str) -> None:
            with contextlib.suppress(RedisError, OSError, TimeoutError, AddressRefused):
                await self.mark(address, shard_id)

        await asyncio.gather(*(one(sid, a) for sid, a in shards))
