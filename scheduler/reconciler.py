"""The reconciler: makes the broker match the store (the truth) again.

It returns attempts whose lease expired to the queue, and sends a new message for every queued
attempt that has none (never sent, lost with a restarted Redis, or dropped by a worker). Extra
messages are harmless: a claim that matches nothing is a no-op.

A pass costs what is in flight, not the history: attempts are read through the index on
(state, seq, id), so a million finished attempts are never visited, and queued ones are read a
page at a time in queue order; the broker is read only when something is queued.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import or_, select, tuple_

from apg_farm.scheduler.broker_view import attempts_with_messages
from apg_farm.scheduler.publish import Sender, publish_attempts
from apg_farm.scheduler.queues import pool_queue
from apg_farm.store import (
    Attempt,
    AttemptState,
    Store,
    Sweep,
    SweepState,
    claimable,
    farm_budget_reached,
    requeue_expired,
)

#: A message sent this recently may be between the queue and a worker's unacked set: leave it.
IN_FLIGHT_GRACE = timedelta(seconds=10)
#: Queued attempts read per query.
PAGE = 5000


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
    expired = store.retrying(lambda: requeue_expired(store))
    first = _page(store, (-1, -1))
    if not first:
        # Nothing queued that could lack a message: the broker need not be read.
        return Reconciliation(expired, 0)
    live = attempts_with_messages(
        broker_url, {pool_queue(pool) for pool in _open_pools(store)}, unacked_grace=unacked_grace
    )
    return Reconciliation(
        expired, publish_attempts(store, app, _without_message(store, first, live))
    )


def _open_pools(store: Store) -> list[str]:
    # A sweep's attempts all go to its pool (a re-submit may not change the pool), so the queues
    # to read come from the few sweeps, not from the attempts.
    with store.read() as session:
        return list(
            session.scalars(select(Sweep.pool).where(Sweep.state == SweepState.OPEN).distinct())
        )


def _page(store: Store, after: tuple[int, int]) -> list[tuple[int, int]]:
    """(seq, id) of up to PAGE queued attempts of open sweeps after `after`, in queue order,
    leaving out those sent within the grace. Index-backed: (state, seq, id)."""
    with store.read() as session:
        if farm_budget_reached(store, session):
            return []  # nothing may be claimed: a message now would only be handed back
        rows = session.execute(
            select(Attempt.seq, Attempt.id)
            .join(Sweep, Sweep.id == Attempt.sweep_id)
            .where(Attempt.state == AttemptState.QUEUED, Sweep.state == SweepState.OPEN)
            # A harness's sweep (Inspect) claims its attempts itself: no worker takes them.
            .where(Sweep.driver.is_(None))
            # Attempts a claim would refuse now (a budget spent, a back-off, a paused model)
            # get their message once they may run (pacing.py).
            .where(*claimable(store))
            .where(tuple_(Attempt.seq, Attempt.id) > tuple_(*after))
            # The grace is judged by the clock that stamped enqueued_at (publish_attempts).
            .where(
                or_(
                    Attempt.enqueued_at.is_(None),
                    Attempt.enqueued_at < store.now_plus(-IN_FLIGHT_GRACE.total_seconds()),
                )
            )
            .order_by(Attempt.seq, Attempt.id)
            .limit(PAGE)
        ).all()
    return [(seq, attempt_id) for seq, attempt_id in rows]


def _without_message(store: Store, page: list[tuple[int, int]], live: set[int]) -> Iterator[int]:
    """The ids of this page and the following ones that are not in `live`, in queue order.

    Each page is read in a short transaction of its own, closed before its ids are handed on,
    so publishing them never runs inside a read.
    """
    while True:
        yield from (attempt_id for _, attempt_id in page if attempt_id not in live)
        if len(page) < PAGE:
            return
        page = _page(store, page[-1])
