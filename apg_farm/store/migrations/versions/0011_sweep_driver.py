"""Who drives a sweep's attempts: NULL for the farm's own workers, or an outside harness
("inspect": the Inspect AI sandbox provider, apg_farm/inspect/). A worker never claims an
attempt of a harness's sweep, and the scheduler never sends one a message.

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A plain ADD COLUMN, no table copy on SQLite; every existing sweep is the farm's own.
    op.add_column("sweeps", sa.Column("driver", sa.String(20)))


def downgrade() -> None:
    with op.batch_alter_table("sweeps") as batch:
        batch.drop_column("driver")
