"""Claims and leases at their edges: poisoned deliveries, lost leases in a row, hand-backs,
cancelled sweeps, skewed host clocks, lock order, deadlock retries and a holder that finishes late."""

from __future__ import annotations

import threading
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from apg_farm.contract import DEFAULT_POLICY, UNFINGERPRINTED, Outcome, Verdict
from apg_farm.scheduler import submit
from apg_farm.specs import parse_sweep
from apg_farm.store import (
    Attempt,
    AttemptState,
    Bed,
    BedState,
    Execution,
    Store,
    cancel_sweep,
    claim_next,
    claims,
    renew_lease,
    requeue_expired,
    utcnow,
)
from apg_farm.workers import AttemptEngine
from apg_farm.workers.engine import BedInfo, _Attempt
from tests.support.rows import add_bed
from tests.support.simbeds import make_beds, spec

#: The retry policy's numbers these tests bound (contract/retries.py).
EXTRA_DELIVERIES = DEFAULT_POLICY.extra_deliveries
MAX_CONSECUTIVE_INFRA_ERRORS = DEFAULT_POLICY.max_consecutive_infra_errors
HAND_BACK_LIMIT = DEFAULT_POLICY.hand_back_limit


def _bed(store: Store, name: str) -> int:
    return add_bed(store, name)


def _sweep(store: Store, *, trials: int = 1, retries: int = 2) -> int:
    sweep = {"name": "s", "tasks": ["a"], "models": ["m1"], "trials": trials, "retries": retries}
    return submit(store, parse_sweep(sweep)).sweep_id


def _attempts(store: Store) -> list[Attempt]:
    with store.session() as session:
        return list(session.scalars(select(Attempt).order_by(Attempt.seq)))


def _set(store: Store, attempt_id: int, **values: object) -> None:
    with store.session() as session:
        session.execute(update(Attempt).where(Attempt.id == attempt_id).values(**values))


def test_an_attempt_delivered_past_its_bound_ends_error(store: Store) -> None:
    """An attempt delivered retries + 1 + EXTRA_DELIVERIES times is poisoned: ERROR, never claimed
    again; one delivery short of the bound it is still claimed."""
    _sweep(store, trials=2, retries=1)
    bound = 1 + 1 + EXTRA_DELIVERIES
    first, second = _attempts(store)
    _set(store, first.id, deliveries=bound)
    _set(store, second.id, deliveries=bound - 1)
    claim = claim_next(store, _bed(store, "b1"), lease_seconds=60, worker="t")
    assert claim is not None and claim.attempt_id == second.id
    poisoned, taken = _attempts(store)
    assert poisoned.state == AttemptState.DONE and poisoned.outcome == Outcome.ERROR
    assert (poisoned.reason or "").startswith(f"poisoned: delivered {bound} times")
    assert poisoned.bed_id is None and poisoned.finished_at is not None
    assert taken.state == AttemptState.RUNNING and taken.deliveries == bound


def test_lost_leases_in_a_row_quarantine_the_bed(store: Store) -> None:
    """Each lease a bed lets expire counts as a failure in a row; the third quarantines the bed."""
    _sweep(store, trials=1, retries=5)
    bed = _bed(store, "b1")
    for lost in range(1, MAX_CONSECUTIVE_INFRA_ERRORS + 1):
        with store.session() as session:
            assert session.get_one(Bed, bed).state == BedState.ACTIVE
        # The only active bed may take its own retry back (no other bed could).
        assert claim_next(store, bed, lease_seconds=-1, worker="dying") is not None
        assert requeue_expired(store) == 1
        with store.session() as session:
            assert session.get_one(Bed, bed).consecutive_errors == lost
    with store.session() as session:
        row = session.get_one(Bed, bed)
        assert row.state == BedState.QUARANTINED
        assert "3 attempts lost in a row" in (row.state_reason or "")
        lost_tries = session.scalars(select(Execution).where(Execution.result == "LOST")).all()
    assert len(lost_tries) == MAX_CONSECUTIVE_INFRA_ERRORS
    assert claim_next(store, bed, lease_seconds=60, worker="t") is None


def test_an_expired_lease_sends_the_attempt_to_another_bed(store: Store) -> None:
    """The reconciler returns an attempt whose bed stopped answering with that bed excluded: the
    dead bed's next claim takes other work while another active bed takes the attempt back."""
    _sweep(store, trials=2)
    dead, other = _bed(store, "b1"), _bed(store, "b2")
    lost = claim_next(store, dead, lease_seconds=-1, worker="dying")
    assert lost is not None
    assert requeue_expired(store) == 1
    with store.session() as session:
        row = session.get_one(Attempt, lost.attempt_id)
        assert (row.state, row.excluded_beds, row.bed_id) == (AttemptState.QUEUED, [dead], None)
    again = claim_next(store, dead, lease_seconds=60, worker="back")
    assert again is not None and again.attempt_id != lost.attempt_id
    taken = claim_next(store, other, lease_seconds=60, worker="other")
    assert taken is not None and taken.attempt_id == lost.attempt_id


def test_a_bed_with_an_escrow_set_but_no_ddev_fingerprint_takes_nothing(store: Store) -> None:
    """Escrowed files without the DDEV configuration's fingerprint: the hooks that fire on every
    `ddev` call are unjudged, so the claim quarantines the bed instead of taking an attempt; an
    escrow set whose files were never hashed is refused alike."""
    _sweep(store)
    no_ddev, no_files = _bed(store, "b1"), _bed(store, "b2")
    with store.session() as session:
        session.get_one(Bed, no_ddev).ddev_files = None
        session.get_one(Bed, no_files).escrow_files = None
    for bed in (no_ddev, no_files):
        assert claim_next(store, bed, lease_seconds=60, worker="t") is None
        with store.session() as session:
            row = session.get_one(Bed, bed)
            assert (row.state, row.state_reason) == (BedState.QUARANTINED, UNFINGERPRINTED)
    [attempt] = _attempts(store)
    assert attempt.state == AttemptState.QUEUED and attempt.deliveries == 0


def test_a_retry_handed_back_enough_times_goes_to_any_bed(store: Store) -> None:
    """A retry meant for other beds is refused by the bed that failed it, until it has been
    handed back HAND_BACK_LIMIT times (its other beds may have no worker): then that bed takes it."""
    _sweep(store)
    failed_here, _other = _bed(store, "b1"), _bed(store, "b2")
    [attempt] = _attempts(store)
    # One infrastructure failure on b1, its first dispatch, then hand-backs (one dispatch each).
    _set(store, attempt.id, excluded_beds=[failed_here], infra_failures=1)
    _set(store, attempt.id, dispatches=1 + 1 + HAND_BACK_LIMIT - 1)
    assert claim_next(store, failed_here, lease_seconds=60, worker="t") is None
    _set(store, attempt.id, dispatches=1 + 1 + HAND_BACK_LIMIT)
    claim = claim_next(store, failed_here, lease_seconds=60, worker="t")
    assert claim is not None and claim.attempt_id == attempt.id and claim.bed_id == failed_here


def test_a_lease_expiring_in_a_cancelled_sweep_ends_cancelled(store: Store) -> None:
    """A running attempt whose sweep was cancelled and whose bed then stopped answering is not
    requeued into a sweep nothing takes from: it ends CANCELLED, its try LOST."""
    sweep_id = _sweep(store, trials=2)
    bed = _bed(store, "b1")
    claim = claim_next(store, bed, lease_seconds=-1, worker="dying")
    assert claim is not None
    assert cancel_sweep(store, sweep_id) == 1  # the queued one; the running one is left to its bed
    assert requeue_expired(store) == 1
    with store.session() as session:
        row = session.get_one(Attempt, claim.attempt_id)
        execution = session.get_one(Execution, claim.execution_id)
    assert row.state == AttemptState.DONE and row.outcome == Outcome.CANCELLED
    assert "cancelled" in (row.reason or "") and execution.result == "LOST"


def test_skewed_host_clocks_do_not_expire_a_live_lease(
    pg_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On PostgreSQL leases use the server's clock: a holder whose clock is 10 minutes behind and
    a reconciler (or restarted worker) whose clock is 10 minutes ahead leave a live lease alone."""
    store = pg_store
    _sweep(store, trials=2)
    bed = _bed(store, "b1")
    real = utcnow
    monkeypatch.setattr(claims, "utcnow", lambda: real() - timedelta(minutes=10))
    claim = claim_next(store, bed, lease_seconds=60, worker="behind")
    assert claim is not None
    assert renew_lease(store, claim, lease_seconds=60)
    monkeypatch.setattr(claims, "utcnow", lambda: real() + timedelta(minutes=10))
    assert requeue_expired(store) == 0
    # The same bed's next claim sees its live lease: busy, nothing given back.
    assert claim_next(store, bed, lease_seconds=60, worker="ahead") is None
    with store.session() as session:
        row = session.get_one(Attempt, claim.attempt_id)
        assert row.state == AttemptState.RUNNING and row.bed_id == bed
        lease_left = session.scalar(
            select(sa.func.extract("epoch", Attempt.lease_expires_at - sa.func.now())).where(
                Attempt.id == claim.attempt_id
            )
        )
    assert lease_left is not None and 50 < float(lease_left) <= 60


def _waiting_for_a_lock(store: Store, deadline: float = 10.0) -> None:
    end = time.monotonic() + deadline
    with store.engine.connect() as conn:
        while time.monotonic() < end:
            if conn.exec_driver_sql("SELECT count(*) FROM pg_locks WHERE NOT granted").scalar():
                return
            conn.rollback()
            time.sleep(0.02)
    pytest.fail("nothing waited for the bed's lock")


def test_requeue_takes_the_bed_lock_before_the_attempt(pg_store: Store) -> None:
    """The reconciler locks an expired attempt's bed before the attempt, as a claimer and a
    finishing holder do: while it waits for the bed, the attempt row is still free."""
    store = pg_store
    _sweep(store)
    bed = _bed(store, "b1")
    claim = claim_next(store, bed, lease_seconds=-1, worker="dying")
    assert claim is not None
    result: list[int] = []
    with store.engine.connect() as holder:
        holder.execute(select(Bed.id).where(Bed.id == bed).with_for_update())
        reconciler = threading.Thread(target=lambda: result.append(requeue_expired(store)))
        reconciler.start()
        _waiting_for_a_lock(store)
        with store.engine.connect() as probe:
            free = probe.execute(
                select(Attempt.id)
                .where(Attempt.id == claim.attempt_id)
                .with_for_update(skip_locked=True)
            ).all()
            probe.rollback()
        holder.rollback()
    reconciler.join(timeout=30)
    assert free == [(claim.attempt_id,)], (
        "the reconciler held the attempt while waiting for its bed"
    )
    assert result == [1]


def test_a_holder_recording_its_end_takes_the_bed_lock_before_the_attempt(
    pg_store: Store, tmp_path: Path
) -> None:
    """The engine recording an attempt's end locks its bed before the attempt, as the reconciler
    does: while it waits for the bed, the attempt row is still free (no deadlock between them)."""
    store = pg_store
    [bed] = make_beds(store, tmp_path, 1)
    submit(store, spec(tasks=1, models=1, trials=1))
    engine = AttemptEngine(store, bed.name, worker="w")
    claim = claim_next(store, bed.id, lease_seconds=60, worker="w")
    assert claim is not None
    with store.session() as session:
        row = session.get_one(Bed, bed.id)
        row.consecutive_errors = 1  # a final verdict resets it: recording the end writes the bed
        info = BedInfo.of(row)
    verdict = Verdict("final", "graded", outcome=Outcome.PASSED)
    reports: list[object] = []
    finisher = threading.Thread(
        target=lambda: reports.append(engine._finish(claim, _Attempt(engine, info, claim), verdict))
    )
    with store.engine.connect() as holder:
        holder.execute(select(Bed.id).where(Bed.id == bed.id).with_for_update())
        finisher.start()
        _waiting_for_a_lock(store)
        with store.engine.connect() as probe:
            free = probe.execute(
                select(Attempt.id)
                .where(Attempt.id == claim.attempt_id)
                .with_for_update(skip_locked=True)
            ).all()
            probe.rollback()
        holder.rollback()
    finisher.join(timeout=30)
    assert free == [(claim.attempt_id,)], "the holder held the attempt while waiting for its bed"
    assert [getattr(r, "outcome", None) for r in reports] == [Outcome.PASSED]
    with store.session() as session:
        assert session.get_one(Bed, bed.id).consecutive_errors == 0


def test_a_deadlock_is_retried_and_the_work_completes(pg_store: Store) -> None:
    """Two transactions lock two beds in opposite orders: PostgreSQL aborts one (40P01),
    Store.retrying runs it again, and both pieces of work end committed."""
    store = pg_store
    first, second = _bed(store, "b1"), _bed(store, "b2")
    both_hold_one = threading.Barrier(2)
    runs: Counter[str] = Counter()
    errors: list[BaseException] = []

    def touch(session: Session, bed: int) -> None:
        session.execute(
            update(Bed).where(Bed.id == bed).values(consecutive_errors=Bed.consecutive_errors + 1)
        )

    def work(name: str, one: int, other: int) -> None:
        def once() -> None:
            runs[name] += 1
            with store.session() as session:
                touch(session, one)
                if runs[name] == 1:
                    both_hold_one.wait(timeout=10)
                touch(session, other)

        try:
            store.retrying(once)
        except BaseException as error:
            errors.append(error)

    threads = [
        threading.Thread(target=work, args=("a", first, second)),
        threading.Thread(target=work, args=("b", second, first)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == []
    assert sum(runs.values()) == 3, "exactly one of the two was the deadlock's victim and ran again"
    with store.session() as session:
        counts = [session.get_one(Bed, b).consecutive_errors for b in (first, second)]
    assert counts == [2, 2]


def test_a_late_holder_keeps_its_record_on_the_lost_execution(store: Store, tmp_path: Path) -> None:
    """The reconciler takes the attempt back while its bed is still running it; the bed finishes
    later: its run id, score and envelope stay on its (LOST) execution, and the attempt is left
    as the reconciler put it."""
    make_beds(store, tmp_path, 1, config={"time_scale": 300})
    sweep_id = submit(store, spec(tasks=1, models=1, trials=1)).sweep_id
    # A long lease: the holder's renewal (every 20 s) does not notice before the attempt ends.
    engine = AttemptEngine(store, "bed0", worker="slow", lease_seconds=60)
    reports: list[object] = []
    holder = threading.Thread(target=lambda: reports.append(engine.run_next(sweep_id=sweep_id)))
    holder.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with store.session() as session:
            if session.scalar(select(Execution.id).join(Execution.phases).limit(1)):
                break
        time.sleep(0.02)
    with store.session() as session:
        session.execute(update(Attempt).values(lease_expires_at=Attempt.created_at))
    assert requeue_expired(store) == 1
    holder.join(timeout=60)
    [report] = reports
    assert report is not None and getattr(report, "lost", False)
    with store.session() as session:
        attempt = session.scalars(select(Attempt)).one()
        execution = session.scalars(select(Execution)).one()
    assert attempt.state == AttemptState.QUEUED and attempt.outcome is None
    assert execution.result == "LOST" and execution.finished_at is not None
    assert execution.run_id is not None and execution.run_id == getattr(report, "run_id", None)
    assert execution.score is not None and execution.max_score is not None
    assert execution.envelope and execution.envelope_sha256
    assert "lease expired" in (execution.reason or "")
    assert "finished later" in (execution.reason or "")
