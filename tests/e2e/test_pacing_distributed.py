"""Spend and pace with real Celery worker processes racing on PostgreSQL (#12): a sweep budget
and a model's max_concurrent hold, a paused sweep's messages are dropped, not passed round, and
raising the budget resumes it through the reconciler without a resubmit."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import func, select

from apg_farm.fixtures import simbed
from apg_farm.scheduler import publish_attempts, reconcile, submit, sweep_status
from apg_farm.store import Attempt, AttemptState, Execution, Store, set_sweep_budget
from tests.store.test_pacing import _max_overlap
from tests.support.celery_farm import (
    LEASE,
    assert_counted_once_and_no_overlap,
    celery_app,
    wait_done,
)
from tests.support.services import RedisServer, Workers
from tests.support.simbeds import make_beds, spec

M0 = simbed.DEFAULT_MODELS[0]


def _wait_paused(store: Store, sweep_id: int, redis: RedisServer, timeout: float = 120) -> None:
    """Reconcile until the sweep is paused by its budget with nothing running."""
    app = celery_app(redis)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = sweep_status(store, sweep_id)
        if status["paused"] and status["states"]["running"] == 0:
            return
        with contextlib.suppress(Exception):
            reconcile(store, app, redis.url, unacked_grace=LEASE)
        time.sleep(0.5)
    pytest.fail(f"sweep never paused: {sweep_status(store, sweep_id)}")


def test_celery_workers_racing_keep_the_budget_and_max_concurrent(
    celery_farm: tuple[Store, Workers], redis: RedisServer, tmp_path: Path
) -> None:
    store, workers = celery_farm
    beds = make_beds(store, tmp_path, 4)
    calibrate = submit(store, spec("calibrate", tasks=1, trials=1)).sweep_id
    for bed in beds:
        workers.start(bed.name)
    publish_attempts(store, celery_app(redis), _queued(store, calibrate))
    wait_done(store, calibrate, redis, workers)
    with store.read() as session:
        mean = (
            session.scalar(
                select(func.avg(Execution.cost_usd))
                .join(Attempt, Attempt.id == Execution.attempt_id)
                .where(Attempt.sweep_id == calibrate)
            )
            or 0.0
        )
    budget = 8 * mean
    sweep_id = submit(
        store, spec("paced", tasks=2, trials=8, budget_usd=budget, max_concurrent={M0: 2})
    ).sweep_id
    publish_attempts(store, celery_app(redis), _queued(store, sweep_id))
    _wait_paused(store, sweep_id, redis)

    with store.read() as session:
        costs = [
            c or 0.0
            for c in session.scalars(
                select(Execution.cost_usd)
                .join(Attempt, Attempt.id == Execution.attempt_id)
                .where(Attempt.sweep_id == sweep_id)
            )
        ]
        queued = session.scalar(
            select(func.count()).where(
                Attempt.sweep_id == sweep_id, Attempt.state == AttemptState.QUEUED
            )
        )
    spent = sweep_status(store, sweep_id)["spend"]["spent_usd"]
    assert spent == pytest.approx(sum(costs), rel=1e-6)
    assert budget <= spent <= budget + len(beds) * max(costs)
    assert queued and queued > 0
    # `--wait` (here through `sweep resume`) does not wait for a person: it says why and exits 1.
    waited = subprocess.run(
        [sys.executable, "-m", "apg_farm", "sweep", "resume", "paced"],
        capture_output=True,
        text=True,
        env=workers.env,
        timeout=120,
    )
    assert waited.returncode == 1, waited.stdout + waited.stderr
    assert "paused: budget: sweep spent" in waited.stderr

    set_sweep_budget(store, sweep_id, None)
    wait_done(store, sweep_id, redis, workers, timeout=180)
    assert_counted_once_and_no_overlap(store, beds)
    with store.read() as session:
        m0 = [
            (started, finished)
            for started, finished in session.execute(
                select(Execution.started_at, Execution.finished_at)
                .join(Attempt, Attempt.id == Execution.attempt_id)
                .where(Attempt.sweep_id == sweep_id, Attempt.model == M0)
            )
            if finished is not None
        ]
    assert len(m0) >= 16 and _max_overlap(m0) <= 2


def _queued(store: Store, sweep_id: int) -> list[int]:
    with store.read() as session:
        return list(
            session.scalars(
                select(Attempt.id).where(
                    Attempt.sweep_id == sweep_id, Attempt.state == AttemptState.QUEUED
                )
            )
        )
