"""The fixed-task interval ("this benchmark", #30 part 3) and the sentences a report states once:
which question its intervals answer, and that few tasks carry them. The variance against numpy's
stratified one; coverage of the benchmark's own rate by seeded simulation; the report's fields
and text on a real store."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from apg_farm.results import analyse, render_html
from apg_farm.results.fixed_tasks import (
    ESTIMAND,
    FEW_TASKS,
    Z95,
    difference,
    few_tasks_note,
    paired,
    rate,
)
from apg_farm.store import Store
from tests.results.test_exclusions import build
from tests.support.cli_runner import run_main


def _stratified_se(groups: list[np.ndarray]) -> float:
    """sqrt(sum_g n_g var_g / N^2), var_g numpy's unbiased variance of task g's outcomes."""
    size = sum(len(g) for g in groups)
    return float(np.sqrt(sum(len(g) * np.var(g, ddof=1) for g in groups) / size**2))


def test_the_rate_and_the_paired_difference_equal_numpys_stratified_variance() -> None:
    rng = np.random.default_rng(5)
    for _ in range(20):
        tasks = int(rng.integers(3, 12))
        # Mixed outcomes in every task (2-18 trials), so no task is smoothed.
        outcomes = []
        for _ in range(tasks):
            n = int(rng.integers(2, 19))
            row = (rng.random(n) < rng.random()).astype(float)
            row[0], row[1] = 1.0, 0.0
            outcomes.append(row)
        found = rate([(int(g.sum()), len(g)) for g in outcomes])
        assert found is not None
        pooled = np.concatenate(outcomes).mean()
        assert found["estimate"] == pytest.approx(pooled)
        assert found["se"] == pytest.approx(_stratified_se(outcomes), rel=1e-12)
        assert found["low"] == pytest.approx(max(0.0, pooled - Z95 * found["se"]))
        # A paired difference: a − b in {-1, 0, 1} per (task, trial).
        diffs = [rng.integers(-1, 2, size=int(rng.integers(2, 19))).astype(float) for _ in range(6)]
        tables = [
            (0, int((d == 1).sum()), int((d == -1).sum()), int((d == 0).sum())) for d in diffs
        ]
        got = paired(tables)
        assert got is not None
        assert got["estimate"] == pytest.approx(np.concatenate(diffs).mean())
        assert got["se"] == pytest.approx(_stratified_se(diffs), rel=1e-12)


def test_a_task_whose_outcomes_agree_still_has_a_variance() -> None:
    found = rate([(10, 10)] * 6)
    assert found is not None and found["estimate"] == 1.0
    assert found["se"] > 0 and found["low"] < 1.0 and found["high"] == 1.0
    assert rate([]) is None and rate([(0, 0)]) is None


def test_the_fixed_task_interval_covers_the_benchmarks_own_rate() -> None:
    """Tasks fixed (their true rates drawn once), only trials redrawn: the interval covers the
    trial-weighted mean of the true rates at least 93 % of 2,000 sweeps, pooled and between two
    sweeps; the task-clustered estimand's truth is not what it is asked."""
    rng = random.Random(11)
    rates = [1 / (1 + np.exp(-rng.gauss(0.3, 1.5))) for _ in range(12)]
    trials = [rng.randint(2, 18) for _ in rates]
    truth = sum(p * n for p, n in zip(rates, trials, strict=True)) / sum(trials)
    covered = covered_diff = 0
    sweeps = 2000
    for _ in range(sweeps):
        counts = [
            (sum(rng.random() < p for _ in range(n)), n) for p, n in zip(rates, trials, strict=True)
        ]
        again = [
            (sum(rng.random() < p for _ in range(n)), n) for p, n in zip(rates, trials, strict=True)
        ]
        found = rate(counts)
        assert found is not None
        covered += found["low"] <= truth <= found["high"]
        both = difference([(a[0], a[1], b[0], b[1]) for a, b in zip(counts, again, strict=True)])
        assert both is not None
        covered_diff += both["low"] <= 0 <= both["high"]
    print(
        f"fixed-task coverage: pooled {covered / sweeps:.3f}, difference {covered_diff / sweeps:.3f}"
    )
    assert covered / sweeps >= 0.93, covered / sweeps
    assert covered_diff / sweeps >= 0.93, covered_diff / sweeps


def test_few_tasks_are_said_between_the_clustered_minimum_and_ten() -> None:
    assert few_tasks_note(4) is None  # under 5, each clustered figure says why it is missing
    assert "rest on 6 task(s)" in str(few_tasks_note(6))
    assert few_tasks_note(FEW_TASKS) is None


def test_the_report_states_the_estimand_once_and_the_few_tasks(
    sqlite_only_store: Store, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    report: dict[str, Any] = analyse(sqlite_only_store, build(sqlite_only_store, "six", excluded=0))
    assert report["estimand"] == ESTIMAND
    assert report["few_tasks"] is not None and "rest on 6 task(s)" in report["few_tasks"]
    for row in report["models"]:
        fixed, clustered = row["fixed_tasks"], row["clustered"]
        assert fixed["estimate"] == pytest.approx(clustered["estimate"])
        assert fixed["tasks"] == 6 and fixed["low"] <= fixed["estimate"] <= fixed["high"]
    [pair] = report["comparisons"]
    assert pair["fixed_tasks"]["estimate"] == pytest.approx(pair["diff"])
    html = render_html(report)
    assert 'id="estimand"' in html and 'id="few-tasks"' in html
    monkeypatch.setenv("APG_FARM_DATABASE_URL", sqlite_only_store.url)
    monkeypatch.setenv("COLUMNS", "250")
    out, _ = run_main(monkeypatch, capsys, "report", "six")
    assert out.count("Intervals answer one of two questions") == 1
    assert "few tasks: the task-clustered intervals rest on 6 task(s)" in out
