"""A tenant's cap on open WatchJob streams.

``shardq_tenant_limits`` gains ``max_watch_streams`` (0: the coordinator's default,
``--max-streams-per-tenant``), read by the coordinators' gate when a stream opens. A column
with a constant default changes only the catalog (no table rewrite).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-04
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "shardq_tenant_limits",
        sa.Column("max_watch_streams", sa.BigInteger, nullable=False, server_default="0"),
    )
    op.create_check_constraint(
        op.f("ck_shardq_tenant_limits_watch_streams_not_negative"),
        "shardq_tenant_limits",
        "max_watch_streams >= 0",
    )


def downgrade() -> None:
    op.drop_constraint(
        op.f("ck_shardq_tenant_limits_watch_streams_not_negative"), "shardq_tenant_limits"
    )
    op.drop_column("shardq_tenant_limits", "max_watch_streams")
