"""The judging of pinned dataset hashes (contract/pins.py), the pins' store (store/pins.py) and
the engine's grade at baseline that makes them (workers/pinning.py)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from sqlalchemy import select

from apg_farm.contract import (
    CONTINUE,
    DatasetRead,
    Grade,
    Outcome,
    Verdict,
    judge_pinned,
    read_of,
    skipped_read,
)
from apg_farm.fixtures import simbed
from apg_farm.scheduler import submit
from apg_farm.store import (
    PIN_BASELINE_GRADE,
    Attempt,
    DatasetPin,
    Execution,
    Phase,
    PinScope,
    Store,
    find_pin,
    record_pin,
    release_bed,
)
from apg_farm.workers import AttemptEngine, run_canary
from tests.support.simbeds import TEST_TIME_SCALE, make_beds, spec

PINNED_DATASET = "a" * 64
PINNED_TASK = "b" * 64
PIN = DatasetRead(PINNED_DATASET, PINNED_TASK, "web/modules/custom/x/datasets/d.json")
SHIPPED_SHA = hashlib.sha256(
    (simbed.PACKAGE_DIR / "droost_build_tasks.json").read_bytes()
).hexdigest()


def _grade(passed: bool = True, **provenance: str) -> Grade:
    return Grade(
        score=5.0 if passed else 0.0,
        min_score=0.0,
        max_score=5.0,
        passed=passed,
        evaluation_id="ai_proving_ground/t/m/r",
        run_id="r",
        model_name="m",
        model_id="org/m",
        task="t",
        reasons=(),
        provenance=dict(provenance),
    )


PASSED = Verdict("final", "score 5/5", outcome=Outcome.PASSED)


# --- the judging ---------------------------------------------------------------------------


def test_the_pinned_hashes_leave_the_verdict_as_it_is() -> None:
    grade = _grade(dataset_sha256=PINNED_DATASET, task_sha256=PINNED_TASK)
    assert judge_pinned(PASSED, pin=PIN, grade=grade) is PASSED


@pytest.mark.parametrize(
    ("dataset", "task"),
    [("c" * 64, PINNED_TASK), (PINNED_DATASET, "d" * 64), ("c" * 64, "d" * 64)],
    ids=["dataset-edited", "task-entry-edited", "both"],
)
def test_other_hashes_than_the_pin_are_tampered_with_both_as_evidence(
    dataset: str, task: str
) -> None:
    verdict = judge_pinned(PASSED, pin=PIN, grade=_grade(dataset_sha256=dataset, task_sha256=task))
    assert verdict.action == "final" and verdict.outcome == Outcome.TAMPERED
    for text in (verdict.reason, verdict.quarantine or ""):
        assert PINNED_DATASET in text and PINNED_TASK in text
        assert dataset in text and task in text
    assert "it would have said PASSED" in verdict.reason
    assert (verdict.quarantine or "").startswith("dataset changed during an attempt")


@pytest.mark.parametrize("passed", [True, False])
def test_an_envelope_that_omits_the_hashes_where_the_pin_has_them_is_tampered(passed: bool) -> None:
    """APG omits them only when the dataset could not be resolved; at baseline it could."""
    grade = _grade(passed, dataset_provenance="unresolved: task t not in d.json")
    before = PASSED if passed else Verdict("final", "score 0/5", outcome=Outcome.FAILED)
    verdict = judge_pinned(before, pin=PIN, grade=grade)
    assert verdict.outcome == Outcome.TAMPERED
    assert "unresolved: task t not in d.json" in verdict.reason and PINNED_DATASET in verdict.reason
    assert verdict.quarantine is not None
    # Without even the note: the same.
    assert judge_pinned(PASSED, pin=PIN, grade=_grade()).outcome == Outcome.TAMPERED


def test_unresolved_provenance_at_baseline_and_after_leaves_the_verdict() -> None:
    """Nothing to compare on either side: the verdict stands (the pin records why)."""
    pin = read_of(_grade(False, dataset_provenance="unresolved: no dataset file"))
    assert pin.hashes() == (None, None) and pin.note == "unresolved: no dataset file"
    grade = _grade(dataset_provenance="unresolved: no dataset file")
    assert judge_pinned(PASSED, pin=pin, grade=grade) is PASSED
    # ... but hashes after the run where the baseline named none: the grade reads something new.
    named = _grade(dataset_sha256="c" * 64, task_sha256="d" * 64)
    assert judge_pinned(PASSED, pin=pin, grade=named).outcome == Outcome.TAMPERED


def test_a_task_skipped_at_baseline_that_grades_after_the_run_is_tampered() -> None:
    """An agent that wrote a droost spec into a task that had none."""
    grade = _grade(dataset_sha256=PINNED_DATASET, task_sha256="e" * 64)
    verdict = judge_pinned(PASSED, pin=skipped_read(), grade=grade)
    assert verdict.outcome == Outcome.TAMPERED and "skipped at baseline" in verdict.reason


def test_no_pin_yet_or_no_envelope_leaves_the_verdict() -> None:
    grade = _grade(dataset_sha256="c" * 64, task_sha256="d" * 64)
    assert judge_pinned(PASSED, pin=None, grade=grade) is PASSED
    for verdict in (
        CONTINUE,
        Verdict("retry", "grade could not run (exit 2)"),
        Verdict("final", "task has no droost spec", outcome=Outcome.SKIPPED),
        Verdict("final", "envelope rejected", outcome=Outcome.INVALID),
        Verdict("final", "grader swapped", outcome=Outcome.TAMPERED),
    ):
        assert judge_pinned(verdict, pin=PIN, grade=grade) is verdict


def test_hostile_hashes_are_bounded_in_the_evidence() -> None:
    grade = _grade(dataset_sha256="x" * 1_000_000 + "\x00", task_sha256=PINNED_TASK)
    verdict = judge_pinned(PASSED, pin=PIN, grade=grade)
    assert verdict.outcome == Outcome.TAMPERED and len(verdict.reason) < 2000
    assert "\x00" not in verdict.reason


# --- the store -------------------------------------------------------------------------------


def test_a_pin_is_written_once_per_scope_and_the_first_stands(store: Store) -> None:
    scope = PinScope.of("k" * 16, "e" * 64, "dv01", "droost_build_tasks")
    assert scope is not None and find_pin(store, scope) is None
    first = record_pin(store, scope, PIN, source=PIN_BASELINE_GRADE, bed_id=1)
    assert first == PIN
    other = DatasetRead("c" * 64, "d" * 64, None)
    assert record_pin(store, scope, other, source="canary", bed_id=2) == PIN
    assert find_pin(store, scope) == PIN
    # Another escrow set (another bed, or the same re-escrowed), task or dataset: its own pin.
    for changed in (
        PinScope.of("k" * 16, "f" * 64, "dv01", "droost_build_tasks"),
        PinScope.of("k" * 16, "e" * 64, "cv01", "droost_build_tasks"),
        PinScope.of("k" * 16, "e" * 64, "dv01", None),
    ):
        assert changed is not None and find_pin(store, changed) is None
    assert PinScope.of(None, None, "dv01", None) is None
    skipped = PinScope.of(None, "e" * 64, "nx01", None)
    assert skipped is not None
    assert record_pin(store, skipped, skipped_read(), source="canary", bed_id=1) == skipped_read()
    with store.read() as session:
        assert session.scalar(select(DatasetPin.note).where(DatasetPin.task == "nx01"))


# --- the engine's grade at baseline ------------------------------------------------------------


def _run(store: Store, tmp_path: Path, faults: dict[str, object] | None, trials: int = 2):  # type: ignore[no-untyped-def]
    [bed] = make_beds(store, tmp_path, 1, faults={0: faults} if faults else None)
    sweep_id = submit(store, spec(tasks=1, models=1, trials=trials)).sweep_id
    engine = AttemptEngine(store, bed.name, worker="w")
    reports = [engine.run_next(sweep_id=sweep_id) for _ in range(trials)]
    with store.read() as session:
        phases = [
            (p.execution_id, p.name) for p in session.scalars(select(Phase).order_by(Phase.id))
        ]
        pins = session.scalars(select(DatasetPin)).all()
        for pin in pins:
            session.expunge(pin)
        executions = session.scalars(select(Execution).order_by(Execution.id)).all()
        reasons = [e.reason or "" for e in executions]
    return reports, phases, pins, reasons


def test_the_first_attempt_pins_its_task_before_the_run_and_the_next_reads_the_pin(
    store: Store, tmp_path: Path
) -> None:
    reports, phases, pins, _ = _run(store, tmp_path, None)
    assert all(r is not None and r.outcome in (Outcome.PASSED, Outcome.FAILED) for r in reports)
    first, second = sorted({e for e, _ in phases})
    names = [n for e, n in phases if e == first]
    assert names.index("baseline_diff") < names.index("grade_pin") < names.index("run")
    assert "grade_pin" not in [n for e, n in phases if e == second]
    [pin] = pins
    assert pin.source == PIN_BASELINE_GRADE and pin.execution_id == first
    assert pin.dataset_sha256 == SHIPPED_SHA and pin.task_sha256 and pin.note is None
    assert pin.dataset_path == simbed.DATASET_REL


@pytest.mark.parametrize(
    "fault",
    [
        {"grade_error": {"times": 1}},
        {"malformed_envelope": {"times": 1}},
        {"huge_output": {"times": 1, "bytes": 4 << 20}},
    ],
    ids=["grade-cannot-run", "malformed-envelope", "huge-output"],
)
def test_a_pinning_grade_that_fails_pins_nothing_and_the_attempt_goes_on_unpinned(
    store: Store, tmp_path: Path, fault: dict[str, object]
) -> None:
    """Before any agent: not the model's; the attempt is graded as usual, said unpinned, and the
    next attempt pins (the fault fired once). The bed stays in service."""
    reports, phases, pins, reasons = _run(store, tmp_path, fault)
    assert all(r is not None and r.outcome in (Outcome.PASSED, Outcome.FAILED) for r in reports)
    assert "not pinned: the grade at baseline gave no envelope to pin" in reasons[0]
    pin_phases = [e for e, n in phases if n == "grade_pin"]
    assert len(pin_phases) == 2 and len(set(pin_phases)) == 2  # tried again by the next attempt
    [pin] = pins
    assert pin.dataset_sha256 == SHIPPED_SHA
    with store.read() as session:
        assert all(a.state == "done" for a in session.scalars(select(Attempt)))


def test_a_task_unresolved_at_baseline_is_pinned_with_its_reason(
    store: Store, tmp_path: Path
) -> None:
    """A custom-module dataset the grade cannot hash (unreadable): the loader falls back, the
    envelope says `unresolved: …`; the pin records that, and the same envelope later stands."""
    [bed] = make_beds(store, tmp_path, 1)
    # The loader told to read a custom module's dataset that is not there: it falls back to
    # the grader tree's, and the grade cannot say which file it read.
    simbed.write_config(
        Path(bed.approot),
        {"time_scale": TEST_TIME_SCALE, "seed": 11, "custom_dataset": "untracked"},
    )
    sweep_id = submit(store, spec(tasks=1, models=1, trials=1)).sweep_id
    report = AttemptEngine(store, bed.name, worker="w").run_next(sweep_id=sweep_id)
    assert report is not None and report.outcome in (Outcome.PASSED, Outcome.FAILED)
    with store.read() as session:
        [pin] = session.scalars(select(DatasetPin)).all()
        assert pin.dataset_sha256 is None and (pin.note or "").startswith("unresolved:")


def test_a_canary_pins_its_task_and_finds_a_dataset_changed_since(
    store: Store, tmp_path: Path
) -> None:
    """The canary's grade follows a trusted verify and a reset with no agent: it pins its task
    when unpinned (the engine then runs no grade of its own for it), and a later canary whose
    grade departs from the pin finds the bed contaminated, both hashes in the reason."""
    [bed] = make_beds(store, tmp_path, 1, config={"custom_dataset": "untracked"})
    task, dataset = "dv01_view_build", "droost_build_tasks"
    first = run_canary(store, bed, worker="t", trigger="t", task=task, dataset=dataset)
    assert first.healthy, first.line()
    with store.read() as session:
        [pin] = session.scalars(select(DatasetPin)).all()
        assert pin.source == "canary" and pin.dataset_sha256 == SHIPPED_SHA
    # An edit of the untracked module's dataset that nothing caught (hand-made here).
    custom = Path(bed.approot) / simbed.CUSTOM_DATASET_REL
    custom.write_text(custom.read_text("utf-8").replace("total=12", "total=13"), "utf-8")
    edited = hashlib.sha256(custom.read_bytes()).hexdigest()
    second = run_canary(store, bed, worker="t", trigger="t", task=task, dataset=dataset)
    assert second.result == "contaminated" and second.quarantined, second.line()
    assert SHIPPED_SHA in second.reason and edited in second.reason
    # Put back and released: the engine's attempt reads the canary's pin, no grade of its own.
    simbed.restore_dataset(Path(bed.approot))
    release_bed(store, bed.name)
    sweep_id = submit(store, spec(task_ids=[task], models=1, trials=1)).sweep_id
    report = AttemptEngine(store, bed.name, worker="w").run_next(sweep_id=sweep_id)
    assert report is not None and report.outcome in (Outcome.PASSED, Outcome.FAILED)
    with store.read() as session:
        names = session.scalars(select(Phase.name)).all()
    assert "grade_pin" not in names and "grade" in names
