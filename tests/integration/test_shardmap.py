"""The shard map in a real Postgres: store, versioning, and followers (replicas) converging."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator

import psycopg
import pytest

from shardq.common.errors import InvalidArgument, NotFound
from shardq.common.placement import slot_of
from shardq.coordinator import cli
from shardq.coordinator.shardmap import (
    MapChangeRefused,
    MapNotInitialized,
    ShardMapFollower,
    ShardMapStore,
)
from shardq.store import db
from shardq.store.migrate import upgrade

THREE = ["10.0.0.1:6379", "10.0.0.2:6379", "10.0.0.3:6379"]
FOUR = [*THREE, "10.0.0.4:6379"]


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[ShardMapStore]:
    await asyncio.to_thread(upgrade, database_url)
    engine = db.make_engine(database_url)
    try:
        yield ShardMapStore(engine)
    finally:
        await engine.dispose()


def tenants(count: int = 1_000) -> list[str]:
    rng = random.Random(7)
    return [f"t-{rng.getrandbits(48):012x}" for _ in range(count)]


async def test_a_fresh_database_has_no_map(store: ShardMapStore) -> None:
    assert await store.version() == 0
    with pytest.raises(MapNotInitialized, match="shards init"):
        await store.load()


async def test_init_creates_a_map_that_load_agrees_with(store: ShardMapStore) -> None:
    created = await store.sync_shards(THREE)
    assert created.version == 1
    assert [created.shards[i].address for i in range(3)] == THREE
    assert sorted(created.slot_counts().values()) == [5461, 5461, 5462]
    loaded = await store.load()
    assert loaded == created
    assert await store.version() == 1


async def test_repeating_a_sync_changes_nothing(store: ShardMapStore) -> None:
    first = await store.sync_shards(THREE)
    again = await store.sync_shards(THREE)
    assert again.version == first.version == 1


async def test_growing_to_four_shards_keeps_most_tenants_in_place(store: ShardMapStore) -> None:
    three = await store.sync_shards(THREE)
    four = await store.sync_shards(FOUR)
    assert four.version == three.version + 1
    assert four.slot_counts() == {0: 4096, 1: 4096, 2: 4096, 3: 4096}
    names = tenants()
    stayed = sum(three.shard_for(t) == four.shard_for(t) for t in names)
    assert stayed >= 700
    assert {four.shard_for(t) for t in names if three.shard_for(t) != four.shard_for(t)} == {3}
    assert await store.load() == four


async def test_weights_set_each_shards_share(store: ShardMapStore) -> None:
    smap = await store.sync_shards(THREE, weights=[2, 1, 1])
    assert smap.slot_counts() == {0: 8192, 1: 4096, 2: 4096}
    smap = await store.set_weight(0, 1)
    assert sorted(smap.slot_counts().values()) == [5461, 5461, 5462]
    assert smap.shards[0].weight == 1
    assert smap.version == 2
    same = await store.set_weight(0, 1)
    assert same.version == 2
    emptied = await store.set_weight(2, 0)
    assert 2 not in emptied.slots
    with pytest.raises(NotFound):
        await store.set_weight(9, 1)


async def test_shrinking_is_refused_and_changes_nothing(store: ShardMapStore) -> None:
    await store.sync_shards(THREE)
    with pytest.raises(MapChangeRefused, match="removing shards is not supported") as err:
        await store.sync_shards(THREE[:2])
    assert isinstance(err.value, ValueError)
    assert (await store.load()).version == 1
    assert len((await store.load()).shards) == 3


async def test_bad_input_is_refused_with_the_field_named(store: ShardMapStore) -> None:
    with pytest.raises(InvalidArgument, match=r"addresses\[1\]"):
        await store.sync_shards(["a:1", "no-port"])
    with pytest.raises(InvalidArgument, match="share an address"):
        await store.sync_shards(["a:1", "a:1"])
    with pytest.raises(InvalidArgument, match="weights"):
        await store.sync_shards(["a:1", "b:1"], weights=[1])
    with pytest.raises(MapChangeRefused, match="weight above 0"):
        await store.sync_shards(["a:1"], weights=[0])
    assert await store.version() == 0


async def test_an_address_change_bumps_the_version_and_moves_no_slots(
    store: ShardMapStore,
) -> None:
    before = await store.sync_shards(THREE)
    after = await store.sync_shards([THREE[0], "10.9.9.9:6379", THREE[2]])
    assert after.version == 2
    assert after.shards[1].address == "10.9.9.9:6379"
    assert after.slots == before.slots


async def test_pin_and_unpin_override_the_slot(store: ShardMapStore) -> None:
    smap = await store.sync_shards(THREE)
    tenant = "hot-tenant"
    home = smap.shard_for(tenant)
    elsewhere = (home + 1) % 3
    pinned = await store.pin(tenant, elsewhere)
    assert pinned.version == 2
    assert pinned.shard_for(tenant) == elsewhere
    assert pinned.pins == {tenant: elsewhere}
    assert (await store.pin(tenant, elsewhere)).version == 2  # no change, no bump
    assert await store.unpin(tenant) is True
    assert await store.unpin(tenant) is False
    unpinned = await store.load()
    assert unpinned.version == 3
    assert unpinned.shard_for(tenant) == home == unpinned.slots[slot_of(tenant)]
    with pytest.raises(NotFound):
        await store.pin(tenant, 7)
    with pytest.raises(InvalidArgument):
        await store.pin("bad tenant:id", 0)


async def test_concurrent_changers_serialize_and_each_bumps_once(store: ShardMapStore) -> None:
    await store.sync_shards(THREE)
    await asyncio.gather(*(store.pin(f"tenant-{i}", i % 3) for i in range(10)))
    smap = await store.load()
    assert smap.version == 11
    assert len(smap.pins) == 10


async def test_moves_in_the_table_override_placement(store: ShardMapStore) -> None:
    await store.sync_shards(THREE)
    async with store._engine.begin() as conn:
        await conn.execute(
            db.moves.insert().values(tenant_id="moving", from_shard_id=0, to_shard_id=2)
        )
    smap = await store.load()
    assert smap.shard_for("moving") == 2
    assert smap.shards_for("moving") == (2, 0)
    assert [m.tenant_id for m in smap.tenants_moving_from(0)] == ["moving"]
    assert smap.moves["moving"].started_at_ms > 0


def follower(store: ShardMapStore, database_url: str, poll_interval_s: float) -> ShardMapFollower:
    return ShardMapFollower(store, database_url, poll_interval_s=poll_interval_s)


async def test_two_replicas_see_a_change_without_a_restart(
    store: ShardMapStore, database_url: str
) -> None:
    await store.sync_shards(THREE)
    replicas = [follower(store, database_url, 0.5), follower(store, database_url, 0.5)]
    for r in replicas:
        await r.start()
    try:
        assert all(r.current.version == 1 for r in replicas)
        changed = await store.sync_shards(FOUR)
        # Waited for, not timed (a loaded box is not a broken follower).
        seen = await asyncio.gather(*(r.wait_for_version(changed.version, 30) for r in replicas))
        assert all(s == changed for s in seen)
    finally:
        for r in replicas:
            await r.stop()


async def test_notification_alone_delivers_a_change(
    store: ShardMapStore, database_url: str
) -> None:
    await store.sync_shards(THREE)
    # A poll every 30 s cannot explain seeing the change within the 5 s below.
    replica = follower(store, database_url, 30.0)
    await replica.start()
    queue = replica.subscribe()
    heard: list[int] = []
    replica.on_change(lambda m: heard.append(m.version))
    try:
        await asyncio.sleep(0.2)  # let the follower's LISTEN take effect
        pinned = await store.pin("acme", 2)
        got = await replica.wait_for_version(pinned.version, 5)
        assert got.shard_for("acme") == 2
        assert (await asyncio.wait_for(queue.get(), 1)).version == pinned.version
        assert heard == [pinned.version]
    finally:
        await replica.stop()


async def test_polling_alone_catches_a_change_without_a_notification(
    store: ShardMapStore, database_url: str
) -> None:
    await store.sync_shards(THREE)
    replica = follower(store, database_url, 0.2)
    await replica.start()
    try:
        # A change whose NOTIFY never happened (as if lost with a dropped connection).
        with psycopg.connect(db.psycopg_dsn(database_url), autocommit=True) as conn:
            conn.execute("UPDATE shardq_map_version SET version = version + 1")
        assert (await replica.wait_for_version(2, 5)).version == 2
    finally:
        await replica.stop()


async def test_waiting_for_a_version_that_never_comes_times_out(
    store: ShardMapStore, database_url: str
) -> None:
    await store.sync_shards(THREE)
    replica = follower(store, database_url, 0.1)
    await replica.start()
    try:
        with pytest.raises(TimeoutError):
            await replica.wait_for_version(99, 0.3)
    finally:
        await replica.stop()


async def test_a_follower_needs_a_map_to_start(store: ShardMapStore, database_url: str) -> None:
    replica = follower(store, database_url, 0.1)
    with pytest.raises(MapNotInitialized):
        await replica.start()
    with pytest.raises(RuntimeError):
        _ = replica.current
    await replica.stop()


def test_the_cli_migrates_inits_syncs_and_shows_the_map(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url = db.psycopg_dsn(database_url)  # operators pass plain postgresql:// URLs
    # These shards do not exist: --skip-checks takes their addresses unchecked, and
    # --map-only changes the map without reaching them.
    template = ["--address", "shard-{i}.shardq-shard:6379", "--skip-checks"]
    assert cli.main(["migrate", "--database-url", url]) == 0
    assert cli.main(["shards", "init", "--shards", "3", *template, "--database-url", url]) == 0
    assert cli.main(["shards", "init", "--shards", "3", *template, "--database-url", url]) == 0
    assert "unchanged at version 1" in capsys.readouterr().out
    assert cli.main(["shards", "init", "--address", "a:1", "--database-url", url]) == 1
    assert "shards sync" in capsys.readouterr().err
    offline = ["--yes", "--map-only", "--database-url", url]
    assert cli.main(["shards", "sync", "--shards", "4", *template, *offline]) == 0
    out = capsys.readouterr().out
    assert "add shard 3 at shard-3.shardq-shard:6379" in out
    assert "1366 slots shard 0 -> 3" in out
    assert "shard map version 1 -> 2" in out
    assert cli.main(["shards", "sync", "--address", "a:1", *offline]) == 1
    assert "removing shards is not supported" in capsys.readouterr().err
    assert cli.main(["shards", "pin", "acme", "3", *offline]) == 0
    assert "pin acme to shard 3" in capsys.readouterr().out
    assert cli.main(["shards", "show", "--json", "--database-url", url]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["version"] == 3
    assert [s["address"] for s in shown["shards"]] == [
        f"shard-{i}.shardq-shard:6379" for i in range(4)
    ]
    assert [s["slots"] for s in shown["shards"]] == [4096] * 4
    assert shown["pins"] == {"acme": 3}
    assert cli.main(["shards", "show", "--database-url", url]) == 0
    table = capsys.readouterr().out
    assert "shard map version 3" in table
    assert "shard-3.shardq-shard:6379" in table


def test_the_cli_says_what_is_missing(
    database_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SHARDQ_DATABASE_URL", raising=False)
    assert cli.main(["shards", "show"]) == 1
    assert "--database-url or set SHARDQ_DATABASE_URL" in capsys.readouterr().err
    monkeypatch.setenv("SHARDQ_DATABASE_URL", database_url)
    assert cli.main(["shards", "show"]) == 1
    assert "run `shardq migrate` first" in capsys.readouterr().err
    assert cli.main(["migrate"]) == 0
    assert cli.main(["shards", "show"]) == 1
    assert "run `shardq shards init`" in capsys.readouterr().err


async def test_a_follower_relistens_after_its_connection_is_killed(
    store: ShardMapStore, database_url: str
) -> None:
    await store.sync_shards(THREE)
    replica = ShardMapFollower(store, database_url, poll_interval_s=30.0, retry_delay_s=0.1)
    await replica.start()
    try:
        await asyncio.sleep(0.2)
        with psycopg.connect(db.psycopg_dsn(database_url), autocommit=True) as conn:
            killed = conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND query LIKE 'LISTEN%'"
            ).fetchall()
        assert killed == [(True,)]
        await asyncio.sleep(0.5)  # reconnect and LISTEN again
        pinned = await store.pin("acme", 1)
        assert (await replica.wait_for_version(pinned.version, 5)).shard_for("acme") == 1
    finally:
        await replica.stop()
