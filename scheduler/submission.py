"""Submitting a sweep: idempotent, so the same file submitted twice creates nothing new."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import islice

from sqlalchemy import bindparam, func, select, text
from sqlalchemy.orm import Session

from apg_farm.errors import BadInput
from apg_farm.results import refuse_if_sealed
from apg_farm.scheduler.plan import AttemptKey, iter_keys
from apg_farm.specs import PACING, SweepSpec
from apg_farm.store import (
    Attempt,
    AttemptState,
    Store,
    Sweep,
    SweepState,
    UTCDateTime,
    ensure_gates,
    place_queued,
    queue_head,
    reopen_sweep,
    stop_reason,
    utcnow,
)

#: Fields that define what an attempt is; a sweep cannot change them once submitted.
_FIXED = ("dataset", "fixtures", "agent")

#: Attempts per INSERT: a bounded batch in memory however large the sweep.
CHUNK = 10_000

_KEY = ", ".join(("sweep_id", "task", "model", "trial"))
_COLUMNS = (
    "sweep_id, task, model, trial, seq, pool, state,"
    " infra_failures, deliveries, excluded_beds, dispatches, created_at"
)
_CONSTANTS = ":pool, :state, 0, 0, '[]', 0, :created_at"

# A chunk is one statement with its keys in one or four parameters, never a parameter set per
# row: PostgreSQL reads them from arrays (one round trip), SQLite from a JSON array. A key the
# sweep already has is skipped by the unique key itself, never looked up from Python.
_PG_INSERT = text(
    f"INSERT INTO {Attempt.__tablename__} ({_COLUMNS})"
    f" SELECT :sweep_id, k.task, k.model, k.trial, k.seq, {_CONSTANTS}"
    " FROM unnest(CAST(:tasks AS TEXT[]), CAST(:models AS TEXT[]),"
    " CAST(:trials AS INTEGER[]), CAST(:seqs AS INTEGER[])) AS k(task, model, trial, seq)"
    f" ON CONFLICT ({_KEY}) DO NOTHING"
).bindparams(bindparam("created_at", type_=UTCDateTime()))
_SQLITE_INSERT = text(
    f"INSERT INTO {Attempt.__tablename__} ({_COLUMNS})"
    " SELECT :sweep_id, json_extract(k.value, '$[0]'), json_extract(k.value, '$[1]'),"
    f" json_extract(k.value, '$[2]'), json_extract(k.value, '$[3]'), {_CONSTANTS}"
    # WHERE true: SQLite's grammar needs it between a SELECT and ON CONFLICT.
    f" FROM json_each(:keys) AS k WHERE true ON CONFLICT ({_KEY}) DO NOTHING"
).bindparams(bindparam("created_at", type_=UTCDateTime()))


@dataclass(frozen=True)
class Submission:
    """What a submit did."""

    sweep_id: int
    name: str
    created: int
    existing: int
    new_sweep: bool

    def describe(self) -> str:
        if self.created == 0:
            return f"sweep {self.name} (id {self.sweep_id}): already submitted, nothing new ({self.existing} attempts)"
        verb = "submitted" if self.new_sweep else "extended"
        return f"sweep {self.name} (id {self.sweep_id}) {verb}: {self.created} new attempts" + (
            f", {self.existing} already there" if self.existing else ""
        )


def submit(store: Store, spec: SweepSpec) -> Submission:
    """Store the sweep and any attempt it lacks. Re-submitting may add tasks, models or trials.

    The keys stream from the plan into bulk INSERTs of `CHUNK` rows; the unique key skips those
    already there, so nothing is loaded to compare and memory stays flat for a million attempts.
    One transaction: a refused submit leaves nothing behind.
    """
    with store.session() as session:
        sweep = session.scalar(select(Sweep).where(Sweep.name == spec.name).with_for_update())
        new_sweep = sweep is None
        if sweep is None:
            sweep = Sweep(
                name=spec.name,
                spec=spec.model_dump(mode="json"),
                spec_sha256=spec.digest(),
                pool=spec.pool,
                budget_usd=spec.budget_usd,
                max_concurrent=spec.max_concurrent or None,
            )
            session.add(sweep)
            session.flush()
            existing = 0
        else:
            check_resubmit(sweep, spec)
            existing = _count(session, sweep.id)
        head = queue_head(store, session, spec.pool)
        if new_sweep:
            # Placed from the pool's head by its weight: it shares the pool from now on, neither
            # starving the sweeps already queued nor starved by them (lifecycle.place_queued).
            offset, weight = head, spec.priority
        else:
            # After its own attempts, in plan order; re-placed by weight below.
            last = session.scalar(select(func.max(Attempt.seq)).where(Attempt.sweep_id == sweep.id))
            offset, weight = (0 if last is None else last + 1), 1
        _insert(store, session, sweep.id, spec.pool, offset, weight, iter_keys(spec))
        created = _count(session, sweep.id) - existing
        reweigh = SweepSpec.model_validate(sweep.spec).priority != spec.priority
        if created and not new_sweep:
            # Raised inside the transaction: the rows just inserted are rolled back.
            refuse_if_sealed(sweep)
            sweep.spec = _merged(SweepSpec.model_validate(sweep.spec), spec).model_dump(mode="json")
            sweep.spec_sha256 = SweepSpec.model_validate(sweep.spec).digest()
            # A finished sweep given new attempts runs again.
            reopen_sweep(sweep)
        if not new_sweep and sweep.sealed_at is None:
            _repace(sweep, spec)
            if created or reweigh:
                # New attempts close up behind the queued ones, all spaced by the weight.
                place_queued(store, session, sweep.id, spec.priority, head)
        # Each capped model's gate row: the claim locks it to count the model's running attempts.
        ensure_gates(store, session, spec.max_concurrent)
        return Submission(sweep.id, sweep.name, created, existing, new_sweep)


def _count(session: Session, sweep_id: int) -> int:
    return int(
        session.scalar(
            select(func.count()).select_from(Attempt).where(Attempt.sweep_id == sweep_id)
        )
        or 0
    )


def _insert(
    store: Store,
    session: Session,
    sweep_id: int,
    pool: str,
    offset: int,
    weight: int,
    keys: Iterable[AttemptKey],
) -> None:
    """Insert every key the sweep lacks, `CHUNK` at a time, at queue place offset + its seq
    divided by the weight (`weight` attempts per place: lifecycle.place_queued)."""
    fixed = {
        "sweep_id": sweep_id,
        "pool": pool,
        "state": AttemptState.QUEUED.value,
        "created_at": utcnow(),
    }
    it = iter(keys)
    while chunk := list(islice(it, CHUNK)):
        if store.is_sqlite:
            rows = [[k.task, k.model, k.trial, offset + k.seq // weight] for k in chunk]
            session.execute(_SQLITE_INSERT, {**fixed, "keys": json.dumps(rows)})
            continue
        session.execute(
            _PG_INSERT,
            {
                **fixed,
                "tasks": [k.task for k in chunk],
                "models": [k.model for k in chunk],
                "trials": [k.trial for k in chunk],
                "seqs": [offset + k.seq // weight for k in chunk],
            },
        )


def check_resubmit(sweep: Sweep, spec: SweepSpec) -> None:
    """Refuse a re-submit the stored sweep cannot take: it was cancelled, or the file changes
    what its attempts are (dataset, fixture set, agent). A finished sweep takes more."""
    if sweep.state == SweepState.CANCELLED:
        raise BadInput(
            f"sweep {spec.name!r} was cancelled; it takes no new attempts",
            field="name",
            fix="give the sweep a new name",
        )
    if stopped := stop_reason(sweep):
        raise BadInput(
            f"sweep {spec.name!r} {stopped}; it takes no new attempts",
            field="name",
            fix="its question is answered: give the sweep a new name to ask another",
        )
    old = SweepSpec.model_validate(sweep.spec)
    _check_compatible(old, spec)
    _check_question(old, spec)


def _check_question(old: SweepSpec, new: SweepSpec) -> None:
    """A sweep's `stop:` is fixed once submitted (choosing the test after seeing the data is no
    test), and a sweep with one takes more trials and models but no new task: a new task's
    cells would land among pairs its test already looked at (apg_farm/sequential.py)."""
    if old.stop != new.stop:
        was, now = (s.model_dump(mode="json") if s else None for s in (old.stop, new.stop))
        raise BadInput(
            f"sweep {old.name!r} was submitted with stop={was!r}; this file says {now!r}",
            field="stop",
            fix="the stopping rule cannot change mid-sweep: give the sweep a new name",
        )
    added = [t for t in new.tasks if t not in old.tasks]
    if old.stop is not None and added:
        raise BadInput(
            f"sweep {old.name!r} has a stopping rule; it cannot take new tasks "
            f"({', '.join(added)}): their pairs would land among those its test already saw",
            field="tasks",
            fix="add trials instead, or give the sweep a new name",
        )


def _check_compatible(old: SweepSpec, new: SweepSpec) -> None:
    for field in _FIXED:
        if getattr(old, field) != getattr(new, field) and not (
            field == "fixtures" and old.pool == new.pool
        ):
            raise BadInput(
                f"sweep {old.name!r} was submitted with {field}={getattr(old, field)!r}; "
                f"this file says {getattr(new, field)!r}",
                field=field,
                fix="give the sweep a new name to run a different configuration",
            )


def _repace(sweep: Sweep, spec: SweepSpec) -> None:
    """A re-submit may change the budget and the concurrency caps (they pace the sweep; its
    digest leaves them out): the file's values replace the stored ones."""
    stored = SweepSpec.model_validate(sweep.spec)
    paced = stored.model_copy(update={name: getattr(spec, name) for name in PACING})
    if paced != stored:
        sweep.spec = paced.model_dump(mode="json")
    sweep.budget_usd = spec.budget_usd
    sweep.max_concurrent = spec.max_concurrent or None


def _merged(old: SweepSpec, new: SweepSpec) -> SweepSpec:
    """The stored spec grows to cover every attempt the sweep now holds."""
    return new.model_copy(
        update={
            "tasks": list(dict.fromkeys([*old.tasks, *new.tasks])),
            "models": list(dict.fromkeys([*old.models, *new.models])),
            "trials": max(old.trials, new.trials),
        }
    )
