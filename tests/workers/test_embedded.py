"""A whole sweep on simulated beds through the embedded executor: outcomes, quarantine, retries."""

from __future__ import annotations

import itertools
import threading
from collections import Counter
from pathlib import Path
from typing import Any

from sqlalchemy import select

from apg_farm.contract import Outcome
from apg_farm.fixtures import simbed
from apg_farm.results import find_sweep, sweep_report
from apg_farm.scheduler import submit
from apg_farm.specs import Timeouts
from apg_farm.store import (
    Attempt,
    AttemptState,
    Bed,
    BedState,
    Execution,
    Phase,
    Store,
    cancel_sweep,
)
from apg_farm.workers import EmbeddedExecutor
from tests.support.simbeds import make_beds, spec


def _run(store: Store, sweep_id: int) -> None:
    result = EmbeddedExecutor(store, sweep_id).run()
    assert result.errors == []


def _attempts(store: Store, sweep_id: int) -> list[Attempt]:
    with store.session() as session:
        rows = list(session.scalars(select(Attempt).where(Attempt.sweep_id == sweep_id)))
        session.expunge_all()
        return rows


def _executions(store: Store) -> list[tuple[Execution, str]]:
    with store.session() as session:
        rows = [
            (e, name)
            for e, name in session.execute(
                select(Execution, Bed.name)
                .join(Bed, Bed.id == Execution.bed_id)
                .order_by(Execution.id)
            )
        ]
        session.expunge_all()
        return rows


def assert_no_bed_overlap(store: Store, beds: list[Bed]) -> None:
    """No bed ran two executions at once (store timestamps) nor two commands at once (bed's own log)."""
    by_bed: dict[str, list[Execution]] = {}
    for execution, name in _executions(store):
        by_bed.setdefault(name, []).append(execution)
    for runs in by_bed.values():
        runs.sort(key=lambda e: e.started_at)
        for earlier, later in itertools.pairwise(runs):
            assert earlier.finished_at is not None
            assert earlier.finished_at <= later.started_at
    for bed in beds:
        log = simbed.read_log(Path(bed.approot))
        assert not any(line.get("overlap") for line in log)


def test_sweep_gives_every_attempt_one_outcome_and_report_agrees(
    store: Store, tmp_path: Path
) -> None:
    """4 beds, 2 models x 3 tasks x 4 trials: all done, report equals the stored executions."""
    beds = make_beds(store, tmp_path, 4)
    sweep_id = submit(store, spec(tasks=3, trials=4)).sweep_id
    _run(store, sweep_id)
    attempts = _attempts(store, sweep_id)
    assert len(attempts) == 24
    assert all(a.state == AttemptState.DONE for a in attempts)
    assert {a.outcome for a in attempts} <= {Outcome.PASSED, Outcome.FAILED}
    executions = _executions(store)
    assert len(executions) == 24
    # The report is derived from the store: recompute it from the executions' own results.
    report = sweep_report(store, find_sweep(store, "s"))
    final = Counter(e.result for e, _ in executions)
    assert report["outcomes"] == dict(final)
    for cell in report["cells"]:
        passed = sum(
            1
            for e, _ in executions
            if e.result == "PASSED"
            and (a := next(x for x in attempts if x.id == e.attempt_id)).task == cell["task"]
            and a.model == cell["model"]
        )
        assert cell["passed"] == passed and cell["n"] == 4
    # Scores and envelopes are kept verbatim with their hash.
    for execution, _ in executions:
        assert execution.envelope and execution.envelope_sha256 and execution.run_id
        assert execution.run_id in execution.envelope.decode()
    assert_no_bed_overlap(store, beds)
    # Different models really differ on the simulated beds (skill 0.85 vs 0.55 on dv01).
    assert len({c["pass_rate"] for c in report["cells"]}) > 1


def test_faults_are_contained_and_counts_reconcile(store: Store, tmp_path: Path) -> None:
    """Reset failure, tampering agent, adapter failure and a skipped task on a 5-bed pool."""
    faults_are_contained(store, tmp_path)


def faults_are_contained(store: Store, tmp_path: Path, **options: Any) -> None:
    """The faults test on beds made with `options` (make_beds' options: container beds too)."""
    beds = make_beds(
        store,
        tmp_path,
        5,
        faults={0: {"reset_fail": True}, 1: {"tamper": True}, 2: {"adapter_fail": True}},
        **options,
    )
    tasks = ["dv01_view_build", "cv01_canvas_home", "nx01_prose_only"]
    sweep_id = submit(store, spec(task_ids=tasks, trials=3)).sweep_id
    _run(store, sweep_id)

    attempts = _attempts(store, sweep_id)
    executions = _executions(store)
    outcomes = Counter(a.outcome for a in attempts)
    # Every attempt has exactly one final outcome, and they add up.
    assert all(a.state == AttemptState.DONE and a.outcome for a in attempts)
    assert sum(outcomes.values()) == len(attempts) == 18
    assert outcomes[Outcome.ERROR] == 0
    # Each attempt has exactly one final execution; all others are retries.
    for attempt in attempts:
        mine = [e for e, _ in executions if e.attempt_id == attempt.id]
        assert [e.result for e in mine].count(attempt.outcome) == 1
        assert all(e.result == "RETRY" for e in mine if e.result != attempt.outcome)
        beds_tried = [name for e, name in executions if e.attempt_id == attempt.id]
        assert len(beds_tried) == len(set(beds_tried)), "a retry went back to a bed that failed it"

    states = {b.name: b for b in _beds(store)}
    assert states["bed0"].state == BedState.QUARANTINED and "RESET" in (
        states["bed0"].state_reason or ""
    )
    assert states["bed1"].state == BedState.QUARANTINED and "TAMPERED" in (
        states["bed1"].state_reason or ""
    )
    assert states["bed2"].state == BedState.QUARANTINED
    assert states["bed3"].state == states["bed4"].state == BedState.ACTIVE
    per_bed = Counter(name for _, name in executions)
    assert per_bed["bed0"] == 1 and per_bed["bed1"] == 1 and per_bed["bed2"] <= 3
    # The tampered attempt was not graded; its evidence is kept.
    tampered = [e for e, name in executions if name == "bed1"]
    assert tampered[0].result == Outcome.TAMPERED and tampered[0].envelope is None
    with store.session() as session:
        phases = session.scalars(
            select(Phase).where(Phase.execution_id == tampered[0].id).order_by(Phase.id)
        ).all()
        # The last bed command is the verify that failed, then only the evidence move (#28).
        assert [p.name for p in phases][-2:] == ["verify_after", "evidence"]
        assert "APG_TAMPERED" in phases[-2].stderr
    # The skip task is SKIPPED wherever it was graded.
    for attempt in attempts:
        if attempt.task == "nx01_prose_only" and attempt.outcome != Outcome.TAMPERED:
            assert attempt.outcome == Outcome.SKIPPED
    assert outcomes[Outcome.SKIPPED] >= 5
    # Retries: every infrastructure failure was retried on another bed and ended there.
    retried = {e.attempt_id for e, _ in executions if e.result == "RETRY"}
    assert retried, "the faulty beds should have caused retries"
    assert_no_bed_overlap(store, beds)


def _beds(store: Store) -> list[Bed]:
    with store.session() as session:
        rows = list(session.scalars(select(Bed)))
        session.expunge_all()
        return rows


def test_start_failures_everywhere_are_scored_after_the_budget(
    store: Store, tmp_path: Path
) -> None:
    """With every bed failing to start the adapter (at once, nothing changed) and no check of
    the farm's to reproduce it (beds without `ai-eval-claude`: #29), the attempt is retried on
    distinct beds, retries + 1 tries; the token is agent-writable, so the last is scored
    (NO_ATTEMPT), never an ERROR outside the denominator."""
    make_beds(
        store,
        tmp_path,
        3,
        faults={i: {"adapter_fail": True} for i in range(3)},
        config={"claude_helper": False},
    )
    sweep_id = submit(store, spec(tasks=1, models=1, trials=1, retries=2)).sweep_id
    _run(store, sweep_id)
    [attempt] = _attempts(store, sweep_id)
    assert attempt.outcome == Outcome.NO_ATTEMPT and "APG_CLAUDE_INSTALL_FAILED" in (
        attempt.reason or ""
    )
    tries = [name for e, name in _executions(store) if e.attempt_id == attempt.id]
    assert sorted(tries) == ["bed0", "bed1", "bed2"]


def test_agent_failures_are_graded_never_retried(store: Store, tmp_path: Path) -> None:
    """An agent timeout or error is NO_ATTEMPT after grading, on the bed it happened on."""
    make_beds(store, tmp_path, 2, faults={0: {"agent_timeout": True}, 1: {"agent_fail": True}})
    sweep_id = submit(store, spec(tasks=1, models=2, trials=2)).sweep_id
    _run(store, sweep_id)
    assert {a.outcome for a in _attempts(store, sweep_id)} == {Outcome.NO_ATTEMPT}
    executions = _executions(store)
    assert len(executions) == 4 and all(e.result == Outcome.NO_ATTEMPT for e, _ in executions)


def test_bad_bed_output_is_invalid_and_nothing_is_lost(store: Store, tmp_path: Path) -> None:
    """Malformed, other-task, non-UTF-8 and 8 MiB envelopes are INVALID; outputs are stored bounded."""
    faults = {
        0: {"malformed_envelope": True},
        1: {"wrong_task_envelope": True},
        2: {"non_utf8": True},
        3: {"huge_output": {"bytes": 8 * 1024 * 1024}},
    }
    beds = make_beds(store, tmp_path, 4, faults=faults)
    attempts = []
    for index in faults:
        # One bed at a time, so each fault surely grades one attempt (threads race otherwise).
        with store.session() as session:
            for bed in session.scalars(select(Bed)):
                bed.state = BedState.ACTIVE if bed.name == beds[index].name else BedState.DRAINING
        sweep_id = submit(store, spec(f"bad{index}", tasks=1, models=1, trials=1)).sweep_id
        _run(store, sweep_id)
        attempts += _attempts(store, sweep_id)
    assert [a.outcome for a in attempts] == [Outcome.INVALID] * 4
    reasons = " ".join(a.reason or "" for a in attempts)
    for problem in ("not_json", "other_task", "not_utf8", "too_large"):
        assert problem in reasons
    with store.session() as session:
        grades = session.scalars(select(Phase).where(Phase.name == "grade")).all()
        huge = [p for p in grades if p.stdout_bytes == 8 * 1024 * 1024]
        assert huge and huge[0].stdout_truncated and len(huge[0].stdout) < 3 * 1024 * 1024
        assert all(p.stdout_bytes > 0 for p in grades)


def test_a_hung_run_is_killed_and_scored(store: Store, tmp_path: Path) -> None:
    """A run that never ends hits the sweep's run timeout and is killed in bounded time; the
    agent could hang its run on purpose, so it is graded as the agent's failure, never retried."""
    make_beds(store, tmp_path, 2, faults={0: {"hang": {"command": "ai-eval-run"}}})
    timeouts = Timeouts(verify=30, reset=30, run=2, grade=30)
    sweep_id = submit(store, spec(tasks=1, models=1, trials=2, timeouts=timeouts)).sweep_id
    _run(store, sweep_id)
    hung = [e for e, name in _executions(store) if name == "bed0"]
    assert hung and all(e.result == Outcome.NO_ATTEMPT for e in hung)
    assert all("run timeout" in (e.reason or "") for e in hung)
    assert {a.outcome for a in _attempts(store, sweep_id)} <= {
        Outcome.PASSED,
        Outcome.FAILED,
        Outcome.NO_ATTEMPT,
    }
    with store.session() as session:
        run = session.scalars(
            select(Phase).where(Phase.execution_id == hung[0].id, Phase.name == "run")
        ).one()
        assert run.timed_out and run.duration < 10


def test_cancel_stops_the_sweep(store: Store, tmp_path: Path) -> None:
    """Cancelling mid-sweep: queued attempts CANCELLED at once, running ones at the next phase; all end."""
    make_beds(store, tmp_path, 2, config={"time_scale": 200})
    sweep_id = submit(store, spec(tasks=2, models=2, trials=5)).sweep_id
    executor = EmbeddedExecutor(store, sweep_id)
    runner = threading.Thread(target=executor.run)
    runner.start()
    while len([e for e, _ in _executions(store)]) < 3:
        runner.join(timeout=0.05)
    cancelled = cancel_sweep(store, sweep_id)
    runner.join(timeout=60)
    assert not runner.is_alive()
    attempts = _attempts(store, sweep_id)
    outcomes = Counter(a.outcome for a in attempts)
    assert all(a.state == AttemptState.DONE for a in attempts)
    assert cancelled > 0 and outcomes[Outcome.CANCELLED] >= cancelled
    assert outcomes[Outcome.CANCELLED] < 20


def test_diff_evidence_is_kept_per_execution(store: Store, tmp_path: Path) -> None:
    """Each graded execution keeps the bed's diff report, taken after the verify and before the grade."""
    make_beds(store, tmp_path, 1)
    sweep_id = submit(store, spec(tasks=1, models=1, trials=2)).sweep_id
    _run(store, sweep_id)
    with store.session() as session:
        names = [
            [
                p.name
                for p in session.scalars(
                    select(Phase).where(Phase.execution_id == e.id).order_by(Phase.id)
                )
            ]
            for e in session.scalars(select(Execution))
        ]
        diffs = session.scalars(select(Phase).where(Phase.name == "diff")).all()
    # The judging code is checked before the attempt and again right after the run, before any
    # other ddev command: the escrow set, the DDEV configuration, the trusted verifier.
    # Before the run, nothing of an earlier attempt (runs/, .git, the kept folders, the project's
    # other files: #28); after it, the host files, and at the end the run folder moved off the bed.
    order = ["escrow_check", "ddev_check", "verify_before", "reset", "baseline_diff"]
    order += ["runs_check", "git_clean", "kept_check", "worktree_check", "project_files", "run"]
    order += ["ddev_check_after", "ddev_check_stopped", "host_files", "verify_after", "diff"]
    order += ["grade", "evidence"]
    # The first attempt of the task on this bed baseline pins what its grade reads, before the run.
    first = [*order[:5], "grade_pin", *order[5:]]
    assert names == [first, order]
    assert all('"changed"' in p.stdout for p in diffs)


def test_two_executors_on_one_pool_never_share_a_bed(store: Store, tmp_path: Path) -> None:
    """Two `apg-farm run` of different sweeps on the same beds at once: no bed runs two attempts together."""
    beds = make_beds(store, tmp_path, 2, config={"time_scale": 500})
    first = submit(store, spec("one", tasks=1, models=2, trials=3)).sweep_id
    second = submit(store, spec("two", tasks=1, models=2, trials=3)).sweep_id
    runners = [threading.Thread(target=EmbeddedExecutor(store, s).run) for s in (first, second)]
    for runner in runners:
        runner.start()
    for runner in runners:
        runner.join(timeout=120)
    assert all(a.state == AttemptState.DONE for s in (first, second) for a in _attempts(store, s))
    assert_no_bed_overlap(store, beds)


def test_cancel_during_a_failing_phase_leaves_nothing_queued(store: Store, tmp_path: Path) -> None:
    """An attempt whose phase fails after the cancel ends CANCELLED instead of going back to a dead queue."""
    make_beds(store, tmp_path, 1, faults={0: {"hang": {"command": "ai-eval-run"}}})
    timeouts = Timeouts(verify=30, reset=30, run=1.5, grade=30)
    sweep_id = submit(store, spec(tasks=1, models=1, trials=3, timeouts=timeouts)).sweep_id
    executor = EmbeddedExecutor(store, sweep_id)
    runner = threading.Thread(target=executor.run)
    runner.start()
    while not any(e for e, _ in _executions(store)):
        runner.join(timeout=0.05)
    cancel_sweep(store, sweep_id)
    runner.join(timeout=60)
    assert not runner.is_alive(), "the executor kept waiting for a cancelled sweep"
    attempts = _attempts(store, sweep_id)
    assert {a.outcome for a in attempts} == {Outcome.CANCELLED}
