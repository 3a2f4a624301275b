"""A store outage costs nothing (#19): a PostgreSQL server of the test's own is restarted and
stopped under running work; every write goes through once it is back, a worker started while it
is down waits for it, and on real Celery workers no try is lost and no task fails."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy import func, select

from apg_farm.scheduler import publish_attempts, submit
from apg_farm.store import Attempt, Execution, Store, is_transient, normalize_url
from tests.support.celery_farm import (
    assert_counted_once_and_no_overlap,
    celery_app,
    celery_env,
    wait_done,
)
from tests.support.pg_server import PostgresServer
from tests.support.services import RedisServer, Workers, free_port
from tests.support.simbeds import make_beds, spec


@pytest.fixture
def server() -> Iterator[PostgresServer]:
    pg = PostgresServer()
    yield pg
    pg.close()


def _error(url: str) -> sa.exc.DBAPIError:
    engine = sa.create_engine(normalize_url(url))
    try:
        with engine.connect() as connection:
            connection.exec_driver_sql("SELECT 1")
    except sa.exc.DBAPIError as error:
        return error
    finally:
        engine.dispose()
    raise AssertionError(f"{url} answered")


def test_a_server_that_cannot_be_reached_is_waited_for_and_a_mistake_is_not(
    server: PostgresServer,
) -> None:
    refused = _error(f"postgresql://postgres@127.0.0.1:{free_port()}/postgres")
    assert is_transient(refused), refused
    missing = _error(server.url.rsplit("/", 1)[0] + "/no_such_database")
    assert not is_transient(missing), missing


def _counter(store: Store) -> None:
    with store.session() as session:
        session.execute(sa.text("CREATE TABLE IF NOT EXISTS tick (n integer)"))


def test_writes_ride_out_a_restart_and_a_stop(server: PostgresServer) -> None:
    """Writes go on in a thread while the server restarts, then stops for 5 s: each one is
    retried (Store.retrying, STORE_PATIENCE) and none fails."""
    store = Store(server.url, upgrade=False)
    _counter(store)
    stop, failures, done = threading.Event(), [], [0]

    def write() -> None:
        with store.session() as session:
            session.execute(sa.text("INSERT INTO tick VALUES (1)"))

    def writer() -> None:
        while not stop.is_set():
            try:
                store.retrying(write)
                done[0] += 1
            except Exception as error:  # counted, and the assertion below names it
                failures.append(error)
            time.sleep(0.02)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        time.sleep(0.5)
        server.restart()
        time.sleep(0.5)
        server.stop()
        time.sleep(5)
        server.start()
        time.sleep(1.0)
    finally:
        stop.set()
        thread.join(timeout=60)
    assert failures == []
    with store.read() as session:
        rows = session.scalar(sa.text("SELECT count(*) FROM tick"))
    assert rows == done[0] and done[0] > 20
    store.dispose()


def test_a_worker_started_while_its_store_is_down_waits_for_it(
    server: PostgresServer, redis: RedisServer, tmp_path: Path
) -> None:
    store = Store(server.url)
    (bed,) = make_beds(store, tmp_path, 1)
    server.stop()
    workers = Workers(celery_env(store, redis, tmp_path / "home"), tmp_path)
    try:
        workers.start(bed.name)
        # Under load a worker takes seconds to import and print; wait for the line, not a time.
        deadline = time.monotonic() + 60
        while "waiting for it" not in workers.logs() and time.monotonic() < deadline:
            time.sleep(0.3)
        time.sleep(1)
        proc = workers.procs[bed.name]
        assert proc.poll() is None, workers.logs()
        assert "cannot be reached; waiting for it" in workers.logs()
        server.start()
        deadline = time.monotonic() + 30
        while "ready" not in workers.logs() and time.monotonic() < deadline:
            time.sleep(0.3)
        assert "ready" in workers.logs(), workers.logs()
    finally:
        workers.stop_all()
        store.dispose()


@pytest.mark.slow
def test_celery_workers_ride_out_a_restart_and_a_20_s_stop(
    server: PostgresServer, redis: RedisServer, tmp_path: Path
) -> None:
    """Attempts run on two real workers while PostgreSQL restarts, then stops for 20 s (under the
    60 s lease): no try is LOST, no task fails, every attempt is counted once."""
    store = Store(server.url)
    beds = make_beds(store, tmp_path, 2, config={"time_scale": 200})
    sweep_id = submit(store, spec("outage", tasks=2, models=2, trials=2)).sweep_id
    env = {**celery_env(store, redis, tmp_path / "home"), "APG_FARM_LEASE_SECONDS": "60"}
    workers = Workers(env, tmp_path)
    try:
        for bed in beds:
            workers.start(bed.name)
        assert publish_attempts(store, celery_app(redis), range(1, 9)) == 8
        _wait_running(store)
        server.restart()
        _wait_running(store)
        server.stop()
        time.sleep(20)
        server.start()
        wait_done(store, sweep_id, redis, workers, timeout=240)
        assert_counted_once_and_no_overlap(store, beds)
        with store.read() as session:
            lost = session.scalar(
                select(func.count()).select_from(Execution).where(Execution.result == "LOST")
            )
            handed = session.scalars(select(Attempt.dispatches)).all()
        assert lost == 0, workers.logs()
        logs = workers.logs()
        # The heartbeat may warn that it missed a beat; no task may fail.
        assert "raised unexpected" not in logs and "Traceback" not in logs, logs
        assert max(handed) <= 2, handed
    finally:
        workers.stop_all()
        store.dispose()


def _wait_running(store: Store, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with store.read() as session:
                if session.scalar(
                    select(func.count()).select_from(Attempt).where(Attempt.state == "running")
                ):
                    return
        except sa.exc.DBAPIError:
            pass
        time.sleep(0.2)
    pytest.fail("no attempt started running")
