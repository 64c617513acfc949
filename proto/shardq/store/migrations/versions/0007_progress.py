"""The handler's last progress report in the result row.

``shardq_results`` gains ``progress`` (JSONB, NULL for a job whose handler never reported
one): ``{"fraction": 0.4, "message": "resized 4/10", "updated_at_unix_ms": ...}``, the names
of ``shardq.v1.JobProgress``. Adding a nullable column without a default changes only the
catalog: no rewrite of the table, no long lock.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("shardq_results", sa.Column("progress", JSONB, nullable=True))


def downgrade() -> None:
    op.drop_column("shardq_results", "progress")
