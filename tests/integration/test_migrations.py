"""Migrations against a real Postgres: repeatable, safe to race, and in step with db.metadata."""

from __future__ import annotations

import concurrent.futures

import psycopg
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from shardq.store import db
from shardq.store.migrate import current_revision, head_revision, upgrade

TABLES = {
    "shardq_shards",
    "shardq_slots",
    "shardq_pins",
    "shardq_moves",
    "shardq_map_version",
    "shardq_tokens",
    "shardq_results",
    "shardq_tenant_limits",
}


def tables(url: str) -> set[str]:
    with psycopg.connect(db.psycopg_dsn(url)) as conn:
        rows = conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        return {r[0] for r in rows}


def constraint_names(inspector: sa.Inspector, table: str) -> set[str]:
    names = {inspector.get_pk_constraint(table)["name"]}
    names |= {c["name"] for c in inspector.get_check_constraints(table)}
    names |= {c["name"] for c in inspector.get_foreign_keys(table)}
    names |= {c["name"] for c in inspector.get_unique_constraints(table)}
    names |= {c["name"] for c in inspector.get_indexes(table) if not c.get("duplicates_constraint")}
    return {str(n) for n in names}


def test_upgrade_creates_every_table_at_head(database_url: str) -> None:
    assert current_revision(database_url) is None
    upgrade(database_url)
    assert tables(database_url) >= TABLES
    assert current_revision(database_url) == head_revision()
    with psycopg.connect(db.psycopg_dsn(database_url)) as conn:
        assert conn.execute("SELECT id, version FROM shardq_map_version").fetchall() == [(1, 0)]


def test_upgrading_twice_changes_nothing(database_url: str) -> None:
    upgrade(database_url)
    with psycopg.connect(db.psycopg_dsn(database_url), autocommit=True) as conn:
        conn.execute("INSERT INTO shardq_shards (shard_id, address) VALUES (0, 'a:1')")
    upgrade(database_url)
    assert current_revision(database_url) == head_revision()
    with psycopg.connect(db.psycopg_dsn(database_url)) as conn:
        assert conn.execute("SELECT address FROM shardq_shards").fetchall() == [("a:1",)]
        assert conn.execute("SELECT count(*) FROM shardq_map_version").fetchone() == (1,)


def test_concurrent_upgrades_both_succeed(database_url: str) -> None:
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        for outcome in [pool.submit(upgrade, database_url) for _ in range(4)]:
            outcome.result(timeout=60)
    assert tables(database_url) >= TABLES
    assert current_revision(database_url) == head_revision()


def test_plain_postgresql_urls_work(database_url: str) -> None:
    upgrade(db.psycopg_dsn(database_url))
    assert current_revision(database_url) == head_revision()


def test_the_migration_matches_the_models(database_url: str) -> None:
    upgrade(database_url)
    engine = db.make_sync_engine(database_url)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={"compare_server_default": True})
            assert compare_metadata(context, db.metadata) == []
            inspector = sa.inspect(conn)
            for table in db.metadata.sorted_tables:
                in_models = {str(c.name) for c in table.constraints}
                in_models |= {str(i.name) for i in table.indexes}
                assert constraint_names(inspector, table.name) == in_models, table.name
    finally:
        engine.dispose()


def test_check_constraints_hold(database_url: str) -> None:
    upgrade(database_url)
    bad = [
        "INSERT INTO shardq_shards (shard_id, address, state) VALUES (1, 'a:1', 'gone')",
        "INSERT INTO shardq_map_version (id, version) VALUES (2, 0)",
        "INSERT INTO shardq_tokens (token_id, token_hash, role) VALUES ('a', 'h', 'tenant')",
        "INSERT INTO shardq_tokens (token_id, token_hash, role, tenant_id) "
        "VALUES ('a', 'h', 'admin', 't')",
        "INSERT INTO shardq_tokens (token_id, token_hash, role) VALUES ('a', 'h', 'root')",
        "INSERT INTO shardq_tenant_limits (tenant_id, weight) VALUES ('a', 1001)",
        "INSERT INTO shardq_tenant_limits (tenant_id, max_pending) VALUES ('a', -1)",
        "INSERT INTO shardq_tenant_limits (tenant_id, submit_rate_per_s) VALUES ('a', -0.5)",
    ]
    with psycopg.connect(db.psycopg_dsn(database_url), autocommit=True) as conn:
        conn.execute("INSERT INTO shardq_shards (shard_id, address) VALUES (0, 'a:1')")
        bad.append("INSERT INTO shardq_slots (slot, shard_id) VALUES (16384, 0)")
        for statement in bad:
            try:
                conn.execute(statement)
            except psycopg.errors.CheckViolation:
                continue
            raise AssertionError(f"accepted: {statement}")
