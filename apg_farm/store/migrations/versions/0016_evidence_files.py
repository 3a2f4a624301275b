"""Evidence off the bed (issue #28): each execution's run folder is moved to an evidence folder
on the worker host (or the SSH bed's host); its files' paths, sizes and sha256 are kept here and
sealed with the sweep.

Revision ID: 0016
Revises: 0015
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("executions", sa.Column("evidence_dir", sa.Text()))
    op.add_column("executions", sa.Column("evidence_host", sa.String(255)))
    op.add_column("executions", sa.Column("evidence_meta", sa.Text()))
    op.create_table(
        "evidence_files",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column(
            "execution_id",
            sa.Integer(),
            sa.ForeignKey("executions.id", name="fk_evidence_files_execution_id_executions"),
            nullable=False,
        ),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("truncated", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_evidence_files"),
        sa.UniqueConstraint("execution_id", "path", name="uq_evidence_files_path"),
    )
    op.create_index(
        "ix_evidence_files_execution_id", "evidence_files", ["execution_id"], unique=False
    )


def downgrade() -> None:
    op.drop_index("ix_evidence_files_execution_id", table_name="evidence_files")
    op.drop_table("evidence_files")
    with op.batch_alter_table("executions") as batch:
        batch.drop_column("evidence_meta")
        batch.drop_column("evidence_host")
        batch.drop_column("evidence_dir")
