"""Provider outages as the farm believes them: when each model's current outage began, and
whether a run that started after it ended clean (pacing.believe_outage).

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain ADD COLUMNs, no table copy on SQLite.
    op.add_column("model_gates", sa.Column("outage_since", sa.DateTime(timezone=True)))
    op.add_column("model_gates", sa.Column("outage_ended_at", sa.DateTime(timezone=True)))


def downgrade() -> None:
    with op.batch_alter_table("model_gates") as batch:
        batch.drop_column("outage_ended_at")
        batch.drop_column("outage_since")
