"""Alembic environment, driven programmatically by :func:`coordinator.migrate.upgrade`.

``upgrade`` hands over an open connection (inside the transaction that holds the advisory
lock) through ``config.attributes["connection"]``; the ``alembic`` command line works too,
given ``-x url=...`` or ``sqlalchemy.url``, e.g. ``alembic -c coordinator/migrations/alembic.ini
upgrade head --sql`` to print the DDL for review.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy.engine import Connection

from shardq.store import db

config = context.config
target_metadata = db.metadata


def _url() -> str:
    url = context.get_x_argument(as_dictionary=True).get("url") or config.get_main_option(
        "sqlalchemy.url"
    )
    if not url:
        raise RuntimeError("no database URL: pass -x url=postgresql://... or set sqlalchemy.url")
    return db.sqlalchemy_url(url)


def _run(connection: Connection) -> None:
    context.configure(connection=connection, target_metadata=target_metadata)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_offline() -> None:
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = db.make_sync_engine(_url())
    try:
        with engine.connect() as conn:
            _run(conn)
            conn.commit()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
