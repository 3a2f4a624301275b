"""The fixed-task interval, and which question each interval answers (#30, part 3).

A pooled pass rate answers one of two questions, and their intervals differ:

- **"tasks like these"**: how would the model do on tasks drawn as these were? The tasks are a
  sample, their difficulty varies, and the interval must carry that: the task-clustered one
  (clustered.py). It is what a comparison of models should read.
- **"this benchmark"**: how would the model do on exactly these tasks, run again? Only the trials
  vary: the variance is within tasks, stratified by task,

      V = sum_g n_g * s_g^2 / N^2,

  s_g^2 the unbiased variance of task g's outcomes. It is narrower and says nothing beyond these
  tasks. A task whose pass/fail outcomes all agree shows no variance, though its rate is not
  known to be 0 or 1: its variance is read at (passed + 1/2) / (n + 1) (the Jeffreys prior's
  centre), so an all-pass benchmark still gets an interval. The interval is normal (z) around the pooled mean, clipped.

`ESTIMAND` is the sentence every report prints once; `few_tasks_note` the one under FEW_TASKS.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from apg_farm.results.clustered import MIN_TASKS

#: The two-sided 95 % normal quantile.
Z95 = 1.959963984540054

#: Under this many tasks a report says its task-clustered intervals rest on few tasks.
FEW_TASKS = 10

ESTIMAND = (
    "Intervals answer one of two questions. Task-clustered (read these): how the models would do "
    "on tasks like these, tasks a sample whose difficulty varies. Fixed-task (`fixed_tasks` in "
    "the JSON): how they would do on exactly these tasks run again, only the trials varying; "
    "narrower, and it says nothing beyond these tasks."
)


def few_tasks_note(tasks: int) -> str | None:
    """The note a report prints when its task-clustered intervals rest on fewer than FEW_TASKS
    tasks (under MIN_TASKS there are none, and each says why)."""
    if not MIN_TASKS <= tasks < FEW_TASKS:
        return None
    return (
        f"the task-clustered intervals rest on {tasks} task(s), fewer than {FEW_TASKS}: when "
        "tasks differ much in difficulty they cover less than 95 % (docs/analysis.md); run more "
        "tasks, not more trials, to narrow them"
    )


def _variance(total: float, squares: float, count: int, binary: bool) -> float:
    """The unbiased variance of one task's outcomes (binary: 0/1, smoothed when they agree)."""
    if binary and total in (0, count):
        rate = (total + 0.5) / (count + 1)
        return rate * (1 - rate) * count / max(count - 1, 1)
    if count < 2:
        return squares  # one outcome in {-1, 0, 1}: its square bounds the variance
    return max(0.0, (squares - total * total / count) / (count - 1))


def fixed_mean(
    groups: Sequence[tuple[float, float, int]], *, binary: bool
) -> tuple[float, float] | None:
    """(mean, variance of the mean) of every outcome in `groups`, per task (sum, sum of squares,
    count), tasks fixed; None without an outcome."""
    present = [(float(s), float(q), int(n)) for s, q, n in groups if n > 0]
    size = sum(n for _, _, n in present)
    if not size:
        return None
    mean = sum(s for s, _, _ in present) / size
    variance = sum(n * _variance(s, q, n, binary) for s, q, n in present) / size**2
    return mean, variance


def as_dict(
    found: tuple[float, float] | None, tasks: int, bounds: tuple[float, float]
) -> dict[str, Any] | None:
    """A report's `fixed_tasks` object: the estimate, its standard error and 95 % interval."""
    if found is None:
        return None
    estimate, variance = found
    se = math.sqrt(variance)
    return {
        "estimate": estimate,
        "se": se,
        "low": max(bounds[0], estimate - Z95 * se),
        "high": min(bounds[1], estimate + Z95 * se),
        "tasks": tasks,
    }


def rate(counts: Sequence[tuple[int, int]]) -> dict[str, Any] | None:
    """A pooled pass rate's fixed-task interval from each task's (passed, n)."""
    found = fixed_mean([(p, p, n) for p, n in counts], binary=True)
    return as_dict(found, sum(1 for _, n in counts if n), (0, 1))


def paired(tables: Sequence[tuple[int, int, int, int]]) -> dict[str, Any] | None:
    """A paired difference a − b's fixed-task interval from each task's 2 x 2 table (both, a
    only, b only, neither)."""
    groups = [(t[1] - t[2], t[1] + t[2], sum(t)) for t in tables]
    found = fixed_mean(groups, binary=False)
    return as_dict(found, sum(1 for g in groups if g[2]), (-1, 1))


def difference(tasks: Sequence[tuple[int, int, int, int]]) -> dict[str, Any] | None:
    """B's pooled rate minus A's, two independent samples of the same fixed tasks, from each
    task's (passed A, n A, passed B, n B): the two sides' variances add."""
    side_a = fixed_mean([(pa, pa, na) for pa, na, _, _ in tasks], binary=True)
    side_b = fixed_mean([(pb, pb, nb) for _, _, pb, nb in tasks], binary=True)
    if side_a is None or side_b is None:
        return None
    found = (side_b[0] - side_a[0], side_a[1] + side_b[1])
    return as_dict(found, sum(1 for row in tasks if row[1] and row[3]), (-1, 1))
