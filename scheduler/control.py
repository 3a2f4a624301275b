"""Controlling a running sweep: status and cancel."""

from __future__ import annotations

from collections import Counter
from typing import Any

from sqlalchemy import select, update

from apg_farm.errors import NotFound
from apg_farm.outcomes import Outcome
from apg_farm.store import Attempt, AttemptState, Bed, Store, Sweep, rowcount, utcnow
from apg_farm.store.models import SweepState


def cancel_sweep(store: Store, sweep_id: int) -> int:
    """Mark the sweep cancelled and its queued attempts CANCELLED; running ones stop at a phase boundary."""
    now = utcnow()
    with store.session() as session:
        sweep = session.get(Sweep, sweep_id)
        if sweep is None:
            raise NotFound(f"no sweep with id {sweep_id}")
        sweep.state = SweepState.CANCELLED
        sweep.cancelled_at = sweep.cancelled_at or now
        return rowcount(
            session.execute(
                update(Attempt)
                .where(Attempt.sweep_id == sweep_id, Attempt.state == AttemptState.QUEUED)
                .values(
                    state=AttemptState.DONE,
                    outcome=Outcome.CANCELLED,
                    reason="sweep cancelled before the attempt ran",
                    finished_at=now,
                )
                .execution_options(synchronize_session=False)
            )
        )


def sweep_status(store: Store, sweep_id: int) -> dict[str, Any]:
    """Counts by state and outcome, and what each bed is running."""
    with store.session() as session:
        sweep = session.get_one(Sweep, sweep_id)
        rows = session.execute(
            select(Attempt.state, Attempt.outcome).where(Attempt.sweep_id == sweep_id)
        ).all()
        running = session.execute(
            select(Bed.name, Attempt.task, Attempt.model, Attempt.trial)
            .join(Bed, Bed.id == Attempt.bed_id)
            .where(Attempt.sweep_id == sweep_id, Attempt.state == AttemptState.RUNNING)
            .order_by(Bed.name)
        ).all()
        states = Counter(state for state, _ in rows)
        outcomes = Counter(outcome for _, outcome in rows if outcome)
        return {
            "id": sweep.id,
            "name": sweep.name,
            "state": sweep.state,
            "attempts": len(rows),
            "states": {s.value: states.get(s.value, 0) for s in AttemptState},
            "outcomes": dict(sorted(outcomes.items())),
            "running": [f"{bed}: {task} {model} #{trial}" for bed, task, model, trial in running],
        }
