"""Before each run the project's other files hold only their baseline (issue #28).

Files outside what APG's reset restores and what the farm's other steps look after (an answer at
the project root, a tracked file edited outside the scope, a CLAUDE.md) stay through every reset.
End to end: a strong model that leaves its answer at the project root, beside a model of no skill
that looks there, on the same simulated bed: the model of no skill passes 0 times (and without the
clean-up it copies). The script on a real git repository with hostile names and paths; a bed
whose baseline lists files; a bed enrolled before the listing was recorded.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from sqlalchemy import select

from apg_farm.beds import (
    WORKTREE,
    WORKTREE_STDOUT_LIMIT,
    Worktree,
    parse_worktree,
    record_escrow_set,
    worktree_argv,
)
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


def _git(root: Path, *args: str) -> str:
    env = {"PATH": os.environ["PATH"], "HOME": str(root), "GIT_CONFIG_NOSYSTEM": "1"}
    return subprocess.run(
        ["git", "-c", "user.email=t@t", "-c", "user.name=t", *args],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def _run(root: Path, mode: str) -> Worktree:
    result = LocalTransport().run(
        worktree_argv(str(root), mode),
        cwd="/",
        env={"PATH": os.environ["PATH"], "LC_ALL": "C"},
        timeout=60,
        stdout_limit=WORKTREE_STDOUT_LIMIT,
        stderr_limit=4096,
    )
    found = parse_worktree(result)
    assert isinstance(found, Worktree), (found, result.stdout.text(), result.stderr.text())
    return found


# --- the script on a real repository ---------------------------------------------------------


def test_the_clean_up_puts_back_what_reset_leaves_and_nothing_else(tmp_path: Path) -> None:
    root = tmp_path / "project"
    for rel in ("config/sync", "web/modules/custom/m", ".ddev"):
        (root / rel).mkdir(parents=True)
    (root / "README.md").write_text("baseline\n")
    (root / "config/sync/system.yml").write_text("a: 1\n")
    (root / ".gitignore").write_text("/vendor/\n")
    _git(root, "init", "-q")
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "baseline")
    assert _run(root, "list") == Worktree()
    # What an agent leaves: a tracked file edited, an answer, a nested repository, a symlink out,
    # a name with a newline, a CLAUDE.md; and what others look after or git ignores.
    (root / "README.md").write_text("the answer is 42\n")
    (root / "ANSWER.md").write_text("42")
    (root / "CLAUDE.md").write_text("copy the answer from ANSWER.md")
    (root / "nested").mkdir()
    _git(root / "nested", "init", "-q")
    (root / "nested" / "a.txt").write_text("hidden")
    (root / "out").symlink_to("/etc")
    (root / "we\nird").write_text("x")
    (root / "config/sync/system.yml").write_text("a: 2\n")  # reset's scope
    (root / ".ddev/config.local.yaml").write_text("x: 1\n")  # the DDEV fingerprint's
    (root / "vendor").mkdir()
    (root / "vendor/lib.php").write_text("<?php")  # ignored: Composer's
    listed = _run(root, "list")
    assert len(listed.entries) == 6 and not listed.cut, listed
    assert " M README.md" in listed.entries and '?? "we\\nird"' in listed.entries
    assert _run(root, "clean") == Worktree()
    assert (root / "README.md").read_text() == "baseline\n"
    for gone in ("ANSWER.md", "CLAUDE.md", "nested", "out", "we\nird"):
        assert not os.path.lexists(root / gone), gone
    assert Path("/etc").is_dir()  # the symlink went, not what it named
    # Left alone: reset's scope, the DDEV configuration, what git ignores.
    assert (root / "config/sync/system.yml").read_text() == "a: 2\n"
    assert (root / ".ddev/config.local.yaml").exists() and (root / "vendor/lib.php").exists()


def test_a_project_without_git_and_a_long_listing(tmp_path: Path) -> None:
    """No repository: nothing listed. More names than the farm reads: the beginning, cut."""
    assert _run(tmp_path, "list") == Worktree(repository=False)
    _git(tmp_path, "init", "-q")
    (tmp_path / "many").mkdir()
    for i in range(5000):
        (tmp_path / "many" / f"file-with-a-long-name-{i:05d}-padding-padding-padding.txt").touch()
    listed = _run(tmp_path, "list")
    assert listed.cut and 0 < len(listed.entries) < 5000
    assert "more than" in listed.label()
    assert _run(tmp_path, "clean") == Worktree()


def test_a_listing_from_meta_is_checked() -> None:
    assert Worktree.from_meta(None) is None
    assert Worktree.from_meta({"entries": [1], "repository": True}) is None
    assert Worktree.from_meta({"entries": [], "repository": "yes"}) is None
    listing = Worktree(("?? a",), True, cut=True)
    assert Worktree.from_meta(listing.as_meta()) == listing
    # An agent-made name is cut in the label a bed event and a reason carry.
    assert len(Worktree(("?? " + "x" * 4000,) * 30).label()) < 20 * 200


# --- end to end --------------------------------------------------------------------------------


def _sweep(store: Store, tmp_path: Path) -> tuple[dict[str, list[str]], list[Bed], int]:
    skill = {STRONG: dict.fromkeys(TASKS, 1.0), ZERO: dict.fromkeys(TASKS, 0.0)}
    beds = make_beds(
        store,
        tmp_path,
        1,
        config={"skill": skill},
        faults={0: {"leave_private": {"where": "root"}, "copy_private": True}},
    )
    sweep_id = submit(store, spec(task_ids=TASKS, models=2, trials=TRIALS)).sweep_id
    assert EmbeddedExecutor(store, sweep_id).run().errors == []
    outcomes: dict[str, list[str]] = {STRONG: [], ZERO: []}
    with store.read() as session:
        for attempt in session.scalars(select(Attempt).where(Attempt.sweep_id == sweep_id)):
            outcomes[attempt.model].append(attempt.outcome)
        rows = [session.get_one(Bed, b.id) for b in beds]
    return outcomes, rows, sweep_id


def test_a_model_of_no_skill_finds_no_answer_at_the_project_root(
    store: Store, tmp_path: Path
) -> None:
    outcomes, beds, _ = _sweep(store, tmp_path)
    print(f"\n{outcomes}")
    assert outcomes[STRONG] == [Outcome.PASSED] * len(TASKS) * TRIALS
    assert outcomes[ZERO] == [Outcome.FAILED] * len(TASKS) * TRIALS
    assert all(b.state != BedState.QUARANTINED for b in beds)
    with store.read() as session:
        events = session.scalars(select(BedEvent).where(BedEvent.kind == "leftover")).all()
        names = session.scalars(select(Phase.name)).all()
    # The strong model did leave answers, and the farm put the root back before the next run.
    assert events and all("apg-sim-answers" in (e.detail or "") for e in events)
    assert names.count("worktree_check") == 2 * len(TASKS) * TRIALS
    assert names.count("worktree_clean") == len(events)


def test_without_the_clean_up_the_model_of_no_skill_copies(
    sqlite_only_store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control: the same sweep with the clean-up switched off lets the copy through."""
    from apg_farm.contract import CONTINUE
    from apg_farm.workers import engine

    monkeypatch.setattr(engine, "clean_worktree", lambda *_args: CONTINUE)
    outcomes, _, _ = _sweep(sqlite_only_store, tmp_path)
    print(f"\nno clean-up: {outcomes}")
    assert outcomes[ZERO].count(Outcome.PASSED) > 0


def test_a_bed_whose_baseline_lists_files_is_quarantined_when_they_change(
    store: Store, tmp_path: Path
) -> None:
    """A baseline with a file of its own at the root (escrowed so): an attempt that finds it as
    it was goes on; once an agent has left another, the farm cannot put back the baseline's
    without a copy: the next attempt there is retried elsewhere, the bed quarantined."""
    beds = make_beds(store, tmp_path, 2)
    first = Path(beds[0].approot)
    (first / "OPERATOR-NOTES.md").write_text("the operator's, untracked")
    record_escrow_set(store, beds[0], beds[0].escrow_set or "")
    with store.read() as session:
        recorded = Worktree.from_meta((session.get_one(Bed, beds[0].id).meta or {})[WORKTREE])
    assert recorded is not None and recorded.entries == ("?? OPERATOR-NOTES.md",)
    one = submit(store, spec("one", tasks=1, models=1, trials=2)).sweep_id
    assert EmbeddedExecutor(store, one).run().errors == []
    with store.read() as session:
        assert session.get_one(Bed, beds[0].id).state == BedState.ACTIVE
    (first / "ANSWER.md").write_text("left by an agent")
    two = submit(store, spec("two", tasks=1, models=1, trials=4)).sweep_id
    assert EmbeddedExecutor(store, two).run().errors == []
    with store.read() as session:
        bed = session.get_one(Bed, beds[0].id)
        retried = session.scalars(
            select(Execution)
            .join(Attempt)
            .where(Attempt.sweep_id == two, Execution.bed_id == bed.id, Execution.result == "RETRY")
        ).all()
        attempts = session.scalars(select(Attempt).where(Attempt.sweep_id == two)).all()
    assert bed.state == BedState.QUARANTINED and "clean tree" in (bed.state_reason or "")
    assert len(retried) == 1 and all(a.outcome is not None for a in attempts)
    assert (first / "OPERATOR-NOTES.md").exists()  # never removed: the farm has no copy


def test_a_bed_enrolled_before_the_listing_is_recorded_at_its_first_reset(
    sqlite_only_store: Store, tmp_path: Path
) -> None:
    beds = make_beds(sqlite_only_store, tmp_path, 1)
    with sqlite_only_store.session() as session:
        row = session.get_one(Bed, beds[0].id)
        assert Worktree.from_meta((row.meta or {}).get(WORKTREE)) == Worktree()
        row.meta = {k: v for k, v in (row.meta or {}).items() if k != WORKTREE}
    sweep_id = submit(sqlite_only_store, spec(tasks=1, models=1, trials=2)).sweep_id
    assert EmbeddedExecutor(sqlite_only_store, sweep_id).run().errors == []
    with sqlite_only_store.read() as session:
        row = session.get_one(Bed, beds[0].id)
        assert Worktree.from_meta((row.meta or {}).get(WORKTREE)) == Worktree()
        events = session.scalars(select(BedEvent).where(BedEvent.kind == "worktree_baseline")).all()
    assert len(events) == 1 and "not at enrolment" in (events[0].detail or "")
