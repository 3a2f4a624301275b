"""Task-clustered intervals (apg_farm/results/clustered.py): the estimator (CR3) against the
general matrix formula and the literal leave-one-task-out jackknife, its degrees of freedom against
the N x N computation, the t quantile against printed tables, and seeded coverage studies."""

from __future__ import annotations

import math
import random
import statistics

import numpy as np
import pytest

from apg_farm.results.clustered import (
    MIN_TASKS,
    Clustered,
    TooFewTasks,
    bell_mccaffrey_df,
    clustered_difference,
    clustered_mean,
    clustered_sums,
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


def _adjustment(matrix: np.ndarray, kind: str) -> np.ndarray:
    """A cluster's adjustment of its residuals: (I - H_gg)^-1 for CR3 (by inversion), or
    (I - H_gg)^(-1/2) for CR2 (by eigen decomposition)."""
    if kind == "CR3":
        return np.linalg.inv(matrix)
    values, vectors = np.linalg.eigh(matrix)
    return vectors @ np.diag(1 / np.sqrt(values)) @ vectors.T


def _cr_by_matrices(
    x: np.ndarray, y: np.ndarray, cluster: np.ndarray, contrast: np.ndarray
) -> float:
    """CR3 of `contrast` in the OLS fit of y on x, the long way: the sandwich
    (X'X)^-1 [sum_g X_g' A_g e_g e_g' A_g X_g] (X'X)^-1 by matrix products, A_g = (I - H_gg)^-1."""
    bread = np.linalg.inv(x.T @ x)
    residuals = y - x @ (bread @ x.T @ y)
    meat = np.zeros((x.shape[1], x.shape[1]))
    for g in np.unique(cluster):
        mask = cluster == g
        xg = x[mask]
        adjust = _adjustment(np.eye(int(mask.sum())) - xg @ bread @ xg.T, "CR3")
        u = xg.T @ adjust @ residuals[mask]
        meat += np.outer(u, u)
    return float(np.sqrt(contrast @ bread @ meat @ bread @ contrast))


def _jackknife(x: np.ndarray, y: np.ndarray, cluster: np.ndarray, contrast: np.ndarray) -> float:
    """sqrt(sum_g (c'b_(g) - c'b)^2), b_(g) the OLS fit refitted without cluster g: the cluster
    jackknife, which CR3 equals for OLS."""

    def fit(rows: np.ndarray) -> float:
        return float(contrast @ np.linalg.lstsq(x[rows], y[rows], rcond=None)[0])

    full = fit(np.ones(len(y), dtype=bool))
    return math.sqrt(sum((fit(cluster != g) - full) ** 2 for g in np.unique(cluster)))


def _mean_design(groups: list[list[float]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    y = np.concatenate([np.array(g, dtype=float) for g in groups])
    cluster = np.repeat(np.arange(len(groups)), [len(g) for g in groups])
    return np.ones((len(y), 1)), y, cluster


def test_the_standard_error_is_cr3() -> None:
    rng = random.Random(7)
    for _ in range(20):
        groups = [
            [float(rng.random() < 0.6) for _ in range(rng.randint(1, 12))]
            for _ in range(rng.randint(MIN_TASKS, 15))
        ]
        got = clustered_mean(groups)
        assert isinstance(got, Clustered)
        x, y, cluster = _mean_design(groups)
        one = np.array([1.0])
        assert got.se == pytest.approx(_cr_by_matrices(x, y, cluster, one), rel=1e-9)
        assert got.se == pytest.approx(_jackknife(x, y, cluster, one), rel=1e-9)
        assert got.df == pytest.approx(_bm_df_by_matrices(x, cluster, one, "CR3"), rel=1e-9)
        assert got.n == sum(map(len, groups))
        assert got.low <= got.estimate <= got.high


def test_bell_mccaffrey_df_of_cr2_weights_is_the_cr2_df() -> None:
    """`bell_mccaffrey_df` takes any side weights: with CR2's (1 - n_g / N)^(-1/2) / N it gives
    CR2's df by the N x N computation (what bench/clustered_coverage.py compares against)."""
    rng = random.Random(8)
    for _ in range(20):
        sizes = [rng.randint(1, 12) for _ in range(rng.randint(MIN_TASKS, 15))]
        n = sum(sizes)
        weights = [[(1 / math.sqrt(1 - size / n) / n, size, n)] for size in sizes]
        x, _, cluster = _mean_design([[0.0] * size for size in sizes])
        oracle = _bm_df_by_matrices(x, cluster, np.array([1.0]), "CR2")
        assert bell_mccaffrey_df(weights) == pytest.approx(oracle, rel=1e-9)


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


def _bm_df_by_matrices(
    x: np.ndarray, cluster: np.ndarray, contrast: np.ndarray, kind: str
) -> float:
    """Bell-McCaffrey (Satterthwaite) degrees of freedom of CR3 or CR2 (`kind`) for `contrast`,
    the general way (Pustejovsky and Tipton 2018, working independence): v_g = A_g X_g (X'X)^-1 c
    on task g's rows, zero elsewhere, A_g the kind's adjustment, w_g = (I - H) v_g,
    M = sum of w_g w_g', df = tr(M)^2 / tr(M^2), all N x N."""
    size = len(x)
    bread = np.linalg.inv(x.T @ x)
    hat = x @ bread @ x.T
    matrix = np.zeros((size, size))
    for g in np.unique(cluster):
        mask = cluster == g
        xg = x[mask]
        adjust = _adjustment(np.eye(int(mask.sum())) - xg @ bread @ xg.T, kind)
        v = np.zeros(size)
        v[mask] = adjust @ xg @ bread @ contrast
        w = (np.eye(size) - hat) @ v
        matrix += np.outer(w, w)
    return float(np.trace(matrix) ** 2 / np.trace(matrix @ matrix))


def test_balanced_tasks_keep_g_minus_one_degrees_of_freedom() -> None:
    """Bell-McCaffrey gives G - 1 when every task has as many outcomes (and the old rule's
    figure there), fewer when a few tasks hold most of them. On balanced tasks CR3's variance is
    the textbook s^2 / G of the task means times G / (G - 1)."""
    balanced = clustered_mean([[1.0, 0.0, 1.0, 0.0]] * 8)
    assert isinstance(balanced, Clustered) and balanced.df == pytest.approx(7)
    groups = [[1.0] * k + [0.0] * (6 - k) for k in (0, 1, 3, 3, 5, 6, 2)]
    got = clustered_mean(groups)
    means = [sum(g) / 6 for g in groups]
    textbook = statistics.variance(means) / len(groups)
    assert isinstance(got, Clustered) and got.df == pytest.approx(len(groups) - 1)
    assert got.se**2 == pytest.approx(textbook * len(groups) / (len(groups) - 1), rel=1e-12)
    lopsided = clustered_mean([[1.0, 0.0] * 9] * 2 + [[1.0, 0.0]] * 6)
    assert isinstance(lopsided, Clustered) and lopsided.df < 5


def test_the_difference_of_two_samples_is_cr3_of_the_contrast() -> None:
    """`clustered_difference` (two sweeps of the same tasks) equals CR3 of the regression with
    one intercept per side, tasks as clusters, and the leave-one-task-out jackknife of B's mean
    minus A's, on 20 random unbalanced designs; its df the N x N Bell-McCaffrey computation."""
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
        rows = [(y, 0, g) for g, (a, _) in enumerate(tasks) for y in a]
        rows += [(y, 1, g) for g, (_, b) in enumerate(tasks) for y in b]
        y = np.array([r[0] for r in rows])
        x = np.array([[1.0 - r[1], float(r[1])] for r in rows])
        cluster = np.array([r[2] for r in rows])
        contrast = np.array([-1.0, 1.0])
        assert got.se == pytest.approx(_cr_by_matrices(x, y, cluster, contrast), rel=1e-9)
        assert got.se == pytest.approx(_jackknife(x, y, cluster, contrast), rel=1e-9)
        assert got.df == pytest.approx(_bm_df_by_matrices(x, cluster, contrast, "CR3"), rel=1e-9)
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


def _expit(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


#: #30 item 3: the 95 % interval must cover >= 94 % in seeded simulations of few, unbalanced,
#: very different tasks. 20,000 sweeps give a Monte Carlo SD of 0.16 point at 94.5 %; the floor
#: is 94 % less one such SD. On these very sweeps CR3 covers 94.3 / 95.2 % (8 tasks, pooled /
#: paired) and 95.0 / 94.8 % (6 tasks); CR2 on its Bell-McCaffrey df, the estimator before,
#: covered 92.9 / 93.7 % and 93.9 / 93.7 %: it fails three of the four (the pooled 6 tasks by
#: chance passes the floor; its coverage over 200,000 sweeps is 93.6 %).
COVERAGE_SWEEPS = 20_000
COVERAGE_FLOOR = 0.94 - 0.0016


@pytest.mark.parametrize("figure", ["pooled", "paired"])
@pytest.mark.parametrize(
    ("tasks", "fewest", "most"), [(8, 2, 18), (6, 10, 10)], ids=["8 tasks 2-18", "6 tasks 10"]
)
def test_coverage_with_few_very_different_tasks(
    tasks: int, fewest: int, most: int, figure: str
) -> None:
    """Tasks drawn at random, logit of model a's rate ~ N(0.3, 2), model b's logit a's plus
    N(-0.3, 0.7) (the gap varies by task), trials per task uniform in [fewest, most], a and b on a
    cell sharing one uniform draw. Pooled: a's pass rate, truth the mean rate of a random task;
    paired: the mean of a - b, truth E[p_a - p_b]; truths over 400,000 tasks
    (bench/clustered_coverage.py prints every design of #30 with CR2 beside CR3)."""
    truth_rng = np.random.default_rng(99)
    logit = truth_rng.normal(0.3, 2.0, 400_000)
    rate_a, rate_b = _expit(logit), _expit(logit + truth_rng.normal(-0.3, 0.7, 400_000))
    truth = float(np.mean(rate_a if figure == "pooled" else rate_a - rate_b))

    rng = np.random.default_rng(30)
    shape = (COVERAGE_SWEEPS, tasks)
    logit = rng.normal(0.3, 2.0, shape)
    p_a, p_b = _expit(logit), _expit(logit + rng.normal(-0.3, 0.7, shape))
    n = rng.integers(fewest, most + 1, shape)
    u = rng.random((*shape, most))
    ran = np.arange(most) < n[..., None]
    a = ((u < p_a[..., None]) & ran).sum(axis=-1)
    b = ((u < p_b[..., None]) & ran).sum(axis=-1)
    totals = a if figure == "pooled" else a - b
    bounds = (0.0, 1.0) if figure == "pooled" else (-1.0, 1.0)
    covered = 0
    for sums, counts in zip(totals.tolist(), n.tolist(), strict=True):
        got = clustered_sums(list(zip(map(float, sums), counts, strict=True)), bounds=bounds)
        assert isinstance(got, Clustered)
        covered += got.low <= truth <= got.high
    coverage = covered / COVERAGE_SWEEPS
    print(f"\n{tasks} tasks, {fewest}-{most} trials, {figure}: coverage {coverage:.4f}")
    assert coverage >= COVERAGE_FLOOR, coverage
