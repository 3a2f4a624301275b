"""The regression gate, calibrated (#30): seeded simulations through the library's own `check`.

An unchanged candidate (the same true rate per (task, model) as its baseline, tasks of very
different difficulty) must fail at most 5 % of the time, plus Monte Carlo error, at 8, 20 and 50
tasks x 2 and 5 models, 10 trials; before #30 it failed 48.8 % of the time at 20 tasks x 2 models.
A real drop must still fail it: 0.2 on one model at 20 tasks (power at least 0.9), and one task
going from always to never. `pytest tests/results/test_gate_calibration.py -s` prints the rates
(docs/analysis.md, "The regression gate").
"""

from __future__ import annotations

import math
import random

import pytest

from apg_farm.results import CheckPolicy, check_regression
from tests.results.test_regression import cell, side

TRIALS = 10
#: Task difficulty: logit of a (task, model)'s true rate ~ N(0.3, 1.5).
LOGIT_MEAN, LOGIT_SD = 0.3, 1.5


def _true_rates(rng: random.Random, tasks: int, models: int) -> dict[tuple[str, str], float]:
    return {
        (f"t{t}", f"m{m}"): 1 / (1 + math.exp(-rng.gauss(LOGIT_MEAN, LOGIT_SD)))
        for t in range(tasks)
        for m in range(models)
    }


def _draw(rng: random.Random, rates: dict[tuple[str, str], float]) -> list[dict[str, object]]:
    return [
        cell(task, model, sum(rng.random() < p for _ in range(TRIALS)), TRIALS)
        for (task, model), p in rates.items()
    ]


def _fails(
    rates_a: dict[tuple[str, str], float], rates_b: dict[tuple[str, str], float], rng: random.Random
) -> bool:
    verdict = check_regression(side(_draw(rng, rates_a)), side(_draw(rng, rates_b)), CheckPolicy())
    return not verdict.ok


@pytest.mark.parametrize("models", [2, 5])
@pytest.mark.parametrize("tasks", [8, 20, 50])
def test_an_unchanged_candidate_fails_at_most_five_percent(tasks: int, models: int) -> None:
    rng = random.Random(3000 + 10 * tasks + models)
    runs = 300
    failed = 0
    for _ in range(runs):
        rates = _true_rates(rng, tasks, models)
        failed += _fails(rates, rates, rng)
    rate = failed / runs
    print(
        f"\n{tasks} tasks x {models} models: unchanged candidates failed {rate:.3f} ({runs} runs)"
    )
    assert rate <= 0.05 + 2 * math.sqrt(0.05 * 0.95 / runs), rate


def test_a_drop_of_twenty_points_on_one_model_is_caught() -> None:
    rng = random.Random(77)
    runs, caught = 200, 0
    for _ in range(runs):
        # Rates in [0.3, 0.9] so that 0.2 off each task is a drop of 0.2 on the model.
        base = {key: 0.3 + 0.6 * rng.random() for key in _true_rates(rng, 20, 2)}
        worse = {key: p - 0.2 if key[1] == "m1" else p for key, p in base.items()}
        caught += _fails(base, worse, rng)
    power = caught / runs
    print(f"\n20 tasks x 2 models, m1 0.2 lower: caught {power:.3f} ({runs} runs)")
    assert power >= 0.9, power


def test_a_task_going_from_always_to_never_is_caught_among_many() -> None:
    """50 tasks x 5 models, every other cell the same: one task 10 of 10 -> 0 of 10 fails."""
    rng = random.Random(5)
    rates = _true_rates(rng, 50, 5)
    cells = _draw(rng, rates)
    worse = [dict(c) for c in cells]
    for c, w in zip(cells, worse, strict=True):
        if (c["task"], c["model"]) == ("t7", "m3"):
            c.update(passed=10, failed=0, headline_passed=10)
            w.update(passed=0, failed=10, headline_passed=0)
    verdict = check_regression(side(cells), side(worse), CheckPolicy())
    assert [f for f in verdict.failures if f.startswith("t7 m3:")], verdict.failures


def test_the_models_share_their_error_by_holm() -> None:
    """Five models each one-sided p 0.015: alone each is a drop (0.015 <= MODEL_ALPHA 0.02); in
    a family of five Holm makes each 0.075, and none is counted."""
    from apg_farm.results.clustered import t_quantile
    from apg_farm.results.gate_family import MODEL_ALPHA, gate_family

    estimate = t_quantile(0.015, 1000)  # se 1: lower_p = 0.015
    row = {"clustered": {"estimate": estimate, "se": 1.0, "df": 1000.0}}
    alone = gate_family({"models": [{"model": "m0", **row}], "cells": []})
    assert alone.adjusted[("model", "m0")] == pytest.approx(0.015, rel=1e-6)
    assert MODEL_ALPHA >= 0.015 and alone.rejects(("model", "m0"))
    five = gate_family({"models": [{"model": f"m{i}", **row} for i in range(5)], "cells": []})
    for i in range(5):
        assert five.adjusted[("model", f"m{i}")] == pytest.approx(0.075, rel=1e-6)
        assert not five.rejects(("model", f"m{i}"))
