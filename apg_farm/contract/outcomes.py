"""The outcome policy: what each phase's result means for the attempt and for the bed.

This module and docs/outcomes.md are the whole policy; a test keeps the two in step. The rule
above the others: once the agent may have acted, what it could have caused counts against it,
unless evidence it cannot write says otherwise (the trusted verifier, the farm's own observations,
the diff on a verified bed read in full). Under it: an infrastructure failure is never scored as a
model failure (it is retried on another bed), and an agent failure is never retried away.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from apg_farm.contract.envelope import Grade
    from apg_farm.contract.output import PhaseOutput
    from apg_farm.contract.site import SiteState


class Outcome(StrEnum):
    """The one final result of an attempt."""

    PASSED = "PASSED"  #: valid, matching envelope whose score equals the metric's max_score
    FAILED = "FAILED"  #: valid, matching envelope with a lower score
    NO_ATTEMPT = (
        "NO_ATTEMPT"  #: the agent failed (timeout, error) and the grade found nothing passing
    )
    TAMPERED = "TAMPERED"  #: the verify after the run failed: not graded, counts as a failure
    SKIPPED = "SKIPPED"  #: the task has no droost spec (APG_GRADE_SKIP): nothing to grade
    INVALID = "INVALID"  #: the envelope is malformed or names another task, model or run
    ERROR = "ERROR"  #: infrastructure failures outlasted the retry budget
    CANCELLED = "CANCELLED"  #: the sweep was cancelled before the attempt finished


#: Outcomes that enter the pass-rate denominator.
COUNTED: frozenset[Outcome] = frozenset(
    {Outcome.PASSED, Outcome.FAILED, Outcome.NO_ATTEMPT, Outcome.TAMPERED}
)


class Effect(StrEnum):
    """What a stderr token means to the farm."""

    INFO = "info"  #: recorded; changes nothing
    INFRA = "infra"  #: infrastructure failure: retry the attempt on another bed
    BED_BROKEN = (
        "bed_broken"  #: infrastructure failure caused by the bed itself: retry and quarantine
    )
    AGENT = "agent"  #: the agent failed: still verified and graded; never retried
    TAMPER = "tamper"  #: judging code changed: TAMPERED after a run, and the bed is quarantined
    MISMATCH = "mismatch"  #: baseline files differ: TAMPERED after a run; --restore repairs them
    SECURITY = "security"  #: the agent leaked its token: the attempt stands, the bed is quarantined
    SKIP = "skip"  #: nothing to grade: SKIPPED
    RUN_INVALID = (
        "run_invalid"  #: grade refused the run record: INVALID, or NO_ATTEMPT if none was made
    )


@dataclass(frozen=True)
class TokenRule:
    """How one APG_* token is read, and by which command it is printed."""

    command: str
    effect: Effect


_RESET_FAIL = (
    "RESET_UNTRACKED",
    "RESET_GRADER_DRIFT",
    "RESET_PACKAGE_DRIFT",
    "RESET_COMPOSER_DRIFT",
    "RESET_PENDING_UPDATES",
)
_RESET_WARN = (
    "RESET_GRADER_UNRECORDED",
    "RESET_PACKAGE_SOURCE_EDITED",
    "RESET_COMPOSER_CHANGED",
    "RESET_CODE_DRIFT",
    "RESET_FILES_UNRECORDED",
    "RESET_PRIVATE_FILES_NOT_RESTORED",
)

#: Every token of the contract (reference/apg-contract.md §3). Unknown tokens are recorded as INFO.
TOKENS: dict[str, TokenRule] = {
    "APG_GRADE_SKIP": TokenRule("grade", Effect.SKIP),
    "APG_GRADE_RUN_INVALID": TokenRule("grade", Effect.RUN_INVALID),
    "APG_GRADE_NOT_STORED": TokenRule("grade", Effect.INFO),
    "APG_GRADE_NOT_SAVED": TokenRule("grade", Effect.INFO),
    "APG_GRADE_DATASET_UNRESOLVED": TokenRule("grade", Effect.INFO),
    "APG_GRADE_GRADER_UNRESOLVED": TokenRule("grade", Effect.INFO),
    "APG_RUN_CRED_REFUSED": TokenRule("run", Effect.BED_BROKEN),
    "APG_CLAUDE_NO_TOKEN": TokenRule("run", Effect.BED_BROKEN),
    "APG_CLAUDE_TOKEN_UNSAFE": TokenRule("run", Effect.BED_BROKEN),
    "APG_CLAUDE_SSH_KEYS": TokenRule("run", Effect.BED_BROKEN),
    "APG_CLAUDE_INSTALL_FAILED": TokenRule("run", Effect.INFRA),
    "APG_CLAUDE_AUTH_FAILED": TokenRule("run", Effect.INFRA),
    "APG_CLAUDE_PROJECT_CHANGED": TokenRule("run", Effect.BED_BROKEN),
    "APG_CLAUDE_NOT_A_TOKEN": TokenRule("run", Effect.BED_BROKEN),
    "APG_CLAUDE_TIMEOUT": TokenRule("run", Effect.AGENT),
    "APG_CLAUDE_FAILED": TokenRule("run", Effect.AGENT),
    "APG_CLAUDE_TOKEN_LEAKED": TokenRule("run", Effect.SECURITY),
    "APG_PROVISION_UNTRACKED": TokenRule("provision", Effect.BED_BROKEN),
    "APG_PROVISION_STALE_BASELINE": TokenRule("provision", Effect.BED_BROKEN),
    "APG_FIXTURE_AMBIGUOUS": TokenRule("provision", Effect.BED_BROKEN),
    "APG_PROVISION_VERSIONS_UNRECORDED": TokenRule("provision", Effect.INFO),
    **{f"APG_{name}": TokenRule("reset", Effect.BED_BROKEN) for name in _RESET_FAIL},
    **{f"APG_{name}": TokenRule("reset", Effect.INFO) for name in _RESET_WARN},
    "APG_DIFF_UNRECORDED": TokenRule("diff", Effect.INFO),
    "APG_DIFF_ERROR": TokenRule("diff", Effect.INFO),
    "APG_ESCROW_OK": TokenRule("verify", Effect.INFO),
    "APG_ESCROW_MISMATCH": TokenRule("verify", Effect.MISMATCH),
    "APG_ESCROW_RESTORED": TokenRule("verify", Effect.INFO),
    "APG_TAMPERED": TokenRule("verify", Effect.TAMPER),
    "APG_ESCROW_NONE": TokenRule("verify", Effect.BED_BROKEN),
    "APG_ESCROW_UNSAFE": TokenRule("verify", Effect.BED_BROKEN),
    "APG_ESCROW_SKIPPED": TokenRule("verify", Effect.INFO),
}


def _own(output: PhaseOutput, command: str) -> list[str]:
    # Only the tokens this command prints count: a token of another command on its stderr (an
    # agent echoing APG_RESET_UNTRACKED during its run, say) is recorded and means nothing.
    return [t.name for t in output.tokens if t.name in TOKENS and TOKENS[t.name].command == command]


def effects(output: PhaseOutput, command: str) -> set[Effect]:
    """The effects of the tokens `command` printed; unknown and foreign tokens mean nothing."""
    return {TOKENS[name].effect for name in _own(output, command)}


def _token_list(output: PhaseOutput, effect: Effect, command: str) -> str:
    names = [name for name in _own(output, command) if TOKENS[name].effect == effect]
    return ", ".join(dict.fromkeys(names))


Action = Literal["continue", "retry", "final"]


@dataclass(frozen=True)
class Verdict:
    """What the engine does after a phase."""

    action: Action
    reason: str = ""
    outcome: Outcome | None = None
    #: When set, the bed is quarantined with this reason (after the attempt is recorded).
    quarantine: str | None = None
    #: The run ended without a completed attempt because of the agent, not the bed.
    agent_failed: bool = False
    #: run.json says the adapter never started (`attempted: false`): an infrastructure failure,
    #: unless the site changed after all (then the agent ran and wrote that itself).
    adapter_not_started: bool = False
    #: The provider failed the run (rate_limited, overloaded, auth_expired, api_error) and the
    #: site is unchanged: a retry charged to the model's provider, not to the bed.
    provider_trouble: str | None = None
    #: The link to the bed failed (a transport error): the farm's own observation, never the
    #: agent's word, so a retry even after the agent ran.
    link_failure: bool = False
    #: A retry that rests on what the run printed or recorded (a start token, no run record, a
    #: run that outlasted its timeout): the agent may have written it, so judge_claim decides.
    claim: bool = False
    #: What the run claimed that a farm check can reproduce (contract/claims.py): its start and
    #: bed-configuration tokens, or NOT_STARTED / NO_RECORD. Believed only when reproduced.
    claims: tuple[str, ...] = ()
    #: A quarantine asked for by a claim the farm could not check: applied within the model's
    #: allowance (store/claim_gates.py), never to the pool.
    unchecked: str | None = None
    #: Why a retry is the farm's own (rerun_kinds.FARM_KINDS: a farm error, a link that failed
    #: after the agent was stopped, a claim the farm's check reproduced): set only where the farm
    #: saw the cause, never from text; the headline does not count such a re-run against the
    #: model.
    farm_cause: str | None = None


CONTINUE = Verdict("continue")

#: The claims of a run that are not tokens: run.json's `attempted: false`, and a failed run
#: that left no run record. Both say the adapter never started; the adapter's check decides.
NOT_STARTED = "NOT_STARTED"
NO_RECORD = "NO_RECORD"

#: Why a bed without an escrow set takes no attempt (unless enrolled with --untrusted-verifier).
UNESCROWED = (
    "no escrow set: its verifier (`ddev ai-eval-verify`) is agent-writable; escrow it with "
    "`apg-farm bed escrow NAME`, or enrol it with --untrusted-verifier"
)
#: Why a bed whose judging code was never fingerprinted takes no attempt.
UNFINGERPRINTED = (
    "judging code not fingerprinted (escrow set files or DDEV configuration): "
    "run `apg-farm bed escrow NAME`"
)


def _retry(
    reason: str,
    quarantine: str | None = None,
    *,
    claim: bool = False,
    claims: tuple[str, ...] = (),
) -> Verdict:
    return Verdict("retry", reason, quarantine=quarantine, claim=claim, claims=claims)


def _final(outcome: Outcome, reason: str, quarantine: str | None = None) -> Verdict:
    return Verdict("final", reason, outcome=outcome, quarantine=quarantine)


def _infrastructure(phase: str, output: PhaseOutput) -> Verdict | None:
    """Failures of the link or of DDEV itself, the same for every phase."""
    if output.transport_error:
        return replace(
            _retry(f"{phase}: transport failed: {output.transport_error}"), link_failure=True
        )
    if output.timed_out:
        return _retry(f"{phase}: no result before the sweep's {phase} timeout")
    if output.project_start_failed:
        return _retry(f"{phase}: DDEV could not start the project")
    if output.unknown_command:
        return _retry(
            f"{phase}: DDEV does not know the command",
            quarantine=f"{phase}: the bed lacks the ai-eval commands (Error: unknown command)",
        )
    return None


def _broken(phase: str, output: PhaseOutput) -> Verdict | None:
    tokens = _token_list(output, Effect.BED_BROKEN, phase)
    if tokens:
        return _retry(f"{phase}: {tokens}", quarantine=f"{phase} refused: {tokens}")
    return None


def judge_verify_before(output: PhaseOutput) -> Verdict:
    """The trusted verify --restore before reset: a failure is the bed's, never the model's."""
    verdict = _infrastructure("verify", output) or _broken("verify", output)
    if verdict:
        return verdict
    if Effect.TAMPER in effects(output, "verify"):
        detail = _token_list(output, Effect.TAMPER, "verify")
        return _retry(
            f"verify before the attempt: {detail}",
            quarantine="judging code changed (APG_TAMPERED before reset): reinstall trusted code",
        )
    if output.exit_code != 0:
        return _retry(f"verify before the attempt failed (exit {output.exit_code})")
    return CONTINUE


def judge_reset(output: PhaseOutput) -> Verdict:
    """A failed reset means the bed is not at baseline: never grade it, quarantine it."""
    verdict = _infrastructure("reset", output)
    if verdict:
        if output.timed_out:
            return _retry(verdict.reason, quarantine="reset did not finish in time")
        return verdict
    if broken := _broken("reset", output):
        return broken
    if output.exit_code != 0:
        return _retry(
            f"reset failed (exit {output.exit_code})",
            quarantine=f"reset failed (exit {output.exit_code})",
        )
    return CONTINUE


def judge_run(
    output: PhaseOutput,
    *,
    run_recorded: bool,
    attempted: bool | None = None,
    tokens_dropped: int = 0,
) -> Verdict:
    """The agent's run: adapter start failures are the bed's; agent failures are the model's.

    `attempted` is run.json's word on whether an attempt happened (None when not known). A run
    that exits 0 without a run record is graded live: the record is agent-writable, and an agent
    that deleted it must not turn its attempt into an infrastructure failure. `tokens_dropped`
    counts token lines of the run's stderr that were not kept (a flood of them): a leak may hide
    there, so the bed is quarantined for a human to look.
    """
    found = effects(output, "run")
    # A leaked token quarantines the bed whatever else happened: the token must be revoked.
    security = (
        f"agent leaked its token ({_token_list(output, Effect.SECURITY, 'run')}): revoke the token"
        if Effect.SECURITY in found
        else None
    )
    verdict = _infrastructure("run", output)
    refused = _token_list(output, Effect.BED_BROKEN, "run")
    if verdict is None and refused:
        # A bed-configuration token is the agent's word until the farm's own check of the bed
        # reproduces it (contract/claims.py): no quarantine here.
        verdict = _retry(f"run refused: {refused}", claims=tuple(refused.split(", ")))
    if verdict is None and Effect.INFRA in found:
        infra = _token_list(output, Effect.INFRA, "run")
        verdict = _retry(f"run: adapter could not start: {infra}", claims=tuple(infra.split(", ")))
    if verdict is None and attempted is False and Effect.AGENT not in found:
        # Only an adapter that never started may say so; an agent that ran can write it too,
        # so the farm's own check decides (contract/claims.py).
        verdict = Verdict(
            "continue",
            f"run.json says the adapter never started (exit {output.exit_code})",
            adapter_not_started=True,
            claims=(NOT_STARTED,),
        )
    if verdict is None and output.exit_code == 0 and not run_recorded:
        verdict = Verdict("continue", "run: exit 0 but no run record; the live site is graded")
    if verdict is None and output.exit_code == 0:
        verdict = CONTINUE
    if verdict is None and (Effect.AGENT in found or run_recorded):
        # The adapter ran and the agent ended without an attempt: graded, never retried away.
        reason = _token_list(output, Effect.AGENT, "run") or f"adapter exit {output.exit_code}"
        verdict = Verdict("continue", f"agent failed: {reason}", agent_failed=True)
    if verdict is None:
        verdict = _retry(
            f"run failed before the adapter started (exit {output.exit_code}, no run record)",
            claims=(NO_RECORD,),
        )
    if verdict.action == "retry":
        # A token, a missing record, DDEV's start failure, a timeout, even a link that dropped
        # (the agent can kill its own session) can all be the agent's doing once it ran:
        # believed only on evidence it cannot write (judge_claim).
        verdict = replace(verdict, claim=True, link_failure=False)
    flood = (
        f"run stderr held {tokens_dropped} more APG_ token lines than are kept: a leaked token "
        "may hide among them; read the run's transcript and revoke the token if it leaked"
        if tokens_dropped
        else None
    )
    # Both are the agent's word (it can print the token, or flood token lines, on every run):
    # the farm cannot check them, so each may take one bed per model an hour, then pauses the
    # model, never the pool (store/claim_gates.py).
    return with_unchecked(with_unchecked(verdict, security), flood)


def judge_claim(verdict: Verdict, *, site: SiteState, run_seconds: float, window: float) -> Verdict:
    """A run that says it never got going (a start token, no run record, `attempted: false`, a
    timeout), judged once the agent is stopped and the bed verified. The agent may have written
    every word of it, so it earns a retry only on evidence the agent cannot write: the diff on
    the verified bed, read in full, shows the site unchanged, and the farm timed the run ending
    within `window` seconds (before an agent could have worked, seen itself failing and put the
    site back). A claim that fast cannot be chosen by how the attempt was going, so the retry
    is no second chance, and the sweep's `retries` bound it. Otherwise the run is the agent's
    failure, graded (NO_ATTEMPT unless the site passes). A quarantine asked for stands either
    way: a human looks at a bed that printed a bed-configuration token."""
    reason = verdict.reason
    fast = run_seconds <= window
    took = (
        "was killed at the sweep's run timeout"
        if run_seconds == float("inf")
        else (f"took {run_seconds:.1f} s, longer than a start failure's {window:g} s")
    )
    if site.unchanged and fast:
        return Verdict(
            "retry",
            f"{reason}; {site.evidence} and the run ended after {run_seconds:.1f} s: nobody "
            "acted, retried elsewhere",
            quarantine=verdict.quarantine,
            claim=True,
        )
    if not site.unchanged:
        why = f"{site.evidence}, so the agent may have acted"
    else:
        why = f"the run {took}: the agent may have worked and put the site back"
    return Verdict(
        "continue",
        f"agent failed: {reason.removeprefix('agent failed: ')}; {why}",
        quarantine=verdict.quarantine,
        agent_failed=True,
    )


def judge_at_baseline(site: SiteState) -> Verdict:
    """The diff right after the reset, before anything of the attempt's runs: a bed that is not
    at baseline carries what an earlier agent left (state the reset keeps, a plant it runs), so
    it is quarantined with the evidence and the attempt goes to another bed."""
    if site.unchanged:
        return CONTINUE
    reason = f"not at baseline after the reset: {site.evidence}"
    return _retry(reason, quarantine=reason)


def with_unchecked(verdict: Verdict, unchecked: str | None) -> Verdict:
    """The verdict, also asking for a quarantine the farm could not check (claim_gates.py)."""
    if unchecked is None or unchecked in (verdict.unchecked or ""):
        return verdict
    both = unchecked if verdict.unchecked is None else f"{verdict.unchecked}; {unchecked}"
    return replace(verdict, unchecked=both)


def with_quarantine(verdict: Verdict, quarantine: str | None) -> Verdict:
    """The verdict, also quarantining the bed for `quarantine`; several reasons are all kept."""
    if quarantine is None or quarantine == verdict.quarantine:
        return verdict
    both = quarantine if verdict.quarantine is None else f"{verdict.quarantine}; {quarantine}"
    return replace(verdict, quarantine=both)


def judge_verify_after(output: PhaseOutput) -> Verdict:
    """The trusted verify after the run: any failure is TAMPERED and nothing is graded."""
    verdict = _infrastructure("verify", output) or _broken("verify", output)
    if verdict:
        return verdict
    if Effect.TAMPER in effects(output, "verify"):
        return _final(
            Outcome.TAMPERED,
            f"judging code changed: {_tampered_paths(output)}",
            quarantine="judging code changed during an attempt (APG_TAMPERED): reinstall trusted code",
        )
    mismatch = _token_list(output, Effect.MISMATCH, "verify")
    # A baseline mismatch after the run is TAMPERED even when the verifier exits 0 with it.
    # So is a repair: the verify after the run never asks for --restore, and a verifier that
    # restored something anyway (and may print only APG_ESCROW_RESTORED, exit 0) found a
    # baseline file changed during the run.
    restored = "APG_ESCROW_RESTORED" in _own(output, "verify")
    if output.exit_code != 0 or mismatch or restored:
        detail = mismatch or ("APG_ESCROW_RESTORED" if restored else f"exit {output.exit_code}")
        return _final(Outcome.TAMPERED, f"verify after the run failed: {detail}")
    return CONTINUE


def _tampered_paths(output: PhaseOutput) -> str:
    details = [t.detail for t in output.tokens if t.name == "APG_TAMPERED"]
    shown = "; ".join(details[:5])
    return shown + (f" (+{len(details) - 5} more)" if len(details) > 5 else "")


def judge_grade(
    output: PhaseOutput,
    *,
    grade: Grade | None,
    envelope_problem: str | None,
    agent_failed: bool,
    grader_mismatch: str | None = None,
) -> Verdict:
    """The grade: a verdict, a skip, a refusal, or a grade that could not run.

    `grader_mismatch` describes an envelope whose grader_tree_sha256 is not the escrowed one: the
    code that graded is not the code that was verified, so the verdict is TAMPERED.
    """
    verdict = _infrastructure("grade", output)
    if verdict:
        return verdict
    if grader_mismatch:
        return _final(
            Outcome.TAMPERED,
            f"the grader that graded is not the escrowed one: {grader_mismatch}",
            quarantine=f"grader changed after verification ({grader_mismatch}): reinstall trusted code",
        )
    found = effects(output, "grade")
    # Exit 3 is the skip; the token alone never overrides a verdict the grade did emit (exit 0).
    if output.exit_code == 3 or (Effect.SKIP in found and output.exit_code != 0):
        return _final(Outcome.SKIPPED, "task has no droost spec (APG_GRADE_SKIP)")
    if Effect.RUN_INVALID in found:
        detail = "; ".join(t.detail for t in output.tokens if t.name == "APG_GRADE_RUN_INVALID")
        if agent_failed:
            return _final(Outcome.NO_ATTEMPT, f"grade refused a run that made no attempt: {detail}")
        return _final(Outcome.INVALID, f"grade refused the run record: {detail}")
    if output.exit_code != 0:
        return _retry(f"grade could not run (exit {output.exit_code})")
    if grade is None:
        return _final(Outcome.INVALID, f"envelope rejected: {envelope_problem}")
    score = f"score {grade.score:g}/{grade.max_score:g}"
    if grade.passed:
        return _final(Outcome.PASSED, score)
    if agent_failed:
        return _final(
            Outcome.NO_ATTEMPT, f"agent failed and the grade found nothing passing ({score})"
        )
    return _final(Outcome.FAILED, score)


#: What a grade said of a site when it judged it: a verdict that counts.
GRADED: frozenset[Outcome] = frozenset({Outcome.PASSED, Outcome.FAILED, Outcome.NO_ATTEMPT})


def needs_baseline_grade(verdict: Verdict) -> bool:
    """A grade after the agent ran that gave no counted verdict: it could not run (not a failed
    link), or it said SKIPPED or INVALID. The site the agent left may have made it so (its module
    code runs inside the grade), so the farm grades the same bed at baseline to tell."""
    if verdict.action == "retry":
        return not verdict.link_failure
    return verdict.outcome in (Outcome.SKIPPED, Outcome.INVALID)


def judge_graded_at_baseline(verdict: Verdict, *, baseline: Verdict, agent_failed: bool) -> Verdict:
    """`verdict` (see needs_baseline_grade) against the same grade of the bed brought back to
    baseline (a trusted verify --restore, a reset, the diff: `baseline` is that grade's verdict,
    or the after_agent verdict of whichever step failed). When the grade judges the baseline
    site, the grader works and the agent's site is what kept it from judging: the agent's
    failure (FAILED, NO_ATTEMPT after an agent failure). When it gives the same skip or the same
    invalid envelope there, that is the task's or the grader's: `verdict` stands. When it cannot
    run there either, the grader is broken: retry elsewhere and quarantine the bed."""
    if baseline.outcome in GRADED:
        outcome = Outcome.NO_ATTEMPT if agent_failed else Outcome.FAILED
        said = verdict.outcome or "could not run"
        return _final(
            outcome,
            f"the grade of the site the agent left gave no verdict ({said}: {verdict.reason}); "
            f"the same grade judges this bed at baseline ({baseline.reason})",
            quarantine=verdict.quarantine,
        )
    if baseline.action == "final" and baseline.outcome == verdict.outcome:
        return verdict
    if baseline.action == "final" and baseline.outcome == Outcome.TAMPERED:
        return baseline  # bringing the bed back after the agent failed: counted against it
    if baseline.link_failure:
        return baseline
    why = baseline.reason
    return _retry(
        f"{verdict.reason}; at baseline too: {why}",
        quarantine=f"the grade does not run on this bed at baseline: {why}",
    )


#: Exit code of the escrow hash command when the set's folder is gone (see apg_farm/beds/escrow.py).
ESCROW_SET_MISSING = 3


def judge_escrow_check(output: PhaseOutput, *, changes: list[str] | None) -> Verdict:
    """The escrow set before the attempt: a set that changed since enrolment cannot be trusted to
    judge anything, so the bed is quarantined before its verifier runs."""
    verdict = _infrastructure("escrow check", output)
    if verdict:
        return verdict
    if output.exit_code == ESCROW_SET_MISSING:
        reason = "escrow set missing since it was recorded"
        return _retry(reason, quarantine=f"{reason}: enrol it again with `apg-farm bed escrow`")
    if output.exit_code != 0 or changes is None:
        return _retry(f"escrow check could not hash the set (exit {output.exit_code})")
    if changes:
        shown = ", ".join(changes[:5]) + (
            f" (+{len(changes) - 5} more)" if len(changes) > 5 else ""
        )
        reason = f"escrow set changed since it was recorded: {shown}"
        return _retry(reason, quarantine=reason)
    return CONTINUE


#: Exit code of the DDEV configuration hash when the project has no `.ddev` folder.
DDEV_FOLDER_MISSING = 3


def judge_ddev_check(output: PhaseOutput, *, changes: list[str] | None, after_run: bool) -> Verdict:
    """The project's DDEV configuration against its fingerprint. Its hooks run on any `ddev` call,
    so a change is judging code changed: before an attempt the bed is quarantined and the attempt
    goes elsewhere; right after a run it is TAMPERED, checked before any other `ddev` command."""
    verdict = _infrastructure("DDEV configuration check", output)
    if verdict:
        return verdict
    if output.exit_code == DDEV_FOLDER_MISSING:
        problem = ".ddev folder missing"
    elif output.exit_code != 0 or changes is None:
        problem = f"its files could not be hashed (exit {output.exit_code})"
    elif changes:
        shown = ", ".join(changes[:5]) + (
            f" (+{len(changes) - 5} more)" if len(changes) > 5 else ""
        )
        problem = f"changed since it was recorded: {shown}"
    else:
        return CONTINUE
    reason = f"DDEV configuration {problem}"
    if after_run:
        # Only the agent ran since the check before the attempt passed: whatever broke it did.
        return _final(
            Outcome.TAMPERED,
            f"{reason} during the run",
            quarantine=f"{reason} during an attempt: restore .ddev/ and `apg-farm bed escrow` it",
        )
    return _retry(reason, quarantine=f"{reason}: restore .ddev/ or `apg-farm bed escrow` it again")
