"""shardq's Postgres schema (SQLAlchemy Core) and engine factories.

This ``metadata`` is what the code queries; the alembic revisions under
``shardq/store/migrations/versions`` are what creates it, spelled out by hand so a migration
never changes because the models did. ``tests/integration/test_migrations.py`` checks the two
agree.

Every table is prefixed ``shardq_`` so the schema can share a database with an application.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from shardq.common.placement import SHARD_STATES, SLOT_COUNT

T = TypeVar("T")

#: Channel of ``NOTIFY`` sent (payload: the new version) whenever the shard map changes.
MAP_CHANNEL = "shardq_map"
#: Token roles: a tenant token acts on one tenant's jobs, admin on everything, worker claims.
TOKEN_ROLES = ("tenant", "admin", "worker")
#: Terminal job states recorded in ``shardq_results``.
RESULT_STATUSES = ("succeeded", "failed", "dead", "cancelled")

# Constraint names fixed here so migrations and error messages name them the same way.
metadata = sa.MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)


def _in(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


def _now() -> sa.TextClause:
    return sa.text("now()")


shards = sa.Table(
    "shardq_shards",
    metadata,
    sa.Column("shard_id", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("address", sa.Text, nullable=False),
    sa.Column("weight", sa.Integer, nullable=False, server_default="1"),
    sa.Column("state", sa.Text, nullable=False, server_default="active"),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=_now()),
    sa.CheckConstraint(_in("state", SHARD_STATES), name="state"),
    sa.CheckConstraint("weight >= 0", name="weight"),
    sa.CheckConstraint("shard_id >= 0", name="shard_id"),
)

# One row per slot (16,384 rows): the slot table of the placement. Rewritten only in the
# rows whose owner changes.
slots = sa.Table(
    "shardq_slots",
    metadata,
    sa.Column("slot", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("shard_id", sa.Integer, sa.ForeignKey(shards.c.shard_id), nullable=False),
    sa.CheckConstraint(f"slot >= 0 AND slot < {SLOT_COUNT}", name="slot"),
)

pins = sa.Table(
    "shardq_pins",
    metadata,
    sa.Column("tenant_id", sa.Text, primary_key=True),
    sa.Column("shard_id", sa.Integer, sa.ForeignKey(shards.c.shard_id), nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=_now()),
)

# Live tenant migrations in progress (the rebalancer writes these; placement reads them).
moves = sa.Table(
    "shardq_moves",
    metadata,
    sa.Column("tenant_id", sa.Text, primary_key=True),
    sa.Column("from_shard_id", sa.Integer, sa.ForeignKey(shards.c.shard_id), nullable=False),
    sa.Column("to_shard_id", sa.Integer, sa.ForeignKey(shards.c.shard_id), nullable=False),
    sa.Column("started_at", sa.DateTime(timezone=True), nullable=False, server_default=_now()),
    # The map version the change that recorded the move committed as: the moves of one
    # command share it, so that command acts on its own moves only (0006; NULL before).
    sa.Column("change_version", sa.BigInteger, nullable=True),
    # Set by the mover just before it first takes anything off the source; `moves abort`
    # deletes only rows where it is false, so the two serialize on the row (0008).
    sa.Column("copying", sa.Boolean, nullable=False, server_default=sa.false()),
)

# A single row: the map's version, bumped in the same transaction as every map change.
map_version = sa.Table(
    "shardq_map_version",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("version", sa.BigInteger, nullable=False),
    sa.CheckConstraint("id = 1", name="single_row"),
)

tokens = sa.Table(
    "shardq_tokens",
    metadata,
    # Public part of the token (12 hex chars); safe to log and to show in `tokens list`.
    sa.Column("token_id", sa.Text, primary_key=True),
    # sha256 hex of the whole token; the token itself is never stored.
    sa.Column("token_hash", sa.Text, nullable=False, unique=True),
    sa.Column("role", sa.Text, nullable=False),
    sa.Column("tenant_id", sa.Text, nullable=True),
    sa.Column("name", sa.Text, nullable=False, server_default=""),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=_now()),
    sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
    sa.CheckConstraint(_in("role", TOKEN_ROLES), name="role"),
    sa.CheckConstraint("(role = 'tenant') = (tenant_id IS NOT NULL)", name="tenant_iff_role"),
)

workers = sa.Table(
    "shardq_workers",
    metadata,
    # A worker is live while some coordinator replica refreshes last_seen for its open
    # assignment stream; every replica assigns shards over the same live set.
    sa.Column("worker_id", sa.Text, primary_key=True),
    sa.Column("hostname", sa.Text, nullable=False, server_default=""),
    sa.Column("concurrency", sa.Integer, nullable=False, server_default="0"),
    sa.Column("last_seen", sa.DateTime(timezone=True), nullable=False),
    # The queues the worker claims from (shards are dealt per queue over the workers serving
    # it), and the names of its handlers (whether some live worker of a queue can run a job).
    sa.Column("queues", ARRAY(sa.Text), nullable=False, server_default=sa.text("'{default}'")),
    sa.Column("handlers", ARRAY(sa.Text), nullable=False, server_default=sa.text("'{}'")),
)

# One row per finished job (succeeded, dead, cancelled), written by the worker that finished
# it or by the shard loop for a job that ended without one (INSERT ... ON CONFLICT DO UPDATE
# ... WHERE status = 'dead', shardq.store.results): only a dead row is ever replaced, so a
# late or duplicate completion changes nothing.
results = sa.Table(
    "shardq_results",
    metadata,
    sa.Column("tenant_id", sa.Text, primary_key=True),
    sa.Column("request_id", sa.Text, primary_key=True),
    sa.Column("job_id", sa.Text, nullable=False),
    sa.Column("shard_id", sa.Integer, nullable=True),
    sa.Column("handler", sa.Text, nullable=False),
    sa.Column("status", sa.Text, nullable=False),
    sa.Column("result", JSONB, nullable=True),
    sa.Column("error", sa.Text, nullable=True),
    sa.Column("attempts", sa.Integer, nullable=False),
    sa.Column("fence", sa.BigInteger, nullable=False),
    sa.Column("worker_id", sa.Text, nullable=False),
    sa.Column("queued_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("finished_at", sa.DateTime(timezone=True), nullable=False, server_default=_now()),
    # The handler's last ctx.progress report, {"fraction", "message", "updated_at_unix_ms"}
    # as in shardq.v1.JobProgress; NULL when it reported none (0007).
    sa.Column("progress", JSONB, nullable=True),
    sa.CheckConstraint(_in("status", RESULT_STATUSES), name="status"),
    sa.Index(None, "job_id"),
    # The retention purge's range: one tenant's rows finished before its cutoff (0005).
    sa.Index(None, "tenant_id", "finished_at"),
)


#: Largest weight a tenant may be given (AdminService.SetTenantLimits).
MAX_TENANT_WEIGHT = 1000

# One row per tenant whose limits an admin set (AdminService.SetTenantLimits): the source of
# truth for the ``limits:{t}`` hash the coordinator pushes to the tenant's shard. A column at 0
# takes the coordinator's default (SHARDQ_TENANT_LIMITS and its flags).
tenant_limits = sa.Table(
    "shardq_tenant_limits",
    metadata,
    sa.Column("tenant_id", sa.Text, primary_key=True),
    # Jobs per round-robin turn against the shard's other tenants (1-1000; 0: the default).
    sa.Column("weight", sa.Integer, nullable=False, server_default="0"),
    # Most jobs ACTIVE at once.
    sa.Column("max_active", sa.BigInteger, nullable=False, server_default="0"),
    # Submits per second (token bucket) and the bucket's size.
    sa.Column("submit_rate_per_s", sa.Double, nullable=False, server_default="0"),
    sa.Column("submit_burst", sa.BigInteger, nullable=False, server_default="0"),
    # Most jobs, and payload bytes, SCHEDULED + READY + ACTIVE at once.
    sa.Column("max_pending", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("max_pending_bytes", sa.BigInteger, nullable=False, server_default="0"),
    # Seconds a finished job's result row is kept (shardq.coordinator.retention), and seconds a
    # request_id stays deduplicated on the shard (0: the server's defaults).
    sa.Column("result_retention_s", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("dedupe_window_s", sa.BigInteger, nullable=False, server_default="0"),
    # WatchJob streams open at once per coordinator process (0: its default) (0009).
    sa.Column("max_watch_streams", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=_now()),
    sa.CheckConstraint(f"weight >= 0 AND weight <= {MAX_TENANT_WEIGHT}", name="weight"),
    sa.CheckConstraint(
        "max_active >= 0 AND submit_rate_per_s >= 0 AND submit_burst >= 0 "
        "AND max_pending >= 0 AND max_pending_bytes >= 0",
        name="not_negative",
    ),
    sa.CheckConstraint(
        "result_retention_s >= 0 AND dedupe_window_s >= 0", name="retention_not_negative"
    ),
    sa.CheckConstraint("max_watch_streams >= 0", name="watch_streams_not_negative"),
)


def sqlalchemy_url(url: str) -> str:
    """``url`` with the psycopg 3 driver: plain ``postgresql://``/``postgres://`` URLs work too."""
    for scheme in ("postgresql://", "postgres://", "postgresql+psycopg2://"):
        if url.startswith(scheme):
            return "postgresql+psycopg://" + url[len(scheme) :]
    return url


def psycopg_dsn(url: str) -> str:
    """``url`` as libpq/psycopg takes it (no SQLAlchemy driver suffix)."""
    for scheme in ("postgresql+psycopg://", "postgresql+psycopg2://", "postgres://"):
        if url.startswith(scheme):
            return "postgresql://" + url[len(scheme) :]
    return url


def make_engine(url: str) -> AsyncEngine:
    """The async engine a process's components share (one pool per process).

    ``pool_pre_ping`` because Postgres restarts and failovers leave dead pooled connections
    that would otherwise fail the first request after them.
    """
    return create_async_engine(sqlalchemy_url(url), pool_pre_ping=True)


def make_sync_engine(url: str) -> sa.Engine:
    """A blocking engine, for migrations and one-shot CLI work."""
    return sa.create_engine(sqlalchemy_url(url), pool_pre_ping=True)


class Uncancellable:
    """Runs database calls in tasks that a cancellation of the caller does not cut.

    SQLAlchemy's pool loses a DBAPI connection when the task is cancelled while the pool is
    still setting the new connection up: nothing closes it, and it is only reclaimed (with a
    ResourceWarning) by the garbage collector. Background loops and stream clean-ups, which
    are cancelled at shutdown or when a client goes away, go through here instead; the caller
    still sees its cancellation at once, and ``drain`` waits for the calls left running
    before the engine is disposed.
    """

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    async def run(self, call: Coroutine[Any, Any, T]) -> T:
        task = asyncio.create_task(call)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return await asyncio.shield(task)

    async def drain(self, timeout_s: float = 5.0) -> None:
        if not self._tasks:
            return
        pending = set(self._tasks)
        _, late = await asyncio.wait(pending, timeout=timeout_s)
        for task in late:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
