"""Celery tasks: thin wrappers that hand the work to the attempt engine and the bed maintenance."""

from __future__ import annotations

import os
import socket
import time
from typing import Any

from celery import Celery, Task, shared_task
from celery.signals import worker_process_init
from sqlalchemy import select

from apg_farm.beds import (
    doctor_bed,
    enrol_escrow,
    get_bed,
    record_event,
    run_provision,
)
from apg_farm.settings import load_settings
from apg_farm.store import Attempt, AttemptState, Bed, BedState, Store, Sweep, SweepState
from scheduler import BED_MAINTENANCE, RUN_ATTEMPT, pool_queue, publish_attempts
from workers.celery_app import WORKER_BED
from workers.engine import AttemptEngine

#: Seconds an idle bed waits before handing back an attempt it may not take (a retry meant elsewhere).
HAND_BACK_DELAY = 1.0


class WorkerRuntime:
    """What one worker process holds: its store connection and its bed's engine."""

    def __init__(self, bed_name: str) -> None:
        settings = load_settings()
        # Migrations ran in the worker's parent at start-up; a child never migrates.
        self.store = Store(settings.resolved_database_url(), upgrade=False)
        self.bed_name = bed_name
        self.engine = AttemptEngine(
            self.store,
            bed_name,
            worker=f"celery:{bed_name}@{socket.gethostname()}:{os.getpid()}",
            lease_seconds=settings.lease_seconds,
        )

    def run_attempt(self, app: Celery, attempt_id: int, hostname: str | None) -> str:
        """Run the attempt if this bed may take it; otherwise make sure it is not lost."""
        report = self.engine.run_next(attempt_id=attempt_id)
        if report is not None:
            if report.outcome is None and not report.lost:
                # An infrastructure failure requeued it in the store: it needs a new message.
                publish_attempts(self.store, app, [attempt_id])
            self._stop_if_inactive(app, hostname)
            return str(report.outcome or ("lost" if report.lost else "retry"))
        reason = self._not_taken(attempt_id)
        if reason in ("bed inactive", "excluded here"):
            if reason == "excluded here":
                time.sleep(HAND_BACK_DELAY)
            publish_attempts(self.store, app, [attempt_id])
            self._stop_if_inactive(app, hostname)
        return reason

    def _not_taken(self, attempt_id: int) -> str:
        with self.store.session() as session:
            attempt = session.get(Attempt, attempt_id)
            bed = session.scalar(select(Bed).where(Bed.name == self.bed_name))
            if attempt is None:
                return "no such attempt"
            if attempt.state != AttemptState.QUEUED:
                # Finished, or held by a live lease elsewhere: a duplicate or redelivered message.
                return f"already {attempt.state}"
            sweep = session.get_one(Sweep, attempt.sweep_id)
            if sweep.state != SweepState.OPEN or sweep.sealed_at is not None:
                return "sweep closed"
            if bed is None or bed.state != BedState.ACTIVE:
                return "bed inactive"
            return "excluded here"

    def _stop_if_inactive(self, app: Celery, hostname: str | None) -> None:
        bed = get_bed(self.store, self.bed_name)
        if bed.state != BedState.ACTIVE and hostname:
            # A quarantined bed's worker stops taking attempts; `bed release` turns it back on.
            app.control.cancel_consumer(pool_queue(bed.pool), destination=[hostname])


_runtime: WorkerRuntime | None = None


def runtime() -> WorkerRuntime:
    global _runtime
    if _runtime is None:
        bed = os.environ.get(WORKER_BED)
        if not bed:
            raise RuntimeError(
                f"{WORKER_BED} is not set: start workers with `apg-farm worker --bed NAME`"
            )
        _runtime = WorkerRuntime(bed)
    return _runtime


@worker_process_init.connect
def _fresh_process(**_: Any) -> None:
    # Never share database connections across fork.
    global _runtime
    _runtime = None


@shared_task(name=RUN_ATTEMPT, bind=True)
def run_attempt(self: Task, attempt_id: int) -> str:
    """Claim and run one attempt on this worker's bed; a duplicate message does nothing."""
    return runtime().run_attempt(self.app, attempt_id, self.request.hostname)


@shared_task(name=BED_MAINTENANCE, bind=True)
def bed_maintenance(self: Task, bed_name: str, action: str) -> str:
    """Doctor, provision or escrow this worker's bed; the result is recorded as a bed event."""
    store = runtime().store
    bed = get_bed(store, bed_name)
    if action == "doctor":
        # The same doctor as `bed doctor`: APG's verdict plus the effective mounts check; it
        # records its own event (and quarantines a bed that can see its escrow or credentials).
        healthy, verdict = doctor_bed(store, bed)
        return "healthy" if healthy else f"unhealthy: {str(verdict)[:180]}"
    elif action == "provision":
        run_provision(bed)
        detail = "provisioned"
    elif action == "escrow":
        # enrol_escrow records its own "escrow" event with the set's path.
        record = enrol_escrow(store, bed)
        return f"escrow set {record.path} recorded ({len(record.files)} files)"
    else:
        detail = f"unknown action {action!r}: use doctor, provision or escrow"
    record_event(store, bed.id, action, detail[:4000])
    return detail[:200]
