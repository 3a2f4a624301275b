"""A sweep ends: `finished` once every attempt is final (open again when a re-submit or a retry
queues attempts), found by an index on (sweep_id, state) as each attempt ends. Sweeps already
at their end are marked finished.

Revision ID: 0014
Revises: 0013
"""

from __future__ import annotations

from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_attempts_sweep_state", "attempts", ["sweep_id", "state"])
    op.execute(
        "UPDATE sweeps SET state = 'finished' WHERE state = 'open' AND NOT EXISTS ("
        "SELECT 1 FROM attempts WHERE attempts.sweep_id = sweeps.id"
        " AND attempts.state IN ('queued', 'running'))"
    )


def downgrade() -> None:
    op.execute("UPDATE sweeps SET state = 'open' WHERE state = 'finished'")
    op.drop_index("ix_attempts_sweep_state", table_name="attempts")
