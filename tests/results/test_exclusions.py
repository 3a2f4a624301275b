"""The exclusion bound (#30, part 5): every attempt that ended INVALID, ERROR or SKIPPED after its
agent started counted as a failure, per cell, model and pair, and a warning when the models (or
the sides of `compare`) excluded different shares. Checked against a row-by-row count of the
store, on SQLite and PostgreSQL; Fisher's p against scipy."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from scipy.stats import fisher_exact
from sqlalchemy import select

from apg_farm.results import (
    analyse,
    compare,
    exclusion_lines,
    exclusion_warnings,
    render_html,
    report_csv,
)
from apg_farm.results.exclusions import EXCLUDED, differ_p
from apg_farm.results.stats import wilson
from apg_farm.store import Attempt, Execution, Store, Sweep
from tests.results.test_second_chance import BEFORE_RUN, _attempt, _bed, _sweep, graded
from tests.support.cli_runner import run_main

TASKS = [f"t{i}" for i in range(1, 7)]


def build(store: Store, name: str, *, excluded: int) -> Sweep:
    """Six tasks, models ma and mb, 2 passed and 2 failed of each per task; ma also has, per
    task, `excluded` attempts that ended ERROR, INVALID or SKIPPED after its agent started and one
    ERROR that never reached the run phase (the farm's alone: never in a bound)."""
    with store.session() as session:
        bed = _bed(session, f"bed-{name}")
        sid = _sweep(session, name, TASKS, ["ma", "mb"])
        for task in TASKS:
            for model in ("ma", "mb"):
                for trial, outcome in enumerate(("PASSED", "PASSED", "FAILED", "FAILED"), 1):
                    _attempt(session, sid, bed, task, model, trial, outcome, [graded(outcome)])
            for index in range(excluded):
                outcome = EXCLUDED[index % len(EXCLUDED)]
                _attempt(session, sid, bed, task, "ma", 10 + index, outcome, [graded(outcome)])
            _attempt(session, sid, bed, task, "ma", 30, "ERROR", [BEFORE_RUN] * 3)
    with store.read() as session:
        sweep = session.get_one(Sweep, sid)
        session.expunge(sweep)
    return sweep


def _excluded_row_by_row(store: Store, sweep_id: int) -> dict[str, int]:
    """Per model: attempts whose outcome is outside every rate and one of whose executions
    started the agent, counted attempt by attempt."""
    found: dict[str, int] = {}
    with store.read() as session:
        for attempt in session.scalars(select(Attempt).where(Attempt.sweep_id == sweep_id)):
            started = session.scalars(
                select(Execution.agent_started).where(Execution.attempt_id == attempt.id)
            ).all()
            if attempt.outcome in EXCLUDED and any(started):
                found[attempt.model] = found.get(attempt.model, 0) + 1
    return found


def _model(report: dict[str, Any], model: str) -> dict[str, Any]:
    [row] = [m for m in report["models"] if m["model"] == model]
    found: dict[str, Any] = row
    return found


def test_the_bound_counts_what_was_excluded_after_the_start(store: Store) -> None:
    sweep = build(store, "ex", excluded=3)
    report = analyse(store, sweep)
    counted = _excluded_row_by_row(store, sweep.id)
    assert counted == {"ma": 18}  # 3 a task; the six that never started are not among them
    for model in ("ma", "mb"):
        row = _model(report, model)
        assert row["excluded_after_start"] == counted.get(model, 0)
        assert row["exclusion_bound_n"] == row["headline_n"] + counted.get(model, 0)
        assert row["exclusion_bound_passed"] == row["headline_passed"] == 12
        bound = 12 / (24 + counted.get(model, 0))
        assert row["exclusion_bound_rate"] == pytest.approx(bound)
        low, high = wilson(12, 24 + counted.get(model, 0))
        assert row["exclusion_bound_ci_low"] == pytest.approx(low)
        assert row["exclusion_bound_ci_high"] == pytest.approx(high)
    # The cells add up to the model row.
    cells = [c for c in report["cells"] if c["model"] == "ma"]
    assert sum(c["excluded_after_start"] for c in cells) == 18
    # The pair: equal headlines (0.5 each), but ma excluded 18 of 42 and mb none.
    [pair] = report["comparisons"]
    found = pair["exclusions"]
    assert found["a"]["exclusion_bound_rate"] == pytest.approx(12 / 42)
    assert found["bound_diff"] == pytest.approx(12 / 42 - 0.5)  # A − B, as the pair's diff
    assert found["p_value"] == pytest.approx(2 * fisher_exact([[24, 18], [24, 0]], "less")[1])
    assert found["p_value"] < 0.05
    [warning] = exclusion_warnings(report["comparisons"])
    assert "ma 18 of 42, mb 0 of 24" in warning and "28.6%" in warning
    [line] = exclusion_lines(report)
    assert line.startswith("ma: 18 of 42") and "would be 28.6%" in line
    # Every format shows it.
    assert "exclusion_bound_rate" in report_csv(report).splitlines()[0]
    html = render_html(report)
    assert "exclusion bound [95% CI]" in html and "exclusions differ" in html


def test_no_warning_when_the_models_exclude_alike(sqlite_only_store: Store) -> None:
    report = analyse(sqlite_only_store, build(sqlite_only_store, "none", excluded=0))
    [pair] = report["comparisons"]
    assert pair["exclusions"]["p_value"] is None and pair["exclusions"]["warning"] is None
    assert _model(report, "ma")["exclusion_bound_rate"] == pytest.approx(0.5)
    assert exclusion_lines(report) == [] and exclusion_warnings(report["comparisons"]) == []
    # One excluded attempt on one side is chance, not a difference worth a warning.
    report = analyse(sqlite_only_store, build(sqlite_only_store, "one", excluded=1))
    assert _model(report, "ma")["excluded_after_start"] == 6
    [pair] = report["comparisons"]
    assert pair["exclusions"]["p_value"] is not None
    assert (pair["exclusions"]["warning"] is None) == (pair["exclusions"]["p_value"] >= 0.05)


def test_compare_bounds_each_side_and_warns_when_they_differ(
    sqlite_only_store: Store, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    before = analyse(sqlite_only_store, build(sqlite_only_store, "before", excluded=0))
    after = analyse(sqlite_only_store, build(sqlite_only_store, "after", excluded=3))
    result = compare(before, after)
    by_model = {row["model"]: row for row in result["models"]}
    ma = by_model["ma"]["exclusions"]
    assert (ma["a"]["excluded_after_start"], ma["b"]["excluded_after_start"]) == (0, 18)
    assert ma["bound_diff"] == pytest.approx(12 / 42 - 0.5)  # B − A, as compare's diff
    assert by_model["mb"]["exclusions"]["warning"] is None
    [warning] = result["exclusion_warnings"]
    assert warning.startswith("ma: exclusions differ: A 0 of 24, B 18 of 42")
    # A baseline promoted before #30 carries no bound: nothing is made up for it.
    for cell in before["cells"]:
        for key in [k for k in cell if k.startswith("exclusion") or k == "excluded_after_start"]:
            del cell[key]
    old = compare(before, after)
    assert all(row["exclusions"] is None for row in old["models"])
    assert old["exclusion_warnings"] == []

    # The commands print them.
    url = sqlite_only_store.url
    monkeypatch.setenv("APG_FARM_DATABASE_URL", url)
    monkeypatch.setenv("COLUMNS", "250")
    out, err = run_main(monkeypatch, capsys, "report", "after")
    assert "exclusion bound:" in out and "ma: 18 of 42 attempts ended INVALID" in out
    assert "exclusions differ: ma 18 of 42, mb 0 of 24" in err
    out, err = run_main(monkeypatch, capsys, "compare", "before", "after")
    assert "ma: exclusions differ: A 0 of 24, B 18 of 42" in err


def test_the_two_sided_fisher_p_is_twice_the_smaller_tail() -> None:
    rng = random.Random(7)
    for _ in range(60):
        n_a, n_b = rng.randint(1, 40), rng.randint(1, 40)
        x_a, x_b = rng.randint(0, n_a), rng.randint(0, n_b)
        table = [[n_a - x_a, x_a], [n_b - x_b, x_b]]
        less, greater = fisher_exact(table, "less")[1], fisher_exact(table, "greater")[1]
        side_a = {"excluded_after_start": x_a, "exclusion_bound_n": n_a}
        side_b = {"excluded_after_start": x_b, "exclusion_bound_n": n_b}
        expected = min(1.0, 2 * min(less, greater))
        assert differ_p(side_a, side_b) == pytest.approx(expected, rel=1e-9, abs=1e-12)


def test_the_bound_survives_a_baseline(sqlite_only_store: Store, tmp_path: Path) -> None:
    """A promoted baseline keeps each cell's bound, so `compare` against it can warn."""
    from apg_farm.results import build_baseline, load_baseline, write_baseline

    report = analyse(sqlite_only_store, build(sqlite_only_store, "base", excluded=2))
    path = write_baseline(build_baseline(report, name="base"), tmp_path)
    doc = load_baseline(path).doc
    assert sum(c["excluded_after_start"] for c in doc["cells"]) == 12
    fresh = analyse(sqlite_only_store, build(sqlite_only_store, "fresh", excluded=0))
    result = compare(doc, fresh)
    assert result["exclusion_warnings"] and result["exclusion_warnings"][0].startswith("ma:")
