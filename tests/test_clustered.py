"""Task-clustered intervals (apg_farm/results/clustered.py): the estimator against an independent
matrix computation, the t quantile against printed tables, and a seeded coverage study."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from apg_farm.results.clustered import (
    MIN_TASKS,
    Clustered,
    TooFewTasks,
    clustered_mean,
    t_quantile,
)
from apg_farm.results.stats import wilson

# Student's t, two-sided 95 % (0.975 quantile), from printed tables.
T_TABLE = {1: 12.7062047, 2: 4.3026527, 4: 2.7764451, 9: 2.2621572, 19: 2.0930241, 100: 1.9839715}


@pytest.mark.parametrize(("df", "value"), sorted(T_TABLE.items()))
def test_the_t_quantile_matches_the_tables(df: int, value: float) -> None:
    assert t_quantile(0.975, df) == pytest.approx(value, abs=1e-6)
    assert t_quantile(0.025, df) == pytest.approx(-value, abs=1e-6)


def _cr2_by_matrices(groups: list[list[float]]) -> float:
    """CR2 for the intercept-only model, computed the long way: (I - H_gg)^(-1/2) by eigen
    decomposition, the sandwich by matrix products."""
    y = np.concatenate([np.array(g, dtype=float) for g in groups])
    x = np.ones((len(y), 1))
    bread = np.linalg.inv(x.T @ x)
    residuals = y - x @ (bread @ x.T @ y)
    meat = np.zeros((1, 1))
    start = 0
    for g in groups:
        rows = slice(start, start + len(g))
        start += len(g)
        xg = x[rows]
        h = xg @ bread @ xg.T
        values, vectors = np.linalg.eigh(np.eye(len(g)) - h)
        adjust = vectors @ np.diag(1 / np.sqrt(values)) @ vectors.T
        u = xg.T @ adjust @ residuals[rows]
        meat += np.outer(u, u)
    return float(np.sqrt((bread @ meat @ bread)[0, 0]))


def test_the_standard_error_is_cr2() -> None:
    rng = random.Random(7)
    for _ in range(20):
        groups = [
            [float(rng.random() < 0.6) for _ in range(rng.randint(1, 12))]
            for _ in range(rng.randint(MIN_TASKS, 15))
        ]
        got = clustered_mean(groups)
        assert isinstance(got, Clustered)
        assert got.se == pytest.approx(_cr2_by_matrices(groups), rel=1e-9)
        assert got.df == len(groups) - 1 and got.n == sum(map(len, groups))
        assert got.low <= got.estimate <= got.high


def test_too_few_tasks_give_no_interval() -> None:
    got = clustered_mean([[1.0, 0.0]] * (MIN_TASKS - 1))
    assert isinstance(got, TooFewTasks) and "at least" in str(got)


def _sweep(
    rng: random.Random, tasks: int, trials: int
) -> tuple[list[list[float]], list[list[float]], float, float]:
    """One synthetic sweep of two models: task difficulty varies (Beta(1, 1)), model B is the
    same task's rate pulled down, their outcomes on a cell correlated through the task."""
    a_groups, d_groups = [], []
    for _ in range(tasks):
        p = rng.random()
        q = max(0.0, p - 0.1)
        a_cells, d_cells = [], []
        for _ in range(trials):
            u = rng.random()  # one draw for both: correlated within the cell
            a, b = float(u < p), float(u < q)
            a_cells.append(a)
            d_cells.append(a - b)
        a_groups.append(a_cells)
        d_groups.append(d_cells)
    return a_groups, d_groups, 0.5, _true_difference()


def _true_difference() -> float:
    # E[p - max(0, p - 0.1)] for p ~ U(0, 1): 0.1 - 0.1^2 / 2
    return 0.1 - 0.005


def test_coverage_of_the_clustered_interval_against_the_naive_one() -> None:
    """2000 seeded sweeps of 20 tasks x 10 trials: the clustered 95 % intervals of the pooled
    rate and of the paired difference cover the truth in >= 93 % of them; the naive binomial
    interval of the pooled rate falls well short."""
    rng = random.Random(2024)
    sweeps, covered_rate, covered_diff, covered_naive = 2000, 0, 0, 0
    for _ in range(sweeps):
        a_groups, d_groups, truth, diff = _sweep(rng, tasks=20, trials=10)
        rate = clustered_mean(a_groups)
        paired = clustered_mean(d_groups, bounds=(-1, 1))
        assert isinstance(rate, Clustered) and isinstance(paired, Clustered)
        covered_rate += rate.low <= truth <= rate.high
        covered_diff += paired.low <= diff <= paired.high
        passed = int(sum(map(sum, a_groups)))
        low, high = wilson(passed, 200)
        covered_naive += low <= truth <= high
    assert covered_rate / sweeps >= 0.93, covered_rate / sweeps
    assert covered_diff / sweeps >= 0.93, covered_diff / sweeps
    assert covered_naive / sweeps < 0.80, covered_naive / sweeps
    assert math.isfinite(covered_rate)
