"""Controlling a running sweep: status, cancel, retry, and which workers are alive."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from apg_farm.contract import Outcome
from apg_farm.errors import BadInput
from apg_farm.scheduler.queues import LIVE_WITHIN
from apg_farm.scheduler.shares import pool_shares
from apg_farm.specs import SweepSpec
from apg_farm.store import (  # cancel_sweep, retry_attempts: the lifecycle's
    Attempt,
    AttemptState,
    Bed,
    BedState,
    Store,
    Sweep,
    WorkerBeat,
    pace_status,
)


def store_now(session: Session, store: Store) -> datetime:
    """The store's clock as a value (Store.now() is the same clock as SQL)."""
    now: datetime | None = session.scalar(select(store.now()))
    assert now is not None
    return now


@dataclass(frozen=True)
class WorkerSeen:
    """A worker process as its heartbeat row shows it, aged by the store's clock."""

    name: str
    bed: str | None
    bed_active: bool
    pool: str
    host: str
    pid: int
    started_at: datetime
    seen_at: datetime
    #: Seconds since its last beat.
    age: float

    @property
    def live(self) -> bool:
        return self.age <= LIVE_WITHIN

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "bed": self.bed,
            "pool": self.pool,
            "host": self.host,
            "pid": self.pid,
            "live": self.live,
            "seen_seconds_ago": round(self.age, 1),
        }


def worker_beats(store: Store, *, pool: str | None = None) -> list[WorkerSeen]:
    """Every worker heartbeat row (of one pool), newest first per bed."""
    query = (
        select(WorkerBeat, Bed.name, Bed.state)
        .outerjoin(Bed, Bed.id == WorkerBeat.bed_id)
        .order_by(Bed.name, WorkerBeat.seen_at.desc())
    )
    if pool is not None:
        query = query.where(WorkerBeat.pool == pool)
    with store.read() as session:
        now = store_now(session, store)
        rows = session.execute(query).all()
    return [
        WorkerSeen(
            name=beat.name,
            bed=bed,
            bed_active=state == BedState.ACTIVE,
            pool=beat.pool,
            host=beat.host,
            pid=beat.pid,
            started_at=beat.started_at,
            seen_at=beat.seen_at,
            age=max(0.0, (now - beat.seen_at).total_seconds()),
        )
        for beat, bed, state in rows
    ]


def live_workers(store: Store, pool: str) -> list[WorkerSeen]:
    """Workers that take the pool's attempts now: beating, on a bed that is active."""
    return [w for w in worker_beats(store, pool=pool) if w.live and w.bed_active]


def sweep_status(store: Store, sweep_id: int) -> dict[str, Any]:
    """Counts by state and outcome, what each bed is running, and the pool's workers.

    Counted in SQL, so a sweep of a million attempts costs no more memory than a small one.
    """
    with store.read() as session:
        sweep = session.get_one(Sweep, sweep_id)
        counts = session.execute(
            select(Attempt.state, Attempt.outcome, func.count())
            .where(Attempt.sweep_id == sweep_id)
            .group_by(Attempt.state, Attempt.outcome)
        ).all()
        running = session.execute(
            select(Bed.name, Attempt.task, Attempt.model, Attempt.trial)
            .join(Bed, Bed.id == Attempt.bed_id)
            .where(Attempt.sweep_id == sweep_id, Attempt.state == AttemptState.RUNNING)
            .order_by(Bed.name)
        ).all()
        pace = pace_status(store, session, sweep)
    states: Counter[str] = Counter()
    outcomes: Counter[str] = Counter()
    for state, outcome, count in counts:
        states[state] += count
        if outcome:
            outcomes[outcome] += count
    beats = worker_beats(store, pool=sweep.pool)
    shares = pool_shares(store, sweep.pool)
    return {
        "id": sweep.id,
        "name": sweep.name,
        "state": sweep.state,
        "attempts": sum(states.values()),
        "states": {s.value: states.get(s.value, 0) for s in AttemptState},
        "outcomes": dict(sorted(outcomes.items())),
        "running": [f"{bed}: {task} {model} #{trial}" for bed, task, model, trial in running],
        **pace,
        "priority": SweepSpec.model_validate(sweep.spec).priority,
        # This sweep's share of its pool's claims, and every open sweep of the pool beside it.
        "share": next((x for x in shares if x["id"] == sweep.id), None),
        "pool_shares": shares,
        # Only the distributed mode has workers; embedded, this stays empty.
        "workers": {
            "pool": sweep.pool,
            "live": sum(1 for w in beats if w.live and w.bed_active),
            "beats": [w.as_dict() for w in beats],
        },
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
