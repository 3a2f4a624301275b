"""The regression gate on hand-made summaries: each rule of the check policy, one at a time."""

from __future__ import annotations

from typing import Any

import pytest

from apg_farm.results import CheckPolicy, Side, check_regression, compare

M1, M2 = "anthropic/m1", "openai/m2"


def cell(
    task: str,
    model: str,
    passed: int,
    n: int,
    *,
    invalid: int = 0,
    error: int = 0,
    pending: int = 0,
) -> dict[str, Any]:
    return {
        "task": task,
        "model": model,
        "n": n,
        "passed": passed,
        "failed": n - passed,
        "no_attempt": 0,
        "tampered": 0,
        "skipped": 0,
        "invalid": invalid,
        "error": error,
        "pending": pending,
        "cancelled": 0,
        # As analyse writes a cell without re-runs: the headline is the final rate.
        "headline_n": n,
        "headline_passed": passed,
    }


def side(
    cells: list[dict[str, Any]],
    *,
    indispensable: dict[str, float] | None = None,
    problems: tuple[str, ...] = (),
    tree: str = "aa",
) -> Side:
    summary = {
        "sweep": {"name": "s"},
        "outcomes": {},
        "cells": cells,
        "indispensable": indispensable or {},
        "provenance": {"fingerprints": {"grader_tree_sha256": {tree: 1}}},
    }
    return Side("side", "sweep", summary, problems)


def grid(rates: dict[tuple[str, str], tuple[int, int]]) -> list[dict[str, Any]]:
    return [cell(t, m, p, n) for (t, m), (p, n) in rates.items()]


BASE = {("t1", M1): (40, 50), ("t2", M1): (30, 50), ("t1", M2): (20, 50), ("t2", M2): (25, 50)}


def test_identical_results_pass() -> None:
    """A candidate equal to its baseline passes with no finding."""
    verdict = check_regression(side(grid(BASE)), side(grid(BASE)), CheckPolicy())
    assert verdict.ok and verdict.failures == [] and verdict.warnings == []


def test_model_drop_beyond_tolerance_fails_and_names_the_model() -> None:
    """M2 pooled 45% -> 20%: 25 points over a 5-point tolerance, beyond the noise."""
    candidate = {**BASE, ("t1", M2): (8, 50), ("t2", M2): (12, 50)}
    verdict = check_regression(
        side(grid(BASE)), side(grid(candidate)), CheckPolicy(max_rate_drop=0.05)
    )
    assert not verdict.ok
    assert any(f.startswith(f"model {M2}: headline pass rate 45%") for f in verdict.failures)
    assert not any(M1 in f for f in verdict.failures)


def test_drop_within_tolerance_passes() -> None:
    """A 2-point drop is inside a 5-point tolerance; beyond a 0-point one it is within the noise
    (a warning), and --plain-tolerance counts it."""
    candidate = {**BASE, ("t1", M1): (39, 50), ("t2", M1): (29, 50)}
    within = check_regression(
        side(grid(BASE)), side(grid(candidate)), CheckPolicy(max_rate_drop=0.05)
    )
    assert within.ok and within.warnings == []
    noise = check_regression(side(grid(BASE)), side(grid(candidate)), CheckPolicy(max_rate_drop=0))
    assert noise.ok and any("within the noise" in w for w in noise.warnings)
    assert not check_regression(
        side(grid(BASE)),
        side(grid(candidate)),
        CheckPolicy(max_rate_drop=0.0, plain_tolerance=True),
    ).ok


def test_exact_tolerance_is_allowed() -> None:
    """A drop of exactly the tolerance (10/100 -> 5/100 at 0.05) passes despite float noise."""
    base = grid({("t", M1): (10, 100)})
    candidate = grid({("t", M1): (5, 100)})
    assert check_regression(side(base), side(candidate), CheckPolicy(max_rate_drop=0.05)).ok


def test_a_drop_within_the_noise_is_a_warning() -> None:
    """2/3 -> 1/3 is a 33-point drop, but three attempts say little: a warning by default,
    counted with --plain-tolerance."""
    base, candidate = grid({("t", M1): (2, 3)}), grid({("t", M1): (1, 3)})
    default = check_regression(side(base), side(candidate), CheckPolicy())
    assert default.ok and any("within the noise" in w for w in default.warnings)
    plain = check_regression(side(base), side(candidate), CheckPolicy(plain_tolerance=True))
    assert not plain.ok


def test_clear_drop_on_one_task_fails_even_when_the_model_holds() -> None:
    """t1 falls 40/50 -> 10/50 while t2 rises: the pooled rate barely moves, the cell fails."""
    candidate = {**BASE, ("t1", M1): (10, 50), ("t2", M1): (50, 50)}
    verdict = check_regression(
        side(grid(BASE)), side(grid(candidate)), CheckPolicy(max_rate_drop=0.1)
    )
    assert [f for f in verdict.failures if f.startswith(f"t1 {M1}")]
    assert not [f for f in verdict.failures if f.startswith(f"model {M1}")]


def test_invalid_and_error_allowances() -> None:
    """INVALID and ERROR above the allowance fail, naming the cells; within it, pass."""
    cells = grid(BASE)
    cells[0] = cell("t1", M1, 40, 50, invalid=2)
    cells[1] = cell("t2", M1, 30, 50, error=1)
    verdict = check_regression(side(grid(BASE)), side(cells), CheckPolicy())
    assert any("2 INVALID" in f and f"t1 {M1}: 2" in f for f in verdict.failures)
    assert any("1 ERROR" in f for f in verdict.failures)
    assert check_regression(
        side(grid(BASE)), side(cells), CheckPolicy(max_invalid=2, max_error=1)
    ).ok


def test_unfinished_or_missing_candidate_fails() -> None:
    """Queued attempts, a missing cell, or a cell with nothing counted all fail."""
    cells = grid(BASE)
    cells[0] = cell("t1", M1, 40, 50, pending=3)
    assert any(
        "unfinished" in f
        for f in check_regression(side(grid(BASE)), side(cells), CheckPolicy()).failures
    )
    missing = check_regression(side(grid(BASE)), side(grid(BASE)[1:]), CheckPolicy())
    assert any(f"t1 {M1}: in the baseline, not in the candidate" in f for f in missing.failures)
    empty = grid(BASE)
    empty[0] = cell("t1", M1, 0, 0, error=50)
    assert any(
        "no counted attempt" in f
        for f in check_regression(side(grid(BASE)), side(empty), CheckPolicy(max_error=50)).failures
    )


def test_indispensable_task_newly_failing_fails() -> None:
    """t2 at 50%: M1 held it (60%) and drops to 40%, a failure. t1 at 80%: M2 never held it
    (40% in the baseline too), so that is a warning, not a new failure."""
    base = side(grid(BASE), indispensable={"t2": 0.5})
    candidate = {**BASE, ("t2", M1): (20, 50)}
    verdict = check_regression(base, side(grid(candidate)), CheckPolicy(max_rate_drop=1.0))
    assert [f for f in verdict.failures if "indispensable task t2 newly fails" in f and M1 in f]
    strict = side(grid(BASE), indispensable={"t1": 0.8})
    verdict = check_regression(strict, side(grid(BASE)), CheckPolicy())
    assert verdict.ok
    assert any("already failed for openai/m2" in w for w in verdict.warnings)


def test_indispensable_default_means_every_attempt_passes() -> None:
    """A gate given on the command line at 1.0: one failure among 10 breaks a perfect record."""
    base = grid({("t", M1): (10, 10)})
    candidate = grid({("t", M1): (9, 10)})
    verdict = check_regression(
        side(base), side(candidate), CheckPolicy(max_rate_drop=1.0), indispensable={"t": 1.0}
    )
    assert not verdict.ok and "needs 100%" in verdict.failures[0]


def test_evidence_that_does_not_verify_fails() -> None:
    """A problem with either side's evidence fails the check, whatever the rates say."""
    verdict = check_regression(
        side(grid(BASE)), side(grid(BASE), problems=("changed: x",)), CheckPolicy()
    )
    assert verdict.failures == ["evidence does not verify: changed: x"]


def test_changed_fingerprint_is_a_warning() -> None:
    """A different grader tree is reported, not failed: cross-revision runs are often the point."""
    verdict = check_regression(side(grid(BASE)), side(grid(BASE), tree="bb"), CheckPolicy())
    assert verdict.ok
    assert verdict.warnings == ["provenance changed: grader_tree_sha256: aa -> bb"]


def test_compare_pools_only_shared_tasks() -> None:
    """Per model, B − A is computed over the tasks both sides ran, with Newcombe's interval."""
    a = {"cells": grid(BASE)}
    b = {"cells": grid({("t1", M1): (45, 50), ("t3", M1): (0, 50)})}
    result = compare(a, b)
    [row] = result["models"]
    assert row["tasks"] == ["t1"] and row["a"]["n"] == 50 and row["b"]["passed"] == 45
    assert row["diff"] == 0.1 or abs(row["diff"] - 0.1) < 1e-12
    assert row["diff_low"] < row["diff"] < row["diff_high"]
    assert f"t3 {M1}" in result["only_in_b"] and f"t2 {M1}" in result["only_in_a"]


# --- which interval the model-level gate reads (task-clustered by default) -----------------------

#: Eight tasks at 50 % for M1, 100 attempts each.
EIGHT = {(f"t{i}", M1): (50, 100) for i in range(8)}


def test_a_drop_within_the_task_clustered_noise_is_a_warning_unless_plain_tolerance() -> None:
    """M1 drops 7.5 points pooled, but task by task it moves from +30 to -50: the fixed-n
    interval excludes zero, the task-clustered one does not. The check warns by default and
    fails with --plain-tolerance."""
    moves = [30, -50, 20, -40, 10, -30, 20, -20]
    candidate = {(f"t{i}", M1): (50 + move, 100) for i, move in enumerate(moves)}
    base, cand = side(grid(EIGHT)), side(grid(candidate))
    row = compare(base.summary, cand.summary)["models"][0]
    assert row["diff"] == pytest.approx(-0.075) and row["diff_high"] < 0  # Newcombe: significant
    assert row["clustered"]["low"] < 0 < row["clustered"]["high"]

    def model_lines(lines: list[str]) -> list[str]:
        # The tasks that fell clearly fail on their own (rule 6) either way.
        return [line for line in lines if line.startswith(f"model {M1}")]

    default = check_regression(base, cand, CheckPolicy(max_rate_drop=0.05))
    assert model_lines(default.failures) == []
    [warning] = model_lines(default.warnings)
    assert "task-clustered test" in warning and "within the noise" in warning
    plain = check_regression(base, cand, CheckPolicy(max_rate_drop=0.05, plain_tolerance=True))
    [failure] = model_lines(plain.failures)
    assert failure.startswith(f"model {M1}: headline pass rate 50%")
    assert "task-clustered over 8 tasks" in failure


def test_a_drop_on_every_task_fails_on_the_clustered_interval() -> None:
    """The same 7.5-point pooled drop, spread over every task: the clustered interval lies
    below zero and the check fails by default."""
    candidate = {(f"t{i}", M1): (42 + i % 2, 100) for i in range(8)}
    base, cand = side(grid(EIGHT)), side(grid(candidate))
    verdict = check_regression(base, cand, CheckPolicy(max_rate_drop=0.05))
    assert not verdict.ok
    row = verdict.comparison["models"][0]
    assert row["clustered"]["high"] < 0
    assert any("task-clustered over 8 tasks" in f for f in verdict.failures)


def test_under_five_tasks_the_pooled_counts_are_tested_and_it_says_so() -> None:
    """Two tasks give no clustered interval: Fisher's test of the pooled counts decides, and the
    finding says it takes the tasks as independent, and why."""
    candidate = {**BASE, ("t1", M2): (8, 50), ("t2", M2): (12, 50)}
    verdict = check_regression(side(grid(BASE)), side(grid(candidate)), CheckPolicy())
    [failure] = [f for f in verdict.failures if f.startswith(f"model {M2}")]
    assert "pooled, tasks taken as independent (2 task(s)" in failure


def test_every_figure_of_a_pair_is_over_one_task_set() -> None:
    """t5 has no counted attempt in B (all INVALID): it is out of M1's pooled rate, its
    clustered estimate and the gates alike, and the row says why (#30; before, the pooled
    difference kept t5's A side and the clustered one did not)."""
    base = {(f"t{i}", M1): (5 + i, 10) for i in range(6)}
    cand = {(f"t{i}", M1): (4 + i, 10) for i in range(5)}
    cells_b = [*grid(cand), cell("t5", M1, 0, 0, invalid=10)]
    result = compare(side(grid(base)).summary, side(cells_b).summary)
    [row] = result["models"]
    assert row["tasks"] == [f"t{i}" for i in range(5)]
    assert row["left_out"] == [{"task": "t5", "why": "no counted attempt in B"}]
    assert row["a"]["n"] == row["b"]["n"] == 50
    assert row["diff"] == pytest.approx(-0.1)
    assert row["clustered"]["estimate"] == pytest.approx(row["diff"])
