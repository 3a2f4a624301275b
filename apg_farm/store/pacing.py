"""Spend and pace: budgets, per-model concurrency caps and circuit breakers, read by the claim.

Every cap is enforced where an attempt is claimed, in the claim's transaction:
- a sweep's budget and the farm's daily and total budgets stop new claims once spend reaches
  them. Spend is added to running totals (sweeps.spent_usd, the `spend` rows) as each execution
  is recorded, so a claim reads a few rows, never the history. What runs when a cap is reached
  finishes and is counted: the overshoot is at most what those attempts cost.
- a model's `max_concurrent` is checked with the model's gate row locked (PostgreSQL; SQLite
  serializes writers anyway), so two claimers cannot both take the last slot;
- a model whose provider failed is paused farm-wide until its breaker's back-off ends, then one
  probe attempt goes; a probe that runs without trouble closes the breaker.

Lock order extends claims.py's: bed, attempts, then model gates (in model order). An engine
recording an end takes bed, attempt, sweep, spend rows, then the one gate it touches.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, Select, and_, false, func, or_, select, update
from sqlalchemy.orm import Session

from apg_farm.store.db import Store
from apg_farm.store.models import (
    Attempt,
    AttemptState,
    Budget,
    ModelGate,
    Spend,
    Sweep,
    SweepState,
)

#: The farm-wide budget scopes `apg-farm budget set` takes.
SCOPES = ("daily", "total")
TOTAL = "total"


def day_key(at: datetime) -> str:
    """The spend row of the UTC day `at` falls in."""
    return f"day:{at.astimezone(UTC).date().isoformat()}"


def backoff(trips: int, base: float, ceiling: float) -> float:
    """Seconds to wait after the `trips`-th trouble in a row: base, doubling, at most ceiling."""
    return float(min(ceiling, base * 2 ** max(0, trips - 1)))


def db_time(store: Store, session: Session) -> datetime:
    """The store's clock (the server's on PostgreSQL), as budgets' days and pauses use it."""
    now: datetime | None = session.scalar(select(store.now()))
    assert now is not None
    return now.astimezone(UTC)


# --- what a claim may take ----------------------------------------------------------------


def farm_budget_reached(store: Store, session: Session) -> str | None:
    """Why the farm takes no new attempt at all (a daily or total budget spent), or None."""
    limits = dict(session.execute(select(Budget.scope, Budget.limit_usd)).all())
    if not limits:
        return None
    keys = {TOTAL: TOTAL}
    if "daily" in limits:
        keys["daily"] = day_key(db_time(store, session))
    spent = dict(
        session.execute(
            select(Spend.key, Spend.spent_usd).where(Spend.key.in_(keys.values()))
        ).all()
    )
    for scope in SCOPES:
        if scope in limits:
            used = spent.get(keys[scope], 0.0)
            if used >= limits[scope]:
                return f"budget: farm {scope} spend ${used:.2f} of ${limits[scope]:.2f}"
    return None


def claimable(store: Store) -> list[ColumnElement[bool]]:
    """Conditions on (Attempt, Sweep) rows an attempt must meet to be claimed now: past its
    back-off, its sweep under budget, its model's breaker not open."""
    now = store.now()
    paused = select(ModelGate.model).where(ModelGate.paused_until > now)
    return [
        or_(Attempt.not_before.is_(None), Attempt.not_before <= now),
        or_(Sweep.budget_usd.is_(None), Sweep.spent_usd < Sweep.budget_usd),
        Attempt.model.not_in(paused),
    ]


def at_capacity(session: Session, pool: str) -> ColumnElement[bool]:
    """A condition true for attempts whose (sweep, model) already runs its max_concurrent.

    Only sweeps that set a cap are read (few, and only open ones), then the running attempts
    of the models they cap: both bounded by the work in flight.
    """
    caps = session.execute(
        select(Sweep.id, Sweep.max_concurrent).where(
            Sweep.pool == pool, Sweep.state == SweepState.OPEN, Sweep.max_concurrent.is_not(None)
        )
    ).all()
    if not caps:
        return false()
    running = running_counts(session, {m for _, limits in caps for m in (limits or {})})
    full = [
        and_(Attempt.sweep_id == sweep_id, Attempt.model == model)
        for sweep_id, limits in caps
        for model, limit in (limits or {}).items()
        if running.get(model, 0) >= limit
    ]
    return or_(*full) if full else false()


def running_counts(session: Session, models: Iterable[str]) -> dict[str, int]:
    wanted = sorted(set(models))
    if not wanted:
        return {}
    rows = session.execute(
        select(Attempt.model, func.count())
        .where(Attempt.state == AttemptState.RUNNING, Attempt.model.in_(wanted))
        .group_by(Attempt.model)
    )
    return {model: int(count) for model, count in rows}


#: What Gates.admits returns for the attempt that probes a model's breaker.
PROBE = "probe"


@dataclass
class Gates:
    """The gate rows a claim locked, and what it learnt under the lock."""

    store: Store
    session: Session
    rows: dict[str, ModelGate]
    _now: datetime | None = None

    @classmethod
    def lock(
        cls, store: Store, session: Session, models: Iterable[str], *, capped: Iterable[str]
    ) -> Gates:
        """Lock, in model order (one statement, so claimers never wait for each other in
        opposite orders), the gates among `models` that matter: a capped model's, or one whose
        breaker tripped. A model without a row is neither."""
        wanted, capped = sorted(set(models)), sorted(set(capped))
        rows: dict[str, ModelGate] = {}
        if wanted:
            query = (
                select(ModelGate)
                .where(ModelGate.model.in_(wanted))
                .where(or_(ModelGate.trips > 0, ModelGate.model.in_(capped)))
                .order_by(ModelGate.model)
            )
            if not store.is_sqlite:
                query = query.with_for_update()
            rows = {gate.model: gate for gate in session.scalars(query)}
            missing = [m for m in capped if m in wanted and m not in rows]
            if missing:
                # A capped model's count is only safe under its row's lock: make the row (submit
                # does; a store migrated with caps already set may lack it), then lock again.
                ensure_gates(store, session, missing)
                rows = {gate.model: gate for gate in session.scalars(query)}
        return cls(store, session, rows)

    def now(self) -> datetime:
        if self._now is None:
            self._now = db_time(self.store, self.session)
        return self._now

    def admits(self, model: str, limit: int | None) -> bool | str:
        """False when the model may not start an attempt now; PROBE when this attempt is the
        breaker's probe; True otherwise. The caller holds the gate's lock."""
        gate = self.rows.get(model)
        if gate is not None and gate.paused_until is not None and gate.paused_until > self.now():
            return False
        if limit is not None and running_counts(self.session, [model]).get(model, 0) >= limit:
            return False
        if gate is not None and gate.trips > 0:
            return PROBE
        return True

    def hold_for_probe(self, model: str, base: float, ceiling: float) -> None:
        """Keep the breaker shut while its probe runs (a lost probe frees it after the back-off)."""
        gate = self.rows[model]
        gate.paused_until = self.now() + timedelta(seconds=backoff(gate.trips, base, ceiling))


def ensure_gates(store: Store, session: Session, models: Iterable[str]) -> None:
    """Create the gate rows of `models` that do not exist yet (a capped or troubled model)."""
    wanted = sorted(set(models))
    if not wanted:
        return
    session.execute(
        store.upsert(ModelGate)
        .values([{"model": model, "trips": 0} for model in wanted])
        .on_conflict_do_nothing(index_elements=["model"])
    )


# --- what an execution's end changes ---------------------------------------------------------


def add_spend(store: Store, session: Session, sweep_id: int, cost: float | None) -> None:
    """Add an execution's cost to its sweep's, today's and the farm's running totals."""
    if not cost:
        return
    session.execute(
        update(Sweep)
        .where(Sweep.id == sweep_id)
        .values(spent_usd=Sweep.spent_usd + cost)
        .execution_options(synchronize_session=False)
    )
    # Keys in sorted order ("day:…" before "total"): every finisher locks them in one order.
    for key in sorted((day_key(db_time(store, session)), TOTAL)):
        statement = store.upsert(Spend).values(key=key, spent_usd=cost)
        session.execute(
            statement.on_conflict_do_update(
                index_elements=["key"], set_={"spent_usd": Spend.spent_usd + cost}
            )
        )


def trip(
    store: Store,
    session: Session,
    model: str,
    *,
    trouble: str,
    detail: str,
    base: float,
    ceiling: float,
    probe: bool = False,
) -> datetime:
    """Provider trouble on `model`: open its breaker, for twice as long as the last time when
    this was its probe. Attempts that were already running when it opened add no trip, so a
    burst failing together counts once. Returns the pause's end."""
    ensure_gates(store, session, [model])
    gate = session.scalars(_gate_query(store, model)).one()
    now = db_time(store, session)
    if probe or gate.trips == 0 or gate.paused_until is None or gate.paused_until <= now:
        gate.trips += 1
        gate.opened_at = now
        gate.paused_until = now + timedelta(seconds=backoff(gate.trips, base, ceiling))
    gate.trouble, gate.detail = trouble, detail[:500]
    return gate.paused_until


def close(store: Store, session: Session, model: str, started_at: datetime) -> None:
    """A probe of `model` ran without provider trouble: close its breaker, if this execution
    started after the breaker last opened (an older one says nothing about the outage)."""
    gate = session.scalars(_gate_query(store, model)).one_or_none()
    if gate is None or gate.trips == 0:
        return
    if gate.opened_at is not None and started_at < gate.opened_at:
        return
    gate.trips, gate.paused_until, gate.opened_at = 0, None, None
    gate.trouble, gate.detail = None, None


def believe_outage(store: Store, session: Session, model: str, *, quiet: float) -> str | None:
    """Whether a provider claim by `model` (an unchanged site, an error record) is believed:
    None when it is, else why not. Believed while the model's outage goes on (no run of it that
    started after the outage began has ended clean); a claim that would start a new outage is
    believed at most once in `quiet` seconds, since clean runs between claims are what an agent
    faking outages when it fails looks like. Locks the model's gate row."""
    ensure_gates(store, session, [model])
    gate = session.scalars(_gate_query(store, model)).one()
    since, ended = gate.outage_since, gate.outage_ended_at
    if since is not None and (ended is None or ended < since):
        return None
    now = db_time(store, session)
    if since is not None and (now - since).total_seconds() < quiet:
        return (
            f"{model}'s last believed outage, begun {(now - since).total_seconds():.0f} s ago, "
            f"is over (a run its provider answered ended since); a new one is believed once in "
            f"{quiet:g} s"
        )
    gate.outage_since, gate.outage_ended_at = now, None
    return None


def outage_clean(session: Session, model: str, started_at: datetime) -> None:
    """A run of `model` that started at `started_at` ended without provider trouble: an outage
    that began before then is over. A no-op (and no lock) unless an outage is open."""
    session.execute(
        update(ModelGate)
        .where(
            ModelGate.model == model,
            ModelGate.outage_since.is_not(None),
            ModelGate.outage_since <= started_at,
            or_(
                ModelGate.outage_ended_at.is_(None),
                ModelGate.outage_ended_at < ModelGate.outage_since,
            ),
        )
        .values(outage_ended_at=started_at)
        .execution_options(synchronize_session=False)
    )


def _gate_query(store: Store, model: str) -> Select[ModelGate]:
    query = select(ModelGate).where(ModelGate.model == model)
    return query if store.is_sqlite else query.with_for_update()


# --- what an operator sets ----------------------------------------------------------------


def set_budget(store: Store, scope: str, limit_usd: float | None) -> None:
    """Set (or, with None, remove) the farm's `daily` or `total` budget. A raised budget
    lets the next claim through: nothing needs to be resubmitted."""
    with store.session() as session:
        budget = session.get(Budget, scope)
        if limit_usd is None:
            if budget is not None:
                session.delete(budget)
        elif budget is None:
            session.add(Budget(scope=scope, limit_usd=limit_usd, set_at=db_time(store, session)))
        else:
            budget.limit_usd, budget.set_at = limit_usd, db_time(store, session)


def set_sweep_budget(store: Store, sweep_id: int, limit_usd: float | None) -> None:
    """Set (or remove) a sweep's budget; a re-submit of its file sets it back to the file's."""
    with store.session() as session:
        session.get_one(Sweep, sweep_id).budget_usd = limit_usd


def budget_status(store: Store) -> dict[str, Any]:
    """The farm's budgets against what was spent: today (UTC, the store's clock) and in all."""
    with store.read() as session:
        limits = dict(session.execute(select(Budget.scope, Budget.limit_usd)).all())
        today = day_key(db_time(store, session))
        spent = dict(
            session.execute(
                select(Spend.key, Spend.spent_usd).where(Spend.key.in_([today, TOTAL]))
            ).all()
        )
        reached = farm_budget_reached(store, session)
    return {
        "daily": {"limit_usd": limits.get("daily"), "spent_usd": spent.get(today, 0.0)},
        "total": {"limit_usd": limits.get("total"), "spent_usd": spent.get(TOTAL, 0.0)},
        "day": today.removeprefix("day:"),
        "paused": reached,
    }


# --- what status says ----------------------------------------------------------------------


def paused_models(store: Store, session: Session) -> list[ModelGate]:
    """Models whose breaker is open or waiting for its probe."""
    return list(
        session.scalars(select(ModelGate).where(ModelGate.trips > 0).order_by(ModelGate.model))
    )


def sweep_pauses(store: Store, session: Session, sweep: Sweep) -> list[str]:
    """Why the sweep's queued attempts are not being taken now, each a line with its figures."""
    reasons = []
    if sweep.budget_usd is not None and sweep.spent_usd >= sweep.budget_usd:
        reasons.append(f"budget: sweep spent ${sweep.spent_usd:.2f} of ${sweep.budget_usd:.2f}")
    farm = farm_budget_reached(store, session)
    if farm:
        reasons.append(farm)
    return reasons


def pace_status(store: Store, session: Session, sweep: Sweep) -> dict[str, Any]:
    """The sweep's spend against its caps, and why its queued attempts may be waiting:
    "paused" (a budget spent: a person must raise it), paused models (their provider failed;
    they resume on their own), and models at their max_concurrent."""
    # The stored spec's models, read as data: status must not fail on a spec it cannot parse.
    models = set((sweep.spec or {}).get("models") or [])
    caps = sweep.max_concurrent or {}
    running = running_counts(session, caps)
    now = db_time(store, session)
    return {
        "spend": {"spent_usd": round(sweep.spent_usd, 6), "budget_usd": sweep.budget_usd},
        "paused": sweep_pauses(store, session, sweep),
        "paused_models": [
            {
                "model": gate.model,
                "trouble": gate.trouble,
                "trips": gate.trips,
                "until": gate.paused_until.isoformat(timespec="seconds")
                if gate.paused_until
                else None,
                "waiting_for": "back-off"
                if gate.paused_until is not None and gate.paused_until > now
                else "probe",
                "detail": gate.detail,
            }
            for gate in paused_models(store, session)
            if gate.model in models
        ],
        "max_concurrent": {
            model: {"running": running.get(model, 0), "max": limit}
            for model, limit in sorted(caps.items())
        },
    }


def stopped_by_budget(store: Store, sweep_id: int) -> list[str]:
    """The budgets that hold the sweep with nothing of it running: waiting longer would wait
    for a person to raise one. Empty while it may still move on its own."""
    with store.read() as session:
        sweep = session.get_one(Sweep, sweep_id)
        pauses = sweep_pauses(store, session, sweep)
        if not pauses:
            return []
        running = session.scalar(
            select(func.count())
            .select_from(Attempt)
            .where(Attempt.sweep_id == sweep_id, Attempt.state == AttemptState.RUNNING)
        )
    return [] if running else pauses
