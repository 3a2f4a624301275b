"""Claims and leases: how a bed takes an attempt so that no attempt runs twice at once.

A bed claims with one conditional UPDATE (queued -> running, its bed id, a lease, delivery + 1).
A claim that matches no row means another bed won: it simply tries the next attempt. The holder
renews the lease while it works; the reconciler returns attempts whose lease expired.

Leases are stamped and judged with the database's clock (Store.now), never a host's: a worker
whose clock runs behind, or a reconciler whose clock runs ahead, cannot expire a live lease.

The lock order is lifecycle.py's (bed rows, then attempt rows, then gates). A claim that takes
nothing says why (`Refusal`), decided in its own transaction, so a front end never works it out
again.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import and_, case, func, not_, or_, select, update
from sqlalchemy.orm import Session

from apg_farm.contract import (
    DEFAULT_POLICY,
    LOST_ON_HOST,
    UNESCROWED,
    UNFINGERPRINTED,
    Outcome,
    RetryPolicy,
    Why,
)
from apg_farm.specs import SweepSpec
from apg_farm.store.baselines import note_baseline
from apg_farm.store.canaries import CANARY_HOLD
from apg_farm.store.claim_gates import unpaused as claims_unpaused
from apg_farm.store.db import Store, rowcount
from apg_farm.store.models import (
    Attempt,
    AttemptState,
    Bed,
    BedEvent,
    BedState,
    Execution,
    ModelGate,
    Sweep,
    SweepState,
    utcnow,
)
from apg_farm.store.pacing import (
    PROBE,
    Gates,
    at_capacity,
    claimable,
    db_time,
    farm_budget_reached,
    sweep_pauses,
)
from apg_farm.store.rules import count_lost_try, done, finish_if_final
from apg_farm.store.stopping import stop_reason

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


@dataclass(frozen=True)
class Refusal:
    """A claim that took nothing, and why, decided in the claim's own transaction."""

    why: Why
    detail: str = ""
    #: Seconds until the refusal may lift on its own (a lease's end, a back-off), when known.
    retry_in: float | None = None

    def __str__(self) -> str:
        return f"{self.why}: {self.detail}" if self.detail else str(self.why)


#: The bed meta key saying the bed's last run ended with its agent confirmed stopped.
AGENT_STOPPED = "agent_stopped"


def claim_next(
    store: Store,
    bed_id: int,
    *,
    lease_seconds: float,
    worker: str,
    sweep_id: int | None = None,
    attempt_id: int | None = None,
    policy: RetryPolicy = DEFAULT_POLICY,
) -> Claim | None:
    """`claim`, for callers that need not know why nothing was taken."""
    taken = claim(
        store,
        bed_id,
        lease_seconds=lease_seconds,
        worker=worker,
        sweep_id=sweep_id,
        attempt_id=attempt_id,
        policy=policy,
    )
    return taken if isinstance(taken, Claim) else None


def claim(
    store: Store,
    bed_id: int,
    *,
    lease_seconds: float,
    worker: str,
    sweep_id: int | None = None,
    attempt_id: int | None = None,
    policy: RetryPolicy = DEFAULT_POLICY,
    driver: str | None = None,
) -> Claim | Refusal:
    """Claim the next attempt this bed may run (or exactly `attempt_id`), or say why not.

    An attempt the claim ended instead (poisoned, or queued in a sweep whose comparison was
    decided) may have been its sweep's last: the sweep is finished after the claim commits, in
    a transaction of its own (the claim holds model gates, which come after the sweep in the
    lock order).
    """
    ended: set[int] = set()
    taken = _claim(
        store,
        bed_id,
        lease_seconds=lease_seconds,
        worker=worker,
        sweep_id=sweep_id,
        attempt_id=attempt_id,
        policy=policy,
        driver=driver,
        ended=ended,
    )
    for ended_sweep in sorted(ended):
        with store.session() as session:
            finish_if_final(store, session, ended_sweep)
    return taken


def _claim(
    store: Store,
    bed_id: int,
    *,
    lease_seconds: float,
    worker: str,
    sweep_id: int | None,
    attempt_id: int | None,
    policy: RetryPolicy,
    driver: str | None,
    ended: set[int],
) -> Claim | Refusal:
    """`claim`'s one transaction; the sweeps of the attempts it ended are added to `ended`.

    Only attempts every cap allows are looked at (pacing.py): the farm's and the sweep's
    budgets, the model's breaker and its max_concurrent; the policy's `backoff` (base, ceiling)
    is how long a breaker probe keeps its model's other attempts waiting, and it says which
    attempts are poisoned and which this bed may not take (contract/retries.py). Only sweeps of `driver` are
    looked at: the farm's own (None) for a worker, a harness's own for that harness.
    """
    with store.session() as session:
        # Lock the bed row: two claimers for one bed (two executors, a second worker) queue here.
        bed = session.get(Bed, bed_id, with_for_update=not store.is_sqlite)
        if bed is None:
            return Refusal(Why.BED_INACTIVE, f"no bed with id {bed_id}")
        if bed.state != BedState.ACTIVE:
            return Refusal(Why.BED_INACTIVE, f"the bed is {bed.state}")
        if busy := _busy(store, session, bed_id, policy):
            return busy
        if refusal := _unattended_refusal(bed):
            # No unattended attempt on a bed whose verifier the agent could rewrite.
            bed.state = BedState.QUARANTINED
            bed.state_reason = refusal
            session.add(BedEvent(bed_id=bed.id, kind="quarantined", detail=refusal))
            return Refusal(Why.BED_INACTIVE, refusal)
        if spent := farm_budget_reached(store, session):
            return Refusal(Why.PAUSED, spent)
        query = (
            select(Attempt, Sweep)
            .join(Sweep, Sweep.id == Attempt.sweep_id)
            .where(Attempt.state == AttemptState.QUEUED, Sweep.state == SweepState.OPEN)
            .where(*claimable(store), not_(at_capacity(session, bed.pool)))
            # A model paused for claims the farm could not check (claim_gates.py) waits.
            .where(claims_unpaused())
            # A sealed sweep's evidence is closed: it takes no new executions.
            .where(Sweep.sealed_at.is_(None))
            .where(Attempt.pool == bed.pool)
            .where(Sweep.driver.is_(None) if driver is None else Sweep.driver == driver)
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
        skipped: Refusal | None = None
        for attempt, sweep in candidates:
            spec = SweepSpec.model_validate(sweep.spec)
            if spec.stop and (stopped := stop_reason(sweep)):
                # Queued after the sweep's comparison was decided (a requeue racing it): it ends
                # like the rest of the queue did.
                done(attempt, Outcome.CANCELLED, stopped)
                ended.add(attempt.sweep_id)
                skipped = skipped or Refusal(Why.SWEEP_CLOSED, stopped)
                continue
            if policy.poisoned(attempt, spec.retries):
                _finish_poisoned(attempt, now)
                ended.add(attempt.sweep_id)
                skipped = skipped or Refusal(Why.NOT_QUEUED, "poisoned")
                continue
            if not policy.may_take(attempt, bed_id, active):
                skipped = Refusal(Why.EXCLUDED, "a retry meant for another bed")
                continue
            admitted = gates.admits(attempt.model, (sweep.max_concurrent or {}).get(attempt.model))
            if not admitted:
                skipped = skipped or Refusal(
                    Why.WAITING, f"model {attempt.model} paused or at its max_concurrent"
                )
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
            # The baseline this try resets to: the bed's, as its escrow set records it.
            baseline_key, escrow_sha256 = note_baseline(session, bed)
            # Stamped now, not when the claim began: a claim that waited for a gate's lock
            # starts after whatever finished meanwhile.
            execution = Execution(
                attempt_id=attempt.id,
                bed_id=bed_id,
                number=number,
                worker=worker,
                started_at=utcnow(),
                baseline_key=baseline_key,
                escrow_sha256=escrow_sha256,
            )
            session.add(execution)
            stopped_before = bool((bed.meta or {}).get(AGENT_STOPPED, True))
            bed.meta = {**(bed.meta or {}), AGENT_STOPPED: False}
            # No phase of this try runs yet; one a dead predecessor left is not this try's.
            bed.phase, bed.phase_started_at = None, None
            if admitted == PROBE:
                gates.hold_for_probe(attempt.model, *policy.backoff)
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
        if skipped is not None:
            return skipped
        if attempt_id is not None:
            return _why_not(store, session, attempt_id, bed, driver)
        return Refusal(Why.NOTHING, f"nothing queued in pool {bed.pool} that this bed may take")


def _why_not(
    store: Store, session: Session, attempt_id: int, bed: Bed, driver: str | None
) -> Refusal:
    """Why `attempt_id` was not among the attempts this bed may take now (same transaction)."""
    attempt = session.get(Attempt, attempt_id)
    if attempt is None:
        return Refusal(Why.NOT_QUEUED, f"no attempt with id {attempt_id}")
    if attempt.state != AttemptState.QUEUED:
        # Finished, or held by a live lease elsewhere: a duplicate or redelivered message.
        return Refusal(Why.NOT_QUEUED, f"already {attempt.state}")
    sweep = session.get_one(Sweep, attempt.sweep_id)
    if sweep.state != SweepState.OPEN or sweep.sealed_at is not None:
        return Refusal(Why.SWEEP_CLOSED, f"sweep {sweep.name} is {sweep.state}")
    if stopped := stop_reason(sweep):
        return Refusal(Why.SWEEP_CLOSED, f"sweep {sweep.name} {stopped}")
    if attempt.pool != bed.pool:
        return Refusal(Why.EXCLUDED, f"the attempt is for pool {attempt.pool}")
    if sweep.driver != driver:
        return Refusal(
            Why.NOT_QUEUED, f"sweep {sweep.name} is driven by {sweep.driver or 'the farm'}"
        )
    if pauses := sweep_pauses(store, session, sweep):
        return Refusal(Why.PAUSED, "; ".join(pauses))
    now = db_time(store, session)
    if attempt.not_before is not None and attempt.not_before > now:
        wait = (attempt.not_before - now).total_seconds()
        return Refusal(Why.WAITING, "provider back-off", retry_in=wait)
    gate = session.get(ModelGate, attempt.model)
    if gate is not None and gate.paused_until is not None and gate.paused_until > now:
        wait = (gate.paused_until - now).total_seconds()
        return Refusal(Why.WAITING, f"model {attempt.model} paused (provider trouble)", wait)
    return Refusal(Why.WAITING, f"model {attempt.model} at its max_concurrent")


def _unattended_refusal(bed: Bed) -> str | None:
    """Why this bed may not run an attempt unattended, or None."""
    if not bed.escrow_set and not bed.untrusted_verifier:
        return UNESCROWED
    if (bed.escrow_set and not bed.escrow_files) or bed.ddev_files is None:
        return UNFINGERPRINTED
    return None


def canary_holder(meta: dict[str, Any] | None, now: datetime) -> tuple[str, float] | None:
    """Who holds the bed for a canary (lifecycle.hold_for_canary), and for how many seconds
    more, or None. An unreadable hold holds nothing: it expires as if it had."""
    hold = (meta or {}).get(CANARY_HOLD)
    if not isinstance(hold, dict):
        return None
    try:
        until = datetime.fromisoformat(str(hold.get("until")))
    except ValueError:
        return None
    left = (until - now).total_seconds()
    return (str(hold.get("by") or "a canary"), left) if left > 0 else None


def _busy(store: Store, session: Session, bed_id: int, policy: RetryPolicy) -> Refusal | None:
    """A refusal while the bed holds a live claim: a bed never runs two attempts at once.

    A claim whose lease already ran out (its worker died) is given back first, so a restarted
    worker need not wait for the reconciler; one whose lease still runs (a predecessor that died
    moments ago) is waited for, never handed round. The caller holds the bed's lock.
    """
    meta = session.get_one(Bed, bed_id).meta
    if meta and CANARY_HOLD in meta and (held_by := canary_holder(meta, db_time(store, session))):
        # A canary runs on the bed (lifecycle.hold_for_canary): nothing else may.
        return Refusal(Why.BED_BUSY, f"a canary by {held_by[0]} holds the bed", retry_in=held_by[1])
    held = session.execute(
        select(Attempt.id, Attempt.lease_expires_at < store.now(), Attempt.lease_expires_at)
        .where(Attempt.bed_id == bed_id, Attempt.state == AttemptState.RUNNING)
        .order_by(Attempt.id)
    ).all()
    for attempt_id, expired, until in held:
        if expired:
            _requeue(session, [attempt_id], policy)
        else:
            left = (until - db_time(store, session)).total_seconds() if until else None
            return Refusal(
                Why.BED_BUSY,
                f"attempt {attempt_id} holds the bed's lease; wait for the lease",
                retry_in=max(0.0, left) if left is not None else None,
            )
    return None


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


def requeue_expired(store: Store, *, policy: RetryPolicy = DEFAULT_POLICY) -> int:
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
        _requeue(session, ids, policy)
        return len(ids)


def _requeue(session: Session, ids: list[int], policy: RetryPolicy) -> None:
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
            count_lost_try(session, attempt.bed_id, policy)
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
        .values(
            result="LOST",
            # rerun_kinds.lost_kind, per row: the agent's on a bed without a web container.
            rerun_kind=case(
                (
                    and_(
                        Execution.agent_started.is_(True),
                        select(Bed.web_container)
                        .where(Bed.id == Execution.bed_id)
                        .scalar_subquery()
                        .is_(False),
                    ),
                    LOST_ON_HOST,
                ),
                else_="lease_lost",
            ),
            reason="lease expired: the bed or its worker stopped answering",
        )
        .execution_options(synchronize_session=False)
    )
