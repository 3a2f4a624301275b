"""`compare` and `check` with --max-cost-increase: a model whose cost per execution (total cost ÷
priced executions, over the tasks both sides ran and priced) rose by more than the fraction fails
with exit 1; unknown cost is said and never fails; a bad fraction is bad input (exit 2)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, update

from apg_farm.errors import BadInput
from apg_farm.fixtures import simbed
from apg_farm.results import (
    CheckPolicy,
    Side,
    check_regression,
    compare,
    cost_findings,
    find_sweep,
    parse_cost_increase,
)
from apg_farm.scheduler import submit
from apg_farm.store import Attempt, Execution, Store
from apg_farm.workers import EmbeddedExecutor
from tests.support.analysis_farm import Farm
from tests.support.cli_runner import run_main
from tests.support.simbeds import make_beds, spec

CHEAP, DEAR = simbed.DEFAULT_MODELS[:2]
#: Cost of every execution of each sweep, per model: `dear` costs 25 % more for DEAR only.
PRICES: dict[str, dict[str, float | None]] = {
    "ref": {CHEAP: 0.10, DEAR: 0.40},
    "dear": {CHEAP: 0.10, DEAR: 0.50},
    "free": {CHEAP: None, DEAR: None},
}


def _price(store: Store, name: str) -> None:
    """Give every execution of the sweep the cost of its model (None: no adapter record)."""
    sweep_id = find_sweep(store, name).id
    with store.session() as session:
        for model, cost in PRICES[name].items():
            attempts = select(Attempt.id).where(
                Attempt.sweep_id == sweep_id, Attempt.model == model
            )
            session.execute(
                update(Execution).where(Execution.attempt_id.in_(attempts)).values(cost_usd=cost)
            )


@pytest.fixture(scope="module")
def farm(tmp_path_factory: pytest.TempPathFactory) -> Farm:
    """Three finished sweeps of 2 tasks x 2 models x 2 trials, priced as PRICES says."""
    home = tmp_path_factory.mktemp("cost-gate")
    store = Store(f"sqlite:///{home / 'farm.db'}")
    make_beds(store, home / "sim", 2)
    for name in PRICES:
        sweep_id = submit(store, spec(name, tasks=2, models=2, trials=2)).sweep_id
        result = EmbeddedExecutor(store, sweep_id).run()
        assert not result.errors and not result.stranded, result
        _price(store, name)
    return Farm(home, store)


Cli = Callable[..., tuple[str, str]]


@pytest.fixture
def cli(farm: Farm, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Cli:
    """`cli(*args, code=0) -> (stdout, stderr)`: apg-farm's main() on this farm."""
    for name in ("APG_FARM_DATABASE_URL", "APG_FARM_BROKER_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("APG_FARM_HOME", str(farm.home))
    # Rich wraps at the terminal's width: wide enough that a finding stays on one line.
    monkeypatch.setenv("COLUMNS", "250")

    def run(*args: str, code: int = 0) -> tuple[str, str]:
        return run_main(monkeypatch, capsys, *args, code=code)

    return run


RISE = (
    f"model {DEAR}: cost per execution $0.4000 ({{a}}, 4 priced) -> $0.5000 ({{b}}, 4 priced), "
    "+25.0% over 2 task(s), allowed +{allowed}"
)


def test_compare_fails_a_model_whose_cost_rose_too_much(cli: Cli) -> None:
    """+25 % for one model: fails at 20 %, holds at exactly 25 %, no gate without the flag, and a
    cheaper candidate passes."""
    out, _ = cli("compare", "ref", "dear", "--max-cost-increase", "0.2", code=1)
    assert "FAIL: " + RISE.format(a="A", b="B", allowed="20.0%") in out
    assert f"cost: model {CHEAP}: cost per execution $0.1000 (A, 4 priced) -> $0.1000" in out
    assert "cost check failed: 1 model(s)" in out

    out, _ = cli("compare", "ref", "dear", "--max-cost-increase", "0.25")
    assert RISE.format(a="A", b="B", allowed="25.0%") in out and "FAIL:" not in out
    out, _ = cli("compare", "ref", "dear")
    assert "cost" not in out
    cli("compare", "dear", "ref", "--max-cost-increase", "0")

    result = json.loads(
        cli("compare", "ref", "dear", "--format", "json", "--max-cost-increase=0.2", code=1)[0]
    )
    gate = result["cost_check"]
    assert gate["max_cost_increase"] == 0.2 and len(gate["failures"]) == 1
    [row] = [m for m in result["models"] if m["model"] == DEAR]
    assert row["a"]["cost_per_execution"] == pytest.approx(0.4)
    assert row["b"]["cost_per_execution"] == pytest.approx(0.5)
    assert row["a"]["costed_executions"] == 4 and len(row["cost_tasks"]) == 2


def test_compare_with_unknown_cost_says_so_and_passes(cli: Cli) -> None:
    out, _ = cli("compare", "ref", "free", "--max-cost-increase", "0")
    for model in (CHEAP, DEAR):
        assert f"model {model}: cost unknown in B; cost not checked" in out
    out, _ = cli("compare", "free", "free", "--max-cost-increase", "0")
    assert f"model {DEAR}: cost unknown in A and B; cost not checked" in out


def test_check_gates_cost_against_a_baseline(farm: Farm, cli: Cli, tmp_path: Path) -> None:
    """A baseline keeps the cost figures; check fails the dearer candidate (exit 1) naming the
    model and both figures, passes within the tolerance, and only warns when cost is unknown."""
    cli("baseline", "promote", "ref", "--name", "ref", "--dir", str(tmp_path))
    baseline = str(tmp_path / "ref.json")
    # The sweeps' pass rates differ by chance: only cost is under test here.
    loose = ["--max-rate-drop", "1"]
    out, _ = cli("check", baseline, "dear", *loose, "--max-cost-increase", "0.2", code=1)
    rise = RISE.format(a="the baseline", b="the candidate", allowed="20.0%")
    assert f"FAIL: {rise}" in out and "check failed: 1 finding(s)" in out

    out, _ = cli("check", baseline, "dear", *loose, "--max-cost-increase", "0.3")
    assert "check passed" in out
    out, _ = cli("check", baseline, "dear", *loose)
    assert "check passed" in out

    out, _ = cli("check", baseline, "free", *loose, "--max-cost-increase", "0.2")
    assert f"warning: model {DEAR}: cost unknown in the candidate; cost not checked" in out
    assert "check passed" in out

    verdict = json.loads(
        cli(
            "check",
            baseline,
            "dear",
            *loose,
            "--max-cost-increase",
            "0.2",
            "--format",
            "json",
            code=1,
        )[0]
    )
    assert verdict["ok"] is False and verdict["failures"] == [rise]

    # The real process: same exit codes, and a bad value is one line, not a traceback.
    for args, code in (
        (["--max-cost-increase", "0.2"], 1),
        (["--max-cost-increase", "0.3"], 0),
        (["--max-cost-increase", "lots"], 2),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "apg_farm", "check", baseline, "dear", *loose, *args],
            capture_output=True,
            text=True,
            env=farm.env(),
            timeout=120,
        )
        assert done.returncode == code, done.stdout + done.stderr
        assert "Traceback" not in done.stderr
    assert "--max-cost-increase" in done.stderr


@pytest.mark.parametrize("value", ["-0.1", "abc", "nan", "inf", "", "1e400"])
@pytest.mark.parametrize("command", ["compare", "check"])
def test_a_bad_fraction_is_bad_input(cli: Cli, command: str, value: str) -> None:
    _, err = cli(command, "ref", "dear", f"--max-cost-increase={value}", code=2)
    assert "error: --max-cost-increase:" in err and "fraction" in err


def test_parse_cost_increase() -> None:
    assert parse_cost_increase(None) is None
    assert parse_cost_increase("0") == 0.0
    assert parse_cost_increase(" 0.25 ") == 0.25
    assert parse_cost_increase("3") == 3.0
    with pytest.raises(BadInput) as error:
        parse_cost_increase("-1")
    assert error.value.field == "--max-cost-increase"


def cell(task: str, model: str, cost: float | None, priced: int) -> dict[str, Any]:
    return {
        "task": task,
        "model": model,
        "n": 4,
        "passed": 2,
        "invalid": 0,
        "error": 0,
        "skipped": 0,
        "pending": 0,
        "cost_usd": cost,
        "costed_executions": priced if cost is not None else 0,
    }


def summary(cells: list[dict[str, Any]]) -> dict[str, Any]:
    return {"sweep": {"name": "s"}, "outcomes": {}, "cells": cells, "indispensable": {}}


def test_cost_pools_only_the_tasks_both_sides_priced() -> None:
    """t2 is priced on one side only (and t3 is run on one side only): the figure is t1's, so a
    side that ran costlier tasks is not mistaken for a dearer model."""
    a = summary([cell("t1", "m", 1.0, 4), cell("t2", "m", None, 0)])
    b = summary([cell("t1", "m", 1.2, 4), cell("t2", "m", 40.0, 4), cell("t3", "m", 9.0, 1)])
    [row] = compare(a, b)["models"]
    assert row["cost_tasks"] == ["t1"]
    assert row["a"]["cost_per_execution"] == pytest.approx(0.25)
    assert row["b"]["cost_per_execution"] == pytest.approx(0.3)
    found = cost_findings(compare(a, b), 0.2)
    assert not found.failures and len(found.within) == 1 and "+20.0%" in found.within[0]
    assert len(cost_findings(compare(a, b), 0.19).failures) == 1


def test_cost_gate_edge_cases() -> None:
    """Zero cost before: any cost after fails; a baseline without cost keys (promoted before costs
    were kept) is unknown, not free; priced on both sides but never on the same task is said."""
    zero = summary([cell("t1", "m", 0.0, 4)])
    some = summary([cell("t1", "m", 0.4, 4)])
    [failed] = cost_findings(compare(zero, some), 10.0).failures
    assert "up from zero" in failed
    assert not cost_findings(compare(zero, zero), 0.0).failures

    old = summary([{k: v for k, v in cell("t1", "m", None, 0).items() if "cost" not in k}])
    found = cost_findings(compare(old, some), 0.1, ("the baseline", "the candidate"))
    assert found.unknown == ["model m: cost unknown in the baseline; cost not checked"]

    apart_a = summary([cell("t1", "m", 1.0, 4), cell("t2", "m", None, 0)])
    apart_b = summary([cell("t1", "m", None, 0), cell("t2", "m", 1.0, 4)])
    [line] = cost_findings(compare(apart_a, apart_b), 0.1).unknown
    assert "not known on both sides for any one task" in line


def test_check_regression_applies_the_cost_policy() -> None:
    base = Side("b", "baseline", summary([cell("t1", "m", 1.0, 4)]))
    dear = Side("c", "sweep", summary([cell("t1", "m", 2.0, 4)]))
    verdict = check_regression(base, dear, CheckPolicy(max_cost_increase=0.5))
    assert not verdict.ok and "cost per execution $0.2500" in verdict.failures[0]
    assert check_regression(base, dear, CheckPolicy()).ok
    assert check_regression(base, dear, CheckPolicy(max_cost_increase=1.0)).ok
