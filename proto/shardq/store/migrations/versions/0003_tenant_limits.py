"""Tenant limits as data: one row per tenant an admin gave limits (AdminService.SetTenantLimits).

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "shardq_tenant_limits",
        sa.Column("tenant_id", sa.Text, nullable=False),
        sa.Column("weight", sa.Integer, nullable=False, server_default="0"),
        sa.Column("max_active", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("submit_rate_per_s", sa.Double, nullable=False, server_default="0"),
        sa.Column("submit_burst", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("max_pending", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("max_pending_bytes", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            nullable=False,
            server_default=sa.text("now()"),
        ),
        sa.PrimaryKeyConstraint("tenant_id", name=op.f("pk_shardq_tenant_limits")),
        sa.CheckConstraint(
            "weight >= 0 AND weight <= 1000", name=op.f("ck_shardq_tenant_limits_weight")
        ),
        sa.CheckConstraint(
            "max_active >= 0 AND submit_rate_per_s >= 0 AND submit_burst >= 0 "
            "AND max_pending >= 0 AND max_pending_bytes >= 0",
            name=op.f("ck_shardq_tenant_limits_not_negative"),
        ),
    )


def downgrade() -> None:
    op.drop_table("shardq_tenant_limits")
