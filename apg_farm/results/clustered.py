"""Task-clustered inference for figures pooled over tasks (#21, part 1).

Attempts of one task share a prompt and a site: they are correlated, and a pooled rate's binomial
interval, which takes every attempt as independent, is too narrow when tasks differ in difficulty
(Miller, "Adding Error Bars to Evals", 2024). Tasks are the clusters here.

The estimate is the pooled mean over every outcome (a pass rate of 0/1 outcomes, or the mean of a
paired difference a - b in {-1, 0, 1} over cells both models ran). Its variance is the
cluster-robust CR2 estimator (Bell and McCaffrey, 2002), which corrects the plain sandwich's
downward bias with few clusters; for a mean it reduces to

    V = sum_g S_g^2 / (1 - n_g / N) / N^2,

S_g the sum of task g's residuals, n_g its outcomes, N all of them. The interval uses a t quantile
on G - 1 degrees of freedom (G tasks), as is usual with few clusters. Under MIN_TASKS tasks no
interval is given: a variance estimated from so few clusters means little.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

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
    df: int


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
    """The pooled mean of every outcome in `groups` (one sequence per task), with its CR2
    standard error and a t interval on G - 1 degrees of freedom, clipped to `bounds`."""
    groups = [list(g) for g in groups if len(g)]
    n = sum(len(g) for g in groups)
    if len(groups) < MIN_TASKS:
        return TooFewTasks(len(groups), n)
    mean = sum(sum(g) for g in groups) / n
    variance = 0.0
    for g in groups:
        residual = sum(g) - mean * len(g)
        variance += residual * residual / (1 - len(g) / n)
    se = math.sqrt(variance) / n
    df = len(groups) - 1
    half = t_quantile(1 - (1 - level) / 2, df) * se
    low, high = bounds
    return Clustered(mean, se, max(low, mean - half), min(high, mean + half), len(groups), n, df)


def t_quantile(p: float, df: int) -> float:
    """The p-quantile of Student's t with `df` degrees of freedom (bisection on the CDF)."""
    if not 0 < p < 1 or df < 1:
        raise ValueError(f"t quantile needs 0 < p < 1 and df >= 1, got p={p}, df={df}")
    if p < 0.5:
        return -t_quantile(1 - p, df)
    low, high = 0.0, 1.0
    while t_cdf(high, df) < p:
        high *= 2
    for _ in range(200):
        middle = (low + high) / 2
        if t_cdf(middle, df) < p:
            low = middle
        else:
            high = middle
        if high - low < 1e-12:
            break
    return (low + high) / 2


def t_cdf(x: float, df: int) -> float:
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
