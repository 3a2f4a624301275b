"""A sweep that declares `stop:` stops claiming once its comparison is decided: on simulated beds,
embedded (SQLite and PostgreSQL) and on Celery workers, with `apg-farm report` saying so."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from apg_farm.contract import COUNTED, Outcome
from apg_farm.errors import BadInput
from apg_farm.fixtures import simbed
from apg_farm.scheduler import publish_attempts, submit
from apg_farm.specs import StopSpec
from apg_farm.store import (
    STOP,
    Attempt,
    AttemptState,
    Execution,
    Store,
    Sweep,
    retry_attempts,
)
from apg_farm.workers import EmbeddedExecutor
from tests.support.celery_farm import celery_app, wait_done
from tests.support.cli_runner import run_process, store_env
from tests.support.services import RedisServer, Workers
from tests.support.simbeds import make_beds, spec

STRONG, WEAK = simbed.DEFAULT_MODELS[:2]
TASKS = simbed.DEFAULT_TASKS[:2]
#: A far better than B on both tasks: the test decides after a dozen pairs or so.
SKILL = {"skill": {STRONG: dict.fromkeys(TASKS, 0.95), WEAK: dict.fromkeys(TASKS, 0.05)}}
TRIALS = 15


def _stop_spec(name: str) -> Any:
    return spec(
        name,
        task_ids=TASKS,
        models=2,
        trials=TRIALS,
        diff=False,
        stop=StopSpec(compare=[STRONG, WEAK], alpha=0.05, min_pairs=4),
    )


def _check_stopped(store: Store, sweep_id: int) -> dict[str, Any]:
    """The sweep stopped early, decided for STRONG; the queue was cancelled with the decision's
    reason and nothing of it ran; what ran finished and counted once."""
    with store.session() as session:
        sweep = session.get_one(Sweep, sweep_id)
        state = (sweep.meta or {}).get(STOP) or {}
        assert state.get("decision"), f"the sweep never stopped; its test's last look: {state}"
        decision: dict[str, Any] = state["decision"]
        attempts = list(session.scalars(select(Attempt).where(Attempt.sweep_id == sweep_id)))
        executions = list(session.scalars(select(Execution)))
    assert decision["kind"] == "decided" and decision["winner"] == STRONG
    assert decision["e_value"] >= 20 and decision["p_anytime"] <= 0.05
    assert 4 <= decision["pairs"] < TRIALS * len(TASKS)
    assert decision["reason"].startswith(
        f"stopped: {STRONG} vs {WEAK} decided after {decision['pairs']} pairs"
    )
    assert all(a.state == AttemptState.DONE for a in attempts)
    stopped = [a for a in attempts if a.reason == decision["reason"]]
    assert stopped and all(a.outcome == Outcome.CANCELLED for a in stopped)
    ran = {e.attempt_id for e in executions}
    # Cancelled from the queue, never started; and no attempt that ran was cut short. The
    # decision cancels what it can lock; one a claimer held that instant (PostgreSQL, skip
    # locked) is cancelled by that claim or the next look, with the same reason.
    assert {a.id for a in attempts if a.id not in ran} == {a.id for a in stopped}
    assert 0 <= decision["cancelled"] <= len(stopped)
    assert not any(a.outcome == Outcome.CANCELLED and a.id in ran for a in attempts)
    for attempt in attempts:
        finals = [
            e for e in executions if e.attempt_id == attempt.id and e.result in Outcome.__members__
        ]
        assert len(finals) == (0 if attempt.outcome == Outcome.CANCELLED else 1), attempt.id
    counted = sum(a.outcome in COUNTED for a in attempts)
    # Far fewer than the 60 planned ran: the decision's pairs and what was running then.
    assert 2 * decision["pairs"] <= counted < 2 * decision["pairs"] + 6, counted
    return decision


def _report(store: Store, name: str, home: Path, fmt: str) -> str:
    """`apg-farm report` as a process, on this store."""
    return _cli(store, home, "report", name, "--format", fmt)


def _cli(store: Store, home: Path, *args: str) -> str:
    """`apg-farm ARGS` as a process, on this store: its stdout."""
    return run_process(store_env(home, store.url, COLUMNS="200"), *args).stdout


def test_a_decided_comparison_stops_the_sweep_and_the_report_says_so(
    store: Store, tmp_path: Path
) -> None:
    make_beds(store, tmp_path, 3, config=SKILL)
    sweep_id = submit(store, _stop_spec("stopping")).sweep_id
    result = EmbeddedExecutor(store, sweep_id).run()
    assert not result.errors and not result.stranded, result
    decision = _check_stopped(store, sweep_id)

    report = json.loads(_report(store, "stopping", tmp_path / "home", "json"))
    stop = report["stop"]
    assert stop["stopped"] and not stop["fixed_n_valid"]
    assert stop["decision"]["pairs"] == decision["pairs"]
    assert "not valid under optional stopping" in stop["note"]
    (row,) = report["comparisons"]
    assert row["anytime"]["e_value"] == decision["e_value"] and row["fixed_n_valid"] is False
    assert row["p_value"] is not None  # the fixed-n figure stays, beside the anytime one
    text = _report(store, "stopping", tmp_path / "home", "table")
    assert f"STOPPED, decided after {decision['pairs']} pairs" in text
    assert "not valid under optional stopping" in text
    compared = json.loads(
        _cli(store, tmp_path / "home", "compare", "stopping", "stopping", "--format", "json")
    )
    assert compared["stop"]["a"]["decision"]["pairs"] == decision["pairs"]
    html = _report(store, "stopping", tmp_path / "home", "html")
    assert 'id="stop"' in html and "anytime p" in html

    # The question is answered: no retry, no re-submit, no change of rule.
    with pytest.raises(BadInput, match="decided after"):
        retry_attempts(store, sweep_id, {Outcome.CANCELLED})
    with pytest.raises(BadInput, match="decided after"):
        submit(store, _stop_spec("stopping").model_copy(update={"trials": TRIALS + 5}))


def test_a_stop_rule_cannot_change_nor_take_new_tasks_once_submitted(store: Store) -> None:
    first = _stop_spec("fixed")
    submit(store, first)
    looser = first.model_copy(update={"stop": StopSpec(compare=[STRONG, WEAK], alpha=0.1)})
    with pytest.raises(BadInput) as changed:
        submit(store, looser)
    assert changed.value.field == "stop"
    with pytest.raises(BadInput) as tasks:
        submit(store, first.model_copy(update={"tasks": [*TASKS, simbed.DEFAULT_TASKS[2]]}))
    assert tasks.value.field == "tasks"
    # More trials continue the sequence: allowed.
    assert submit(store, first.model_copy(update={"trials": TRIALS + 1})).created == 4


@pytest.mark.slow
def test_a_decided_comparison_stops_a_celery_sweep(
    celery_farm: tuple[Store, Workers], redis: RedisServer, tmp_path: Path
) -> None:
    store, workers = celery_farm
    beds = make_beds(store, tmp_path / "beds", 3, config=SKILL)
    sweep_id = submit(store, _stop_spec("celery-stop")).sweep_id
    for bed in beds:
        workers.start(bed.name)
    with store.session() as session:
        ids = list(session.scalars(select(Attempt.id).where(Attempt.sweep_id == sweep_id)))
    assert publish_attempts(store, celery_app(redis), ids) == len(ids)
    wait_done(store, sweep_id, redis, workers)
    decision = _check_stopped(store, sweep_id)
    text = _report(store, "celery-stop", tmp_path / "home", "table")
    assert f"STOPPED, decided after {decision['pairs']} pairs" in text
