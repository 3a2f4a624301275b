"""What a sweep would cost and how long it would take, before it is submitted.

From the farm's own history: for each (task, model) of the sweep, its most recent `RECENT`
finished executions in any sweep (`finished_at` set, whatever their result: a retried or lost
execution was paid for and held a bed too). Per pair, the **median** cost and bed time of one
execution, and a **range**: the 10th to 90th percentile (R type 7, as the reports' quantiles) when
the pair has at least `FEW` executions with the figure, the minimum to the maximum below that.
Bed time is the execution's `bed_seconds` (the bed commands' time), else finished − started.

The sweep's figures: the attempts a submit would add (tasks × models × trials, less those the
sweep of that name already holds), each pair's attempts × its median, summed; the range sums
attempts × low and attempts × high, so it bounds a sweep whose every attempt is cheap or dear, not
a confidence interval. The wall time is the bed time over the active beds of the sweep's pool. A
pair without history contributes to no total; the estimate names it and counts its attempts.

The database aggregates (quantiles by `group_quantiles`), so rows returned are per pair, not per
execution. It still ranks every finished execution of the sweep's pairs to find the recent ones:
the attempts table has no (task, model) index to stop earlier.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Float, cast, extract, func, select
from sqlalchemy.orm import Session

from apg_farm.results import group_quantiles, refuse_if_sealed
from apg_farm.scheduler.submission import check_resubmit
from apg_farm.specs import SweepSpec
from apg_farm.store import Attempt, Execution, Store, Sweep, pool_capacity

#: Finished executions read per (task, model): the most recent ones.
RECENT = 200
#: Below this many executions with a figure, its range is min–max instead of p10–p90.
FEW = 10
#: The range's quantiles when a pair has at least FEW figures.
LOW_Q, HIGH_Q = 0.1, 0.9
#: Median, p10, p90, min, max: what group_quantiles is asked for.
_QS = (0.5, LOW_Q, HIGH_Q, 0.0, 1.0)
#: Separates task and model in one grouping key (neither can contain it: sweep-file names).
_SEP = "\t"
RANGE = f"median; range p{LOW_Q * 100:.0f}-p{HIGH_Q * 100:.0f}, or min-max under {FEW} executions"


@dataclass(frozen=True)
class Spread:
    """One figure of one execution: its median and range over `samples` executions."""

    median: float
    low: float
    high: float
    samples: int


@dataclass(frozen=True)
class Total:
    """A figure summed over attempts: median and range, and how many attempts it covers."""

    median: float
    low: float
    high: float
    attempts: int


@dataclass(frozen=True)
class PairEstimate:
    """One (task, model): the attempts a submit would add and what an execution of it took."""

    task: str
    model: str
    attempts: int
    #: Finished executions read (at most RECENT); 0 is a pair without history.
    executions: int
    #: USD per execution; None when none of them has a cost (no adapter record).
    cost: Spread | None
    #: Bed seconds per execution.
    seconds: Spread | None


def _total(pairs: Iterable[PairEstimate], figure: str) -> Total | None:
    median = low = high = 0.0
    attempts = 0
    for pair in pairs:
        spread: Spread | None = getattr(pair, figure)
        if spread is None or not pair.attempts:
            continue
        median += pair.attempts * spread.median
        low += pair.attempts * spread.low
        high += pair.attempts * spread.high
        attempts += pair.attempts
    return Total(median, low, high, attempts) if attempts else None


@dataclass(frozen=True)
class SweepEstimate:
    """What submitting the spec would add, and what it would cost and take."""

    name: str
    pool: str
    #: Active beds of the pool now.
    active_beds: int
    #: False when a sweep of that name exists: only its missing attempts are counted.
    new_sweep: bool
    #: Attempts of this file the sweep already holds.
    existing: int
    pairs: tuple[PairEstimate, ...]
    #: Finished executions read per (task, model), the most recent.
    recent: int = RECENT
    #: The spec's budget_usd; whether it caps a model's concurrency (max_concurrent).
    budget_usd: float | None = None
    capped: bool = False
    #: "running on 1 of 4 beds of pool p: 3 quarantined", None when every bed is in.
    capacity_warning: str | None = None

    @property
    def attempts(self) -> int:
        return sum(p.attempts for p in self.pairs)

    @property
    def cost(self) -> Total | None:
        return _total(self.pairs, "cost")

    @property
    def bed_seconds(self) -> Total | None:
        return _total(self.pairs, "seconds")

    @property
    def wall_seconds(self) -> Total | None:
        """Bed time spread over the pool's active beds; None without a bed or any history."""
        bed = self.bed_seconds
        if bed is None or not self.active_beds:
            return None
        n = self.active_beds
        return Total(bed.median / n, bed.low / n, bed.high / n, bed.attempts)

    def needed(self) -> list[PairEstimate]:
        """The pairs the submit would add attempts to."""
        return [p for p in self.pairs if p.attempts]

    def without_history(self) -> list[PairEstimate]:
        return [p for p in self.needed() if not p.executions]

    def without_cost(self) -> list[PairEstimate]:
        """Pairs with executions but no recorded cost among them."""
        return [p for p in self.needed() if p.executions and p.cost is None]

    def by_model(self) -> list[dict[str, Any]]:
        """Per model, in the spec's order: attempts, those without history, cost and bed time."""
        models = list(dict.fromkeys(p.model for p in self.pairs))
        rows = []
        for model in models:
            mine = [p for p in self.pairs if p.model == model]
            rows.append(
                {
                    "model": model,
                    "attempts": sum(p.attempts for p in mine),
                    "attempts_without_history": sum(p.attempts for p in mine if not p.executions),
                    "cost_usd": _as_dict(_total(mine, "cost")),
                    "bed_seconds": _as_dict(_total(mine, "seconds")),
                }
            )
        return rows

    def as_dict(self) -> dict[str, Any]:
        """The estimate as JSON-ready data."""
        return {
            "sweep": self.name,
            "new_sweep": self.new_sweep,
            "pool": self.pool,
            "active_beds": self.active_beds,
            "capacity_warning": self.capacity_warning,
            "attempts": self.attempts,
            "existing_attempts": self.existing,
            "budget_usd": self.budget_usd,
            "history": {"recent_executions_per_pair": self.recent, "figures": RANGE},
            "cost_usd": _as_dict(self.cost),
            "bed_seconds": _as_dict(self.bed_seconds),
            "wall_seconds": _as_dict(self.wall_seconds),
            "pairs_without_history": [_key(p) for p in self.without_history()],
            "pairs_without_cost": [_key(p) for p in self.without_cost()],
            "models": self.by_model(),
            "pairs": [
                {
                    "task": p.task,
                    "model": p.model,
                    "attempts": p.attempts,
                    "executions": p.executions,
                    "cost_usd": _spread(p.cost),
                    "bed_seconds": _spread(p.seconds),
                }
                for p in self.pairs
            ],
        }

    def describe(self) -> str:
        """A table per model and the totals, as plain text."""
        lines = [self._headline()]
        if not self.attempts:
            return lines[0]
        lines.append(
            f"from the last {self.recent} finished executions per (task, model), any sweep: {RANGE}"
        )
        header = ("model", "attempts", "no history", "cost", "cost range", "bed time", "range")
        rows: list[tuple[str, ...]] = [header]
        for model in self.by_model():
            rows.append(_row(model["model"], model, model["cost_usd"], model["bed_seconds"]))
        if len(rows) > 2:
            total: dict[str, Any] = {
                "attempts": self.attempts,
                "attempts_without_history": sum(p.attempts for p in self.without_history()),
            }
            rows.append(_row("total", total, _as_dict(self.cost), _as_dict(self.bed_seconds)))
        widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
        for cells_of in rows:
            cells = [
                c.ljust(w) if i == 0 else c.rjust(w)
                for i, (c, w) in enumerate(zip(cells_of, widths, strict=True))
            ]
            lines.append("  ".join(cells).rstrip())
        lines += self._totals()
        if self.capacity_warning:
            lines.append(f"capacity: {self.capacity_warning}")
        return "\n".join(lines)

    def _headline(self) -> str:
        if self.new_sweep:
            return f"dry run: sweep {self.name} would be submitted with {self.attempts} attempts; nothing stored"
        if not self.attempts:
            return f"dry run: sweep {self.name} already holds all {self.existing} attempts of this file: nothing new"
        return (
            f"dry run: sweep {self.name} exists; this file would add {self.attempts} attempts "
            f"({self.existing} already there); nothing stored"
        )

    def _of(self, attempts: int) -> str:
        return str(attempts) if attempts == self.attempts else f"{attempts} of {self.attempts}"

    def _totals(self) -> list[str]:
        needed, missing = self.needed(), self.without_history()
        if len(missing) == len(needed):
            return [
                f"no history: no (task, model) of this sweep has a finished execution in the store; "
                f"cost and time unknown for all {self.attempts} attempts"
            ]
        lines = []
        cost, bed, wall = self.cost, self.bed_seconds, self.wall_seconds
        if cost is not None:
            lines.append(
                f"cost ≈ {_usd(cost.median)} (range {_usd(cost.low)}-{_usd(cost.high)}) "
                f"for {self._of(cost.attempts)} attempts"
            )
            if self.budget_usd is not None and cost.median > self.budget_usd:
                lines.append(
                    f"above the sweep's budget_usd ({_usd(self.budget_usd)}): no attempt is "
                    "claimed once that much is spent"
                )
        if bed is not None:
            lines.append(
                f"bed time ≈ {_duration(bed.median)} (range {_duration(bed.low)}-"
                f"{_duration(bed.high)}) for {self._of(bed.attempts)} attempts"
            )
            if wall is not None:
                beds = f"{self.active_beds} active bed{'s' if self.active_beds != 1 else ''}"
                lines.append(
                    f"wall time ≈ {_duration(wall.median)} (range {_duration(wall.low)}-"
                    f"{_duration(wall.high)}) on the {beds} of pool {self.pool}"
                    + (", or longer under the max_concurrent caps" if self.capped else "")
                )
            else:
                lines.append(f"wall time unknown: pool {self.pool} has no active bed")
        if missing:
            unknown = sum(p.attempts for p in missing)
            lines.append(
                f"no history for {len(missing)} of {len(needed)} (task, model) pairs: cost and time "
                f"unknown for {unknown} attempts, left out of the totals: "
                + ", ".join(f"({p.task}, {p.model})" for p in missing)
            )
        uncosted = self.without_cost()
        if uncosted:
            unknown = sum(p.attempts for p in uncosted)
            lines.append(
                f"no recorded cost for {len(uncosted)} of {len(needed)} pairs (executions without "
                f"an adapter record): cost unknown for {unknown} attempts, left out of the cost: "
                + ", ".join(f"({p.task}, {p.model})" for p in uncosted)
            )
        return lines


def estimate_sweep(store: Store, spec: SweepSpec, *, recent: int = RECENT) -> SweepEstimate:
    """Estimate what submitting `spec` would add; stores nothing.

    Refuses what `submit` refuses (a cancelled sweep, a changed dataset, fixture set or agent, new
    attempts for a sealed sweep), so a dry run that passes means the submit would too.
    """
    with store.read() as session:
        sweep = session.scalar(select(Sweep).where(Sweep.name == spec.name))
        have: dict[tuple[str, str], int] = {}
        if sweep is not None:
            check_resubmit(sweep, spec)
            have = _existing(session, sweep.id, spec)
        adds = {
            (task, model): spec.trials - have.get((task, model), 0)
            for task in spec.tasks
            for model in spec.models
        }
        if sweep is not None and any(adds.values()):
            refuse_if_sealed(sweep)
        history = _history(session, spec, recent, sqlite=store.is_sqlite)
        capacity = pool_capacity(session, spec.pool)
    pairs = []
    for (task, model), attempts in adds.items():
        executions, cost, seconds = history.get(f"{task}{_SEP}{model}", (0, None, None))
        pairs.append(PairEstimate(task, model, attempts, executions, cost, seconds))
    return SweepEstimate(
        name=spec.name,
        pool=spec.pool,
        active_beds=capacity.active,
        capacity_warning=capacity.warning(),
        new_sweep=sweep is None,
        existing=sum(have.values()),
        pairs=tuple(pairs),
        recent=recent,
        budget_usd=spec.budget_usd,
        capped=bool(spec.max_concurrent),
    )


def _existing(session: Session, sweep_id: int, spec: SweepSpec) -> dict[tuple[str, str], int]:
    """Attempts of the spec's keys the sweep holds, per (task, model)."""
    stmt = (
        select(Attempt.task, Attempt.model, func.count())
        .where(
            Attempt.sweep_id == sweep_id,
            Attempt.task.in_(spec.tasks),
            Attempt.model.in_(spec.models),
            Attempt.trial.between(1, spec.trials),
        )
        .group_by(Attempt.task, Attempt.model)
    )
    return {(task, model): int(n) for task, model, n in session.execute(stmt)}


def _history(
    session: Session, spec: SweepSpec, recent: int, *, sqlite: bool
) -> dict[str, tuple[int, Spread | None, Spread | None]]:
    """Per "task<TAB>model" key: executions read, cost and bed-seconds spreads."""
    if sqlite:
        elapsed: Any = (
            func.julianday(Execution.finished_at) - func.julianday(Execution.started_at)
        ) * 86400.0
    else:
        elapsed = extract("epoch", Execution.finished_at - Execution.started_at)
    key = (Attempt.task + _SEP + Attempt.model).label("key")
    ranked = (
        select(
            key,
            cast(Execution.cost_usd, Float).label("cost"),
            cast(func.coalesce(Execution.bed_seconds, elapsed), Float).label("seconds"),
            func.row_number()
            .over(
                partition_by=(Attempt.task, Attempt.model),
                order_by=(Execution.finished_at.desc(), Execution.id.desc()),
            )
            .label("recency"),
        )
        .select_from(Execution)
        .join(Attempt, Attempt.id == Execution.attempt_id)
        .where(
            Execution.finished_at.is_not(None),
            Attempt.task.in_(spec.tasks),
            Attempt.model.in_(spec.models),
        )
        .subquery("ranked")
    )
    kept = ranked.c.recency <= recent
    counts = {
        k: (int(n), int(costed), int(timed))
        for k, n, costed, timed in session.execute(
            select(
                ranked.c.key, func.count(), func.count(ranked.c.cost), func.count(ranked.c.seconds)
            )
            .where(kept)
            .group_by(ranked.c.key)
        )
    }
    figures = {}
    for column in ("cost", "seconds"):
        values = select(ranked.c.key.label("key"), ranked.c[column].label("value")).where(
            kept, ranked.c[column].is_not(None)
        )
        figures[column] = group_quantiles(session, values, _QS)
    out: dict[str, tuple[int, Spread | None, Spread | None]] = {}
    for k, (n, costed, timed) in counts.items():
        out[k] = (
            n,
            _spread_of(figures["cost"].get(k), costed),
            _spread_of(figures["seconds"].get(k), timed),
        )
    return out


def _spread_of(found: list[float] | None, samples: int) -> Spread | None:
    if not found or not samples:
        return None
    median, p_low, p_high, least, most = found
    if samples < FEW:
        return Spread(median, least, most, samples)
    return Spread(median, p_low, p_high, samples)


def _key(pair: PairEstimate) -> dict[str, Any]:
    return {"task": pair.task, "model": pair.model, "attempts": pair.attempts}


def _figures(median: float, low: float, high: float, **count: int) -> dict[str, Any]:
    return {"median": round(median, 6), "low": round(low, 6), "high": round(high, 6), **count}


def _as_dict(total: Total | None) -> dict[str, Any] | None:
    if total is None:
        return None
    return _figures(total.median, total.low, total.high, attempts=total.attempts)


def _spread(spread: Spread | None) -> dict[str, Any] | None:
    if spread is None:
        return None
    return _figures(spread.median, spread.low, spread.high, executions=spread.samples)


def _row(
    name: str,
    counts: dict[str, Any],
    cost: dict[str, Any] | None,
    seconds: dict[str, Any] | None,
) -> tuple[str, ...]:
    unknown = "?"
    return (
        name,
        str(counts["attempts"]),
        str(counts["attempts_without_history"]),
        _usd(cost["median"]) if cost else unknown,
        f"{_usd(cost['low'])}-{_usd(cost['high'])}" if cost else unknown,
        _duration(seconds["median"]) if seconds else unknown,
        f"{_duration(seconds['low'])}-{_duration(seconds['high'])}" if seconds else unknown,
    )


def _usd(value: float) -> str:
    if value >= 100:
        return f"${value:,.0f}"
    if value >= 1 or value == 0:
        return f"${value:.2f}"
    return f"${value:.3g}"


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"
