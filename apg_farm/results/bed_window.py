"""A report's beds as they were during its sweep, not as they are today (#31, part 5).

A bed row in a report says how many times the bed was quarantined during the sweep and in which
state the sweep left it. Both are read from the bed's events inside the sweep's window, from its
creation to its last execution's end (open while attempts are pending): a quarantine of a later
sweep is not this one's, and a bed quarantined today was maybe active when this sweep ended. The
state is the one the bed's last state-changing event before the window's end set (STATE_AFTER);
a bed whose first such event came later was active (beds are born so); a bed with none at all
keeps today's. `state_now` shows today's beside it.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import ColumnElement, func, select
from sqlalchemy.orm import Session

from apg_farm.store import Attempt, BedEvent, BedState, Execution

#: The state a bed is in after each event that changes it; other events (escrow, worker,
#: fingerprints...) leave it as it was.
STATE_AFTER: dict[str, str] = {
    "added": BedState.ACTIVE,
    "cloned": BedState.ACTIVE,
    "reactivated": BedState.ACTIVE,
    "reset": BedState.ACTIVE,
    "released": BedState.ACTIVE,
    "upgraded": BedState.ACTIVE,
    "quarantined": BedState.QUARANTINED,
    "draining": BedState.DRAINING,
    "upgrade-out": BedState.UPGRADING,
    "removed": BedState.REMOVED,
}


@dataclass(frozen=True)
class Window:
    """The sweep's time: from its creation to its last execution's end (None: still open)."""

    start: datetime
    end: datetime | None


def sweep_window(session: Session, sweep_id: int, start: datetime, *, pending: bool) -> Window:
    """The window of a sweep created at `start`; open while it has attempts pending."""
    if pending:
        return Window(start, None)
    end = session.scalar(
        select(func.max(Execution.finished_at))
        .join(Attempt, Attempt.id == Execution.attempt_id)
        .where(Attempt.sweep_id == sweep_id)
    )
    return Window(start, end)


def _within(window: Window) -> ColumnElement[bool]:
    """The SQL condition of an event before the window's end."""
    return BedEvent.at <= window.end if window.end is not None else BedEvent.at.is_not(None)


def quarantines(session: Session, bed_ids: Collection[int], window: Window) -> dict[int, int]:
    """Per bed: its quarantines inside the window."""
    rows = session.execute(
        select(BedEvent.bed_id, func.count())
        .where(
            BedEvent.bed_id.in_(bed_ids),
            BedEvent.kind == "quarantined",
            BedEvent.at >= window.start,
            _within(window),
        )
        .group_by(BedEvent.bed_id)
    )
    return {int(bed): int(count) for bed, count in rows}


def states_at_end(
    session: Session, bed_ids: Collection[int], window: Window
) -> dict[int, tuple[str, str | None]]:
    """Per bed: (state, reason) as its last state-changing event before the window's end left
    it; beds without one are missing."""
    last = (
        select(func.max(BedEvent.id).label("id"))
        .where(BedEvent.bed_id.in_(bed_ids), BedEvent.kind.in_(STATE_AFTER), _within(window))
        .group_by(BedEvent.bed_id)
        .subquery()
    )
    rows = session.execute(
        select(BedEvent.bed_id, BedEvent.kind, BedEvent.detail).join(last, last.c.id == BedEvent.id)
    )
    found: dict[int, tuple[str, str | None]] = {
        int(bed): (STATE_AFTER[kind], detail if STATE_AFTER[kind] != BedState.ACTIVE else None)
        for bed, kind, detail in rows
    }
    if window.end is not None:
        # A bed is born active and every change since is an event: one whose first change came
        # after the window was active in it.
        later = session.scalars(
            select(BedEvent.bed_id)
            .distinct()
            .where(
                BedEvent.bed_id.in_(set(bed_ids) - set(found)),
                BedEvent.kind.in_(STATE_AFTER),
                BedEvent.at > window.end,
            )
        )
        found.update({int(bed): (BedState.ACTIVE, None) for bed in later})
    return found
