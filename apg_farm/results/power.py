"""How many trials a paired, task-clustered comparison of two models needs (#21, part 2).

The analysis planned for is the farm's: the pooled paired difference d = a - b in {-1, 0, 1} over
the (task, trial) cells both models ran, with its CR3 standard error, tasks as clusters, and a
t quantile on G - 1 degrees of freedom (`clustered.py`). With every task run T times the CR3
variance of that mean is exactly s_m^2 / (G - 1), s_m^2 the sample variance of the G task means
of d: the clustered test is the one-sample t test on the task means, its critical value times
sqrt(G / (G - 1)). A task mean is

    m_g = delta_g + (mean of T cells' noise),   Var(m_g) = tau^2 + v / T,

tau^2 the variance across tasks of the true difference delta_g (tasks are a sample of the tasks
one cares about, so their spread is noise too) and v the mean over tasks of one cell's variance,

    v_g = s_a^2 + s_b^2 - 2 rho s_a s_b,   s^2 = p (1 - p) per model, rho the models'
    correlation on the same cell (the same site and prompt make it positive).

With m_g roughly normal, t = mean(m) / (s_m / sqrt G) is noncentral t on G - 1 degrees of freedom
with noncentrality lambda = delta sqrt(G) / sqrt(tau^2 + v / T), and the power of the two-sided
test at alpha is P(|t| > t_{1 - alpha/2, G - 1}), computed here by integrating the normal over
the chi-square of the variance (exact for the normal model; no library). More trials shrink only
v / T: at any T the power is below its value at tau^2 alone, so with few tasks some differences
cannot be detected by trials at all, only by more tasks.

Inputs from history are estimated here too, from counts the store aggregates: per-task rates, the
within-task correlation over paired cells, and tau^2 by the method of moments (the spread of the
observed task differences less what their sampling noise alone would give).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from apg_farm.results.clustered import MIN_TASKS, t_quantile

#: Trial and task counts the searches stop at: beyond, the plan is "not reachable".
MAX_TRIALS = 100_000
MAX_TASKS = 100_000
#: Intervals of the Simpson rule over log chi-square (enough for 1e-6 against scipy's nct).
_STEPS = 800


def cell_variance(var_a: float, var_b: float, correlation: float) -> float:
    """Var(a - b) of one cell: two outcomes with variances p (1 - p) and this correlation."""
    return max(0.0, var_a + var_b - 2 * correlation * math.sqrt(var_a * var_b))


def paired_power(
    detect: float, *, tasks: int, trials: float, within: float, between: float, alpha: float
) -> float:
    """Power of the two-sided clustered paired test at `alpha` to detect a pooled difference
    `detect`, with `tasks` tasks of `trials` trials each (math.inf: the floor of tau^2 alone).

    The test is the one the report makes (clustered.py): on balanced tasks its CR3 variance is
    the usual s^2 / G times G / (G - 1), so it rejects when |t| exceeds sqrt(G / (G - 1)) times
    Student's quantile on G - 1 degrees of freedom."""
    if tasks < 2:
        return 0.0
    variance = between + (0.0 if math.isinf(trials) else within / trials)
    if variance <= 0:
        return 1.0
    noncentrality = detect * math.sqrt(tasks / variance)
    df = tasks - 1
    critical = t_quantile(1 - alpha / 2, df) * math.sqrt(tasks / df)
    return _noncentral_t_two_sided(noncentrality, df, critical)


def trials_needed(
    detect: float, *, tasks: int, within: float, between: float, alpha: float, target: float
) -> int | None:
    """The fewest trials per (task, model) reaching `target` power; None when no count up to
    MAX_TRIALS does (the between-task spread alone keeps the power below it)."""

    def enough(trials: float) -> bool:
        found = paired_power(
            detect, tasks=tasks, trials=trials, within=within, between=between, alpha=alpha
        )
        return found >= target

    if tasks < MIN_TASKS or not enough(math.inf):
        return None
    return _least(enough, MAX_TRIALS)


def tasks_needed(
    detect: float, *, trials: float, within: float, between: float, alpha: float, target: float
) -> int | None:
    """The fewest tasks (at least MIN_TASKS) reaching `target` power at `trials` per cell."""

    def enough(tasks: int) -> bool:
        found = paired_power(
            detect, tasks=tasks, trials=trials, within=within, between=between, alpha=alpha
        )
        return found >= target

    found = _least(enough, MAX_TASKS)
    return None if found is None else max(found, MIN_TASKS)


def _least(enough: Callable[[int], bool], cap: int) -> int | None:
    """The least n in [1, cap] with enough(n), for a monotone predicate: doubling, then bisection."""
    high = 1
    while not enough(high):
        if high >= cap:
            return None
        high = min(cap, high * 2)
    low = high // 2  # not enough (or 0)
    while high - low > 1:
        middle = (low + high) // 2
        if enough(middle):
            high = middle
        else:
            low = middle
    return high


def _noncentral_t_two_sided(noncentrality: float, df: int, critical: float) -> float:
    """P(|T| > critical) for T noncentral t(df, noncentrality): T = (Z + lambda) / sqrt(V / df),
    V chi-square(df), so the probability is E_V[Phi(lambda - c S) + Phi(-lambda - c S)], S =
    sqrt(V / df), integrated by Simpson's rule over u = log V (smooth, and bounded for any df)."""
    spread = math.sqrt(2 / df)
    low = math.log(df) - 30 / df - 12 * spread
    high = math.log(df) + 3 / df + 12 * spread
    step = (high - low) / _STEPS
    log_norm = (df / 2) * math.log(2) + math.lgamma(df / 2)
    total = 0.0
    for i in range(_STEPS + 1):
        u = low + i * step
        v = math.exp(u)
        # The chi-square density times dV/du = V.
        density = math.exp((df / 2) * u - v / 2 - log_norm)
        scaled = critical * math.sqrt(v / df)
        inner = _phi(noncentrality - scaled) + _phi(-noncentrality - scaled)
        weight = 1 if i in (0, _STEPS) else (4 if i % 2 else 2)
        total += weight * density * inner
    return min(1.0, max(0.0, total * step / 3))


def _phi(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2))


# History: the inputs above estimated from counts.


@dataclass(frozen=True)
class Rate:
    """One (task, model)'s counted attempts and passes."""

    attempts: int
    passes: int

    @property
    def rate(self) -> float:
        return self.passes / self.attempts

    @property
    def variance(self) -> float:
        """p(1 - p) of one outcome, unbiased (n / (n - 1)), at most 1/4."""
        p = self.rate
        if self.attempts < 2:
            return p * (1 - p)
        return min(0.25, p * (1 - p) * self.attempts / (self.attempts - 1))


@dataclass(frozen=True)
class Paired:
    """One task's cells where both models have a counted outcome: cells, a's passes, b's
    passes, cells both passed."""

    cells: int
    a: int
    b: int
    both: int


def within_task_correlation(paired: Sequence[Paired]) -> float | None:
    """The two models' correlation on the same cell, within tasks (each task's own means taken
    out, so task difficulty does not pass for correlation), pooled over tasks; None when no
    task's cells vary for both models."""
    cross = var_a = var_b = 0.0
    for task in paired:
        if task.cells < 2:
            continue
        n = task.cells
        cross += task.both - task.a * task.b / n
        var_a += task.a - task.a * task.a / n
        var_b += task.b - task.b * task.b / n
    if var_a <= 0 or var_b <= 0:
        return None
    return max(-1.0, min(1.0, cross / math.sqrt(var_a * var_b)))


def between_task_variance(
    tasks: Sequence[tuple[Rate, Rate, int]], correlation: float
) -> float | None:
    """tau^2 from tasks with history for both models, each (a's rate, b's rate, paired cells
    among them): the sample variance of the observed differences less their mean sampling
    variance, floored at 0; None under MIN_TASKS tasks (too few to say)."""
    if len(tasks) < MIN_TASKS:
        return None
    differences, noise = [], []
    for a, b, cells in tasks:
        differences.append(a.rate - b.rate)
        cov = correlation * math.sqrt(a.variance * b.variance) * cells / (a.attempts * b.attempts)
        noise.append(a.variance / a.attempts + b.variance / b.attempts - 2 * cov)
    mean = sum(differences) / len(differences)
    spread = sum((d - mean) ** 2 for d in differences) / (len(differences) - 1)
    return max(0.0, spread - sum(noise) / len(noise))
