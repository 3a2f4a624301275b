"""Stopping a sweep when its comparison is decided (its file's `stop:`), inside the verdict's
transaction (store/lifecycle.py holds the bed's lock, then the attempt's, then the sweep's).

After every final outcome of a sweep with `stop:`, `look` walks the pairs of the two compared
models in the plan's fixed order (trial-major, tasks in the file's order) up to the first cell
not finished, updating the anytime-valid test (apg_farm/sequential.py) pair by pair. Cells of
trials every one of whose cells is finished are folded into a cursor kept in `sweeps.meta`, so
a look reads one trial's width of attempts onward: its cost grows with the sweep's width, never
with its history nor the store's.

When the test decides (or finds the comparison futile, or reaches its cap), the decision is
written to `sweeps.meta["stop"]["decision"]` and every queued attempt of the sweep ends
CANCELLED with the decision as its reason. Nothing running is touched: those attempts finish and
are recorded as usual. An attempt that would go back to the queue afterwards (a retry, a lease
that expired) is cancelled instead, by the lifecycle and the claim (`stop_reason`).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from apg_farm.contract import COUNTED, Outcome, headline_outcome
from apg_farm.sequential import Decision, Rule, Tally, describe, judge
from apg_farm.specs import StopSpec, SweepSpec
from apg_farm.store.db import Store
from apg_farm.store.models import Attempt, AttemptState, Sweep, utcnow
from apg_farm.store.rules import cancel_queued
from apg_farm.store.second_chances import bought_sql

#: The sweeps.meta key holding the comparison's state: cursor, last look, decision.
STOP = "stop"


def rule_of(stop: StopSpec) -> Rule:
    """The test's parameters from the sweep file's `stop:`."""
    return Rule(
        alpha=stop.alpha,
        min_pairs=stop.min_pairs,
        max_pairs=stop.max_pairs,
        futility=stop.futility,
    )


def decision_of(sweep: Sweep) -> dict[str, Any] | None:
    """The recorded decision of a sweep that stopped, or None."""
    state = (sweep.meta or {}).get(STOP)
    decision = state.get("decision") if isinstance(state, dict) else None
    return decision if isinstance(decision, dict) else None


def stop_reason(sweep: Sweep) -> str | None:
    """Why the sweep takes no new attempt: its comparison was decided; None while it runs."""
    decision = decision_of(sweep)
    return str(decision["reason"]) if decision else None


def lock_sweep(store: Store, session: Session, sweep_id: int) -> Sweep:
    """The sweep's row, locked: its looks are serialized (the lock order's third place)."""
    return session.get_one(Sweep, sweep_id, with_for_update=not store.is_sqlite)


def look(store: Store, session: Session, sweep: Sweep) -> str | None:
    """Advance the sweep's test over the pairs finished so far; when it decides, record the
    decision and cancel the queued attempts. The reason when the sweep is stopped, else None."""
    spec = SweepSpec.model_validate(sweep.spec)
    if spec.stop is None:
        return None
    state = dict((sweep.meta or {}).get(STOP) or {})
    if reason := stop_reason(sweep):
        # Decided earlier: anything queued since (a requeue that raced the decision) goes too.
        cancel_queued(store, session, sweep.id, reason)
        return reason
    first, second = spec.stop.compare
    rule = rule_of(spec.stop)
    cursor = state.get("cursor") or {}
    start = int(cursor.get("trial", 1))
    tally = Tally.from_dict(cursor.get("tally") or {})
    cells = _cells(session, sweep.id, (first, second), start)
    decision: Decision | None = None
    for trial, pairs, complete in _walk(cells, spec, first, second, start):
        for a_passed, b_passed in pairs:
            tally = tally.add(a_passed, b_passed)
            decision = judge(tally, rule, first, second)
            if decision is not None:
                break
        if decision is not None or not complete:
            break
        cursor = {"trial": trial + 1, "tally": tally.as_dict()}
    now = utcnow()
    state.update(cursor=cursor, look=_figures(tally, rule, now))
    reason = None
    if decision is not None:
        reason = describe(decision, rule, first, second)
        state["decision"] = {
            "kind": decision.kind,
            "winner": decision.winner,
            "reason": reason,
            **_figures(decision.tally, rule, now),
        }
        state["decision"]["cancelled"] = cancel_queued(store, session, sweep.id, reason)
    if state != (sweep.meta or {}).get(STOP):
        sweep.meta = {**(sweep.meta or {}), STOP: state}
    return reason


def _figures(tally: Tally, rule: Rule, now: datetime) -> dict[str, Any]:
    low, high = tally.interval(rule.alpha)
    return {
        **tally.as_dict(),
        "e_value": tally.e_value,
        "p_anytime": tally.p_anytime,
        "difference": tally.difference,
        "cs_low": low,
        "cs_high": high,
        "at": now.isoformat(timespec="seconds"),
    }


Cell = dict[str, tuple[str, str | None]]


def _cells(
    session: Session, sweep_id: int, models: tuple[str, str], start: int
) -> dict[tuple[int, str], Cell]:
    """The compared models' attempts from trial `start` on, by (trial, task), each outcome as
    the headline counts it: a model that buys second chances cannot win the comparison with
    them (store/second_chances.py)."""
    rows = session.execute(
        select(
            Attempt.trial,
            Attempt.task,
            Attempt.model,
            Attempt.state,
            Attempt.outcome,
            bought_sql(),
        ).where(Attempt.sweep_id == sweep_id, Attempt.model.in_(models), Attempt.trial >= start)
    )
    cells: dict[tuple[int, str], Cell] = {}
    for trial, task, model, state, outcome, bought in rows:
        cells.setdefault((trial, task), {})[model] = (state, headline_outcome(outcome, bought))
    return cells


def _walk(
    cells: dict[tuple[int, str], Cell], spec: SweepSpec, first: str, second: str, start: int
) -> Iterator[tuple[int, list[tuple[bool, bool]], bool]]:
    """Per trial from `start`: its counted pairs in task order up to the first unfinished cell,
    and whether every cell of the trial is finished."""
    for trial in range(start, spec.trials + 1):
        pairs: list[tuple[bool, bool]] = []
        complete = True
        for task in spec.tasks:
            cell = cells.get((trial, task), {})
            a, b = cell.get(first), cell.get(second)
            if a is None or b is None or a[0] != AttemptState.DONE or b[0] != AttemptState.DONE:
                complete = False
                break
            if a[1] in COUNTED and b[1] in COUNTED:
                pairs.append((a[1] == Outcome.PASSED, b[1] == Outcome.PASSED))
        yield trial, pairs, complete
        if not complete:
            return
