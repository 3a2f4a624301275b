"""How far a sweep has got, for the progress bars of both modes."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from apg_farm.store import Store


def done_count(store: Store, sweep_id: int) -> tuple[int, int]:
    """(attempts with an outcome, all attempts) of the sweep."""
    from sqlalchemy import func, select

    from apg_farm.store import Attempt, AttemptState

    with store.read() as session:
        total = session.scalar(
            select(func.count()).select_from(Attempt).where(Attempt.sweep_id == sweep_id)
        )
        done = session.scalar(
            select(func.count())
            .select_from(Attempt)
            .where(Attempt.sweep_id == sweep_id, Attempt.state == AttemptState.DONE)
        )
    return done or 0, total or 0
