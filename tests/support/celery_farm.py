"""Shared parts of the tests that run real Celery workers: their environment, an app to send
with, waiting for a sweep like `apg-farm scheduler` would, and the counted-once check."""

from __future__ import annotations

import contextlib
import itertools
import os
import time
from pathlib import Path

import pytest
from sqlalchemy import select

from apg_farm.fixtures import simbed
from apg_farm.scheduler import reconcile
from apg_farm.settings import Settings
from apg_farm.store import Attempt, AttemptState, Bed, Execution, Store
from apg_farm.workers import make_app
from tests.support.services import RedisServer, Workers, sweep_done

#: Seconds of a worker's lease in these tests: short, so a killed worker's attempt returns soon.
LEASE = 3.0


def celery_env(store: Store, redis: RedisServer, home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("APG_FARM_")}
    env.update(
        APG_FARM_HOME=str(home),
        APG_FARM_DATABASE_URL=store.url,
        APG_FARM_BROKER_URL=redis.url,
        APG_FARM_LEASE_SECONDS=str(LEASE),
    )
    return env


def celery_app(redis: RedisServer):  # type: ignore[no-untyped-def]
    return make_app(Settings(broker_url=redis.url, database_url="sqlite://"))


def wait_done(
    store: Store, sweep_id: int, redis: RedisServer, workers: Workers, timeout: float = 120
) -> None:
    """Reconcile like `apg-farm scheduler` until every attempt is done."""
    app = celery_app(redis)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sweep_done(store, sweep_id):
            return
        with contextlib.suppress(Exception):  # the broker may be restarting
            reconcile(store, app, redis.url, unacked_grace=LEASE)
        time.sleep(0.5)
    pytest.fail(f"sweep not done in {timeout}s; worker logs:\n{workers.logs()}")


def assert_counted_once_and_no_overlap(store: Store, beds: list[Bed]) -> None:
    with store.session() as session:
        attempts = list(session.scalars(select(Attempt)))
        executions = list(session.scalars(select(Execution)))
    assert all(a.state == AttemptState.DONE and a.outcome for a in attempts)
    for attempt in attempts:
        finals = [
            e for e in executions if e.attempt_id == attempt.id and e.result == attempt.outcome
        ]
        assert len(finals) == 1, f"attempt {attempt.id} recorded {len(finals)} times"
    by_bed: dict[int, list[Execution]] = {}
    for e in executions:
        by_bed.setdefault(e.bed_id, []).append(e)
    for runs in by_bed.values():
        runs.sort(key=lambda e: e.started_at)
        for a, b in itertools.pairwise(runs):
            if a.result != "LOST":  # a killed worker's try has no end of its own
                assert a.finished_at is not None and a.finished_at <= b.started_at
    for bed in beds:
        assert not any(line.get("overlap") for line in simbed.read_log(Path(bed.approot)))
