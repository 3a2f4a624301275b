"""One Inspect sample on one bed: the farm's claim and lease, the engine's preparation before the
agent and its judging after, with Inspect's agent acting in between (workers/harness.py).

Synchronous on purpose: the engine runs in a thread of its own for the whole attempt, exactly as
a worker runs it (lease renewed, every phase recorded, the verdict recorded by the lifecycle);
the async provider (sandbox.py) only waits for it.
"""

from __future__ import annotations

import os
import random
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sqlalchemy import select

from apg_farm.contract import RetryPolicy, Usage, Why
from apg_farm.errors import BadInput, FarmError
from apg_farm.inspect import container
from apg_farm.inspect.config import ApgConfig, task_sweep_name
from apg_farm.settings import load_settings
from apg_farm.specs import SweepSpec
from apg_farm.store import (
    Bed,
    BedState,
    Claim,
    HarnessAttempt,
    Phase,
    Refusal,
    Store,
    SweepOwned,
    cancel_attempt,
    open_harness_attempt,
)
from apg_farm.transports import CommandResult, LocalTransport

if TYPE_CHECKING:
    from apg_farm.transports import SshTarget
from apg_farm.workers import AttemptEngine, AttemptReport, HandOver, Seat

#: The sweeps of Inspect runs: no farm worker claims their attempts (store/claims.py).
DRIVER = "inspect"
#: Seconds `docker ps` may take to name the web container.
FIND_TIMEOUT = 30.0
#: Seconds between two rounds over the pool's beds while none is free.
_WAIT_STEP = 1.0


class SampleRefused(FarmError):
    """The farm will not run this sample: it was judged already, its sweep is closed or sealed,
    or a budget is spent. Inspect records it as the sample's error."""


class NoBedReady(FarmError):
    """No bed of the pool took the sample, or the bed taken could not be made ready (the farm
    recorded why, and retries or quarantines as a worker would)."""


@dataclass(frozen=True)
class SampleKey:
    """Which attempt an Inspect sample is: its sweep, task, model and trial (the epoch)."""

    sweep: str
    task: str
    model: str
    trial: int
    dataset: str | None
    #: What Inspect says about the sample (ids, the prompt's sha256): the agent phase's record.
    record: Mapping[str, str] = field(default_factory=dict)

    def spec(self, config: ApgConfig) -> SweepSpec:
        return SweepSpec(
            name=self.sweep,
            dataset=self.dataset,
            fixtures=list(config.fixtures),
            tasks=[self.task],
            models=[self.model],
            trials=self.trial,
            agent=DRIVER,
            retries=config.retries,
            timeouts=config.timeouts,
        )


def _open_attempt(store: Store, config: ApgConfig, key: SampleKey) -> HarnessAttempt:
    """The sample's attempt, in the run's sweep, or in a sweep of its Inspect task's own when
    another task of the run holds that one (two tasks over the same APG tasks and models)."""
    owner = key.record.get("inspect_task") or None
    names = [key.sweep] if owner is None else [key.sweep, task_sweep_name(key.sweep, owner)]
    for name in names:
        try:
            return open_harness_attempt(
                store,
                key.spec(config).model_copy(update={"name": name}),
                driver=DRIVER,
                task=key.task,
                model=key.model,
                trial=key.trial,
                meta={"driver": DRIVER, **dict(key.record)},
                owner=owner,
            )
        except SweepOwned as held:
            last = held
    raise BadInput(
        f"apg sandbox: Inspect task {owner!r}: sweeps {', '.join(names)} hold another task's "
        f"samples ({last.owner!r})",
        field="sweep",
        fix="name a sweep of its own in the sandbox config (sweep:)",
    )


def worker_name() -> str:
    return f"inspect@{socket.gethostname()}:{os.getpid()}"


class SampleBed:
    """A bed held for one sample; made by `take`, ended by `finish` or `abandon`."""

    def __init__(
        self,
        engine: AttemptEngine,
        claim: Claim,
        handover: HandOver,
        thread: threading.Thread,
        reports: list[AttemptReport],
        container: str,
    ) -> None:
        #: The web container's id, found by its DDEV labels before the agent acted.
        self.container = container
        self.engine = engine
        self.claim = claim
        self._handover = handover
        self._thread = thread
        self._reports = reports
        self._ended = False
        #: The last of the execution's phases shown in Inspect's transcript (new_phases).
        self._phases_shown = 0
        #: The verdict was shown in Inspect's transcript (once: judge, then cleanup, end it).
        self.verdict_shown = False

    @property
    def bed_name(self) -> str:
        return self.engine.bed_name

    def ssh_target(self) -> SshTarget | None:
        """The bed's host when it is reached over SSH (None: this host)."""
        transport = self.engine.transport
        if isinstance(transport, LocalTransport):
            return None  # paramiko is not loaded for a local bed
        from apg_farm.transports import SshTransport

        return transport.target if isinstance(transport, SshTransport) else None

    def new_phases(self) -> list[Phase]:
        """The phases the farm recorded for this sample's execution since the last call."""
        with self.engine.store.read() as session:
            phases = list(
                session.scalars(
                    select(Phase)
                    .where(
                        Phase.execution_id == self.claim.execution_id,
                        Phase.id > self._phases_shown,
                    )
                    .order_by(Phase.id)
                )
            )
            for phase in phases:
                session.expunge(phase)
        if phases:
            self._phases_shown = phases[-1].id
        return phases

    @property
    def seat(self) -> Seat:
        assert self._handover.seat is not None  # set before take() returns
        return self._handover.seat

    @classmethod
    def take(
        cls,
        store: Store,
        config: ApgConfig,
        key: SampleKey,
        *,
        stop: threading.Event | None = None,
    ) -> SampleBed:
        """Claim the sample's attempt on a free bed of the pool and prepare that bed; raises
        SampleRefused or NoBedReady (after the farm recorded what happened). `stop` set (the
        sample was cancelled) ends the wait for a bed, and a bed taken meanwhile is let go."""
        stop = stop or threading.Event()
        attempt = _open_attempt(store, config, key)
        engine, claim = _claim(store, config, attempt, stop)
        found: list[str] = []
        handover = HandOver(
            ("inspect", "sample", key.task, key.model, f"epoch={key.trial}"),
            key.record,
            timeout=config.timeouts.run,
            prepare=lambda seat: _find_container(seat, found),
        )
        reports: list[AttemptReport] = []
        thread = threading.Thread(
            target=lambda: reports.append(engine.run(claim, handover)),
            name=f"apg-sample-{claim.attempt_id}",
            daemon=True,
        )
        thread.start()
        while not handover.ready.wait(0.1):
            if not thread.is_alive():
                break
        taken = cls(engine, claim, handover, thread, reports, found[0] if found else "")
        if stop.is_set() and handover.ready.is_set():
            taken.abandon()
            raise SampleRefused(
                f"{claim.label}: the sample was cancelled while its bed was prepared"
            )
        if not handover.ready.is_set():
            thread.join()
            report = reports[0] if reports else None
            why = report.verdict.reason if report else "the engine stopped without a verdict"
            outcome = f" ({report.outcome})" if report and report.outcome else ""
            raise NoBedReady(
                f"bed {engine.bed_name} could not be made ready for {claim.label}{outcome}: {why}",
                fix="the farm recorded it (`apg-farm sweep status`); Inspect's retry_on_error "
                "takes another bed",
            )
        return taken

    def run(
        self,
        argv: tuple[str, ...],
        *,
        timeout: float,
        stdout_limit: int,
        stderr_limit: int,
        input: bytes | None = None,
    ) -> CommandResult:
        """One command on the bed's host with the bed's environment (never the farm's)."""
        if self._ended or self._handover.closed.is_set():
            # The farm judges the bed now (the sample ended, or outlasted the run timeout): a
            # command of the agent's must not race the verify and the grade.
            raise SampleRefused(
                f"the sample on bed {self.bed_name} has ended: the farm is judging the bed"
            )
        seat = self.seat
        return seat.transport.run(
            argv,
            cwd=seat.bed.approot,
            env=seat.env,
            timeout=timeout,
            stdout_limit=stdout_limit,
            stderr_limit=stderr_limit,
            input=input,
        )

    def finish(self, usage: Usage | None = None, *, answered: bool | None = None) -> AttemptReport:
        """The agent is done: the engine judges the bed (stop what the agent left, the DDEV
        configuration, the trusted verify, the grade) and records the verdict, with what the
        sample's model calls cost (`usage`, as Inspect metered them). `answered` False (Inspect's
        transcript shows no model call answered and no tool call) with no call metered: the
        model never acted, and the sample is run again (harness.never_acted); None: unknown."""
        never = usage is None and answered is False
        return self._end(interrupted=False, usage=usage, never_acted=never)

    def abandon(self) -> AttemptReport:
        """The sample was interrupted: the attempt ends CANCELLED, the bed marked for a restart."""
        return self._end(interrupted=True)

    @property
    def report(self) -> AttemptReport | None:
        return self._reports[0] if self._reports else None

    def _end(
        self, *, interrupted: bool, usage: Usage | None = None, never_acted: bool = False
    ) -> AttemptReport:
        if not self._ended:
            self._ended = True
            self._handover.end(interrupted=interrupted, usage=usage, never_acted=never_acted)
        self._thread.join()
        if not self._reports:
            raise NoBedReady(f"the engine on bed {self.bed_name} stopped without a verdict")
        return self._reports[0]


def _find_container(seat: Seat, found: list[str]) -> str | None:
    """The bed's running web container, by the labels DDEV gives it (the approot the farm
    enrolled, service web), found before the agent acts: every command of the sample goes to it."""
    result = seat.transport.run(
        container.find_container_argv(seat.bed.approot),
        cwd=seat.bed.approot,
        env=seat.env,
        timeout=FIND_TIMEOUT,
        stdout_limit=4096,
        stderr_limit=4096,
    )
    cid = container.container_id(result)
    if cid is None:
        said = (result.transport_error or result.stderr.text() or result.stdout.text()).strip()
        return (
            f"the web container of {seat.bed.approot} was not found by its DDEV labels "
            f"(docker ps: exit {result.rc}{': ' + said[:200] if said else ''})"
        )
    found.append(cid)
    return None


def _claim(
    store: Store, config: ApgConfig, attempt: HarnessAttempt, stop: threading.Event
) -> tuple[AttemptEngine, Claim]:
    """The attempt claimed on a bed of the pool, under the claim's own rules (active beds only,
    caps and breakers, a retry away from the bed that failed it); waits while beds are busy."""
    deadline = time.monotonic() + config.wait_for_bed
    worker = worker_name()
    while True:
        if stop.is_set():
            # Interrupted before any bed took it: the attempt ends CANCELLED, not left queued.
            cancel_attempt(store, attempt.attempt_id, "the Inspect sample was cancelled")
            raise SampleRefused(f"{attempt.sweep_name}: the sample was cancelled waiting for a bed")
        waits: list[float] = []
        beds = _beds(store, config)
        if not beds:
            raise NoBedReady(
                f"no active bed in pool {config.pool}"
                + (f" among {', '.join(config.beds)}" if config.beds else ""),
                field="fixtures",
                fix="`apg-farm bed list` shows the pool's beds; `apg-farm bed release` brings one back",
            )
        for name in beds:
            engine = AttemptEngine(
                store,
                name,
                worker=worker,
                lease_seconds=config.lease_seconds,
                driver=DRIVER,
                policy=RetryPolicy.from_settings(load_settings()),
            )
            taken = engine.claim(attempt_id=attempt.attempt_id)
            if not isinstance(taken, Refusal):
                return engine, taken
            engine.transport.close()
            if taken.why in (Why.NOT_QUEUED, Why.SWEEP_CLOSED, Why.PAUSED):
                raise SampleRefused(f"{attempt.sweep_name}: attempt {attempt.attempt_id}: {taken}")
            if taken.why == Why.WAITING and taken.retry_in:
                waits.append(taken.retry_in)
        if time.monotonic() >= deadline:
            raise NoBedReady(
                f"no bed of pool {config.pool} took the sample within {config.wait_for_bed:g} s",
                fix="more beds, fewer --max-sandboxes, or a longer wait_for_bed",
            )
        stop.wait(min([_WAIT_STEP, *waits]) + random.uniform(0, 0.2))


def _beds(store: Store, config: ApgConfig) -> list[str]:
    """The pool's active beds (those named in the config, when it names some), shuffled so
    that samples starting together spread over the pool."""
    with store.read() as session:
        # Only beds with a web container: the sample's commands run in it (container.py).
        query = select(Bed.name).where(
            Bed.pool == config.pool, Bed.state == BedState.ACTIVE, Bed.web_container.is_(True)
        )
        if config.beds:
            query = query.where(Bed.name.in_(config.beds))
        names = list(session.scalars(query))
    random.shuffle(names)
    return names
