"""A throwaway database per test on a real PostgreSQL.

The server is the one at SHARDQ_TEST_DATABASE_URL (default: the machine's, trust auth). Where
none answers and a Docker engine runs, testcontainers starts one; where neither works the
test fails with a message saying so — never a skip.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg import sql

DEFAULT_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
# The one container this test process started, if any (started once, reused).
_container: dict[str, str] = {}


def admin_url() -> str:
    url = os.environ.get("SHARDQ_TEST_DATABASE_URL", DEFAULT_ADMIN_URL)
    try:
        with psycopg.connect(url, connect_timeout=3):
            return url
    except psycopg.OperationalError as first:
        if "url" in _container:
            return _container["url"]
        try:
            from testcontainers.postgres import PostgresContainer  # noqa: PLC0415

            container = PostgresContainer("postgres:16", driver=None).start()
            _container["url"] = container.get_connection_url()
            return _container["url"]
        except Exception as exc:  # docker.errors.DockerException where no engine runs
            raise RuntimeError(
                f"no PostgreSQL for the tests: {url} refused ({first}) and testcontainers "
                f"could not start one ({exc!r}). Start PostgreSQL or set SHARDQ_TEST_DATABASE_URL."
            ) from exc


def _with_db(url: str, name: str) -> str:
    base, _, _ = url.rpartition("/")
    return f"{base}/{name}"


@contextmanager
def throwaway_database() -> Iterator[str]:
    """Create a fresh database, yield its psycopg URL, drop it afterwards."""
    admin = admin_url()
    name = f"shardq_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield _with_db(admin, name)
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def sqlalchemy_url(psycopg_url: str) -> str:
    """The same database as a SQLAlchemy URL with the psycopg 3 driver."""
    return psycopg_url.replace("postgresql://", "postgresql+psycopg://", 1)
