"""Each execution names the baseline its bed reset to (fixture-set key and code versions,
`bed_baselines`) and the escrow set it was verified against, so a sweep that ran across a
rolling upgrade says so and is not compared as if it had not.

Revision ID: 0013
Revises: 0012
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "bed_baselines",
        sa.Column("key", sa.String(16), nullable=False),
        sa.Column("set_key", sa.String(64), nullable=False),
        sa.Column("versions", sa.Text(), nullable=True),
        sa.Column("first_seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_bed_baselines")),
    )
    # Plain ADD COLUMNs, no table copy on SQLite; executions before this named no baseline.
    op.add_column("executions", sa.Column("baseline_key", sa.String(16)))
    op.add_column("executions", sa.Column("escrow_sha256", sa.String(64)))


def downgrade() -> None:
    with op.batch_alter_table("executions") as batch:
        batch.drop_column("escrow_sha256")
        batch.drop_column("baseline_key")
    op.drop_table("bed_baselines")
