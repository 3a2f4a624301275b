"""A harness's sweep (Inspect) belongs to the harness: no farm worker claims its attempts and the
scheduler sends them no message; the harness claims only its own. And what the lifecycle does
for one sample: its attempt added alone (never a cross product), found again on a retry."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from sqlalchemy import select

from apg_farm.contract import Why
from apg_farm.errors import BadInput
from apg_farm.scheduler import submit
from apg_farm.specs import SweepSpec, pool_key
from apg_farm.store import (
    Attempt,
    Claim,
    Refusal,
    Store,
    Sweep,
    cancel_attempt,
    cancel_sweep,
    claim,
    open_harness_attempt,
)
from tests.support.rows import POOL, add_bed

FIXTURES = POOL.split(",")


def _spec(
    name: str = "run-1", task: str = "dv01_view_build", model: str = "m/a", trial: int = 1
) -> SweepSpec:
    return SweepSpec(
        name=name,
        fixtures=FIXTURES,
        tasks=[task],
        models=[model],
        trials=trial,
        agent="inspect",
        dataset="droost_build_tasks",
    )


def _open(store: Store, task: str = "dv01_view_build", model: str = "m/a", trial: int = 1) -> int:
    return open_harness_attempt(
        store,
        _spec(task=task, model=model, trial=trial),
        driver="inspect",
        task=task,
        model=model,
        trial=trial,
    ).attempt_id


def test_a_worker_never_claims_a_harness_attempt_and_the_harness_does(store: Store) -> None:
    bed = add_bed(store, "b1")
    attempt = _open(store)
    worker = claim(store, bed, lease_seconds=60, worker="w")
    assert isinstance(worker, Refusal) and worker.why == Why.NOTHING
    named = claim(store, bed, lease_seconds=60, worker="w", attempt_id=attempt)
    assert isinstance(named, Refusal) and named.why == Why.NOT_QUEUED
    assert "driven by inspect" in named.detail
    harness = claim(store, bed, lease_seconds=60, worker="inspect@h:1", driver="inspect")
    assert isinstance(harness, Claim) and harness.attempt_id == attempt


def test_the_harness_never_claims_the_farms_own_attempts(store: Store) -> None:
    bed = add_bed(store, "b1")
    submit(store, SweepSpec(name="farm", fixtures=FIXTURES, tasks=["t1"], models=["m"], trials=1))
    refused = claim(store, bed, lease_seconds=60, worker="inspect@h:1", driver="inspect")
    assert isinstance(refused, Refusal) and refused.why == Why.NOTHING
    taken = claim(store, bed, lease_seconds=60, worker="w")
    assert isinstance(taken, Claim) and taken.sweep_name == "farm"


def test_a_sample_adds_its_own_attempt_only_and_finds_it_again(store: Store) -> None:
    first = _open(store, task="t1", model="m/a")
    _open(store, task="t2", model="m/b", trial=3)
    assert _open(store, task="t1", model="m/a") == first
    with store.read() as session:
        keys = sorted((a.task, a.model, a.trial) for a in session.scalars(select(Attempt)))
        sweep = session.scalars(select(Sweep)).one()
    # Exactly what ran, never the cross product a submitted spec expands to.
    assert keys == [("t1", "m/a", 1), ("t2", "m/b", 3)]
    assert sweep.driver == "inspect"
    assert sweep.spec["tasks"] == ["t1", "t2"] and sweep.spec["models"] == ["m/a", "m/b"]
    assert sweep.spec["trials"] == 3


def test_a_harness_does_not_write_into_a_farm_sweep_or_another_dataset(store: Store) -> None:
    submit(store, SweepSpec(name="run-1", fixtures=FIXTURES, tasks=["t1"], models=["m"], trials=1))
    with pytest.raises(BadInput, match="driven by the farm"):
        _open(store)
    open_harness_attempt(store, _spec(name="run-2"), driver="inspect", task="t", model="m", trial=1)
    other = _spec(name="run-2").model_copy(update={"dataset": "other_tasks"})
    with pytest.raises(BadInput, match="dataset"):
        open_harness_attempt(store, other, driver="inspect", task="t", model="m", trial=2)


def test_a_sample_cancelled_before_a_bed_took_it_ends_cancelled(store: Store) -> None:
    bed = add_bed(store, "b1")
    attempt = _open(store)
    assert cancel_attempt(store, attempt, "interrupted")
    with store.read() as session:
        row = session.get_one(Attempt, attempt)
        assert (row.state, row.outcome) == ("done", "CANCELLED")
    # A claimed attempt is the verdict's to end, not this.
    second = _open(store, trial=2)
    taken = claim(store, bed, lease_seconds=60, worker="inspect@h:1", driver="inspect")
    assert isinstance(taken, Claim) and taken.attempt_id == second
    assert not cancel_attempt(store, second, "interrupted")


def test_an_interrupted_sample_run_again_is_queued_again_in_an_open_sweep_only(
    store: Store,
) -> None:
    """#32: an eval set resumed runs its interrupted samples again; their attempts (CANCELLED,
    counted nowhere) are taken again, the finished sweep open; a cancelled sweep stays closed."""
    bed = add_bed(store, "b1")
    attempt = _open(store)
    assert cancel_attempt(store, attempt, "interrupted")
    assert _open(store) == attempt
    with store.read() as session:
        row = session.get_one(Attempt, attempt)
        assert (row.state, row.outcome) == ("queued", None)
        assert session.scalars(select(Sweep.state)).one() == "open"
    taken = claim(store, bed, lease_seconds=60, worker="inspect@h:1", driver="inspect")
    assert isinstance(taken, Claim) and taken.attempt_id == attempt

    other = open_harness_attempt(
        store, _spec(name="run-2"), driver="inspect", task="dv01_view_build", model="m/a", trial=1
    )
    cancel_sweep(store, other.sweep_id)
    again = open_harness_attempt(
        store, _spec(name="run-2"), driver="inspect", task="dv01_view_build", model="m/a", trial=1
    )
    assert (again.state, again.outcome) == ("done", "CANCELLED")


def test_the_reconciler_sends_no_message_for_a_harness_attempt(store: Store) -> None:
    # What the broker window would send, in claim order (scheduler/window.py).
    from apg_farm.scheduler.window import _candidates

    _open(store)
    submit(store, SweepSpec(name="farm", fixtures=FIXTURES, tasks=["t1"], models=["m"], trials=1))
    with store.read() as session:
        farm_ids = set(
            session.scalars(
                select(Attempt.id)
                .join(Sweep, Sweep.id == Attempt.sweep_id)
                .where(Sweep.name == "farm")
            )
        )
    with store.read() as session:
        sent = set(_candidates(store, session, pool_key(FIXTURES), 100, grace=False))
    assert sent == farm_ids


def test_two_inspect_tasks_over_the_same_ids_are_two_sweeps_each_counted_once(
    store: Store,
) -> None:
    """#32: two Inspect tasks of one run over the same APG task, model and epoch. The run's sweep
    belongs to the task whose sample made it; the other task's samples go to a sweep of its own
    (`<sweep>.<task>`), every sample an attempt of its own, found again when retried."""
    from apg_farm.inspect.config import ApgConfig
    from apg_farm.inspect.sample_bed import SampleKey, _open_attempt
    from apg_farm.store import SweepOwned

    config = ApgConfig(fixtures=FIXTURES, dataset="droost_build_tasks")

    def key(inspect_task: str, trial: int = 1) -> SampleKey:
        return SampleKey(
            sweep="inspect-run-1",
            task="dv01_view_build",
            model="m/a",
            trial=trial,
            dataset="droost_build_tasks",
            record={"inspect_task": inspect_task, "sample_id": "dv01_view_build"},
        )

    with_tool = _open_attempt(store, config, key("with_tool"))
    without = _open_attempt(store, config, key("without_tool"))
    assert with_tool.sweep_name == "inspect-run-1"
    assert without.sweep_name == "inspect-run-1.without_tool"
    assert with_tool.attempt_id != without.attempt_id
    # A retry of either sample (or a later epoch) finds its own sweep and attempt again.
    assert _open_attempt(store, config, key("without_tool")).attempt_id == without.attempt_id
    assert _open_attempt(store, config, key("with_tool")).attempt_id == with_tool.attempt_id
    assert _open_attempt(store, config, key("without_tool", 2)).sweep_name == without.sweep_name
    with store.read() as session:
        rows = session.execute(select(Sweep.name, Attempt.trial).join(Attempt)).all()
    assert sorted(rows) == [
        ("inspect-run-1", 1),
        ("inspect-run-1.without_tool", 1),
        ("inspect-run-1.without_tool", 2),
    ]

    # The lifecycle refuses another owner's sweep; a sweep made before owners were recorded
    # belongs to the Inspect task its first sample named.
    def own(name: str, trial: int = 1, **by: Any) -> None:
        open_harness_attempt(
            store, _spec(name=name), driver="inspect", task="t", model="m", trial=trial, **by
        )

    with pytest.raises(SweepOwned):
        own("inspect-run-1", owner="third")
    own("legacy", meta={"inspect_task": "old_task"})
    with pytest.raises(SweepOwned, match="old_task"):
        own("legacy", 2, owner="new_task")
    # When both names are held by other tasks the sample is refused in one line naming the fix.
    own("legacy.y", owner="z")
    with pytest.raises(BadInput, match="sweep:"):
        _open_attempt(
            store, config, replace(key("x"), sweep="legacy", record={"inspect_task": "y"})
        )
