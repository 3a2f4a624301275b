"""Beds: the DDEV configuration's fingerprint, the escrowed grader hash, an untrusted-verifier flag,
and whether web commands run in a web container (where an agent's processes outlive its run).

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("beds") as batch:
        batch.add_column(sa.Column("ddev_files", sa.Text(), nullable=True))
        batch.add_column(sa.Column("grader_tree_sha256", sa.String(64), nullable=True))
        batch.add_column(
            sa.Column("untrusted_verifier", sa.Boolean(), nullable=False, server_default=sa.false())
        )
        batch.add_column(
            sa.Column("web_container", sa.Boolean(), nullable=False, server_default=sa.true())
        )


def downgrade() -> None:
    with op.batch_alter_table("beds") as batch:
        batch.drop_column("web_container")
        batch.drop_column("untrusted_verifier")
        batch.drop_column("grader_tree_sha256")
        batch.drop_column("ddev_files")
