"""Attempts by state and queue order: the reconciler's and the lease sweep's reads stay index-backed.

The reconciler pages through queued attempts in queue order (seq, id) and the lease sweep looks
for running ones; with a million finished attempts beside ten thousand queued, both must read
only the attempts in flight, never the history.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_attempts_state_seq", "attempts", ["state", "seq", "id"])


def downgrade() -> None:
    op.drop_index("ix_attempts_state_seq", table_name="attempts")
