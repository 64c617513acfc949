"""Tokens in a real Postgres: created once, stored hashed, cached briefly, revocable."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from shardq.common.errors import InvalidArgument, Unavailable
from shardq.coordinator import cli
from shardq.coordinator.tokens import TOKEN_RE, Principal, TokenStore, hash_token
from shardq.store import db
from shardq.store.migrate import upgrade
from tests.support.outage import proxied_database


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def engine(database_url: str) -> AsyncIterator[AsyncEngine]:
    await asyncio.to_thread(upgrade, database_url)
    engine = db.make_engine(database_url)
    try:
        yield engine
    finally:
        await engine.dispose()


@pytest.fixture
def mono() -> Clock:
    return Clock()


@pytest.fixture
def store(engine: AsyncEngine, mono: Clock) -> TokenStore:
    return TokenStore(engine, cache_ttl_s=0.05, clock=mono)


async def test_a_created_token_authenticates_as_its_principal(store: TokenStore) -> None:
    token_id, token = await store.create("tenant", "acme", name="acme prod")
    assert token.startswith(f"sq_{token_id}_")
    assert len(token_id) == 12
    assert await store.authenticate(token) == Principal("tenant", "acme", token_id)
    admin_id, admin = await store.create("admin")
    worker_id, worker = await store.create("worker", name="pool-a")
    assert await store.authenticate(admin) == Principal("admin", None, admin_id)
    assert await store.authenticate(worker) == Principal("worker", None, worker_id)


async def test_only_a_hash_is_stored(store: TokenStore, database_url: str) -> None:
    token_id, token = await store.create("tenant", "acme")
    secret = token[len(f"sq_{token_id}_") :]
    assert len(secret) == 43
    with psycopg.connect(db.psycopg_dsn(database_url)) as conn:
        rows = conn.execute("SELECT row_to_json(t)::text FROM shardq_tokens t").fetchall()
        stored_hash = conn.execute("SELECT token_hash FROM shardq_tokens").fetchone()
    dump = " ".join(r[0] for r in rows)
    assert token not in dump
    assert secret not in dump
    assert stored_hash == (hash_token(token),)
    listed = await store.list()
    assert [t.token_id for t in listed] == [token_id]
    assert "hash" not in repr(listed) and secret not in repr(listed)


@pytest.mark.parametrize(
    "presented",
    [
        "",
        "nonsense",
        "Bearer sq_x",
        "sq_0123456789ab_" + "A" * 43,  # well formed, never issued
        "sq_0123456789ab_" + "A" * 44,
        "sq_0123456789AB_" + "A" * 43,
    ],
)
async def test_an_unknown_or_malformed_token_is_refused(store: TokenStore, presented: str) -> None:
    await store.create("admin")
    assert await store.authenticate(presented) is None


async def test_a_token_with_a_swapped_id_is_refused(store: TokenStore) -> None:
    token_id, token = await store.create("admin")
    other_id, _ = await store.create("admin")
    forged = token.replace(token_id, other_id, 1)
    assert await store.authenticate(forged) is None
    tampered = token[:-1] + ("B" if token[-1] != "B" else "C")
    assert await store.authenticate(tampered) is None


async def test_a_revoked_token_is_refused_after_the_cache_ttl(
    engine: AsyncEngine, mono: Clock
) -> None:
    # Two stores are two coordinator replicas: one revokes, the other still has it cached.
    revoker = TokenStore(engine, cache_ttl_s=5.0, clock=mono)
    replica = TokenStore(engine, cache_ttl_s=5.0, clock=mono)
    token_id, token = await revoker.create("tenant", "acme")
    assert await replica.authenticate(token) is not None
    assert await revoker.authenticate(token) is not None

    assert await revoker.revoke(token_id) is True
    assert await revoker.revoke(token_id) is False
    assert await revoker.revoke("000000000000") is False
    assert await revoker.authenticate(token) is None  # the revoking process: at once
    assert await replica.authenticate(token) is not None  # elsewhere: cached for the TTL
    mono.now += 5.01
    assert await replica.authenticate(token) is None
    listed = await revoker.list()
    assert listed[0].revoked_at is not None and not listed[0].active
    assert await revoker.list(include_revoked=False) == []


async def test_the_cache_spares_the_database(store: TokenStore, engine: AsyncEngine) -> None:
    _, token = await store.create("admin")
    queries: list[str] = []

    def count(*args: object) -> None:
        queries.append(str(args[2]))

    sa.event.listen(engine.sync_engine, "before_cursor_execute", count)
    try:
        for _ in range(100):
            assert await store.authenticate(token) is not None
        for _ in range(100):
            assert await store.authenticate("sq_0123456789ab_" + "A" * 43) is None
    finally:
        sa.event.remove(engine.sync_engine, "before_cursor_execute", count)
    assert len(queries) == 2  # one per distinct token, positive and negative answers alike


async def test_while_postgres_is_cut_off_tokens_seen_are_served_from_cache_for_a_bounded_time(
    engine: AsyncEngine, database_url: str, mono: Clock
) -> None:
    async with proxied_database(database_url) as (proxy, proxied_url):
        cut_engine = db.make_engine(proxied_url)
        try:
            # The coordinator's store reaches Postgres through the proxy; the operator's
            # (revoking) path to the same database is never cut.
            store = TokenStore(
                cut_engine, cache_ttl_s=5.0, stale_max_s=60.0, retry_s=1.0, clock=mono
            )
            operator = TokenStore(engine)
            kept_id, kept = await operator.create("tenant", "acme")
            gone_id, gone = await operator.create("tenant", "globex")
            _, unseen = await operator.create("tenant", "initech")
            junk = "sq_0123456789ab_" + "A" * 43
            assert await store.authenticate(kept) == Principal("tenant", "acme", kept_id)
            assert await store.authenticate(gone) == Principal("tenant", "globex", gone_id)
            assert await store.authenticate(junk) is None
            assert store.lookups == 3

            proxy.cut()
            assert await operator.revoke(gone_id)
            mono.now += 5.0  # every cached answer is past its TTL
            for _ in range(50):
                assert await store.authenticate(kept) == Principal("tenant", "acme", kept_id)
                # Revoked, but this store cannot know it yet: the bounded price.
                assert await store.authenticate(gone) is not None
                assert await store.authenticate(junk) is None  # a refusal stays a refusal
                with pytest.raises(Unavailable):
                    await store.authenticate(unseen)  # valid, but never checked here
            assert store.lookups == 4  # one failed lookup, then none for retry_s

            mono.now += 56.0  # 61 s after the last successful lookup: past the bound
            with pytest.raises(Unavailable, match="token-stale-max-s"):
                await store.authenticate(kept)

            proxy.restore()
            mono.now += 1.0
            assert await store.authenticate(kept) == Principal("tenant", "acme", kept_id)
            assert await store.authenticate(gone) is None  # the revocation, once it can be read
            assert await store.authenticate(unseen) is not None
            assert await store.authenticate(junk) is None
        finally:
            await cut_engine.dispose()


async def test_creating_checks_roles_and_tenants(store: TokenStore) -> None:
    with pytest.raises(InvalidArgument, match="role"):
        await store.create("root")
    with pytest.raises(InvalidArgument, match="tenant_id"):
        await store.create("tenant")
    with pytest.raises(InvalidArgument, match="tenant_id"):
        await store.create("tenant", "bad tenant!")
    with pytest.raises(InvalidArgument, match="tenant_id"):
        await store.create("admin", "acme")
    assert await store.list() == []


def test_the_cli_creates_lists_and_revokes_tokens(
    database_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SHARDQ_DATABASE_URL", db.psycopg_dsn(database_url))
    assert cli.main(["migrate"]) == 0
    assert cli.main(["tokens", "create", "--tenant", "acme", "--name", "acme prod"]) == 0
    printed = capsys.readouterr().out
    token = printed.strip().splitlines()[-1]
    assert TOKEN_RE.fullmatch(token)
    assert cli.main(["tokens", "create", "--worker", "--json"]) == 0
    worker = json.loads(capsys.readouterr().out)
    assert worker["role"] == "worker" and TOKEN_RE.fullmatch(worker["token"])
    assert cli.main(["tokens", "create", "--admin", "--worker"]) == 1
    assert "exactly one of" in capsys.readouterr().err

    assert cli.main(["tokens", "list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(t["role"], t["tenant_id"], t["name"]) for t in listed] == [
        ("tenant", "acme", "acme prod"),
        ("worker", None, ""),
    ]
    assert token not in json.dumps(listed)
    tenant_id = listed[0]["token_id"]
    assert cli.main(["tokens", "revoke", tenant_id]) == 0
    assert cli.main(["tokens", "revoke", tenant_id]) == 1
    capsys.readouterr()
    assert cli.main(["tokens", "list", "--active"]) == 0
    table = capsys.readouterr().out
    assert worker["token_id"] in table
    assert tenant_id not in table
