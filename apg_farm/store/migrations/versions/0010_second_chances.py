"""Second chances: how often an attempt was re-run on the word of a run that may have been the
agent's, and each model's current provider outage (when it began, whether a clean run ended it).

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
    # Plain ADD COLUMNs: a batch copy of `attempts` would drop it under the executions' keys.
    op.add_column(
        "attempts", sa.Column("agent_reruns", sa.Integer(), nullable=False, server_default="0")
    )
    op.add_column("model_gates", sa.Column("outage_since", sa.DateTime(timezone=True)))
    op.add_column("model_gates", sa.Column("outage_ended_at", sa.DateTime(timezone=True)))


def downgrade() -> None:
    with op.batch_alter_table("model_gates") as batch:
        batch.drop_column("outage_ended_at")
        batch.drop_column("outage_since")
    with op.batch_alter_table("attempts") as batch:
        batch.drop_column("agent_reruns")
