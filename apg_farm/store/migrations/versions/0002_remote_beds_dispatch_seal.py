"""Remote beds (SSH, escrow fingerprints), broker dispatch bookkeeping, sealed sweeps.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("beds", schema=None) as batch_op:
        batch_op.add_column(sa.Column("escrow_files", sa.Text(), nullable=True))
        batch_op.add_column(
            sa.Column("escrow_recorded_at", sa.DateTime(timezone=True), nullable=True)
        )
        batch_op.add_column(sa.Column("ssh_user", sa.String(length=100), nullable=True))
        batch_op.add_column(sa.Column("ssh_port", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("identity_file", sa.Text(), nullable=True))
        batch_op.add_column(sa.Column("known_hosts", sa.Text(), nullable=True))
        batch_op.add_column(sa.Column("meta", sa.Text(), nullable=True))
    with op.batch_alter_table("sweeps", schema=None) as batch_op:
        batch_op.add_column(sa.Column("sealed_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("seal_sha256", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("meta", sa.Text(), nullable=True))
    with op.batch_alter_table("attempts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("enqueued_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(
            sa.Column("dispatches", sa.Integer(), nullable=False, server_default="0")
        )


def downgrade() -> None:
    with op.batch_alter_table("attempts", schema=None) as batch_op:
        batch_op.drop_column("dispatches")
        batch_op.drop_column("enqueued_at")
    with op.batch_alter_table("sweeps", schema=None) as batch_op:
        batch_op.drop_column("meta")
        batch_op.drop_column("seal_sha256")
        batch_op.drop_column("sealed_at")
    with op.batch_alter_table("beds", schema=None) as batch_op:
        for column in (
            "meta",
            "known_hosts",
            "identity_file",
            "ssh_port",
            "ssh_user",
            "escrow_recorded_at",
            "escrow_files",
        ):
            batch_op.drop_column(column)
