"""Worker liveness (issue #11): heartbeats, `--wait` giving up on a pool nobody serves, stale
maintenance messages, SQL-side sweep status, and the worker's connection budget."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis as redis_client
import yaml
from sqlalchemy import event, select, update

from apg_farm.cli.distributed import maintenance_via_worker, sweep_without_worker
from apg_farm.errors import FarmError
from apg_farm.scheduler import (
    BED_MAINTENANCE,
    LIVE_WITHIN,
    bed_queue,
    live_workers,
    publish_attempts,
    store_now,
    submit,
    sweep_status,
    worker_beats,
)
from apg_farm.specs import SweepSpec
from apg_farm.store import (
    Attempt,
    AttemptState,
    Bed,
    BedEvent,
    Store,
    Sweep,
    WorkerBeat,
    utcnow,
)
from apg_farm.workers import heartbeat as heartbeat_module
from apg_farm.workers import tasks
from apg_farm.workers.heartbeat import Heartbeat, worker_name
from tests.support.celery_farm import celery_app
from tests.support.services import RedisServer, Workers, sweep_done
from tests.support.simbeds import make_beds, spec

#: `--wait`'s grace in these tests: short, so a test that gives up does so quickly.
GRACE = "3"


def _until(check: Callable[[], bool], timeout: float, what: str, logs: str = "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    pytest.fail(f"{what} not within {timeout:.0f} s\n{logs}")


def _cli(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "apg_farm", *args],
        env={**env, "APG_FARM_NO_WORKER_GRACE": GRACE, "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _sweep_file(tmp_path: Path, sweep: SweepSpec) -> Path:
    path = tmp_path / f"{sweep.name}.yaml"
    path.write_text(yaml.safe_dump(sweep.model_dump(mode="json")))
    return path


# --- heartbeat rows, on both stores ----------------------------------------------------------


def test_a_beat_is_live_then_stale_then_gone(store: Store, tmp_path: Path) -> None:
    """A beating worker is live; one that stopped beating goes stale; a clean stop removes its row."""
    (bed,) = make_beds(store, tmp_path, 1)
    beat = Heartbeat(store, bed.name)
    beat.beat()
    beat.beat()  # the second beat refreshes the same row
    seen = worker_beats(store)
    assert [(w.name, w.bed, w.pool, w.pid) for w in seen] == [
        (worker_name(bed.name), bed.name, bed.pool, os.getpid())
    ]
    assert [w.name for w in live_workers(store, bed.pool)] == [beat.name]

    with store.session() as session:  # as if it stopped beating a while ago
        session.execute(
            update(WorkerBeat).values(seen_at=utcnow() - timedelta(seconds=LIVE_WITHIN + 30))
        )
    assert live_workers(store, bed.pool) == []
    assert worker_beats(store)[0].age > LIVE_WITHIN

    beat.beat()  # beating again makes it live again
    assert len(live_workers(store, bed.pool)) == 1
    beat.stop()
    assert worker_beats(store) == []


def test_a_new_worker_clears_its_beds_dead_rows(store: Store, tmp_path: Path) -> None:
    """A SIGKILLed worker's row stays (stale) until the bed's next worker starts beating."""
    (bed,) = make_beds(store, tmp_path, 1)
    with store.session() as session:
        session.add(
            WorkerBeat(
                name=f"celery:{bed.name}@gone:1",
                bed_id=bed.id,
                pool=bed.pool,
                host="gone",
                pid=1,
                started_at=utcnow() - timedelta(hours=2),
                seen_at=utcnow() - timedelta(hours=1),
            )
        )
    Heartbeat(store, bed.name).beat()
    assert [w.host for w in worker_beats(store)] == [socket.gethostname()]


def test_a_quarantined_beds_worker_serves_no_pool(store: Store, tmp_path: Path) -> None:
    """Only a worker on an active bed takes the pool's attempts."""
    (bed,) = make_beds(store, tmp_path, 1)
    Heartbeat(store, bed.name).beat()
    with store.session() as session:
        session.execute(update(Bed).values(state="quarantined"))
    assert live_workers(store, bed.pool) == []
    assert worker_beats(store)[0].live


def test_liveness_uses_the_database_clock(
    pg_store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker host whose clock is an hour slow still beats live: seen_at is PostgreSQL's now()."""
    (bed,) = make_beds(pg_store, tmp_path, 1)
    monkeypatch.setattr(heartbeat_module, "utcnow", lambda: utcnow() - timedelta(hours=1))
    Heartbeat(pg_store, bed.name).beat()
    (seen,) = worker_beats(pg_store)
    assert seen.age < 5, seen
    assert seen.live


# --- sweep status in SQL ---------------------------------------------------------------------


def test_sweep_status_counts_in_sql(store: Store, tmp_path: Path) -> None:
    """Counts by state and outcome come from GROUP BY: no attempt row is pulled into Python."""
    (bed,) = make_beds(store, tmp_path, 1)
    sweep_id = submit(store, spec("big", tasks=3, models=2, trials=50)).sweep_id
    with store.session() as session:
        ids = list(session.scalars(select(Attempt.id).order_by(Attempt.id)))
        session.execute(
            update(Attempt)
            .where(Attempt.id.in_(ids[:100]))
            .values(state=AttemptState.DONE, outcome="PASSED")
        )
        session.execute(
            update(Attempt)
            .where(Attempt.id.in_(ids[100:130]))
            .values(state=AttemptState.DONE, outcome="ERROR")
        )
        session.execute(
            update(Attempt)
            .where(Attempt.id == ids[130])
            .values(state=AttemptState.RUNNING, bed_id=bed.id)
        )
    Heartbeat(store, bed.name).beat()

    fetched: list[str] = []

    def count_rows(_conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        # A read of attempts that is not an aggregate, nor an EXISTS (one row at most per sweep).
        bounded = ("GROUP BY", "count(", "EXISTS (")
        if "FROM attempts" in statement and not any(word in statement for word in bounded):
            fetched.append(statement)

    event.listen(store.engine, "after_cursor_execute", count_rows)
    try:
        status = sweep_status(store, sweep_id)
    finally:
        event.remove(store.engine, "after_cursor_execute", count_rows)
    assert status["attempts"] == 300
    assert status["states"] == {"queued": 169, "running": 1, "done": 130}
    assert status["outcomes"] == {"ERROR": 30, "PASSED": 100}
    assert len(status["running"]) == 1 and status["running"][0].startswith(f"{bed.name}: ")
    assert status["workers"]["live"] == 1
    assert status["workers"]["beats"][0]["bed"] == bed.name
    # The only per-row read of attempts is the running list (one row per busy bed).
    assert len(fetched) <= 1, fetched


# --- real workers: PostgreSQL, Redis, `apg-farm worker` processes -----------------------------


def _worker_pids(workers: Workers, bed: str) -> tuple[int, list[int]]:
    """(the worker's main process, its pool children)."""
    parent = workers.procs[bed].pid
    children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
    return parent, [int(c) for c in children]


def _live(store: Store, pool: str) -> bool:
    return bool(live_workers(store, pool))


def test_live_worker_then_killed_worker_makes_wait_give_up(
    celery_farm: tuple[Store, Workers],
    tmp_path: Path,
) -> None:
    """A pool with a worker is live and `--wait` finishes; once it is SIGKILLed, `--wait` exits 1."""
    store, workers = celery_farm
    (bed,) = make_beds(store, tmp_path, 1)
    workers.start(bed.name)
    _until(lambda: _live(store, bed.pool), 120, "a live worker", workers.logs())
    parent, children = _worker_pids(workers, bed.name)
    (beat,) = worker_beats(store)
    # The pool child beats: the process that runs attempts, named as executions name it.
    assert beat.pid in children and beat.pid != parent
    assert beat.name == f"celery:{bed.name}@{beat.host}:{beat.pid}"
    listed = _cli(workers.env, "bed", "list")
    assert listed.returncode == 0, listed.stderr
    assert f"live ({beat.host}:{beat.pid})" in listed.stdout
    assert "no live worker" not in listed.stderr

    done = _cli(
        workers.env,
        "sweep",
        "submit",
        str(_sweep_file(tmp_path, spec("alive", tasks=1, models=1, trials=2))),
        "--wait",
    )
    assert done.returncode == 0, done.stderr + workers.logs()

    workers.kill(bed.name)
    _until(lambda: not _live(store, bed.pool), LIVE_WITHIN + 10, "the beat going stale")
    status = _cli(workers.env, "sweep", "status", "alive", "--json")
    assert '"live": 0' in status.stdout
    assert "lost (" in _cli(workers.env, "bed", "list").stdout

    started = time.monotonic()
    gave_up = _cli(
        workers.env,
        "sweep",
        "submit",
        str(_sweep_file(tmp_path, spec("orphaned", tasks=1, models=1, trials=1))),
        "--wait",
    )
    assert gave_up.returncode == 1, gave_up.stderr
    text = " ".join(gave_up.stderr.split())
    assert f"pool {bed.pool} has no live worker" in text
    assert f"apg-farm worker --bed {bed.name}" in text
    assert "last beat" in text
    assert time.monotonic() - started < 60


def test_a_pool_that_never_had_a_worker_makes_wait_give_up(
    celery_farm: tuple[Store, Workers],
    tmp_path: Path,
) -> None:
    """No worker ever started for the pool: `--wait` says so after the grace and exits 1."""
    store, workers = celery_farm
    (bed,) = make_beds(store, tmp_path, 1)
    listed = _cli(workers.env, "bed", "list")
    assert "none" in listed.stdout and f"pool {bed.pool} has no live worker" in listed.stderr
    gave_up = _cli(
        workers.env,
        "sweep",
        "submit",
        str(_sweep_file(tmp_path, spec("nobody", tasks=1, models=1, trials=1))),
        "--wait",
    )
    assert gave_up.returncode == 1, gave_up.stderr
    text = " ".join(gave_up.stderr.split())
    assert f"pool {bed.pool} has no live worker" in text
    assert "none has ever beaten" in text
    assert f"apg-farm worker --bed {bed.name}" in text
    # What `sweep status` prints under its table.
    with store.read() as session:
        sweep_id = session.scalars(select(Sweep.id).where(Sweep.name == "nobody")).one()
    assert f"pool {bed.pool} has no live worker" in (sweep_without_worker(store, sweep_id) or "")


def test_a_clean_stop_removes_the_beat(
    celery_farm: tuple[Store, Workers],
    tmp_path: Path,
) -> None:
    """SIGTERM to the worker's main process only (as `docker stop` sends it): its row goes."""
    store, workers = celery_farm
    (bed,) = make_beds(store, tmp_path, 1)
    workers.start(bed.name)
    _until(lambda: _live(store, bed.pool), 120, "a live worker", workers.logs())
    proc = workers.procs.pop(bed.name)
    os.kill(proc.pid, signal.SIGTERM)
    proc.wait(timeout=30)
    assert worker_beats(store) == [], workers.logs()


def _pg_sockets(pid: int) -> int:
    """TCP connections of one process to PostgreSQL's port, read from /proc."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    count = 0
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            port = int(fields[2].rsplit(":", 1)[1], 16)
            if port == 5432 and fields[3] == "01" and fields[9] in inodes:  # 01: established
                count += 1
    return count


def test_a_worker_holds_at_most_two_database_connections(
    celery_farm: tuple[Store, Workers],
    redis: RedisServer,
    tmp_path: Path,
) -> None:
    """While attempts run (engine, lease renewal and heartbeat at once), a worker uses <= 2."""
    store, workers = celery_farm
    (bed,) = make_beds(store, tmp_path, 1, config={"time_scale": 200})
    workers.start(bed.name)
    _until(lambda: _live(store, bed.pool), 120, "a live worker", workers.logs())
    sweep_id = submit(store, spec("budget", tasks=2, models=2, trials=1)).sweep_id
    assert publish_attempts(store, celery_app(redis), range(1, 5)) == 4
    most = 0
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        parent, children = _worker_pids(workers, bed.name)
        per_process = [_pg_sockets(p) for p in (parent, *children)]
        most = max(most, *per_process)
        assert per_process[0] == 0, "the worker's main process holds no database connection"
        if sweep_done(store, sweep_id):
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"sweep not done\n{workers.logs()}")
    assert 1 <= most <= 2, most


def test_the_worker_store_pool_is_capped_at_two(
    pg_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store a worker process opens gives out two connections; a third caller waits."""
    monkeypatch.setenv("APG_FARM_DATABASE_URL", pg_store.url)
    monkeypatch.setattr(tasks, "_store", None)
    worker_store = tasks.worker_store()
    try:
        held = [worker_store.engine.connect() for _ in range(2)]
        third: list[object] = []
        waiter = threading.Thread(
            target=lambda: third.append(worker_store.engine.connect()), daemon=True
        )
        waiter.start()
        waiter.join(2.0)
        assert waiter.is_alive() and not third, "a third connection was opened"
        held.pop().close()
        waiter.join(5.0)
        assert third, "the waiting caller got the returned connection"
        for connection in [*held, *third]:
            connection.close()  # type: ignore[attr-defined]
    finally:
        worker_store.dispose()
        monkeypatch.setattr(tasks, "_store", None)


# --- maintenance messages that outlived their sender ------------------------------------------


def _events(store: Store, bed: Bed, kind: str) -> list[str]:
    with store.read() as session:
        return [
            detail or ""
            for detail in session.scalars(
                select(BedEvent.detail)
                .where(BedEvent.bed_id == bed.id, BedEvent.kind == kind)
                .order_by(BedEvent.id)
            )
        ]


@pytest.fixture
def broker(redis: RedisServer) -> Iterator[redis_client.Redis]:
    client = redis_client.Redis.from_url(redis.url)
    yield client
    client.close()


def test_stale_maintenance_is_dropped_and_fresh_maintenance_runs(
    celery_farm: tuple[Store, Workers],
    redis: RedisServer,
    broker: redis_client.Redis,
    tmp_path: Path,
) -> None:
    """A doctor sent long ago, and one whose sender gave up, never run; a fresh one does."""
    store, workers = celery_farm
    (bed,) = make_beds(store, tmp_path, 1)
    with store.read() as session:
        long_ago = store_now(session, store) - timedelta(hours=2)
    # Sent two hours ago by a sender whose message carried no broker expiry (or whose clock
    # disagreed with the worker's): the task's own check, on the store's clock, drops it.
    celery_app(redis).send_task(
        BED_MAINTENANCE,
        args=(bed.name, "doctor"),
        kwargs={"sent_at": long_ago.isoformat(), "expires_in": 600},
        queue=bed_queue(bed.name),
    )
    # Sent while the bed's worker was down; the operator stopped waiting after 1 s.
    with pytest.raises(FarmError, match="expired"):
        maintenance_via_worker(store, bed, "doctor", timeout=1)
    time.sleep(1.5)
    assert broker.llen(bed_queue(bed.name)) == 2

    workers.start(bed.name)  # the worker comes back
    _until(
        lambda: broker.llen(bed_queue(bed.name)) == 0 and broker.hlen("unacked") == 0,
        60,
        "the bed queue drained",
        workers.logs(),
    )
    time.sleep(1.0)
    dropped = _events(store, bed, "maintenance_dropped")
    assert len(dropped) == 1 and "past its 600 s expiry" in dropped[0], dropped
    assert _events(store, bed, "doctor") == [], "a stale doctor ran"
    # The broker-side expiry (Celery's `expires=`) discarded the other before it reached the task.
    assert "Discarding revoked task: apg_farm.bed_maintenance" in workers.logs()

    answer = maintenance_via_worker(store, bed, "doctor", timeout=120)
    assert answer.startswith("healthy"), answer
    assert len(_events(store, bed, "doctor")) == 1
