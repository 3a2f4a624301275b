"""Task-clustered inference for figures pooled over tasks (#21, part 1; #30, item 3).

Attempts of one task share a prompt and a site: they are correlated, and a pooled rate's binomial
interval, which takes every attempt as independent, is too narrow when tasks differ in difficulty
(Miller, "Adding Error Bars to Evals", 2024). Tasks are the clusters here.

The estimate is the pooled mean over every outcome (a pass rate of 0/1 outcomes, or the mean of a
paired difference a - b in {-1, 0, 1} over cells both models ran). Its variance is CR3, the
cluster jackknife: "CR3" of Pustejovsky and Tipton's clubSandwich (2018), the jackknife Bell and
McCaffrey (2002) set beside their CR2, and what MacKinnon, Nielsen and Webb ("Cluster-robust
inference: a guide to empirical practice", J. Econometrics 2023) find more reliable than the
other sandwiches with few or unequal clusters. Each task's residuals are scaled by (I - H_gg)^-1,
so for a mean

    V = sum_g S_g^2 / (1 - n_g / N)^2 / N^2 = sum_g (m_(g) - m)^2,

S_g the sum of task g's residuals, n_g its outcomes, N all of them, m_(g) the pooled mean without
task g: the spread of the leave-one-task-out estimates around the estimate (clubSandwich's form;
MacKinnon, Nielsen and Webb's CV3 carries a further (G - 1) / G, which makes it CR2 itself on
balanced tasks and here gave back most of the gain). The interval uses a t quantile on the
Satterthwaite (Bell-McCaffrey) degrees of freedom of that quadratic form under working
independence, as clubSandwich's Satterthwaite test computes for any CR type: tr(M)^2 / tr(M^2),
M the matrix of V = e' M e. Balanced tasks give G - 1 (G tasks); unbalanced ones or a few large
tasks give fewer.

Why CR3 and not CR2 (the farm's estimator before, (I - H_gg)^-1/2, on the same df): with 6-8
tasks whose rates differ widely (logit SD 1.5-2), seeded simulations of tasks drawn at random
(bench/clustered_coverage.py, docs/analysis.md) covered a pooled rate 92.5-93.4 % with CR2 and
94.2-95.1 % with CR3, a paired difference 93.6-93.8 % and 94.8-95.3 %; the difference of two
sweeps 95.2-96.1 % and 96.8-97.0 %. On balanced tasks CR3's variance is CR2's times G / (G - 1),
so with many tasks the two meet (20 tasks: the interval 2.6 % wider, coverage 95-96 %). An
interval on the logit scale overshot (96-97 %) and does not carry over to a difference. At 5
tasks of very different difficulty (logit SD 2.5) even CR3 falls short (pooled 93.7 %, paired
92.2 %: in 6 % of such sweeps the two models never differ on a cell and the interval is a point).
Under MIN_TASKS tasks no interval is given: a variance estimated from so few clusters means
little.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

#: Fewer tasks than this and a clustered interval is not given.
MIN_TASKS = 5


@dataclass(frozen=True)
class Clustered:
    """A pooled mean with its task-clustered standard error and 95 % interval."""

    estimate: float
    se: float
    low: float
    high: float
    tasks: int
    n: int
    #: Satterthwaite (Bell-McCaffrey) degrees of freedom of the CR3 variance (G - 1 when tasks
    #: are balanced).
    df: float


@dataclass(frozen=True)
class TooFewTasks:
    """Why no clustered interval is given."""

    tasks: int
    n: int

    def __str__(self) -> str:
        return (
            f"{self.tasks} task(s): a task-clustered interval needs at least {MIN_TASKS}; "
            "run more tasks, not more trials"
        )


def clustered_mean(
    groups: Sequence[Sequence[float]], *, level: float = 0.95, bounds: tuple[float, float] = (0, 1)
) -> Clustered | TooFewTasks:
    """The pooled mean of every outcome in `groups` (one sequence per task), with its CR3
    standard error and a t interval on its Bell-McCaffrey degrees of freedom, clipped to
    `bounds`."""
    return clustered_sums([(sum(g), len(g)) for g in groups], level=level, bounds=bounds)


def clustered_sums(
    groups: Sequence[tuple[float, int]],
    *,
    level: float = 0.95,
    bounds: tuple[float, float] = (0, 1),
) -> Clustered | TooFewTasks:
    """`clustered_mean` from each task's (sum of outcomes, count): all CR3 needs of a mean, so
    a report computes it from the database's counts without reading attempts one by one."""
    present = [(float(total), int(count)) for total, count in groups if count > 0]
    n = sum(count for _, count in present)
    if len(present) < MIN_TASKS:
        return TooFewTasks(len(present), n)
    mean = sum(total for total, _ in present) / n
    # A task holding every outcome has leverage 1: CR3 is undefined, but then G = 1 < MIN_TASKS.
    # Task g's score is m - m_(g), its leave-one-task-out change: S_g / (1 - n_g / N) / N.
    scores = [(total - mean * count) / (1 - count / n) / n for total, count in present]
    weights = [[(1 / (1 - count / n) / n, count, n)] for _, count in present]
    return _interval(mean, scores, n, level, bounds, bell_mccaffrey_df(weights))


def clustered_difference(
    tasks: Sequence[tuple[float, int, float, int]],
    *,
    level: float = 0.95,
) -> Clustered | TooFewTasks:
    """B's pooled mean minus A's, for two independent samples of the same tasks (two sweeps, or
    a baseline and a sweep): per task (sum A, n A, sum B, n B), tasks as clusters.

    It is the contrast of a regression with one intercept per side, clustered by task: a task's
    difficulty is shared by both sides and cancels, its sampling noise on each side does not.
    CR3 for that model scales each side's task score by (1 - n_gs / N_s)^-1, as for a mean (the
    side's hat matrix block is J / N_s), so the task's score is

        u_g = S_gB / (1 - n_gB / N_B) / N_B - S_gA / (1 - n_gA / N_A) / N_A,

    S_gs the sum of task g's residuals on side s, and V = sum_g u_g^2."""
    present = [(float(sa), int(na), float(sb), int(nb)) for sa, na, sb, nb in tasks if na and nb]
    n_a = sum(row[1] for row in present)
    n_b = sum(row[3] for row in present)
    if len(present) < MIN_TASKS:
        return TooFewTasks(len(present), n_a + n_b)
    mean_a = sum(row[0] for row in present) / n_a
    mean_b = sum(row[2] for row in present) / n_b
    scores = [
        (sb - mean_b * nb) / (1 - nb / n_b) / n_b - (sa - mean_a * na) / (1 - na / n_a) / n_a
        for sa, na, sb, nb in present
    ]
    weights = [
        [(-1 / (1 - na / n_a) / n_a, na, n_a), (1 / (1 - nb / n_b) / n_b, nb, n_b)]
        for _, na, _, nb in present
    ]
    df = bell_mccaffrey_df(weights)
    return _interval(mean_b - mean_a, scores, n_a + n_b, level, (-1, 1), df)


def bell_mccaffrey_df(tasks: Sequence[Sequence[tuple[float, int, int]]]) -> float:
    """tr(M)^2 / tr(M^2) for a contrast of side means (one intercept per side), tasks as
    clusters: per task and side (alpha, n_gs, N_s), alpha the weight of the task's outcomes in
    its score (CR3: 1 / (1 - n_gs / N_s) / N_s, signed as the side in the contrast; CR2: the
    square root of 1 - n_gs / N_s in its place). For such a design the task's vector
    w_g = (I - H) A_g X_g (X'X)^-1 c has

        w_g' w_h = sum over sides of (delta_gh alpha_gs^2 n_gs - alpha_gs alpha_hs n_gs n_hs / N_s),

    so M's traces need G x G numbers, never the N x N matrices (tests/results/test_clustered.py checks
    it against them)."""
    count = len(tasks)
    gram = [[0.0] * count for _ in range(count)]
    for g, sides_g in enumerate(tasks):
        for h, sides_h in enumerate(tasks):
            total = 0.0
            for (a_g, n_g, big_n), (a_h, n_h, _) in zip(sides_g, sides_h, strict=True):
                total -= a_g * a_h * n_g * n_h / big_n
                if g == h:
                    total += a_g * a_g * n_g
            gram[g][h] = total
    trace = sum(gram[g][g] for g in range(count))
    square = sum(value * value for row in gram for value in row)
    return trace * trace / square if square > 0 else float(max(count - 1, 1))


def _interval(
    estimate: float,
    scores: list[float],
    n: int,
    level: float,
    bounds: tuple[float, float],
    df: float,
) -> Clustered:
    """The t interval on `df` around `estimate`, from each task's CR3 score."""
    se = math.sqrt(sum(score * score for score in scores))
    half = t_quantile(1 - (1 - level) / 2, df) * se
    low, high = bounds
    return Clustered(
        estimate, se, max(low, estimate - half), min(high, estimate + half), len(scores), n, df
    )


def lower_p(estimate: float, se: float, df: float) -> float:
    """The one-sided clustered t test of "the mean is below 0": P(T <= estimate / se), T on
    `df` (what the regression gate asks of a drop)."""
    if se <= 0:
        return 1.0 if estimate >= 0 else 0.0
    return t_cdf(estimate / se, df)


def two_sided_p(result: Clustered) -> float:
    """The clustered t test of "the mean is 0": 2 P(T > |estimate / se|), T on `df`."""
    if result.se == 0:
        return 1.0 if result.estimate == 0 else 0.0
    return min(1.0, 2 * (1 - t_cdf(abs(result.estimate / result.se), result.df)))


def as_dict(result: Clustered | TooFewTasks) -> dict[str, Any]:
    """A report's `clustered` object: the interval, or why there is none (`unavailable`)."""
    if isinstance(result, TooFewTasks):
        return {
            "tasks": result.tasks,
            "n": result.n,
            "min_tasks": MIN_TASKS,
            "unavailable": str(result),
        }
    return {
        "estimate": result.estimate,
        "se": result.se,
        "low": result.low,
        "high": result.high,
        "tasks": result.tasks,
        "n": result.n,
        "df": result.df,
    }


def t_quantile(p: float, df: float) -> float:
    """The p-quantile of Student's t with `df` degrees of freedom: Newton's method on the CDF,
    kept inside a bracket that bisection shrinks whenever a Newton step would leave it."""
    if not 0 < p < 1 or df <= 0:
        raise ValueError(f"t quantile needs 0 < p < 1 and df > 0, got p={p}, df={df}")
    if p < 0.5:
        return -t_quantile(1 - p, df)
    if p == 0.5:
        return 0.0
    low, high = 0.0, 1.0
    while t_cdf(high, df) < p:
        low, high = high, high * 2
    x = (low + high) / 2
    for _ in range(200):
        error = t_cdf(x, df) - p
        if error == 0:
            return x
        if error < 0:
            low = x
        else:
            high = x
        step = x - error / _t_pdf(x, df)
        following = step if low < step < high else (low + high) / 2
        if abs(following - x) < 1e-13 * max(1.0, x) or high - low < 1e-12:
            return following
        x = following
    return x


def _t_pdf(x: float, df: float) -> float:
    return math.exp(
        math.lgamma((df + 1) / 2)
        - math.lgamma(df / 2)
        - 0.5 * math.log(df * math.pi)
        - (df + 1) / 2 * math.log1p(x * x / df)
    )


def t_cdf(x: float, df: float) -> float:
    """Student's t CDF through the regularized incomplete beta function."""
    tail = 0.5 * _betainc(df / 2, 0.5, df / (df + x * x))
    return 1 - tail if x >= 0 else tail


def _betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta I_x(a, b) (continued fraction, Numerical Recipes 6.4)."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    front = math.exp(
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x < (a + 1) / (a + b + 2):
        return front * _betacf(a, b, x) / a
    return 1 - front * _betacf(b, a, 1 - x) / b


def _betacf(a: float, b: float, x: float) -> float:
    tiny = 1e-300
    c, d = 1.0, 1 - (a + b) * x / (a + 1)
    d = 1 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        for numerator in (
            m * (b - m) * x / ((a + m2 - 1) * (a + m2)),
            -(a + m) * (a + b + m) * x / ((a + m2) * (a + m2 + 1)),
        ):
            d = 1 + numerator * d
            d = 1 / (d if abs(d) > tiny else tiny)
            c = 1 + numerator / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1) < 1e-15:
            break
    return h
