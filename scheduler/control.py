"""Controlling a running sweep: status and cancel."""

from __future__ import annotations

from collections import Counter
from typing import Any

from sqlalchemy import select, update

from apg_farm.contract import Outcome
from apg_farm.errors import BadInput, NotFound
from apg_farm.store import Attempt, AttemptState, Bed, Store, Sweep, SweepState, rowcount, utcnow


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
    with store.read() as session:
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


#: Outcomes a retry may undo: the farm's own failures. A model's verdict is never re-rolled.
RETRYABLE = frozenset({Outcome.ERROR, Outcome.INVALID})


def parse_retry_outcomes(text: str) -> set[Outcome]:
    """`--only error,invalid` as outcomes; anything else is refused, naming the allowed ones."""
    names = [name.strip().upper() for name in text.split(",") if name.strip()]
    allowed = ", ".join(sorted(o.value.lower() for o in RETRYABLE))
    if not names:
        raise BadInput("no outcome given", field="--only", fix=f"use {allowed}")
    chosen = set()
    for name in names:
        if name not in Outcome.__members__ or Outcome(name) not in RETRYABLE:
            raise BadInput(
                f"{name.lower()!r} cannot be retried: only the farm's failures are run again",
                field="--only",
                fix=f"use {allowed}",
            )
        chosen.add(Outcome(name))
    return chosen


def retry_attempts(store: Store, sweep_id: int, outcomes: set[Outcome]) -> int:
    """Put finished attempts with these outcomes back in the queue; their executions stay as history."""
    with store.session() as session:
        sweep = session.get(Sweep, sweep_id)
        if sweep is None:
            raise NotFound(f"no sweep with id {sweep_id}")
        if sweep.state != SweepState.OPEN:
            raise BadInput(f"sweep {sweep.name} was cancelled", fix="submit it under a new name")
        rows = list(
            session.scalars(
                select(Attempt).where(
                    Attempt.sweep_id == sweep_id,
                    Attempt.state == AttemptState.DONE,
                    Attempt.outcome.in_([o.value for o in outcomes]),
                )
            )
        )
        for attempt in rows:
            attempt.reason = f"retry requested after {attempt.outcome}: {attempt.reason}"
            attempt.state = AttemptState.QUEUED
            attempt.outcome = None
            attempt.finished_at = None
            attempt.infra_failures = 0
            attempt.deliveries = 0
            attempt.excluded_beds = []
            attempt.enqueued_at = None
        return len(rows)
