"""`sweep submit --dry-run`: the cost and time of a sweep estimated from earlier executions of
the same (task, model), with nothing stored."""

from __future__ import annotations

import json
import subprocess
from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy import select, update

from apg_farm.errors import BadInput
from apg_farm.results import quantile
from apg_farm.scheduler import estimate_sweep, submit
from apg_farm.scheduler.estimate import FEW
from apg_farm.specs import SweepSpec
from apg_farm.store import Attempt, Bed, BedState, Execution, Store, Sweep, cancel_sweep, utcnow
from apg_farm.workers import EmbeddedExecutor
from tests.support.cli_runner import run_process, store_env
from tests.support.simbeds import make_beds, spec

FIXTURES = ["kb_docs"]


def _spec(
    name: str, tasks: list[str], models: list[str], trials: int, **extra: object
) -> SweepSpec:
    return SweepSpec.model_validate(
        {
            "name": name,
            "fixtures": FIXTURES,
            "tasks": tasks,
            "models": models,
            "trials": trials,
            **extra,
        }
    )


def _bed(store: Store, name: str, *, pool: list[str] = FIXTURES, state: str = "active") -> int:
    with store.session() as session:
        bed = Bed(
            name=name,
            approot=f"/srv/{name}",
            fixtures=pool,
            pool=",".join(sorted(pool)),
            state=state,
        )
        session.add(bed)
        session.flush()
        return bed.id


def _history(
    store: Store,
    bed_id: int,
    task: str,
    model: str,
    runs: list[tuple[float | None, float | None, float]],
    *,
    sweep: str = "earlier",
    finished: bool = True,
    age: float = 0.0,
) -> None:
    """Executions of (task, model) in a sweep of their own: (cost, bed seconds, wall seconds)
    each, finishing one second apart, the last `age` seconds ago."""
    sweep_id = submit(store, _spec(sweep, [task], [model], len(runs))).sweep_id
    end = utcnow() - timedelta(seconds=age)
    with store.session() as session:
        attempts = session.scalars(
            select(Attempt).where(Attempt.sweep_id == sweep_id).order_by(Attempt.trial)
        ).all()
        for index, (attempt, (cost, bed_seconds, wall)) in enumerate(
            zip(attempts, runs, strict=True)
        ):
            done = end - timedelta(seconds=len(runs) - index)
            session.add(
                Execution(
                    attempt_id=attempt.id,
                    bed_id=bed_id,
                    number=1,
                    started_at=done - timedelta(seconds=wall),
                    finished_at=done if finished else None,
                    result="PASSED" if finished else None,
                    cost_usd=cost,
                    bed_seconds=bed_seconds,
                )
            )


def _rows(store: Store) -> dict[str, int]:
    """Rows of every table of the store."""
    with store.engine.connect() as conn:
        names = sa.inspect(conn).get_table_names()
        return {
            name: int(conn.execute(sa.text(f'SELECT count(*) FROM "{name}"')).scalar_one())
            for name in names
        }


def test_medians_ranges_and_totals(store: Store) -> None:
    """p10-p90 with enough executions, min-max with few; bed seconds, else finished - started;
    unfinished executions ignored; totals are attempts x medians; pairs without history named."""
    bed = _bed(store, "b1")
    _bed(store, "b2")
    _bed(store, "b3", state=BedState.QUARANTINED)
    _bed(store, "elsewhere", pool=["canvas_home"])
    many = [(float(i), 10.0 * i, 999.0) for i in range(1, 21)]
    _history(store, bed, "t1", "m1", many, sweep="h1")
    # Few, and without bed seconds: the wall time of each execution counts.
    _history(
        store,
        bed,
        "t1",
        "m2",
        [(1.0, None, 30.0), (9.0, None, 90.0), (2.0, None, 60.0)],
        sweep="h2",
    )
    # No adapter record: time known, cost not.
    _history(store, bed, "t2", "m2", [(None, 40.0, 1.0), (None, 50.0, 1.0)], sweep="h3")
    # Unfinished: no history.
    _history(store, bed, "t2", "m1", [(5.0, 5.0, 5.0)], sweep="h4", finished=False)

    estimate = estimate_sweep(store, _spec("new", ["t1", "t2"], ["m1", "m2"], 5))

    pairs = {(p.task, p.model): p for p in estimate.pairs}
    assert estimate.attempts == 20 and estimate.new_sweep and estimate.existing == 0
    assert estimate.active_beds == 2
    costs = [float(i) for i in range(1, 21)]
    t1m1 = pairs[("t1", "m1")]
    assert t1m1.executions == 20 >= FEW and t1m1.cost and t1m1.seconds
    assert t1m1.cost.median == pytest.approx(quantile(costs, 0.5))
    assert t1m1.cost.low == pytest.approx(quantile(costs, 0.1))
    assert t1m1.cost.high == pytest.approx(quantile(costs, 0.9))
    assert t1m1.seconds.median == pytest.approx(105.0)
    assert (t1m1.seconds.low, t1m1.seconds.high) == (pytest.approx(29.0), pytest.approx(181.0))
    t1m2 = pairs[("t1", "m2")]
    assert t1m2.cost and t1m2.seconds and t1m2.executions == 3
    assert (t1m2.cost.median, t1m2.cost.low, t1m2.cost.high) == (2.0, 1.0, 9.0)
    assert t1m2.seconds.median == pytest.approx(60.0, abs=0.01)
    assert t1m2.seconds.low == pytest.approx(30.0, abs=0.01)
    assert t1m2.seconds.high == pytest.approx(90.0, abs=0.01)
    t2m2 = pairs[("t2", "m2")]
    assert t2m2.cost is None and t2m2.seconds and t2m2.seconds.median == pytest.approx(45.0)
    assert pairs[("t2", "m1")].executions == 0

    cost = estimate.cost
    assert cost is not None and cost.attempts == 10
    assert cost.median == pytest.approx(5 * 10.5 + 5 * 2.0)
    assert cost.low == pytest.approx(5 * 2.9 + 5 * 1.0)
    assert cost.high == pytest.approx(5 * 18.1 + 5 * 9.0)
    bed_time = estimate.bed_seconds
    assert bed_time is not None and bed_time.attempts == 15
    assert bed_time.median == pytest.approx(5 * 105 + 5 * 60 + 5 * 45, abs=0.1)
    wall = estimate.wall_seconds
    assert wall is not None and wall.median == pytest.approx(bed_time.median / 2)
    assert [(p.task, p.model) for p in estimate.without_history()] == [("t2", "m1")]
    assert [(p.task, p.model) for p in estimate.without_cost()] == [("t2", "m2")]

    text = estimate.describe()
    assert "no history for 1 of 4 (task, model) pairs: cost and time unknown for 5 attempts" in text
    assert "(t2, m1)" in text and "no recorded cost for 1 of 4 pairs" in text
    assert "2 active beds of pool kb_docs" in text and "cost ≈ $62.50" in text
    by_model = {row["model"]: row for row in estimate.as_dict()["models"]}
    assert by_model["m1"]["attempts"] == 10 and by_model["m1"]["attempts_without_history"] == 5
    assert by_model["m2"]["cost_usd"]["median"] == pytest.approx(10.0)


def test_only_the_most_recent_executions_count(store: Store) -> None:
    """Old, dear executions beyond the most recent `recent` ones leave the figures alone."""
    bed = _bed(store, "b1")
    _history(store, bed, "t1", "m1", [(100.0, 1000.0, 1.0)] * 10, sweep="old", age=3600)
    _history(store, bed, "t1", "m1", [(1.0, 10.0, 1.0)] * 5, sweep="recent")
    spec = _spec("new", ["t1"], ["m1"], 2)
    pair = estimate_sweep(store, spec, recent=5).pairs[0]
    assert pair.executions == 5 and pair.cost and pair.cost.high == 1.0
    assert pair.seconds and pair.seconds.median == 10.0
    everything = estimate_sweep(store, spec).pairs[0]
    assert everything.executions == 15 and everything.cost and everything.cost.median == 100.0


def test_no_history_at_all_is_said(store: Store) -> None:
    estimate = estimate_sweep(store, _spec("new", ["t1", "t2"], ["m1"], 3))
    assert estimate.attempts == 6 and estimate.cost is None and estimate.wall_seconds is None
    text = estimate.describe()
    assert "no history: no (task, model) of this sweep has a finished execution" in text
    assert "unknown for all 6 attempts" in text and "cost ≈" not in text


def test_a_resubmit_is_estimated_for_its_missing_attempts_only(store: Store) -> None:
    """Existing attempts are not counted again; the figure matches what submit then creates;
    what submit refuses the estimate refuses too."""
    bed = _bed(store, "b1")
    _history(store, bed, "t1", "m1", [(2.0, 20.0, 1.0)] * 3, sweep="h1")
    _history(store, bed, "t1", "m2", [(4.0, 40.0, 1.0)] * 3, sweep="h2")
    first = _spec("s", ["t1"], ["m1"], 2)
    submit(store, first)
    again = estimate_sweep(store, first)
    assert again.attempts == 0 and not again.new_sweep and again.existing == 2
    assert "nothing new" in again.describe()

    wider = _spec("s", ["t1"], ["m1", "m2"], 3)
    estimate = estimate_sweep(store, wider)
    pairs = {(p.task, p.model): p.attempts for p in estimate.pairs}
    assert pairs == {("t1", "m1"): 1, ("t1", "m2"): 3}
    assert estimate.existing == 2 and estimate.attempts == 4
    assert estimate.cost and estimate.cost.median == pytest.approx(1 * 2.0 + 3 * 4.0)
    assert "this file would add 4 attempts (2 already there)" in estimate.describe()
    assert submit(store, wider).created == estimate.attempts

    with pytest.raises(BadInput, match="agent"):
        estimate_sweep(store, _spec("s", ["t1"], ["m1"], 9, agent="other"))
    with store.session() as session:
        session.execute(update(Sweep).where(Sweep.name == "s").values(sealed_at=utcnow()))
    assert estimate_sweep(store, wider).attempts == 0  # nothing to add: a sealed sweep may say so
    with pytest.raises(BadInput, match="sealed"):
        estimate_sweep(store, _spec("s", ["t1"], ["m1", "m2"], 4))
    with store.session() as session:
        sweep_id = session.scalars(select(Sweep.id).where(Sweep.name == "s")).one()
        # The lifecycle refuses to cancel a sealed sweep: lift the seal for the cancelled case.
        session.execute(update(Sweep).where(Sweep.id == sweep_id).values(sealed_at=None))
    cancel_sweep(store, sweep_id)
    with pytest.raises(BadInput, match="cancelled"):
        estimate_sweep(store, wider)


def test_estimate_from_a_sweep_run_on_simulated_beds_stores_nothing(
    store: Store, tmp_path: Path
) -> None:
    """The figures are the quantiles of the executions a real (simulated) run recorded, and
    estimating writes no row anywhere."""
    make_beds(store, tmp_path, 2)
    sweep_id = submit(store, spec("first", tasks=1, trials=3)).sweep_id
    assert EmbeddedExecutor(store, sweep_id).run().errors == []
    with store.read() as session:
        recorded = session.execute(
            select(Attempt.model, Execution.cost_usd, Execution.bed_seconds).join(
                Attempt, Attempt.id == Execution.attempt_id
            )
        ).all()
    before = _rows(store)
    estimate = estimate_sweep(store, spec("second", tasks=2, trials=4))
    assert _rows(store) == before
    assert estimate.attempts == 16 and estimate.active_beds == 2
    for pair in estimate.pairs:
        if pair.task != "dv01_view_build":
            assert pair.executions == 0
            continue
        costs = [c for m, c, _ in recorded if m == pair.model and c is not None]
        seconds = [s for m, _, s in recorded if m == pair.model and s is not None]
        assert pair.executions == len(costs) == 3
        assert pair.cost and pair.cost.median == pytest.approx(quantile(costs, 0.5))
        assert (pair.cost.low, pair.cost.high) == (min(costs), max(costs))
        assert pair.seconds and pair.seconds.median == pytest.approx(quantile(seconds, 0.5))
    assert len(estimate.without_history()) == 2


def _cli(store: Store, home: Path, *args: str, code: int = 0) -> subprocess.CompletedProcess[str]:
    return run_process(store_env(home, store.url), *args, code=code)


def test_cli_dry_run_prints_the_estimate_and_stores_nothing(store: Store, tmp_path: Path) -> None:
    bed = _bed(store, "b1")
    _history(store, bed, "t1", "m1", [(1.0, 60.0, 1.0), (3.0, 180.0, 1.0)], sweep="h1")
    file = tmp_path / "sweep.yaml"
    file.write_text(
        "name: s\nfixtures: [kb_docs]\ntasks: [t1, t2]\nmodels: [m1, m2]\ntrials: 3\nbudget_usd: 5\n"
    )
    home = tmp_path / "home"
    before = _rows(store)

    text = _cli(store, home, "sweep", "submit", str(file), "--dry-run").stdout
    assert "dry run: sweep s would be submitted with 12 attempts; nothing stored" in text
    assert "cost ≈ $6.00 (range $3.00-$9.00) for 3 of 12 attempts" in text
    assert "above the sweep's budget_usd ($5.00)" in text
    assert "wall time ≈ 6 min" in text and "1 active bed of pool kb_docs" in text
    assert "no history for 3 of 4 (task, model) pairs: cost and time unknown for 9 attempts" in text
    lines = {line.split()[0]: line.split() for line in text.splitlines() if line.strip()}
    assert lines["m1"][1:3] == ["6", "3"] and lines["m2"][1:3] == ["6", "6"]
    assert lines["total"][1] == "12"

    data = json.loads(_cli(store, home, "sweep", "submit", str(file), "--dry-run", "--json").stdout)
    assert data["attempts"] == 12 and data["cost_usd"]["median"] == 6.0
    assert len(data["pairs_without_history"]) == 3 and data["active_beds"] == 1
    assert _rows(store) == before

    wait = _cli(store, home, "sweep", "submit", str(file), "--dry-run", "--wait", code=2)
    assert "--dry-run" in wait.stderr and "--wait" in wait.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: s\ntasks: [t1]\nmodels: [m1]\ntrials: 0\ncolour: red\n")
    refused = _cli(store, home, "sweep", "submit", str(bad), "--dry-run", code=2)
    assert "trials" in refused.stderr and "colour: unknown key" in refused.stderr
    assert _rows(store) == before

    # Submitted for real, the same file again is estimated as nothing new.
    assert "12 new attempts" in _cli(store, home, "sweep", "submit", str(file)).stdout
    assert "nothing new" in _cli(store, home, "sweep", "submit", str(file), "--dry-run").stdout
