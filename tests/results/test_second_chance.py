"""The second-chance bias (DESIGN decision 9, issue 18): re-runs after the agent started, by kind,
and the lower-bound pass rate that counts every attempt with one as a failure, in every report
format, in compare and behind `check --max-rerun-share`; the migration's backfill; and a real
embedded sweep whose run the farm retries after the adapter "never started"."""

from __future__ import annotations

import csv
import io
import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from apg_farm.cli.analysis import second_chance_table
from apg_farm.errors import BadInput
from apg_farm.results import (
    analyse,
    compare,
    parse_rerun_share,
    render_html,
    report_csv,
    rerun_share_findings,
)
from apg_farm.results.second_chance import (
    KINDS,
    SECOND_CHANCE_KINDS,
    rerun_kind,
    rerun_kind_sql,
)
from apg_farm.results.stats import wilson
from apg_farm.scheduler import submit
from apg_farm.store import Attempt, AttemptState, Bed, Execution, Phase, Store, Sweep, utcnow
from apg_farm.workers import EmbeddedExecutor
from tests.support.cli_runner import run_main
from tests.support.simbeds import make_beds, spec

#: (reason, result, provider_trouble) -> kind: the engine's and the policy's own reason texts.
REASONS: list[tuple[str | None, str, str | None, str]] = [
    (
        "provider trouble (rate_limited): the adapter's record says the provider failed and the "
        "site is unchanged (agent failed: APG_CLAUDE_FAILED result is_error)",
        "RETRY",
        "rate_limited",
        "provider_trouble",
    ),
    (
        "run: adapter could not start: APG_CLAUDE_INSTALL_FAILED npm",
        "RETRY",
        None,
        "adapter_not_started",
    ),
    (
        "run: run.json says the adapter never started (exit 127); the site is unchanged: the "
        "adapter never started",
        "RETRY",
        None,
        "adapter_not_started",
    ),
    (
        "run failed before the adapter started (exit 2, no run record)",
        "RETRY",
        None,
        "adapter_not_started",
    ),
    ("run: APG_CLAUDE_NO_TOKEN no token", "RETRY", None, "adapter_not_started"),
    ("run: no result before the sweep's run timeout", "RETRY", None, "timeout_or_transport"),
    ("verify: transport failed: ssh: connection reset", "RETRY", None, "timeout_or_transport"),
    ("grade: DDEV could not start the project", "RETRY", None, "timeout_or_transport"),
    ("grade could not run (exit 2)", "RETRY", None, "grade_failed"),
    ("lease expired: the bed or its worker stopped answering", "LOST", None, "lease_lost"),
    ("anything at all", "LOST", "overloaded", "lease_lost"),
    # The farm's kinds are never read from text (rerun_kinds.py): stored when the re-run ended.
    ("farm error: OperationalError: server closed the connection", "RETRY", None, "other"),
    ("run: APG_X; reproduced by the farm's check: retried", "RETRY", None, "adapter_not_started"),
    ("verify_after: transport failed: reset", "RETRY", None, "timeout_or_transport"),
    ("PROVIDER TROUBLE: upper case is the same", "RETRY", None, "provider_trouble"),
    ("something new (100%_sure)", "RETRY", None, "other"),
    (None, "RETRY", None, "other"),
    ("verify before the attempt failed (exit 1)", "RETRY", "api_error", "provider_trouble"),
]


def test_rerun_kind_classifies_the_reasons() -> None:
    for reason, result, trouble, kind in REASONS:
        assert rerun_kind(result, trouble, reason) == kind, reason
        assert kind in KINDS


def test_a_stored_kind_wins_and_text_never_names_the_farms() -> None:
    for kind in KINDS:
        # The kind the farm stored, whatever the text says; LOST is a lost lease regardless,
        # the farm's unless stored as lost on the worker's host (rerun_kinds.lost_kind).
        assert rerun_kind("RETRY", None, "provider trouble", kind) == kind
        lost = "lost_on_host" if kind == "lost_on_host" else "lease_lost"
        assert rerun_kind("LOST", None, "farm error", kind) == lost
    # An unknown stored value is not believed: the text's agent kind, or other.
    assert rerun_kind("RETRY", None, "farm error: x", "farm_errorz") == "other"
    for reason, result, trouble, _ in REASONS:
        if result == "RETRY":
            assert rerun_kind(result, trouble, reason) in SECOND_CHANCE_KINDS, reason


# --- a store built by hand ------------------------------------------------------------------------


#: One execution: (result, agent_started, reason, provider_trouble), and the kind the farm
#: stored when it ended, for a re-run of one of the farm's kinds (contract/rerun_kinds.py).
Try = (
    tuple[str | None, bool, str | None, str | None]
    | tuple[str | None, bool, str | None, str | None, str]
)


def _bed(session: Any, name: str = "b0") -> int:
    bed = Bed(name=name, approot="/x", fixtures=[], pool="p")
    session.add(bed)
    session.flush()
    return bed.id


def _sweep(session: Any, name: str, tasks: list[str], models: list[str]) -> int:
    sweep = Sweep(
        name=name,
        spec={"tasks": tasks, "models": models, "trials": 9},
        spec_sha256="x" * 64,
        pool="p",
        state="open",
    )
    session.add(sweep)
    session.flush()
    return sweep.id


def _attempt(
    session: Any,
    sweep_id: int,
    bed_id: int,
    task: str,
    model: str,
    trial: int,
    outcome: str | None,
    tries: list[Try],
) -> None:
    """An attempt with its executions: (result, agent_started, reason, provider_trouble)."""
    attempt = Attempt(
        sweep_id=sweep_id,
        task=task,
        model=model,
        trial=trial,
        seq=trial,
        pool="p",
        state=AttemptState.DONE if outcome else AttemptState.QUEUED,
        outcome=outcome,
        infra_failures=0,
        deliveries=len(tries),
        excluded_beds=[],
    )
    session.add(attempt)
    session.flush()
    t0 = utcnow()
    for number, (result, started, reason, trouble, *recorded) in enumerate(tries, 1):
        execution = Execution(
            attempt_id=attempt.id,
            bed_id=bed_id,
            number=number,
            result=result,
            reason=reason,
            rerun_kind=recorded[0] if recorded else None,
            provider_trouble=trouble,
            agent_started=started,
            finished_at=t0,
        )
        session.add(execution)
        session.flush()
        if started:
            session.add(
                Phase(
                    execution_id=execution.id,
                    name="run",
                    argv=["ddev", "ai-eval-run"],
                    started_at=t0,
                    finished_at=t0 + timedelta(seconds=1),
                    duration=1.0,
                )
            )


PROVIDER = ("RETRY", True, "provider trouble (rate_limited): ...", "rate_limited")
NOT_STARTED = ("RETRY", True, "run: run.json says ...: the adapter never started", None)
BEFORE_RUN = ("RETRY", False, "reset: transport failed: gone", None)
LOST = ("LOST", True, "lease expired: the bed or its worker stopped answering", None)


def graded(outcome: str) -> Try:
    return (outcome, True, "graded", None)


def build(store: Store, name: str = "sc") -> int:
    """Task t1 and t2, models ma and mb; what each attempt went through is in the comments."""
    with store.session() as session:
        bed = _bed(session)
        sid = _sweep(session, name, ["t1", "t2"], ["ma", "mb"])

        def add(task: str, model: str, trial: int, outcome: str | None, tries: list[Try]) -> None:
            _attempt(session, sid, bed, task, model, trial, outcome, tries)

        # t1 ma: 4 counted; one PASSED after a provider-trouble re-run, one PASSED after a retry
        # before the run (not a second chance), one PASSED clean, one FAILED clean.
        add("t1", "ma", 1, "PASSED", [PROVIDER, graded("PASSED")])
        add("t1", "ma", 2, "PASSED", [BEFORE_RUN, graded("PASSED")])
        add("t1", "ma", 3, "PASSED", [graded("PASSED")])
        add("t1", "ma", 4, "FAILED", [graded("FAILED")])
        # t1 ma: ERROR after three re-runs after the agent started: added to the lower bound's n.
        add("t1", "ma", 5, "ERROR", [NOT_STARTED, NOT_STARTED, PROVIDER])
        # t1 ma: ERROR with only pre-run failures: outside both rates.
        add("t1", "ma", 6, "ERROR", [BEFORE_RUN, BEFORE_RUN, BEFORE_RUN])
        # t2 ma: PASSED after a lost lease mid-run; SKIPPED after a re-run: left out.
        add("t2", "ma", 1, "PASSED", [LOST, graded("PASSED")])
        add("t2", "ma", 2, "SKIPPED", [PROVIDER, ("SKIPPED", True, "skip", None)])
        # t1 mb: clean; one INVALID after a re-run (added), one still queued after a re-run.
        add("t1", "mb", 1, "PASSED", [graded("PASSED")])
        add("t1", "mb", 2, "INVALID", [NOT_STARTED, ("INVALID", True, "bad", None)])
        add("t1", "mb", 3, None, [PROVIDER])
    return sid


@pytest.fixture
def report(store: Store) -> dict[str, Any]:
    sid = build(store)
    with store.read() as session:
        sweep = session.get_one(Sweep, sid)
        session.expunge(sweep)
    return analyse(store, sweep)


def _cell(report: dict[str, Any], task: str, model: str) -> dict[str, Any]:
    [cell] = [c for c in report["cells"] if (c["task"], c["model"]) == (task, model)]
    found: dict[str, Any] = cell
    return found


def test_figures_per_cell_model_and_sweep(report: dict[str, Any]) -> None:
    """On SQLite and PostgreSQL: the re-runs by kind, the attempts with one, and the lower bound."""
    t1a = _cell(report, "t1", "ma")
    assert (t1a["n"], t1a["passed"]) == (4, 3)
    assert t1a["started_attempts"] == 5  # trial 6 never reached the run phase
    assert t1a["rerun_attempts"] == 2  # trials 1 and 5
    assert t1a["reruns"] == 4
    assert t1a["reruns_by_kind"] == {"provider_trouble": 2, "adapter_not_started": 2}
    # Trial 1's pass is a failure; trial 5 (ERROR) joins the denominator.
    assert (t1a["lower_bound_passed"], t1a["lower_bound_n"]) == (2, 5)
    assert t1a["lower_bound_rate"] == pytest.approx(0.4)
    low, high = wilson(2, 5)
    assert (t1a["lower_bound_ci_low"], t1a["lower_bound_ci_high"]) == (
        pytest.approx(low),
        pytest.approx(high),
    )
    assert t1a["rerun_share"] == pytest.approx(2 / 5)

    t2a = _cell(report, "t2", "ma")
    assert t2a["reruns_by_kind"] == {"provider_trouble": 1, "lease_lost": 1}
    assert (t2a["rerun_attempts"], t2a["started_attempts"]) == (2, 2)
    # The SKIPPED attempt is in neither denominator; the pass after a lost lease is a failure.
    assert (t2a["n"], t2a["lower_bound_passed"], t2a["lower_bound_n"]) == (1, 0, 1)

    t1b = _cell(report, "t1", "mb")
    assert (t1b["n"], t1b["passed"], t1b["pending"]) == (1, 1, 1)
    assert (t1b["rerun_attempts"], t1b["started_attempts"], t1b["reruns"]) == (2, 3, 2)
    # The INVALID one is added; the queued one is not finished, so not added.
    assert (t1b["lower_bound_passed"], t1b["lower_bound_n"]) == (1, 2)

    models = {m["model"]: m for m in report["models"]}
    assert (models["ma"]["lower_bound_passed"], models["ma"]["lower_bound_n"]) == (2, 6)
    assert models["ma"]["reruns_by_kind"] == {
        "provider_trouble": 3,
        "adapter_not_started": 2,
        "lease_lost": 1,
    }
    assert (models["ma"]["rerun_attempts"], models["ma"]["started_attempts"]) == (4, 7)
    assert (models["mb"]["lower_bound_passed"], models["mb"]["lower_bound_n"]) == (1, 2)

    sweep = report["second_chance"]
    assert (sweep["rerun_attempts"], sweep["started_attempts"], sweep["reruns"]) == (6, 10, 8)
    assert sweep["rerun_share"] == pytest.approx(0.6)
    assert (sweep["lower_bound_passed"], sweep["lower_bound_n"]) == (3, 8)
    # The headline counts only the re-runs the agent could have bought (not t2 ma's lost lease):
    # passes 5 - 1 (t1 ma trial 1), n 6 + 2 (t1 ma trial 5's ERROR, t1 mb trial 2's INVALID).
    assert (sweep["headline_passed"], sweep["headline_n"]) == (4, 8)
    assert sweep["pass_rate"] == pytest.approx(0.5)
    assert sweep["final_rate"] == pytest.approx(5 / 6)
    assert (t1a["headline_passed"], t1a["headline_n"], t1a["pass_rate"]) == (2, 5, 0.4)
    assert t1a["final_rate"] == pytest.approx(3 / 4)
    # t2 ma's pass after a lost lease is the farm's re-run: the headline keeps it.
    assert (t2a["second_chance_attempts"], t2a["pass_rate"], t2a["lower_bound_rate"]) == (1, 1, 0)
    assert json.loads(json.dumps(report, default=str))["second_chance"]["reruns"] == 8


def test_the_sql_case_agrees_with_the_function(store: Store) -> None:
    """rerun_kind_sql is rerun_kind, on both backends (case, LIKE wildcards in the text)."""
    with store.session() as session:
        bed = _bed(session)
        sid = _sweep(session, "kinds", ["t"], ["m"])
        for trial, (reason, result, trouble, _) in enumerate(REASONS):
            _attempt(
                session, sid, bed, "t", "m", trial, "PASSED", [(result, True, reason, trouble)]
            )
        # Stored kinds, beside text that names another kind (and an unknown stored value).
        stored = [(kind, "provider trouble (x)") for kind in KINDS] + [("bogus", "farm error")]
        for trial, (kind, reason) in enumerate(stored, len(REASONS)):
            _attempt(
                session, sid, bed, "t", "m", trial, "PASSED", [("RETRY", True, reason, None, kind)]
            )
    with store.read() as session:
        rows = session.execute(
            sa.select(
                Execution.reason,
                Execution.result,
                Execution.provider_trouble,
                Execution.rerun_kind,
                rerun_kind_sql(),
            ).order_by(Execution.id)
        ).all()
    expected = [kind for *_, kind in REASONS] + [*KINDS, "other"]
    assert [kind for *_, kind in rows] == expected
    assert [rerun_kind(r, t, why, k) for why, r, t, k, _ in rows] == expected


def test_every_format_states_it(report: dict[str, Any]) -> None:
    rows = {(r["task"], r["model"]): r for r in csv.DictReader(io.StringIO(report_csv(report)))}
    row = rows[("t1", "ma")]
    assert (row["rerun_attempts"], row["reruns"], row["lower_bound_n"]) == ("2", "4", "5")
    assert (row["reruns_provider_trouble"], row["reruns_adapter_not_started"]) == ("2", "2")
    assert row["reruns_other"] == "0" and float(row["lower_bound_rate"]) == pytest.approx(0.4)
    page = render_html(report)
    for marker in ("second-chance-models-table", "second-chance-cells-table", 'id="rerun-share"'):
        assert marker in page
    assert "6 of 10 attempts that reached the run phase" in page and "60.0%" in page
    from rich.console import Console

    console = Console(width=250, record=True)
    console.print(second_chance_table(report))
    text = console.export_text()
    assert "re-run share 60.0%: 6 of 10" in text
    assert "provider_trouble 3, adapter_not_started 2, lease_lost 1" in text
    assert "33% [" in text  # ma's lower bound, 2 of 6


def test_compare_carries_both_sides(report: dict[str, Any]) -> None:
    result = compare(report, report)
    [ma] = [m for m in result["models"] if m["model"] == "ma"]
    assert ma["a"]["rerun_attempts"] == ma["b"]["rerun_attempts"] == 4
    assert ma["b"]["lower_bound_rate"] == pytest.approx(2 / 6)
    assert result["second_chance"]["b"]["rerun_share"] == pytest.approx(0.6)
    # A baseline without the figures: unknown, never zero.
    old = {
        **report,
        "cells": [
            {k: v for k, v in c.items() if "rerun" not in k and "lower" not in k}
            for c in report["cells"]
        ],
    }
    old.pop("second_chance")
    result = compare(old, report)
    assert result["models"][0]["a"]["rerun_attempts"] is None
    assert result["second_chance"]["a"]["rerun_share"] is None
    assert rerun_share_findings(old, 0.1) == (
        [],
        ["rerun_share unknown in the candidate (not recorded); not checked"],
    )


def test_parse_rerun_share() -> None:
    assert parse_rerun_share(None) is None
    assert parse_rerun_share("0") == 0.0 and parse_rerun_share("1") == 1.0
    assert parse_rerun_share(" 0.25 ") == 0.25
    for bad in ("-0.01", "1.01", "nan", "inf", "", "lots"):
        with pytest.raises(BadInput) as error:
            parse_rerun_share(bad)
        assert error.value.field == "--max-rerun-share"


def test_backfill_marks_executions_with_a_run_phase(tmp_path: Path) -> None:
    """Migration 0009: an execution that recorded a run phase started its agent; others did not."""
    from alembic import command

    from apg_farm.store.db import _alembic_config

    url = f"sqlite:///{tmp_path / 'old.db'}"
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        command.upgrade(_alembic_config(conn), "0008")
        conn.exec_driver_sql(
            "INSERT INTO sweeps (name, spec, spec_sha256, pool, state, created_at) "
            "VALUES ('old', '{}', 'x', 'p', 'open', '2026-01-01 00:00:00')"
        )
        conn.exec_driver_sql(
            "INSERT INTO beds (name, transport, approot, ddev, fixtures, pool, env, state,"
            " consecutive_errors, created_at, updated_at) VALUES ('b', 'local', '/x', 'ddev',"
            " '[]', 'p', '{}', 'active', 0, '2026-01-01 00:00:00', '2026-01-01 00:00:00')"
        )
        conn.exec_driver_sql(
            "INSERT INTO attempts (sweep_id, task, model, trial, seq, pool, state, infra_failures,"
            " deliveries, excluded_beds, created_at) VALUES (1, 't', 'm', 1, 0, 'p', 'done', 0, 0,"
            " '[]', '2026-01-01 00:00:00')"
        )
        for number in (1, 2):
            conn.exec_driver_sql(
                "INSERT INTO executions (attempt_id, bed_id, number, started_at, result) VALUES"
                f" (1, 1, {number}, '2026-01-01 00:00:00', 'RETRY')"
            )
        for name in ("reset", "run"):
            conn.exec_driver_sql(
                "INSERT INTO phases (execution_id, name, argv, tokens, started_at, finished_at,"
                " duration, timed_out, stdout, stdout_bytes, stdout_truncated, stderr,"
                " stderr_bytes, stderr_truncated) VALUES (2, ?, '[]', '[]',"
                " '2026-01-01 00:00:00', '2026-01-01 00:00:01', 1, 0, '', 0, 0, '', 0, 0)",
                (name,),
            )
        conn.exec_driver_sql(
            "INSERT INTO phases (execution_id, name, argv, tokens, started_at, finished_at,"
            " duration, timed_out, stdout, stdout_bytes, stdout_truncated, stderr,"
            " stderr_bytes, stderr_truncated) VALUES (1, 'reset', '[]', '[]',"
            " '2026-01-01 00:00:00', '2026-01-01 00:00:01', 1, 0, '', 0, 0, '', 0, 0)"
        )
    store = Store(url)
    with store.read() as session:
        found = session.execute(
            sa.select(Execution.number, Execution.agent_started).order_by(Execution.number)
        ).all()
    assert [tuple(row) for row in found] == [(1, False), (2, True)]


# --- a real sweep: the adapter "never started" after the run phase began, once ---------------------


def test_an_embedded_sweep_reports_its_rerun_and_gates_on_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """bed0's first run says the adapter never started (site unchanged), and the farm's own
    check fails the same way: the farm retries it on bed1, which passes or fails it. The report's JSON shows the re-run after the agent started
    and the lower bound; `check --max-rerun-share` fails below the share and passes at it."""
    home = tmp_path / "home"
    home.mkdir()
    store = Store(f"sqlite:///{home / 'farm.db'}")
    make_beds(store, home / "sim", 2, faults={0: {"not_started": {"times": 2}}})
    sweep_id = submit(store, spec("sc", tasks=1, models=1, trials=2)).sweep_id
    result = EmbeddedExecutor(store, sweep_id).run()
    assert not result.errors and not result.stranded, result
    with store.read() as session:
        rows = session.execute(
            sa.select(
                Execution.result,
                Execution.reason,
                Execution.agent_started,
                sa.exists().where(Phase.execution_id == Execution.id, Phase.name == "run"),
            )
        ).all()
    # The engine's flag is what the phases show, for every execution.
    assert all(started == has_run for _, _, started, has_run in rows), rows
    [retry] = [r for r in rows if r[0] == "RETRY"]
    assert retry[2] is True and "never started" in str(retry[1])

    for name in ("APG_FARM_DATABASE_URL", "APG_FARM_BROKER_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("APG_FARM_HOME", str(home))
    monkeypatch.setenv("COLUMNS", "250")
    out, _ = run_main(monkeypatch, capsys, "report", "sc", "--format", "json")
    report = json.loads(out)
    [cell] = report["cells"]
    assert cell["n"] == 2
    assert (cell["rerun_attempts"], cell["reruns"], cell["started_attempts"]) == (1, 1, 2)
    # The farm's own check (ai-eval-claude check) failed too: a re-run the farm reproduced.
    assert cell["reruns_by_kind"] == {"farm_reproduced": 1}
    # The retried attempt counts as a failure whatever it scored on bed1.
    assert cell["lower_bound_n"] == 2
    assert cell["lower_bound_passed"] == cell["passed"] - (
        1 if _retried_passed(store, sweep_id) else 0
    )
    assert report["second_chance"]["rerun_share"] == pytest.approx(0.5)

    out, _ = run_main(monkeypatch, capsys, "report", "sc")
    assert "second-chance bias" in out and "re-run share 50.0%: 1 of 2" in out

    loose = ["--max-rate-drop", "1"]
    out, _ = run_main(
        monkeypatch, capsys, "check", "sc", "sc", *loose, "--max-rerun-share", "0.4", code=1
    )
    assert "FAIL: rerun_share 50.0% (1 of 2 attempts" in out
    assert "exceeds --max-rerun-share 0.4" in out and "check failed: 1 finding(s)" in out
    out, _ = run_main(monkeypatch, capsys, "check", "sc", "sc", *loose, "--max-rerun-share", "0.5")
    assert "check passed" in out
    for bad in ("1.5", "-0.1", "half"):
        _, err = run_main(
            monkeypatch, capsys, "check", "sc", "sc", f"--max-rerun-share={bad}", code=2
        )
        assert "--max-rerun-share" in err and "fraction" in err
    out, _ = run_main(monkeypatch, capsys, "compare", "sc", "sc")
    assert "second-chance bias per model" in out and "rerun_share: A 50.0%, B 50.0%" in out


def _retried_passed(store: Store, sweep_id: int) -> bool:
    with store.read() as session:
        outcome = session.scalar(
            sa.select(Attempt.outcome)
            .join(Execution, Execution.attempt_id == Attempt.id)
            .where(Attempt.sweep_id == sweep_id, Execution.result == "RETRY")
        )
    return outcome == "PASSED"
