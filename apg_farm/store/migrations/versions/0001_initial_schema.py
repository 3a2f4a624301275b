"""initial schema

Revision ID: 0001
Revises: (none)
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "beds",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("transport", sa.String(length=20), nullable=False),
        sa.Column("host", sa.String(length=255), nullable=True),
        sa.Column("approot", sa.Text(), nullable=False),
        sa.Column("ddev", sa.Text(), nullable=False),
        sa.Column("fixtures", sa.Text(), nullable=False),
        sa.Column("pool", sa.String(length=255), nullable=False),
        sa.Column("escrow_set", sa.Text(), nullable=True),
        sa.Column("env", sa.Text(), nullable=False),
        sa.Column("state", sa.String(length=20), nullable=False),
        sa.Column("state_reason", sa.Text(), nullable=True),
        sa.Column("consecutive_errors", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_beds")),
        sa.UniqueConstraint("name", name=op.f("uq_beds_name")),
    )
    with op.batch_alter_table("beds", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_beds_pool"), ["pool"], unique=False)

    op.create_table(
        "sweeps",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("spec", sa.Text(), nullable=False),
        sa.Column("spec_sha256", sa.String(length=64), nullable=False),
        sa.Column("pool", sa.String(length=255), nullable=False),
        sa.Column("state", sa.String(length=20), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("cancelled_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_sweeps")),
        sa.UniqueConstraint("name", name=op.f("uq_sweeps_name")),
    )
    op.create_table(
        "attempts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("sweep_id", sa.Integer(), nullable=False),
        sa.Column("task", sa.String(length=255), nullable=False),
        sa.Column("model", sa.String(length=255), nullable=False),
        sa.Column("trial", sa.Integer(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("pool", sa.String(length=255), nullable=False),
        sa.Column("state", sa.String(length=20), nullable=False),
        sa.Column("outcome", sa.String(length=20), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("infra_failures", sa.Integer(), nullable=False),
        sa.Column("deliveries", sa.Integer(), nullable=False),
        sa.Column("excluded_beds", sa.Text(), nullable=False),
        sa.Column("bed_id", sa.Integer(), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["bed_id"], ["beds.id"], name=op.f("fk_attempts_bed_id_beds")),
        sa.ForeignKeyConstraint(
            ["sweep_id"], ["sweeps.id"], name=op.f("fk_attempts_sweep_id_sweeps")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_attempts")),
        sa.UniqueConstraint("sweep_id", "task", "model", "trial", name="uq_attempts_key"),
    )
    with op.batch_alter_table("attempts", schema=None) as batch_op:
        batch_op.create_index("ix_attempts_claim", ["pool", "state", "seq"], unique=False)
        batch_op.create_index(batch_op.f("ix_attempts_sweep_id"), ["sweep_id"], unique=False)

    op.create_table(
        "bed_events",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("bed_id", sa.Integer(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("kind", sa.String(length=40), nullable=False),
        sa.Column("detail", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(["bed_id"], ["beds.id"], name=op.f("fk_bed_events_bed_id_beds")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_bed_events")),
    )
    with op.batch_alter_table("bed_events", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_bed_events_bed_id"), ["bed_id"], unique=False)

    op.create_table(
        "executions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("attempt_id", sa.Integer(), nullable=False),
        sa.Column("bed_id", sa.Integer(), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("worker", sa.String(length=255), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("run_id", sa.String(length=255), nullable=True),
        sa.Column("result", sa.String(length=20), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("score", sa.Float(), nullable=True),
        sa.Column("max_score", sa.Float(), nullable=True),
        sa.Column("envelope", sa.LargeBinary(), nullable=True),
        sa.Column("envelope_sha256", sa.String(length=64), nullable=True),
        sa.Column("bed_seconds", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(
            ["attempt_id"], ["attempts.id"], name=op.f("fk_executions_attempt_id_attempts")
        ),
        sa.ForeignKeyConstraint(["bed_id"], ["beds.id"], name=op.f("fk_executions_bed_id_beds")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_executions")),
        sa.UniqueConstraint("attempt_id", "number", name="uq_executions_try"),
    )
    with op.batch_alter_table("executions", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_executions_attempt_id"), ["attempt_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_executions_bed_id"), ["bed_id"], unique=False)

    op.create_table(
        "phases",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("execution_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=40), nullable=False),
        sa.Column("argv", sa.Text(), nullable=False),
        sa.Column("rc", sa.Integer(), nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("tokens", sa.Text(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("duration", sa.Float(), nullable=False),
        sa.Column("timed_out", sa.Boolean(), nullable=False),
        sa.Column("transport_error", sa.Text(), nullable=True),
        sa.Column("stdout", sa.Text(), nullable=False),
        sa.Column("stdout_bytes", sa.BigInteger(), nullable=False),
        sa.Column("stdout_truncated", sa.Boolean(), nullable=False),
        sa.Column("stderr", sa.Text(), nullable=False),
        sa.Column("stderr_bytes", sa.BigInteger(), nullable=False),
        sa.Column("stderr_truncated", sa.Boolean(), nullable=False),
        sa.ForeignKeyConstraint(
            ["execution_id"], ["executions.id"], name=op.f("fk_phases_execution_id_executions")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_phases")),
    )
    with op.batch_alter_table("phases", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_phases_execution_id"), ["execution_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("phases", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_phases_execution_id"))

    op.drop_table("phases")
    with op.batch_alter_table("executions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_executions_bed_id"))
        batch_op.drop_index(batch_op.f("ix_executions_attempt_id"))

    op.drop_table("executions")
    with op.batch_alter_table("bed_events", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_bed_events_bed_id"))

    op.drop_table("bed_events")
    with op.batch_alter_table("attempts", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_attempts_sweep_id"))
        batch_op.drop_index("ix_attempts_claim")

    op.drop_table("attempts")
    op.drop_table("sweeps")
    with op.batch_alter_table("beds", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_beds_pool"))

    op.drop_table("beds")
