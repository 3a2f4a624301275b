"""Claims and leases: how a bed takes an attempt so that no attempt runs twice at once.

A bed claims with one conditional UPDATE (queued -> running, its bed id, a lease, delivery + 1).
A claim that matches no row means another bed won: it simply tries the next attempt. The holder
renews the lease while it works; the reconciler returns attempts whose lease expired.

Leases are stamped and judged with the database's clock (Store.now), never a host's: a worker
whose clock runs behind, or a reconciler whose clock runs ahead, cannot expire a live lease.

Lock order, on every path that takes both: the bed rows first (in id order), then the attempt
rows. A claimer locks its bed then skips attempts others hold; the reconciler locks the beds of
the expired attempts then those attempts; the engine recording an end locks its bed then its
attempt. Two transactions never wait for each other in opposite orders.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, not_, or_, select, update
from sqlalchemy.orm import Session

from apg_farm.contract import UNESCROWED, UNFINGERPRINTED, Outcome
from apg_farm.defaults import (
    EXTRA_DELIVERIES,
    MAX_CONSECUTIVE_INFRA_ERRORS,
    PROVIDER_BACKOFF,
    PROVIDER_BACKOFF_MAX,
)
from apg_farm.specs import SweepSpec
from apg_farm.store.db import Store, rowcount
from apg_farm.store.models import (
    Attempt,
    AttemptState,
    Bed,
    BedEvent,
    BedState,
    Execution,
    Sweep,
    SweepState,
    utcnow,
)
from apg_farm.store.pacing import PROBE, Gates, at_capacity, claimable, farm_budget_reached

#: How many queued attempts a claimer looks at to find one it may take.
_CANDIDATES = 64


@dataclass(frozen=True)
class Claim:
    """An attempt held by a bed, with what the engine needs to run it."""

    attempt_id: int
    execution_id: int
    execution_number: int
    bed_id: int
    sweep_id: int
    sweep_name: str
    task: str
    model: str
    trial: int
    spec: SweepSpec
    #: Tries of this attempt the provider already failed (each retried without counting).
    provider_failures: int = 0
    #: This attempt is its model's breaker probe: how it ends closes or reopens the breaker.
    probe: bool = False
    #: The bed's last run ended with its agent confirmed stopped. The claim itself records
    #: "not confirmed" on the bed (committed before anything runs); the engine records how
    #: this attempt ended with its verdict, so a worker that dies leaves the bed marked.
    agent_stopped: bool = True

    @property
    def label(self) -> str:
        """A stable name for the attempt, also given to the bed as APG_FARM_ATTEMPT."""
        return f"{self.sweep_name}/{self.task}/{self.model}/{self.trial}"


#: The bed meta key saying the bed's last run ended with its agent confirmed stopped.
AGENT_STOPPED = "agent_stopped"

#: A retry handed back this many times is taken by any bed: the beds it waits for may have no worker.
HAND_BACK_LIMIT = 10


def _may_take(attempt: Attempt, bed_id: int, active_beds: set[int]) -> bool:
    # A retry goes to another bed where one exists; when every active bed already failed it,
    # any bed may take it rather than leave it stranded.
    excluded = set(attempt.excluded_beds or [])
    handed_back = attempt.dispatches - attempt.infra_failures - 1
    return bed_id not in excluded or active_beds <= excluded or handed_back >= HAND_BACK_LIMIT


def _poisoned(attempt: Attempt, spec: SweepSpec) -> bool:
    # A try the provider failed was delivered and finished: it is no sign of a looping worker.
    return attempt.deliveries - attempt.provider_failures >= spec.retries + 1 + EXTRA_DELIVERIES


def claim_next(
    store: Store,
    bed_id: int,
    *,
    lease_seconds: float,
    worker: str,
    sweep_id: int | None = None,
    attempt_id: int | None = None,
    backoff: tuple[float, float] = (PROVIDER_BACKOFF, PROVIDER_BACKOFF_MAX),
) -> Claim | None:
    """Claim the next attempt this bed may run (or exactly `attempt_id`), or None.

    Only attempts every cap allows are looked at (pacing.py): the farm's and the sweep's
    budgets, the model's breaker and its max_concurrent; `backoff` (base, ceiling) is how long
    a breaker probe keeps its model's other attempts waiting.
    """
    with store.session() as session:
        # Lock the bed row: two claimers for one bed (two executors, a second worker) queue here.
        bed = session.get(Bed, bed_id, with_for_update=not store.is_sqlite)
        if bed is None or bed.state != BedState.ACTIVE:
            return None
        if _busy(store, session, bed_id):
            return None
        if refusal := _unattended_refusal(bed):
            # No unattended attempt on a bed whose verifier the agent could rewrite.
            bed.state = BedState.QUARANTINED
            bed.state_reason = refusal
            session.add(BedEvent(bed_id=bed.id, kind="quarantined", detail=refusal))
            return None
        if farm_budget_reached(store, session):
            return None
        query = (
            select(Attempt, Sweep)
            .join(Sweep, Sweep.id == Attempt.sweep_id)
            .where(Attempt.state == AttemptState.QUEUED, Sweep.state == SweepState.OPEN)
            .where(*claimable(store), not_(at_capacity(session, bed.pool)))
            # A sealed sweep's evidence is closed: it takes no new executions.
            .where(Sweep.sealed_at.is_(None))
            .where(Attempt.pool == bed.pool)
            .order_by(Attempt.seq, Attempt.id)
            .limit(_CANDIDATES)
        )
        if sweep_id is not None:
            query = query.where(Attempt.sweep_id == sweep_id)
        if attempt_id is not None:
            query = query.where(Attempt.id == attempt_id)
        if not store.is_sqlite:
            # Concurrent claimers skip rows another transaction is claiming instead of queueing on them.
            query = query.with_for_update(of=Attempt, skip_locked=True)
        active = set(
            session.scalars(
                select(Bed.id).where(Bed.pool == bed.pool, Bed.state == BedState.ACTIVE)
            )
        )
        now = utcnow()
        candidates = session.execute(query).all()
        gates = Gates.lock(
            store,
            session,
            {attempt.model for attempt, _ in candidates},
            capped={m for _, sweep in candidates for m in (sweep.max_concurrent or {})},
        )
        for attempt, sweep in candidates:
            spec = SweepSpec.model_validate(sweep.spec)
            if _poisoned(attempt, spec):
                _finish_poisoned(attempt, now)
                continue
            if not _may_take(attempt, bed_id, active):
                continue
            admitted = gates.admits(attempt.model, (sweep.max_concurrent or {}).get(attempt.model))
            if not admitted:
                continue
            won = rowcount(
                session.execute(
                    update(Attempt)
                    .where(Attempt.id == attempt.id, Attempt.state == AttemptState.QUEUED)
                    .values(
                        state=AttemptState.RUNNING,
                        bed_id=bed_id,
                        lease_expires_at=store.now_plus(lease_seconds),
                        deliveries=Attempt.deliveries + 1,
                    )
                    .execution_options(synchronize_session=False)
                )
            )
            if won != 1:
                continue
            number = (
                session.scalar(
                    select(func.count())
                    .select_from(Execution)
                    .where(Execution.attempt_id == attempt.id)
                )
                or 0
            ) + 1
            # Stamped now, not when the claim began: a claim that waited for a gate's lock
            # starts after whatever finished meanwhile.
            execution = Execution(
                attempt_id=attempt.id,
                bed_id=bed_id,
                number=number,
                worker=worker,
                started_at=utcnow(),
            )
            session.add(execution)
            stopped_before = bool((bed.meta or {}).get(AGENT_STOPPED, True))
            bed.meta = {**(bed.meta or {}), AGENT_STOPPED: False}
            if admitted == PROBE:
                gates.hold_for_probe(attempt.model, *backoff)
            session.flush()
            return Claim(
                attempt_id=attempt.id,
                execution_id=execution.id,
                execution_number=number,
                bed_id=bed_id,
                sweep_id=sweep.id,
                sweep_name=sweep.name,
                task=attempt.task,
                model=attempt.model,
                trial=attempt.trial,
                spec=spec,
                provider_failures=attempt.provider_failures,
                probe=admitted == PROBE,
                agent_stopped=stopped_before,
            )
    return None


def _unattended_refusal(bed: Bed) -> str | None:
    """Why this bed may not run an attempt unattended, or None."""
    if not bed.escrow_set and not bed.untrusted_verifier:
        return UNESCROWED
    if (bed.escrow_set and not bed.escrow_files) or bed.ddev_files is None:
        return UNFINGERPRINTED
    return None


def _busy(store: Store, session: Session, bed_id: int) -> bool:
    """True while the bed holds a live claim: a bed never runs two attempts at once.

    A claim whose lease already ran out (its worker died) is given back first, so a restarted
    worker need not wait for the reconciler. The caller holds the bed's lock.
    """
    held = session.execute(
        select(Attempt.id, Attempt.lease_expires_at < store.now())
        .where(Attempt.bed_id == bed_id, Attempt.state == AttemptState.RUNNING)
        .order_by(Attempt.id)
    ).all()
    for attempt_id, expired in held:
        if expired:
            _requeue(session, [attempt_id])
        else:
            return True
    return False


def _count_bed_failure(session: Session, bed_id: int) -> None:
    bed = session.get(Bed, bed_id)
    if bed is None:
        return
    bed.consecutive_errors += 1
    if bed.state == BedState.ACTIVE and bed.consecutive_errors >= MAX_CONSECUTIVE_INFRA_ERRORS:
        bed.state = BedState.QUARANTINED
        bed.state_reason = (
            f"{bed.consecutive_errors} attempts lost in a row (its worker or link keeps dying)"
        )
        session.add(BedEvent(bed_id=bed.id, kind="quarantined", detail=bed.state_reason))


def _finish_poisoned(attempt: Attempt, now: datetime) -> None:
    # Delivered again and again without finishing (a worker that dies on it): stop looping.
    attempt.state = AttemptState.DONE
    attempt.outcome = Outcome.ERROR
    attempt.reason = f"poisoned: delivered {attempt.deliveries} times without finishing"
    attempt.finished_at = now
    attempt.bed_id = None
    attempt.lease_expires_at = None


def renew_lease(store: Store, claim: Claim, *, lease_seconds: float) -> bool:
    """Extend the lease; False when the claim was lost (expired and taken back)."""
    with store.session() as session:
        renewed = rowcount(
            session.execute(
                update(Attempt)
                .where(
                    Attempt.id == claim.attempt_id,
                    Attempt.state == AttemptState.RUNNING,
                    Attempt.bed_id == claim.bed_id,
                )
                .values(lease_expires_at=store.now_plus(lease_seconds))
                .execution_options(synchronize_session=False)
            )
        )
    return renewed == 1


def requeue_expired(store: Store) -> int:
    """Return attempts whose lease ran out (their bed or worker died) to the queue.

    Their unfinished execution is closed as LOST, so the history shows the try that was cut short.
    The beds of those attempts are locked first (in id order), then the attempts, as the claim
    and the engine do; an attempt another transaction holds (its holder recording the end) is
    left for the next pass.
    """
    with store.session() as session:
        now = store.now()
        expired = (Attempt.state == AttemptState.RUNNING, Attempt.lease_expires_at < now)
        found = list(session.scalars(select(Attempt.bed_id).where(*expired).distinct()))
        if not found:
            return 0
        beds = sorted(b for b in found if b is not None)
        if beds and not store.is_sqlite:
            session.execute(
                select(Bed.id).where(Bed.id.in_(beds)).order_by(Bed.id).with_for_update()
            )
        query = (
            select(Attempt.id)
            .where(*expired, or_(Attempt.bed_id.in_(beds), Attempt.bed_id.is_(None)))
            .order_by(Attempt.id)
        )
        if not store.is_sqlite:
            query = query.with_for_update(skip_locked=True)
        ids = list(session.scalars(query))
        _requeue(session, ids)
        return len(ids)


def _requeue(session: Session, ids: list[int]) -> None:
    """Expired claims back to the queue; in a sweep no longer open they end CANCELLED instead."""
    if not ids:
        return
    closed = set(
        session.scalars(
            select(Attempt.id)
            .join(Sweep, Sweep.id == Attempt.sweep_id)
            .where(Attempt.id.in_(ids), Sweep.state != SweepState.OPEN)
        )
    )
    for attempt in session.scalars(
        select(Attempt).where(Attempt.id.in_(ids), Attempt.state == AttemptState.RUNNING)
    ):
        if attempt.bed_id is not None:
            # The bed (or its worker, or the link to it) stopped answering: like any infrastructure
            # failure, the attempt goes elsewhere and the bed's failures in a row grow.
            attempt.excluded_beds = sorted({*(attempt.excluded_beds or []), attempt.bed_id})
            _count_bed_failure(session, attempt.bed_id)
        attempt.state = AttemptState.QUEUED
        attempt.bed_id = None
        attempt.lease_expires_at = None
        attempt.enqueued_at = None
    session.flush()
    if closed:
        session.execute(
            update(Attempt)
            .where(Attempt.id.in_(closed))
            .values(
                state=AttemptState.DONE,
                outcome=Outcome.CANCELLED,
                reason="sweep cancelled while the attempt's bed stopped answering",
                finished_at=utcnow(),
            )
            .execution_options(synchronize_session=False)
        )
    session.execute(
        update(Execution)
        .where(Execution.attempt_id.in_(ids), Execution.result.is_(None))
        .values(result="LOST", reason="lease expired: the bed or its worker stopped answering")
        .execution_options(synchronize_session=False)
    )
