"""The broker window: a pool's queue holds a few messages (`window_per_bed` per active bed), never
a whole sweep.

The store is the truth and a message only says "run this attempt" (DESIGN, decision 1), so the
broker need hold no more than the beds can take next: submit stores every attempt and sends the
window; the reconciler's pass and each finished attempt top it up, in the store's claim order
(seq, id), so priorities (lifecycle.place_queued) decide what is sent next. A lost message, an
emptied Redis or a worker killed with a message unacknowledged leaves the queue short, and the
next top-up fills it again from the store.

A top-up reads the pool's queue (bounded by the window) and the recently delivered messages, then
at most `window + live` queued attempts through the claim index: its cost does not grow with the
sweep. Top-ups of one pool hold a short Redis lock, so two finishing workers do not both fill the
same gap.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from functools import partial

import redis
from redis.exceptions import LockError
from sqlalchemy import func, not_, or_, select
from sqlalchemy.orm import Session

from apg_farm.scheduler.broker_view import read_broker
from apg_farm.scheduler.publish import Sender, publish_attempts
from apg_farm.scheduler.queues import pool_queue
from apg_farm.store import (
    Attempt,
    AttemptState,
    Bed,
    BedState,
    Store,
    Sweep,
    SweepState,
    at_capacity,
    claimable,
    farm_budget_reached,
)

#: A message sent this recently may be between the queue and a worker's unacked set: it is not
#: sent again yet (another attempt fills its place meanwhile).
IN_FLIGHT_GRACE = timedelta(seconds=10)
#: Seconds a top-up holds its pool's lock at most (a top-up that dies frees it by then).
LOCK_SECONDS = 10.0
#: Messages per active bed when the settings say nothing.
WINDOW_PER_BED = 2
#: Message ids read per statement when counting a long queue (one left from before the window).
_COUNT_CHUNK = 5000


@dataclass(frozen=True)
class Window:
    """One pool's window after a top-up."""

    pool: str
    size: int
    waiting: int
    sent: int


def window_size(active_beds: int, per_bed: int) -> int:
    """Messages a pool's queue holds: `per_bed` for each bed that takes attempts."""
    return max(0, active_beds) * per_bed


def open_pools(store: Store) -> list[str]:
    """The pools of open sweeps the farm's workers run (a sweep's pool never changes)."""
    with store.read() as session:
        return list(
            session.scalars(
                select(Sweep.pool)
                .where(Sweep.state == SweepState.OPEN, Sweep.driver.is_(None))
                .distinct()
                .order_by(Sweep.pool)
            )
        )


def top_up(
    store: Store,
    app: Sender,
    broker_url: str,
    pools: Iterable[str] | None = None,
    *,
    per_bed: int = WINDOW_PER_BED,
    unacked_grace: float = 60.0,
    lock_wait: float = 5.0,
) -> list[Window]:
    """Fill each pool's queue up to its window from the store, in claim order; what was done.

    A pool whose lock another top-up holds for longer than `lock_wait` is left to it.
    """
    wanted = open_pools(store) if pools is None else sorted(set(pools))
    client = redis.Redis.from_url(broker_url)
    done: list[Window] = []
    try:
        for pool in wanted:
            size, anything = store.retrying(partial(_room, store, pool, per_bed))
            if size == 0 or not anything:
                continue  # no bed to take a message, or nothing to send: Redis is not read
            queue = pool_queue(pool)
            lock = client.lock(
                f"apg_farm:window:{queue}", timeout=LOCK_SECONDS, blocking_timeout=lock_wait
            )
            if not lock.acquire():
                continue
            try:
                done.append(_fill(store, app, client, pool, size, unacked_grace))
            finally:
                # Expired meanwhile, or Redis emptied (FLUSHALL): nothing to release.
                with contextlib.suppress(LockError):
                    lock.release()
    finally:
        client.close()
    return done


def _room(store: Store, pool: str, per_bed: int) -> tuple[int, bool]:
    """(the pool's window, whether anything of it may be sent now)."""
    with store.read() as session:
        beds = session.scalar(
            select(func.count())
            .select_from(Bed)
            .where(Bed.pool == pool, Bed.state == BedState.ACTIVE)
        )
        size = window_size(beds or 0, per_bed)
        if size == 0:
            return 0, False
        return size, bool(_candidates(store, session, pool, 1, grace=False))


def _fill(
    store: Store, app: Sender, client: redis.Redis, pool: str, size: int, unacked_grace: float
) -> Window:
    queue = pool_queue(pool)
    view = read_broker(client, [queue], unacked_grace=unacked_grace)
    in_queue = view.waiting[queue]
    waiting = store.retrying(partial(_still_queued, store, in_queue, size))
    need = size - waiting
    if need <= 0:
        return Window(pool, size, waiting, 0)
    live = view.live
    with store.read() as session:
        # Over-fetch by the attempts that have a message: they are skipped, not sent twice.
        rows = _candidates(store, session, pool, need + len(live), grace=True)
    ids = [attempt_id for attempt_id in rows if attempt_id not in live][:need]
    return Window(pool, size, waiting, publish_attempts(store, app, ids) if ids else 0)


def _still_queued(store: Store, ids: set[int], enough: int) -> int:
    """How many of `ids` are still queued (a message for a finished attempt holds no place),
    counted until `enough` is reached."""
    found, ordered = 0, sorted(ids)
    with store.read() as session:
        for start in range(0, len(ordered), _COUNT_CHUNK):
            found += (
                session.scalar(
                    select(func.count())
                    .select_from(Attempt)
                    .where(
                        Attempt.id.in_(ordered[start : start + _COUNT_CHUNK]),
                        Attempt.state == AttemptState.QUEUED,
                    )
                )
                or 0
            )
            if found >= enough:
                break
    return found


def _candidates(store: Store, session: Session, pool: str, limit: int, *, grace: bool) -> list[int]:
    """The first `limit` queued attempts of the pool a claim could take now, in claim order.

    The claim's own conditions (claims.claim), read through the claim index (pool, state, seq).
    """
    if farm_budget_reached(store, session):
        return []  # nothing may be claimed: a message now would only be handed back
    query = (
        select(Attempt.id)
        .join(Sweep, Sweep.id == Attempt.sweep_id)
        .where(Attempt.pool == pool, Attempt.state == AttemptState.QUEUED)
        .where(Sweep.state == SweepState.OPEN, Sweep.sealed_at.is_(None))
        # A harness's sweep (Inspect) claims its attempts itself: no worker takes them.
        .where(Sweep.driver.is_(None))
        # Attempts a claim would refuse now (a budget spent, a back-off, a paused model, a
        # model at its max_concurrent) get their message once they may run (pacing.py).
        .where(*claimable(store), not_(at_capacity(session, pool)))
        .order_by(Attempt.seq, Attempt.id)
        .limit(limit)
    )
    if grace:
        # Judged by the clock that stamped enqueued_at (publish_attempts).
        query = query.where(
            or_(
                Attempt.enqueued_at.is_(None),
                Attempt.enqueued_at < store.now_plus(-IN_FLIGHT_GRACE.total_seconds()),
            )
        )
    return list(session.scalars(query))
