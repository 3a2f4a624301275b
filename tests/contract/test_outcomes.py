"""The outcome policy, phase by phase, and its page in docs/outcomes.md."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest

from apg_farm.contract import (
    CLAIM_CHECKS,
    TOKENS,
    Check,
    Finding,
    Outcome,
    PhaseOutput,
    Reproduced,
    SiteState,
    Verdict,
    after_agent,
    judge_at_baseline,
    judge_claim,
    judge_ddev_check,
    judge_escrow_check,
    judge_grade,
    judge_graded_at_baseline,
    judge_reproduction,
    judge_reset,
    judge_run,
    judge_verify_after,
    judge_verify_before,
    needs_baseline_grade,
    read_grade,
    read_output,
    with_quarantine,
)
from apg_farm.transports import Captured, CommandResult

DOC = Path(__file__).resolve().parents[2] / "docs" / "outcomes.md"
RED = "\x1b[31m{}\x1b[0m"


def out(
    rc: int | None, stderr: str = "", argv: tuple[str, ...] = ("ddev", "ai-eval-x"), **kw: object
) -> PhaseOutput:
    data = stderr.encode()
    result = CommandResult(
        argv=argv,
        rc=rc,
        stdout=Captured(b"", 0, False),
        stderr=Captured(data, len(data), False),
        duration=0.1,
        **kw,  # type: ignore[arg-type]
    )
    return read_output(result)


def web_fail(cmd: str, status: int, lines: str = "") -> PhaseOutput:
    return out(
        1,
        lines + RED.format(f"Failed to run {cmd} x: exit status {status}") + "\n",
        argv=("ddev", cmd, "x"),
    )


def test_every_token_has_a_row_in_the_doc() -> None:
    """docs/outcomes.md lists exactly the tokens of the policy, each with the same effect."""
    rows = dict(re.findall(r"^\| `(APG_[A-Z_]+)` \| \w+ \| (\w+) \|", DOC.read_text(), flags=re.M))
    assert rows == {name: rule.effect.value for name, rule in TOKENS.items()}


def test_every_outcome_has_a_row_in_the_doc() -> None:
    """Each outcome is explained in the doc's outcome table."""
    text = DOC.read_text()
    for outcome in Outcome:
        assert f"| {outcome.value} |" in text


def test_verify_before() -> None:
    """A failing verify before reset is the bed's problem: retry, quarantine when judging code changed."""
    assert (
        judge_verify_before(out(0, "APG_ESCROW_RESTORED x\nAPG_ESCROW_OK\n")).action == "continue"
    )
    tampered = judge_verify_before(
        out(1, "APG_TAMPERED web/x.php changed\n", argv=("/usr/bin/bash", "v.sh"))
    )
    assert tampered.action == "retry" and tampered.quarantine
    plain = judge_verify_before(out(1, "something broke\n", argv=("/usr/bin/bash", "v.sh")))
    assert plain.action == "retry" and plain.quarantine is None
    assert judge_verify_before(out(None, timed_out=True)).action == "retry"


def test_reset_failure_quarantines_and_warnings_do_not() -> None:
    """Reset fail tokens or non-zero exit quarantine; warn tokens pass."""
    failed = judge_reset(
        web_fail("ai-eval-reset", 1, "APG_RESET_GRADER_DRIFT web/modules/contrib/ai_eval\n")
    )
    assert failed.action == "retry" and "APG_RESET_GRADER_DRIFT" in (failed.quarantine or "")
    assert judge_reset(web_fail("ai-eval-reset", 2)).quarantine
    assert (
        judge_reset(out(0, "APG_RESET_CODE_DRIFT a\nAPG_RESET_FILES_UNRECORDED\n")).action
        == "continue"
    )
    timed = judge_reset(out(None, timed_out=True))
    assert timed.action == "retry" and timed.quarantine
    assert judge_reset(out(None, transport_error="link down")).quarantine is None


def test_run_agent_failure_continues_infra_retries() -> None:
    """Agent failures go on to grading; adapter start failures retry; config tokens quarantine."""
    agent = judge_run(
        web_fail("ai-eval-run", 1, "APG_CLAUDE_TIMEOUT after 3600s\n"), run_recorded=True
    )
    assert agent.action == "continue" and agent.agent_failed
    silent = judge_run(web_fail("ai-eval-run", 1), run_recorded=True)
    assert silent.action == "continue" and silent.agent_failed
    before = judge_run(web_fail("ai-eval-run", 1), run_recorded=False)
    assert before.action == "retry"
    install = judge_run(
        web_fail("ai-eval-run", 1, "APG_CLAUDE_INSTALL_FAILED npm\n"), run_recorded=True
    )
    assert install.action == "retry" and install.quarantine is None
    cred = judge_run(
        web_fail("ai-eval-run", 1, "APG_RUN_CRED_REFUSED .ddev/.env\n"), run_recorded=False
    )
    # A bed-configuration token is a claim: no quarantine until the farm reproduces it (#29).
    assert cred.action == "retry" and cred.quarantine is None
    assert cred.claims == ("APG_RUN_CRED_REFUSED",)
    leaked = judge_run(web_fail("ai-eval-run", 1, "APG_CLAUDE_TOKEN_LEAKED x\n"), run_recorded=True)
    # The agent can print a leak line on every run: an unchecked quarantine, within the model's
    # allowance (#29), never the bed's on the agent's word.
    assert leaked.action == "continue" and leaked.quarantine is None
    assert leaked.unchecked and "revoke the token" in leaked.unchecked
    assert judge_run(out(None, timed_out=True), run_recorded=False).action == "retry"
    unknown = judge_run(
        out(1, 'Error: unknown command "ai-eval-run" for "ddev"\n'), run_recorded=False
    )
    assert unknown.action == "retry" and unknown.quarantine


def test_verify_after_is_tampered_on_any_failure() -> None:
    """Judging-code changes are TAMPERED and quarantine; other failures are TAMPERED only."""
    code = judge_verify_after(
        out(1, "APG_TAMPERED web/a.php changed\n", argv=("/usr/bin/bash", "v"))
    )
    assert code.outcome == Outcome.TAMPERED and code.quarantine
    files = judge_verify_after(
        out(1, "APG_ESCROW_MISMATCH baseline.sql\n", argv=("/usr/bin/bash", "v"))
    )
    assert files.outcome == Outcome.TAMPERED and files.quarantine is None
    assert judge_verify_after(out(None, transport_error="x")).action == "retry"
    # A verifier that fails without saying why (no token at all) still failed.
    for status in (1, 2, 127):
        silent = judge_verify_after(out(status, "", argv=("/usr/bin/bash", "v")))
        assert silent.outcome == Outcome.TAMPERED and f"exit {status}" in silent.reason


@pytest.mark.parametrize(
    ("stderr_lines", "status", "agent_failed", "expected"),
    [
        ("APG_GRADE_SKIP dv01\n", 3, False, Outcome.SKIPPED),
        ("APG_GRADE_RUN_INVALID other task\n", 1, False, Outcome.INVALID),
        ("APG_GRADE_RUN_INVALID no attempt\n", 1, True, Outcome.NO_ATTEMPT),
    ],
)
def test_grade_refusals(
    stderr_lines: str, status: int, agent_failed: bool, expected: Outcome
) -> None:
    """Skip, refused run record: final outcomes, never a retry."""
    verdict = judge_grade(
        web_fail("ai-eval-grade", status, stderr_lines),
        grade=None,
        envelope_problem=None,
        agent_failed=agent_failed,
    )
    assert verdict.outcome == expected


def test_grade_verdicts_from_a_real_envelope() -> None:
    """A valid envelope gives PASSED at max score, FAILED below, NO_ATTEMPT below after an agent failure."""
    raw = Path(__file__).with_name("recorded").joinpath("grade_example.json").read_bytes()
    grade = read_grade(
        raw,
        truncated=False,
        task="dv01_view_build",
        model="anthropic/claude-sonnet-5-5",
        run_id=None,
    )
    ok = out(0, "APG_GRADE_NOT_STORED importer unavailable\n")
    assert (
        judge_grade(ok, grade=grade, envelope_problem=None, agent_failed=False).outcome
        == Outcome.PASSED
    )
    failing = raw.replace(b'"score": 5.0', b'"score": 0.0')
    low = read_grade(failing, truncated=False, task="dv01_view_build", model=None, run_id=None)
    assert (
        judge_grade(ok, grade=low, envelope_problem=None, agent_failed=False).outcome
        == Outcome.FAILED
    )
    assert (
        judge_grade(ok, grade=low, envelope_problem=None, agent_failed=True).outcome
        == Outcome.NO_ATTEMPT
    )
    bad = judge_grade(ok, grade=None, envelope_problem="schema: x", agent_failed=False)
    assert bad.outcome == Outcome.INVALID
    could_not = judge_grade(
        web_fail("ai-eval-grade", 2), grade=None, envelope_problem=None, agent_failed=False
    )
    assert could_not.action == "retry"


def test_tokens_count_only_in_the_phase_that_prints_them() -> None:
    """An agent echoing other commands' tokens during its run changes nothing; reset tokens in a run are foreign."""
    noisy = out(0, "APG_RESET_UNTRACKED web/x\nAPG_ESCROW_NONE\nAPG_GRADE_SKIP\n")
    assert judge_run(noisy, run_recorded=True) == Verdict("continue")
    assert judge_reset(out(0, "APG_CLAUDE_INSTALL_FAILED\n")).action == "continue"


def test_a_stray_skip_token_does_not_override_an_emitted_verdict() -> None:
    """Exit 0 with a valid envelope is a verdict, whatever APG_GRADE_SKIP text also appeared."""
    raw = Path(__file__).with_name("recorded").joinpath("grade_example.json").read_bytes()
    grade = read_grade(raw, truncated=False, task="dv01_view_build", model=None, run_id=None)
    verdict = judge_grade(
        out(0, "APG_GRADE_SKIP nothing\n"), grade=grade, envelope_problem=None, agent_failed=False
    )
    assert verdict.outcome == Outcome.PASSED


def test_a_leaked_token_quarantines_on_every_path() -> None:
    """APG_CLAUDE_TOKEN_LEAKED asks for the bed's quarantine even when the run is also an
    infrastructure retry, as an unchecked one (the agent can print it: claim_gates.py), and the
    farm's judging of the run's claim keeps it."""
    leaked = web_fail("ai-eval-run", 1, "APG_CLAUDE_TOKEN_LEAKED transcript.jsonl\n")
    verdict = judge_run(leaked, run_recorded=False)
    assert "revoke" in (verdict.unchecked or "") and verdict.quarantine is None
    both = web_fail("ai-eval-run", 1, "APG_CLAUDE_INSTALL_FAILED\nAPG_CLAUDE_TOKEN_LEAKED x\n")
    claimed = judge_run(both, run_recorded=True)
    assert "revoke" in (claimed.unchecked or "")
    refuted = judge_reproduction(
        claimed,
        {Check.INSTALL: Finding(Reproduced.NO, "the check passed")},
        site=UNCHANGED,
        run_seconds=1,
        window=60,
    )
    assert refuted.action == "continue" and "revoke" in (refuted.unchecked or "")


def test_an_adapter_that_never_started_is_not_the_models_failure() -> None:
    """run.json `attempted: false` with no agent token: the site decides; an agent token wins."""
    silent = web_fail("ai-eval-run", 127)
    started = judge_run(silent, run_recorded=True, attempted=False)
    assert started.action == "continue" and started.adapter_not_started and not started.agent_failed
    # Without run.json's word, a silent failure with a run record is the agent's.
    assert judge_run(silent, run_recorded=True, attempted=None).agent_failed
    timeout = web_fail("ai-eval-run", 1, "APG_CLAUDE_TIMEOUT after 3600s\n")
    assert judge_run(timeout, run_recorded=True, attempted=False).agent_failed
    unchanged = judge_claim(started, site=SiteState(True, "no change"), run_seconds=1, window=60)
    assert unchanged.action == "retry"
    # A report that could not be read in full is a site that changed, never "unknown".
    unreadable = judge_claim(started, site=SiteState(False, "report cut"), run_seconds=1, window=60)
    assert unreadable.action == "continue" and unreadable.agent_failed


UNCHANGED = SiteState(True, "the diff, read in full, reports no change")
CHANGED = SiteState(False, "the site changed: config: added views.view.x")


@pytest.mark.parametrize(
    "stderr",
    [
        "APG_CLAUDE_INSTALL_FAILED npm exited 1\n",
        "APG_CLAUDE_AUTH_FAILED 401\n",
        "Failed to start project for custom command: boom\n",
        "",  # non-zero with no run record: "failed before the adapter started"
    ],
)
def test_a_start_failure_is_a_claim_the_site_decides(stderr: str) -> None:
    """Everything the run printed is agent-writable: a start failure is a claim; believed (a
    retry) only on a site the diff shows unchanged, and once; otherwise the agent's failure."""
    verdict = judge_run(web_fail("ai-eval-run", 1, stderr), run_recorded=False)
    assert verdict.action == "retry" and verdict.claim and not verdict.link_failure
    assert judge_claim(verdict, site=UNCHANGED, run_seconds=1, window=60).action == "retry"
    scored = judge_claim(verdict, site=CHANGED, run_seconds=1, window=60)
    assert scored.action == "continue" and scored.agent_failed
    assert "may have acted" in scored.reason
    # An unchanged site after a run as long as real work: the agent may have put it back.
    slow = judge_claim(verdict, site=UNCHANGED, run_seconds=300, window=60)
    assert slow.action == "continue" and slow.agent_failed and "put the site back" in slow.reason


def test_a_run_timeout_and_a_dropped_link_during_the_run_are_claims() -> None:
    """The agent can hang its run on purpose, and kill its own session; both are claims the site
    and the clock decide. A timed-out run is never quick."""
    timed = judge_run(out(None, timed_out=True), run_recorded=True)
    assert timed.claim and not timed.link_failure
    link = judge_run(out(None, transport_error="ssh closed"), run_recorded=True)
    assert link.action == "retry" and link.claim and not link.link_failure
    killed = judge_claim(timed, site=UNCHANGED, run_seconds=float("inf"), window=60)
    assert killed.agent_failed and "run timeout" in killed.reason
    believed = judge_claim(link, site=UNCHANGED, run_seconds=2, window=60)
    assert believed.action == "retry" and believed.claim


def test_a_bed_broken_token_quarantines_only_when_the_farm_reproduces_it() -> None:
    """#29: reproduced by the farm's own check, retried and quarantined; refuted, graded with
    no quarantine; not checkable, the old rule, and a believed one asks for an `unchecked`
    quarantine (rationed by the store), never a plain one."""
    printed = judge_run(
        web_fail("ai-eval-run", 1, "APG_RUN_CRED_REFUSED .env\n"), run_recorded=True
    )
    creds = Check.CREDENTIALS
    yes = judge_reproduction(
        printed, {creds: Finding(Reproduced.YES, "k")}, site=CHANGED, run_seconds=1, window=60
    )
    assert yes.action == "retry" and "APG_RUN_CRED_REFUSED" in (yes.quarantine or "")
    assert not yes.claim  # the farm's own observation: counts against the bed
    no = judge_reproduction(
        printed, {creds: Finding(Reproduced.NO, "none")}, site=UNCHANGED, run_seconds=1, window=60
    )
    assert no.action == "continue" and no.agent_failed and no.quarantine is None
    unknown = {creds: Finding(Reproduced.UNKNOWN, "x")}
    scored = judge_reproduction(printed, unknown, site=CHANGED, run_seconds=1, window=60)
    assert scored.agent_failed and scored.quarantine is None and scored.unchecked is None
    believed = judge_reproduction(printed, unknown, site=UNCHANGED, run_seconds=1, window=60)
    assert believed.action == "retry" and believed.claim and believed.quarantine is None
    assert "could not check" in (believed.unchecked or "")


def test_a_check_after_the_run_that_cannot_complete_counts_against_the_agent() -> None:
    """A timeout or a cut listing after the run is TAMPERED; a failed link stays a retry."""
    timeout = judge_verify_after(out(None, timed_out=True))
    assert after_agent(timeout).outcome == Outcome.TAMPERED
    link = judge_verify_after(out(None, transport_error="reset by peer"))
    assert after_agent(link).action == "retry"
    assert after_agent(Verdict("retry", "x", quarantine="q")).quarantine == "q"


def test_a_bed_not_at_baseline_after_the_reset_is_quarantined() -> None:
    assert judge_at_baseline(UNCHANGED).action == "continue"
    moved = judge_at_baseline(CHANGED)
    assert moved.action == "retry" and moved.quarantine and "views.view.x" in moved.quarantine


def test_a_grade_without_a_verdict_after_the_run_is_decided_at_baseline() -> None:
    """A grade that could not run, or said SKIPPED or INVALID, after the agent ran: the same grade
    at baseline decides. It judges there: the agent's failure. The same skip or invalid envelope
    there: it stands. It cannot run there either: retry and quarantine. A step of bringing the bed
    back that failed counts against the agent (TAMPERED); a failed link retries."""
    failed = judge_grade(
        web_fail("ai-eval-grade", 2), grade=None, envelope_problem=None, agent_failed=False
    )
    skipped = Verdict("final", "no droost spec", outcome=Outcome.SKIPPED)
    invalid = Verdict("final", "envelope rejected", outcome=Outcome.INVALID)
    link = replace(failed, link_failure=True)
    assert needs_baseline_grade(failed) and needs_baseline_grade(skipped)
    assert needs_baseline_grade(invalid) and not needs_baseline_grade(link)
    assert not needs_baseline_grade(Verdict("final", "x", outcome=Outcome.FAILED))
    judged = Verdict("final", "score 0/5", outcome=Outcome.FAILED)
    for verdict in (failed, skipped, invalid):
        theirs = judge_graded_at_baseline(verdict, baseline=judged, agent_failed=False)
        assert theirs.outcome == Outcome.FAILED and "at baseline" in theirs.reason
        gave_up = judge_graded_at_baseline(verdict, baseline=judged, agent_failed=True)
        assert gave_up.outcome == Outcome.NO_ATTEMPT
    assert judge_graded_at_baseline(skipped, baseline=skipped, agent_failed=False) == skipped
    assert judge_graded_at_baseline(invalid, baseline=invalid, agent_failed=False) == invalid
    broken = judge_graded_at_baseline(failed, baseline=failed, agent_failed=False)
    assert broken.action == "retry" and broken.quarantine
    tampered = after_agent(Verdict("retry", "reset failed (exit 1)", quarantine="q"))
    assert judge_graded_at_baseline(failed, baseline=tampered, agent_failed=False) == tampered
    assert judge_graded_at_baseline(failed, baseline=link, agent_failed=False) == link


def test_a_run_without_a_record_is_graded_live() -> None:
    """Exit 0 and no run record: graded live (the agent may have deleted its record), never an
    infrastructure retry that could end ERROR."""
    graded = judge_run(out(0), run_recorded=False)
    assert graded.action == "continue" and not graded.agent_failed


def test_every_quarantine_reason_is_kept() -> None:
    """Two reasons for one bed are both kept, the leaked token's `revoke` among them."""
    # (A bed-configuration token is a claim since #29, not a quarantine: a flood is the second.)
    leaked = judge_run(
        web_fail("ai-eval-run", 1, "APG_CLAUDE_TOKEN_LEAKED x\nAPG_CLAUDE_PROJECT_CHANGED y\n"),
        run_recorded=True,
        tokens_dropped=1,
    )
    assert "revoke" in (leaked.unchecked or "") and "token lines" in (leaked.unchecked or "")
    both = with_quarantine(Verdict("retry", "r", quarantine="first"), "second")
    assert both.quarantine == "first; second"
    assert with_quarantine(both, "first; second") == both


def test_a_baseline_mismatch_after_the_run_is_tampered_whatever_the_exit_code() -> None:
    """APG_ESCROW_MISMATCH with exit 0 after the run is still TAMPERED."""
    verdict = judge_verify_after(
        out(0, "APG_ESCROW_MISMATCH baseline.sql\nAPG_ESCROW_OK\n", argv=("/usr/bin/bash", "v"))
    )
    assert verdict.outcome == Outcome.TAMPERED and "APG_ESCROW_MISMATCH" in verdict.reason


def test_a_repair_after_the_run_is_tampered() -> None:
    """The verify after the run is never asked to --restore; a verifier that repaired a baseline
    file anyway saw it changed during the run: TAMPERED, even at exit 0 with no mismatch line.
    Before the attempt a repair is what --restore is for."""
    line = "APG_ESCROW_RESTORED .ai-proving-ground/db.sql\nAPG_ESCROW_OK /e\n"
    after = judge_verify_after(out(0, line, argv=("/usr/bin/bash", "v")))
    assert after.outcome == Outcome.TAMPERED and "APG_ESCROW_RESTORED" in after.reason
    assert judge_verify_before(out(0, line, argv=("/usr/bin/bash", "v"))).action == "continue"
    clean = judge_verify_after(out(0, "APG_ESCROW_OK /e\n", argv=("/usr/bin/bash", "v")))
    assert clean.action == "continue"


@pytest.mark.parametrize("status", [0, 1, 2, 4])
def test_a_refused_run_record_is_honoured_whatever_the_exit_code(status: int) -> None:
    """APG_GRADE_RUN_INVALID refuses the run record on any exit but the skip's."""
    output = (
        out(0, "APG_GRADE_RUN_INVALID other task\n")
        if status == 0
        else web_fail("ai-eval-grade", status, "APG_GRADE_RUN_INVALID other task\n")
    )
    verdict = judge_grade(output, grade=None, envelope_problem=None, agent_failed=False)
    assert verdict.outcome == Outcome.INVALID


def test_an_envelope_from_another_grader_is_tampered() -> None:
    """grader_tree_sha256 unlike the escrowed one: TAMPERED, and the bed is quarantined."""
    raw = Path(__file__).with_name("recorded").joinpath("grade_example.json").read_bytes()
    grade = read_grade(raw, truncated=False, task="dv01_view_build", model=None, run_id=None)
    verdict = judge_grade(
        out(0),
        grade=grade,
        envelope_problem=None,
        agent_failed=False,
        grader_mismatch="envelope aaaa, escrow bbbb",
    )
    assert verdict.outcome == Outcome.TAMPERED and verdict.quarantine


def test_a_changed_ddev_configuration() -> None:
    """Before an attempt: quarantine and retry elsewhere. Right after a run: TAMPERED."""
    hashing = ("/bin/sh", "-c", "...")
    before = judge_ddev_check(
        out(0, argv=hashing), changes=["config.hook.yaml added"], after_run=False
    )
    assert before.action == "retry" and "config.hook.yaml added" in (before.quarantine or "")
    after = judge_ddev_check(out(0, argv=hashing), changes=["config.yaml changed"], after_run=True)
    assert after.outcome == Outcome.TAMPERED and after.quarantine
    gone = judge_ddev_check(out(3, argv=hashing), changes=None, after_run=True)
    assert gone.outcome == Outcome.TAMPERED and ".ddev folder missing" in gone.reason
    unhashable = judge_ddev_check(out(1, argv=hashing), changes=None, after_run=True)
    assert unhashable.outcome == Outcome.TAMPERED
    assert judge_ddev_check(out(0, argv=hashing), changes=[], after_run=True).action == "continue"
    link = judge_ddev_check(out(None, transport_error="reset"), changes=None, after_run=True)
    assert link.action == "retry"


def test_a_flood_of_token_lines_quarantines_the_bed() -> None:
    """Token lines pushed out of the kept stderr may hide a leak: the bed is quarantined."""
    verdict = judge_run(out(0), run_recorded=True, tokens_dropped=3)
    assert verdict.action == "continue" and "revoke the token" in (verdict.unchecked or "")
    assert judge_run(out(0), run_recorded=True).unchecked is None


def test_a_grade_that_exited_0_is_judged_whatever_its_stderr_says() -> None:
    """Exit 0 with a DDEV-like `exit status 3` line on stderr (the site's code runs inside the
    grade and can print anything) is the verdict the envelope carries, never SKIPPED."""
    raw = Path(__file__).with_name("recorded").joinpath("grade_example.json").read_bytes()
    grade = read_grade(raw, truncated=False, task="dv01_view_build", model=None, run_id=None)
    line = RED.format("Failed to run ai-eval-grade dv01_view_build: exit status 3")
    output = out(0, line + "\n", argv=("ddev", "ai-eval-grade", "dv01_view_build"))
    assert output.exit_code == 0
    verdict = judge_grade(output, grade=grade, envelope_problem=None, agent_failed=False)
    assert verdict.outcome == Outcome.PASSED


def test_an_agent_failure_with_a_partial_score_is_no_attempt() -> None:
    """An agent that failed and a grade that found part of the task built (a score strictly
    between min and max) is NO_ATTEMPT: only max_score passes; without the agent's failure it
    is FAILED."""
    raw = Path(__file__).with_name("recorded").joinpath("grade_example.json").read_bytes()
    full = read_grade(raw, truncated=False, task="dv01_view_build", model=None, run_id=None)
    partial = replace(full, score=2.5, passed=False)
    assert full.min_score < partial.score < full.max_score
    failed = judge_grade(out(0), grade=partial, envelope_problem=None, agent_failed=True)
    assert failed.outcome == Outcome.NO_ATTEMPT and "2.5/5" in failed.reason
    scored = judge_grade(out(0), grade=partial, envelope_problem=None, agent_failed=False)
    assert scored.outcome == Outcome.FAILED
    lowest = replace(full, score=full.min_score, passed=False)
    lowest_failed = judge_grade(out(0), grade=lowest, envelope_problem=None, agent_failed=True)
    assert lowest_failed.outcome == Outcome.NO_ATTEMPT
    passed = judge_grade(out(0), grade=full, envelope_problem=None, agent_failed=True)
    assert passed.outcome == Outcome.PASSED


def test_one_dropped_token_line_is_a_flood() -> None:
    """A single APG_ token line the capture could not keep may be the leak: quarantine."""
    verdict = judge_run(out(0), run_recorded=True, tokens_dropped=1)
    assert verdict.action == "continue" and "revoke the token" in (verdict.unchecked or "")
    assert "1 more APG_ token lines" in (verdict.unchecked or "")


def test_the_escrow_check_continues_only_on_exit_0_with_nothing_changed() -> None:
    """The escrow set's hash: exit 0 and no change continues; any other exit is no proof the set
    is intact, even with no change listed (a hash command that died half way lists fewer)."""
    hashing = ("/bin/sh", "-c", "...")
    assert judge_escrow_check(out(0, argv=hashing), changes=[]).action == "continue"
    for rc in (1, 2, 4):
        for changes in ([], None):
            verdict = judge_escrow_check(out(rc, argv=hashing), changes=changes)
            assert verdict.action == "retry" and f"exit {rc}" in verdict.reason, (rc, changes)
    missing = judge_escrow_check(out(3, argv=hashing), changes=None)
    assert missing.action == "retry" and "missing" in (missing.quarantine or "")
    changed = judge_escrow_check(out(0, argv=hashing), changes=["escrow-verify.sh changed"])
    assert changed.action == "retry" and "escrow-verify.sh" in (changed.quarantine or "")
    unread = judge_escrow_check(out(0, argv=hashing), changes=None)
    assert unread.action == "retry" and unread.quarantine is None


def test_every_claim_has_a_row_in_the_claims_table() -> None:
    """docs/outcomes.md "Claims" names each claim of contract/claims.py with its check (#29)."""
    section = DOC.read_text().split("## Claims", 1)[1].split("\n## ", 1)[0]
    rows = dict(re.findall(r"^\| `([A-Z_]+)`[^|]* \| (\w+)", section, flags=re.M))
    assert rows == {claim: check.value for claim, check in CLAIM_CHECKS.items()}
    assert "believed only when the farm reproduces it with a check of its own" in section
