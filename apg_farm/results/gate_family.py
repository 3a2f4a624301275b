"""Which pass-rate drops the regression gate may count: one family of one-sided tests (#30).

`check` looks at every model and every (task, model) cell of a candidate. Tested one at a time at
5 %, a candidate equal to its baseline fails on some cell about half the time at 20 tasks x 2
models (measured: 48.8 %), and a gate that fails half the unchanged candidates is switched off.
So every drop the gate counts comes from one family of tests, "the candidate's rate is lower",
whose family-wise error is at most ALPHA, one-sided 2.5 % (the level of a two-sided 95 % interval
that excludes zero): whatever the number of tasks and models, an unchanged candidate fails the
rate rules at most that often (when each test's p is valid), and a drop beyond the tolerance that
the family does not reject is a warning. The error is split (Bonferroni) between the models'
tests, which carry the comparison (MODEL_ALPHA, 2 %), and the cells' (CELL_ALPHA, 0.5 %), each
with Holm's step-down (Holm 1979) within; one Holm over both let 40 cells dilute two models' tests
(power for a 0.2 drop at 20 tasks fell to 0.73). Neither needs an assumption on how the tests
depend on each other (a model's test and its cells' share the data).

The tests:
- a model over 5 tasks or more: the task-clustered difference (clustered.py, CR3), one-sided t;
- a model over fewer tasks: Fisher's exact test of its pooled counts, which takes the attempts as
  independent (the finding says so: few tasks say little of the noise tasks make);
- a cell: Fisher's exact test of its counts, one-sided (conditional on the total passed; exact
  at every n, conservative for small ones).
A task that went from always to never (10 of 10 to 0 of 10) has p = 1 / C(20, 10) = 5.4e-6: it is
caught among up to 920 cells.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from apg_farm.results.clustered import lower_p
from apg_farm.results.stats import holm

#: The family-wise error rate of the gate's rate rules, one-sided: the models' share and the
#: cells'.
MODEL_ALPHA = 0.02
CELL_ALPHA = 0.005
ALPHA = MODEL_ALPHA + CELL_ALPHA


def fisher_drop_p(passed_a: int, n_a: int, passed_b: int, n_b: int) -> float:
    """One-sided Fisher exact p of "B's pass rate is lower than A's": the probability, with the
    total passed fixed, that B passed `passed_b` or fewer (hypergeometric lower tail)."""
    if n_a <= 0 or n_b <= 0:
        return 1.0
    total, size = passed_a + passed_b, n_a + n_b
    low = max(0, total - n_a)
    if passed_b < low:
        return 0.0
    log_all = _log_comb(size, n_b)
    terms = [
        _log_comb(total, k) + _log_comb(size - total, n_b - k) - log_all
        for k in range(low, min(passed_b, total) + 1)
    ]
    return min(1.0, sum(math.exp(t) for t in terms))


def _log_comb(n: int, k: int) -> float:
    if k < 0 or k > n:
        return -math.inf
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def clustered_drop_p(clustered: Mapping[str, Any]) -> float:
    """One-sided p of a report's task-clustered difference B - A being below zero."""
    return lower_p(clustered["estimate"], clustered["se"], float(clustered["df"]))


@dataclass(frozen=True)
class Family:
    """Each test's Holm-adjusted p within its kind, by key: ("model", model) or
    ("cell", task, model)."""

    adjusted: dict[tuple[str, ...], float]
    #: How the model tests were made, by model ("task-clustered" or "pooled, tasks independent").
    how: dict[str, str]

    def size(self, kind: str) -> int:
        return sum(key[0] == kind for key in self.adjusted)

    @staticmethod
    def alpha(kind: str) -> float:
        return MODEL_ALPHA if kind == "model" else CELL_ALPHA

    def rejects(self, key: tuple[str, ...]) -> bool:
        return self.adjusted.get(key, 1.0) <= self.alpha(key[0])


def gate_family(comparison: Mapping[str, Any]) -> Family:
    """The family of `compare(a, b)`'s models and cells, Holm-adjusted within each kind."""
    keys: list[tuple[str, ...]] = []
    pvalues: list[float] = []
    cell_keys: list[tuple[str, ...]] = []
    cell_pvalues: list[float] = []
    how: dict[str, str] = {}
    for row in comparison["models"]:
        clustered = row.get("clustered") or {}
        if "se" in clustered:
            p, how[row["model"]] = clustered_drop_p(clustered), "task-clustered"
        else:
            a, b = row["a"], row["b"]
            p = fisher_drop_p(a["passed"], a["n"], b["passed"], b["n"])
            how[row["model"]] = "pooled, tasks taken as independent"
        keys.append(("model", row["model"]))
        pvalues.append(p)
    for row in comparison["cells"]:
        a, b = row["a"], row["b"]
        if a["n"] and b["n"]:
            cell_keys.append(("cell", row["task"], row["model"]))
            cell_pvalues.append(fisher_drop_p(a["passed"], a["n"], b["passed"], b["n"]))
    adjusted = dict(zip(keys, holm(pvalues), strict=True))
    adjusted.update(zip(cell_keys, holm(cell_pvalues), strict=True))
    return Family(adjusted, how)
