"""What each run cost is kept on its execution, read from the adapter's claude.json."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest
from sqlalchemy import func, select

from apg_farm.results import analyse, find_sweep, report_csv
from apg_farm.scheduler import submit
from apg_farm.store import Attempt, Execution, Store
from apg_farm.workers import EmbeddedExecutor
from tests.support.simbeds import make_beds, spec


def test_cost_and_tokens_are_kept_per_execution(store: Store, tmp_path: Path) -> None:
    make_beds(store, tmp_path, 2)
    sweep_id = submit(store, spec(tasks=2, trials=2)).sweep_id
    assert EmbeddedExecutor(store, sweep_id).run().errors == []
    with store.read() as session:
        rows = session.execute(
            select(Attempt.model, Execution).join(Attempt, Attempt.id == Execution.attempt_id)
        ).all()
    assert len(rows) == 8
    for _, execution in rows:
        assert execution.cost_usd is not None and execution.cost_usd > 0
        assert execution.input_tokens and execution.output_tokens and execution.turns
        assert execution.cache_read_tokens and execution.cache_write_tokens
        assert execution.adapter_status == "success" and execution.provider_trouble is None
    by_model: dict[str, list[float]] = {}
    for model, execution in rows:
        by_model.setdefault(model, []).append(execution.cost_usd or 0.0)
    # The simulated models are priced differently: their mean costs differ.
    means = {m: sum(c) / len(c) for m, c in by_model.items()}
    assert len(set(means.values())) == len(means) == 2


def test_the_report_gives_cost_per_model_and_per_pass(store: Store, tmp_path: Path) -> None:
    """Per cell and per model: the total equals the executions' sum; cost per pass is the total
    over the passes, inside its interval from the pass rate's Wilson bounds."""
    make_beds(store, tmp_path, 2)
    sweep_id = submit(store, spec(tasks=2, trials=3)).sweep_id
    assert EmbeddedExecutor(store, sweep_id).run().errors == []
    report = analyse(store, find_sweep(store, "s"))
    with store.read() as session:
        spent = dict(
            session.execute(
                select(Attempt.model, func.sum(Execution.cost_usd))
                .join(Attempt, Attempt.id == Execution.attempt_id)
                .group_by(Attempt.model)
            ).all()
        )
    assert {row["model"] for row in report["models"]} == set(spent)
    for row in report["models"]:
        assert row["cost_usd"] == pytest.approx(spent[row["model"]], rel=1e-6)
        assert row["costed_executions"] == 6 and row["median_cost_usd"] > 0
        assert row["tokens"]["output_tokens"] > 0
        if row["passed"]:
            assert row["cost_per_pass"] == pytest.approx(row["cost_usd"] / row["passed"], rel=1e-5)
            assert row["cost_per_pass_low"] <= row["cost_per_pass"]
            high = row["cost_per_pass_high"]
            assert high is None or row["cost_per_pass"] <= high
    assert sum(c["cost_usd"] for c in report["cells"]) == pytest.approx(
        sum(spent.values()), rel=1e-6
    )


def test_a_sweep_without_adapter_records_has_no_cost() -> None:
    from apg_farm.results.costs import _figures

    assert _figures(None, None, {"n": 3, "passed": 1})["cost_per_pass"] is None
    found = {
        "cost": 3.0,
        "known": 3,
        "input_tokens": 1,
        "output_tokens": 2,
        "cache_read_tokens": 0,
        "cache_write_tokens": 0,
    }
    figures = _figures(found, 1.0, {"n": 3, "passed": 0, "ci_low": 0.0, "ci_high": 0.56})
    assert figures["cost_per_pass"] is None and figures["cost_per_pass_high"] is None
    assert figures["cost_per_pass_low"] == pytest.approx(3.0 / (3 * 0.56), rel=1e-5)


def test_the_csv_report_carries_the_cost_columns(store: Store, tmp_path: Path) -> None:
    make_beds(store, tmp_path, 1)
    sweep_id = submit(store, spec(tasks=1, trials=2)).sweep_id
    assert EmbeddedExecutor(store, sweep_id).run().errors == []
    report = analyse(store, find_sweep(store, "s"))
    rows = list(csv.DictReader(io.StringIO(report_csv(report))))
    assert len(rows) == len(report["cells"]) == 2
    for row, cell in zip(rows, report["cells"], strict=True):
        assert float(row["cost_usd"]) == pytest.approx(cell["cost_usd"])
        assert int(row["output_tokens"]) == cell["tokens"]["output_tokens"] > 0
