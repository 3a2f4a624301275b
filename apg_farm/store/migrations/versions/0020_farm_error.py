"""A farm error's traceback kept with the execution it ended (bounded: its last 16 KiB), so a
bug of the farm leaves a trace in the store, not only in a worker's log (#33, part 5).

Revision ID: 0020_farm_error
Revises: 0019_rerun_kind
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020_farm_error"
down_revision = "0019_rerun_kind"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("executions", sa.Column("farm_error", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("executions") as batch:
        batch.drop_column("farm_error")
