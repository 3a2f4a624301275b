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
from sqlalchemy.exc import DBAPIError

from apg_farm.beds import (
    doctor_bed,
    enrol_escrow,
    get_bed,
    record_event,
    run_provision,
)
from apg_farm.contract import RetryPolicy, Why
from apg_farm.scheduler import (
    BED_MAINTENANCE,
    MAINTENANCE_EXPIRY,
    RUN_ATTEMPT,
    maintenance_time_limits,
    pool_queue,
    publish_attempts,
    store_now,
    top_up,
)
from apg_farm.settings import load_settings
from apg_farm.store import (
    BedState,
    Claim,
    Refusal,
    Store,
    is_transient,
)
from apg_farm.workers.celery_app import WORKER_BED
from apg_farm.workers.engine import AttemptEngine, AttemptReport
from apg_farm.workers.heartbeat import Heartbeat, worker_name

log = logging.getLogger(__name__)

#: What a broker that is down (or restarting) raises; the store is the truth, so the worker carries
#: on and the reconciler sends what could not be sent.
BROKER_ERRORS = (KombuError, RedisError, OSError)

#: Connections one worker process may hold (one worker per bed, all on one PostgreSQL). Three
#: threads share them: the attempt, its lease renewal and the heartbeat, each for one short
#: transaction at a time, none waiting for another while it holds one.
WORKER_POOL_SIZE = 2


#: What a run_attempt task returns. Celery keeps no result (the store is the truth), but the
#: task-succeeded event carries it, so Flower and `celery events` show how the attempt ended:
#: every task that did not crash is SUCCESS there, a FAILED or TAMPERED outcome included.
TaskResult = dict[str, str | int | None]


def ran_result(bed: str, report: AttemptReport) -> TaskResult:
    """A claimed attempt: its outcome when final, else whether it went back to the queue or was
    lost (its lease taken over)."""
    claim = report.claim
    if report.outcome is not None:
        ended = "recorded"
    elif report.lost:
        ended = "lost"
    else:
        ended = "requeued"
    return {
        "attempt": claim.attempt_id,
        "outcome": str(report.outcome) if report.outcome is not None else None,
        "ended": ended,
        "bed": bed,
        "sweep": claim.sweep_name,
        "task": claim.task,
        "model": claim.model,
        "trial": claim.trial,
        "execution": claim.execution_number,
        "run_id": report.run_id,
    }


def refused_result(bed: str, attempt_id: int, refusal: Refusal, *, handed_back: bool) -> TaskResult:
    """A message this bed took nothing for: no outcome, and why."""
    return {
        "attempt": attempt_id,
        "outcome": None,
        "ended": "handed back" if handed_back else "dropped",
        "bed": bed,
        "refused": str(refusal.why),
        "detail": refusal.detail[:200],
    }


class WorkerRuntime:
    """What one worker process holds: its store connection and its bed's engine."""

    def __init__(self, bed_name: str, store: Store) -> None:
        self.store = store
        self.bed_name = bed_name
        #: The retry policy with this process's APG_FARM_* overrides, read once here.
        self.policy = RetryPolicy.from_settings(load_settings())
        self.engine = AttemptEngine(
            self.store, bed_name, worker=worker_name(bed_name), policy=self.policy
        )

    def run_attempt(self, app: Celery, attempt_id: int, hostname: str | None) -> TaskResult:
        """Run the attempt if this bed may take it; otherwise make sure it is not lost."""
        self._canary_if_due()
        taken = self._take(attempt_id)
        if isinstance(taken, AttemptReport):
            report = taken
            self._stop_if_inactive(app, hostname)
            # The message this attempt came with is spent: the pool's window takes the next in
            # claim order (an attempt an infrastructure failure requeued comes first there; one
            # after provider trouble waits out its back-off and is sent then).
            self._top_up(app)
            return ran_result(self.bed_name, report)
        refusal = taken
        delay = self.policy.hand_back(refusal.why)
        if delay is not None:
            if delay:
                time.sleep(delay)
            # Handed back: the new message takes the spent one's place in the window.
            self._publish(app, attempt_id)
            self._stop_if_inactive(app, hostname)
            return refused_result(self.bed_name, attempt_id, refusal, handed_back=True)
        # Dropped (the policy says why): the spent message's place in the window goes to the
        # next attempt that may run.
        self._top_up(app)
        return refused_result(self.bed_name, attempt_id, refusal, handed_back=False)

    def _canary_if_due(self) -> None:
        """The bed's canary before its next claim, when one is due: a bed it quarantines refuses
        the claim that follows, and the message is handed back to the pool."""
        try:
            canary = self.engine.canary_if_due()
        except DBAPIError as error:
            if not is_transient(error):
                raise
            return  # the claim that follows waits for the store; the canary stays due
        if canary is not None:
            log.info("%s", canary.line())

    def _take(self, attempt_id: int) -> AttemptReport | Refusal:
        """The claim, waiting out a lease this bed still holds (a predecessor that died): such a
        message is this bed's to run once the lease ends, not a hand-back that counts against
        the attempt's hand_back_limit (the retry policy)."""
        deadline = time.monotonic() + self.policy.lease_wait()
        while True:
            taken = self._claim(attempt_id)
            if isinstance(taken, Claim):
                return self.engine.run(taken)
            if taken.why != Why.BED_BUSY:
                return taken
            left = deadline - time.monotonic()
            if left <= 0:
                return taken
            log.info("attempt %s: %s", attempt_id, taken)
            time.sleep(min(left, max(0.2, (taken.retry_in or 1.0) + 0.2)))

    def _claim(self, attempt_id: int) -> Claim | Refusal:
        """The claim, through a store outage of any length: the message stays with this worker
        (unacknowledged) until the store answers, so none is dropped for want of a store."""
        while True:
            try:
                return self.engine.claim(attempt_id=attempt_id)
            except DBAPIError as error:
                if not is_transient(error):
                    raise
                self.store.wait_until_reachable(say=log.warning)

    def _publish(self, app: Celery, attempt_id: int) -> None:
        try:
            publish_attempts(self.store, app, [attempt_id])
        except BROKER_ERRORS as error:
            # The attempt is queued in the store (the send rolled back with its transaction):
            # the reconciler finds it without a message and sends one once the broker is back.
            log.warning("attempt %s not re-sent, broker unreachable: %s", attempt_id, error)

    def _top_up(self, app: Celery) -> None:
        """Fill the pool's queue up to its window again (scheduler/window.py)."""
        settings = load_settings()
        if not settings.broker_url:
            return
        try:
            pool = get_bed(self.store, self.bed_name).pool
            top_up(
                self.store,
                app,
                settings.broker_url,
                [pool],
                per_bed=settings.window_per_bed,
                unacked_grace=self.policy.lease_seconds,
            )
        except BROKER_ERRORS as error:
            # The reconciler's next pass tops the window up instead.
            log.warning("window not topped up, broker unreachable: %s", error)
        except DBAPIError as error:
            if not is_transient(error):
                raise
            log.warning("window not topped up, store unreachable: %s", error)

    def _stop_if_inactive(self, app: Celery, hostname: str | None) -> None:
        bed = get_bed(self.store, self.bed_name)
        if bed.state != BedState.ACTIVE and hostname:
            # A quarantined bed's worker stops taking attempts; `bed release` turns it back on.
            try:
                app.control.cancel_consumer(pool_queue(bed.pool), destination=[hostname])
            except BROKER_ERRORS as error:
                # Its claims refuse attempts anyway; the next message it hands back tries again.
                log.warning("could not stop consuming %s: %s", pool_queue(bed.pool), error)


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
    """This process's runtime, made at its first message: through a store that cannot be
    reached it waits (the message stays unacknowledged), never fails the task."""
    global _runtime
    while _runtime is None:
        try:
            _runtime = WorkerRuntime(_worker_bed(), worker_store())
        except DBAPIError as error:
            if not is_transient(error):
                raise
            worker_store().wait_until_reachable(say=log.warning)
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
def run_attempt(self: Task, attempt_id: int) -> TaskResult:
    """Claim and run one attempt on this worker's bed; a duplicate message does nothing. The
    result (shown by Flower) names the attempt's outcome."""
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
