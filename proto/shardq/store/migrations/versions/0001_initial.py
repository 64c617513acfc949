"""The initial schema: shard map (shards, slots, pins, moves, version), tokens, results.

Written out by hand rather than generated from ``coordinator.db`` at run time, so this
revision means the same thing forever. Constraint names are the ones ``db.metadata``'s naming
convention gives, wrapped in ``op.f`` (final: alembic would otherwise apply the convention a
second time), so an autogenerate comparison against the models comes out empty.

Revision ID: 0001
Revises:
Create Date: 2025-01-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

NOW = sa.text("now()")


def upgrade() -> None:
    op.create_table(
        "shardq_shards",
        sa.Column("shard_id", sa.Integer, autoincrement=False, nullable=False),
        sa.Column("address", sa.Text, nullable=False),
        sa.Column("weight", sa.Integer, nullable=False, server_default="1"),
        sa.Column("state", sa.Text, nullable=False, server_default="active"),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=NOW),
        sa.PrimaryKeyConstraint("shard_id", name=op.f("pk_shardq_shards")),
        sa.CheckConstraint("state IN ('active', 'draining')", name=op.f("ck_shardq_shards_state")),
        sa.CheckConstraint("weight >= 0", name=op.f("ck_shardq_shards_weight")),
        sa.CheckConstraint("shard_id >= 0", name=op.f("ck_shardq_shards_shard_id")),
    )
    op.create_table(
        "shardq_slots",
        sa.Column("slot", sa.Integer, autoincrement=False, nullable=False),
        sa.Column("shard_id", sa.Integer, nullable=False),
        sa.PrimaryKeyConstraint("slot", name=op.f("pk_shardq_slots")),
        sa.ForeignKeyConstraint(
            ["shard_id"],
            ["shardq_shards.shard_id"],
            name=op.f("fk_shardq_slots_shard_id_shardq_shards"),
        ),
        sa.CheckConstraint("slot >= 0 AND slot < 16384", name=op.f("ck_shardq_slots_slot")),
    )
    op.create_table(
        "shardq_pins",
        sa.Column("tenant_id", sa.Text, nullable=False),
        sa.Column("shard_id", sa.Integer, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=NOW),
        sa.PrimaryKeyConstraint("tenant_id", name=op.f("pk_shardq_pins")),
        sa.ForeignKeyConstraint(
            ["shard_id"],
            ["shardq_shards.shard_id"],
            name=op.f("fk_shardq_pins_shard_id_shardq_shards"),
        ),
    )
    op.create_table(
        "shardq_moves",
        sa.Column("tenant_id", sa.Text, nullable=False),
        sa.Column("from_shard_id", sa.Integer, nullable=False),
        sa.Column("to_shard_id", sa.Integer, nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False, server_default=NOW),
        sa.PrimaryKeyConstraint("tenant_id", name=op.f("pk_shardq_moves")),
        sa.ForeignKeyConstraint(
            ["from_shard_id"],
            ["shardq_shards.shard_id"],
            name=op.f("fk_shardq_moves_from_shard_id_shardq_shards"),
        ),
        sa.ForeignKeyConstraint(
            ["to_shard_id"],
            ["shardq_shards.shard_id"],
            name=op.f("fk_shardq_moves_to_shard_id_shardq_shards"),
        ),
    )
    op.create_table(
        "shardq_map_version",
        sa.Column("id", sa.Integer, autoincrement=False, nullable=False),
        sa.Column("version", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_shardq_map_version")),
        sa.CheckConstraint("id = 1", name=op.f("ck_shardq_map_version_single_row")),
    )
    # Version 0 means "no map yet"; the row exists from the start so changers can lock it.
    op.execute("INSERT INTO shardq_map_version (id, version) VALUES (1, 0)")
    op.create_table(
        "shardq_tokens",
        sa.Column("token_id", sa.Text, nullable=False),
        sa.Column("token_hash", sa.Text, nullable=False),
        sa.Column("role", sa.Text, nullable=False),
        sa.Column("tenant_id", sa.Text, nullable=True),
        sa.Column("name", sa.Text, nullable=False, server_default=""),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=NOW),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("token_id", name=op.f("pk_shardq_tokens")),
        sa.UniqueConstraint("token_hash", name=op.f("uq_shardq_tokens_token_hash")),
        sa.CheckConstraint(
            "role IN ('tenant', 'admin', 'worker')", name=op.f("ck_shardq_tokens_role")
        ),
        sa.CheckConstraint(
            "(role = 'tenant') = (tenant_id IS NOT NULL)",
            name=op.f("ck_shardq_tokens_tenant_iff_role"),
        ),
    )
    op.create_table(
        "shardq_results",
        sa.Column("tenant_id", sa.Text, nullable=False),
        sa.Column("request_id", sa.Text, nullable=False),
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
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=False, server_default=NOW),
        sa.PrimaryKeyConstraint("tenant_id", "request_id", name=op.f("pk_shardq_results")),
        sa.CheckConstraint(
            "status IN ('succeeded', 'failed', 'dead', 'cancelled')",
            name=op.f("ck_shardq_results_status"),
        ),
    )
    op.create_index(op.f("ix_shardq_results_job_id"), "shardq_results", ["job_id"])


def downgrade() -> None:
    op.drop_index(op.f("ix_shardq_results_job_id"), table_name=op.f("shardq_results"))
    for table in (
        "shardq_results",
        "shardq_tokens",
        "shardq_map_version",
        "shardq_moves",
        "shardq_pins",
        "shardq_slots",
        "shardq_shards",
    ):
        op.drop_table(table)
