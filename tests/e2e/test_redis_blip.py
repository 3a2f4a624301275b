"""A Redis outage of a few seconds while attempts run costs nothing (issue #11).

Real `apg-farm worker` processes on simulated beds, PostgreSQL, and a redis-server of the test's
own that goes away for about 4 s and comes back on the same port, while every bed is in the middle
of an attempt. Two kinds of Redis:

- with the append-only file, as docker-compose.yml runs it: queued messages survive, and so do the
  delivered-but-unacknowledged ones, whose acks the outage may have eaten: they come back later as
  duplicates, which must do nothing;
- without persistence: every message is lost, and the reconciler sends the queued attempts again.

Either way the running attempts finish once, nothing is LOST or run twice, and no bed is quarantined.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis as redis_client
from kombu.connection import Connection
from sqlalchemy import select

from apg_farm.scheduler import pool_queue, publish_attempts, reconcile, submit
from apg_farm.settings import Settings
from apg_farm.store import Attempt, Bed, BedState, Execution, Phase, Store
from apg_farm.workers import make_app
from tests.support.celery_farm import LEASE, assert_counted_once_and_no_overlap, celery_env
from tests.support.services import RedisServer, Workers, sweep_done
from tests.support.simbeds import make_beds, spec

pytestmark = pytest.mark.slow

#: Seconds Redis stays away each time.
OUTAGE = 4.0
#: Agents run for seconds at this scale (a 5-minute run takes 10 s), so an outage lands inside.
TIME_SCALE = 30


class BlipRedis(RedisServer):
    """A redis-server that can go away for a few seconds and come back on the same port."""

    def __init__(self, workdir: Path, *, persistent: bool) -> None:
        super().__init__(workdir)
        self.persistent = persistent

    def start(self) -> None:
        if not self.persistent:
            super().start()
            return
        assert self.binary
        self.proc = subprocess.Popen(
            [
                self.binary,
                *("--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.workdir)),
                *("--save", "", "--appendonly", "yes", "--appendfsync", "everysec"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with contextlib.suppress(redis_client.RedisError):
                if redis_client.Redis.from_url(self.url, socket_timeout=0.5).ping():
                    return
            time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def blip(self, seconds: float) -> None:
        """Shut down as a restart does (SIGTERM: the append-only file is flushed), wait, start."""
        assert self.proc
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=10)
        time.sleep(seconds)
        self.start()


@pytest.fixture(params=["appendonly", "no-persistence"])
def blip_redis(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BlipRedis]:
    if shutil.which("redis-server") is None:
        RedisServer(tmp_path)  # skips locally, fails under CI
    workdir = tmp_path / "redis"
    workdir.mkdir()
    server = BlipRedis(workdir, persistent=request.param == "appendonly")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def blip_farm(
    pg_store: Store, blip_redis: BlipRedis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Store, Workers]]:
    env = celery_env(pg_store, blip_redis, tmp_path / "home")
    for key in ("APG_FARM_DATABASE_URL", "APG_FARM_BROKER_URL", "APG_FARM_HOME"):
        monkeypatch.setenv(key, env[key])
    workers = Workers(env, tmp_path)
    yield pg_store, workers
    workers.stop_all()


def _in_run_phase(store: Store) -> set[int]:
    """Executions inside their run phase right now (the agent started, the run not recorded)."""
    with store.read() as session:
        started = set(
            session.scalars(
                select(Execution.id).where(
                    Execution.finished_at.is_(None), Execution.agent_started.is_(True)
                )
            )
        )
        ran = set(
            session.scalars(
                select(Phase.execution_id).where(
                    Phase.execution_id.in_(started), Phase.name == "run"
                )
            )
        )
    return started - ran


@contextlib.contextmanager
def _scheduler(store: Store, server: BlipRedis) -> Iterator[None]:
    """What `apg-farm scheduler` does, every second, in a thread, for as long as the test runs."""
    app = make_app(Settings(broker_url=server.url, database_url="sqlite://"))
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(1.0):
            with contextlib.suppress(Exception):  # the broker may be away
                reconcile(store, app, server.url, unacked_grace=LEASE)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _until_done(store: Store, workers: Workers, sweep_id: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sweep_done(store, sweep_id):
            return
        with store.read() as session:
            beds = session.execute(select(Bed.name, Bed.state, Bed.state_reason)).all()
        if all(state != BedState.ACTIVE for _, state, _ in beds):
            pytest.fail(f"every bed is out of the pool: {beds}")
        time.sleep(0.5)
    pytest.fail(f"sweep not done in {timeout:.0f} s\n{workers.logs()}")


def _drained(server: BlipRedis, queue: str, timeout: float = 60) -> None:
    client = redis_client.Redis.from_url(server.url)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if client.llen(queue) == 0 and client.hlen("unacked") == 0:
                return
            time.sleep(0.2)
    finally:
        client.close()
    pytest.fail(f"{queue} not drained")


def test_a_redis_blip_costs_nothing(
    blip_farm: tuple[Store, Workers], blip_redis: BlipRedis, tmp_path: Path
) -> None:
    """Three 4 s outages, each while every bed runs an agent: all finish once, no bed quarantined."""
    store, workers = blip_farm
    beds = make_beds(store, tmp_path, 3, config={"time_scale": TIME_SCALE})
    sweep_id = submit(store, spec("blips", tasks=3, models=1, trials=3)).sweep_id
    for bed in beds:
        workers.start(bed.name)
    app = make_app(Settings(broker_url=blip_redis.url, database_url="sqlite://"))
    assert publish_attempts(store, app, range(1, 10)) == 9

    spanned: set[int] = set()  # executions that were running an agent when Redis went away
    with _scheduler(store, blip_redis):
        for _ in range(3):
            end = time.monotonic() + 120
            while time.monotonic() < end:
                running = _in_run_phase(store) - spanned
                if len(running) >= 2:
                    break
                time.sleep(0.05)
            else:
                pytest.fail(f"no two beds running an agent at once\n{workers.logs()}")
            spanned |= running
            blip_redis.blip(OUTAGE)
        _until_done(store, workers, sweep_id, timeout=180)

    assert_counted_once_and_no_overlap(store, beds)
    with store.read() as session:
        attempts = session.scalars(select(Attempt)).all()
        executions = session.scalars(select(Execution)).all()
        bed_rows = session.scalars(select(Bed)).all()
    # Nothing was cut short and run again: one execution per attempt, each with its outcome.
    assert len(attempts) == 9
    assert sorted(e.attempt_id for e in executions) == sorted(a.id for a in attempts), [
        (e.attempt_id, e.result, e.reason) for e in executions
    ]
    outcome = {a.id: a.outcome for a in attempts}
    assert all(e.result == outcome[e.attempt_id] for e in executions)
    assert {e.id for e in executions} >= spanned
    assert all(b.state == BedState.ACTIVE and b.consecutive_errors == 0 for b in bed_rows), [
        (b.name, b.state, b.state_reason) for b in bed_rows
    ]

    # Acks the outage ate leave messages in Redis's unacked set; after the visibility timeout
    # kombu gives them back. Do that now: each is a duplicate of a finished attempt, a no-op.
    restore = {"visibility_timeout": 0}
    with Connection(blip_redis.url, transport_options=restore) as connection:  # type: ignore[no-untyped-call]
        connection.default_channel.qos.restore_visible(num=100)
    _drained(blip_redis, pool_queue(beds[0].pool))
    time.sleep(1.0)
    with store.read() as session:
        assert len(session.scalars(select(Execution)).all()) == len(executions)
        assert all(b.consecutive_errors == 0 for b in session.scalars(select(Bed)))
