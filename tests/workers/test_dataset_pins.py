"""Pin what the grade reads (#28, part 3): the task dataset kept in the project's own module
(`datasets/` of a custom module, as APG advises) is not covered by the escrow verifier, so an
agent can edit its own task's entry and have its failing build graded PASSED. Each task's
`dataset_sha256` and `task_sha256` are pinned per bed baseline from a grade at baseline before
any run; an envelope naming other hashes (or none) is TAMPERED and the bed quarantined."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from apg_farm.contract import Outcome
from apg_farm.errors import FarmError
from apg_farm.fixtures import simbed
from apg_farm.results import analyse, dataset_hash_lines, find_sweep, render_html, sweep_report
from apg_farm.scheduler import submit
from apg_farm.store import (
    Attempt,
    Bed,
    BedState,
    DatasetPin,
    Execution,
    Phase,
    Store,
    read_evidence,
    release_bed,
)
from apg_farm.workers import EmbeddedExecutor
from tests.support.simbeds import make_beds, spec

HONEST, EDITOR = simbed.DEFAULT_MODELS[:2]
TASKS = ("dv01_view_build", "cv01_canvas_home")
TRIALS = 6
SHIPPED = (simbed.PACKAGE_DIR / "droost_build_tasks.json").read_bytes()
SHIPPED_SHA = hashlib.sha256(SHIPPED).hexdigest()
HEX64 = re.compile(r"\b[0-9a-f]{64}\b")


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[Store]:
    """The policy under test is the engine's: the end-to-end sweeps run on SQLite (the pins'
    own reads and writes are tested on both stores in tests/contract/test_pins.py)."""
    s = Store(f"sqlite:///{tmp_path / 'farm.db'}")
    yield s
    s.dispose()


def _sweep_until_done(store: Store, sweep_id: int, beds: list[Bed], mode: str) -> list[str]:
    """Run the sweep; each time every bed is quarantined, a person looks (the reason names
    both hashes), restores the custom module's dataset, and releases the bed. Returns the
    quarantine reasons seen."""
    reasons: list[str] = []
    for _ in range(40):
        result = EmbeddedExecutor(store, sweep_id).run()
        assert result.errors == []
        with store.read() as session:
            rows = [session.get_one(Bed, b.id) for b in beds]
            held = [(r.name, r.approot, r.state_reason or "") for r in rows]
            states = [r.state for r in rows]
        for (name, approot, reason), state in zip(held, states, strict=True):
            if state != BedState.QUARANTINED:
                continue
            reasons.append(reason)
            if mode == "untracked":
                # The edit outlives every reset there: the person puts the dataset back.
                simbed.restore_dataset(Path(approot))
            release_bed(store, name, note="looked: dataset restored")
        if result.stranded == 0 and not any(s == BedState.QUARANTINED for s in states):
            return reasons
    raise AssertionError("the sweep did not finish")


def _sim_passed(store: Store, execution_id: int, run_id: str | None) -> bool | None:
    """The simulated agent's own draw for its run (sim.json, kept in the evidence): whether it
    built a passing site."""
    if run_id is None:
        return None
    try:
        raw = read_evidence(store, execution_id, f"runs/{run_id}/sim.json", limit=1 << 16)
        return bool(json.loads(raw)["passed"])
    except (FarmError, ValueError, KeyError):
        return None


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["tracked", "untracked"])
def test_an_agent_that_edits_its_task_in_the_dataset_is_tampered_never_passed(
    sqlite_store: Store, tmp_path: Path, mode: str
) -> None:
    store = sqlite_store
    skill = {HONEST: dict.fromkeys(TASKS, 0.6), EDITOR: dict.fromkeys(TASKS, 0.1)}
    beds = make_beds(
        store,
        tmp_path,
        3,
        config={"custom_dataset": mode, "skill": skill},
        faults={i: {"edit_dataset": {"models": [EDITOR]}} for i in range(3)},
    )
    sweep_id = submit(store, spec(task_ids=TASKS, models=2, trials=TRIALS)).sweep_id
    reasons = _sweep_until_done(store, sweep_id, beds, mode)

    with store.read() as session:
        rows = session.execute(
            select(Attempt.model, Attempt.outcome, Execution.id, Execution.run_id, Execution.reason)
            .join(Execution, Execution.attempt_id == Attempt.id)
            .join(Bed, Bed.id == Execution.bed_id)
            .where(Attempt.sweep_id == sweep_id, Execution.result != "RETRY")
        ).all()
        pins = session.scalars(select(DatasetPin)).all()
        pin_phases = session.scalars(select(Phase).where(Phase.name == "grade_pin")).all()
    assert len(rows) == len(TASKS) * 2 * TRIALS
    edited = [r for r in rows if r.model == EDITOR and _sim_passed(store, r.id, r.run_id) is False]
    built = [r for r in rows if r.model == EDITOR and _sim_passed(store, r.id, r.run_id) is True]
    print(
        f"\n{mode}: {len(edited)} edited runs, {len(built)} passing builds, {len(reasons)} quarantines"
    )
    assert len(edited) >= 5  # the low-skill model did edit, often
    # Every edited run is TAMPERED, never PASSED, with both hashes in its reason.
    for row in edited:
        assert row.outcome == Outcome.TAMPERED, row
        assert SHIPPED_SHA in row.reason and len(set(HEX64.findall(row.reason))) >= 4, row.reason
    # Its builds that really pass stay PASSED; the honest model is never TAMPERED.
    assert all(r.outcome == Outcome.PASSED for r in built)
    honest = [r.outcome for r in rows if r.model == HONEST]
    assert set(honest) <= {Outcome.PASSED, Outcome.FAILED} and Outcome.PASSED in honest
    # Each edit quarantined its bed, the reason naming the pinned and the edited dataset hash.
    assert len(reasons) == len(edited)
    for reason in reasons:
        assert reason.startswith("dataset changed during an attempt"), reason
        found = set(HEX64.findall(reason))
        assert SHIPPED_SHA in found and len(found - {SHIPPED_SHA}) >= 2, reason
    # One pin per task and bed baseline (each bed its own escrow set), from the grade at
    # baseline before the first run there: the shipped file, whatever the edits after it.
    assert {p.task for p in pins} == set(TASKS) and len(pins) <= len(TASKS) * len(beds)
    assert len({(p.baseline_key, p.escrow_sha256, p.task) for p in pins}) == len(pins)
    assert {p.dataset_sha256 for p in pins} == {SHIPPED_SHA}
    assert {p.source for p in pins} == {"baseline_grade"}
    assert {p.dataset_path for p in pins} == {simbed.CUSTOM_DATASET_REL}
    assert len(pin_phases) == len(pins)


def test_the_dataset_stays_edited_on_an_untracked_module_and_the_next_attempt_sees_it(
    sqlite_store: Store, tmp_path: Path
) -> None:
    """Released without restoring the untracked dataset: the diff after the next reset shows
    the edited file, so the bed is quarantined again before any agent runs there, and the
    honest model's attempt goes back to the queue, never judged by the edited dataset."""
    store = sqlite_store
    skill = {HONEST: {TASKS[0]: 1.0}, EDITOR: {TASKS[0]: 0.0}}
    [bed] = make_beds(
        store,
        tmp_path,
        1,
        config={"custom_dataset": "untracked", "skill": skill},
        faults={0: {"edit_dataset": {"models": [EDITOR]}}},
    )
    first = submit(
        store,
        spec("editor", task_ids=TASKS[:1], models=2, trials=1).model_copy(
            update={"models": [EDITOR]}
        ),
    ).sweep_id
    EmbeddedExecutor(store, first).run()
    with store.read() as session:
        row = session.get_one(Bed, bed.id)
        reason = row.state_reason or ""
        assert row.state == BedState.QUARANTINED
    assert reason.startswith("dataset changed during an attempt")
    edited = (Path(bed.approot) / simbed.CUSTOM_DATASET_REL).read_bytes()
    assert hashlib.sha256(edited).hexdigest() in reason and SHIPPED_SHA in reason
    release_bed(store, bed.name, note="released without a look")
    second = submit(store, spec("honest", task_ids=TASKS[:1], models=1, trials=1)).sweep_id
    result = EmbeddedExecutor(store, second).run()
    with store.read() as session:
        row = session.get_one(Bed, bed.id)
        again = row.state_reason or ""
        outcomes = session.scalars(select(Attempt.outcome).where(Attempt.sweep_id == second)).all()
        runs = session.scalars(
            select(Phase.name)
            .join(Execution, Execution.id == Phase.execution_id)
            .join(Attempt, Attempt.id == Execution.attempt_id)
            .where(Attempt.sweep_id == second)
        ).all()
    assert row.state == BedState.QUARANTINED and result.stranded == 1
    assert (
        again.startswith("not at baseline after the reset") and simbed.CUSTOM_DATASET_REL in again
    )
    assert outcomes == [None] and "run" not in runs


def test_the_report_names_the_sweep_and_the_attempts_graded_against_another_hash(
    sqlite_store: Store, tmp_path: Path
) -> None:
    """Not a tally: each hash a task was graded against, with the attempts behind it, in the
    JSON (`report --json`), the text lines and the HTML report."""
    store = sqlite_store
    skill = {HONEST: {TASKS[0]: 1.0}, EDITOR: {TASKS[0]: 0.0}}
    beds = make_beds(
        store,
        tmp_path,
        2,
        config={"custom_dataset": "tracked", "skill": skill},
        faults={i: {"edit_dataset": {"models": [EDITOR]}} for i in range(2)},
    )
    sweep_id = submit(store, spec("mixed", task_ids=TASKS[:1], models=2, trials=2)).sweep_id
    _sweep_until_done(store, sweep_id, beds, "tracked")
    sweep = find_sweep(store, "mixed")
    report = analyse(store, sweep)
    with store.read() as session:
        tampered = session.scalars(
            select(Attempt.id).where(Attempt.sweep_id == sweep_id, Attempt.model == EDITOR)
        ).all()
        honest = session.scalars(
            select(Attempt.id).where(Attempt.sweep_id == sweep_id, Attempt.model == HONEST)
        ).all()
    found = report["dataset_hashes"]
    assert found["mixed"] is True
    by_field = {e["field"]: e for e in found["tasks"] if e["task"] == TASKS[0]}
    assert set(by_field) == {"dataset_sha256", "task_sha256"}
    hashes = {h["sha256"]: h for h in by_field["dataset_sha256"]["hashes"]}
    assert {a["attempt"] for a in hashes[SHIPPED_SHA]["attempts"]} == set(honest)
    others = [h for sha, h in hashes.items() if sha != SHIPPED_SHA]
    named = {a["attempt"] for h in others for a in h["attempts"]}
    assert named == set(tampered) and all(
        a["result"] == Outcome.TAMPERED for h in others for a in h["attempts"]
    )
    lines = dataset_hash_lines(report)
    assert len(lines) == 2 and all(
        line.startswith("sweep mixed: task dv01_view_build") for line in lines
    )
    for attempt in tampered:
        assert any(f"attempt {attempt} ({EDITOR}" in line for line in lines)
    html = render_html(report)
    assert 'id="dataset-hashes"' in html and SHIPPED_SHA in html
    assert all(h["sha256"] in html for h in others)
    # The compact report (`apg-farm run --json`) carries the same.
    assert sweep_report(store, sweep)["dataset_hashes"] == found
    # A sweep graded against one dataset says so, and names nothing.
    clean = submit(store, spec("clean", task_ids=TASKS[:1], models=1, trials=1)).sweep_id
    assert EmbeddedExecutor(store, clean).run().errors == []
    assert analyse(store, find_sweep(store, "clean"))["dataset_hashes"] == {
        "mixed": False,
        "tasks": [],
    }
