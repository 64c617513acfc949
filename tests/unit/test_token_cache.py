"""The token cache's rules while the database cannot be reached, on a fake clock.

The database here is a script (up or down, which tokens it holds, a lookup that hangs), so
every rule can be driven to its edge: served stale up to the bound and not a moment longer,
negative answers never turned positive, one lookup per interval however many calls, unseen
tokens UNAVAILABLE, revocation honoured at the first lookup after the outage. The same
rules against a real Postgres cut off by a proxy: tests/integration/test_tokens.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import cast

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from shardq.common.errors import Unavailable
from shardq.coordinator.tokens import Principal, TokenStore, hash_token

TTL_S = 5.0
STALE_MAX_S = 60.0
RETRY_S = 1.0


def token(n: int) -> str:
    return f"sq_{n:012x}_{'A' * 43}"


def principal(n: int) -> Principal:
    return Principal("tenant", f"t{n}", f"{n:012x}")


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


class Database:
    """What the store's lookups find: tokens by hash, or an outage."""

    def __init__(self) -> None:
        self.tokens: dict[str, Principal] = {}
        self.up = True
        #: Set: lookups hang until it is cleared (a partitioned database).
        self.hanging: asyncio.Event | None = None
        self.lookups = 0

    def add(self, n: int) -> str:
        t = token(n)
        self.tokens[hash_token(t)] = principal(n)
        return t

    def revoke(self, n: int) -> None:
        del self.tokens[hash_token(token(n))]


class ScriptedStore(TokenStore):
    def __init__(self, database: Database, clock: Clock, **kw: float) -> None:
        settings = {"cache_ttl_s": TTL_S, "stale_max_s": STALE_MAX_S, "retry_s": RETRY_S, **kw}
        super().__init__(cast(AsyncEngine, None), clock=clock, **settings)
        self.db = database

    async def _lookup(self, digest: str, token_id: str) -> Principal | None:
        self.db.lookups += 1
        if self.db.hanging is not None:
            await self.db.hanging.wait()
        if not self.db.up:
            raise sa.exc.OperationalError("SELECT", {}, OSError("connection refused"))
        return self.db.tokens.get(digest)


@pytest.fixture
def database() -> Database:
    return Database()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def store(database: Database, clock: Clock) -> AsyncIterator[ScriptedStore]:
    s = ScriptedStore(database, clock)
    try:
        yield s
    finally:
        await s.drain(timeout_s=0)


async def test_a_known_token_is_served_stale_up_to_the_bound_and_not_after(
    store: ScriptedStore, database: Database, clock: Clock
) -> None:
    t = database.add(1)
    assert await store.authenticate(t) == principal(1)
    read_at = clock.now
    database.up = False
    clock.now += TTL_S  # due for a lookup: it fails, the cached answer is served
    assert await store.authenticate(t) == principal(1)
    assert database.lookups == 2
    assert store.stale_answers == 1
    clock.now = read_at + STALE_MAX_S  # the last moment it may be served
    assert await store.authenticate(t) == principal(1)
    clock.now += 0.001
    with pytest.raises(Unavailable, match="token-stale-max-s"):
        await store.authenticate(t)
    # The database is back: the next lookup (after the quiet interval) serves it again.
    database.up = True
    clock.now += RETRY_S
    assert await store.authenticate(t) == principal(1)
    clock.now += TTL_S - 0.001
    lookups = database.lookups
    assert await store.authenticate(t) == principal(1)
    assert database.lookups == lookups  # fresh again: from the cache


async def test_during_an_outage_the_database_is_asked_once_per_interval_not_per_call(
    store: ScriptedStore, database: Database, clock: Clock
) -> None:
    known = [database.add(n) for n in range(5)]
    for t in known:
        assert await store.authenticate(t) is not None
    assert database.lookups == 5
    database.up = False
    clock.now += TTL_S
    for _ in range(100):
        for t in known:
            assert await store.authenticate(t) is not None
        with pytest.raises(Unavailable):
            await store.authenticate(token(999))  # never seen: no lookup either
    assert database.lookups == 6  # the first call after the TTL tried; nothing since
    for _ in range(3):
        clock.now += RETRY_S
        for _ in range(50):
            for t in known:
                assert await store.authenticate(t) is not None
    assert database.lookups == 9  # one probe per interval, for the whole store


async def test_a_token_never_seen_is_unavailable_not_unauthenticated(
    store: ScriptedStore, database: Database, clock: Clock
) -> None:
    valid = database.add(7)  # in the database, but this store never checked it
    database.up = False
    with pytest.raises(Unavailable, match="cannot be reached"):
        await store.authenticate(valid)
    clock.now += RETRY_S
    with pytest.raises(Unavailable):
        await store.authenticate(token(8))
    assert await store.authenticate("sq_not-a-token") is None  # malformed: no lookup needed
    database.up = True
    clock.now += RETRY_S
    assert await store.authenticate(valid) == principal(7)
    assert await store.authenticate(token(8)) is None


async def test_a_negative_answer_never_turns_positive(
    store: ScriptedStore, database: Database, clock: Clock
) -> None:
    t = database.add(3)
    assert await store.authenticate(t) == principal(3)
    database.revoke(3)
    clock.now += TTL_S
    assert await store.authenticate(t) is None  # refreshed: revoked
    database.add(3)  # whatever the database would say now, it cannot be asked
    database.up = False
    for step in (TTL_S, RETRY_S, STALE_MAX_S / 2):
        clock.now += step
        assert await store.authenticate(t) is None
    clock.now += STALE_MAX_S
    with pytest.raises(Unavailable):
        await store.authenticate(t)  # too old to use either way, and still not accepted


async def test_a_token_revoked_during_the_outage_stops_at_the_first_lookup_after_it(
    store: ScriptedStore, database: Database, clock: Clock
) -> None:
    revoked, kept = database.add(1), database.add(2)
    assert await store.authenticate(revoked) is not None
    assert await store.authenticate(kept) is not None
    database.up = False
    clock.now += TTL_S
    database.revoke(1)
    assert await store.authenticate(revoked) == principal(1)  # stale: the price, bounded
    database.up = True
    clock.now += RETRY_S / 2
    assert await store.authenticate(revoked) == principal(1)  # within the quiet interval
    clock.now += RETRY_S / 2
    assert await store.authenticate(revoked) is None
    assert await store.authenticate(kept) == principal(2)


async def test_a_hung_lookup_is_waited_for_once_and_never_asked_twice(
    database: Database, clock: Clock
) -> None:
    store = ScriptedStore(database, clock, lookup_timeout_s=0.05)
    t = database.add(1)
    assert await store.authenticate(t) is not None
    database.hanging = asyncio.Event()
    clock.now += TTL_S
    # The first call starts the lookup and waits lookup_timeout_s for it; the others are
    # answered from the cache meanwhile, without a lookup of their own.
    answers = await asyncio.gather(*(store.authenticate(t) for _ in range(20)))
    assert answers == [principal(1)] * 20
    assert database.lookups == 2
    clock.now += RETRY_S
    assert await store.authenticate(t) == principal(1)
    assert database.lookups == 2  # the hung lookup is still the one in flight
    # It answers at last: its result is cached, fresh from when it answered.
    database.revoke(1)
    hang, database.hanging = database.hanging, None
    hang.set()
    await store.drain()
    assert await store.authenticate(t) is None
    assert database.lookups == 2


async def test_without_staleness_an_outage_is_unavailable_past_the_ttl(
    database: Database, clock: Clock
) -> None:
    store = ScriptedStore(database, clock, stale_max_s=0)
    t = database.add(1)
    assert await store.authenticate(t) is not None
    database.up = False
    clock.now += TTL_S / 2
    assert await store.authenticate(t) == principal(1)
    clock.now += TTL_S / 2 + 0.001
    with pytest.raises(Unavailable):
        await store.authenticate(t)
