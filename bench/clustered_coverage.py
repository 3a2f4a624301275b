"""Coverage of the task-clustered 95 % intervals (apg_farm/results/clustered.py), tasks drawn at
random ("tasks like these"): seeded sweeps of few, unbalanced or very different tasks, the farm's
CR3 (cluster jackknife) beside the CR2 it used before (both on Bell-McCaffrey degrees of
freedom), for the three figures the reports give:

- pooled: one model's pooled pass rate (`clustered_sums`); truth, the mean rate of a task drawn at
  random;
- paired: two models in one sweep, the mean of d = a - b over the (task, trial) cells
  (`clustered_sums` with bounds (-1, 1)); per task logit_a ~ N(0.3, sd), logit_b = logit_a +
  N(-0.3, 0.7) (the gap varies by task), a and b on a cell share one uniform draw (correlated);
  truth, E[p_a - p_b] of a task drawn at random;
- two sweeps: B minus A from two independent sweeps of the same tasks (`clustered_difference`),
  A's and B's rates as in `paired`, each side's trials drawn on its own; truth E[p_b - p_a].

Truths by Monte Carlo over 400,000 tasks. One line a design and figure:

    .venv/bin/python bench/clustered_coverage.py
"""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Callable, Sequence

from apg_farm.results import (
    Clustered,
    bell_mccaffrey_df,
    clustered_difference,
    clustered_sums,
    t_quantile,
)

LOGIT_MEAN = 0.3
#: logit_b - logit_a ~ N(GAP_MEAN, GAP_SD) per task.
GAP_MEAN, GAP_SD = -0.3, 0.7
SWEEPS = 5000

Trials = Callable[[random.Random], int]
Interval = tuple[float, float]


def _expit(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def _rates(rng: random.Random, sd: float) -> tuple[float, float]:
    logit_a = rng.gauss(LOGIT_MEAN, sd)
    return _expit(logit_a), _expit(logit_a + rng.gauss(GAP_MEAN, GAP_SD))


def _truth(sd: float, figure: str) -> float:
    rng = random.Random(99)
    draws = [_rates(rng, sd) for _ in range(400_000)]
    if figure == "pooled":
        return statistics.fmean(a for a, _ in draws)
    if figure == "paired":
        return statistics.fmean(a - b for a, b in draws)
    return statistics.fmean(b - a for a, b in draws)


def _cr2_mean(groups: Sequence[tuple[float, int]], bounds: Interval) -> Interval:
    """The farm's interval before #30 item 3: CR2 of the mean, t on its Bell-McCaffrey df."""
    n = sum(count for _, count in groups)
    mean = sum(total for total, _ in groups) / n
    alphas = [1 / math.sqrt(1 - count / n) / n for _, count in groups]
    se = math.sqrt(sum(((t - mean * c) * a) ** 2 for (t, c), a in zip(groups, alphas, strict=True)))
    df = bell_mccaffrey_df([[(a, c, n)] for (_, c), a in zip(groups, alphas, strict=True)])
    half = t_quantile(0.975, df) * se
    return max(bounds[0], mean - half), min(bounds[1], mean + half)


def _cr2_difference(tasks: Sequence[tuple[float, int, float, int]]) -> Interval:
    """Likewise for B minus A of two sweeps (CR2 of the two-intercept contrast)."""
    n_a, n_b = sum(t[1] for t in tasks), sum(t[3] for t in tasks)
    mean_a, mean_b = sum(t[0] for t in tasks) / n_a, sum(t[2] for t in tasks) / n_b
    weights = [
        [
            (-1 / math.sqrt(1 - na / n_a) / n_a, na, n_a),
            (1 / math.sqrt(1 - nb / n_b) / n_b, nb, n_b),
        ]
        for _, na, _, nb in tasks
    ]
    se = math.sqrt(
        sum(
            ((sb - mean_b * nb) * w[1][0] + (sa - mean_a * na) * w[0][0]) ** 2
            for (sa, na, sb, nb), w in zip(tasks, weights, strict=True)
        )
    )
    half = t_quantile(0.975, bell_mccaffrey_df(weights)) * se
    estimate = mean_b - mean_a
    return max(-1.0, estimate - half), min(1.0, estimate + half)


def _interval(result: object) -> Interval:
    assert isinstance(result, Clustered)
    return result.low, result.high


def coverage(tasks: int, trials: Trials, sd: float, figure: str) -> tuple[float, float]:
    """(CR3 coverage, CR2 coverage) of `figure` over SWEEPS seeded sweeps of the design."""
    rng, truth = random.Random(1), _truth(sd, figure)
    new = old = 0
    for _ in range(SWEEPS):
        if figure == "two sweeps":
            rows = []
            for _ in range(tasks):
                p_a, p_b = _rates(rng, sd)
                n_a, n_b = trials(rng), trials(rng)
                a = sum(rng.random() < p_a for _ in range(n_a))
                b = sum(rng.random() < p_b for _ in range(n_b))
                rows.append((float(a), n_a, float(b), n_b))
            intervals = [_interval(clustered_difference(rows)), _cr2_difference(rows)]
        else:
            groups, bounds = [], (0.0, 1.0) if figure == "pooled" else (-1.0, 1.0)
            for _ in range(tasks):
                p_a, p_b = _rates(rng, sd)
                n, total = trials(rng), 0
                for _ in range(n):
                    u = rng.random()  # one draw for both models: correlated on a cell
                    total += (u < p_a) - (u < p_b) if figure == "paired" else u < p_a
                groups.append((float(total), n))
            intervals = [
                _interval(clustered_sums(groups, bounds=bounds)),
                _cr2_mean(groups, bounds),
            ]
        new += intervals[0][0] <= truth <= intervals[0][1]
        old += intervals[1][0] <= truth <= intervals[1][1]
    return new / SWEEPS, old / SWEEPS


DESIGNS: list[tuple[str, int, Trials, float]] = [
    ("8 tasks, 2-18 trials, logit SD 1.5", 8, lambda r: r.randint(2, 18), 1.5),
    ("8 tasks, 2-18 trials, logit SD 2", 8, lambda r: r.randint(2, 18), 2.0),
    ("6 tasks, 10 trials, logit SD 2", 6, lambda r: 10, 2.0),
    ("5 tasks, 10 trials, logit SD 2.5", 5, lambda r: 10, 2.5),
    ("20 tasks, 10 trials, logit SD 1.5", 20, lambda r: 10, 1.5),
]


def main() -> None:
    start = time.monotonic()
    print(f"95 % task-clustered intervals, {SWEEPS} seeded sweeps a line: CR3 (now) | CR2 (before)")
    for label, tasks, trials, sd in DESIGNS:
        cells = []
        for figure in ("pooled", "paired", "two sweeps"):
            new, old = coverage(tasks, trials, sd, figure)
            cells.append(f"{figure} {new:.3f} | {old:.3f}")
        print(f"{label}: " + ", ".join(cells), flush=True)
    print(f"({time.monotonic() - start:.0f} s)")


if __name__ == "__main__":
    main()
