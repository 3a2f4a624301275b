"""Spend and pace: sweep budgets and running spend, farm budgets, per-model breakers and
concurrency locks, and the provider back-off of attempts.

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("sweeps") as batch:
        batch.add_column(sa.Column("budget_usd", sa.Float(), nullable=True))
        batch.add_column(sa.Column("spent_usd", sa.Float(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("max_concurrent", sa.Text(), nullable=True))
    with op.batch_alter_table("attempts") as batch:
        batch.add_column(
            sa.Column("provider_failures", sa.Integer(), nullable=False, server_default="0")
        )
        batch.add_column(sa.Column("not_before", sa.DateTime(timezone=True), nullable=True))
    op.create_table(
        "model_gates",
        sa.Column("model", sa.String(255), nullable=False),
        sa.Column("trips", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("paused_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("opened_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("trouble", sa.String(32), nullable=True),
        sa.Column("detail", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("model", name="pk_model_gates"),
    )
    op.create_table(
        "budgets",
        sa.Column("scope", sa.String(20), nullable=False),
        sa.Column("limit_usd", sa.Float(), nullable=False),
        sa.Column("set_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("scope", name="pk_budgets"),
    )
    op.create_table(
        "spend",
        sa.Column("key", sa.String(20), nullable=False),
        sa.Column("spent_usd", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("key", name="pk_spend"),
    )
    # What existing sweeps already spent, so their budgets (set later) start from the truth.
    op.execute(
        "UPDATE sweeps SET spent_usd = COALESCE((SELECT SUM(e.cost_usd) FROM executions e"
        " JOIN attempts a ON a.id = e.attempt_id WHERE a.sweep_id = sweeps.id), 0)"
    )
    op.execute(
        "INSERT INTO spend (key, spent_usd) SELECT 'total', COALESCE(SUM(cost_usd), 0)"
        " FROM executions"
    )


def downgrade() -> None:
    op.drop_table("spend")
    op.drop_table("budgets")
    op.drop_table("model_gates")
    with op.batch_alter_table("attempts") as batch:
        batch.drop_column("not_before")
        batch.drop_column("provider_failures")
    with op.batch_alter_table("sweeps") as batch:
        batch.drop_column("max_concurrent")
        batch.drop_column("spent_usd")
        batch.drop_column("budget_usd")
