"""A run's claims, believed only when the farm reproduces them (issue #29, DESIGN 13).

A run that says it never got going (an adapter-start token, `attempted: false`, no run record)
or that the bed is misconfigured (a bed-configuration token) may be the agent's own words: it
prints them and writes the record. Each such claim names a check the farm runs itself on the
trusted side, once the agent is stopped and the bed verified (workers/claims.py runs them):

| check | what the farm runs | reproduces |
|---|---|---|
| adapter | `ddev ai-eval-claude check`: one short call with the bed's saved token | a failure |
| install | a restart of the web container (container beds), then the adapter's check | a failure |
| credentials | its own scan of the project's DDEV configuration (fingerprinted, unchanged) | a host credential |
| ssh_keys | `ddev exec ssh-add -l` in the web container | an agent with keys |
| project_files | `git status` of CLAUDE.md, AGENTS.md, ... read on the bed's host before the run | a difference |

Reproduced: the bed's fault, retried elsewhere (a bed-configuration claim also quarantines).
Refuted (the check passed): the agent's failure, graded, no quarantine. Could not check (another
adapter, a command the bed lacks, a timeout): the old rule (an unchanged site and a run that
ended within the start window), and never more than the store's allowance of quarantines.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import TYPE_CHECKING

from apg_farm.contract.outcomes import (
    NO_RECORD,
    NOT_STARTED,
    Verdict,
    judge_claim,
    with_quarantine,
    with_unchecked,
)

if TYPE_CHECKING:
    from apg_farm.contract.site import SiteState


class Check(StrEnum):
    """A check of the farm's own that can reproduce a claim."""

    ADAPTER = (
        "adapter"  #: the adapter's own check of its install and token (`ai-eval-claude check`)
    )
    INSTALL = "install"  #: the same after a restart that removes the install (container beds)
    CREDENTIALS = "credentials"  #: the farm's scan of the project's DDEV configuration
    SSH_KEYS = "ssh_keys"  #: an SSH agent with keys reachable from the web container
    PROJECT_FILES = "project_files"  #: the agent files differ from the last commit, before the run


#: The check each claim rests on (the run tokens of outcomes.TOKENS that are claims).
CLAIM_CHECKS: Mapping[str, Check] = {
    "APG_CLAUDE_INSTALL_FAILED": Check.INSTALL,
    "APG_CLAUDE_AUTH_FAILED": Check.ADAPTER,
    "APG_CLAUDE_NO_TOKEN": Check.ADAPTER,
    "APG_CLAUDE_TOKEN_UNSAFE": Check.ADAPTER,
    "APG_CLAUDE_NOT_A_TOKEN": Check.ADAPTER,
    "APG_RUN_CRED_REFUSED": Check.CREDENTIALS,
    "APG_CLAUDE_SSH_KEYS": Check.SSH_KEYS,
    "APG_CLAUDE_PROJECT_CHANGED": Check.PROJECT_FILES,
    NOT_STARTED: Check.ADAPTER,
    NO_RECORD: Check.ADAPTER,
}

#: Claims that say the bed is misconfigured: a reproduced one quarantines the bed.
BED_CONFIGURATION: frozenset[str] = frozenset(
    {
        "APG_RUN_CRED_REFUSED",
        "APG_CLAUDE_NO_TOKEN",
        "APG_CLAUDE_TOKEN_UNSAFE",
        "APG_CLAUDE_SSH_KEYS",
        "APG_CLAUDE_PROJECT_CHANGED",
        "APG_CLAUDE_NOT_A_TOKEN",
    }
)


class Reproduced(StrEnum):
    """What the farm's own check said of a claim."""

    YES = "reproduced"  #: the check failed the same way: the bed's fault
    NO = "refuted"  #: the check passed: the claim is the agent's
    UNKNOWN = "unchecked"  #: the check could not run (another adapter, unknown command, timeout)


@dataclass(frozen=True)
class Finding:
    """One check's answer, with what it saw (said in the reason)."""

    result: Reproduced
    detail: str


def checks_for(claims: tuple[str, ...]) -> set[Check]:
    """The checks that can reproduce `claims` (an unknown claim needs none)."""
    return {CLAIM_CHECKS[c] for c in claims if c in CLAIM_CHECKS}


def judge_reproduction(
    verdict: Verdict,
    findings: Mapping[Check, Finding],
    *,
    site: SiteState,
    run_seconds: float,
    window: float,
) -> Verdict:
    """The run's claim judged by the farm's checks (_judged), keeping the quarantines the run
    asked for besides (a leaked token's, a DDEV failure's)."""
    judged = _judged(verdict, findings, site=site, run_seconds=run_seconds, window=window)
    return with_unchecked(with_quarantine(judged, verdict.quarantine), verdict.unchecked)


def _judged(
    verdict: Verdict,
    findings: Mapping[Check, Finding],
    *,
    site: SiteState,
    run_seconds: float,
    window: float,
) -> Verdict:
    """The run's claim (`verdict.claims`) against the farm's own checks of it.

    Any claim reproduced: the bed's fault, retried elsewhere, and a bed-configuration claim
    quarantines the bed (the farm saw it itself). Every claim refuted: the agent's failure,
    graded (NO_ATTEMPT unless the site passes), no quarantine. Otherwise (a check could not
    run): the rule of the unchanged site and the start window (outcomes.judge_claim); a
    bed-configuration claim believed that way asks for an `unchecked` quarantine, which the
    store grants at most once per model per hour."""
    said = ", ".join(verdict.claims)
    by_claim = {c: findings.get(CLAIM_CHECKS[c]) for c in verdict.claims if c in CLAIM_CHECKS}
    shown = "; ".join(
        f"{check} check: {finding.result}: {finding.detail}" for check, finding in findings.items()
    )
    yes = [c for c, f in by_claim.items() if f is not None and f.result == Reproduced.YES]
    if yes:
        config = [c for c in yes if c in BED_CONFIGURATION]
        return Verdict(
            "retry",
            f"{verdict.reason}; reproduced by the farm's check ({shown}): retried elsewhere",
            quarantine=(
                f"the farm's own check reproduced {', '.join(config)} ({shown})" if config else None
            ),
            claims=verdict.claims,
            farm_cause="farm_reproduced",
        )
    if by_claim and all(f is not None and f.result == Reproduced.NO for f in by_claim.values()):
        return Verdict(
            "continue",
            f"agent failed: {verdict.reason.removeprefix('agent failed: ')}; the farm's own "
            f"check passed ({shown}): {said} is the agent's claim, not the bed's",
            agent_failed=True,
            claims=verdict.claims,
        )
    judged = judge_claim(verdict, site=site, run_seconds=run_seconds, window=window)
    doubt = f" (not checked: {shown})" if shown else " (no check of the farm's applies)"
    judged = replace(judged, reason=f"{judged.reason}{doubt}", claims=verdict.claims)
    config = [c for c in verdict.claims if c in BED_CONFIGURATION]
    if judged.action == "retry" and config:
        judged = with_unchecked(
            judged, f"{', '.join(config)} claimed, and the farm could not check it"
        )
    return judged
