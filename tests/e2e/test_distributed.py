"""Distributed mode with real parts: redis-server, PostgreSQL, `apg-farm worker` processes, simulated beds."""

from __future__ import annotations

import ast
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from apg_farm.fixtures import simbed
from apg_farm.scheduler import pool_queue, publish_attempts, submit
from apg_farm.store import Attempt, AttemptState, Bed, Execution, Phase, Store
from apg_farm.workers import EmbeddedExecutor
from tests.support.celery_farm import assert_counted_once_and_no_overlap, celery_app, wait_done
from tests.support.services import RedisServer, Workers
from tests.support.simbeds import make_beds, spec


def _counts(store: Store, sweep_id: int) -> Counter[tuple[str, str, str]]:
    with store.session() as session:
        return Counter(
            (a.task, a.model, a.outcome or "")
            for a in session.scalars(select(Attempt).where(Attempt.sweep_id == sweep_id))
        )


def test_distributed_equals_embedded(
    celery_farm: tuple[Store, Workers], redis: RedisServer, tmp_path: Path
) -> None:
    """40 attempts on 4 worker processes give the same outcomes per (task, model) as the embedded mode."""
    store, workers = celery_farm
    beds = make_beds(store, tmp_path / "dist", 4)
    sweep = spec("equal", task_ids=simbed.DEFAULT_TASKS, models=2, trials=5)
    sweep_id = submit(store, sweep).sweep_id
    for bed in beds:
        workers.start(bed.name)
    assert publish_attempts(store, celery_app(redis), range(1, 41)) == 40
    # 10 attempts a bed; an attempt takes 1 s on a quiet machine, 10-18 s under a loaded CI.
    wait_done(store, sweep_id, redis, workers, timeout=400)
    assert_counted_once_and_no_overlap(store, beds)

    embedded = Store(f"sqlite:///{tmp_path / 'embedded.db'}")
    make_beds(embedded, tmp_path / "emb", 4)
    local_id = submit(embedded, sweep).sweep_id
    EmbeddedExecutor(embedded, local_id).run()
    assert _counts(store, sweep_id) == _counts(embedded, local_id)
    assert sum(_counts(store, sweep_id).values()) == 40


def test_sigkilled_worker_attempt_runs_again_once(
    celery_farm: tuple[Store, Workers], redis: RedisServer, tmp_path: Path
) -> None:
    """SIGKILL a worker mid-attempt: the attempt runs again on a verified, reset bed and counts once."""
    store, workers = celery_farm
    beds = make_beds(store, tmp_path, 3, config={"time_scale": 60})
    sweep_id = submit(store, spec("kill", tasks=1, models=1, trials=3)).sweep_id
    for bed in beds:
        workers.start(bed.name)
    publish_attempts(store, celery_app(redis), range(1, 4))
    victim = _wait_for_run_phase(store, deadline=60)
    workers.kill(victim)
    wait_done(store, sweep_id, redis, workers)
    assert_counted_once_and_no_overlap(store, beds)
    with store.session() as session:
        lost = session.scalars(select(Execution).where(Execution.result == "LOST")).all()
        assert len(lost) == 1
        again = session.scalars(
            select(Execution).where(
                Execution.attempt_id == lost[0].attempt_id, Execution.id != lost[0].id
            )
        ).one()
        bed = session.get_one(Bed, again.bed_id)
        phases = [
            p.name
            for p in session.scalars(
                select(Phase).where(Phase.execution_id == again.id).order_by(Phase.id)
            )
        ]
    assert bed.name != victim
    # The new try starts from checked judging code, a trusted verify and a reset, and ends with
    # its grade, then its run folder moved off the bed.
    assert phases[:4] == ["escrow_check", "ddev_check", "verify_before", "reset"]
    assert phases[-2:] == ["grade", "evidence"]


def test_a_restarted_worker_waits_for_its_dead_predecessors_lease(
    celery_farm: tuple[Store, Workers], redis: RedisServer, tmp_path: Path
) -> None:
    """One bed; its worker is SIGKILLed mid-attempt and started again at once, while the dead
    one's lease still runs. The next message is the bed's own to run once that lease ends: the
    new worker waits (the claim's refusal: bed busy) and never hands it back."""
    store, workers = celery_farm
    (bed,) = make_beds(store, tmp_path, 1, config={"time_scale": 60})
    sweep_id = submit(store, spec("heir", tasks=1, models=1, trials=3)).sweep_id
    # A lease that outlasts a worker's start, so the heir meets it still running.
    workers.env = {**workers.env, "APG_FARM_LEASE_SECONDS": "15"}
    workers.start(bed.name)
    publish_attempts(store, celery_app(redis), range(1, 4))
    _wait_for_run_phase(store, deadline=60)
    workers.kill(bed.name)
    workers.start(bed.name)
    wait_done(store, sweep_id, redis, workers, timeout=180)
    assert_counted_once_and_no_overlap(store, [bed])
    with store.session() as session:
        attempts = session.scalars(select(Attempt).where(Attempt.sweep_id == sweep_id)).all()
        lost = session.scalars(select(Execution).where(Execution.result == "LOST")).all()
    assert len(lost) == 1
    assert len(attempts) == 3
    logs = workers.logs()
    # It waited for the lease, and handed nothing back (a hand-back counts towards the
    # attempt's HAND_BACK_LIMIT, past which a retry may go to the bed it was meant to avoid).
    assert "bed busy" in logs and "excluded here" not in logs, logs


def _wait_for_run_phase(store: Store, deadline: float) -> str:
    """The name of a bed that is inside an attempt's run phase right now."""
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        with store.session() as session:
            row = session.execute(
                select(Bed.name)
                .join(Execution, Execution.bed_id == Bed.id)
                .where(Execution.agent_started.is_(True), Execution.finished_at.is_(None))
                .limit(1)
            ).first()
        if row:
            time.sleep(0.2)  # inside the run phase (it lasts seconds at this time scale)
            return str(row[0])
        time.sleep(0.05)
    pytest.fail("no attempt reached its run phase")


def test_redis_restart_loses_no_attempt(
    celery_farm: tuple[Store, Workers], redis: RedisServer, tmp_path: Path
) -> None:
    """Restarting redis-server mid-sweep (every message lost) still ends with every attempt done once."""
    store, workers = celery_farm
    beds = make_beds(store, tmp_path, 3, config={"time_scale": 400})
    sweep_id = submit(store, spec("restart", tasks=2, models=2, trials=4)).sweep_id
    for bed in beds:
        workers.start(bed.name)
    publish_attempts(store, celery_app(redis), range(1, 17))
    end = time.monotonic() + 60
    while time.monotonic() < end:
        with store.session() as session:
            done = session.scalars(
                select(Attempt.id).where(Attempt.state == AttemptState.DONE)
            ).all()
        if len(done) >= 3:
            break
        time.sleep(0.1)
    redis.restart()
    wait_done(store, sweep_id, redis, workers, timeout=180)
    assert_counted_once_and_no_overlap(store, beds)
    with store.session() as session:
        assert len(session.scalars(select(Attempt)).all()) == 16


def test_duplicate_and_late_messages_do_nothing(
    celery_farm: tuple[Store, Workers], redis: RedisServer, tmp_path: Path
) -> None:
    """Every message sent three times: no bed runs two attempts at once, each counts once; a late one is a no-op."""
    store, workers = celery_farm
    beds = make_beds(store, tmp_path, 2)
    sweep_id = submit(store, spec("dupes", tasks=2, models=2, trials=2)).sweep_id
    app = celery_app(redis)
    assert publish_attempts(store, app, range(1, 9)) == 8
    for attempt_id in range(1, 9):  # the same attempt twice more, as at-least-once delivery may
        for copy in ("dup-a", "dup-b"):
            app.send_task(
                "apg_farm.run_attempt",
                args=(attempt_id,),
                queue=pool_queue(beds[0].pool),
                task_id=f"{copy}-{attempt_id}",
            )
    for bed in beds:
        workers.start(bed.name)
    wait_done(store, sweep_id, redis, workers)
    _wait_drained(redis, pool_queue(beds[0].pool))
    assert_counted_once_and_no_overlap(store, beds)
    with store.session() as session:
        before = len(session.scalars(select(Execution)).all())
        finished = session.scalars(select(Attempt)).first()
        assert finished is not None
    assert before == 8
    # A message for a finished attempt (a redelivery after a visibility timeout, say).
    app.send_task("apg_farm.run_attempt", args=(finished.id,), queue=pool_queue(finished.pool))
    _wait_drained(redis, pool_queue(finished.pool))
    with store.session() as session:
        assert len(session.scalars(select(Execution)).all()) == before


def _wait_drained(redis: RedisServer, queue: str, timeout: float = 30) -> None:
    """Until every message of the queue was taken and acknowledged."""
    import redis as redis_client

    client = redis_client.Redis.from_url(redis.url)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if client.llen(queue) == 0 and client.hlen("unacked") == 0:
            client.close()
            return
        time.sleep(0.1)
    client.close()
    pytest.fail(f"queue {queue} not drained")


def test_maintenance_goes_to_the_beds_own_worker(
    celery_farm: tuple[Store, Workers], redis: RedisServer, tmp_path: Path
) -> None:
    """`bed doctor --via-worker` reaches the bed's worker through `bed.<name>` and prints its verdict."""
    import subprocess
    import sys

    store, workers = celery_farm
    make_beds(store, tmp_path, 2)
    workers.start("bed1")
    done = subprocess.run(
        [sys.executable, "-m", "apg_farm", "bed", "doctor", "bed1", "--via-worker"],
        env=workers.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("healthy")


class _Events:
    """The workers' task-succeeded events, as Flower receives them (a Celery event consumer).

    One subscription for the whole test: Redis delivers events by publish/subscribe, so any
    moment without one would lose them. A worker's online or heartbeat event shows it is live.
    """

    def __init__(self, redis: RedisServer) -> None:
        self.app = celery_app(redis)
        self.results: dict[str, str] = {}
        self.worker_seen = threading.Event()
        self._receiver: Any = None
        self._thread = threading.Thread(target=self._listen, daemon=True)

    def __enter__(self) -> _Events:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        if self._receiver is not None:
            self._receiver.should_stop = True
        self._thread.join(timeout=10)

    def _listen(self) -> None:
        def succeeded(event: dict[str, Any]) -> None:
            self.results[event["uuid"]] = event["result"]

        def worker(event: dict[str, Any]) -> None:
            self.worker_seen.set()

        handlers = {
            "task-succeeded": succeeded,
            "worker-online": worker,
            "worker-heartbeat": worker,
        }
        with self.app.connection() as connection:
            self._receiver = self.app.events.Receiver(connection, handlers=handlers)
            self._receiver.capture(limit=None, timeout=None, wakeup=False)


def test_each_tasks_result_names_the_attempts_outcome(
    celery_farm: tuple[Store, Workers], redis: RedisServer, tmp_path: Path
) -> None:
    """What Flower shows of each run_attempt (its task-succeeded event) holds the attempt's
    outcome, FAILED included, not only the task's SUCCESS; a duplicate message says it was
    dropped, with no outcome."""
    store, workers = celery_farm
    beds = make_beds(store, tmp_path, 1)
    sweep_id = submit(store, spec("flower", tasks=3, models=2, trials=2)).sweep_id
    with _Events(redis) as events:
        workers.start(beds[0].name)
        assert events.worker_seen.wait(120), workers.logs()
        app = celery_app(redis)
        assert publish_attempts(store, app, range(1, 13)) == 12
        wait_done(store, sweep_id, redis, workers)
        app.send_task("apg_farm.run_attempt", args=(1,), queue=pool_queue(beds[0].pool))
        deadline = time.monotonic() + 60
        while len(events.results) < 13 and time.monotonic() < deadline:
            time.sleep(0.2)
    results = [ast.literal_eval(text) for text in events.results.values()]
    ran = {r["attempt"]: r for r in results if r["ended"] == "recorded"}
    with store.read() as session:
        outcomes = {a.id: a.outcome for a in session.scalars(select(Attempt))}
    assert {a: r["outcome"] for a, r in ran.items()} == outcomes, workers.logs()
    assert {"PASSED", "FAILED"} <= set(outcomes.values()), outcomes
    assert all(r["bed"] == beds[0].name and r["sweep"] == "flower" for r in ran.values())
    dropped = [r for r in results if r["ended"] == "dropped"]
    assert dropped == [
        {
            "attempt": 1,
            "outcome": None,
            "ended": "dropped",
            "bed": beds[0].name,
            "refused": "not queued",
            "detail": dropped[0]["detail"],
        }
    ], results
