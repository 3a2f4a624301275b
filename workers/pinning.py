"""Pin what the grade reads, and judge each attempt's envelope against the pin (contract/pins.py).

Where a pin comes from: a grade no agent could have influenced. The engine's own, when its
(baseline, escrow set, task, dataset) has no pin yet: right after the trusted verify --restore,
the reset, the process clean-up and the diff that shows the site at baseline, before the run
(phase `grade_pin`, once per scope: later attempts read the pin from the store). Or a canary's
grade (workers/canary.py), which follows the same verify and reset with no agent in between.
Never the first grade after a run: the escrow verifier does not cover a custom module's dataset,
so the agent of that attempt may already have edited it.

A grade at baseline that gives no envelope the farm accepts (it cannot run, its envelope is
refused) pins nothing and the attempt goes on unpinned, said in its reason: the same grade after
the run meets the same trouble and is judged by the usual policy, and a task no grade can judge
yet must not take the bed out of service here. Only a failed link makes it a retry.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy.orm import Session

from apg_farm import contract
from apg_farm.contract import (
    CONTINUE,
    DatasetRead,
    EnvelopeError,
    Grade,
    Outcome,
    Verdict,
    judge_grade,
    judge_pinned,
    pin_problem,
    read_grade,
    read_of,
    skipped_read,
)
from apg_farm.defaults import GRADE_STDOUT_LIMIT
from apg_farm.store import (
    PIN_BASELINE_GRADE,
    PIN_CANARY,
    Bed,
    Execution,
    PinScope,
    Store,
    bed_baseline,
    find_pin,
    record_pin,
)

if TYPE_CHECKING:
    from apg_farm.workers.engine import _Attempt


def pinned_read(verdict: Verdict, grade: Grade | None) -> DatasetRead | None:
    """What a grade at baseline pins: its envelope's hashes, or "skipped"; None when it gave
    nothing the farm accepts."""
    if verdict.outcome in (Outcome.PASSED, Outcome.FAILED) and grade is not None:
        return read_of(grade)
    if verdict.outcome == Outcome.SKIPPED:
        return skipped_read()
    return None


class DatasetPins:
    """One attempt's pin: found or made before the run, applied to every grade after it."""

    def __init__(self, attempt: _Attempt) -> None:
        self.attempt = attempt
        self.pin: DatasetRead | None = None

    def _scope(self) -> PinScope | None:
        store, claim = self.attempt.engine.store, self.attempt.claim

        def read(session: Session) -> tuple[str | None, str | None]:
            row = session.get_one(Execution, claim.execution_id)
            return row.baseline_key, row.escrow_sha256

        def named() -> tuple[str | None, str | None]:
            with store.read() as session:
                return read(session)

        key, escrow = store.retrying(named)
        return PinScope.of(key, escrow, claim.task, claim.spec.dataset)

    def ensure(self) -> Verdict:
        """The pin of this attempt's task on this baseline, made now by a grade at baseline when
        there is none. Called after the baseline checks, before the run."""
        attempt = self.attempt
        store = attempt.engine.store
        scope = self._scope()
        if scope is None:
            attempt.doubts.append("not pinned: the bed names no baseline or escrow set")
            return CONTINUE
        self.pin = store.retrying(lambda: find_pin(store, scope))
        if self.pin is not None:
            return CONTINUE
        verdict, grade = self._grade_at_baseline()
        read = pinned_read(verdict, grade)
        if read is None:
            if verdict.action == "retry" and verdict.link_failure:
                return verdict  # nothing learned, and no agent ran: retried as any link failure
            attempt.doubts.append(
                f"not pinned: the grade at baseline gave no envelope to pin ({verdict.reason})"
            )
            return CONTINUE
        self.pin = store.retrying(
            lambda: record_pin(
                store,
                scope,
                read,
                source=PIN_BASELINE_GRADE,
                bed_id=attempt.bed.id,
                execution_id=attempt.claim.execution_id,
            )
        )
        return CONTINUE

    def _grade_at_baseline(self) -> tuple[Verdict, Grade | None]:
        attempt = self.attempt
        claim, bed = attempt.claim, attempt.bed
        dataset = claim.spec.dataset
        model = claim.model if dataset is not None else None
        argv = contract.grade(bed.ddev, claim.task, dataset=dataset, model=model, run_id=None)
        output, result = attempt._phase_result(
            "grade_pin", argv, claim.spec.timeouts.grade, stdout_limit=GRADE_STDOUT_LIMIT
        )
        grade, problem = None, None
        if output.exit_code == 0 and result.rc is not None:
            try:
                grade = read_grade(
                    result.stdout.data,
                    truncated=result.stdout.truncated,
                    task=claim.task,
                    model=model,
                    run_id=None,
                )
            except EnvelopeError as error:
                problem = f"{error.problem}: {error.message}"
        verdict = judge_grade(
            output,
            grade=grade,
            envelope_problem=problem,
            agent_failed=False,
            grader_mismatch=attempt._grader_mismatch(grade),
        )
        return verdict, grade

    def judge(self, verdict: Verdict, grade: Grade | None) -> Verdict:
        """A grade's verdict against the pin (contract.judge_pinned)."""
        return judge_pinned(verdict, pin=self.pin, grade=grade)


def canary_pin(
    store: Store, bed: Bed, task: str, dataset: str | None, verdict: Verdict, grade: Grade | None
) -> str | None:
    """A canary's grade at baseline: pins its task when unpinned; when pinned, how the grade
    departs from the pin (the bed's dataset changed since: a contaminated bed), else None."""
    identity = bed_baseline(bed) or {}
    scope = PinScope.of(identity.get("key"), identity.get("escrow_sha256"), task, dataset)
    read = pinned_read(verdict, grade)
    if scope is None or read is None:
        return None
    pin = store.retrying(lambda: record_pin(store, scope, read, source=PIN_CANARY, bed_id=bed.id))
    return pin_problem(pin, read)
