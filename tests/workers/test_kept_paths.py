"""Before each run the folders APG's reset keeps hold only their baseline (issue #28).

End to end: a strong model that leaves its answer in the private files folder or in the public
files' css/ (folders reset keeps), beside a model of no skill that looks there, on the same
simulated bed: the model of no skill passes 0 times, and the leftovers are in the evidence.
Unit: the listing and the clean-up on hostile folders (a symlink out of the folder, a FIFO, a
huge file, many files), and a bed enrolled before the farm listed these folders.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from sqlalchemy import select

from apg_farm.beds import KEPT_PATHS, KeptListing, list_kept, parse_listing
from apg_farm.beds.kept_paths import FOLDERS, MAX_ENTRIES, PRIVATE
from apg_farm.contract import Outcome
from apg_farm.fixtures import simbed
from apg_farm.scheduler import submit
from apg_farm.store import Attempt, Bed, BedEvent, BedState, Execution, Phase, Store
from apg_farm.transports import LocalTransport
from apg_farm.workers import EmbeddedExecutor
from tests.support.simbeds import make_beds, spec

STRONG, ZERO = simbed.DEFAULT_MODELS[:2]
TASKS = ("dv01_view_build", "cv01_canvas_home")
TRIALS = 3
CSS = "web/sites/default/files/css"


def _listing(root: Path) -> KeptListing:
    found = parse_listing(list_kept(LocalTransport(), str(root)))
    assert isinstance(found, KeptListing), found
    return found


# --- the listing on hostile folders --------------------------------------------------------


def test_the_listing_follows_no_symlink_opens_no_fifo_and_is_bounded(tmp_path: Path) -> None:
    private = tmp_path / PRIVATE
    private.mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("outside the folder")
    (private / "link").symlink_to(outside)  # a symlink out of the folder: listed, not followed
    os.mkfifo(private / "pipe")  # opening it would block the listing forever
    with (private / "huge.bin").open("wb") as f:
        f.truncate(1 << 30)  # 1 GiB, sparse: only its first HASH_BYTES are read
    (private / "a.txt").write_text("answer")
    found = _listing(tmp_path)
    entries = found.folders[PRIVATE].entries
    assert entries[f"{PRIVATE}/link"][0] == "l"
    assert entries[f"{PRIVATE}/pipe"][0] == "p"
    assert entries[f"{PRIVATE}/huge.bin"][:2] == ["f", 1 << 30]
    assert entries[f"{PRIVATE}/a.txt"][0] == "f"
    assert not any("secret" in p for p in entries)
    assert found.folders[CSS].state == "absent"
    # A symlink in a folder's place is named as such, never entered.
    (tmp_path / CSS).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / CSS).symlink_to(outside)
    assert _listing(tmp_path).folders[CSS].state == "symlink"


def test_too_many_entries_mark_the_folder_cut(tmp_path: Path) -> None:
    private = tmp_path / PRIVATE
    private.mkdir(parents=True)
    for i in range(MAX_ENTRIES + 5):
        (private / f"f{i}").touch()
    found = _listing(tmp_path)
    assert found.folders[PRIVATE].state == "cut" and not found.folders[PRIVATE].entries
    assert set(found.folders) == set(FOLDERS)


def test_a_listing_from_meta_is_checked() -> None:
    assert KeptListing.from_meta(None) is None
    assert KeptListing.from_meta({"x": {"state": 1, "entries": {}}}) is None
    good = {PRIVATE: {"state": "dir", "entries": {f"{PRIVATE}/a": ["f", 1, "0" * 64]}}}
    listing = KeptListing.from_meta(good)
    assert listing is not None and listing.as_meta() == good


# --- end to end ----------------------------------------------------------------------------


def _sweep(
    store: Store, tmp_path: Path, where: str, *, trials: int = TRIALS
) -> tuple[dict[str, list[str]], list[Bed]]:
    skill = {STRONG: dict.fromkeys(TASKS, 1.0), ZERO: dict.fromkeys(TASKS, 0.0)}
    beds = make_beds(
        store,
        tmp_path,
        1,
        config={"skill": skill},
        faults={0: {"leave_private": {"where": where}, "copy_private": True}},
    )
    sweep_id = submit(store, spec(task_ids=TASKS, models=2, trials=trials)).sweep_id
    assert EmbeddedExecutor(store, sweep_id).run().errors == []
    outcomes: dict[str, list[str]] = {STRONG: [], ZERO: []}
    with store.read() as session:
        for attempt in session.scalars(select(Attempt).where(Attempt.sweep_id == sweep_id)):
            outcomes[attempt.model].append(attempt.outcome)
        rows = [session.get_one(Bed, b.id) for b in beds]
    return outcomes, rows


@pytest.mark.parametrize("where", ["private", "css"])
def test_a_model_of_no_skill_finds_no_answer_in_the_kept_folders(
    sqlite_only_store: Store, tmp_path: Path, where: str
) -> None:
    _no_answer_found(sqlite_only_store, tmp_path, where)


def test_a_model_of_no_skill_finds_no_answer_in_the_kept_folders_on_postgresql(
    pg_store: Store, tmp_path: Path
) -> None:
    """The same on PostgreSQL, one kept folder (both run on SQLite above)."""
    _no_answer_found(pg_store, tmp_path, "private")


def _no_answer_found(store: Store, tmp_path: Path, where: str) -> None:
    outcomes, beds = _sweep(store, tmp_path, where)
    print(f"\n{where}: {outcomes}")
    assert outcomes[STRONG] == [Outcome.PASSED] * len(TASKS) * TRIALS
    assert outcomes[ZERO] == [Outcome.FAILED] * len(TASKS) * TRIALS
    assert all(b.state != BedState.QUARANTINED for b in beds)
    # The strong model did leave answers, and the farm moved them into the evidence.
    with store.read() as session:
        events = session.scalars(select(BedEvent).where(BedEvent.kind == "leftover")).all()
        executions = session.scalars(select(Execution)).all()
        names = session.scalars(select(Phase.name)).all()
    assert any(e.evidence_dir for e in executions)
    assert events and all(where in (e.detail or "") for e in events)
    assert names.count("kept_check") == len(outcomes[STRONG]) + len(outcomes[ZERO])
    kept = [Path(e.evidence_dir) / f"leftover.{where}" for e in executions if e.evidence_dir]
    assert any(list(k.glob("apg-sim-answers/*.json")) for k in kept if k.is_dir())


@pytest.mark.parametrize("where", ["private", "css"])
def test_without_the_clean_up_the_model_of_no_skill_copies(
    sqlite_only_store: Store, tmp_path: Path, where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control: the same sweep with the clean-up switched off lets the copy through, so the
    test above would see it."""
    from apg_farm.contract import CONTINUE
    from apg_farm.workers import engine

    monkeypatch.setattr(engine, "clean_kept", lambda *_args: CONTINUE)
    outcomes, _ = _sweep(sqlite_only_store, tmp_path, where)
    print(f"\n{where}, no clean-up: {outcomes}")
    assert outcomes[ZERO].count(Outcome.PASSED) > 0


def test_a_bed_enrolled_before_kept_listings_is_recorded_at_its_first_reset(
    store: Store, tmp_path: Path
) -> None:
    beds = make_beds(store, tmp_path, 1)
    with store.session() as session:
        row = session.get_one(Bed, beds[0].id)
        recorded = dict(row.meta or {}).get(KEPT_PATHS)
        assert recorded and KeptListing.from_meta(recorded) is not None
        row.meta = {k: v for k, v in (row.meta or {}).items() if k != KEPT_PATHS}
    sweep_id = submit(store, spec(tasks=1, models=1, trials=2)).sweep_id
    assert EmbeddedExecutor(store, sweep_id).run().errors == []
    with store.read() as session:
        row = session.get_one(Bed, beds[0].id)
        assert KeptListing.from_meta((row.meta or {}).get(KEPT_PATHS)) == KeptListing.from_meta(
            recorded
        )
        events = session.scalars(select(BedEvent).where(BedEvent.kind == "kept_baseline")).all()
    assert len(events) == 1 and "not at enrolment" in (events[0].detail or "")


def _hostile(approot: Path) -> None:
    """What an agent can leave in the kept folders: a symlink out, a FIFO, a big file, many."""
    private, css = approot / PRIVATE, approot / CSS
    private.mkdir(parents=True, exist_ok=True)
    css.mkdir(parents=True, exist_ok=True)
    (private / "out").symlink_to("/etc")
    os.mkfifo(private / "pipe")
    with (private / "big.bin").open("wb") as f:
        f.truncate(64 << 20)
    many = css / "many"
    many.mkdir()
    for i in range(MAX_ENTRIES + 10):
        (many / f"c{i}.css").write_text("x")


def test_hostile_leftovers_are_moved_off_and_the_attempt_goes_on(
    store: Store, tmp_path: Path
) -> None:
    beds = make_beds(store, tmp_path, 1)
    approot = Path(beds[0].approot)
    _hostile(approot)
    sweep_id = submit(store, spec(tasks=1, models=1, trials=1)).sweep_id
    assert EmbeddedExecutor(store, sweep_id).run().errors == []
    with store.read() as session:
        bed = session.get_one(Bed, beds[0].id)
        attempt = session.scalars(select(Attempt)).one()
        execution = session.scalars(select(Execution)).one()
        events = session.scalars(select(BedEvent).where(BedEvent.kind == "leftover")).all()
    assert bed.state != BedState.QUARANTINED
    assert attempt.outcome in (Outcome.PASSED, Outcome.FAILED)
    assert os.path.exists("/etc/passwd")  # the symlink's target untouched
    assert not any((approot / PRIVATE).iterdir()) and not any((approot / CSS).iterdir())
    assert events
    meta = execution.evidence_meta or {}
    skipped = {s["type"] for s in meta.get("leftover.private", {}).get("skipped", [])}
    assert {"symlink", "fifo"} <= skipped, meta


def test_a_changed_private_baseline_file_quarantines_and_is_not_charged(
    store: Store, tmp_path: Path
) -> None:
    """A private folder whose baseline held a file: an agent changed it, the farm moves it off
    (no copy to restore) and retries elsewhere; the bed is quarantined, no model charged."""
    beds = make_beds(store, tmp_path, 2)
    approot = Path(beds[0].approot)
    from apg_farm.beds import fingerprint_escrow_set
    from apg_farm.beds.escrow import apply_escrow_record

    (approot / PRIVATE).mkdir(parents=True, exist_ok=True)
    (approot / PRIVATE / "keep.txt").write_text("baseline")
    with store.session() as session:
        row = session.get_one(Bed, beds[0].id)
        apply_escrow_record(row, fingerprint_escrow_set(row, row.escrow_set or ""))
    (approot / PRIVATE / "keep.txt").write_text("an answer")
    sweep_id = submit(store, spec(tasks=1, models=1, trials=2)).sweep_id
    assert EmbeddedExecutor(store, sweep_id).run().errors == []
    with store.read() as session:
        first = session.get_one(Bed, beds[0].id)
        outcomes = session.scalars(select(Attempt.outcome)).all()
    assert first.state == BedState.QUARANTINED
    assert all(o in (Outcome.PASSED, Outcome.FAILED) for o in outcomes), outcomes
    assert not (approot / PRIVATE / "keep.txt").exists()
