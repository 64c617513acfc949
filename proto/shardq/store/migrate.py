"""Run shardq's alembic migrations from code (``shardq migrate``, a Helm hook, tests).

No ``alembic.ini`` is needed: the Config is built here with the migrations' package path.
Every coordinator replica or hook may call :func:`upgrade` at start-up at the same time:
a transaction-level advisory lock makes them take turns, and the ones that come second find
the schema at head and do nothing.
"""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from shardq.store import db

#: Key of the advisory lock serializing migrations (any fixed 64-bit number; "shardqmg").
MIGRATION_LOCK_KEY = 0x73686172_64716D67
MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    # ConfigParser interpolation: a literal % in a password must be doubled.
    cfg.set_main_option("sqlalchemy.url", db.sqlalchemy_url(url).replace("%", "%%"))
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    """Bring the schema at ``url`` to ``revision``; a no-op when it is there already.

    Runs in one transaction holding ``pg_advisory_xact_lock``, so two processes upgrading
    at once serialize and the lock can never outlive a crashed migrator (Postgres DDL is
    transactional: a failed upgrade leaves the schema as it was).
    """
    cfg = alembic_config(url)
    engine = db.make_sync_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": MIGRATION_LOCK_KEY})
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, revision)
    finally:
        engine.dispose()


def current_revision(url: str) -> str | None:
    """The revision the database at ``url`` is at, or None before the first migration."""
    engine = db.make_sync_engine(url)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()


def head_revision() -> str:
    """The newest revision this code ships."""
    head = ScriptDirectory.from_config(alembic_config("postgresql://")).get_current_head()
    if head is None:
        raise RuntimeError(f"no alembic revisions under {MIGRATIONS_DIR}")
    return head
