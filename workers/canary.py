"""The canary: a grade right after a reset, before any agent, on one bed.

After `ai-eval-reset` the site is at baseline, so a build task graded there must not pass: the
farm's trusted verify --restore, the reset, then `ai-eval-grade <task>` with no run. FAILED is the
expected, healthy result. PASSED means what the grade reads survived the reset (a contaminated
bed: every later attempt there could pass without work); a grade that cannot run, or gives an
envelope the farm refuses, means a broken grader. Either quarantines the bed with the evidence;
so does a trusted verify or reset that fails (the bed cannot be brought to baseline). A failed
link teaches nothing: recorded, nothing quarantined, and the canary stays due.

The canary is the farm's own execution, never an attempt: it holds the bed (claims refuse it
meanwhile), and its phases are kept in its bed event (lifecycle.record_canary), so no sweep,
report or count ever sees it. Workers run it before they claim, when one is due
(store/canaries.canary_due); `apg-farm bed doctor NAME --canary` runs it on demand.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from dataclasses import dataclass
from typing import Any

from apg_farm import contract
from apg_farm.contract import EnvelopeError, Grade, Outcome, Verdict, bed_environment, read_grade
from apg_farm.defaults import GRADE_STDOUT_LIMIT
from apg_farm.specs import Timeouts
from apg_farm.store import (
    BROKEN,
    CONTAMINATED,
    HEALTHY,
    INCONCLUSIVE,
    NO_TASK,
    NOT_AT_BASELINE,
    Bed,
    Store,
    canary_tasks,
    hold_for_canary,
    record_canary,
    start_phase,
    utcnow,
)
from apg_farm.transports import CommandResult, Transport, host_environment, transport_for
from apg_farm.workers.farm_errors import farm_error_trace
from apg_farm.workers.pinning import canary_pin

#: Tasks a canary tries before it gives up finding one the grader does not SKIP.
MAX_CANDIDATES = 3
#: Each phase's stdout and stderr kept in the canary's event (head and tail, as phases keep).
EVIDENCE_LIMIT = 64 * 1024
#: The canary's phases take the sweeps' default timeouts.
TIMEOUTS = Timeouts()


@dataclass(frozen=True)
class CanaryResult:
    """How one canary ended."""

    bed: str
    #: canaries.HEALTHY, CONTAMINATED, BROKEN, NOT_AT_BASELINE, NO_TASK or INCONCLUSIVE; "busy"
    #: when the bed could not be held (nothing ran, nothing recorded).
    result: str
    reason: str
    task: str | None = None
    #: The bed event holding the evidence; None when nothing was recorded (busy).
    event_id: int | None = None
    quarantined: bool = False
    seconds: float = 0.0

    @property
    def healthy(self) -> bool:
        return self.result == HEALTHY

    def line(self) -> str:
        """One line for a person: the bed, the result, why, and what happened to the bed."""
        what = f"bed {self.bed}: canary {self.result}"
        if self.task:
            what += f" (task {self.task})"
        what += f": {self.reason}"
        if self.quarantined:
            what += "; the bed is quarantined (`apg-farm bed release` after a look)"
        if self.event_id is not None:
            what += f" [bed event {self.event_id}, {self.seconds:.1f} s]"
        return what


def run_canary(
    store: Store,
    bed: Bed,
    *,
    worker: str,
    trigger: str,
    transport: Transport | None = None,
    task: str | None = None,
    dataset: str | None = None,
    operator: bool = False,
) -> CanaryResult:
    """Hold the bed, verify, reset and grade it, record what that showed (and quarantine)."""
    tasks, dataset = store.retrying(lambda: canary_tasks(store, bed.id, task=task, dataset=dataset))
    hold = TIMEOUTS.verify + TIMEOUTS.reset + TIMEOUTS.grade * MAX_CANDIDATES + 60
    refused = store.retrying(
        lambda: hold_for_canary(store, bed.id, seconds=hold, by=worker, operator=operator)
    )
    if refused is not None:
        return CanaryResult(bed.name, "busy", refused)
    own = transport is None
    transport = transport or transport_for(bed)
    run = _Canary(store, bed, transport)
    started = time.monotonic()
    trace: str | None = None
    try:
        result, reason, quarantine, chosen = run.execute(tasks[:MAX_CANDIDATES], dataset)
    except Exception as error:  # the farm's own trouble: nothing learned of the bed
        trace = farm_error_trace(error, f"the canary of bed {bed.name}")
        result, reason, quarantine, chosen = (
            INCONCLUSIVE,
            f"farm error: {type(error).__name__}: {error}",
            None,
            None,
        )
    finally:
        if own:
            transport.close()
    seconds = time.monotonic() - started
    evidence: dict[str, Any] = {
        # Makes recording it safe to repeat (lifecycle.record_canary).
        "id": uuid.uuid4().hex,
        "result": result,
        "reason": reason,
        "trigger": trigger,
        "worker": worker,
        "task": chosen,
        "dataset": dataset,
        "tried": run.tried,
        "seconds": round(seconds, 3),
        "phases": run.phases,
        **run.graded,
    }
    if trace is not None:
        evidence["farm_error"] = trace
    event = store.retrying(
        lambda: record_canary(store, bed.id, evidence, quarantine_reason=quarantine)
    )
    return CanaryResult(
        bed.name, result, reason, chosen, event, quarantined=quarantine is not None, seconds=seconds
    )


class _Canary:
    """The phases of one canary on one bed, each kept as evidence."""

    def __init__(self, store: Store, bed: Bed, transport: Transport) -> None:
        self.store = store
        self.bed = bed
        self.transport = transport
        self.env = bed_environment(
            base=host_environment(transport),
            extra={**dict(bed.env or {}), "APG_FARM_ATTEMPT": f"canary/{bed.name}"},
        )
        self.phases: list[dict[str, Any]] = []
        #: The tasks graded, in order, with what the grade said of each.
        self.tried: list[dict[str, str]] = []
        #: The verdict's figures of the graded task (score, envelope sha256).
        self.graded: dict[str, Any] = {}

    def execute(
        self, tasks: list[str], dataset: str | None
    ) -> tuple[str, str, str | None, str | None]:
        """(result, reason, the quarantine's reason or None, the task graded)."""
        if not tasks:
            return NO_TASK, "no task to grade: no sweep on the bed's pool names one", None, None
        bed = self.bed
        verify = (
            contract.trusted_verify(bed.escrow_set, bed.approot, restore=True)
            if bed.escrow_set
            else contract.verify(bed.ddev, list(bed.fixtures), restore=True)
        )
        for name, argv, timeout, judge in (
            ("verify_before", verify, TIMEOUTS.verify, contract.judge_verify_before),
            (
                "reset",
                contract.reset(bed.ddev, list(bed.fixtures)),
                TIMEOUTS.reset,
                contract.judge_reset,
            ),
        ):
            output, _ = self._phase(name, argv, timeout)
            verdict = judge(output)
            if verdict.action == "continue":
                continue
            if _link(verdict, output):
                return INCONCLUSIVE, f"{name}: {verdict.reason}", None, None
            reason = f"the canary's {name} failed: {verdict.quarantine or verdict.reason}"
            return NOT_AT_BASELINE, reason, reason, None
        for task in tasks:
            verdict, grade, output = self._grade(task, dataset)
            self.tried.append({"task": task, "verdict": str(verdict.outcome or verdict.action)})
            # A grade at baseline pins what its task's grade reads (workers/pinning.py); one
            # that departs from the pin finds the bed's dataset changed since.
            changed = canary_pin(self.store, self.bed, task, dataset, verdict, grade)
            if changed is not None:
                reason = f"task {task}: the grade at baseline read another dataset: {changed}"
                return CONTAMINATED, reason, reason, task
            if verdict.outcome == Outcome.SKIPPED:
                continue  # a task the grader skips is no canary: try the next one
            if grade is not None:
                self.graded = {"score": grade.score, "max_score": grade.max_score}
            if verdict.outcome == Outcome.FAILED:
                return HEALTHY, f"FAILED at baseline, as it must ({verdict.reason})", None, task
            if verdict.outcome == Outcome.PASSED:
                reason = (
                    f"task {task} PASSED right after a reset ({verdict.reason}): what the grade "
                    "reads survives the reset (a contaminated bed)"
                )
                return CONTAMINATED, reason, reason, task
            if _link(verdict, output):
                return INCONCLUSIVE, f"grade: {verdict.reason}", None, task
            reason = f"the grade at baseline gives no verdict: {verdict.reason} (a broken grader?)"
            return BROKEN, reason, reason, task
        return NO_TASK, f"the grader skips every task tried ({', '.join(tasks)})", None, None

    def _grade(self, task: str, dataset: str | None) -> tuple[Verdict, Grade | None, Any]:
        argv = contract.grade(self.bed.ddev, task, dataset=dataset)
        output, result = self._phase("grade", argv, TIMEOUTS.grade, stdout_limit=GRADE_STDOUT_LIMIT)
        grade, problem = None, None
        if output.exit_code == 0 and result.rc is not None:
            self.graded["envelope_sha256"] = hashlib.sha256(result.stdout.data).hexdigest()
            try:
                grade = read_grade(
                    result.stdout.data,
                    truncated=result.stdout.truncated,
                    task=task,
                    model=None,
                    run_id=None,
                )
            except EnvelopeError as error:
                problem = f"{error.problem}: {error.message}"
        verdict = contract.judge_grade(
            output,
            grade=grade,
            envelope_problem=problem,
            agent_failed=False,
            grader_mismatch=self._grader_mismatch(grade),
        )
        return verdict, grade, output

    def _grader_mismatch(self, grade: Grade | None) -> str | None:
        recorded = self.bed.grader_tree_sha256
        graded = grade.provenance.get("grader_tree_sha256") if grade else None
        if recorded is None or graded is None or graded == recorded:
            return None
        return f"envelope grader_tree_sha256 {graded[:16]}…, escrow records {recorded[:16]}…"

    def _phase(
        self,
        name: str,
        argv: tuple[str, ...],
        timeout: float,
        *,
        stdout_limit: int = EVIDENCE_LIMIT,
    ) -> tuple[contract.PhaseOutput, CommandResult]:
        started = utcnow()
        # On the bed's row for the live views; record_canary clears it at the end.
        self.store.retrying(lambda: start_phase(self.store, self.bed.id, name, started))
        result = self.transport.run(
            argv,
            cwd=self.bed.approot,
            env=self.env,
            timeout=timeout,
            stdout_limit=stdout_limit,
            stderr_limit=EVIDENCE_LIMIT,
        )
        output = contract.read_output(result)
        self.phases.append(_evidence(name, result, output, started.isoformat()))
        return output, result


def _link(verdict: Verdict, output: contract.PhaseOutput) -> bool:
    """The link to the bed failed, or DDEV could not start the project: nothing about the bed
    itself was learned (the engine retries these too)."""
    return verdict.link_failure or bool(output.transport_error) or output.project_start_failed


def _evidence(
    name: str, result: CommandResult, output: contract.PhaseOutput, started: str
) -> dict[str, Any]:
    """One phase as the canary's event keeps it (bounded, as a phase row is)."""
    stdout = result.stdout.text()
    return {
        "name": name,
        "argv": list(result.argv),
        "started_at": started,
        "duration": round(result.duration, 3),
        "rc": result.rc,
        "exit_code": output.exit_code,
        "tokens": [[t.name, t.detail] for t in output.tokens],
        "timed_out": result.timed_out,
        "transport_error": result.transport_error,
        "stdout": stdout if len(stdout) <= EVIDENCE_LIMIT else stdout[:EVIDENCE_LIMIT],
        "stdout_bytes": result.stdout.total,
        "stdout_truncated": result.stdout.truncated or len(stdout) > EVIDENCE_LIMIT,
        "stderr": result.stderr.text(),
        "stderr_bytes": result.stderr.total,
        "stderr_truncated": result.stderr.truncated,
    }
