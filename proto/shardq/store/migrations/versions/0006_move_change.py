"""The change that recorded a tenant move.

``shardq_moves`` gains ``change_version``: the shard-map version the placement change that
recorded the move committed as. Every move one command records carries the same value, so
that command watches (and, run by hand, runs) its own moves only, and tells the operator of
the others pending. NULL for moves recorded before this revision (they belong to no command).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("shardq_moves", sa.Column("change_version", sa.BigInteger, nullable=True))


def downgrade() -> None:
    op.drop_column("shardq_moves", "change_version")
