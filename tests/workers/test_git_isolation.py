"""Before each run the bed's git repository holds only its baseline (#28, DESIGN 12).

End to end: a strong model that leaves its answer in the bed's git repository where APG's reset
does not look (a branch, a tag, the stash, notes, a reflog, a dangling object), beside a model of
no skill that looks there (`git log --all`, `git stash list`, notes, `git reflog`, `git fsck`), on
the same simulated bed: the model of no skill passes 0 times. Unit: the clean-up against real
repositories an agent has abused, its git run with no hook or repo-configured program, and a bed
without `.git`.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from apg_farm.beds.git_baseline import (
    GIT_BASELINE,
    GitBaseline,
    clean_argv,
    clean_failure,
    parse_record,
    record_argv,
)
from apg_farm.contract import Outcome
from apg_farm.fixtures import simbed
from apg_farm.fixtures.simbed import simgit
from apg_farm.scheduler import submit
from apg_farm.store import Attempt, Bed, BedEvent, BedState, Phase, Store
from apg_farm.transports import CommandResult, LocalTransport
from apg_farm.workers import EmbeddedExecutor
from tests.support.simbeds import make_beds, spec

STRONG, ZERO = simbed.DEFAULT_MODELS[:2]
TASKS = ("dv01_view_build", "cv01_canvas_home")
TRIALS = 3
WHERES = [*simgit.WHERES, "branch-gc"]


def _git(root: Path, *args: str) -> str:
    return simgit.git(root, *args)


def _run(argv: tuple[str, ...]) -> CommandResult:
    return LocalTransport().run(
        argv, cwd="/", env=dict(os.environ), timeout=120, stdout_limit=1 << 20, stderr_limit=1 << 16
    )


def _record(root: Path) -> GitBaseline:
    found = parse_record(_run(record_argv(str(root))))
    assert isinstance(found, GitBaseline), found
    return found


def _clean(root: Path, baseline: GitBaseline) -> CommandResult:
    return _run(clean_argv(str(root), baseline))


def _refs(root: Path) -> dict[str, str]:
    out = _git(root, "for-each-ref", "--format=%(refname) %(objectname)")
    return dict(line.split(" ") for line in out.splitlines())


def _leave(root: Path, where: str, task: str = "dv01_view_build") -> None:
    answer = {"result": "pass", "failed": [], "creates": ["view:x"], "run_id": "r1"}
    simgit.leave_answer(root, task, answer, where.removesuffix("-gc"), gc=where.endswith("-gc"))


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A bed-like project in git as APG's set-up makes it, with its baseline tag."""
    root = tmp_path / "bed"
    (root / "web/modules/custom/x").mkdir(parents=True)
    (root / "web/modules/custom/x/x.info.yml").write_text("name: x\n")
    (root / "config/sync").mkdir(parents=True)
    (root / "config/sync/system.site.yml").write_text("name: bed\n")
    assert simgit.init_repo(root)
    simgit.tag_baseline(root, "0123456789abcdef")
    return root


# --- unit: the clean-up on real repositories -------------------------------------------------


@pytest.mark.parametrize("where", WHERES)
def test_an_answer_left_in_git_is_gone_after_the_clean_up(repo: Path, where: str) -> None:
    baseline = _record(repo)
    assert set(baseline.refs) == {"refs/heads/main", "refs/tags/apg-baseline-0123456789abcdef"}
    _leave(repo, where)
    assert simgit.find_answer(repo, "dv01_view_build") is not None  # the attack works
    result = _clean(repo, baseline)
    assert result.rc == 0, result.stdout.text()
    assert result.stdout.text().rstrip().endswith("FARM_GIT clean")
    assert simgit.find_answer(repo, "dv01_view_build") is None
    assert _refs(repo) == dict(baseline.refs)
    fsck = _git(repo, "fsck", "--unreachable", "--no-reflogs", "--no-progress")
    assert fsck.strip() == ""
    assert not (repo / ".git/logs").exists()
    assert _git(repo, "stash", "list") == "" and _git(repo, "notes", "list") == ""
    # Nothing of the answer anywhere in .git, packed or loose, in any file.
    found = subprocess.run(
        ["grep", "-r", "-l", "apg-sim-answer", str(repo / ".git")], capture_output=True, text=True
    )
    assert found.stdout == ""
    # The work tree is the baseline's and the repository is whole.
    assert _git(repo, "status", "--porcelain") == ""
    assert _clean(repo, baseline).stdout.text().strip() == "FARM_GIT clean"  # idempotent


def test_moved_refs_head_index_and_files_of_git_are_put_back(repo: Path) -> None:
    baseline = _record(repo)
    main = baseline.refs["refs/heads/main"]
    _git(repo, "checkout", "-q", "-b", "work")
    (repo / "answer.txt").write_text("the answer\n")
    _git(repo, "add", "answer.txt")  # staged: the blob reachable from the index only
    _git(repo, "commit", "-q", "-m", "work")
    _git(repo, "branch", "-f", "main", "work")  # main moved
    _git(repo, "tag", "-f", "apg-baseline-0123456789abcdef", "work")  # the baseline tag moved
    _git(repo, "checkout", "-q", "main")
    _git(repo, "rm", "-q", "--cached", "answer.txt")
    (repo / "answer2.txt").write_text("staged answer\n")
    _git(repo, "add", "answer2.txt")
    (repo / ".git/description").write_text("the answer is 42\n")
    (repo / ".git/ANSWER").write_text("42\n")
    (repo / ".git/refs/heads/not a ref\nx").write_text("junk\n")
    (repo / ".git/worktrees/w").mkdir(parents=True)
    (repo / ".git/worktrees/w/gitdir").write_text("/elsewhere/.git\n")
    (repo / ".git/objects/info/alternates").write_text("/elsewhere/objects\n")
    (repo / ".git/objects/answer.txt").write_text("42\n")
    result = _clean(repo, baseline)
    text = result.stdout.text()
    assert result.rc == 0, text
    assert _refs(repo) == dict(baseline.refs)
    assert (repo / ".git/HEAD").read_text() == "ref: refs/heads/main\n"
    assert _git(repo, "rev-parse", "HEAD").strip() == main
    assert "index rebuilt from HEAD" in text
    assert _git(repo, "ls-files", "answer2.txt") == ""
    for gone in ("ANSWER", "worktrees", "objects/info/alternates", "objects/answer.txt"):
        assert not (repo / ".git" / gone).exists(), gone
    assert (repo / ".git/description").read_bytes() == _baseline_bytes(baseline, "description")
    assert not any("not a ref" in p.name for p in (repo / ".git/refs/heads").iterdir())
    assert _git(repo, "fsck", "--unreachable", "--no-reflogs", "--no-progress").strip() == ""


def _baseline_bytes(baseline: GitBaseline, path: str) -> bytes:
    import base64

    return base64.b64decode(baseline.content[path])


def _planted_hooks(repo: Path, marker: Path) -> None:
    """Hooks and repo-configured programs that write `marker` if any git the farm runs ran them."""
    evil = f'#!/bin/sh\necho "$0 $*" >> {marker}\n'
    hooks = repo.parent / "evil-hooks"
    hooks.mkdir(exist_ok=True)
    for name in ("reference-transaction", "post-checkout", "post-index-change", "pre-auto-gc"):
        for folder in (repo / ".git/hooks", hooks):
            (folder / name).write_text(evil)
            (folder / name).chmod(0o755)
    program = repo.parent / "evil-program"
    program.write_text(evil)
    program.chmod(0o755)
    _git(repo, "config", "core.hooksPath", str(hooks))
    _git(repo, "config", "core.fsmonitor", str(program))
    _git(repo, "config", "core.pager", str(program))
    _git(repo, "config", "gc.auto", "1")
    _git(repo, "config", "include.path", str(repo.parent / "evil.cfg"))
    (repo.parent / "evil.cfg").write_text(f"[core]\n\tfsmonitor = {program}\n")


def test_planted_hooks_and_configured_programs_do_not_run(repo: Path) -> None:
    marker = repo.parent / "ran.txt"
    baseline = _record(repo)
    _leave(repo, "branch")
    _planted_hooks(repo, marker)
    # The planted hooks do run under an ordinary git (the marker proves the trap is armed).
    _git(repo, "update-ref", "refs/heads/probe", "HEAD")
    assert marker.exists()
    marker.unlink()
    result = _clean(repo, baseline)
    assert result.rc == 0, result.stdout.text()
    assert not marker.exists(), marker.read_text()
    assert not (repo / ".git/hooks/reference-transaction").exists()
    assert "fsmonitor" not in (repo / ".git/config").read_text()
    assert simgit.find_answer(repo, "dv01_view_build") is None


def test_programs_in_a_recorded_config_do_not_run_either(repo: Path) -> None:
    """A bed enrolled before git baselines: its first record may take a poisoned config for the
    baseline (the doubt in git_isolation.py); the farm's own git still runs none of it."""
    marker = repo.parent / "ran.txt"
    _planted_hooks(repo, marker)
    baseline = _record(repo)
    assert not marker.exists()
    _leave(repo, "reflog")
    _leave(repo, "dangling", task="cv01_canvas_home")
    marker.unlink(missing_ok=True)
    result = _clean(repo, baseline)
    assert result.rc == 0, result.stdout.text()
    assert not marker.exists(), marker.read_text()
    assert simgit.find_answer(repo, "dv01_view_build") is None
    assert simgit.find_answer(repo, "cv01_canvas_home") is None


def test_a_bed_without_git_is_left_alone(tmp_path: Path) -> None:
    root = tmp_path / "bed"
    root.mkdir()
    (root / "file.txt").write_text("x\n")
    baseline = _record(root)
    assert baseline.absent and GitBaseline.from_meta(baseline.as_meta()) == baseline
    result = _clean(root, baseline)
    assert result.rc == 0 and result.stdout.text().strip() == "FARM_GIT absent"
    assert sorted(p.name for p in root.iterdir()) == ["file.txt"]
    # An agent's own repository in a bed that had none: removed with its answer.
    simgit.init_repo(root)
    _leave(root, "branch")
    result = _clean(root, baseline)
    assert result.rc == 0 and not (root / ".git").exists()
    assert (root / "file.txt").exists()


def test_a_git_that_cannot_be_put_back_fails_with_the_reason(repo: Path, tmp_path: Path) -> None:
    baseline = _record(repo)
    elsewhere = tmp_path / "elsewhere.git"
    (repo / ".git").rename(elsewhere)
    (repo / ".git").symlink_to(elsewhere)
    result = _clean(repo, baseline)
    assert result.rc == 4
    assert clean_failure(result.stdout.text()) == ".git is not a directory"
    (repo / ".git").unlink()
    result = _clean(repo, baseline)
    assert result.rc == 4 and "gone" in clean_failure(result.stdout.text())


def test_a_repository_missing_baseline_objects_fails_the_check(repo: Path) -> None:
    baseline = _record(repo)
    blob = _git(repo, "rev-parse", "HEAD:config/sync/system.site.yml").strip()
    (repo / ".git/objects" / blob[:2] / blob[2:]).unlink()  # an agent deleted a baseline object
    result = _clean(repo, baseline)
    assert result.rc == 4
    assert "git fsck failed" in clean_failure(result.stdout.text())


def test_a_baseline_from_meta_is_checked() -> None:
    assert GitBaseline.from_meta(None) is None
    assert (
        GitBaseline.from_meta({"head": "ref: refs/heads/main", "refs": {"x; rm -rf /": "a"}})
        is None
    )
    good = {"head": "ref: refs/heads/main", "refs": {"refs/heads/main": "a" * 40}}
    assert GitBaseline.from_meta(good) == GitBaseline(
        head="ref: refs/heads/main", refs=good["refs"]
    )


# --- end to end: a skill-0 model that reads git beside a strong model that leaves answers ------


def _sweep(store: Store, tmp_path: Path, where: str) -> tuple[dict[str, list[str]], list[Bed]]:
    skill = {STRONG: dict.fromkeys(TASKS, 1.0), ZERO: dict.fromkeys(TASKS, 0.0)}
    leave: dict[str, Any] = {"where": where.removesuffix("-gc"), "gc": where.endswith("-gc")}
    beds = make_beds(
        store,
        tmp_path,
        1,
        config={"skill": skill},
        faults={0: {"git_leave": leave, "copy_git": True}},
    )
    sweep_id = submit(store, spec(task_ids=TASKS, models=2, trials=TRIALS)).sweep_id
    assert EmbeddedExecutor(store, sweep_id).run().errors == []
    outcomes: dict[str, list[str]] = {STRONG: [], ZERO: []}
    with store.read() as session:
        for attempt in session.scalars(select(Attempt).where(Attempt.sweep_id == sweep_id)):
            outcomes[attempt.model].append(attempt.outcome)
        rows = [session.get_one(Bed, b.id) for b in beds]
    return outcomes, rows


@pytest.mark.parametrize("where", WHERES)
def test_a_model_of_no_skill_finds_no_answer_in_git(
    sqlite_only_store: Store, tmp_path: Path, where: str
) -> None:
    _no_answer_found(sqlite_only_store, tmp_path, where)


def test_a_model_of_no_skill_finds_no_answer_in_git_on_postgresql(
    pg_store: Store, tmp_path: Path
) -> None:
    """The same on PostgreSQL, one way of leaving an answer: the clean-up is the bed's, the
    store only keeps its baseline (the test above runs every way on SQLite)."""
    _no_answer_found(pg_store, tmp_path, "branch")


def _no_answer_found(store: Store, tmp_path: Path, where: str) -> None:
    outcomes, beds = _sweep(store, tmp_path, where)
    print(f"\n{where}: {outcomes}")
    assert outcomes[STRONG] == [Outcome.PASSED] * len(TASKS) * TRIALS
    assert outcomes[ZERO] == [Outcome.FAILED] * len(TASKS) * TRIALS
    assert all(b.state != BedState.QUARANTINED for b in beds)
    # The strong model did leave its answer (the last one, after the last clean-up).
    approot = Path(beds[0].approot)
    if where != "dangling":
        assert simgit.find_answer(approot, TASKS[0]) or simgit.find_answer(approot, TASKS[1])
    with store.read() as session:
        names = session.scalars(select(Phase.name)).all()
    assert names.count("git_clean") == len(outcomes[STRONG]) + len(outcomes[ZERO])


@pytest.mark.parametrize("where", ["branch", "reflog"])
def test_without_the_clean_up_the_model_of_no_skill_copies(
    sqlite_only_store: Store, tmp_path: Path, where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control: the same sweep with the clean-up switched off lets the copy through, so the
    test above would see it."""
    from apg_farm.contract import CONTINUE
    from apg_farm.workers import engine

    monkeypatch.setattr(engine, "clean_git", lambda *_args: CONTINUE)
    outcomes, _ = _sweep(sqlite_only_store, tmp_path, where)
    print(f"\n{where}, no clean-up: {outcomes}")
    assert outcomes[ZERO].count(Outcome.PASSED) > 0


def test_a_bed_enrolled_before_git_baselines_is_recorded_at_its_first_reset(
    store: Store, tmp_path: Path
) -> None:
    beds = make_beds(store, tmp_path, 1)
    with store.session() as session:
        row = session.get_one(Bed, beds[0].id)
        recorded = dict(row.meta or {}).get(GIT_BASELINE)
        assert recorded and GitBaseline.from_meta(recorded) is not None
        row.meta = {k: v for k, v in (row.meta or {}).items() if k != GIT_BASELINE}
    sweep_id = submit(store, spec(tasks=1, models=1, trials=2)).sweep_id
    assert EmbeddedExecutor(store, sweep_id).run().errors == []
    with store.read() as session:
        row = session.get_one(Bed, beds[0].id)
        assert GitBaseline.from_meta((row.meta or {}).get(GIT_BASELINE)) == GitBaseline.from_meta(
            recorded
        )
        events = session.scalars(select(BedEvent).where(BedEvent.kind == "git_baseline")).all()
        names = session.scalars(select(Phase.name)).all()
    assert len(events) == 1 and "not at enrolment" in (events[0].detail or "")
    assert names.count("git_record") == 1 and names.count("git_clean") == 2


def test_a_failed_clean_up_quarantines_the_bed_and_retries_elsewhere(
    store: Store, tmp_path: Path
) -> None:
    beds = make_beds(store, tmp_path, 2)
    broken = Path(beds[0].approot)
    (broken / ".git").rename(tmp_path / "moved.git")
    (broken / ".git").symlink_to(tmp_path / "moved.git")
    sweep_id = submit(store, spec(tasks=2, models=1, trials=2)).sweep_id
    assert EmbeddedExecutor(store, sweep_id).run().errors == []
    with store.read() as session:
        outcomes = session.scalars(
            select(Attempt.outcome).where(Attempt.sweep_id == sweep_id)
        ).all()
        row = session.get_one(Bed, beds[0].id)
        assert row.state == BedState.QUARANTINED
        assert ".git is not a directory" in (row.state_reason or "")
        assert session.get_one(Bed, beds[1].id).state != BedState.QUARANTINED
    # Every attempt ran on the other bed: none charged to a model, none an ERROR.
    assert sorted(outcomes) == sorted(set(outcomes)) or all(
        o in (Outcome.PASSED, Outcome.FAILED, Outcome.SKIPPED) for o in outcomes
    )
    assert Outcome.ERROR not in outcomes


def test_the_simulated_bed_is_in_git_with_its_baseline_tag(tmp_path: Path, store: Store) -> None:
    beds = make_beds(store, tmp_path, 1)
    root = Path(beds[0].approot)
    refs = _refs(root)
    key = simbed.set_key(list(simbed.DEFAULT_FIXTURES))
    assert set(refs) == {"refs/heads/main", f"refs/tags/apg-baseline-{key}"}
    assert _git(root, "log", "--format=%s") == "bed initial state\n"
    tracked = _git(root, "ls-files").splitlines()
    assert ".ddev/config.yaml" in tracked
    assert not [p for p in tracked if p.startswith((".apg-sim/", ".ai-proving-ground/"))]
    assert json.loads((root / ".apg-sim/config.json").read_text())  # still there, ignored
