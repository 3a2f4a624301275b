"""Why an execution was run again: its kind, decided once, from what the farm itself knows.

A re-run is a second chance. Whether the model pays for it in the headline (results/headline.py)
depends on its kind: a kind the farm caused or observed itself (`FARM_KINDS`) costs the model
nothing, any other may have been bought by the agent. The farm's kinds therefore come only from
the verdict's own fields, set where the farm saw the cause (`Verdict.farm_cause`): a farm error
caught by the worker, a failed link in a check after the agent was stopped, a claim its own check
reproduced. They are never read from a reason's text, which can carry what the agent wrote (a
token's detail, an adapter's error message, a site's output): text only names which of the
agent's kinds a re-run was, for the report. The kind is stored with the execution
(`executions.rerun_kind`) when it ends, and reports read that column.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from apg_farm.contract.outcomes import Outcome

if TYPE_CHECKING:
    from apg_farm.contract.outcomes import Verdict

#: The kinds of re-run, in report order; "other" takes whatever no rule names.
KINDS = (
    "provider_trouble",
    "adapter_not_started",
    "timeout_or_transport",
    "grade_failed",
    "lease_lost",
    "lost_on_host",
    "farm_error",
    "link_failed",
    "farm_reproduced",
    "no_model_call",
    "other",
)

#: Re-runs the farm caused or observed itself: the agent cannot have bought them.
#: "no_model_call": a harness's sample whose model never acted, by the harness's own counts.
FARM_KINDS = ("lease_lost", "farm_error", "link_failed", "farm_reproduced", "no_model_call")

#: A lease lost after the agent started on a bed without a web container: the agent ran as the
#: worker's user on the worker's host, where it can kill the worker (or its link) itself.
LOST_ON_HOST = "lost_on_host"

#: Re-runs that rest on what the agent could write (its record, its output, its run's timing):
#: the headline counts an attempt with one as not passed ("other" included: unknown is not the
#: farm's word).
SECOND_CHANCE_KINDS = tuple(kind for kind in KINDS if kind not in FARM_KINDS)

#: (kind, lower-case texts any of which in the lower-cased reason names it), first match wins.
#: Only the agent's kinds: a text can never make a re-run the farm's.
TEXT_RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("provider_trouble", ("provider trouble",)),
    (
        "adapter_not_started",
        (
            "adapter could not start",
            "adapter never started",
            "before the adapter started",
            "run: apg_",
        ),
    ),
    (
        "timeout_or_transport",
        (
            "transport failed",
            "no result before the sweep's",
            "ddev could not start the project",
            "ddev does not know the command",
        ),
    ),
    ("grade_failed", ("grade could not run",)),
)


def kind_of_text(reason: str | None, provider_trouble: str | None = None) -> str:
    """Which of the agent's kinds a reason names ("other" when none): never a farm kind."""
    text = (reason or "").lower()
    for kind, needles in TEXT_RULES:
        if any(needle in text for needle in needles):
            return kind
    return "provider_trouble" if provider_trouble else "other"


def rerun_kind_of(verdict: Verdict) -> str:
    """The kind of a retry verdict: the farm's cause when the farm set one, else the agent's
    kind its provider trouble or reason names."""
    if verdict.farm_cause is not None:
        return verdict.farm_cause
    return kind_of_text(verdict.reason, verdict.provider_trouble)


def lost_kind(web_container: bool, agent_started: bool) -> str:
    """The kind of a lost lease: the farm's, unless the agent had started on a bed whose
    commands run on the worker's host (no web container), where it could have killed the worker
    to be run again; nothing it cannot write says otherwise, so that one is the agent's."""
    return LOST_ON_HOST if agent_started and not web_container else "lease_lost"


def stored_kind(
    result: str | None,
    recorded: str | None,
    reason: str | None,
    provider_trouble: str | None = None,
) -> str:
    """The kind of a stored re-run: a LOST execution is a lost lease (on the host, when stored
    so); otherwise the kind recorded when it ended, or (a row without one) what its reason
    names among the agent's kinds."""
    if result == "LOST":
        return LOST_ON_HOST if recorded == LOST_ON_HOST else "lease_lost"
    if recorded in KINDS:
        return recorded
    return kind_of_text(reason, provider_trouble)


#: Outcomes an attempt with a second chance is a failure with, in the headline: a pass it may
#: have bought, and retries run out (ERROR) or an envelope broken (INVALID) after one.
_BOUGHT_FAILS = (Outcome.PASSED, Outcome.ERROR, Outcome.INVALID)


def headline_outcome(outcome: str | None, bought: bool) -> str | None:
    """The attempt's outcome as the headline counts it: after a second chance the agent could
    have bought, a PASSED, ERROR or INVALID is FAILED (counted, not passed)."""
    return Outcome.FAILED.value if bought and outcome in _BOUGHT_FAILS else outcome
