"""The broker window (scheduler/window.py) with real parts: a redis-server of the test's own,
PostgreSQL, Celery's own sending, and real `apg-farm worker` processes on simulated beds.

A pool's queue holds `window_per_bed` messages per active bed whatever the sweep's size; a lost
message, an emptied Redis and a worker killed with its message unacknowledged each leave the
queue short, and one reconciler pass fills it again from the store.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import redis as redis_client
from sqlalchemy import func, select

from apg_farm.scheduler import pool_queue, reconcile, submit, top_up
from apg_farm.scheduler.broker_view import attempts_with_messages
from apg_farm.specs import parse_sweep
from apg_farm.store import Attempt, AttemptState, Bed, Store
from tests.support.celery_farm import (
    LEASE,
    assert_counted_once_and_no_overlap,
    celery_app,
    wait_done,
)
from tests.support.services import RedisServer, Workers, sweep_done
from tests.support.simbeds import make_beds, spec

#: Messages per active bed in these tests (the default).
PER_BED = 2


def _big(name: str, *, tasks: int, models: int, trials: int):  # type: ignore[no-untyped-def]
    return parse_sweep(
        {
            "name": name,
            "dataset": "droost_build_tasks",
            "tasks": [f"t{i:04d}" for i in range(tasks)],
            "models": [f"m{i:02d}" for i in range(models)],
            "trials": trials,
        }
    )


def _first_queued(store: Store, count: int) -> list[int]:
    """The first `count` queued attempts in claim order."""
    with store.read() as session:
        return list(
            session.scalars(
                select(Attempt.id)
                .where(Attempt.state == AttemptState.QUEUED)
                .order_by(Attempt.seq, Attempt.id)
                .limit(count)
            )
        )


def _age_sends(store: Store) -> None:
    """Every send older than the in-flight grace, as a pass a little later would see them."""
    from sqlalchemy import text

    with store.session() as session:
        session.execute(text("UPDATE attempts SET enqueued_at = enqueued_at - interval '1 min'"))


def test_submit_sends_only_the_window_and_a_pass_refills_it(
    pg_store: Store, redis: RedisServer, tmp_path: Path
) -> None:
    """10,000 attempts on a pool of 3 beds: the queue holds 6 messages, for the first 6 attempts
    in claim order, however often the reconciler runs; a lost message and an emptied Redis
    (FLUSHALL) are each made good by one pass."""
    store = pg_store
    beds = make_beds(store, tmp_path, 3)
    sweep = _big("wide", tasks=100, models=10, trials=10)
    assert submit(store, sweep).created == 10_000
    app = celery_app(redis)
    queue = pool_queue(beds[0].pool)
    client = redis_client.Redis.from_url(redis.url)
    try:
        assert reconcile(store, app, redis.url, per_bed=PER_BED).resent == 6
        assert client.llen(queue) == 6
        assert attempts_with_messages(redis.url, [queue]) == set(_first_queued(store, 6))
        for _ in range(3):
            assert reconcile(store, app, redis.url, per_bed=PER_BED).resent == 0
        assert client.llen(queue) == 6
        with store.read() as session:
            sent = session.scalar(select(func.count()).where(Attempt.dispatches > 0))
        assert sent == 6

        # A lost message (the next one a worker would have taken).
        client.rpop(queue)
        assert client.llen(queue) == 5
        assert reconcile(store, app, redis.url, per_bed=PER_BED).resent == 1
        assert client.llen(queue) == 6

        # Redis emptied: every message and the unacked set gone.
        client.flushall()
        assert reconcile(store, app, redis.url, per_bed=PER_BED).resent == 6
        assert client.llen(queue) == 6
        # Once the lost sends are past the in-flight grace, the window still holds 6: the
        # attempts whose messages were lost come first again as others are taken.
        _age_sends(store)
        assert reconcile(store, app, redis.url, per_bed=PER_BED).resent == 0
        assert client.llen(queue) == 6
    finally:
        client.close()


def test_the_window_follows_the_active_beds_and_the_setting(
    pg_store: Store, redis: RedisServer, tmp_path: Path
) -> None:
    """A quarantined bed's share leaves the window; `per_bed` sizes it; no bed, no message."""
    store = pg_store
    beds = make_beds(store, tmp_path, 2)
    submit(store, _big("sized", tasks=10, models=10, trials=10))
    app = celery_app(redis)
    queue = pool_queue(beds[0].pool)
    client = redis_client.Redis.from_url(redis.url)
    try:
        assert sum(w.sent for w in top_up(store, app, redis.url, per_bed=5)) == 10
        assert client.llen(queue) == 10
        client.delete(queue)
        from apg_farm.store import quarantine_bed

        quarantine_bed(store, beds[0].name, "test")
        assert sum(w.sent for w in top_up(store, app, redis.url, per_bed=3)) == 3
        assert client.llen(queue) == 3
        client.delete(queue)
        quarantine_bed(store, beds[1].name, "test")
        assert top_up(store, app, redis.url, per_bed=3) == []
        assert client.llen(queue) == 0
    finally:
        client.close()


def _queue_watch(redis: RedisServer, queue: str, stop: threading.Event, seen: list[int]) -> None:
    client = redis_client.Redis.from_url(redis.url)
    try:
        while not stop.wait(0.02):
            seen.append(int(client.llen(queue)))
    finally:
        client.close()


def test_finished_attempts_top_the_window_up_without_a_reconciler(
    celery_farm: tuple[Store, Workers], redis: RedisServer, tmp_path: Path
) -> None:
    """Only the submit's window is sent and no reconciler runs: each finished attempt sends the
    next, the sweep ends with every attempt counted once, and the queue never holds more than
    the window."""
    store, workers = celery_farm
    beds = make_beds(store, tmp_path, 2)
    sweep_id = submit(store, spec("chain", tasks=3, models=2, trials=4)).sweep_id
    app = celery_app(redis)
    queue = pool_queue(beds[0].pool)
    assert reconcile(store, app, redis.url, per_bed=PER_BED).resent == 4
    seen: list[int] = []
    stop = threading.Event()
    watcher = threading.Thread(target=_queue_watch, args=(redis, queue, stop, seen))
    watcher.start()
    try:
        for bed in beds:
            workers.start(bed.name)
        deadline = time.monotonic() + 120
        while not sweep_done(store, sweep_id):
            if time.monotonic() > deadline:
                pytest.fail(f"sweep not done without a reconciler\n{workers.logs()}")
            time.sleep(0.2)
    finally:
        stop.set()
        watcher.join()
    assert_counted_once_and_no_overlap(store, beds)
    assert seen and max(seen) <= 4, max(seen)


def test_a_worker_killed_with_its_message_unacked_is_made_good_by_one_pass(
    celery_farm: tuple[Store, Workers], redis: RedisServer, tmp_path: Path
) -> None:
    """SIGKILL a worker mid-attempt (its message stays unacknowledged in Redis): once its lease
    ends, one reconciler pass returns the attempt and sends it first; the sweep ends counted
    once."""
    store, workers = celery_farm
    beds = make_beds(store, tmp_path, 2, config={"time_scale": 60})
    sweep_id = submit(store, spec("killed", tasks=2, models=1, trials=3)).sweep_id
    app = celery_app(redis)
    queue = pool_queue(beds[0].pool)
    reconcile(store, app, redis.url, per_bed=PER_BED)
    workers.start(beds[0].name)
    victim = _running(store, deadline=60)
    workers.kill(beds[0].name)
    client = redis_client.Redis.from_url(redis.url)
    try:
        assert client.hlen("unacked") == 1  # the killed worker's message, never acknowledged
        time.sleep(LEASE + 1.5)  # the lease runs out; the unacked message is past its grace
        result = reconcile(store, app, redis.url, unacked_grace=LEASE, per_bed=PER_BED)
        assert result.expired == 1
        # The returned attempt has a message again: it waits first in line (seq order).
        assert victim in attempts_with_messages(redis.url, [queue], unacked_grace=0)
        assert client.llen(queue) == 2 * PER_BED
    finally:
        client.close()
    workers.start(beds[1].name)
    wait_done(store, sweep_id, redis, workers)
    assert_counted_once_and_no_overlap(store, beds)


def _running(store: Store, deadline: float) -> int:
    """The id of an attempt a bed is running now."""
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        with store.read() as session:
            found = session.scalar(
                select(Attempt.id)
                .join(Bed, Bed.id == Attempt.bed_id)
                .where(Attempt.state == AttemptState.RUNNING)
            )
        if found is not None:
            return int(found)
        time.sleep(0.05)
    pytest.fail("no attempt started")
