"""Sending attempts to the broker. The store records each send, so lost messages can be found."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from sqlalchemy import select

from apg_farm.specs import SweepSpec
from apg_farm.store import Attempt, AttemptState, Store, Sweep, SweepState, utcnow
from scheduler.queues import RUN_ATTEMPT, attempt_time_limits, pool_queue, task_id


class Sender(Protocol):
    """The part of a Celery app that sends a task by name."""

    def send_task(self, name: str, *args: Any, **kwargs: Any) -> Any: ...


def publish_attempts(store: Store, app: Sender, attempt_ids: Iterable[int]) -> int:
    """One message per still-queued attempt, to its pool's queue, in queue order; returns how many."""
    ids = list(attempt_ids)
    if not ids:
        return 0
    sent = 0
    specs: dict[int, SweepSpec] = {}
    with store.session() as session:
        rows = session.execute(
            select(Attempt, Sweep)
            .join(Sweep, Sweep.id == Attempt.sweep_id)
            .where(Attempt.id.in_(ids), Attempt.state == AttemptState.QUEUED)
            .where(Sweep.state == SweepState.OPEN)
            .order_by(Attempt.seq)
        ).all()
        now = utcnow()
        for attempt, sweep in rows:
            spec = specs.get(sweep.id) or specs.setdefault(
                sweep.id, SweepSpec.model_validate(sweep.spec)
            )
            soft, hard = attempt_time_limits(spec)
            attempt.dispatches += 1
            attempt.enqueued_at = now
            app.send_task(
                RUN_ATTEMPT,
                args=(attempt.id,),
                queue=pool_queue(attempt.pool),
                task_id=task_id(attempt.id, attempt.dispatches),
                soft_time_limit=soft,
                time_limit=hard,
            )
            sent += 1
    return sent
