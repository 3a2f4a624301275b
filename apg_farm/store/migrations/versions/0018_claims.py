"""What claims the farm could not check have cost each model (`claim_gates`): the last bed one
quarantined, and the model's pause once another would (issue #29).

Revision ID: 0018_claims
Revises: 0017
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018_claims"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "claim_gates",
        sa.Column("model", sa.String(255), nullable=False),
        sa.Column("quarantined_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("quarantined_bed_id", sa.Integer(), nullable=True),
        sa.Column("paused_reason", sa.Text(), nullable=True),
        sa.Column("paused_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("model", name=op.f("pk_claim_gates")),
    )


def downgrade() -> None:
    op.drop_table("claim_gates")
