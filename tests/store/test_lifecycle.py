"""The lifecycle's own preconditions (#19): each function refuses what its state forbids, whoever
calls it, with a typed error naming the fix, and changes nothing when it refuses."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import func, select

from apg_farm.contract import Outcome, RetryPolicy, Why
from apg_farm.scheduler import submit
from apg_farm.store import (
    Attempt,
    AttemptState,
    Bed,
    BedEvent,
    BedState,
    NotReleasable,
    Refusal,
    SealedSweep,
    Store,
    Sweep,
    SweepState,
    cancel_sweep,
    claim,
    claim_next,
    release_bed,
    retry_attempts,
    utcnow,
)
from tests.support.simbeds import make_beds, spec


def _set_bed(store: Store, bed_id: int, state: BedState, reason: str | None = None) -> None:
    with store.session() as session:
        row = session.get_one(Bed, bed_id)
        row.state, row.state_reason = state, reason


def _events(store: Store, bed_id: int) -> list[str]:
    with store.read() as session:
        return list(session.scalars(select(BedEvent.kind).where(BedEvent.bed_id == bed_id)))


def test_a_removed_bed_is_not_released(store: Store, tmp_path: Path) -> None:
    (bed,) = make_beds(store, tmp_path, 1)
    _set_bed(store, bed.id, BedState.REMOVED, "not in beds.toml")
    before = _events(store, bed.id)
    with pytest.raises(NotReleasable) as refused:
        release_bed(store, bed.name)
    assert refused.value.fix and "apg-farm beds apply" in refused.value.fix
    with store.read() as session:
        assert session.get_one(Bed, bed.id).state == BedState.REMOVED
    assert _events(store, bed.id) == before


def test_a_quarantined_bed_is_released_and_an_active_one_left_alone(
    store: Store, tmp_path: Path
) -> None:
    (bed,) = make_beds(store, tmp_path, 1)
    _set_bed(store, bed.id, BedState.QUARANTINED, "reset failed")
    assert release_bed(store, bed.name).state == BedState.ACTIVE
    released = _events(store, bed.id)
    assert released[-1] == "released"
    release_bed(store, bed.name)  # already active: no second event
    assert _events(store, bed.id) == released


def _finished_sweep(store: Store, tmp_path: Path) -> int:
    make_beds(store, tmp_path, 1)
    sweep_id = submit(store, spec(tasks=1, models=1, trials=2)).sweep_id
    with store.session() as session:
        for attempt in session.scalars(select(Attempt).where(Attempt.sweep_id == sweep_id)):
            attempt.state, attempt.outcome, attempt.finished_at = (
                AttemptState.DONE,
                Outcome.ERROR,
                utcnow(),
            )
    return sweep_id


def _seal(store: Store, sweep_id: int, *, cancelled: bool = False) -> None:
    with store.session() as session:
        sweep = session.get_one(Sweep, sweep_id)
        sweep.sealed_at = utcnow()
        if cancelled:
            sweep.state = SweepState.CANCELLED


def _queued(store: Store, sweep_id: int) -> int:
    with store.read() as session:
        return int(
            session.scalar(
                select(func.count())
                .select_from(Attempt)
                .where(Attempt.sweep_id == sweep_id, Attempt.state == AttemptState.QUEUED)
            )
            or 0
        )


@pytest.mark.parametrize("cancelled", [False, True], ids=["open", "cancelled"])
def test_a_sealed_sweep_is_not_retried(store: Store, tmp_path: Path, cancelled: bool) -> None:
    """Whatever its state: a cancelled sealed sweep is as closed as an open one."""
    sweep_id = _finished_sweep(store, tmp_path)
    _seal(store, sweep_id, cancelled=cancelled)
    with pytest.raises(SealedSweep):
        retry_attempts(store, sweep_id, {Outcome.ERROR})
    assert _queued(store, sweep_id) == 0


def test_a_sealed_sweep_is_not_cancelled(store: Store, tmp_path: Path) -> None:
    make_beds(store, tmp_path, 1)
    sweep_id = submit(store, spec(tasks=1, models=1, trials=2)).sweep_id
    _seal(store, sweep_id)
    with pytest.raises(SealedSweep):
        cancel_sweep(store, sweep_id)
    with store.read() as session:
        assert session.get_one(Sweep, sweep_id).state == SweepState.OPEN
    assert _queued(store, sweep_id) == 2


def test_an_unsealed_sweep_is_retried(store: Store, tmp_path: Path) -> None:
    """The control: the same retry goes through when nothing is sealed."""
    sweep_id = _finished_sweep(store, tmp_path)
    assert retry_attempts(store, sweep_id, {Outcome.ERROR}) == 2
    assert _queued(store, sweep_id) == 2


@pytest.mark.parametrize("state", [BedState.DRAINING, BedState.QUARANTINED, BedState.REMOVED])
def test_a_bed_that_is_not_active_takes_nothing(
    store: Store, tmp_path: Path, state: BedState
) -> None:
    (bed,) = make_beds(store, tmp_path, 1)
    sweep_id = submit(store, spec(tasks=1, models=1, trials=1)).sweep_id
    _set_bed(store, bed.id, state, "for the test")
    assert claim_next(store, bed.id, lease_seconds=60, worker="w") is None
    assert _queued(store, sweep_id) == 1
    _set_bed(store, bed.id, BedState.ACTIVE)
    assert claim_next(store, bed.id, lease_seconds=60, worker="w") is not None


def test_a_bed_holding_a_live_lease_says_so(tmp_path: Path) -> None:
    """The claim's refusal for a bed whose lease still runs (a predecessor that died): bed busy,
    with the seconds left, which a worker waits out instead of handing the message back."""
    store = Store(f"sqlite:///{tmp_path / 'farm.db'}")
    (bed,) = make_beds(store, tmp_path, 1)
    sweep_id = submit(store, spec(tasks=1, models=1, trials=2)).sweep_id
    held = claim(store, bed.id, lease_seconds=60, worker="dead")
    assert not isinstance(held, Refusal)
    with store.read() as session:
        other = session.scalars(
            select(Attempt.id).where(Attempt.sweep_id == sweep_id, Attempt.id != held.attempt_id)
        ).one()
    refused = claim(store, bed.id, lease_seconds=60, worker="heir", attempt_id=other)
    assert isinstance(refused, Refusal) and refused.why == Why.BED_BUSY, refused
    assert refused.retry_in is not None and 50 < refused.retry_in <= 60
    store.dispose()


def test_provider_trouble_leaves_the_beds_failures_in_a_row_alone(tmp_path: Path) -> None:
    """rules.settle on its own: a provider failure is neither the bed's nor the model's, so the
    bed's count towards quarantine stays where it was (two more real failures would otherwise
    quarantine it early) and the attempt waits out a back-off, this bed not excluded."""
    from apg_farm.contract import Verdict
    from apg_farm.store.rules import settle

    store = Store(f"sqlite:///{tmp_path / 'farm.db'}")
    row = Attempt(provider_failures=0, infra_failures=0, excluded_beds=[])
    bed = Bed(id=7, consecutive_errors=2, state=BedState.ACTIVE)
    verdict = Verdict("retry", "429 from the provider", provider_trouble="rate_limited")
    backoff = RetryPolicy(provider_backoff=1.0, provider_backoff_max=2.0)
    assert settle(row, bed, verdict, retries=2, store=store, policy=backoff) == (None, None)
    assert bed.consecutive_errors == 2
    assert row.state == AttemptState.QUEUED and row.provider_failures == 1
    assert row.infra_failures == 0 and row.excluded_beds == []
    store.dispose()
