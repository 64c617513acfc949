"""Whether a tenant move has started copying.

``shardq_moves`` gains ``copying`` (false until the mover, just before it first takes
anything off the move's source, sets it while the row still exists). ``shardq moves abort``
deletes only rows where it is false, so an abort and a mover's first take serialize on the
row: an abort never succeeds once copying may have begun, and a move aborted first is never
started. A column with a constant default changes only the catalog (no table rewrite).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-04
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "shardq_moves",
        sa.Column("copying", sa.Boolean, nullable=False, server_default=sa.false()),
    )


def downgrade() -> None:
    op.drop_column("shardq_moves", "copying")
