"""Power-priced planning's statistics (apg_farm/results/power.py): the noncentral t against
scipy, the planned trials checked by simulating sweeps analysed with the farm's own clustered
paired difference, the floor that more trials cannot pass, and the history estimators."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from apg_farm.results import power as pw
from apg_farm.results.clustered import Clustered, clustered_mean, t_quantile

ALPHA = 0.05


@pytest.mark.parametrize("df", [4, 9, 19, 99, 5000])
def test_the_two_sided_power_is_scipys_noncentral_t(df: int) -> None:
    # The report's CR3 test on balanced tasks: Student's quantile times sqrt(G / (G - 1)).
    critical = t_quantile(1 - ALPHA / 2, df) * math.sqrt((df + 1) / df)
    for noncentrality in (0.0, 0.7, 1.5, 2.8, 4.0, 8.0):
        expected = scipy_stats.nct.sf(critical, df, noncentrality) + scipy_stats.nct.cdf(
            -critical, df, noncentrality
        )
        got = pw.paired_power(
            noncentrality / math.sqrt(df + 1),
            tasks=df + 1,
            trials=1,
            within=0.0,
            between=1.0,
            alpha=ALPHA,
        )
        assert got == pytest.approx(expected, abs=1e-7)


def _population(
    rng: np.random.Generator, n: int, detect: float, task_sd: float, rho: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """n tasks: difficulty ~ U(0.2, 0.8), the difference ~ N(detect, task_sd^2) split around it,
    and P(both pass) giving the two models correlation rho on a cell (within Fréchet's bounds)."""
    base = rng.uniform(0.2, 0.8, n)
    diff = rng.normal(detect, task_sd, n)
    a = np.clip(base + diff / 2, 0.01, 0.99)
    b = np.clip(base - diff / 2, 0.01, 0.99)
    both = a * b + rho * np.sqrt(a * (1 - a) * b * (1 - b))
    return a, b, np.clip(both, np.maximum(0, a + b - 1), np.minimum(a, b))


def _truth(seed: int, detect: float, task_sd: float, rho: float) -> tuple[float, float, float]:
    """The population's pooled difference, mean cell variance of a - b, and task variance."""
    a, b, both = _population(np.random.default_rng(seed), 400_000, detect, task_sd, rho)
    only_a, only_b = a - both, b - both
    within = float(np.mean(only_a + only_b - (only_a - only_b) ** 2))
    return float(np.mean(a - b)), within, float(np.var(a - b))


def _detected_share(
    seed: int, sweeps: int, tasks: int, trials: int, detect: float, task_sd: float, rho: float
) -> float:
    """Simulated sweeps (fresh tasks each) analysed as the farm does: the clustered 95 %
    interval of the pooled paired difference (clustered_mean) excludes 0."""
    rng = np.random.default_rng(seed)
    hits = 0
    for _ in range(sweeps):
        a, b, both = _population(rng, tasks, detect, task_sd, rho)
        cells = np.stack([both, a - both, b - both, 1 - a - b + both], axis=1).clip(0, 1)
        cells /= cells.sum(axis=1, keepdims=True)
        groups = []
        for probs in cells:
            n_both, only_a, only_b, neither = rng.multinomial(trials, probs)
            groups.append([0.0] * (n_both + neither) + [1.0] * only_a + [-1.0] * only_b)
        found = clustered_mean(groups, level=1 - ALPHA, bounds=(-1, 1))
        assert isinstance(found, Clustered)
        hits += found.low > 0 or found.high < 0
    return hits / sweeps


# (tasks, pooled difference, SD of the difference across tasks, correlation on a cell)
SCENARIOS = [(20, 0.10, 0.05, 0.3), (10, 0.15, 0.08, 0.2), (30, 0.05, 0.03, 0.4)]


@pytest.mark.parametrize(("tasks", "detect", "task_sd", "rho"), SCENARIOS)
def test_the_planned_trials_detect_the_difference_with_the_asked_power(
    tasks: int, detect: float, task_sd: float, rho: float
) -> None:
    """At the planned trials, the share of simulated sweeps whose clustered interval excludes 0
    is within 5 points of the asked 0.8 (and within 3 of the plan's own figure at those trials);
    one trial fewer would not have been enough."""
    delta, within, between = _truth(1, detect, task_sd, rho)
    figures = {"within": within, "between": between, "alpha": ALPHA}
    trials = pw.trials_needed(delta, tasks=tasks, target=0.8, **figures)
    assert trials is not None and trials > 1
    planned = pw.paired_power(delta, tasks=tasks, trials=trials, **figures)
    assert planned >= 0.8 > pw.paired_power(delta, tasks=tasks, trials=trials - 1, **figures)
    share = _detected_share(tasks, 1500, tasks, trials, detect, task_sd, rho)
    print(f"{tasks} tasks: {trials} trials, planned power {planned:.3f}, simulated {share:.3f}")
    assert abs(share - 0.8) <= 0.05
    assert abs(share - planned) <= 0.03


def test_with_few_tasks_no_number_of_trials_reaches_the_power() -> None:
    """6 tasks whose difference spreads with SD 0.15: the plan says unreachable, its ceiling is
    what simulated sweeps with many trials reach, and more tasks are what it asks for."""
    delta, within, between = _truth(2, 0.10, 0.15, 0.2)
    figures = {"within": within, "between": between, "alpha": ALPHA}
    assert pw.trials_needed(delta, tasks=6, target=0.8, **figures) is None
    ceiling = pw.paired_power(delta, tasks=6, trials=math.inf, **figures)
    at_200 = pw.paired_power(delta, tasks=6, trials=200, **figures)
    assert at_200 <= ceiling < 0.8
    share = _detected_share(3, 1000, 6, 200, 0.10, 0.15, 0.2)
    print(f"6 tasks x 200 trials: plan {at_200:.3f} (ceiling {ceiling:.3f}), simulated {share:.3f}")
    assert abs(share - at_200) <= 0.05 and share < 0.7
    more = pw.tasks_needed(delta, trials=math.inf, target=0.8, **figures)
    assert more is not None and more > 6
    assert pw.paired_power(delta, tasks=more, trials=math.inf, **figures) >= 0.8


def test_under_five_tasks_there_is_no_plan() -> None:
    assert pw.trials_needed(0.3, tasks=4, within=0.3, between=0.0, alpha=ALPHA, target=0.8) is None


def test_the_history_estimators_recover_the_correlation_and_the_task_spread() -> None:
    """From 60 tasks x 40 paired cells of a known population: the within-task correlation and
    tau (the task SD of the difference) come back close to the truth; the pooled correlation,
    which task difficulty inflates, would not."""
    rng = np.random.default_rng(5)
    a, b, both = _population(rng, 60, 0.1, 0.12, 0.3)
    paired, rated = [], []
    all_a, all_b = [], []
    for pa, pb, p11 in zip(a, b, both, strict=True):
        counts = rng.multinomial(40, [p11, pa - p11, pb - p11, 1 - pa - pb + p11])
        n_both, only_a, only_b, _ = (int(c) for c in counts)
        paired.append(pw.Paired(40, n_both + only_a, n_both + only_b, n_both))
        rated.append((pw.Rate(40, n_both + only_a), pw.Rate(40, n_both + only_b), 40))
        all_a += [1] * (n_both + only_a) + [0] * (40 - n_both - only_a)
        all_b += [1] * n_both + [0] * only_a + [1] * only_b + [0] * (40 - n_both - only_a - only_b)
    rho = pw.within_task_correlation(paired)
    assert rho is not None and rho == pytest.approx(0.3, abs=0.06)
    assert float(np.corrcoef(all_a, all_b)[0, 1]) > rho + 0.05
    tau2 = pw.between_task_variance(rated, rho)
    assert tau2 is not None and math.sqrt(tau2) == pytest.approx(float(np.std(a - b)), abs=0.03)
    assert pw.between_task_variance(rated[:4], rho) is None
