"""The bed contract: what a bed is asked and what its answers mean.

`argv` builds each `ddev ai-eval-*` argv (every argument checked); what a bed prints is read by
`tokens` (`APG_*` lines, DDEV's failure line), `output` (one command's real exit code and
diagnostics), `runs` (which run folder is the attempt's), `records` (run.json), `reports` (doctor
and diff JSON, the escrow path), `site` (the diff as evidence), `usage` (the adapter's record),
`envelope` (the every_eval_ever grade) and `provenance` (the bounded strings reports tally from an
envelope); `pins` judges an envelope's dataset and task hashes against the ones pinned at
baseline; `outcomes` is the outcome policy; `retries` the retry policy (every retry, wait,
hand-back, drop and quarantine decision, its numbers in one `RetryPolicy`); `claims` believes
a run's claim only when a check of the farm's reproduces it; `rerun_kinds` names why a re-run was run again, stored when it
ends; `bedenv` is the environment a bed command gets. Used as `contract.run(...)`.
Imports only transports.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from apg_farm.lazy_exports import lazy_exports

# The names, imported when first used (lazy_exports.py): a read command that needs `Outcome`
# loads the outcome policy, not the transports, the envelope schema or the run readers.
if TYPE_CHECKING:
    from apg_farm.contract.argv import (
        SAFE_ARG,
        check_arg,
        claude_check,
        diff,
        doctor,
        escrow,
        grade,
        provision,
        reset,
        restart,
        run,
        trusted_verify,
        verify,
        web_exec,
    )
    from apg_farm.contract.bedenv import (
        ALLOWED_BASE_NAMES,
        ATTEMPT_VARIABLE,
        FORCED,
        bed_environment,
        is_credential_shaped,
        is_farm_setting,
    )
    from apg_farm.contract.claims import (
        BED_CONFIGURATION,
        CLAIM_CHECKS,
        Check,
        Finding,
        Reproduced,
        checks_for,
        judge_reproduction,
    )
    from apg_farm.contract.envelope import (
        MAX_ENVELOPE_BYTES,
        SCHEMA_VERSION,
        EnvelopeError,
        Grade,
        model_matches,
        read_grade,
        schema_validator,
    )
    from apg_farm.contract.outcomes import (
        CONTINUE,
        COUNTED,
        DDEV_FOLDER_MISSING,
        ESCROW_SET_MISSING,
        GRADED,
        TOKENS,
        UNESCROWED,
        UNFINGERPRINTED,
        Outcome,
        Verdict,
        judge_at_baseline,
        judge_claim,
        judge_ddev_check,
        judge_escrow_check,
        judge_grade,
        judge_graded_at_baseline,
        judge_reset,
        judge_run,
        judge_verify_after,
        judge_verify_before,
        needs_baseline_grade,
        with_quarantine,
        with_unchecked,
    )
    from apg_farm.contract.output import (
        PhaseOutput,
        read_output,
    )
    from apg_farm.contract.pins import (
        PINNED_FIELDS,
        DatasetRead,
        judge_pinned,
        pin_problem,
        read_of,
        skipped_read,
    )
    from apg_farm.contract.provenance import (
        FINGERPRINTS,
        MAX_PROVENANCE_VALUE,
        PROVENANCE_FIELDS,
        PROVENANCE_LIBRARY,
        envelope_provenance,
    )
    from apg_farm.contract.records import (
        RunRecord,
        run_record,
    )
    from apg_farm.contract.reports import (
        parse_escrow_path,
        parse_json_report,
    )
    from apg_farm.contract.rerun_kinds import (
        FARM_KINDS,
        KINDS,
        LOST_ON_HOST,
        SECOND_CHANCE_KINDS,
        TEXT_RULES,
        headline_outcome,
        kind_of_text,
        lost_kind,
        rerun_kind_of,
        stored_kind,
    )
    from apg_farm.contract.retries import (
        DEFAULT_POLICY,
        RetryPolicy,
        Tries,
        Why,
        after_agent,
        counts_against_bed,
        farm_error,
        into_sweep,
        out_of_retries,
    )
    from apg_farm.contract.runs import (
        RunIdDiscovery,
        discover_run_id,
        printed_run_ids,
    )
    from apg_farm.contract.site import SiteState, site_state
    from apg_farm.contract.tokens import (
        DdevFailure,
        Token,
        parse_ddev_failure,
        parse_tokens,
        strip_ansi,
    )
    from apg_farm.contract.usage import USAGE_FILES, USAGE_LIMIT, Usage, read_usage

__all__ = [
    "ALLOWED_BASE_NAMES",
    "ATTEMPT_VARIABLE",
    "BED_CONFIGURATION",
    "CLAIM_CHECKS",
    "CONTINUE",
    "COUNTED",
    "DDEV_FOLDER_MISSING",
    "DEFAULT_POLICY",
    "ESCROW_SET_MISSING",
    "FARM_KINDS",
    "FINGERPRINTS",
    "FORCED",
    "GRADED",
    "KINDS",
    "LOST_ON_HOST",
    "MAX_ENVELOPE_BYTES",
    "MAX_PROVENANCE_VALUE",
    "PINNED_FIELDS",
    "PROVENANCE_FIELDS",
    "PROVENANCE_LIBRARY",
    "SAFE_ARG",
    "SCHEMA_VERSION",
    "SECOND_CHANCE_KINDS",
    "TEXT_RULES",
    "TOKENS",
    "UNESCROWED",
    "UNFINGERPRINTED",
    "USAGE_FILES",
    "USAGE_LIMIT",
    "Check",
    "DatasetRead",
    "DdevFailure",
    "EnvelopeError",
    "Finding",
    "Grade",
    "Outcome",
    "PhaseOutput",
    "Reproduced",
    "RetryPolicy",
    "RunIdDiscovery",
    "RunRecord",
    "SiteState",
    "Token",
    "Tries",
    "Usage",
    "Verdict",
    "Why",
    "after_agent",
    "bed_environment",
    "check_arg",
    "checks_for",
    "claude_check",
    "counts_against_bed",
    "diff",
    "discover_run_id",
    "doctor",
    "envelope_provenance",
    "escrow",
    "farm_error",
    "grade",
    "headline_outcome",
    "into_sweep",
    "is_credential_shaped",
    "is_farm_setting",
    "judge_at_baseline",
    "judge_claim",
    "judge_ddev_check",
    "judge_escrow_check",
    "judge_grade",
    "judge_graded_at_baseline",
    "judge_pinned",
    "judge_reproduction",
    "judge_reset",
    "judge_run",
    "judge_verify_after",
    "judge_verify_before",
    "kind_of_text",
    "lost_kind",
    "model_matches",
    "needs_baseline_grade",
    "out_of_retries",
    "parse_ddev_failure",
    "parse_escrow_path",
    "parse_json_report",
    "parse_tokens",
    "pin_problem",
    "printed_run_ids",
    "provision",
    "read_grade",
    "read_of",
    "read_output",
    "read_usage",
    "rerun_kind_of",
    "reset",
    "restart",
    "run",
    "run_record",
    "schema_validator",
    "site_state",
    "skipped_read",
    "stored_kind",
    "strip_ansi",
    "trusted_verify",
    "verify",
    "web_exec",
    "with_quarantine",
    "with_unchecked",
]

__getattr__ = lazy_exports(__name__, __file__)
