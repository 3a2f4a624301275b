"""The embedded executor: no broker, one thread per bed in this process, the same claim and engine."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy import func, select

from apg_farm.contract import RetryPolicy
from apg_farm.defaults import IDLE_POLL_SECONDS
from apg_farm.settings import load_settings
from apg_farm.store import (
    Attempt,
    AttemptState,
    Bed,
    BedState,
    Store,
    Sweep,
    SweepState,
    requeue_expired,
    stopped_by_budget,
    stopped_by_claims,
)
from apg_farm.transports import Transport
from apg_farm.workers.canary import CanaryResult
from apg_farm.workers.engine import AttemptEngine, AttemptReport

#: Beds a run keeps a thread for: active ones, and those a rolling upgrade took out for a while.
IN_SERVICE = (BedState.ACTIVE, BedState.UPGRADING)


@dataclass
class ExecutorResult:
    """How an embedded run ended."""

    reports: list[AttemptReport] = field(default_factory=list)
    #: Attempts still queued or running when no bed could take them (every bed quarantined).
    stranded: int = 0
    errors: list[str] = field(default_factory=list)
    #: Why the run stopped with attempts left: a budget reached (raise it, then `sweep resume`).
    paused: list[str] = field(default_factory=list)
    #: The canaries the beds ran before their claims: the farm's own, never the sweep's.
    canaries: list[CanaryResult] = field(default_factory=list)


class EmbeddedExecutor:
    """Runs a sweep's attempts on every active bed of its pool, one thread per bed."""

    def __init__(
        self,
        store: Store,
        sweep_id: int,
        *,
        transport_for: Callable[[str], Transport] | None = None,
        lease_seconds: float | None = None,
        on_report: Callable[[AttemptReport], None] | None = None,
        start_window: float | None = None,
        policy: RetryPolicy | None = None,
    ) -> None:
        self.store = store
        #: The retry policy every bed's engine is handed: this process's APG_FARM_* settings
        #: unless given, with the lease and start window given here (the attack demo's
        #: time-scaled beds need a shorter window).
        self.policy = (policy or RetryPolicy.from_settings(load_settings())).but(
            lease_seconds=lease_seconds, start_window=start_window
        )
        self.sweep_id = sweep_id
        self.on_report = on_report
        self.transport_for = transport_for
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.result = ExecutorResult()

    def stop(self) -> None:
        """Take no new attempts; running ones finish (their leases keep them safe otherwise)."""
        self._stop.set()

    def beds(self) -> list[str]:
        with self.store.session() as session:
            pool = session.scalar(select(Sweep.pool).where(Sweep.id == self.sweep_id))
            return list(
                session.scalars(
                    select(Bed.name)
                    .where(Bed.pool == pool, Bed.state.in_(IN_SERVICE))
                    .order_by(Bed.name)
                )
            )

    def run(self) -> ExecutorResult:
        """Run until every attempt of the sweep is done, or no bed can take what remains."""
        requeue_expired(self.store, policy=self.policy)
        worker = f"embedded@{socket.gethostname()}:{os.getpid()}"
        threads = [
            threading.Thread(
                target=self._bed_loop, args=(name, worker), name=f"bed-{name}", daemon=True
            )
            for name in self.beds()
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            while thread.is_alive():
                thread.join(timeout=0.5)
        self.result.stranded = self._remaining()
        return self.result

    def _bed_loop(self, bed_name: str, worker: str) -> None:
        try:
            engine = AttemptEngine(
                self.store,
                bed_name,
                worker=f"{worker}/{bed_name}",
                transport=self.transport_for(bed_name) if self.transport_for else None,
                policy=self.policy,
            )
            while not self._stop.is_set():
                # A canary due on this bed runs before its next claim (workers/canary.py).
                canary = engine.canary_if_due()
                if canary is not None:
                    with self._lock:
                        self.result.canaries.append(canary)
                report = engine.run_next(sweep_id=self.sweep_id)
                if report is not None:
                    with self._lock:
                        self.result.reports.append(report)
                    if self.on_report:
                        self.on_report(report)
                    continue
                state = self._bed_state(bed_name)
                if state not in IN_SERVICE or self._remaining() == 0:
                    return
                if state == BedState.UPGRADING:
                    # Out for a rolling upgrade: back when healthy (or quarantined: then gone).
                    self._stop.wait(IDLE_POLL_SECONDS)
                    continue
                if self._budget_spent():
                    return
                # Nothing this bed may take now: attempts are running elsewhere and may come back.
                requeue_expired(self.store, policy=self.policy)
                self._stop.wait(IDLE_POLL_SECONDS)
        except Exception as error:
            with self._lock:
                self.result.errors.append(f"bed {bed_name}: {type(error).__name__}: {error}")

    def _budget_spent(self) -> bool:
        """A budget stops the sweep (nothing of it runs, nothing may start): waiting here would
        wait for a person. The run ends and says so; queued attempts stay queued."""
        pauses = stopped_by_budget(self.store, self.sweep_id) or stopped_by_claims(
            self.store, self.sweep_id
        )
        if pauses:
            with self._lock:
                self.result.paused = pauses
        return bool(pauses)

    def _bed_state(self, bed_name: str) -> str | None:
        with self.store.read() as session:
            return session.scalar(select(Bed.state).where(Bed.name == bed_name))

    def _remaining(self) -> int:
        """Attempts that may still change: running ones, and queued ones while the sweep is open."""
        with self.store.read() as session:
            open_sweep = (
                session.scalar(select(Sweep.state).where(Sweep.id == self.sweep_id))
                == SweepState.OPEN
            )
            states = (
                [AttemptState.RUNNING, AttemptState.QUEUED]
                if open_sweep
                else [AttemptState.RUNNING]
            )
            return (
                session.scalar(
                    select(func.count())
                    .select_from(Attempt)
                    .where(Attempt.sweep_id == self.sweep_id, Attempt.state.in_(states))
                )
                or 0
            )
