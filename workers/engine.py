"""The attempt engine: one attempt on one bed, start to finish, every phase recorded.

verify --restore (trusted) -> reset -> run -> verify (trusted) -> grade. The embedded executor and
the Celery task both call this; neither adds policy of its own.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import PurePosixPath

from sqlalchemy import select

from apg_farm import contract
from apg_farm.beds import escrow_changes_in, escrow_hash_argv, finish_draining
from apg_farm.contract import (
    EnvelopeError,
    Grade,
    Outcome,
    PhaseOutput,
    Verdict,
    bed_environment,
    judge_escrow_check,
    judge_grade,
    judge_reset,
    judge_run,
    judge_verify_after,
    judge_verify_before,
    read_grade,
    with_quarantine,
)
from apg_farm.defaults import (
    BASELINE_DIR,
    GRADE_STDOUT_LIMIT,
    LEASE_SECONDS,
    MAX_CONSECUTIVE_INFRA_ERRORS,
    PHASE_OUTPUT_LIMIT,
    RUN_JSON_LIMIT,
)
from apg_farm.errors import FarmError
from apg_farm.store import (
    Attempt,
    AttemptState,
    Bed,
    BedEvent,
    BedState,
    Claim,
    Execution,
    Phase,
    Store,
    Sweep,
    SweepState,
    claim_next,
    renew_lease,
    utcnow,
)
from apg_farm.transports import CommandResult, Transport, host_environment, transport_for

#: Where DDEV mounts the project inside the web container; AI_PG_BASELINE_DIR may use it.
_CONTAINER_ROOT = "/var/www/html"


@dataclass(frozen=True)
class BedInfo:
    """What the engine needs of a bed, read once per attempt."""

    id: int
    name: str
    approot: str
    ddev: str
    fixtures: tuple[str, ...]
    escrow_set: str | None
    env: Mapping[str, str]
    #: sha256 of every file of the escrow set when it was enrolled; None when not recorded.
    escrow_files: Mapping[str, str] | None = None

    @classmethod
    def of(cls, bed: Bed) -> BedInfo:
        return cls(
            bed.id,
            bed.name,
            bed.approot,
            bed.ddev,
            tuple(bed.fixtures),
            bed.escrow_set,
            dict(bed.env),
            escrow_files=dict(bed.escrow_files) if bed.escrow_files else None,
        )

    def runs_dir(self) -> str:
        """The bed's runs/ folder on its host, honouring AI_PG_BASELINE_DIR (contract §4)."""
        base = self.env.get("AI_PG_BASELINE_DIR")
        if not base:
            return str(PurePosixPath(self.approot) / BASELINE_DIR / "runs")
        if base == _CONTAINER_ROOT or base.startswith(_CONTAINER_ROOT + "/"):
            base = self.approot + base[len(_CONTAINER_ROOT) :]
        elif not base.startswith("/"):
            base = str(PurePosixPath(self.approot) / base)
        return str(PurePosixPath(base) / "runs")


@dataclass
class AttemptReport:
    """What happened to one claimed attempt."""

    claim: Claim
    verdict: Verdict
    #: The attempt's final outcome, or None when it went back to the queue (retry) or was lost.
    outcome: Outcome | None
    run_id: str | None = None
    lost: bool = False


class _Cancelled(Exception):
    """The sweep was cancelled; stop at this phase boundary."""


class _LeaseLost(Exception):
    """Our claim expired and was returned to the queue; someone else owns the attempt now."""


@dataclass
class _Lease:
    """Renews the claim's lease in the background while the bed works."""

    store: Store
    claim: Claim
    seconds: float
    lost: bool = False
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> _Lease:
        self._thread = threading.Thread(
            target=self._loop, name=f"lease-{self.claim.attempt_id}", daemon=True
        )
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(self.seconds / 3):
            try:
                if not renew_lease(self.store, self.claim, lease_seconds=self.seconds):
                    self.lost = True
                    return
            except Exception:
                continue


class AttemptEngine:
    """Runs attempts on one bed. One engine per bed; never two attempts at once."""

    def __init__(
        self,
        store: Store,
        bed_name: str,
        *,
        worker: str,
        transport: Transport | None = None,
        lease_seconds: float = LEASE_SECONDS,
    ) -> None:
        self.store = store
        self.worker = worker
        self.lease_seconds = lease_seconds
        with store.session() as session:
            bed = session.scalar(select(Bed).where(Bed.name == bed_name))
            if bed is None:
                raise FarmError(f"no bed named {bed_name!r}", fix="see `apg-farm bed list`")
            self.bed_id = bed.id
            self.bed_name = bed.name
            # One transport per bed for its whole life: an SSH connection is reused across attempts.
            self.transport: Transport = transport or transport_for(bed)
        self._lock = threading.Lock()

    def run_next(
        self, *, sweep_id: int | None = None, attempt_id: int | None = None
    ) -> AttemptReport | None:
        """Claim and run one attempt; None when there is nothing this bed may take."""
        with self._lock:
            claim = self.store.retrying(
                lambda: claim_next(
                    self.store,
                    self.bed_id,
                    lease_seconds=self.lease_seconds,
                    worker=self.worker,
                    sweep_id=sweep_id,
                    attempt_id=attempt_id,
                )
            )
            if claim is None:
                return None
            return self._run(claim)

    def _run(self, claim: Claim) -> AttemptReport:
        with self.store.session() as session:
            bed = BedInfo.of(session.get_one(Bed, self.bed_id))
        attempt = _Attempt(self, bed, claim)
        with _Lease(self.store, claim, self.lease_seconds) as lease:
            attempt.lease = lease
            try:
                verdict = attempt.execute()
            except _Cancelled:
                verdict = Verdict("final", "sweep cancelled", outcome=Outcome.CANCELLED)
            except _LeaseLost:
                return self.store.retrying(lambda: self._record_lost(claim, attempt))
            except Exception as error:
                # Whatever broke inside the farm (a soft time limit, a lost database) is not the
                # model's doing: record it as an infrastructure failure and let the attempt retry.
                verdict = Verdict("retry", f"farm error: {type(error).__name__}: {error}")
        # Every write is safe to repeat, so a database that drops mid-attempt costs a retry, not a record.
        return self.store.retrying(lambda: self._finish(claim, attempt, verdict))

    def _record_lost(self, claim: Claim, attempt: _Attempt) -> AttemptReport:
        verdict = Verdict("retry", "lease expired; the attempt went back to the queue")
        with self.store.session() as session:
            execution = session.get_one(Execution, claim.execution_id)
            attempt.fill(execution, verdict)
            execution.result = "LOST"
        return AttemptReport(claim, verdict, None, attempt.run_id, lost=True)

    def _finish(self, claim: Claim, attempt: _Attempt, verdict: Verdict) -> AttemptReport:
        """Record the verdict in one transaction, only if this bed still holds the attempt."""
        with self.store.session() as session:
            row = session.scalar(
                select(Attempt).where(Attempt.id == claim.attempt_id).with_for_update()
            )
            execution = session.get_one(Execution, claim.execution_id)
            bed = session.get_one(Bed, self.bed_id)
            if execution.result is not None:
                # Recorded by an earlier try whose commit went through before the connection dropped.
                done = execution.result if execution.result in Outcome.__members__ else None
                return AttemptReport(
                    claim, verdict, Outcome(done) if done else None, attempt.run_id
                )
            attempt.fill(execution, verdict)
            if row is None or row.state != AttemptState.RUNNING or row.bed_id != self.bed_id:
                # The lease expired and the attempt moved on: keep this try as history only.
                execution.result = "LOST"
                return AttemptReport(claim, verdict, None, attempt.run_id, lost=True)
            if (
                verdict.action == "retry"
                and session.get_one(Sweep, row.sweep_id).state != SweepState.OPEN
            ):
                # Never requeue into a cancelled sweep: nothing would ever take it.
                verdict = Verdict("final", f"sweep cancelled ({verdict.reason})", Outcome.CANCELLED)
            outcome, quarantine = _settle(row, bed, verdict, retries=claim.spec.retries)
            execution.result = outcome or "RETRY"
            if quarantine and bed.state == BedState.ACTIVE:
                bed.state = BedState.QUARANTINED
                bed.state_reason = quarantine
                session.add(BedEvent(bed_id=bed.id, kind="quarantined", detail=quarantine))
            if bed.state == BedState.DRAINING:
                finish_draining(session, bed)
        return AttemptReport(claim, verdict, outcome, attempt.run_id)


def _settle(
    row: Attempt, bed: Bed, verdict: Verdict, *, retries: int
) -> tuple[Outcome | None, str | None]:
    """Apply a verdict to the attempt and the bed: (final outcome or None if requeued, quarantine reason)."""
    row.bed_id = None
    row.lease_expires_at = None
    quarantine = verdict.quarantine
    if verdict.action != "retry":
        bed.consecutive_errors = 0
        assert verdict.outcome is not None
        return _done(row, verdict.outcome, verdict.reason), quarantine
    row.infra_failures += 1
    bed.consecutive_errors += 1
    if quarantine is None and bed.consecutive_errors >= MAX_CONSECUTIVE_INFRA_ERRORS:
        quarantine = (
            f"{bed.consecutive_errors} infrastructure failures in a row; last: {verdict.reason}"
        )
    if row.infra_failures > retries:
        return _done(
            row, Outcome.ERROR, f"{verdict.reason} (after {row.infra_failures} tries)"
        ), quarantine
    row.state = AttemptState.QUEUED
    row.excluded_beds = sorted({*(row.excluded_beds or []), bed.id})
    row.reason = f"retrying: {verdict.reason}"
    return None, quarantine


def _done(row: Attempt, outcome: Outcome, reason: str) -> Outcome:
    row.state = AttemptState.DONE
    row.outcome = outcome
    row.reason = reason
    row.finished_at = utcnow()
    return outcome


class _Attempt:
    """The phases of one execution on one bed."""

    def __init__(self, engine: AttemptEngine, bed: BedInfo, claim: Claim) -> None:
        self.engine = engine
        self.bed = bed
        self.claim = claim
        self.lease: _Lease | None = None
        self.env = bed_environment(
            base=host_environment(engine.transport),
            extra={**bed.env, "APG_FARM_ATTEMPT": claim.label},
        )
        self.run_id: str | None = None
        self.grade: Grade | None = None
        self.envelope: bytes | None = None
        self.bed_seconds = 0.0

    def execute(self) -> Verdict:
        spec, bed, claim = self.claim.spec, self.bed, self.claim
        if bed.escrow_set and bed.escrow_files:
            verdict = self._check_escrow()
            if verdict.action != "continue":
                return verdict
        verdict = judge_verify_before(
            self._phase("verify_before", self._verify(restore=True), spec.timeouts.verify)
        )
        if verdict.action != "continue":
            return verdict
        reset = self._phase(
            "reset", contract.reset(bed.ddev, list(bed.fixtures)), spec.timeouts.reset
        )
        verdict = judge_reset(reset)
        if verdict.action != "continue":
            return verdict
        run_verdict = self._run_agent()
        if run_verdict.action != "continue":
            return run_verdict
        after = judge_verify_after(
            self._phase("verify_after", self._verify(restore=False), spec.timeouts.verify)
        )
        if after.action != "continue":
            return with_quarantine(after, run_verdict.quarantine)
        if spec.diff:
            # Evidence of what the attempt changed, taken on a verified bed; it never decides the outcome.
            self._phase(
                "diff",
                contract.diff(bed.ddev, list(bed.fixtures), run_id=self.run_id),
                spec.timeouts.grade,
            )
        if self.run_id is None and spec.dataset is None and run_verdict.agent_failed:
            # Nothing names the model to the grade (no run record, no dataset): the agent's failure
            # stands as NO_ATTEMPT rather than an ungradable retry.
            return with_quarantine(
                Verdict(
                    "final", f"{run_verdict.reason}; no run record to grade", Outcome.NO_ATTEMPT
                ),
                run_verdict.quarantine,
            )
        argv = contract.grade(
            bed.ddev,
            claim.task,
            dataset=spec.dataset,
            model=claim.model if (self.run_id or spec.dataset) else None,
            run_id=self.run_id,
        )
        output, result = self._phase_result(
            "grade", argv, spec.timeouts.grade, stdout_limit=GRADE_STDOUT_LIMIT
        )
        problem = None
        if output.exit_code == 0 and result.rc is not None:
            if not result.stdout.truncated:
                self.envelope = result.stdout.data
            try:
                self.grade = read_grade(
                    result.stdout.data,
                    truncated=result.stdout.truncated,
                    task=claim.task,
                    model=claim.model,
                    run_id=self.run_id,
                )
            except EnvelopeError as error:
                problem = f"{error.problem}: {error.message}"
        verdict = judge_grade(
            output,
            grade=self.grade,
            envelope_problem=problem,
            agent_failed=run_verdict.agent_failed,
        )
        return with_quarantine(verdict, run_verdict.quarantine)

    def _check_escrow(self) -> Verdict:
        """The escrow set's files against the hashes recorded at enrolment: one command on the host."""
        assert self.bed.escrow_set is not None and self.bed.escrow_files is not None
        argv = escrow_hash_argv(self.bed.escrow_set)
        output, result = self._phase_result("escrow_check", argv, self.claim.spec.timeouts.verify)
        return judge_escrow_check(output, changes=escrow_changes_in(self.bed.escrow_files, result))

    def _verify(self, *, restore: bool) -> tuple[str, ...]:
        if self.bed.escrow_set:
            return contract.trusted_verify(self.bed.escrow_set, self.bed.approot, restore=restore)
        # No escrow recorded: the ddev wrapper, which an agent can rewrite (bed list warns about it).
        return contract.verify(self.bed.ddev, list(self.bed.fixtures), restore=restore)

    def _run_agent(self) -> Verdict:
        spec, claim, bed = self.claim.spec, self.claim, self.bed
        runs = bed.runs_dir()
        before = set(self.engine.transport.list_dir(runs) or [])
        argv = contract.run(
            bed.ddev, claim.task, agent=spec.agent, dataset=spec.dataset, model=claim.model
        )
        output, result = self._phase_result("run", argv, spec.timeouts.run)
        after = set(self.engine.transport.list_dir(runs) or [])
        found = contract.discover_run_id(
            task=claim.task,
            printed=contract.printed_run_ids(result.stdout.text()),
            before=before,
            after=after,
            read_run_json=lambda run_id: self._read_run_json(runs, run_id),
        )
        self.run_id = found.run_id
        # A new run folder means the adapter ran, even when its id cannot be told apart (several
        # folders, an unreadable run.json): then the live site is graded without --run.
        return judge_run(output, run_recorded=found.run_id is not None or bool(after - before))

    def _read_run_json(self, runs: str, run_id: str) -> dict[str, object] | None:
        data = self.engine.transport.read_file(f"{runs}/{run_id}/run.json", limit=RUN_JSON_LIMIT)
        if data is None:
            return None
        try:
            doc = json.loads(data)
        except (ValueError, RecursionError):  # a bed can write anything there, nesting included
            return None
        return doc if isinstance(doc, dict) else None

    def _phase(self, name: str, argv: tuple[str, ...], timeout: float) -> PhaseOutput:
        return self._phase_result(name, argv, timeout)[0]

    def _phase_result(
        self,
        name: str,
        argv: tuple[str, ...],
        timeout: float,
        *,
        stdout_limit: int = PHASE_OUTPUT_LIMIT,
    ) -> tuple[PhaseOutput, CommandResult]:
        self._check_boundary()
        started = utcnow()
        result = self.engine.transport.run(
            argv,
            cwd=self.bed.approot,
            env=self.env,
            timeout=timeout,
            stdout_limit=stdout_limit,
            stderr_limit=PHASE_OUTPUT_LIMIT,
        )
        output = contract.read_output(result)
        self.bed_seconds += result.duration
        self.engine.store.retrying(lambda: self._record(name, result, output, started))
        return output, result

    def _check_boundary(self) -> None:
        if self.lease is not None and self.lease.lost:
            raise _LeaseLost
        if self._sweep_state() == SweepState.CANCELLED:
            raise _Cancelled

    def _sweep_state(self) -> str | None:
        def read() -> str | None:
            with self.engine.store.read() as session:
                return session.scalar(select(Sweep.state).where(Sweep.id == self.claim.sweep_id))

        return self.engine.store.retrying(read)

    def _record(
        self, name: str, result: CommandResult, output: PhaseOutput, started: datetime
    ) -> None:
        with self.engine.store.session() as session:
            already = session.scalar(
                select(Phase.id).where(
                    Phase.execution_id == self.claim.execution_id,
                    Phase.name == name,
                    Phase.started_at == started,
                )
            )
            if already is not None:
                return
            session.add(
                Phase(
                    execution_id=self.claim.execution_id,
                    name=name,
                    argv=list(result.argv),
                    rc=result.rc,
                    exit_code=output.exit_code,
                    tokens=[[t.name, t.detail] for t in output.tokens],
                    started_at=started,
                    finished_at=started + timedelta(seconds=result.duration),
                    duration=result.duration,
                    timed_out=result.timed_out,
                    transport_error=result.transport_error,
                    stdout=result.stdout.text(),
                    stdout_bytes=result.stdout.total,
                    stdout_truncated=result.stdout.truncated,
                    stderr=result.stderr.text(),
                    stderr_bytes=result.stderr.total,
                    stderr_truncated=result.stderr.truncated,
                )
            )

    def fill(self, execution: Execution, verdict: Verdict) -> None:
        """Copy what this execution learned onto its row."""
        execution.finished_at = utcnow()
        execution.run_id = self.run_id
        execution.bed_seconds = self.bed_seconds
        execution.reason = verdict.reason
        if self.grade is not None:
            execution.score = self.grade.score
            execution.max_score = self.grade.max_score
        if self.envelope is not None:
            execution.envelope = self.envelope
            execution.envelope_sha256 = hashlib.sha256(self.envelope).hexdigest()
