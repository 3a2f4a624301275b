"""Each re-run's kind stored when it ends (contract/rerun_kinds.py), and executions indexed by
when they ended (store/outages.py reads the runs that ended since a claim).

Rows recorded before take the kind their reason named under the rules of the time (a farm
error, a failed link after the run, a claim the farm's check reproduced were read from the
text then): history keeps the headline it had.

Revision ID: 0019_rerun_kind
Revises: 0018_claims
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019_rerun_kind"
down_revision = "0018_claims"
branch_labels = None
depends_on = None

#: The rules the reports read the reason with until this revision, frozen here: (kind, texts).
_AFTER_RUN = (
    "ddev_check_after",
    "ddev_check_stopped",
    "processes_after",
    "stop_agent",
    "host_files",
    "verify_after",
)
_RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("farm_reproduced", ("reproduced by the farm's check",)),
    ("provider_trouble", ("provider trouble",)),
    ("lease_lost", ("lease expired",)),
    ("farm_error", ("farm error",)),
    ("link_failed", tuple(f"{check}: transport failed" for check in _AFTER_RUN)),
    (
        "adapter_not_started",
        (
            "adapter could not start",
            "adapter never started",
            "before the adapter started",
            "run: apg_",
        ),
    ),
    (
        "timeout_or_transport",
        (
            "transport failed",
            "no result before the sweep's",
            "ddev could not start the project",
            "ddev does not know the command",
        ),
    ),
    ("grade_failed", ("grade could not run",)),
)


def upgrade() -> None:
    op.add_column("executions", sa.Column("rerun_kind", sa.String(32), nullable=True))
    op.create_index(op.f("ix_executions_finished_at"), "executions", ["finished_at"])
    executions = sa.table(
        "executions",
        sa.column("result", sa.String),
        sa.column("reason", sa.Text),
        sa.column("provider_trouble", sa.String),
        sa.column("rerun_kind", sa.String),
    )
    text = sa.func.lower(sa.func.coalesce(executions.c.reason, ""))
    whens: list[tuple[sa.ColumnElement[bool], str]] = [
        (executions.c.result == "LOST", "lease_lost")
    ]
    for kind, needles in _RULES:
        whens.extend((text.contains(needle, autoescape=True), kind) for needle in needles)
    whens.append((executions.c.provider_trouble.is_not(None), "provider_trouble"))
    op.execute(
        executions.update()
        .where(executions.c.result.in_(("RETRY", "LOST")))
        .values(rerun_kind=sa.case(*whens, else_=sa.literal("other")))
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_executions_finished_at"), table_name="executions")
    with op.batch_alter_table("executions") as batch:
        batch.drop_column("rerun_kind")
