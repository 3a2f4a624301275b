"""Dataset pins: what a task's grade reads on one bed baseline (`dataset_pins`).

A pin's scope is the baseline identity (issue #22's key: fixture set and code versions) *and*
the escrow set the bed is verified against (`executions.escrow_sha256`): the dataset in a custom
module is project content, not code, so two beds on one baseline key may hold different
datasets, and an operator who changes a bed's dataset re-escrows it (a new escrow digest, so a
new pin, never a stale one that would charge the next agent). The first pin of a scope stands:
a pin is written once (the unique key settles a race between two writers) and never updated.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Select, select
from sqlalchemy.exc import IntegrityError

from apg_farm.contract import DatasetRead
from apg_farm.store.db import Store
from apg_farm.store.models import DatasetPin

#: Where a pin came from.
PIN_BASELINE_GRADE = "baseline_grade"
PIN_CANARY = "canary"


@dataclass(frozen=True)
class PinScope:
    """Which grades a pin judges: one task (and dataset named) on one verified baseline."""

    baseline_key: str
    escrow_sha256: str
    task: str
    dataset: str

    @classmethod
    def of(
        cls, baseline_key: str | None, escrow_sha256: str | None, task: str, dataset: str | None
    ) -> PinScope | None:
        """None when the bed names neither a baseline nor an escrow set (nothing to pin to)."""
        if not baseline_key and not escrow_sha256:
            return None
        return cls(
            (baseline_key or "")[:16], (escrow_sha256 or "")[:64], task[:255], (dataset or "")[:255]
        )


def _scoped(scope: PinScope) -> Select[DatasetPin]:
    return select(DatasetPin).where(
        DatasetPin.baseline_key == scope.baseline_key,
        DatasetPin.escrow_sha256 == scope.escrow_sha256,
        DatasetPin.task == scope.task,
        DatasetPin.dataset == scope.dataset,
    )


def _read(row: DatasetPin) -> DatasetRead:
    return DatasetRead(row.dataset_sha256, row.task_sha256, row.dataset_path, row.note)


def find_pin(store: Store, scope: PinScope) -> DatasetRead | None:
    """The pin of `scope`, or None when no grade at baseline pinned it yet."""
    with store.read() as session:
        row = session.scalar(_scoped(scope))
        return _read(row) if row is not None else None


def record_pin(
    store: Store,
    scope: PinScope,
    read: DatasetRead,
    *,
    source: str,
    bed_id: int | None,
    execution_id: int | None = None,
) -> DatasetRead:
    """Pin `read` for `scope` unless a pin is there already; returns the pin that stands."""
    try:
        with store.session() as session:
            existing = session.scalar(_scoped(scope))
            if existing is not None:
                return _read(existing)
            session.add(
                DatasetPin(
                    baseline_key=scope.baseline_key,
                    escrow_sha256=scope.escrow_sha256,
                    task=scope.task,
                    dataset=scope.dataset,
                    dataset_sha256=read.dataset_sha256,
                    task_sha256=read.task_sha256,
                    dataset_path=read.dataset_path,
                    note=read.note,
                    source=source,
                    bed_id=bed_id,
                    execution_id=execution_id,
                )
            )
        return read
    except IntegrityError:
        # Another writer pinned the scope first: its pin stands.
        found = find_pin(store, scope)
        if found is None:
            raise
        return found
