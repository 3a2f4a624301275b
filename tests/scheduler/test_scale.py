"""The store and the scheduler at scale: bulk submits, dispatch past PostgreSQL's parameter limit,
dispatch counts under concurrent dispatchers, a 100,000-attempt submit on a real Redis that holds
only the broker window, and the connections one process may open."""

from __future__ import annotations

import threading
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis as redis_client
import sqlalchemy as sa
from sqlalchemy import func, select

from apg_farm.scheduler import attempt_of, pool_queue, publish_attempts, reconcile, submit
from apg_farm.scheduler.broker_view import attempts_with_messages
from apg_farm.settings import Settings
from apg_farm.specs import SweepSpec, parse_sweep
from apg_farm.store import Attempt, Store
from apg_farm.workers import make_app
from tests.support.services import RedisServer, redis_server
from tests.support.simbeds import make_beds


class Recorder:
    """A Sender that keeps the task ids it was given (threads may share it)."""

    def __init__(self) -> None:
        self.task_ids: list[str] = []
        self._lock = threading.Lock()

    def send_task(self, name: str, *args: Any, **kwargs: Any) -> None:
        with self._lock:
            self.task_ids.append(kwargs["task_id"])


def _spec(name: str, *, tasks: int, models: int, trials: int) -> SweepSpec:
    return parse_sweep(
        {
            "name": name,
            "tasks": [f"t{i:04d}" for i in range(tasks)],
            "models": [f"m{i:02d}" for i in range(models)],
            "trials": trials,
        }
    )


def _ids(store: Store) -> list[int]:
    with store.read() as session:
        return list(session.scalars(select(Attempt.id).order_by(Attempt.id)))


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    with redis_server(tmp_path) as server:
        yield server


def test_submit_streams_in_bounded_memory(store: Store) -> None:
    """20,000 attempts are submitted without holding them all (one ORM object each took ~4 KiB:
    ~85 MiB here, 4 GiB for a million; in chunks it stays ~15 MiB whatever the size), and
    submitting again stays idempotent."""
    tracemalloc.start()
    try:
        first = submit(store, _spec("mem", tasks=50, models=10, trials=40))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (first.created, first.existing) == (20_000, 0)
    assert peak < 40 * 2**20, f"submit peaked at {peak / 2**20:.0f} MiB"
    grown = submit(store, _spec("mem", tasks=50, models=10, trials=41))
    assert (grown.created, grown.existing) == (500, 20_000)
    with store.read() as session:
        seqs = session.execute(select(func.count(func.distinct(Attempt.seq)))).scalar()
    assert seqs == 20_500


def test_dispatch_counts_are_never_lost_between_dispatchers(store: Store) -> None:
    """Four dispatchers sending the same attempts at once: every send gets a dispatch number of
    its own, so no two messages share a task id and the store counts every one."""
    submit(store, _spec("race", tasks=10, models=5, trials=4))
    ids = _ids(store)
    sender = Recorder()

    def dispatcher() -> None:
        for _ in range(3):
            publish_attempts(store, sender, ids)

    threads = [threading.Thread(target=dispatcher) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(sender.task_ids) == 4 * 3 * len(ids)
    assert len(set(sender.task_ids)) == len(sender.task_ids)
    with store.read() as session:
        counted = session.scalar(select(func.sum(Attempt.dispatches)))
    assert counted == len(sender.task_ids)


def test_dispatch_past_the_bind_parameter_limit(pg_store: Store) -> None:
    """70,000 attempts (more than PostgreSQL's 65,535 parameters in one statement) dispatch in one
    call, each once, in queue order within every chunk."""
    store = pg_store
    submit(store, _spec("wide", tasks=70, models=10, trials=100))
    ids = _ids(store)
    sender = Recorder()
    assert publish_attempts(store, sender, iter(ids)) == 70_000
    sent = [attempt_of(task_id) for task_id in sender.task_ids]
    assert sorted(a for a in sent if a is not None) == ids
    assert all(task_id.endswith("-1") for task_id in sender.task_ids)


@pytest.mark.slow
def test_100k_attempts_submit_with_a_broker_sends_only_the_window(
    pg_store: Store, redis: RedisServer, tmp_path: Path
) -> None:
    """100,000 attempts submitted and dispatched to a real Redis through Celery on a pool of 4
    beds: Redis holds the window (8 messages), not the sweep; 10,000 messages of an older farm
    (one per attempt) fill the window already, so a pass sends nothing and reads them in pages."""
    store = pg_store
    make_beds(store, tmp_path, 4)
    started = time.monotonic()
    submitted = submit(store, _spec("big", tasks=100, models=10, trials=100))
    app = make_app(Settings(broker_url=redis.url, database_url="sqlite://"))
    result = reconcile(store, app, redis.url, per_bed=2)
    submit_seconds = time.monotonic() - started
    assert submitted.created == 100_000
    assert (result.expired, result.resent) == (0, 8)
    queue = pool_queue(submitted_pool(store))
    client = redis_client.Redis.from_url(redis.url)
    try:
        assert client.llen(queue) == 8
        ids = _ids(store)
        publish_attempts(store, app, ids[:10_000])
        started = time.monotonic()
        again = reconcile(store, app, redis.url, per_bed=2)
        reconcile_seconds = time.monotonic() - started
        assert again.resent == 0
        assert client.llen(queue) == 10_008
    finally:
        client.close()
    assert attempts_with_messages(redis.url, [queue]) == set(ids[:10_000])
    print(
        f"submit and dispatch {submit_seconds:.1f}s, "
        f"reconcile over 10,008 messages {reconcile_seconds:.1f}s"
    )


def submitted_pool(store: Store) -> str:
    with store.read() as session:
        return str(session.scalar(select(Attempt.pool).limit(1)))


def _url_with(store: Store, flag: str) -> str:
    return f"{store.url}{'&' if '?' in store.url else '?'}{flag}"


def test_a_capped_pool_opens_no_more_connections(pg_store: Store) -> None:
    """Store(url, pool_size=2): two connections at most, and a third waits pool_timeout then fails."""
    capped = Store(pg_store.url, upgrade=False, pool_size=2, pool_timeout=0.3)
    try:
        with capped.engine.connect(), capped.engine.connect():
            started = time.monotonic()
            with pytest.raises(sa.exc.TimeoutError), capped.engine.connect():
                pass
            assert time.monotonic() - started >= 0.25
        default = Store(pg_store.url, upgrade=False)
        assert (capped.engine.pool.size(), default.engine.pool.size()) == (2, 20)  # type: ignore[attr-defined]
        default.dispose()
    finally:
        capped.dispose()


def _prepared_after_repeats(store: Store) -> int:
    with store.engine.connect() as conn:
        for _ in range(10):  # psycopg prepares a statement run 5 times, unless told not to
            conn.execute(select(Attempt.id).where(Attempt.id == 1)).all()
        return int(
            conn.exec_driver_sql("SELECT count(*) FROM pg_prepared_statements").scalar() or 0
        )


def test_pgbouncer_mode_never_prepares_statements(pg_store: Store) -> None:
    """With ?pgbouncer=true psycopg keeps no server-side prepared statement (PgBouncer in
    transaction pooling mode would hand them to another client); the flag stays in Store.url for
    the processes it is passed to, and never reaches the driver."""
    bouncer = Store(_url_with(pg_store, "pgbouncer=true"), upgrade=False)
    try:
        assert bouncer.pgbouncer and "pgbouncer=true" in bouncer.url
        assert "pgbouncer" not in bouncer.engine.url.render_as_string()
        assert _prepared_after_repeats(bouncer) == 0
        assert _prepared_after_repeats(pg_store) > 0
    finally:
        bouncer.dispose()
