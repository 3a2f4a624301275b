"""Nothing an earlier attempt left in the web container reaches the next one, and what an agent
leaves on the bed's host that the farm will not clean quarantines the bed (issue #28).

Container beds (a real web container on the real Docker engine): skipped without the image
locally, a failure under CI (tests/support/simbeds.py's bed_image).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from apg_farm.contract import Outcome
from apg_farm.fixtures import simbed
from apg_farm.scheduler import submit
from apg_farm.store import Attempt, Bed, BedState, Execution, Phase, Store
from apg_farm.workers import AttemptEngine, EmbeddedExecutor
from tests.support.backends import SQLITE_ONLY
from tests.support.simbeds import bed_image, make_beds, spec

# A container test takes a minute; the store paths it takes run on both backends elsewhere.
pytestmark = SQLITE_ONLY

POISONER, *OTHERS = simbed.DEFAULT_MODELS[:3]
TASK = "dv01_view_build"


@pytest.fixture
def beds_made() -> Iterator[list[Path]]:
    """Approots whose containers are removed at the end, whatever the test did."""
    made: list[Path] = []
    yield made
    for approot in made:
        simbed.stop_container(approot)


def _beds(
    store: Store,
    root: Path,
    made: list[Path],
    faults: dict[int, dict[str, Any]],
    count: int,
    *,
    image: str | None,
) -> list[Bed]:
    # Skill 0 for every model: without a poison, no attempt of any model can pass.
    skill = {m: {TASK: 0.0} for m in simbed.DEFAULT_MODELS}
    beds = make_beds(
        store,
        root,
        count,
        image=image,
        prefix=f"i{root.name[-6:]}x",
        faults=faults,
        config={"skill": skill},
    )
    made.extend(Path(b.approot) for b in beds)
    return beds


def _phase_names(store: Store, execution_id: int) -> list[str]:
    with store.read() as session:
        return list(
            session.scalars(
                select(Phase.name).where(Phase.execution_id == execution_id).order_by(Phase.id)
            )
        )


@pytest.mark.parametrize("crash", [False, True], ids=["passes", "crashes"])
def test_a_poisoned_install_never_reaches_another_models_attempt(
    crash: bool, store: Store, tmp_path: Path, beds_made: list[Path]
) -> None:
    """One model poisons the claude adapter's install in the web container (every later run on
    it passes, or crashes at once); the other models, of skill 0, on the same bed never PASS
    and never end NO_ATTEMPT; the bed stays active."""
    image = bed_image()
    poison = {"models": [POISONER], "crash": crash}
    [bed] = _beds(store, tmp_path, beds_made, {0: {"poison_install": poison}}, 1, image=image)
    sweep_id = submit(store, spec(task_ids=[TASK], models=3, trials=2)).sweep_id
    assert EmbeddedExecutor(store, sweep_id).run().errors == []
    with store.read() as session:
        rows = session.execute(
            select(Execution.id, Attempt.model, Attempt.outcome)
            .join(Attempt, Attempt.id == Execution.attempt_id)
            .order_by(Execution.id)
        ).all()
        state = session.get_one(Bed, bed.id).state
    print(rows)
    # The attack was live: another model ran after the poisoner on this bed.
    first = next(i for i, (_, model, _) in enumerate(rows) if model == POISONER)
    followed = [row for row in rows[first + 1 :] if row[1] != POISONER]
    assert followed, rows
    assert {outcome for _, _, outcome in rows} == {Outcome.FAILED}, rows
    assert state == BedState.ACTIVE
    # Cleaned by a restart before it (the claude adapter's install always differs from a clean
    # start, so on claude beds that is every attempt after the first).
    for execution_id, *_ in followed:
        assert "restart_clean" in _phase_names(store, execution_id)


def test_a_setuid_shell_left_in_the_project_quarantines_the_bed(
    store: Store, tmp_path: Path, beds_made: list[Path]
) -> None:
    """A root agent in the web container leaves a setuid-root /bin/sh and a file owned by
    another user in the project: the attempt is graded, the bed quarantined naming both."""
    image = bed_image()
    [bed] = _beds(store, tmp_path, beds_made, {0: {"setuid_plant": True}}, 1, image=image)
    sweep_id = submit(store, spec(task_ids=[TASK], models=1, trials=1)).sweep_id
    report = AttemptEngine(store, bed.name, worker="w").run_next(sweep_id=sweep_id)
    assert report is not None and report.outcome == Outcome.FAILED
    with store.read() as session:
        row = session.get_one(Bed, bed.id)
    assert row.state == BedState.QUARANTINED
    assert "setuid apg-sim-sh" in (row.state_reason or ""), row.state_reason
    assert "owner apg-sim-foreign" in (row.state_reason or ""), row.state_reason


def test_a_setuid_file_is_named_even_when_the_attempt_is_tampered(
    store: Store, tmp_path: Path
) -> None:
    """A host-only bed (no Docker needed): the agent edits the grader and leaves a setuid copy
    of /bin/sh. The attempt is TAMPERED, and the bed's quarantine names the setuid file too."""
    faults = {0: {"setuid_plant": {"foreign": False}, "tamper": True}}
    [bed] = _beds(store, tmp_path, [], faults, 1, image=None)
    sweep_id = submit(store, spec(task_ids=[TASK], models=1, trials=1)).sweep_id
    report = AttemptEngine(store, bed.name, worker="w").run_next(sweep_id=sweep_id)
    assert report is not None and report.outcome == Outcome.TAMPERED
    with store.read() as session:
        row = session.get_one(Bed, bed.id)
    assert row.state == BedState.QUARANTINED
    assert "setuid apg-sim-sh" in (row.state_reason or ""), row.state_reason
    assert "judging code changed" in (row.state_reason or ""), row.state_reason


def test_a_container_left_as_it_started_is_not_restarted(
    store: Store, tmp_path: Path, beds_made: list[Path]
) -> None:
    """With the run on the host (no install in the container), nothing differs from the clean
    start after the first restart: the check costs a `docker diff`, not a restart."""
    image = bed_image()
    web = [c for c in simbed.DEFAULT_WEB_COMMANDS if c not in ("ai-eval-run", "ai-eval-grade")]
    beds = make_beds(
        store,
        tmp_path,
        1,
        image=image,
        prefix=f"h{tmp_path.name[-6:]}x",
        config={"web_commands": web},
    )
    beds_made.extend(Path(b.approot) for b in beds)
    sweep_id = submit(store, spec(task_ids=[TASK], models=1, trials=3)).sweep_id
    assert EmbeddedExecutor(store, sweep_id).run().errors == []
    with store.read() as session:
        executions = list(session.scalars(select(Execution.id).order_by(Execution.id)))
    restarts = ["restart_clean" in _phase_names(store, e) for e in executions]
    assert restarts == [True, False, False]
