"""Coverage of the task-clustered interval of a pooled pass rate, tasks drawn at random ("tasks
like these"): seeded sweeps of few, unbalanced or very different tasks, with the Bell-McCaffrey
degrees of freedom the farm uses beside the G - 1 it used before #30. Prints one line a design.

    .venv/bin/python bench/clustered_coverage.py
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable

from apg_farm.results import Clustered, clustered_sums, t_quantile

LOGIT_MEAN = 0.3
SWEEPS = 3000


def _rate(rng: random.Random, sd: float) -> float:
    return 1 / (1 + math.exp(-rng.gauss(LOGIT_MEAN, sd)))


def _truth(sd: float) -> float:
    """The mean rate of a task drawn at random (what "tasks like these" estimates)."""
    rng = random.Random(99)
    return statistics.fmean(_rate(rng, sd) for _ in range(400_000))


def coverage(
    tasks: int, trials: Callable[[random.Random], int], sd: float, *, old_df: bool = False
) -> float:
    rng, truth, covered = random.Random(1), _truth(sd), 0
    for _ in range(SWEEPS):
        groups = []
        for _ in range(tasks):
            p, n = _rate(rng, sd), trials(rng)
            groups.append((float(sum(rng.random() < p for _ in range(n))), n))
        result = clustered_sums(groups)
        assert isinstance(result, Clustered)
        low, high = result.low, result.high
        if old_df:
            half = t_quantile(0.975, result.tasks - 1) * result.se
            low, high = result.estimate - half, result.estimate + half
        covered += low <= truth <= high
    return covered / SWEEPS


def main() -> None:
    designs: list[tuple[str, int, Callable[[random.Random], int], float]] = [
        ("8 tasks, 2-18 trials, logit SD 1.5", 8, lambda r: r.randint(2, 18), 1.5),
        ("8 tasks, 2-18 trials, logit SD 2", 8, lambda r: r.randint(2, 18), 2.0),
        ("6 tasks, 10 trials, logit SD 2", 6, lambda r: 10, 2.0),
        ("5 tasks, 10 trials, logit SD 2.5", 5, lambda r: 10, 2.5),
    ]
    for label, tasks, trials, sd in designs:
        bm = coverage(tasks, trials, sd)
        old = coverage(tasks, trials, sd, old_df=True)
        print(f"{label}: Bell-McCaffrey {bm:.3f}, G - 1 {old:.3f} ({SWEEPS} sweeps)")


if __name__ == "__main__":
    main()
