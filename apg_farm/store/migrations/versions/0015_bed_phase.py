"""The bed command running now and when it started (`beds.phase`, `beds.phase_started_at`),
written as each phase starts, so the live views show what really runs instead of guessing from
the last phase recorded.

Revision ID: 0015
Revises: 0014
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain ADD COLUMNs, no table copy on SQLite; no bed runs anything during a migration.
    op.add_column("beds", sa.Column("phase", sa.String(40)))
    op.add_column("beds", sa.Column("phase_started_at", sa.DateTime(timezone=True)))


def downgrade() -> None:
    with op.batch_alter_table("beds") as batch:
        batch.drop_column("phase_started_at")
        batch.drop_column("phase")
