"""apg-farm's own mutation test of its safety lines (standard library only).

Each mutant is one small, plausible bug: a file, an exact snippet of it and what replaces it, and
the test node ids that should catch it. The tool plants one mutant at a time in the working
tree, runs its tests (`pytest -x -q`) and puts the file back (in a `finally`, also on Ctrl-C or
SIGTERM), then prints per module: mutants, killed, survived, score.

    .venv/bin/python bench/mutate.py                    # every mutant
    .venv/bin/python bench/mutate.py --list             # names, files and tests, nothing run
    .venv/bin/python bench/mutate.py --only claim-no-bed-lock,flood-needs-two
    .venv/bin/python bench/mutate.py --module apg_farm/store/claims.py --json out.json
    .venv/bin/python bench/mutate.py --baseline         # first: every listed test passes unmutated

A mutant is killed when its tests fail (or time out); it survives when they pass. Set
APG_FARM_TEST_DATABASE_URL so the tests that need PostgreSQL run (the bed-lock mutant is only
seen there); without it those tests skip and their mutants survive. A planted file gets an
mtime of its own and no bytecode is written while it is planted, so a stale .pyc of the original
never runs in the mutant's place (nor the mutant's afterwards). See docs/testing.md.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

ROOT = Path(__file__).resolve().parents[1]

OUTCOMES = "apg_farm/contract/outcomes.py"
RETRIES = "apg_farm/contract/retries.py"
ENVELOPE = "apg_farm/contract/envelope.py"
OUTPUT = "apg_farm/contract/output.py"
TOKENS = "apg_farm/contract/tokens.py"
LIFECYCLE = "apg_farm/store/lifecycle.py"
RULES = "apg_farm/store/rules.py"
CLAIMS = "apg_farm/store/claims.py"
GATE_FAMILY = "apg_farm/results/gate_family.py"
PACING = "apg_farm/store/pacing.py"
SEALING = "apg_farm/results/sealing.py"
AUTH = "apg_farm/dashboard/auth.py"
STATS = "apg_farm/results/stats.py"
ENGINE = "workers/engine.py"
WORKTREE = "apg_farm/workers/worktree.py"
WORKTREE_SCRIPT = "apg_farm/beds/worktree.py"
RERUN_SEAL = "apg_farm/results/sealing.py"
SECRET_ENV = "apg_farm/secret_env.py"
INSPECT_SANDBOX = "apg_farm/inspect/sandbox.py"
INSPECT_SCORER = "apg_farm/inspect/scorer.py"
WORKER_CLAIMS = "workers/claims.py"

T_OUTCOMES = "tests/contract/test_outcomes.py"
T_ENVELOPE = "tests/contract/test_envelope.py"
T_CONTRACT = "tests/contract/test_contract.py"
T_STORE = "tests/store/test_store.py"
T_CLAIMS = "tests/store/test_claim_branches.py"
T_PACING = "tests/store/test_pacing.py"
T_SEAL = "tests/results/test_seal.py"
T_DASH = "tests/dashboard/test_dashboard.py"
T_STATS = "tests/results/test_stats.py"
T_ENGINE = "tests/workers/test_engine.py"
T_ATTACKS = "tests/cli/test_attacks.py"
T_WORKTREE = "tests/workers/test_worktree.py"
REFUSED = "tests/e2e/test_inspect_eval.py::test_a_sample_whose_provider_refused_its_first_call_is_run_again_at_no_cost"


@dataclass(frozen=True)
class Mutant:
    """One planted bug: `old` (which must occur exactly once in `file`) becomes `new`."""

    name: str
    file: str
    old: str
    new: str
    tests: tuple[str, ...]
    #: Why this mutant cannot be told from the original, when it is equivalent (then a survivor
    #: is reported as such and left out of the score).
    equivalent: str | None = None


def m(
    name: str, file: str, old: str, new: str, *tests: str, equivalent: str | None = None
) -> Mutant:
    return Mutant(name, file, old, new, tuple(tests), equivalent)


MUTANTS: tuple[Mutant, ...] = (
    # --- the survivors of issue 19's review, each with the test that now kills it -----------
    m(
        "verify-after-restores",
        ENGINE,
        'self._phase("verify_after", self._verify(restore=False)',
        'self._phase("verify_after", self._verify(restore=True)',
        f"{T_ENGINE}::test_a_baseline_file_edited_during_the_run_is_tampered_and_left_as_evidence[sqlite]",
    ),
    m(
        "task-prefix-without-slash",
        ENVELOPE,
        'r["evaluation_result_id"].startswith(f"{task}/")',
        'r["evaluation_result_id"].startswith(task)',
        f"{T_ENVELOPE}::test_a_task_whose_id_extends_another_is_not_it",
    ),
    m(
        "ddev-line-on-any-rc",
        OUTPUT,
        "elif rc == 1 and failure is not None and failure.status != 0:",
        "elif failure is not None and failure.status != 0:",
        f"{T_CONTRACT}::test_a_failure_line_is_read_only_behind_rc_1",
        f"{T_OUTCOMES}::test_a_grade_that_exited_0_is_judged_whatever_its_stderr_says",
    ),
    m(
        "escrow-check-exit-1-no-changes",
        OUTCOMES,
        "    if output.exit_code != 0 or changes is None:\n"
        '        return _retry(f"escrow check could not hash',
        '    if changes is None:\n        return _retry(f"escrow check could not hash',
        f"{T_OUTCOMES}::test_the_escrow_check_continues_only_on_exit_0_with_nothing_changed",
    ),
    m(
        "flood-needs-two",
        OUTCOMES,
        '"may hide among them; read the run\'s transcript and revoke the token if it leaked"\n'
        "        if tokens_dropped\n",
        '"may hide among them; read the run\'s transcript and revoke the token if it leaked"\n'
        "        if tokens_dropped > 1\n",
        f"{T_OUTCOMES}::test_one_dropped_token_line_is_a_flood",
    ),
    m(
        "no-attempt-only-at-min-score",
        OUTCOMES,
        "    if agent_failed:\n        return _final(\n            Outcome.NO_ATTEMPT,",
        "    if agent_failed and grade.score == grade.min_score:\n"
        "        return _final(\n            Outcome.NO_ATTEMPT,",
        f"{T_OUTCOMES}::test_an_agent_failure_with_a_partial_score_is_no_attempt",
    ),
    m(
        "claim-no-bed-lock",
        CLAIMS,
        "bed = session.get(Bed, bed_id, with_for_update=not store.is_sqlite)",
        "bed = session.get(Bed, bed_id, with_for_update=False)",
        f"{T_STORE}::test_a_bed_holds_one_claim_at_a_time[postgresql]",
    ),
    m(
        "requeue-keeps-dead-bed",
        CLAIMS,
        "            attempt.excluded_beds = sorted({*(attempt.excluded_beds or []), attempt.bed_id})\n",
        "",
        f"{T_CLAIMS}::test_an_expired_lease_sends_the_attempt_to_another_bed[sqlite]",
    ),
    m(
        "claim-without-ddev-fingerprint",
        CLAIMS,
        "if (bed.escrow_set and not bed.escrow_files) or bed.ddev_files is None:",
        "if bed.escrow_set and not bed.escrow_files:",
        f"{T_CLAIMS}::test_a_bed_with_an_escrow_set_but_no_ddev_fingerprint_takes_nothing[sqlite]",
    ),
    m(
        "farm-budget-exactly-spent",
        PACING,
        "if used >= limits[scope]:",
        "if used > limits[scope]:",
        f"{T_PACING}::test_spend_exactly_at_a_budget_stops_the_claim[sqlite]",
    ),
    m(
        "sweep-budget-exactly-spent",
        PACING,
        "or_(Sweep.budget_usd.is_(None), Sweep.spent_usd < Sweep.budget_usd)",
        "or_(Sweep.budget_usd.is_(None), Sweep.spent_usd <= Sweep.budget_usd)",
        f"{T_PACING}::test_spend_exactly_at_a_budget_stops_the_claim[sqlite]",
    ),
    m(
        "sealed-only-while-open",
        LIFECYCLE,
        "    if sweep.sealed_at is not None:\n        raise SealedSweep(",
        "    if sweep.sealed_at is not None and sweep.state == 'open':\n        raise SealedSweep(",
        f"{T_SEAL}::test_a_cancelled_sealed_sweep_is_still_sealed[sqlite]",
    ),
    m(
        "csrf-compared-with-eq",
        AUTH,
        "return hmac.compare_digest(submitted, self.csrf_token(nonce))",
        "return submitted == self.csrf_token(nonce)",
        f"{T_DASH}::test_every_secret_is_compared_in_constant_time",
    ),
    m(
        "token-file-group-readable",
        AUTH,
        "if mode & 0o077:",
        "if mode & 0o007:",
        f"{T_DASH}::test_a_token_file_others_can_read_is_refused",
    ),
    m(
        "bare-authorization-header",
        AUTH,
        '        if not header or not header.startswith("Bearer "):\n            return False\n'
        '        return self.token_matches(header[len("Bearer ") :])',
        "        if not header:\n            return False\n"
        '        return self.token_matches(header.removeprefix("Bearer "))',
        f"{T_DASH}::test_only_a_bearer_header_carries_the_token",
    ),
    m(
        "newcombe-correction-from-zero",
        STATS,
        "if cross > n / 2:",
        "if cross > 0:",
        f"{T_STATS}::test_newcombe_paired_reproduces_newcombe_1998_table",
    ),
    # --- more plausible bugs in the safety modules --------------------------------------------
    # outcomes.py: the policy
    m(
        "verify-after-ignores-exit",
        OUTCOMES,
        "    if output.exit_code != 0 or mismatch or restored:",
        "    if mismatch or restored:",
        f"{T_OUTCOMES}::test_verify_after_is_tampered_on_any_failure",
    ),
    m(
        "verify-after-repair-passes",
        OUTCOMES,
        "    if output.exit_code != 0 or mismatch or restored:",
        "    if output.exit_code != 0 or mismatch:",
        f"{T_OUTCOMES}::test_a_repair_after_the_run_is_tampered",
    ),
    m(
        "stray-skip-token-overrides-verdict",
        OUTCOMES,
        "if output.exit_code == 3 or (Effect.SKIP in found and output.exit_code != 0):",
        "if output.exit_code == 3 or Effect.SKIP in found:",
        f"{T_OUTCOMES}::test_a_stray_skip_token_does_not_override_an_emitted_verdict",
    ),
    m(
        "foreign-tokens-count",
        OUTCOMES,
        "if t.name in TOKENS and TOKENS[t.name].command == command]",
        "if t.name in TOKENS]",
        f"{T_OUTCOMES}::test_tokens_count_only_in_the_phase_that_prints_them",
    ),
    m(
        "run-link-drop-believed",
        OUTCOMES,
        "verdict = replace(verdict, claim=True, link_failure=False)",
        "verdict = replace(verdict, claim=True)",
        f"{T_OUTCOMES}::test_a_run_timeout_and_a_dropped_link_during_the_run_are_claims",
    ),
    m(
        "claim-believed-however-long",
        OUTCOMES,
        "fast = run_seconds <= window",
        "fast = run_seconds >= 0",
        f"{T_OUTCOMES}::test_a_start_failure_is_a_claim_the_site_decides",
        f"{T_OUTCOMES}::test_a_run_timeout_and_a_dropped_link_during_the_run_are_claims",
    ),
    m(
        "after-agent-retries-everything",
        RETRIES,
        'if verdict.action != "retry" or verdict.link_failure:',
        'if verdict.action != "retry" or not verdict.link_failure:',
        f"{T_OUTCOMES}::test_a_check_after_the_run_that_cannot_complete_counts_against_the_agent",
    ),
    m(
        "baseline-grade-forgets-agent-failure",
        OUTCOMES,
        "outcome = Outcome.NO_ATTEMPT if agent_failed else Outcome.FAILED",
        "outcome = Outcome.FAILED",
        f"{T_OUTCOMES}::test_a_grade_without_a_verdict_after_the_run_is_decided_at_baseline",
    ),
    m(
        "leak-quarantine-dropped",
        OUTCOMES,
        "return with_unchecked(with_unchecked(verdict, security), flood)",
        "return with_unchecked(verdict, flood)",
        f"{T_OUTCOMES}::test_a_leaked_token_quarantines_on_every_path",
    ),
    m(
        "ddev-change-after-run-retried",
        OUTCOMES,
        "    if after_run:\n        # Only the agent ran",
        "    if after_run and changes:\n        # Only the agent ran",
        f"{T_OUTCOMES}::test_a_changed_ddev_configuration",
    ),
    # envelope.py: the envelope is about this attempt
    m(
        "run-id-suffix-without-boundary",
        ENVELOPE,
        'return before == "" or not before[-1].isalnum()',
        "return True",
        f"{T_ENVELOPE}::test_run_id_suffix_needs_boundary",
    ),
    m(
        "two-providers-match",
        ENVELOPE,
        "    provider, name = _split_model(model)\n    id_provider, id_name = _split_model(model_id)\n"
        "    if provider and id_provider and provider != id_provider:\n        return False\n",
        "    provider, name = _split_model(model)\n    id_provider, id_name = _split_model(model_id)\n",
        f"{T_ENVELOPE}::test_model_matching_rule",
    ),
    m(
        "score-above-max-accepted",
        ENVELOPE,
        "if not low <= score <= high:",
        "if not low <= score:",
        f"{T_ENVELOPE}::test_score_above_max",
    ),
    m(
        "apg-run-id-unchecked",
        ENVELOPE,
        "if apg_run_id is not None and apg_run_id != run_id:",
        "if apg_run_id is not None and not apg_run_id.startswith(run_id[:4]):",
        f"{T_ENVELOPE}::test_wrong_run_apg_run_id",
    ),
    m(
        "duplicate-keys-accepted",
        ENVELOPE,
        '        if key in obj:\n            raise ValueError(f"duplicate key',
        '        if key in obj and obj[key] == value:\n            raise ValueError(f"duplicate key',
        f"{T_ENVELOPE}::test_not_json",
    ),
    m(
        "grade-task-from-the-request",
        ENVELOPE,
        'task=result["evaluation_name"],',
        "task=task,",
        f"{T_ENVELOPE}::test_mutated_envelopes_never_crash",
    ),
    # claims.py: the claim
    m(
        "poisoned-one-delivery-late",
        RETRIES,
        ">= retries + 1 + self.extra_deliveries",
        "> retries + 1 + self.extra_deliveries",
        f"{T_CLAIMS}::test_an_attempt_delivered_past_its_bound_ends_error[sqlite]",
    ),
    m(
        "hand-back-one-late",
        RETRIES,
        "or handed_back >= self.hand_back_limit",
        "or handed_back > self.hand_back_limit",
        f"{T_CLAIMS}::test_a_retry_handed_back_enough_times_goes_to_any_bed[sqlite]",
    ),
    m(
        "sealed-sweep-claimed",
        CLAIMS,
        "            .where(Sweep.sealed_at.is_(None))\n",
        "",
        f"{T_SEAL}::test_sealed_sweep_takes_no_new_executions[sqlite]",
    ),
    m(
        "lost-lease-not-counted",
        CLAIMS,
        "            count_lost_try(session, attempt.bed_id, policy)\n",
        "",
        f"{T_CLAIMS}::test_lost_leases_in_a_row_quarantine_the_bed[sqlite]",
    ),
    m(
        "renew-for-any-bed",
        CLAIMS,
        "                    Attempt.bed_id == claim.bed_id,\n",
        "",
        f"{T_STORE}::test_a_bed_that_lost_its_claim_cannot_renew_another_beds[sqlite]",
    ),
    m(
        "unescrowed-bed-claimed",
        CLAIMS,
        "if not bed.escrow_set and not bed.untrusted_verifier:",
        "if not bed.escrow_set and bed.untrusted_verifier is False and bed.escrow_files:",
        "tests/workers/test_quarantine.py::test_no_unattended_attempt_on_a_bed_without_escrow",
    ),
    # pacing.py: budgets, caps, breakers
    m(
        "max-concurrent-one-over",
        PACING,
        "if limit is not None and running_counts(self.session, [model]).get(model, 0) >= limit:",
        "if limit is not None and running_counts(self.session, [model]).get(model, 0) > limit:",
        f"{T_PACING}::test_the_gate_admits_up_to_the_cap_and_not_one_more[sqlite]",
    ),
    m(
        "capacity-prefilter-one-over",
        PACING,
        "        if running.get(model, 0) >= limit\n",
        "        if running.get(model, 0) > limit\n",
        f"{T_PACING}::test_a_capped_model_at_its_cap_hides_no_other_work[sqlite]",
    ),
    m(
        "back-off-doubles-from-the-first-trip",
        PACING,
        "base * 2 ** max(0, trips - 1)",
        "base * 2 ** max(0, trips)",
        f"{T_PACING}::test_the_back_off_starts_at_its_base_and_doubles_up_to_its_ceiling",
    ),
    m(
        "breaker-closed-by-an-older-run",
        PACING,
        "    if gate.opened_at is not None and started_at < gate.opened_at:\n        return\n",
        "",
        f"{T_PACING}::test_a_failed_probe_doubles_the_pause_and_a_burst_counts_once[sqlite]",
    ),
    m(
        "outage-quiet-ignored",
        PACING,
        "if since is not None and (now - since).total_seconds() < quiet:",
        "if since is not None and (now - since).total_seconds() < 0:",
        f"{T_PACING}::test_an_outage_goes_on_until_a_later_run_ends_clean_and_a_new_one_waits_out_the_quiet[sqlite]",
    ),
    # sealing.py: sealed evidence
    m(
        "seal-with-queued-attempts",
        SEALING,
        "Attempt.state != AttemptState.DONE)",
        "Attempt.state == AttemptState.RUNNING)",
        f"{T_SEAL}::test_seal_refuses_unfinished_and_resealing[sqlite]",
    ),
    m(
        "reseal-without-replace",
        SEALING,
        "if sweep.sealed_at is not None and not replace:",
        "if sweep.sealed_at is not None and replace:",
        f"{T_SEAL}::test_seal_refuses_unfinished_and_resealing[sqlite]",
    ),
    m(
        "manifest-digest-unchecked",
        SEALING,
        "if _sha(data) != sweep.seal_sha256:",
        "if sweep.seal_sha256 is None:",
        f"{T_SEAL}::test_missing_added_and_manifest_changes[sqlite]",
    ),
    m(
        "changed-artifact-not-named",
        SEALING,
        "if sealed[n] != current[n])",
        "if sealed[n] != sealed[n])",
        f"{T_SEAL}::test_altered_envelope_is_named[sqlite]",
    ),
    # auth.py: who may act
    m(
        "session-never-expires",
        AUTH,
        "return 0 <= age <= SESSION_SECONDS",
        "return 0 <= age",
        f"{T_DASH}::test_sessions_and_csrf_tokens_are_signed_and_bound",
    ),
    m(
        "session-key-not-from-token",
        AUTH,
        'self._key = hashlib.sha256(b"apg-farm dashboard v1\\0" + self._token).digest()',
        'self._key = hashlib.sha256(b"apg-farm dashboard v1\\0").digest()',
        f"{T_DASH}::test_sessions_and_csrf_tokens_are_signed_and_bound",
    ),
    # workers/engine.py: the judging paths
    m(
        "grader-hash-read-from-wrong-key",
        ENGINE,
        'graded = grade.provenance.get("grader_tree_sha256") if grade else None',
        'graded = grade.provenance.get("grader_tree") if grade else None',
        f"{T_ATTACKS}::test_every_attack_ends_as_catalogued[grader_swap]",
    ),
    m(
        "no-baseline-grade-unless-agent-failed",
        ENGINE,
        "        if needs_baseline_grade(verdict):\n",
        "        if needs_baseline_grade(verdict) and run_verdict.agent_failed:\n",
        f"{T_ATTACKS}::test_every_attack_ends_as_catalogued[game_break_site]",
    ),
    m(
        "killed-run-timed-as-quick",
        ENGINE,
        "self.run_seconds = math.inf if result.timed_out else result.duration",
        "self.run_seconds = result.duration",
        "tests/workers/test_embedded.py::test_a_hung_run_is_killed_and_scored[sqlite]",
    ),
    m(
        "envelope-model-unchecked",
        ENGINE,
        "model=claim.model if (model or run_id) else None,",
        "model=None,",
        f"{T_ENGINE}::test_a_grade_stamped_for_another_model_is_graded_again_live[sqlite-no-dataset]",
    ),
    m(
        "checks-after-run-not-counted",
        ENGINE,
        "verdict = self._seen(after_agent(verdict) if self.agent_started else verdict)",
        "verdict = self._seen(verdict)",
        f"{T_ENGINE}::test_a_verifier_broken_during_the_run_is_counted_against_the_agent[sqlite]",
    ),
    # --- what the strengthened fuzz tests say a reader must return ---------------------------
    m(
        "tokens-lose-detail",
        TOKENS,
        "tokens.append(Token(m.group(1), m.group(2).strip()))",
        "tokens.append(Token(m.group(1), m.group(2).strip()[:40]))",
        f"{T_CONTRACT}::test_random_bytes_never_crash_readers",
    ),
    m(
        "envelope-score-from-wrong-bound",
        ENVELOPE,
        "    passed = score == high\n",
        "    passed = score >= high - 1\n",
        f"{T_ENVELOPE}::test_mutated_envelopes_never_crash",
    ),
    # --- the lifecycle (store/lifecycle.py) and its rules (store/rules.py) --------------------
    m(
        "release-a-removed-bed",
        LIFECYCLE,
        "        if row.state == BedState.REMOVED:\n            raise NotReleasable(",
        "        if False:\n            raise NotReleasable(",
        "tests/store/test_lifecycle.py::test_a_removed_bed_is_not_released[sqlite]",
    ),
    m(
        "retry-a-sealed-sweep",
        LIFECYCLE,
        "        refuse_if_sealed(sweep)\n        if sweep.state == SweepState.CANCELLED:\n"
        '            raise BadInput(f"sweep {sweep.name} was cancelled", fix="submit it under a new name")',
        "        if sweep.state == SweepState.CANCELLED:\n"
        '            raise BadInput(f"sweep {sweep.name} was cancelled", fix="submit it under a new name")',
        "tests/store/test_lifecycle.py::test_a_sealed_sweep_is_not_retried[sqlite-open]",
    ),
    m(
        "cancel-a-sealed-sweep",
        LIFECYCLE,
        "        refuse_if_sealed(sweep)\n        sweep.state = SweepState.CANCELLED",
        "        sweep.state = SweepState.CANCELLED",
        "tests/store/test_lifecycle.py::test_a_sealed_sweep_is_not_cancelled[sqlite]",
    ),
    m(
        "claim-on-a-draining-bed",
        CLAIMS,
        "        if bed.state != BedState.ACTIVE:\n            return Refusal(",
        "        if bed.state not in (BedState.ACTIVE, BedState.DRAINING):\n            return Refusal(",
        "tests/store/test_lifecycle.py::test_a_bed_that_is_not_active_takes_nothing[sqlite-draining]",
    ),
    m(
        "retry-back-to-the-same-bed",
        RULES,
        "    row.excluded_beds = sorted({*(row.excluded_beds or []), bed.id})\n",
        "",
        "tests/workers/test_embedded.py::test_faults_are_contained_and_counts_reconcile[sqlite]",
    ),
    m(
        "last-believed-claim-is-error",
        RETRIES,
        "return Outcome.NO_ATTEMPT if verdict.claim else Outcome.ERROR",
        "return Outcome.ERROR",
        "tests/workers/test_embedded.py::test_start_failures_everywhere_are_scored_after_the_budget[sqlite]",
    ),
    m(
        "drain-a-bed-that-holds-an-attempt",
        RULES,
        "    if bed.state != BedState.DRAINING or holds_attempt(session, bed.id):",
        "    if bed.state != BedState.DRAINING:",
        "tests/beds/test_inventory.py::test_removing_a_busy_bed_drains_it_first[sqlite]",
        equivalent="record_verdict, its only caller, calls it after settle took the attempt off the "
        "bed, and a bed holds one attempt at a time: the check cannot be false there; it stays "
        "as the rule's own precondition for a future caller",
    ),
    m(
        "provider-trouble-counts-against-the-bed",
        RULES,
        "        row.provider_failures += 1\n",
        "        row.provider_failures += 1\n        bed.consecutive_errors += 1\n",
        "tests/store/test_pacing.py::test_an_outage_on_one_bed_never_quarantines_it[sqlite]",
        "tests/store/test_lifecycle.py::test_provider_trouble_leaves_the_beds_failures_in_a_row_alone",
    ),
    # --- the project's other files put back before each run (#28) --------------------------
    m(
        "worktree-any-listing-passes",
        WORKTREE,
        "    if now == baseline:\n        return CONTINUE",
        "    if True:\n        return CONTINUE",
        f"{T_WORKTREE}::test_a_model_of_no_skill_finds_no_answer_at_the_project_root[sqlite]",
    ),
    m(
        "worktree-dirty-baseline-cleaned",
        WORKTREE,
        "    if baseline.entries or baseline.cut or not baseline.repository:",
        "    if baseline.cut or not baseline.repository:",
        f"{T_WORKTREE}::test_a_bed_whose_baseline_lists_files_is_quarantined_when_they_change[sqlite]",
    ),
    m(
        "worktree-untracked-kept",
        WORKTREE_SCRIPT,
        '  g clean -ffdq -- "$@" >&2 || fail "git clean failed"\n',
        "",
        f"{T_WORKTREE}::test_the_clean_up_puts_back_what_reset_leaves_and_nothing_else",
    ),
    m(
        "worktree-cut-listing-trusted",
        WORKTREE,
        "    if after.entries or after.cut:",
        "    if after.entries:",
        f"{T_WORKTREE}::test_a_project_without_git_and_a_long_listing",
        equivalent="the clean-up removes every untracked file whatever the listing's length, so "
        "after it the listing is never cut on a bed the farm can put back; the check stays for a "
        "clean-up that left more than the farm reads",
    ),
    # --- a re-run's kind sealed (#29) ----------------------------------------------------
    m(
        "rerun-kind-unsealed",
        RERUN_SEAL,
        "        if execution.rerun_kind is not None:",
        "        if False:",
        "tests/results/test_seal_fields.py::test_each_sealed_field_changed_is_named[sqlite-executions.rerun_kind=edit]",
    ),
    m(
        "busy-bed-handed-back",
        CLAIMS,
        "            return Refusal(\n                Why.BED_BUSY,",
        "            return Refusal(\n                Why.EXCLUDED,",
        "tests/store/test_lifecycle.py::test_a_bed_holding_a_live_lease_says_so",
    ),
    # --- the farm's secrets out of /proc (#29), as `demo --attacks` plays it -------------------
    m(
        "secrets-left-in-environ",
        SECRET_ENV,
        "        if moved:\n            _reexec_without(moved)",
        "        if moved and False:\n            _reexec_without(moved)",
        f"{T_ATTACKS}::test_every_attack_ends_as_catalogued[read_proc]",
    ),
    # --- an Inspect sample whose model never acted (#29) ----------------------------------------
    m(
        "never-acted-scored",
        ENGINE,
        "        if end.never_acted:\n            return never_acted(end)",
        "        if False:\n            return never_acted(end)",
        REFUSED,
    ),
    m(
        "unanswered-means-acted",
        INSPECT_SANDBOX,
        "    if any(isinstance(e, ToolEvent) for e in events) or any(e.error is None for e in calls):",
        "    if any(isinstance(e, ToolEvent) for e in events) or calls:",
        "tests/inspect/test_inspect_never_acted.py",
        REFUSED,
    ),
    m(
        "answered-means-never-acted",
        INSPECT_SANDBOX,
        "    return False if calls else None",
        "    return False",
        "tests/inspect/test_inspect_never_acted.py",
    ),
    m(
        "scorer-final-outcome",
        INSPECT_SCORER,
        "    counted = headline_outcome(report.outcome, bought)",
        "    counted = headline_outcome(report.outcome, False)",
        "tests/inspect/test_inspect_scorer.py",
    ),
    # --- an install claim on a container bed: checked in a restarted container (#29) -----------
    m(
        "claim-install-unrestarted",
        WORKER_CLAIMS,
        "    if attempt.bed.web_container and attempt.claim.spec.agent == CHECKED_ADAPTER:",
        "    if False:",
        "tests/e2e/test_container_claims.py",
    ),
    m(
        "project-change-refuted",
        WORKER_CLAIMS,
        '    if state == "changed":',
        '    if state == "never":',
        "tests/workers/test_claims.py::test_an_honest_project_change_quarantines_its_bed_and_costs_nothing",
    ),
    m(
        "lost-on-host-is-the-farms",
        CLAIMS,
        "                    LOST_ON_HOST,\n                ),\n                else_=",
        '                    "lease_lost",\n                ),\n                else_=',
        "tests/store/test_store.py::test_a_lease_lost_on_the_workers_host_after_the_agent_started_is_the_agents",
    ),
    # --- the regression gate's family of tests (#30) -------------------------------------------
    m(
        "gate-cells-unadjusted",
        GATE_FAMILY,
        "    adjusted.update(zip(cell_keys, holm(cell_pvalues), strict=True))",
        "    adjusted.update(zip(cell_keys, cell_pvalues, strict=True))",
        "tests/results/test_gate_calibration.py::test_an_unchanged_candidate_fails_at_most_five_percent[50-5]",
    ),
    m(
        "gate-models-unadjusted",
        GATE_FAMILY,
        "    adjusted = dict(zip(keys, holm(pvalues), strict=True))",
        "    adjusted = dict(zip(keys, pvalues, strict=True))",
        "tests/results/test_gate_calibration.py::test_the_models_share_their_error_by_holm",
    ),
    m(
        "pair-over-tasks-one-side-ran",
        "apg_farm/results/comparison.py",
        '        mine = [c for c in ran if c["a"]["n"] and c["b"]["n"]]',
        "        mine = ran",
        "tests/results/test_regression.py::test_every_figure_of_a_pair_is_over_one_task_set",
    ),
    m(
        "clustered-df-g-minus-one",
        "apg_farm/results/clustered.py",
        "    return trace * trace / square if square > 0 else float(max(count - 1, 1))",
        "    return float(max(count - 1, 1))",
        "tests/results/test_clustered.py::test_the_difference_of_two_samples_is_cr3_of_the_contrast",
    ),
    m(
        "exclusions-not-tallied",
        "apg_farm/results/second_chance.py",
        '            found["excluded"] += int(started)',
        '            found["excluded"] += 0',
        "tests/results/test_exclusions.py::test_the_bound_counts_what_was_excluded_after_the_start",
    ),
    m(
        "exclusions-never-warn",
        "apg_farm/results/exclusions.py",
        "    if p < WARN_P:",
        "    if p < 0:",
        "tests/results/test_exclusions.py::test_compare_bounds_each_side_and_warns_when_they_differ",
    ),
    m(
        "harness-sweep-any-owner",
        "apg_farm/store/lifecycle.py",
        "        if owner is not None and held_by is not None and held_by != owner:",
        "        if owner is not None and held_by is not None and held_by == owner + '?':",
        "tests/store/test_harness_sweeps.py::test_two_inspect_tasks_over_the_same_ids_are_two_sweeps_each_counted_once",
    ),
    m(
        "inspect-usage-unguarded",
        "apg_farm/inspect/sandbox.py",
        '        _private_api_failed("sample_model_usage", error)\n',
        "        raise\n",
        "tests/inspect/test_inspect_private_api.py::test_usage_and_answer_unreadable_are_said_not_raised",
    ),
)


@dataclass
class Result:
    mutant: Mutant
    status: str  # killed, survived, timeout, error
    seconds: float
    detail: str = ""
    tail: list[str] = field(default_factory=list)


class Interrupted(Exception):
    pass


def _on_signal(signum: int, _frame: FrameType | None) -> None:
    # Raised inside whatever runs now, so the `finally` that restores the file still runs.
    raise Interrupted(f"signal {signum}")


@contextmanager
def planted(mutant: Mutant) -> Iterator[None]:
    """The mutant in its file for the duration; the original bytes back afterwards, whatever."""
    path = ROOT / mutant.file
    original = path.read_bytes()
    stamp = path.stat()
    text = original.decode("utf-8")
    count = text.count(mutant.old)
    if count != 1:
        raise ValueError(f"{mutant.name}: the snippet occurs {count} times in {mutant.file}")
    try:
        path.write_bytes(text.replace(mutant.old, mutant.new, 1).encode("utf-8"))
        # A .pyc is trusted on the source's mtime (whole seconds) and size: give the mutant an
        # mtime of its own, so the original's cached bytecode is never run in its place.
        os.utime(path, ns=(stamp.st_atime_ns, stamp.st_mtime_ns - 7_000_000_000))
        yield
    finally:
        path.write_bytes(original)
        # Back to the original's mtime too: its cached bytecode stays valid.
        os.utime(path, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))


def _pytest(tests: tuple[str, ...], timeout: float) -> tuple[int | None, list[str]]:
    # No bytecode written while a mutant is planted: nothing of it outlives its run.
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    argv = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests]
    try:
        done = subprocess.run(
            argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return None, []
    lines = (done.stdout + done.stderr).strip().splitlines()
    return done.returncode, lines[-6:]


def run_mutant(mutant: Mutant, timeout: float) -> Result:
    started = time.monotonic()
    with planted(mutant):
        rc, tail = _pytest(mutant.tests, timeout)
    seconds = time.monotonic() - started
    if rc is None:
        return Result(mutant, "timeout", seconds, f"tests ran longer than {timeout:g} s")
    if rc == 0:
        skipped = any("skipped" in line for line in tail)
        return Result(mutant, "survived", seconds, "tests skipped" if skipped else "", tail)
    if rc == 1:
        return Result(mutant, "killed", seconds, "", tail)
    # 2: interrupted, 3: internal error, 4: usage error, 5: no tests collected.
    return Result(mutant, "error", seconds, f"pytest exit {rc}", tail)


def check_all(mutants: tuple[Mutant, ...]) -> list[str]:
    problems = []
    for mutant in mutants:
        text = (ROOT / mutant.file).read_text("utf-8")
        if text.count(mutant.old) != 1:
            problems.append(f"{mutant.name}: snippet occurs {text.count(mutant.old)} times")
        if not mutant.tests:
            problems.append(f"{mutant.name}: no tests")
    names = [mutant.name for mutant in mutants]
    problems += [
        f"{name}: name used twice" for name in sorted({n for n in names if names.count(n) > 1})
    ]
    return problems


def summary(results: list[Result]) -> list[str]:
    modules: dict[str, list[Result]] = {}
    for result in results:
        modules.setdefault(result.mutant.file, []).append(result)
    lines = [
        "| module | mutants | killed | survived | equivalent | score |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    totals = [0, 0, 0, 0]
    for module in sorted(modules):
        rows = modules[module]
        killed = sum(r.status in ("killed", "timeout") for r in rows)
        equivalent = sum(r.status == "survived" and r.mutant.equivalent is not None for r in rows)
        survived = sum(r.status != "killed" and r.status != "timeout" for r in rows) - equivalent
        counted = len(rows) - equivalent
        score = f"{100 * killed / counted:.0f} %" if counted else "-"
        lines.append(
            f"| `{module}` | {len(rows)} | {killed} | {survived} | {equivalent} | {score} |"
        )
        for i, value in enumerate((len(rows), killed, survived, equivalent)):
            totals[i] += value
    counted = totals[0] - totals[3]
    score = f"{100 * totals[1] / counted:.0f} %" if counted else "-"
    lines.append(f"| **all** | {totals[0]} | {totals[1]} | {totals[2]} | {totals[3]} | {score} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--list", action="store_true", help="list the mutants and run nothing")
    parser.add_argument("--only", default="", help="comma-separated mutant names")
    parser.add_argument("--module", default="", help="only the mutants of this file")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per mutant's tests")
    parser.add_argument("--baseline", action="store_true", help="first run every test unmutated")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)

    chosen = MUTANTS
    if args.only:
        wanted = {name.strip() for name in args.only.split(",") if name.strip()}
        unknown = wanted - {mutant.name for mutant in MUTANTS}
        if unknown:
            parser.error(f"unknown mutants: {', '.join(sorted(unknown))}")
        chosen = tuple(mutant for mutant in chosen if mutant.name in wanted)
    if args.module:
        chosen = tuple(mutant for mutant in chosen if mutant.file == args.module)
    problems = check_all(chosen)
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 2
    if args.list:
        for mutant in chosen:
            note = f"  (equivalent: {mutant.equivalent})" if mutant.equivalent else ""
            print(f"{mutant.name}  {mutant.file}{note}")
            for test in mutant.tests:
                print(f"    {test}")
        return 0

    signal.signal(signal.SIGTERM, _on_signal)
    if args.baseline:
        tests = tuple(dict.fromkeys(t for mutant in chosen for t in mutant.tests))
        print(f"baseline: {len(tests)} tests unmutated ...", file=sys.stderr, flush=True)
        rc, tail = _pytest(tests, args.timeout * 4)
        if rc != 0:
            print("\n".join(["baseline failed: fix the suite first", *tail]), file=sys.stderr)
            return 2
    results: list[Result] = []
    try:
        for index, mutant in enumerate(chosen, 1):
            result = run_mutant(mutant, args.timeout)
            results.append(result)
            extra = f"  {result.detail}" if result.detail else ""
            print(
                f"[{index}/{len(chosen)}] {result.status:8} {result.seconds:6.1f} s  "
                f"{mutant.name} ({mutant.file}){extra}",
                file=sys.stderr,
                flush=True,
            )
            if result.status in ("survived", "error"):
                for line in result.tail:
                    print(f"        {line}", file=sys.stderr)
    except (KeyboardInterrupt, Interrupted):
        print("interrupted: the file being mutated was restored", file=sys.stderr)
        return 130
    print("\n".join(summary(results)))
    survivors = [r for r in results if r.status in ("survived", "error")]
    for result in survivors:
        why = f": equivalent, {result.mutant.equivalent}" if result.mutant.equivalent else ""
        print(f"- {result.status}: `{result.mutant.name}` ({result.mutant.file}){why}")
    if args.json:
        args.json.write_text(
            json.dumps(
                [
                    {
                        "name": r.mutant.name,
                        "file": r.mutant.file,
                        "status": r.status,
                        "seconds": round(r.seconds, 1),
                        "tests": list(r.mutant.tests),
                        "equivalent": r.mutant.equivalent,
                    }
                    for r in results
                ],
                indent=2,
            )
            + "\n"
        )
    return 1 if any(r.mutant.equivalent is None for r in survivors) else 0


if __name__ == "__main__":
    sys.exit(main())
