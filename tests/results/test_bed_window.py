"""A report's bed table as of its sweep's window (#31, part 5): a quarantine of a later sweep is
not counted, and the state shown is the one the sweep left the bed in, today's beside it. Before
the fix the demo's clean report listed three beds quarantined once, by a later sweep."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from apg_farm.results import analyse
from apg_farm.store import Bed, BedEvent, BedState, Store, Sweep, release_bed, utcnow
from tests.results.test_second_chance import _attempt, _bed, _sweep, graded


def _sweep_on(store: Store, name: str, beds: list[str]) -> int:
    """A finished sweep: one PASSED attempt on each bed, its executions finished at once."""
    with store.session() as session:
        ids = {}
        for bed in beds:
            found = session.query(Bed).filter_by(name=bed).one_or_none()
            ids[bed] = found.id if found else _bed(session, bed)
        sid = _sweep(session, name, ["t"], ["m"])
        for trial, bed in enumerate(beds, 1):
            _attempt(session, sid, ids[bed], "t", "m", trial, "PASSED", [graded("PASSED")])
    return sid


def _event(store: Store, bed: str, kind: str, later: timedelta, state: str, reason: str) -> None:
    """An event `later` after now, and the bed left in `state` by it."""
    with store.session() as session:
        row = session.query(Bed).filter_by(name=bed).one()
        row.state, row.state_reason = state, reason
        session.add(BedEvent(bed_id=row.id, kind=kind, detail=reason, at=utcnow() + later))


def _beds(store: Store, sweep_id: int) -> dict[str, dict[str, Any]]:
    with store.read() as session:
        sweep = session.get_one(Sweep, sweep_id)
        session.expunge(sweep)
    return {row["bed"]: row for row in analyse(store, sweep)["beds"]}


def test_a_later_quarantine_is_not_the_sweeps(store: Store) -> None:
    sid = _sweep_on(store, "clean", ["b1", "b2"])
    # After the sweep ended: b1 quarantined by a later sweep.
    _event(store, "b1", "quarantined", timedelta(hours=1), BedState.QUARANTINED, "later: reset")
    beds = _beds(store, sid)
    assert beds["b1"]["quarantined_during_sweep"] == 0
    assert (beds["b1"]["state"], beds["b1"]["reason"]) == ("active", None)
    assert beds["b1"]["state_now"] == "quarantined"
    assert (beds["b2"]["state"], beds["b2"]["state_now"]) == ("active", "active")


def test_a_quarantine_inside_the_window_is_counted_and_kept_after_a_release(store: Store) -> None:
    # b1 quarantined while the sweep ran (before its executions finished), released afterwards.
    with store.session() as session:
        bed_id = _bed(session, "b1")
        session.add(
            BedEvent(
                bed_id=bed_id,
                kind="quarantined",
                detail="reset failed",
                at=utcnow() - timedelta(seconds=1),
            )
        )
    sid = _sweep_on(store, "hit", ["b1"])
    with store.session() as session:
        # The sweep was created before the quarantine: move its creation back.
        session.get_one(Sweep, sid).created_at = utcnow() - timedelta(minutes=5)
        session.get_one(Bed, bed_id).state = BedState.QUARANTINED
    release_bed(store, "b1", note="looked at it")
    with store.session() as session:
        # The release came after the sweep's end.
        event = session.query(BedEvent).filter_by(kind="released").one()
        event.at = utcnow() + timedelta(hours=1)
    beds = _beds(store, sid)
    assert beds["b1"]["quarantined_during_sweep"] == 1
    assert (beds["b1"]["state"], beds["b1"]["reason"]) == ("quarantined", "reset failed")
    assert beds["b1"]["state_now"] == "active"
