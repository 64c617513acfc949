"""Retention and the dedupe window as tenant limits, and the index the retention purge reads.

``shardq_tenant_limits`` gains ``result_retention_s`` (seconds a finished job's result row is
kept; 0: the server default) and ``dedupe_window_s`` (seconds a request_id is deduplicated on
the shard; 0: the server default, 24 h).

``ix_shardq_results_tenant_id_finished_at`` lets the purge (``shardq.coordinator.retention``) find
one tenant's rows older than its cutoff by an index range, a batch at a time, instead of
reading every row of the tenant through the primary key. It is ``IF NOT EXISTS``: the upgrade
runs in one transaction (``shardq.store.migrate``), where ``CREATE INDEX`` blocks writes to
the table while it builds; on a large table an operator builds it first with
``CREATE INDEX CONCURRENTLY ix_shardq_results_tenant_id_finished_at ON shardq_results
(tenant_id, finished_at)`` and this revision then only adds the two columns.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    for name in ("result_retention_s", "dedupe_window_s"):
        op.add_column(
            "shardq_tenant_limits",
            sa.Column(name, sa.BigInteger, nullable=False, server_default="0"),
        )
    op.create_check_constraint(
        op.f("ck_shardq_tenant_limits_retention_not_negative"),
        "shardq_tenant_limits",
        "result_retention_s >= 0 AND dedupe_window_s >= 0",
    )
    op.create_index(
        op.f("ix_shardq_results_tenant_id_finished_at"),
        "shardq_results",
        ["tenant_id", "finished_at"],
        if_not_exists=True,
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_shardq_results_tenant_id_finished_at"), table_name="shardq_results")
    op.drop_constraint(
        op.f("ck_shardq_tenant_limits_retention_not_negative"), "shardq_tenant_limits"
    )
    op.drop_column("shardq_tenant_limits", "dedupe_window_s")
    op.drop_column("shardq_tenant_limits", "result_retention_s")
