"""The scorer of the `apg` sandbox: the farm's verdict on the bed, as an Inspect score.

What the farm does after an agent (what it left running stopped, the DDEV configuration and the
trusted verify, then `ai-eval-grade` on the live site with the sample's model) runs here, and the
outcome maps to Inspect:

| farm outcome | Inspect |
|---|---|
| PASSED | score C (1) |
| PASSED, ERROR or INVALID after a re-run the agent could have bought | score I (0): the headline's count (results/headline.py) |
| FAILED, NO_ATTEMPT, TAMPERED | score I (0): in the denominator, as the farm counts them |
| SKIPPED, INVALID, ERROR, CANCELLED | a sample error (no score): out of the denominator on both sides |
| retried by the farm (a failed link, a bed that could not be judged) | a sample error: Inspect's retry_on_error runs it again and the farm's claim takes another bed |
"""

from __future__ import annotations

from typing import Any

from inspect_ai.scorer import (
    CORRECT,
    INCORRECT,
    Score,
    Scorer,
    Target,
    accuracy,
    scorer,
    stderr,
)
from inspect_ai.solver import TaskState
from inspect_ai.util import sandbox

from apg_farm.contract import Outcome, headline_outcome
from apg_farm.errors import FarmError
from apg_farm.inspect.sandbox import ApgSandboxEnvironment, _in_thread
from apg_farm.store import had_second_chance
from apg_farm.workers import AttemptReport

#: Outcomes that are a score; the rest are a sample error.
SCORED = {
    Outcome.PASSED: CORRECT,
    Outcome.FAILED: INCORRECT,
    Outcome.NO_ATTEMPT: INCORRECT,
    Outcome.TAMPERED: INCORRECT,
}


class NotScored(FarmError):
    """The farm's outcome for the sample is not a score (or the farm retries the attempt)."""


def score_of(report: AttemptReport, bed: str, *, bought: bool = False) -> Score:
    """The Inspect score of a farm verdict, as the headline counts it: `bought`, the attempt had
    a re-run the agent could have bought, so a PASSED (or an ERROR or INVALID) is I, as the
    farm's reports count it. Raises NotScored for what is no score."""
    claim = report.claim
    if report.lost:
        raise NotScored(f"{claim.label}: the lease was lost; the farm runs the attempt again")
    if report.outcome is None:
        raise NotScored(
            f"{claim.label}: the farm retries the attempt ({report.verdict.reason})",
            fix="run with --retry-on-error so Inspect takes another bed",
        )
    counted = headline_outcome(report.outcome, bought)
    value = SCORED.get(Outcome(counted)) if counted else None
    if value is None:
        raise NotScored(f"{claim.label}: {report.outcome}: {report.verdict.reason}")
    explanation = report.verdict.reason
    if counted != report.outcome:
        explanation = (
            f"{report.outcome} after a re-run the agent could have bought: the headline counts "
            f"it as {counted} ({explanation})"
        )
    metadata: dict[str, Any] = {
        "apg_outcome": str(report.outcome),
        "apg_headline_outcome": str(counted),
        "apg_bed": bed,
        "apg_sweep": claim.sweep_name,
        "apg_attempt": claim.attempt_id,
        "apg_execution": claim.execution_id,
    }
    return Score(
        value=value,
        answer=str(report.outcome),
        explanation=explanation,
        metadata=metadata,
    )


@scorer(metrics=[accuracy(), stderr()])
def apg_grade() -> Scorer:
    """The farm's trusted judging of the bed the sample ran on (the `apg` sandbox's)."""

    async def score(state: TaskState, target: Target) -> Score:
        environment = sandbox().as_type(ApgSandboxEnvironment)
        report = await environment.judge()
        bed = environment.bed
        bought = await _in_thread(
            lambda: had_second_chance(bed.engine.store, report.claim.attempt_id)
        )
        return score_of(report, bed.bed_name, bought=bought)

    return score
