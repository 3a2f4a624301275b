"""Whether the agent started: executions.agent_started, for the second-chance bias of reports.

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A plain ADD COLUMN (a constant default needs no table copy on SQLite: a batch copy would
    # drop `executions` under the phases' foreign keys).
    op.add_column(
        "executions",
        sa.Column("agent_started", sa.Boolean(), nullable=False, server_default=sa.false()),
    )
    # Before this column, an execution whose agent started is one that recorded its run phase.
    op.execute(
        "UPDATE executions SET agent_started = TRUE WHERE EXISTS (SELECT 1 FROM phases p"
        " WHERE p.execution_id = executions.id AND p.name = 'run')"
    )


def downgrade() -> None:
    with op.batch_alter_table("executions") as batch:
        batch.drop_column("agent_started")
