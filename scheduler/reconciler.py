"""The reconciler: makes the broker match the store (the truth) again.

It returns attempts whose lease expired to the queue, and sends a new message for every queued
attempt that has none (never sent, lost with a restarted Redis, or dropped by a worker). Extra
messages are harmless: a claim that matches nothing is a no-op.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import select

from apg_farm.store import Attempt, AttemptState, Store, Sweep, SweepState, requeue_expired, utcnow
from scheduler.broker_view import attempts_with_messages
from scheduler.publish import Sender, publish_attempts
from scheduler.queues import pool_queue

#: A message sent this recently may be between the queue and a worker's unacked set: leave it.
IN_FLIGHT_GRACE = timedelta(seconds=10)


@dataclass(frozen=True)
class Reconciliation:
    """What one pass did."""

    expired: int
    resent: int

    def describe(self) -> str:
        return f"{self.expired} expired leases returned, {self.resent} messages sent"


def reconcile(
    store: Store, app: Sender, broker_url: str, *, unacked_grace: float = 60.0
) -> Reconciliation:
    """One pass: expired leases back to the queue, then a message for each queued attempt without one."""
    expired = requeue_expired(store)
    with store.session() as session:
        queued = session.execute(
            select(Attempt.id, Attempt.pool, Attempt.enqueued_at)
            .join(Sweep, Sweep.id == Attempt.sweep_id)
            .where(Attempt.state == AttemptState.QUEUED, Sweep.state == SweepState.OPEN)
            .order_by(Attempt.seq)
        ).all()
    if not queued:
        return Reconciliation(expired, 0)
    live = attempts_with_messages(
        broker_url, {pool_queue(pool) for _, pool, _ in queued}, unacked_grace=unacked_grace
    )
    cutoff = utcnow() - IN_FLIGHT_GRACE
    missing = [
        attempt_id
        for attempt_id, _, enqueued_at in queued
        if attempt_id not in live and (enqueued_at is None or enqueued_at < cutoff)
    ]
    return Reconciliation(expired, publish_attempts(store, app, missing))
