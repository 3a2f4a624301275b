"""Celery tasks: thin wrappers that hand the work to the attempt engine and the bed maintenance."""

from __future__ import annotations

import logging
import os
import time
from datetime import datetime
from typing import Any

from celery import Celery, Task, shared_task
from celery.signals import worker_process_init, worker_process_shutdown
from kombu.exceptions import KombuError
from redis.exceptions import RedisError
from sqlalchemy import select
from sqlalchemy.orm import Session

from apg_farm.beds import (
    doctor_bed,
    enrol_escrow,
    get_bed,
    record_event,
    run_provision,
)
from apg_farm.settings import load_settings
from apg_farm.store import (
    Attempt,
    AttemptState,
    Bed,
    BedState,
    ModelGate,
    Store,
    Sweep,
    SweepState,
    db_time,
    sweep_pauses,
)
from scheduler import (
    BED_MAINTENANCE,
    MAINTENANCE_EXPIRY,
    RUN_ATTEMPT,
    maintenance_time_limits,
    pool_queue,
    publish_attempts,
    store_now,
)
from workers.celery_app import WORKER_BED
from workers.engine import AttemptEngine
from workers.heartbeat import Heartbeat, worker_name

log = logging.getLogger(__name__)

#: What a broker that is down (or restarting) raises; the store is the truth, so the worker carries
#: on and the reconciler sends what could not be sent.
BROKER_ERRORS = (KombuError, RedisError, OSError)

#: Connections one worker process may hold (one worker per bed, all on one PostgreSQL). Three
#: threads share them: the attempt, its lease renewal and the heartbeat, each for one short
#: transaction at a time, none waiting for another while it holds one.
WORKER_POOL_SIZE = 2

#: Seconds an idle bed waits before handing back an attempt it may not take (a retry meant elsewhere).
HAND_BACK_DELAY = 1.0


class WorkerRuntime:
    """What one worker process holds: its store connection and its bed's engine."""

    def __init__(self, bed_name: str, store: Store) -> None:
        self.store = store
        self.bed_name = bed_name
        self.engine = AttemptEngine(
            self.store,
            bed_name,
            worker=worker_name(bed_name),
            lease_seconds=load_settings().lease_seconds,
        )

    def run_attempt(self, app: Celery, attempt_id: int, hostname: str | None) -> str:
        """Run the attempt if this bed may take it; otherwise make sure it is not lost."""
        report = self.engine.run_next(attempt_id=attempt_id)
        if report is not None:
            if report.outcome is None and not report.lost and not report.verdict.provider_trouble:
                # An infrastructure failure requeued it in the store: it needs a new message.
                # (After provider trouble it waits out a back-off: the reconciler sends it then.)
                self._publish(app, attempt_id)
            self._stop_if_inactive(app, hostname)
            return str(report.outcome or ("lost" if report.lost else "retry"))
        reason = self._not_taken(attempt_id)
        if reason in ("bed inactive", "excluded here"):
            if reason == "excluded here":
                time.sleep(HAND_BACK_DELAY)
            self._publish(app, attempt_id)
            self._stop_if_inactive(app, hostname)
        return reason

    def _publish(self, app: Celery, attempt_id: int) -> None:
        try:
            publish_attempts(self.store, app, [attempt_id])
        except BROKER_ERRORS as error:
            # The attempt is queued in the store (the send rolled back with its transaction):
            # the reconciler finds it without a message and sends one once the broker is back.
            log.warning("attempt %s not re-sent, broker unreachable: %s", attempt_id, error)

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
            if waiting := _waiting(self.store, session, attempt, sweep):
                # Dropped, not handed back: the reconciler sends it again once it may run,
                # instead of every idle worker passing it round while a budget or a back-off holds.
                return waiting
            return "excluded here"

    def _stop_if_inactive(self, app: Celery, hostname: str | None) -> None:
        bed = get_bed(self.store, self.bed_name)
        if bed.state != BedState.ACTIVE and hostname:
            # A quarantined bed's worker stops taking attempts; `bed release` turns it back on.
            try:
                app.control.cancel_consumer(pool_queue(bed.pool), destination=[hostname])
            except BROKER_ERRORS as error:
                # Its claims refuse attempts anyway; the next message it hands back tries again.
                log.warning("could not stop consuming %s: %s", pool_queue(bed.pool), error)


def _waiting(store: Store, session: Session, attempt: Attempt, sweep: Sweep) -> str | None:
    """Why no bed may take the attempt for a while (a budget spent, a provider back-off), or None."""
    if pauses := sweep_pauses(store, session, sweep):
        return "paused: " + "; ".join(pauses)
    now = db_time(store, session)
    if attempt.not_before is not None and attempt.not_before > now:
        return "waiting: provider back-off"
    gate = session.get(ModelGate, attempt.model)
    if gate is not None and gate.paused_until is not None and gate.paused_until > now:
        return f"paused: model {attempt.model} (provider trouble)"
    return None


_store: Store | None = None
_runtime: WorkerRuntime | None = None
_heartbeat: Heartbeat | None = None


def worker_store() -> Store:
    """This process's store, shared by the engine and the heartbeat."""
    global _store
    if _store is None:
        # Migrations ran in the worker's parent at start-up; a child never migrates.
        url = load_settings().resolved_database_url()
        _store = Store(url, upgrade=False, pool_size=WORKER_POOL_SIZE)
    return _store


def _worker_bed() -> str:
    bed = os.environ.get(WORKER_BED)
    if not bed:
        raise RuntimeError(
            f"{WORKER_BED} is not set: start workers with `apg-farm worker --bed NAME`"
        )
    return bed


def runtime() -> WorkerRuntime:
    global _runtime
    if _runtime is None:
        _runtime = WorkerRuntime(_worker_bed(), worker_store())
    return _runtime


@worker_process_init.connect
def _fresh_process(**_: Any) -> None:
    # Never share database connections across fork: the pool child opens its own, then beats.
    global _store, _runtime, _heartbeat
    _store, _runtime, _heartbeat = None, None, None
    try:
        _heartbeat = Heartbeat(worker_store(), _worker_bed())
        _heartbeat.start()  # the first beat runs in its thread: process init must stay quick
    except Exception as error:
        log.error("no heartbeat: %s: %s", type(error).__name__, error)


@worker_process_shutdown.connect
def _process_exit(**_: Any) -> None:
    # A clean exit removes the row; a killed process leaves it to go stale.
    if _heartbeat is not None:
        _heartbeat.stop()
    if _store is not None:
        _store.dispose()


@shared_task(name=RUN_ATTEMPT, bind=True)
def run_attempt(self: Task, attempt_id: int) -> str:
    """Claim and run one attempt on this worker's bed; a duplicate message does nothing."""
    return runtime().run_attempt(self.app, attempt_id, self.request.hostname)


SOFT_MAINTENANCE_LIMIT, HARD_MAINTENANCE_LIMIT = maintenance_time_limits()


def stale_maintenance(store: Store, sent_at: str | None, expires_in: float | None) -> str | None:
    """Why a maintenance message is too old to run, or None. Ages come from the store's clock."""
    if sent_at is None:
        return "it carries no sent time (an older farm sent it)"
    try:
        sent = datetime.fromisoformat(sent_at)
    except ValueError:
        return f"its sent time {sent_at!r} is unreadable"
    if sent.tzinfo is None:
        return f"its sent time {sent_at!r} has no time zone"
    limit = MAINTENANCE_EXPIRY if expires_in is None else expires_in
    with store.read() as session:
        age = (store_now(session, store) - sent).total_seconds()
    if age > limit:
        return f"it was sent {age:.0f} s ago, past its {limit:.0f} s expiry"
    return None


@shared_task(
    name=BED_MAINTENANCE,
    bind=True,
    soft_time_limit=SOFT_MAINTENANCE_LIMIT,
    time_limit=HARD_MAINTENANCE_LIMIT,
)
def bed_maintenance(
    self: Task,
    bed_name: str,
    action: str,
    sent_at: str | None = None,
    expires_in: float | None = None,
) -> str:
    """Doctor, provision or escrow this worker's bed; the result is recorded as a bed event.

    A message older than its expiry is dropped, never run: a stale `escrow` from days ago would
    record whatever verifier the bed has now.
    """
    store = runtime().store
    bed = get_bed(store, bed_name)
    stale = stale_maintenance(store, sent_at, expires_in)
    if stale is not None:
        detail = f"{action} not run: {stale}; ask again if it is still wanted"
        log.warning("bed %s: %s", bed_name, detail)
        record_event(store, bed.id, "maintenance_dropped", detail)
        return f"dropped: {detail}"[:200]
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
