"""What each task's grade reads, pinned per bed baseline (`dataset_pins`): the dataset and task
sha256 a grade at baseline named, so an envelope naming others is TAMPERED (issue #28, part 3).

Revision ID: 0017
Revises: 0016
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "dataset_pins",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("baseline_key", sa.String(16), nullable=False),
        sa.Column("escrow_sha256", sa.String(64), nullable=False),
        sa.Column("task", sa.String(255), nullable=False),
        sa.Column("dataset", sa.String(255), nullable=False),
        sa.Column("dataset_sha256", sa.String(256), nullable=True),
        sa.Column("task_sha256", sa.String(256), nullable=True),
        sa.Column("dataset_path", sa.String(256), nullable=True),
        sa.Column("note", sa.Text(), nullable=True),
        sa.Column("source", sa.String(40), nullable=False),
        sa.Column("bed_id", sa.Integer(), nullable=True),
        sa.Column("execution_id", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_dataset_pins")),
        sa.UniqueConstraint(
            "baseline_key", "escrow_sha256", "task", "dataset", name="uq_dataset_pins_key"
        ),
    )


def downgrade() -> None:
    op.drop_table("dataset_pins")
