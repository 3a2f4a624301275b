"""The sweeps list: each sweep's progress, pass rate, trouble counts and spend, a page at a time.

What `apg-farm sweep list` prints and the dashboard's sweeps page shows. One page of sweeps
(newest first, keyset on the id: never OFFSET) and one GROUP BY over the attempts of those sweeps
only, so its cost follows the sweeps listed, not the store's history.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import case, func, select
from sqlalchemy.orm import load_only

from apg_farm.contract import Outcome
from apg_farm.errors import BadInput
from apg_farm.store import (
    Attempt,
    AttemptState,
    Store,
    Sweep,
    SweepState,
    headline_counted_sql,
    headline_passed_sql,
)

#: Sweeps per page unless asked otherwise, and the most one page holds.
SWEEPS_PAGE = 50
MAX_SWEEPS_PAGE = 500
#: The largest id a store holds (a signed 64-bit integer): a larger one names no row.
MAX_ID = 2**63 - 1

#: The states a sweep list may be filtered by.
STATES = tuple(state.value for state in SweepState)


@dataclass(frozen=True)
class SweepPage:
    """One page of the sweeps list, and the id to ask `before` for the next (older) one."""

    sweeps: list[dict[str, Any]]
    next_before: int | None

    def as_dict(self) -> dict[str, Any]:
        return {"sweeps": self.sweeps, "next_before": self.next_before}


def check_state(state: str | None) -> str | None:
    """A state filter as given (None: every state), or BadInput naming the choices."""
    if state is None or state == "":
        return None
    if state not in STATES:
        raise BadInput(
            f"no sweep state {state!r}", field="--state", fix=f"one of {', '.join(STATES)}"
        )
    return state


def check_before(before: int | None, field: str = "before") -> int | None:
    """A keyset bound a store can compare with (a larger one is refused, not overflowed)."""
    if before is not None and not 0 <= before <= MAX_ID:
        raise BadInput(f"{field} must be an id from 0 to {MAX_ID}", field=field)
    return before


_SHOWN = (
    Sweep.id,
    Sweep.name,
    Sweep.state,
    Sweep.pool,
    Sweep.created_at,
    Sweep.cancelled_at,
    Sweep.sealed_at,
    Sweep.spent_usd,
    Sweep.budget_usd,
)


def _iso(value: datetime | None) -> str | None:
    return value.isoformat(timespec="seconds") if value else None


def _count_of(condition: Any) -> Any:
    return func.coalesce(func.sum(case((condition, 1), else_=0)), 0)


def list_sweeps(
    store: Store,
    *,
    state: str | None = None,
    before: int | None = None,
    limit: int = SWEEPS_PAGE,
) -> SweepPage:
    """The newest sweeps (ids below `before`, in `state` if given), each with its figures.

    The pass rate is the headline's (results/headline.py): PASSED over the outcomes that count
    (docs/outcomes.md), an attempt with a second chance the agent could have bought counted as
    not passed; None before any attempt is graded; TAMPERED, INVALID and ERROR are counted apart; spend is the running total
    the farm keeps as executions are recorded.
    """
    state = check_state(state)
    before = check_before(before)
    limit = max(1, min(limit, MAX_SWEEPS_PAGE))
    outcomes = list(Outcome)
    with store.read() as session:
        # Not the spec: a sweep's file may name 100,000 tasks, and the list shows none of them.
        query = select(Sweep).options(load_only(*_SHOWN)).order_by(Sweep.id.desc()).limit(limit + 1)
        if before is not None:
            query = query.where(Sweep.id < before)
        if state is not None:
            query = query.where(Sweep.state == state)
        sweeps = list(session.scalars(query))
        more = len(sweeps) > limit
        sweeps = sweeps[:limit]
        figures: dict[int, Any] = {}
        if sweeps:
            grouped = (
                select(
                    Attempt.sweep_id,
                    func.count(),
                    _count_of(Attempt.state == AttemptState.DONE),
                    _count_of(Attempt.state == AttemptState.RUNNING),
                    _count_of(Attempt.state == AttemptState.QUEUED),
                    *(_count_of(Attempt.outcome == o.value) for o in outcomes),
                    # The headline's corrections (store/second_chances.py).
                    _count_of(headline_passed_sql()),
                    _count_of(headline_counted_sql()),
                )
                .where(Attempt.sweep_id.in_([s.id for s in sweeps]))
                .group_by(Attempt.sweep_id)
            )
            figures = {row[0]: row[1:] for row in session.execute(grouped)}
        rows = [_row(sweep, figures.get(sweep.id), outcomes) for sweep in sweeps]
    return SweepPage(rows, rows[-1]["id"] if more and rows else None)


def _row(sweep: Sweep, figures: Any, outcomes: list[Outcome]) -> dict[str, Any]:
    total, done, running, queued, *by_outcome, passed, counted = (
        [int(v) for v in figures] if figures else [0] * (6 + len(outcomes))
    )
    counts = {o.value: n for o, n in zip(outcomes, by_outcome, strict=True) if n}
    return {
        "id": sweep.id,
        "name": sweep.name,
        "state": sweep.state,
        "pool": sweep.pool,
        "created_at": _iso(sweep.created_at),
        "cancelled_at": _iso(sweep.cancelled_at),
        "sealed_at": _iso(sweep.sealed_at),
        "total": total,
        "done": done,
        "running": running,
        "queued": queued,
        "outcomes": dict(sorted(counts.items())),
        "passed": passed,
        "counted": counted,
        "pass_rate": passed / counted if counted else None,
        "tampered": counts.get(Outcome.TAMPERED.value, 0),
        "invalid": counts.get(Outcome.INVALID.value, 0),
        "error": counts.get(Outcome.ERROR.value, 0),
        "spent_usd": round(sweep.spent_usd or 0.0, 6),
        "budget_usd": sweep.budget_usd,
    }
