"""Each live worker's queues and handler names: shards are dealt per queue over the workers
serving it, and the coordinator can tell whether some live worker of a queue has a handler.

Rows written before this revision (workers of a replica not yet upgraded) serve ``default``.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "shardq_workers",
        sa.Column(
            "queues",
            postgresql.ARRAY(sa.Text),
            nullable=False,
            server_default=sa.text("'{default}'"),
        ),
    )
    op.add_column(
        "shardq_workers",
        sa.Column(
            "handlers", postgresql.ARRAY(sa.Text), nullable=False, server_default=sa.text("'{}'")
        ),
    )


def downgrade() -> None:
    op.drop_column("shardq_workers", "handlers")
    op.drop_column("shardq_workers", "queues")
