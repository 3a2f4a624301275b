"""An execution's provenance (grader, dataset and task fingerprints, the eval library), read from
its envelope when it is recorded: reports GROUP BY it instead of parsing every envelope.

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa
from alembic import op

from apg_farm.contract import envelope_provenance

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

#: Envelopes read per round trip: a batch's bytes (a few MB) are all the backfill holds.
BATCH = 2000


def upgrade() -> None:
    # A plain ADD COLUMN, no table copy on SQLite.
    op.add_column("executions", sa.Column("provenance", sa.Text()))
    _backfill(op.get_bind())


def _backfill(conn: sa.Connection) -> None:
    """Every stored envelope's provenance, in id order a batch at a time (bounded memory)."""
    postgres = conn.dialect.name == "postgresql"
    select = sa.text(
        "SELECT id, envelope FROM executions WHERE id > :after AND envelope IS NOT NULL"
        " ORDER BY id LIMIT :batch"
    )
    if postgres:
        # One statement per batch: the ids and values as two arrays, joined by position.
        update = sa.text(
            "UPDATE executions SET provenance = v.p FROM unnest(CAST(:ids AS bigint[]),"
            " CAST(:values AS text[])) AS v(id, p) WHERE executions.id = v.id"
        )
    else:
        update = sa.text("UPDATE executions SET provenance = :p WHERE id = :id")
    after = 0
    while True:
        rows = conn.execute(select, {"after": after, "batch": BATCH}).all()
        if not rows:
            return
        # As models.JSONText writes it: sorted keys, so equal provenances are equal text.
        found = [
            (i, json.dumps(envelope_provenance(bytes(raw)), sort_keys=True)) for i, raw in rows
        ]
        if postgres:
            conn.execute(update, {"ids": [i for i, _ in found], "values": [p for _, p in found]})
        else:
            params: list[dict[str, Any]] = [{"id": i, "p": p} for i, p in found]
            conn.execute(update, params)
        after = rows[-1][0]


def downgrade() -> None:
    with op.batch_alter_table("executions") as batch:
        batch.drop_column("provenance")
