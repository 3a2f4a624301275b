"""The rules applied when an execution ends, each one small and named, all inside the one
transaction of store/lifecycle.py that records the verdict (the caller holds the bed's lock, then
the attempt's). None of them opens a session or commits.

- `settle`: the retry decision (final outcome, requeue elsewhere, or a provider back-off);
- `quarantine`: a bed is taken out for every reason asked, none dropped;
- `pace_model`: the model's breaker and its believed outage (store/pacing.py);
- `to_the_back`: an attempt the provider failed goes behind its pool's queue;
- `finish_draining`: a draining bed that holds nothing any more is removed;
- `count_lost_try`: a bed whose claims keep expiring is quarantined;
- `cancel_queued`: a sweep whose comparison was decided (store/stopping.py) cancels its queue;
- `finish_if_final`: a sweep whose last attempt became final is finished; `reopen_sweep` undoes it.
"""

from __future__ import annotations

from sqlalchemy import exists, func, select, update
from sqlalchemy.orm import Session

from apg_farm.contract import (
    COUNTED,
    DEFAULT_POLICY,
    Outcome,
    RetryPolicy,
    Verdict,
    counts_against_bed,
    out_of_retries,
)
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
from apg_farm.store.outages import provider_answered
from apg_farm.store.pacing import backoff, close, trip


def settle(
    row: Attempt,
    bed: Bed,
    verdict: Verdict,
    *,
    retries: int,
    store: Store,
    policy: RetryPolicy = DEFAULT_POLICY,
) -> tuple[Outcome | None, str | None]:
    """Apply a verdict to the attempt and the bed: (final outcome or None if requeued, the
    quarantine reason when the bed failed too often in a row). What each decision is comes from
    the retry policy (contract/retries.py); this writes it to the rows."""
    row.bed_id = None
    row.lease_expires_at = None
    if verdict.provider_trouble is not None:
        # The provider failed, not the bed nor the model: the bed's count does not move, the
        # attempt may go back to this very bed, and it waits out a back-off.
        row.provider_failures += 1
        wait = backoff(row.provider_failures, *policy.backoff)
        # On the store's clock, the one the claim compares it with.
        row.not_before = store.now_plus(wait)
        row.state = AttemptState.QUEUED
        row.reason = f"retrying after provider trouble: {verdict.reason}"
        return None, None
    if verdict.action != "retry":
        bed.consecutive_errors = 0
        assert verdict.outcome is not None
        return done(row, verdict.outcome, verdict.reason), None
    row.infra_failures += 1
    if counts_against_bed(verdict):
        bed.consecutive_errors += 1
    in_a_row = policy.quarantine_in_a_row(bed.consecutive_errors, verdict.reason)
    outcome = out_of_retries(verdict, row.infra_failures, retries)
    if outcome is not None:
        return done(row, outcome, f"{verdict.reason} (after {row.infra_failures} tries)"), in_a_row
    row.state = AttemptState.QUEUED
    row.excluded_beds = sorted({*(row.excluded_beds or []), bed.id})
    row.reason = f"retrying: {verdict.reason}"
    return None, in_a_row


def done(row: Attempt, outcome: Outcome, reason: str) -> Outcome:
    row.state = AttemptState.DONE
    row.outcome = outcome
    row.reason = reason
    row.finished_at = utcnow()
    return outcome


def quarantine(session: Session, bed: Bed, reasons: list[str]) -> None:
    """Quarantine the bed for every reason given; none is ever dropped.

    A draining bed is quarantined too (a human must look before it is removed), and a bed already
    quarantined gains the new reasons. A removed bed stays removed.
    """
    new = [r for r in dict.fromkeys(reasons) if r not in (bed.state_reason or "")]
    if not new or bed.state == BedState.REMOVED:
        return
    if bed.state == BedState.QUARANTINED and bed.state_reason:
        bed.state_reason = "; ".join([bed.state_reason, *new])
    else:
        bed.state = BedState.QUARANTINED
        bed.state_reason = "; ".join(new)
    session.add(BedEvent(bed_id=bed.id, kind="quarantined", detail="; ".join(new)))


def pace_model(
    store: Store,
    session: Session,
    *,
    model: str,
    probe: bool,
    verdict: Verdict,
    execution: Execution,
    policy: RetryPolicy = DEFAULT_POLICY,
) -> None:
    """Provider trouble opens the model's breaker; a probe that ran without it closes it; a
    run judged without trouble ends the model's believed outage (pacing.believe_outage), and one
    the provider answered ends its provider's (store/outages.py)."""
    if verdict.provider_trouble is not None:
        trip(
            store,
            session,
            model,
            trouble=verdict.provider_trouble,
            detail=verdict.reason,
            base=policy.backoff[0],
            ceiling=policy.backoff[1],
            probe=probe,
        )
        return
    # Not the record's word (an agent can write an outage into a run it passed): a run judged
    # without believed trouble ends its model's outage; one the provider answered (no error
    # record, or passed) ends its provider's other models' too (store/outages.py). First: it
    # locks the provider's gates in model order, this model's included, before close does.
    if execution.agent_started and verdict.outcome in COUNTED:
        answered = execution.provider_trouble is None or verdict.outcome == Outcome.PASSED
        provider_answered(store, session, model, execution, answered=answered)
    if probe and verdict.action == "final":
        close(store, session, model, execution.started_at)


def to_the_back(session: Session, row: Attempt) -> None:
    """Behind every queued attempt of its pool: the breaker's next probe is another attempt, so
    an outage spreads its provider failures over the queue instead of using up one attempt's."""
    last = session.scalar(
        select(func.max(Attempt.seq)).where(
            Attempt.pool == row.pool, Attempt.state == AttemptState.QUEUED, Attempt.id != row.id
        )
    )
    if last is not None and last >= row.seq:
        row.seq = last + 1


def holds_attempt(session: Session, bed_id: int) -> bool:
    """True while an attempt is running on this bed."""
    held = session.scalar(
        select(Attempt.id)
        .where(Attempt.bed_id == bed_id, Attempt.state == AttemptState.RUNNING)
        .limit(1)
    )
    return held is not None


def finish_draining(session: Session, bed: Bed) -> bool:
    """A draining bed that holds nothing any more is removed; True when that happened."""
    if bed.state != BedState.DRAINING or holds_attempt(session, bed.id):
        return False
    bed.state = BedState.REMOVED
    bed.state_reason = "removed from the inventory; drained"
    session.add(BedEvent(bed_id=bed.id, kind="removed", detail="drained: holds no attempt"))
    return True


def count_lost_try(session: Session, bed_id: int, policy: RetryPolicy = DEFAULT_POLICY) -> None:
    """A claim of this bed expired (its worker or link died): one more failure in a row."""
    bed = session.get(Bed, bed_id)
    if bed is None:
        return
    bed.consecutive_errors += 1
    # Its worker is gone: the phase it last started runs no more (or nobody watches it).
    bed.phase, bed.phase_started_at = None, None
    lost = policy.lost_in_a_row(bed.consecutive_errors)
    if bed.state == BedState.ACTIVE and lost is not None:
        bed.state = BedState.QUARANTINED
        bed.state_reason = lost
        session.add(BedEvent(bed_id=bed.id, kind="quarantined", detail=bed.state_reason))


def cancel_queued(store: Store, session: Session, sweep_id: int, reason: str) -> int:
    """Every queued attempt of the sweep ends CANCELLED for `reason` (their count). One a
    claimer is taking this instant is skipped, not waited for: it runs, or the claim cancels it."""
    queued = select(Attempt.id).where(
        Attempt.sweep_id == sweep_id, Attempt.state == AttemptState.QUEUED
    )
    if not store.is_sqlite:
        queued = queued.with_for_update(skip_locked=True)
    ids = list(session.scalars(queued))
    if not ids:
        return 0
    return rowcount(
        session.execute(
            update(Attempt)
            .where(Attempt.id.in_(ids), Attempt.state == AttemptState.QUEUED)
            .values(
                state=AttemptState.DONE,
                outcome=Outcome.CANCELLED,
                reason=reason,
                finished_at=utcnow(),
                not_before=None,
            )
            .execution_options(synchronize_session=False)
        )
    )


#: The attempt states that are not final: a sweep with one of these is still open.
UNFINISHED = (AttemptState.QUEUED.value, AttemptState.RUNNING.value)


def finish_if_final(store: Store, session: Session, sweep_id: int) -> bool:
    """An open sweep none of whose attempts is queued or running any more is finished; True
    when that happened. Called in the transaction that made an attempt final, after its
    attempt rows (the lock order): the sweep row is locked first, so of two transactions
    ending a sweep's last two attempts the second, once the first committed, sees both final."""
    locked = select(Sweep.state).where(Sweep.id == sweep_id)
    state = session.scalar(locked if store.is_sqlite else locked.with_for_update())
    if state != SweepState.OPEN:
        return False
    # A fresh statement after the lock: on PostgreSQL it sees what committed while it waited.
    pending = session.scalar(
        select(exists().where(Attempt.sweep_id == sweep_id, Attempt.state.in_(UNFINISHED)))
    )
    if pending:
        return False
    session.get_one(Sweep, sweep_id).state = SweepState.FINISHED
    return True


def reopen_sweep(sweep: Sweep) -> None:
    """A finished sweep that was given attempts to run again (a re-submit that adds some, a
    retry, a harness's new sample) is open: claims take its attempts again."""
    if sweep.state == SweepState.FINISHED:
        sweep.state = SweepState.OPEN
