"""Live workers, shared by every coordinator replica so all assign shards over the same set.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "shardq_workers",
        sa.Column("worker_id", sa.Text, nullable=False),
        sa.Column("hostname", sa.Text, nullable=False, server_default=""),
        sa.Column("concurrency", sa.Integer, nullable=False, server_default="0"),
        sa.Column("last_seen", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("worker_id", name=op.f("pk_shardq_workers")),
    )


def downgrade() -> None:
    op.drop_table("shardq_workers")
