"""Submitting a sweep: idempotent, so the same file submitted twice creates nothing new."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import func, select

from apg_farm.errors import BadInput
from apg_farm.results import refuse_if_sealed
from apg_farm.specs import SweepSpec
from apg_farm.store import Attempt, Store, Sweep, SweepState
from scheduler.plan import expand

#: Fields that define what an attempt is; a sweep cannot change them once submitted.
_FIXED = ("dataset", "fixtures", "agent")


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
    """Store the sweep and any attempt it lacks. Re-submitting may add tasks, models or trials."""
    keys = expand(spec)
    with store.session() as session:
        sweep = session.scalar(select(Sweep).where(Sweep.name == spec.name).with_for_update())
        new_sweep = sweep is None
        if sweep is None:
            sweep = Sweep(
                name=spec.name,
                spec=spec.model_dump(mode="json"),
                spec_sha256=spec.digest(),
                pool=spec.pool,
            )
            session.add(sweep)
            session.flush()
            existing: set[tuple[str, str, int]] = set()
        else:
            if sweep.state != SweepState.OPEN:
                raise BadInput(
                    f"sweep {spec.name!r} was cancelled; it takes no new attempts",
                    field="name",
                    fix="give the sweep a new name",
                )
            _check_compatible(SweepSpec.model_validate(sweep.spec), spec)
            existing = {
                (a.task, a.model, a.trial)
                for a in session.execute(
                    select(Attempt.task, Attempt.model, Attempt.trial).where(
                        Attempt.sweep_id == sweep.id
                    )
                )
            }
        base = session.scalar(select(func.max(Attempt.seq)).where(Attempt.sweep_id == sweep.id))
        offset = 0 if base is None else base + 1
        fresh = [k for k in keys if (k.task, k.model, k.trial) not in existing]
        if fresh and not new_sweep:
            refuse_if_sealed(sweep)
        session.add_all(
            Attempt(
                sweep_id=sweep.id,
                task=k.task,
                model=k.model,
                trial=k.trial,
                seq=offset + k.seq,
                pool=spec.pool,
            )
            for k in fresh
        )
        if fresh and not new_sweep:
            sweep.spec = _merged(SweepSpec.model_validate(sweep.spec), spec).model_dump(mode="json")
            sweep.spec_sha256 = SweepSpec.model_validate(sweep.spec).digest()
        return Submission(sweep.id, sweep.name, len(fresh), len(existing), new_sweep)


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


def _merged(old: SweepSpec, new: SweepSpec) -> SweepSpec:
    """The stored spec grows to cover every attempt the sweep now holds."""
    return new.model_copy(
        update={
            "tasks": list(dict.fromkeys([*old.tasks, *new.tasks])),
            "models": list(dict.fromkeys([*old.models, *new.models])),
            "trials": max(old.trials, new.trials),
        }
    )
