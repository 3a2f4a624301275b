"""Worker heartbeats: which worker processes are alive, for which bed and pool.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "worker_beats",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("name", sa.String(255), nullable=False, unique=True),
        sa.Column("bed_id", sa.Integer(), sa.ForeignKey("beds.id"), nullable=True),
        sa.Column("pool", sa.String(255), nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("seen_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_worker_beats_bed_id", "worker_beats", ["bed_id"])
    op.create_index("ix_worker_beats_pool", "worker_beats", ["pool"])
    op.create_index("ix_worker_beats_seen_at", "worker_beats", ["seen_at"])


def downgrade() -> None:
    op.drop_table("worker_beats")
