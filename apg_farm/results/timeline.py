"""A sweep over its time (#31, part 4): throughput, queue depth, beds by state and each model's
pass rate, in equal bins from the sweep's creation to its last execution's end (to now while it
runs), drawn as inline SVG beside the forest plot.

Every query groups by bin in SQL, so what is read is at most bins × series rows whatever the
sweep's size; only the beds' state changes (added, quarantined, released...: operators' and
quarantines' events, not one per attempt) come back as rows.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import accumulate
from typing import Any

from sqlalchemy import ColumnElement, Float, Integer, cast, func, select
from sqlalchemy.orm import InstrumentedAttribute, Session

from apg_farm.contract import COUNTED, Outcome
from apg_farm.errors import NotFound
from apg_farm.results import bed_window
from apg_farm.store import Attempt, BedEvent, BedState, Execution, Store, Sweep, utcnow

BINS = 40
#: The states drawn, in this order (removed beds are out of the pool: not drawn).
STATES = (BedState.ACTIVE, BedState.QUARANTINED, BedState.DRAINING, BedState.UPGRADING)


def _epoch(session: Session, column: InstrumentedAttribute[Any]) -> ColumnElement[float]:
    """Seconds since 1970 of a timestamp column, in SQL (SQLite keeps naive UTC text)."""
    if session.get_bind().dialect.name == "postgresql":
        return cast(func.extract("epoch", column), Float)
    return (func.julianday(column) - 2440587.5) * 86400.0


def _bin(
    session: Session, column: InstrumentedAttribute[Any], start: float, width: float
) -> ColumnElement[int]:
    offset = (_epoch(session, column) - start) / width
    if session.get_bind().dialect.name == "postgresql":
        return cast(func.floor(offset), Integer())  # a bare cast rounds there
    # SQLite has no floor(); its cast truncates, the same for the offsets that are not negative
    # (anything before the sweep's creation is clamped to the first bin anyway).
    return cast(offset, Integer())


def _clamp(index: Any, bins: int) -> int:
    """A bin index from SQL inside 0..bins-1 (a time a hair before the creation or after the
    window's end counts in the first or last bin)."""
    return min(max(int(index), 0), bins - 1)


def _per_bin(rows: Iterable[Sequence[Any]], bins: int) -> list[int]:
    counts = [0] * bins
    for index, count in rows:
        if index is not None:
            counts[_clamp(index, bins)] += int(count)
    return counts


def _cumulative(values: Sequence[int]) -> list[int]:
    return list(accumulate(values))


def sweep_timeline(session: Session, sweep: Sweep, bins: int = BINS) -> dict[str, Any]:
    """The sweep's series over `bins` equal bins; each value is as of the bin's end."""
    pending = bool(
        session.scalar(
            select(func.count())
            .select_from(Attempt)
            .where(Attempt.sweep_id == sweep.id, Attempt.outcome.is_(None))
        )
    )
    window = bed_window.sweep_window(session, sweep.id, sweep.created_at, pending=pending)
    end = window.end or utcnow()
    start_s = sweep.created_at.timestamp()
    width = max((end.timestamp() - start_s) / bins, 1.0)
    in_sweep = Attempt.sweep_id == sweep.id

    def count_by_bin(column: InstrumentedAttribute[Any], *where: Any) -> list[int]:
        index = _bin(session, column, start_s, width).label("i")
        query = select(index, func.count()).where(column.is_not(None), *where).group_by(index)
        return _per_bin(session.execute(query), bins)

    created = _cumulative(count_by_bin(Attempt.created_at, in_sweep))
    ended_bins = count_by_bin(Attempt.finished_at, in_sweep, Attempt.outcome.is_not(None))
    ended = _cumulative(ended_bins)
    joined = Execution.attempt_id.in_(select(Attempt.id).where(in_sweep))
    started = _cumulative(count_by_bin(Execution.started_at, joined))
    stopped = _cumulative(count_by_bin(Execution.finished_at, joined))
    running = [max(s - f, 0) for s, f in zip(started, stopped, strict=True)]
    queued = [max(c - e - r, 0) for c, e, r in zip(created, ended, running, strict=True)]

    return {
        "start": sweep.created_at.isoformat(),
        "end": end.isoformat(),
        "open": window.end is None,
        "bin_seconds": width,
        "bins": bins,
        "finished_per_hour": [round(n * 3600 / width, 2) for n in ended_bins],
        "running": running,
        "queued": queued,
        "pass_rate": _pass_rates(session, sweep, start_s, width, bins),
        "beds": _beds_by_state(session, sweep, start_s, width, bins),
    }


def _pass_rates(
    session: Session, sweep: Sweep, start: float, width: float, bins: int
) -> dict[str, list[float | None]]:
    """Per model, PASSED over the counted final outcomes of the attempts finished so far: the
    report's "with re-runs" rate as it grew (its last point is that column)."""
    index = _bin(session, Attempt.finished_at, start, width).label("i")
    rows = session.execute(
        select(Attempt.model, index, Attempt.outcome, func.count())
        .where(
            Attempt.sweep_id == sweep.id,
            Attempt.finished_at.is_not(None),
            Attempt.outcome.in_([str(o) for o in COUNTED]),
        )
        .group_by(Attempt.model, index, Attempt.outcome)
    )
    passed: dict[str, list[int]] = {}
    counted: dict[str, list[int]] = {}
    for model, i, outcome, n in rows:
        at = _clamp(i, bins)
        counted.setdefault(model, [0] * bins)[at] += int(n)
        passed.setdefault(model, [0] * bins)[at] += int(n) if outcome == Outcome.PASSED else 0
    rates: dict[str, list[float | None]] = {}
    for model in sorted(counted):
        p, c = _cumulative(passed[model]), _cumulative(counted[model])
        rates[model] = [round(a / b, 4) if b else None for a, b in zip(p, c, strict=True)]
    return rates


def _beds_by_state(
    session: Session, sweep: Sweep, start: float, width: float, bins: int
) -> dict[str, list[int]]:
    """Of the beds that ran the sweep, how many were in each state at each bin's end: each bed's
    state at the sweep's creation (its last state-changing event before it, one row a bed), then
    the events inside the window replayed. Read: one row a bed plus the window's events, never a
    bed's whole history."""
    ran = select(Execution.bed_id).join(Attempt, Attempt.id == Execution.attempt_id)
    bed_ids = set(session.scalars(ran.where(Attempt.sweep_id == sweep.id).distinct()))
    changes = BedEvent.bed_id.in_(bed_ids), BedEvent.kind.in_(bed_window.STATE_AFTER)
    last_before = (
        select(func.max(BedEvent.id))
        .where(*changes, BedEvent.at <= sweep.created_at)
        .group_by(BedEvent.bed_id)
    )
    carried = select(BedEvent.bed_id, BedEvent.kind).where(BedEvent.id.in_(last_before))
    before = {int(bed): str(kind) for bed, kind in session.execute(carried)}
    events = session.execute(
        select(BedEvent.bed_id, BedEvent.at, BedEvent.kind)
        .where(*changes, BedEvent.at > sweep.created_at)
        .order_by(BedEvent.at, BedEvent.id)
    ).all()
    # A bed without a change before the sweep is absent until its "added" (or "cloned") event
    # inside it; one with no such event at all predates the record and was active.
    born_later = {bed for bed, _, kind in events if kind in ("added", "cloned")}
    state: dict[int, str | None] = {
        bed: bed_window.STATE_AFTER[before[bed]]
        if bed in before
        else (None if bed in born_later else BedState.ACTIVE)
        for bed in bed_ids
    }
    series = {str(s): [0] * bins for s in STATES}
    next_event = 0
    for i in range(bins):
        edge = start + width * (i + 1)
        while next_event < len(events) and events[next_event][1].timestamp() <= edge:
            bed, _, kind = events[next_event]
            state[bed] = bed_window.STATE_AFTER[kind]
            next_event += 1
        for now in state.values():
            if now is not None and str(now) in series:
                series[str(now)][i] += 1
    return {s: counts for s, counts in series.items() if any(counts)}


def timeline_for(store: Store, sweep: Sweep, bins: int = BINS) -> dict[str, Any]:
    """`sweep_timeline` in a read session of its own."""
    with store.read() as session:
        row = session.get(Sweep, sweep.id)
        if row is None:
            raise NotFound(f"sweep {sweep.id} is not in the store", field="sweep")
        return sweep_timeline(session, row, bins)
