"""`sweep submit FILE --dry-run --detect D`: the trials a paired comparison of the sweep's
models needs, planned from the store's history (or printed assumptions) and priced."""

from __future__ import annotations

import json
import math
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy import stats as scipy_stats
from sqlalchemy import select, update

from apg_farm.fixtures import simbed
from apg_farm.results import quantile
from apg_farm.scheduler import estimate_sweep, submit
from apg_farm.scheduler.power_plan import ASSUMED_TASK_SD, plan_power
from apg_farm.specs import SweepSpec
from apg_farm.store import Attempt, Execution, Store
from apg_farm.workers import EmbeddedExecutor
from tests.support.cli_runner import run_main, run_process
from tests.support.simbeds import make_beds, spec

HISTORY_TASKS = list(simbed.DEFAULT_TASKS[:3])  # the fourth has no droost spec: never counted
MODELS = list(simbed.DEFAULT_MODELS[:2])


def _cli(env: dict[str, str], *args: str) -> str:
    return run_process(env, *args).stdout


def _power_of(detect: float, tasks: int, trials: int, within: float, between: float) -> float:
    """The clustered test's power by scipy's noncentral t: the oracle for the plan. The test is
    the report's CR3 t test: on balanced tasks Student's critical value times sqrt(G / (G - 1))."""
    df = tasks - 1
    critical = scipy_stats.t.ppf(0.975, df) * math.sqrt(tasks / df)
    noncentrality = detect * math.sqrt(tasks / (between + within / trials))
    return float(
        scipy_stats.nct.sf(critical, df, noncentrality)
        + scipy_stats.nct.cdf(-critical, df, noncentrality)
    )


def test_a_plan_from_a_sweep_run_on_simulated_beds(tmp_path: Path) -> None:
    """History from a real (simulated) run: the rates the plan uses are the stored ones, the
    figures it lacks are assumed and said so, its trials are the least scipy agrees reach 0.8,
    and their price is trials x the per-execution medians of the store's executions."""
    home = tmp_path / "home"
    store = Store(f"sqlite:///{home / 'farm.db'}")
    make_beds(store, tmp_path / "sim", 4)
    sweep = submit(store, spec("history", tasks=3, models=2, trials=4)).sweep_id
    assert EmbeddedExecutor(store, sweep).run().errors == []
    with store.read() as session:
        outcomes = session.execute(select(Attempt.task, Attempt.model, Attempt.outcome)).all()
        executions = session.execute(
            select(Attempt.task, Attempt.model, Execution.cost_usd, Execution.bed_seconds).join(
                Attempt, Attempt.id == Execution.attempt_id
            )
        ).all()
    new_tasks = [f"new{i:02d}" for i in range(17)]
    file = tmp_path / "plan.yaml"
    file.write_text(
        json.dumps(
            {
                "name": "planned",
                "dataset": "droost_build_tasks",
                "tasks": HISTORY_TASKS + new_tasks,
                "models": MODELS,
                "trials": 3,
            }
        )
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("APG_FARM_")}
    env["APG_FARM_HOME"] = str(home)

    data = json.loads(
        _cli(env, "sweep", "submit", str(file), "--dry-run", "--detect", "0.1", "--json")
    )
    plan = data["power"]
    assert (plan["detect"], plan["power"], plan["alpha"], plan["tasks"]) == (0.1, 0.8, 0.05, 20)

    # Rates: the stored ones where the store has them, 0.5 (assumed) elsewhere.
    rates = {(r["task"], r["model"]): r for r in plan["assumptions"]["rates"]}
    variances = {}
    for task in HISTORY_TASKS + new_tasks:
        for model in MODELS:
            row = rates[(task, model)]
            mine = [o for t, m, o in outcomes if (t, m) == (task, model)]
            if task in HISTORY_TASKS:
                passed = sum(o == "PASSED" for o in mine)
                assert row["source"] == "history" and row["attempts"] == len(mine) == 4
                assert row["rate"] == pytest.approx(passed / len(mine))
                p = passed / len(mine)
                # Unbiased p(1 - p), but never above its largest possible value, 1/4.
                variances[(task, model)] = min(0.25, p * (1 - p) * 4 / 3)
            else:
                assert row["source"] == "assumed" and row["rate"] == 0.5
                variances[(task, model)] = 0.25
    (pair,) = plan["pairs"]
    assert pair["models"] == MODELS
    # 12 paired cells are too few for a correlation; 3 tasks too few for the task spread.
    assert pair["correlation"]["source"] == "assumed" and pair["correlation"]["value"] == 0
    assert pair["task_sd"] == {
        "value": ASSUMED_TASK_SD,
        "source": "assumed",
        "note": pair["task_sd"]["note"],
    }
    within = (
        sum(
            variances[(t, MODELS[0])] + variances[(t, MODELS[1])] for t in HISTORY_TASKS + new_tasks
        )
        / 20
    )
    assert pair["cell_variance"] == pytest.approx(within, abs=1e-6)

    # The trials: the least count the oracle says reaches 0.8.
    trials = plan["trials_per_cell_needed"]
    between = ASSUMED_TASK_SD**2
    assert trials is not None and plan["reachable"] and plan["worst_pair"] == MODELS
    assert _power_of(0.1, 20, trials, within, between) >= 0.8
    assert _power_of(0.1, 20, trials - 1, within, between) < 0.8
    assert plan["achieved_power"] == pytest.approx(_power_of(0.1, 20, 3, within, between), abs=1e-4)

    # The price: trials x the median cost and bed time of each (task, model)'s executions.
    cost = bed = 0.0
    for task in HISTORY_TASKS:
        for model in MODELS:
            runs = [(c, s) for t, m, c, s in executions if (t, m) == (task, model)]
            cost += trials * quantile([float(c) for c, _ in runs if c is not None], 0.5)
            bed += trials * quantile([float(s) for _, s in runs if s is not None], 0.5)
    at = plan["at_trials_needed"]
    assert at["trials"] == trials and at["attempts"] == 20 * 2 * trials
    assert at["cost_usd"]["median"] == pytest.approx(cost, rel=1e-6)
    assert at["cost_usd"]["attempts"] == 3 * 2 * trials and at["pairs_without_history"] == 34
    assert at["bed_seconds"]["median"] == pytest.approx(bed, rel=1e-6)
    assert at["bed_hours"]["median"] == pytest.approx(bed / 3600, abs=1e-6)
    assert at["wall_seconds"]["median"] == pytest.approx(bed / 4, rel=1e-6)
    # The estimate beside it still prices the sweep's own 3 trials.
    assert data["attempts"] == 120

    text = _cli(env, "sweep", "submit", str(file), "--dry-run", "--detect", "0.1")
    assert f"needed: {trials} trials per (task, model) on 20 tasks" in text
    assert f"at {trials} trials the sweep would add {40 * trials} attempts" in text
    assert "bed-hours" in text and "on the 4 active bed(s) of pool" in text
    assert "rates: from history for 6 of 40 (task, model); assumed 0.5 for 34" in text


def _set_outcomes(store: Store, sweep_id: int, outcome_of: dict[tuple[str, str, int], str]) -> None:
    with store.session() as session:
        for (task, model, trial), outcome in outcome_of.items():
            session.execute(
                update(Attempt)
                .where(
                    Attempt.sweep_id == sweep_id,
                    Attempt.task == task,
                    Attempt.model == model,
                    Attempt.trial == trial,
                )
                .values(state="done", outcome=outcome)
            )


def _spec(name: str, tasks: list[str], models: list[str], trials: int) -> SweepSpec:
    return SweepSpec.model_validate(
        {"name": name, "fixtures": ["kb_docs"], "tasks": tasks, "models": models, "trials": trials}
    )


def test_correlation_and_task_spread_from_paired_history(store: Store) -> None:
    """Correlated outcomes of two models on 8 tasks: the plan's correlation is the within-task
    one over the cells one sweep ran for both (a model's cells in another sweep pair with
    nothing; ERROR and CANCELLED cells are not counted), and its task SD is the method of
    moments, both recomputed here with numpy."""
    tasks, models, trials = [f"t{i}" for i in range(8)], ["ma", "mb"], 20
    rng = random.Random(4)
    outcomes: dict[tuple[str, str, int], str] = {}
    for index, task in enumerate(tasks):
        # Model ma leads by 0.3 on half the tasks and trails by 0.1 on the others.
        base, lead = 0.2 + 0.08 * index, 0.3 if index % 2 else -0.1
        for trial in range(1, trials + 1):
            shared = rng.random()
            # A common draw for both models most of the time: positively correlated cells.
            a = (shared if rng.random() < 0.85 else rng.random()) < base + lead
            b = (shared if rng.random() < 0.85 else rng.random()) < base
            outcomes[(task, "ma", trial)] = "PASSED" if a else "FAILED"
            outcomes[(task, "mb", trial)] = "PASSED" if b else "NO_ATTEMPT"
    outcomes[("t0", "ma", 1)] = "ERROR"
    outcomes[("t1", "mb", 2)] = "CANCELLED"
    first = submit(store, _spec("h1", tasks, models, trials)).sweep_id
    _set_outcomes(store, first, outcomes)
    # Model ma alone in another sweep: its rate counts, its cells pair with nothing.
    other = submit(store, _spec("h2", tasks[:2], ["ma"], 3)).sweep_id
    _set_outcomes(store, other, {(t, "ma", n): "PASSED" for t in tasks[:2] for n in (1, 2, 3)})

    target = _spec("next", tasks, models, 5)
    plan = plan_power(store, target, estimate_sweep(store, target), detect=0.1)

    counted = {k: v for k, v in outcomes.items() if v not in ("ERROR", "CANCELLED")}
    extra = {(t, "ma", 100 + n): "PASSED" for t in tasks[:2] for n in (1, 2, 3)}
    rates = {}
    for task in tasks:
        for model in models:
            mine = [v for (t, m, _), v in (counted | extra).items() if (t, m) == (task, model)]
            rates[(task, model)] = (sum(v == "PASSED" for v in mine), len(mine))
            found = plan.rates[(task, model)]
            assert (found.passes, found.attempts) == rates[(task, model)]
    # Within-task correlation over cells both counted in sweep h1.
    xs, ys = [], []
    for task in tasks:
        cells = [
            (counted[(task, "ma", n)] == "PASSED", counted[(task, "mb", n)] == "PASSED")
            for n in range(1, trials + 1)
            if (task, "ma", n) in counted and (task, "mb", n) in counted
        ]
        of_a = np.array([c[0] for c in cells], dtype=float)
        of_b = np.array([c[1] for c in cells], dtype=float)
        xs.append(of_a - of_a.mean())
        ys.append(of_b - of_b.mean())
    x, y = np.concatenate(xs), np.concatenate(ys)
    rho = float((x * y).sum() / math.sqrt((x * x).sum() * (y * y).sum()))
    (pair,) = plan.pairs
    assert pair.correlation.source == "history"
    assert f"from {len(x)} paired" in pair.correlation.note and len(x) == 8 * 20 - 2
    assert pair.correlation.value == pytest.approx(rho, abs=1e-9) and rho > 0.2

    # tau^2: variance of the observed differences less their mean sampling variance.
    diffs, noise = [], []
    for task in tasks:
        (pa, na), (pb, nb) = rates[(task, "ma")], rates[(task, "mb")]
        va = min(0.25, (pa / na) * (1 - pa / na) * na / (na - 1))
        vb = min(0.25, (pb / nb) * (1 - pb / nb) * nb / (nb - 1))
        paired = sum(
            1
            for n in range(1, trials + 1)
            if (task, "ma", n) in counted and (task, "mb", n) in counted
        )
        diffs.append(pa / na - pb / nb)
        noise.append(va / na + vb / nb - 2 * rho * math.sqrt(va * vb) * paired / (na * nb))
    tau2 = max(0.0, float(np.var(diffs, ddof=1)) - float(np.mean(noise)))
    assert pair.task_sd.source == "history"
    assert pair.task_sd.value == pytest.approx(math.sqrt(tau2), abs=1e-9) and tau2 > 0
    assert plan.as_dict()["pairs"][0]["correlation"]["source"] == "history"


def _spec_file(path: Path, tasks: int, models: int, trials: int = 3) -> Path:
    path.write_text(
        json.dumps(
            {
                "name": "s",
                "fixtures": ["kb_docs"],
                "tasks": [f"t{i}" for i in range(tasks)],
                "models": [f"m{i}" for i in range(models)],
                "trials": trials,
            }
        )
    )
    return path


def test_without_history_the_plan_prints_its_assumptions(
    farm_home: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    file = _spec_file(tmp_path / "s.json", tasks=20, models=2)
    out, _ = run_main(
        monkeypatch, capsys, "sweep", "submit", str(file), "--dry-run", "--detect", "0.1"
    )
    assert "rates: none in history: assumed 0.5 for every (task, model)" in out
    assert "correlation 0.00 assumed: 0 paired cells in the store, 20 needed" in out
    assert "task SD 0.100 assumed: history has rates for both models on 0" in out
    assert "needed: 42 trials per (task, model) on 20 tasks" in out
    assert "cost and time unknown" in out

    # 5 points with 20 tasks whose difference spreads by 0.1: no number of trials does it.
    out, _ = run_main(
        monkeypatch, capsys, "sweep", "submit", str(file), "--dry-run", "--detect", "0.05"
    )
    assert "not reachable with 20 tasks at any number of trials" in out and "add tasks" in out
    data: dict[str, Any] = json.loads(
        run_main(
            monkeypatch,
            capsys,
            "sweep",
            "submit",
            str(file),
            "--dry-run",
            "--detect",
            "0.05",
            "--json",
        )[0]
    )
    assert data["power"]["trials_per_cell_needed"] is None and not data["power"]["reachable"]
    assert data["power"]["at_trials_needed"] is None
    assert data["power"]["pairs"][0]["tasks_needed_unlimited_trials"] > 20

    # The flags override the assumptions, and say so.
    out, _ = run_main(
        monkeypatch,
        capsys,
        "sweep",
        "submit",
        str(file),
        "--dry-run",
        "--detect",
        "0.05",
        "--task-sd",
        "0",
        "--correlation",
        "0.5",
    )
    assert "correlation 0.50 (--correlation)" in out and "task SD 0.000 (--task-sd)" in out
    assert "needed: " in out

    # Three models: three pairs, each at alpha / 3; four tasks: no clustered comparison at all.
    three = _spec_file(tmp_path / "three.json", tasks=4, models=3)
    out, _ = run_main(
        monkeypatch, capsys, "sweep", "submit", str(three), "--dry-run", "--detect", "0.1"
    )
    assert "3 model pairs, each tested at alpha 0.0167 (Bonferroni" in out
    assert "4 task(s): a task-clustered comparison needs at least 5" in out
    # A dry run stores nothing: the same file is still a new sweep.
    out, _ = run_main(monkeypatch, capsys, "sweep", "submit", str(file), "--dry-run")
    assert "sweep s would be submitted with 120 attempts" in out


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--dry-run", "--detect", "0"], "--detect"),
        (["--dry-run", "--detect", "1"], "--detect"),
        (["--dry-run", "--detect", "-0.1"], "--detect"),
        (["--dry-run", "--detect", "nan"], "--detect"),
        (["--dry-run", "--detect", "0.1", "--power", "1"], "--power"),
        (["--dry-run", "--detect", "0.1", "--power", "0"], "--power"),
        (["--dry-run", "--detect", "0.1", "--power", "0.04"], "--power"),
        (["--dry-run", "--detect", "0.1", "--alpha", "1.5"], "--alpha"),
        (["--dry-run", "--detect", "0.1", "--correlation", "-2"], "--correlation"),
        (["--dry-run", "--detect", "0.1", "--task-sd", "-0.1"], "--task-sd"),
        (["--detect", "0.1"], "--detect"),
        (["--dry-run", "--power", "0.9"], "--power"),
    ],
)
def test_bad_planning_flags_are_refused_naming_the_flag(
    farm_home: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    flag: str,
) -> None:
    file = _spec_file(tmp_path / "s.json", tasks=6, models=2)
    _, err = run_main(monkeypatch, capsys, "sweep", "submit", str(file), *args, code=2)
    assert err.startswith(f"error: {flag}:") or f"{flag}:" in err, err
    assert "fix:" in err
    # Nothing submitted: the refused command stored no sweep.
    out, _ = run_main(monkeypatch, capsys, "sweep", "submit", str(file), "--dry-run")
    assert "would be submitted" in out
