"""A bed's canary, as the store knows it: its settings, when one is due, and its history.

A canary is the farm's own execution on a bed: the trusted verify, the reset and a grade, with no
agent in between (workers/canary.py runs it). At baseline a build task must not pass, so a PASSED
there (a contaminated bed) or a grade that cannot run (a broken grader) quarantines the bed.
It is never an attempt of any sweep: each canary is one `bed_events` row (kind "canary", its
evidence as JSON in `detail`), and the bed's summary (count, failures, the last one) sits in
`beds.meta["canary"]`, so `bed list` and the dashboard read one row per bed. The lifecycle
(lifecycle.py: hold_for_canary, record_canary, set_canary_config) writes both; this module only
reads and validates.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from apg_farm.contract import SAFE_ARG
from apg_farm.errors import BadInput
from apg_farm.settings import Settings, load_settings
from apg_farm.store.db import Store
from apg_farm.store.models import Bed, Execution, Sweep, utcnow

#: The bed event kind of a canary, and the bed meta key of its summary.
CANARY = "canary"
#: The bed meta key of a canary holding the bed (claims refuse it meanwhile): {until, by}.
CANARY_HOLD = "canary_hold"
#: The bed meta key of the bed's own canary settings (over the farm's APG_FARM_CANARY_*).
CANARY_CONFIG = "canary_config"

#: What a canary found; only HEALTHY is the expected result.
HEALTHY = "healthy"  #: the grade at baseline said FAILED
CONTAMINATED = "contaminated"  #: the grade at baseline said PASSED
BROKEN = "broken"  #: the grade could not run, or gave no verdict the farm accepts
NOT_AT_BASELINE = "not_at_baseline"  #: the trusted verify or the reset failed
NO_TASK = "no_task"  #: no task to grade (every candidate SKIPped, none known)
INCONCLUSIVE = "inconclusive"  #: the link failed: nothing learned, still due
QUARANTINING = frozenset({CONTAMINATED, BROKEN, NOT_AT_BASELINE})


@dataclass(frozen=True)
class CanaryConfig:
    """When a bed's canary is due and what it grades."""

    #: Executions on the bed between canaries; 0: not by count.
    every: int = 0
    #: Hours between canaries; 0: not by time.
    hours: float = 0.0
    #: The task graded; None: the first gradeable task of the newest sweep of the bed's pool.
    task: str | None = None
    #: The dataset named to the grade with `task`; None: the bed's default.
    dataset: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def enabled(self) -> bool:
        return self.every > 0 or self.hours > 0


def check_canary_config(values: Mapping[str, Any], *, prefix: str = "--") -> dict[str, Any]:
    """A bed's canary settings checked: every problem a BadInput naming the field (`prefix` +
    its name, as the user wrote it). Unknown keys are refused; None leaves a key to the farm."""
    known = set(CanaryConfig.__dataclass_fields__)
    for key in values:
        if key not in known:
            raise BadInput(
                f"unknown canary setting {key!r}",
                field=f"{prefix}{key}",
                fix=f"use {', '.join(sorted(known))}",
            )
    checked: dict[str, Any] = {}
    every = values.get("every")
    if every is not None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 0:
            raise BadInput(
                f"{every!r} is not a count of attempts",
                field=f"{prefix}every",
                fix="a whole number >= 0 (0: not by count)",
            )
        checked["every"] = every
    hours = values.get("hours")
    if hours is not None:
        if isinstance(hours, bool) or not isinstance(hours, int | float) or not 0 <= hours < 1e6:
            raise BadInput(
                f"{hours!r} is not a number of hours",
                field=f"{prefix}hours",
                fix="a number >= 0 (0: not by time), e.g. 24 or 0.5",
            )
        checked["hours"] = float(hours)
    for key in ("task", "dataset"):
        value = values.get(key)
        if value is None:
            continue
        if not isinstance(value, str) or not SAFE_ARG.fullmatch(value):
            raise BadInput(
                f"{value!r} is not a {key} id (letters, digits and ._@=:/- only)",
                field=f"{prefix}{key}",
                fix=f"give the {key} id as the grade takes it",
            )
        checked[key] = value
    if "dataset" in checked and "task" not in checked:
        raise BadInput(
            "a dataset names where the canary's task is: give the task too",
            field=f"{prefix}dataset",
            fix="add --task",
        )
    return checked


def effective_config(
    meta: Mapping[str, Any] | None, settings: Settings | None = None
) -> CanaryConfig:
    """The bed's own settings over the farm's (APG_FARM_CANARY_EVERY, APG_FARM_CANARY_HOURS)."""
    settings = settings or load_settings()
    own = dict((meta or {}).get(CANARY_CONFIG) or {})
    return CanaryConfig(
        every=int(own.get("every", settings.canary_every)),
        hours=float(own.get("hours", settings.canary_hours)),
        task=own.get("task"),
        dataset=own.get("dataset"),
    )


def summary_of(meta: Mapping[str, Any] | None) -> dict[str, Any]:
    """A bed's canary history: count, failures, the last result with its time and task, the
    last failure's time, the event that holds the last one's evidence (empty: never ran)."""
    found = (meta or {}).get(CANARY)
    return dict(found) if isinstance(found, dict) else {}


def _since(meta: Mapping[str, Any] | None, enrolled: datetime) -> datetime:
    """When the bed's canary clock started: its last conclusive canary, else its enrolment."""
    last = summary_of(meta).get("due_from")
    if isinstance(last, str):
        try:
            return datetime.fromisoformat(last)
        except ValueError:
            pass
    return enrolled


def canary_due(store: Store, bed_id: int, settings: Settings | None = None) -> str | None:
    """Why the bed's canary is due now (for the event's `trigger`), or None when it is not."""
    with store.read() as session:
        bed = session.get(Bed, bed_id)
        if bed is None:
            return None
        config = effective_config(bed.meta, settings)
        if not config.enabled:
            return None
        # A row written without an enrolment time (raw SQL) starts its clock now.
        since = _since(bed.meta, bed.created_at or utcnow())
        if config.hours > 0 and utcnow() - since >= timedelta(hours=config.hours):
            return f"{config.hours:g} h since the last canary"
        if config.every > 0:
            ran = _executions_since(session, bed_id, since)
            if ran >= config.every:
                return f"{ran} executions since the last canary (every {config.every})"
    return None


def _executions_since(session: Session, bed_id: int, since: datetime) -> int:
    return (
        session.scalar(
            select(func.count())
            .select_from(Execution)
            .where(Execution.bed_id == bed_id, Execution.started_at > since)
        )
        or 0
    )


def canary_tasks(
    store: Store, bed_id: int, *, task: str | None = None, dataset: str | None = None
) -> tuple[list[str], str | None]:
    """The tasks a canary tries in order (the first the grader does not SKIP is graded) and the
    dataset named with them: the one given, else the bed's setting, else the tasks of the newest
    sweep of the bed's pool with its dataset, the last canary's task first."""
    if task is not None:
        return [task], dataset
    with store.read() as session:
        bed = session.get_one(Bed, bed_id)
        config = effective_config(bed.meta)
        if config.task is not None:
            return [config.task], config.dataset
        spec = session.scalar(
            select(Sweep.spec).where(Sweep.pool == bed.pool).order_by(Sweep.id.desc()).limit(1)
        )
        last = summary_of(bed.meta).get("task")
    if not isinstance(spec, dict):
        return [], None
    tasks = [t for t in spec.get("tasks") or [] if isinstance(t, str)]
    if isinstance(last, str) and last in tasks:
        tasks = [last, *(t for t in tasks if t != last)]
    found = spec.get("dataset")
    return tasks, found if isinstance(found, str) else None
