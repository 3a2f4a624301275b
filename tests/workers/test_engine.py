"""The attempt engine on one bed: lost claims, the bed's environment, verification path."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, update

from apg_farm.contract import ALLOWED_BASE_NAMES, ATTEMPT_VARIABLE, FORCED, Outcome
from apg_farm.fixtures import simbed
from apg_farm.scheduler import submit
from apg_farm.store import (
    Attempt,
    AttemptState,
    Bed,
    BedState,
    Execution,
    Phase,
    Store,
    requeue_expired,
)
from apg_farm.transports.strays import MARKER
from apg_farm.workers import AttemptEngine
from apg_farm.workers.engine import _Attempt
from tests.support.simbeds import make_beds, spec


def test_a_claim_lost_mid_attempt_is_counted_once(store: Store, tmp_path: Path) -> None:
    """A bed whose lease expired mid-run records its try as LOST; the attempt has one outcome, from the new holder."""
    make_beds(store, tmp_path, 2, config={"time_scale": 150})
    sweep_id = submit(store, spec(tasks=1, models=1, trials=1)).sweep_id
    # A short lease, renewed every 0.3 s, so the slow bed notices the loss at its next phase.
    slow = AttemptEngine(store, "bed0", worker="slow", lease_seconds=0.9)
    other = AttemptEngine(store, "bed1", worker="other")
    first = threading.Thread(target=slow.run_next, kwargs={"sweep_id": sweep_id})
    first.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with store.session() as session:
            if session.scalar(select(Phase.id).where(Phase.name == "reset")):
                break
        time.sleep(0.02)
    # The lease lapses (a stalled worker, a network partition) and the reconciler takes it back.
    for _ in range(50):  # the slow bed's renewal may slip in between: try again
        with store.session() as session:
            session.execute(update(Attempt).values(lease_expires_at=Attempt.created_at))
        if requeue_expired(store) == 1:
            break
    else:
        pytest.fail("could not expire the lease")
    report = other.run_next(sweep_id=sweep_id)
    first.join(timeout=60)
    assert report is not None and report.outcome in (Outcome.PASSED, Outcome.FAILED)
    with store.session() as session:
        attempt = session.scalars(select(Attempt)).one()
        results = sorted(
            (e.worker or "", e.result or "") for e in session.scalars(select(Execution))
        )
    assert attempt.state == AttemptState.DONE and attempt.outcome == report.outcome
    assert results == [("other", str(report.outcome)), ("slow", "LOST")]
    with store.session() as session:
        lost = session.scalars(select(Execution).where(Execution.worker == "slow")).one()
        names = [
            p.name for p in session.scalars(select(Phase).where(Phase.execution_id == lost.id))
        ]
    # It stopped at the first phase boundary after the loss: it never graded the attempt.
    assert "grade" not in names and lost.finished_at is not None


def test_bed_commands_never_see_farm_settings(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Farm secrets in the worker's environment do not reach any bed command."""
    monkeypatch.setenv("APG_FARM_DATABASE_URL", "postgresql://farm:hunter2@db/farm")
    monkeypatch.setenv("APG_FARM_BROKER_URL", "redis://:hunter2@broker:6379/0")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "hunter2")
    [bed] = make_beds(store, tmp_path, 1)
    sweep_id = submit(store, spec(tasks=1, models=1, trials=1)).sweep_id
    AttemptEngine(store, bed.name, worker="w").run_next(sweep_id=sweep_id)
    with store.session() as session:
        argvs = [p.argv for p in session.scalars(select(Phase))]
    # 11 bed commands, the two evidence moves (runs_check, evidence), the grade at baseline
    # that pins the task's dataset hashes, the listing of the folders reset keeps, and two
    # phases other #28 steps added on i28-trial (the git clean-up among them), and the reading
    # of the agent files before the run a PROJECT_CHANGED claim is judged by (#29), and the
    # listing of the project's other files (worktree_check, #28).
    assert len(argvs) == 19 and not any("hunter2" in " ".join(a) for a in argvs)
    log = simbed.read_log(Path(bed.approot))
    commands = {line["command"] for line in log}
    assert {"ai-eval-reset", "ai-eval-run", "ai-eval-grade"} <= commands
    for line in log:
        names = set(line["env"])
        assert not names & {"APG_FARM_DATABASE_URL", "APG_FARM_BROKER_URL", "AWS_SECRET_ACCESS_KEY"}
        assert {"NO_COLOR", "AI_PG_NO_IMPORT"} <= names
        # Nothing beyond the allow-list, the forced names and the bed's own settings (plus what
        # /bin/sh, which launches the simulated ddev, exports by itself).
        allowed = {
            *ALLOWED_BASE_NAMES,
            *FORCED,
            *bed.env,
            ATTEMPT_VARIABLE,
            "PWD",
            "SHLVL",
            "OLDPWD",
            "_",
            MARKER,
        }
        assert names <= allowed, names - allowed
    run_env = next(set(line["env"]) for line in log if line["command"] == "ai-eval-run")
    assert "APG_FARM_ATTEMPT" in run_env


def test_database_connections_killed_mid_attempt_are_survived(
    pg_store: Store, tmp_path: Path
) -> None:
    """PostgreSQL kills the engine's connections again and again mid-attempt: the writes are retried, recorded once."""
    make_beds(pg_store, tmp_path, 1, config={"time_scale": 100})
    sweep_id = submit(pg_store, spec(tasks=1, models=1, trials=2)).sweep_id
    victim_name = f"victim-{uuid.uuid4().hex[:8]}"
    victim = Store(f"{pg_store.url}&application_name={victim_name}", upgrade=False)
    engine = AttemptEngine(victim, "bed0", worker="victim")
    stop = threading.Event()
    killed: list[int] = []

    def killer() -> None:
        # Every 0.4 s: often enough to cut most phases, rarely enough that a claim (a dozen
        # statements) gets through on a loaded machine; at 0.15 s, under CI's load, none did.
        while not stop.wait(0.4):
            with pg_store.engine.begin() as conn:
                rows = conn.exec_driver_sql(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
                    (victim_name,),
                ).all()
            killed.append(sum(1 for (done,) in rows if done))

    thread = threading.Thread(target=killer)
    thread.start()
    try:
        reports = [engine.run_next(sweep_id=sweep_id), engine.run_next(sweep_id=sweep_id)]
    finally:
        stop.set()
        thread.join()
        victim.dispose()
    assert all(r is not None and r.outcome in (Outcome.PASSED, Outcome.FAILED) for r in reports), [
        (r.outcome, r.verdict.reason) if r else None for r in reports
    ]
    assert sum(killed) >= 3, killed  # the connections were really killed, mid-attempt
    with pg_store.session() as session:
        attempts = session.scalars(select(Attempt)).all()
        executions = session.scalars(select(Execution)).all()
        phases = session.scalars(select(Phase)).all()
    assert [a.state for a in attempts] == [AttemptState.DONE] * 2
    assert len(executions) == 2 and all(e.result in ("PASSED", "FAILED") for e in executions)
    # 14 phases each: escrow and DDEV checks, verify, reset, baseline diff, the runs/ check, the
    # kept-folders check, run,
    # two DDEV checks, verify, diff, grade, the evidence move; and once, before the first run, the
    # grade at baseline that pins the task's dataset hashes (workers/pinning.py); and each the
    # reading of the agent files before the run (`project_files`, #29), and the listing of the
    # project's other files (`worktree_check`, #28).
    assert [p.name for p in phases].count("grade_pin") == 1
    assert [p.name for p in phases].count("project_files") == 2
    assert [p.name for p in phases].count("worktree_check") == 2
    assert len(phases) == 37 and len({(p.execution_id, p.name, p.started_at) for p in phases}) == 37


def test_a_baseline_file_edited_during_the_run_is_tampered_and_left_as_evidence(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent rewrites a baseline file the escrow set keeps a copy of: the verify after the
    run, never with --restore, finds it (TAMPERED, not graded) and leaves it as the agent left
    it for a human to read; only the next attempt's verify --restore repairs it."""
    [bed] = make_beds(store, tmp_path, 1)
    sweep_id = submit(store, spec(tasks=1, models=1, trials=1)).sweep_id
    [baseline] = sorted((Path(bed.approot) / ".ai-proving-ground").glob("baseline.*.json"))
    planted = b'{"planted": "by the agent"}\n'
    run_agent = _Attempt._run_agent

    def agent_edits_baseline(attempt: _Attempt) -> object:
        verdict = run_agent(attempt)
        # What an agent (or a process it left) writes while its run goes on.
        baseline.write_bytes(planted)
        return verdict

    monkeypatch.setattr(_Attempt, "_run_agent", agent_edits_baseline)
    report = AttemptEngine(store, bed.name, worker="w").run_next(sweep_id=sweep_id)
    assert report is not None and report.outcome == Outcome.TAMPERED
    with store.session() as session:
        attempt = session.scalars(select(Attempt)).one()
        phases = {p.name: p for p in session.scalars(select(Phase))}
    assert "APG_ESCROW_MISMATCH" in (attempt.reason or "")
    assert "grade" not in phases
    before, after = phases["verify_before"].argv, phases["verify_after"].argv
    assert before[-1] == "--restore" and before[:-1] == after
    assert "--restore" not in after
    assert baseline.read_bytes() == planted


@pytest.mark.parametrize("named", [True, False], ids=["model-named", "no-dataset"])
def test_a_grade_stamped_for_another_model_is_graded_again_live(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, named: bool
) -> None:
    """The agent rewrote its run record to name another model. With a dataset to name, the
    farm names the attempt's model and the grade refuses the record; with none (neither the
    sweep nor the record names one) the grade with --run stamps the decoy model, which the
    envelope check refuses. Either way the live site is graded again, and the envelope kept
    never names the decoy."""
    import json

    [bed] = make_beds(store, tmp_path, 1, faults={0: {"rewrite_run_json": True}} if named else None)
    sweep = spec(tasks=1, models=1, trials=1)
    if not named:
        sweep = sweep.model_copy(update={"dataset": None})
        phase_result = _Attempt._phase_result

        def record_rewritten(attempt: _Attempt, name: str, *args: Any, **kwargs: Any) -> Any:
            done = phase_result(attempt, name, *args, **kwargs)
            if name == "run":  # before the farm reads the record
                for path in (Path(bed.approot) / ".ai-proving-ground" / "runs").glob("*/run.json"):
                    record = json.loads(path.read_text())
                    record.pop("dataset", None)
                    record["model"] = "decoy/model"
                    path.write_text(json.dumps(record))
            return done

        monkeypatch.setattr(_Attempt, "_phase_result", record_rewritten)
    sweep_id = submit(store, sweep).sweep_id
    report = AttemptEngine(store, bed.name, worker="w").run_next(sweep_id=sweep_id)
    assert report is not None and report.outcome in (Outcome.PASSED, Outcome.FAILED)
    with store.session() as session:
        attempt = session.scalars(select(Attempt)).one()
        execution = session.scalars(select(Execution)).one()
        grades = [p.argv for p in session.scalars(select(Phase).where(Phase.name == "grade"))]
    assert len(grades) == 2
    assert any(a.startswith("--run=") for a in grades[0])
    assert not any(a.startswith("--run=") for a in grades[1])
    assert execution.envelope is not None
    info = json.loads(execution.envelope)["model_info"]
    assert "decoy" not in info["id"] and "decoy" not in info["name"]
    if named:
        assert attempt.model in (info["id"], info["name"])


def test_a_verifier_broken_during_the_run_is_counted_against_the_agent(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trusted verifier reports the bed broken after the run (its escrow set incomplete):
    before the run that would be the bed's failure, retried elsewhere; once the agent ran it may
    be the agent's doing, so the attempt is TAMPERED (not graded) and the bed still quarantined."""
    [bed] = make_beds(store, tmp_path, 1)
    sweep_id = submit(store, spec(tasks=1, models=1, trials=1)).sweep_id
    assert bed.escrow_set is not None
    run_agent = _Attempt._run_agent

    def agent_breaks_the_verifier(attempt: _Attempt) -> object:
        verdict = run_agent(attempt)
        (Path(bed.escrow_set or "") / "baseline.dir").unlink()
        return verdict

    monkeypatch.setattr(_Attempt, "_run_agent", agent_breaks_the_verifier)
    report = AttemptEngine(store, bed.name, worker="w").run_next(sweep_id=sweep_id)
    assert report is not None and report.outcome == Outcome.TAMPERED
    with store.session() as session:
        attempt = session.scalars(select(Attempt)).one()
        row = session.scalars(select(Bed)).one()
    assert attempt.state == AttemptState.DONE and "APG_ESCROW_NONE" in (attempt.reason or "")
    assert "counted against it" in (attempt.reason or "")
    assert row.state == BedState.QUARANTINED
