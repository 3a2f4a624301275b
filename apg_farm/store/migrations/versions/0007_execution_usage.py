"""Executions: what the run cost and used, from the adapter's record (claude.json).

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

_COUNTS = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens", "turns")


def upgrade() -> None:
    with op.batch_alter_table("executions") as batch:
        batch.add_column(sa.Column("cost_usd", sa.Float(), nullable=True))
        for name in _COUNTS:
            batch.add_column(sa.Column(name, sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("adapter_status", sa.String(64), nullable=True))
        batch.add_column(sa.Column("provider_trouble", sa.String(32), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("executions") as batch:
        batch.drop_column("provider_trouble")
        batch.drop_column("adapter_status")
        for name in reversed(_COUNTS):
            batch.drop_column(name)
        batch.drop_column("cost_usd")
