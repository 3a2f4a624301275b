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
    clustered_difference,
    clustered_mean,
    t_quantile,
    two_sided_p,
)
from apg_farm.results.stats import paired_comparison, wilson

# Student's t, two-sided 95 % (0.975 quantile), from printed tables.
T_TABLE = {1: 12.7062047, 2: 4.3026527, 4: 2.7764451, 9: 2.2621572, 19: 2.0930241, 100: 1.9839715}


@pytest.mark.parametrize(("df", "value"), sorted(T_TABLE.items()))
def test_the_t_quantile_matches_the_tables(df: int, value: float) -> None:
    assert t_quantile(0.975, df) == pytest.approx(value, abs=1e-6)
    assert t_quantile(0.025, df) == pytest.approx(-value, abs=1e-6)


@pytest.mark.parametrize(("df", "value"), sorted(T_TABLE.items()))
def test_the_clustered_p_value_at_the_tables_critical_value_is_five_percent(
    df: int, value: float
) -> None:
    at = Clustered(value, 1.0, 0.0, 0.0, df + 1, 100, df)
    assert two_sided_p(at) == pytest.approx(0.05, abs=1e-6)
    assert two_sided_p(Clustered(-2 * value, 2.0, 0.0, 0.0, df + 1, 100, df)) == pytest.approx(
        0.05, abs=1e-6
    )


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
        x = np.ones((sum(map(len, groups)), 1))
        cluster = np.repeat(np.arange(len(groups)), [len(g) for g in groups])
        assert got.df == pytest.approx(_bm_df_by_matrices(x, cluster, np.array([1.0])), rel=1e-9)
        assert got.n == sum(map(len, groups))
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


def test_paired_difference_coverage_when_the_effect_differs_by_task() -> None:
    """The paired difference when B's gap to A differs by task (uniform in [-0.15, 0.25], mean
    0.05), 20 tasks x 10 trials: the clustered interval covers the mean gap in >= 93 % of 2000
    seeded sweeps; Newcombe's paired interval, which takes every pair as independent, does not."""
    rng = random.Random(11)
    sweeps, clustered, naive = 2000, 0, 0
    for _ in range(sweeps):
        groups, pairs = [], []
        for _ in range(20):
            p = rng.uniform(0.3, 0.7)
            q = p - rng.uniform(-0.15, 0.25)
            cells = []
            for _ in range(10):
                u = rng.random()
                a, b = u < p, u < q
                cells.append(float(a) - float(b))
                pairs.append((a, b))
            groups.append(cells)
        got = clustered_mean(groups, bounds=(-1, 1))
        assert isinstance(got, Clustered)
        clustered += got.low <= 0.05 <= got.high
        interval = paired_comparison(pairs).difference
        naive += interval.low <= 0.05 <= interval.high
    assert clustered / sweeps >= 0.93, clustered / sweeps
    assert naive / sweeps < 0.85, naive / sweeps


def _cr2_difference_by_matrices(tasks: list[tuple[list[float], list[float]]]) -> float:
    """CR2 of B's mean minus A's in y = a·[side A] + b·[side B], clustered by task, computed
    the long way (the general formula with (I - H_gg)^(-1/2) by eigen decomposition)."""
    rows = [(y, 0, g) for g, (a, _) in enumerate(tasks) for y in a]
    rows += [(y, 1, g) for g, (_, b) in enumerate(tasks) for y in b]
    y = np.array([r[0] for r in rows])
    x = np.array([[1.0 - r[1], float(r[1])] for r in rows])
    cluster = np.array([r[2] for r in rows])
    bread = np.linalg.inv(x.T @ x)
    residuals = y - x @ (bread @ x.T @ y)
    meat = np.zeros((2, 2))
    for g in range(len(tasks)):
        mask = cluster == g
        xg = x[mask]
        values, vectors = np.linalg.eigh(np.eye(int(mask.sum())) - xg @ bread @ xg.T)
        adjust = vectors @ np.diag(1 / np.sqrt(values)) @ vectors.T
        u = xg.T @ adjust @ residuals[mask]
        meat += np.outer(u, u)
    contrast = np.array([-1.0, 1.0])
    return float(np.sqrt(contrast @ bread @ meat @ bread @ contrast))


def _bm_df_by_matrices(x: np.ndarray, cluster: np.ndarray, contrast: np.ndarray) -> float:
    """Bell-McCaffrey degrees of freedom of CR2 for `contrast`, the general way (Pustejovsky and
    Tipton 2018, working independence): v_g = A_g X_g (X'X)^-1 c on task g's rows, zero elsewhere,
    w_g = (I - H) v_g, M = sum of w_g w_g', df = tr(M)^2 / tr(M^2), all N x N."""
    size = len(x)
    bread = np.linalg.inv(x.T @ x)
    hat = x @ bread @ x.T
    matrix = np.zeros((size, size))
    for g in np.unique(cluster):
        mask = cluster == g
        xg = x[mask]
        values, vectors = np.linalg.eigh(np.eye(int(mask.sum())) - xg @ bread @ xg.T)
        adjust = vectors @ np.diag(1 / np.sqrt(values)) @ vectors.T
        v = np.zeros(size)
        v[mask] = adjust @ xg @ bread @ contrast
        w = (np.eye(size) - hat) @ v
        matrix += np.outer(w, w)
    return float(np.trace(matrix) ** 2 / np.trace(matrix @ matrix))


def test_balanced_tasks_keep_g_minus_one_degrees_of_freedom() -> None:
    """Bell-McCaffrey gives G - 1 when every task has as many outcomes (and the old rule's
    figure there), fewer when a few tasks hold most of them."""
    balanced = clustered_mean([[1.0, 0.0, 1.0, 0.0]] * 8)
    assert isinstance(balanced, Clustered) and balanced.df == pytest.approx(7)
    lopsided = clustered_mean([[1.0, 0.0] * 9] * 2 + [[1.0, 0.0]] * 6)
    assert isinstance(lopsided, Clustered) and lopsided.df < 5


def test_the_difference_of_two_samples_is_cr2_of_the_contrast() -> None:
    """`clustered_difference` (two sweeps of the same tasks) equals CR2 of the regression with
    one intercept per side, tasks as clusters, on 20 random unbalanced designs."""
    rng = random.Random(5)
    for _ in range(20):
        tasks = [
            (
                [float(rng.random() < 0.6) for _ in range(rng.randint(1, 9))],
                [float(rng.random() < 0.4) for _ in range(rng.randint(1, 9))],
            )
            for _ in range(rng.randint(MIN_TASKS, 12))
        ]
        got = clustered_difference([(sum(a), len(a), sum(b), len(b)) for a, b in tasks])
        assert isinstance(got, Clustered)
        mean_a = sum(sum(a) for a, _ in tasks) / sum(len(a) for a, _ in tasks)
        mean_b = sum(sum(b) for _, b in tasks) / sum(len(b) for _, b in tasks)
        assert got.estimate == pytest.approx(mean_b - mean_a)
        assert got.se == pytest.approx(_cr2_difference_by_matrices(tasks), rel=1e-9)
        rows = [(0, g) for g, (a, _) in enumerate(tasks) for _ in a]
        rows += [(1, g) for g, (_, b) in enumerate(tasks) for _ in b]
        x = np.array([[1.0 - side, float(side)] for side, _ in rows])
        cluster = np.array([g for _, g in rows])
        oracle = _bm_df_by_matrices(x, cluster, np.array([-1.0, 1.0]))
        assert got.df == pytest.approx(oracle, rel=1e-9)
        assert got.df < len(tasks) - 1 + 1e-9


def test_a_task_missing_on_one_side_is_left_out_and_few_tasks_give_none() -> None:
    five = [(3.0, 5, 2.0, 5)] * MIN_TASKS
    assert isinstance(clustered_difference(five), Clustered)
    assert isinstance(clustered_difference([*five[:-1], (3.0, 5, 0.0, 0)]), TooFewTasks)


def test_the_difference_of_two_sweeps_covers_the_truth() -> None:
    """Two independent sweeps of the same 10 tasks (baseline and candidate, 20 trials each),
    the candidate's rate on a task its baseline rate minus a gap uniform in [-0.1, 0.2]: the
    clustered interval of the pooled difference covers the mean gap (-0.05) in >= 93 % of 2000
    seeded pairs of sweeps."""
    rng = random.Random(3)
    sweeps, covered = 2000, 0
    for _ in range(sweeps):
        tasks = []
        for _ in range(10):
            p = rng.uniform(0.25, 0.75)
            q = p - rng.uniform(-0.1, 0.2)
            a = sum(rng.random() < p for _ in range(20))
            b = sum(rng.random() < q for _ in range(20))
            tasks.append((float(a), 20, float(b), 20))
        got = clustered_difference(tasks)
        assert isinstance(got, Clustered)
        covered += got.low <= -0.05 <= got.high
    assert covered / sweeps >= 0.93, covered / sweeps
