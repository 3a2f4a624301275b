"""A worker process's heartbeat: its row in worker_beats, refreshed every few seconds.

`--wait`, `sweep status` and `bed list` read these rows (scheduler.live_workers) to tell a pool
that has no live worker. Times come from the store's clock (PostgreSQL's now()), never the worker
host's, so a skewed host neither looks dead nor alive. The thread shares the worker's store, so a
worker process stays within its connection budget.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from datetime import timedelta
from typing import Any

from sqlalchemy import and_, delete, func, or_, select, update

from apg_farm.scheduler import HEARTBEAT_SECONDS, LIVE_WITHIN
from apg_farm.store import Bed, Store, WorkerBeat, rowcount, utcnow

log = logging.getLogger(__name__)


def worker_name(bed_name: str) -> str:
    """celery:<bed>@<host>:<pid>: the name executions record as their worker, and the beat's."""
    return f"celery:{bed_name}@{socket.gethostname()}:{os.getpid()}"


class Heartbeat:
    """Inserts this process's row, refreshes its seen_at from a daemon thread, deletes it at exit."""

    def __init__(self, store: Store, bed_name: str, *, interval: float = HEARTBEAT_SECONDS) -> None:
        self.store = store
        self.bed_name = bed_name
        self.name = worker_name(bed_name)
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._inserted = False

    def _clock(self) -> Any:
        # The database's clock on PostgreSQL; SQLite is one host, so Python's clock is the clock.
        return utcnow() if self.store.is_sqlite else func.now()

    def beat(self) -> None:
        """One beat: refresh the row, or (first beat, or after someone removed it) insert it."""
        with self.store.session() as session:
            if self._inserted and rowcount(
                session.execute(
                    update(WorkerBeat)
                    .where(WorkerBeat.name == self.name)
                    .values(seen_at=self._clock())
                    .execution_options(synchronize_session=False)
                )
            ):
                return
            bed = session.execute(select(Bed.id, Bed.pool).where(Bed.name == self.bed_name)).first()
            if bed is None:
                log.warning("heartbeat: no bed named %s; not beating", self.bed_name)
                return
            # A row of the same name is an earlier process that had this pid (a restarted
            # container); the bed's stale rows are its dead workers: `bed list` shows the living.
            stale = (
                utcnow() - timedelta(seconds=LIVE_WITHIN)
                if self.store.is_sqlite
                else func.now() - timedelta(seconds=LIVE_WITHIN)
            )
            session.execute(
                delete(WorkerBeat)
                .where(
                    or_(
                        WorkerBeat.name == self.name,
                        and_(WorkerBeat.bed_id == bed.id, WorkerBeat.seen_at < stale),
                    )
                )
                .execution_options(synchronize_session=False)
            )
            session.add(
                WorkerBeat(
                    name=self.name,
                    bed_id=bed.id,
                    pool=bed.pool,
                    host=socket.gethostname(),
                    pid=os.getpid(),
                    started_at=self._clock(),
                    seen_at=self._clock(),
                )
            )
        self._inserted = True

    def start(self) -> None:
        """Beat now and every `interval` seconds from a daemon thread (it dies with the process)."""
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="heartbeat", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            try:
                self.beat()
            except Exception as error:
                # A store that is down for a while makes the worker look dead, which it is for
                # the farm; the next beat after the store is back makes it live again.
                log.warning("heartbeat failed: %s: %s", type(error).__name__, error)
            if self._stop.wait(self.interval):
                return

    def stop(self) -> None:
        """Stop beating and delete the row: a clean exit is not a dead worker."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval + 5)
        try:
            with self.store.session() as session:
                session.execute(
                    delete(WorkerBeat)
                    .where(WorkerBeat.name == self.name)
                    .execution_options(synchronize_session=False)
                )
        except Exception as error:
            # It goes stale instead; a later worker of the bed removes it.
            log.warning("heartbeat row not removed: %s: %s", type(error).__name__, error)
