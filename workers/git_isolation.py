"""Before each run: the bed's git repository holds only its baseline (issue #28, DESIGN 12).

The engine calls `clean_git` after the reset and the checks that follow it, before the agent. One
phase (`git_clean`) runs the clean-up of apg_farm/beds/git_baseline.py on the bed's host through
the bed's transport, bounded by a timeout, and its output (what it removed) is the phase's record.

A bed enrolled before the farm recorded git baselines has none in bed.meta: its baseline is read
on its first reset here (phase `git_record`), before any agent runs in this attempt, and kept. The
doubt, written into the bed event: an agent of an earlier farm version may already have left
something in `.git`, which that first record then takes for the baseline. Re-escrow such a bed
(`apg-farm bed escrow NAME`) on a trusted tree to record it anew.

A clean-up that fails is an infrastructure failure before the agent: a retry on another bed, this
bed quarantined with the reason, never charged to a model.
"""

from __future__ import annotations

from typing import Protocol

from apg_farm.beds import (
    GIT_BASELINE,
    GIT_TIMEOUT,
    GitBaseline,
    git_clean_argv,
    git_clean_failure,
    git_record_argv,
    parse_git_record,
)
from apg_farm.contract import CONTINUE, PhaseOutput, Verdict
from apg_farm.store import Store
from apg_farm.transports import CommandResult
from apg_farm.workers.baseline_records import bed_failed, recorded, remember

#: Stdout of the clean-up kept (one line per thing it removed).
CLEAN_OUTPUT_LIMIT = 256 * 1024
RECORD_OUTPUT_LIMIT = 1 << 20


class Phases(Protocol):
    """The engine's attempt, as far as this step needs it: a recorded phase on the bed's host."""

    def _phase_result(
        self, name: str, argv: tuple[str, ...], timeout: float, *, stdout_limit: int = ...
    ) -> tuple[PhaseOutput, CommandResult]: ...


def clean_git(attempt: Phases, store: Store, bed_id: int, approot: str) -> Verdict:
    """Put the bed's `.git` back to its recorded baseline and check it; CONTINUE when it holds
    only the baseline, else a retry with the bed quarantined."""
    baseline = _recorded(store, bed_id)
    if baseline is None:
        output, result = attempt._phase_result(
            "git_record", git_record_argv(approot), GIT_TIMEOUT, stdout_limit=RECORD_OUTPUT_LIMIT
        )
        found = parse_git_record(result)
        if isinstance(found, str):
            return bed_failed(f"the bed's git baseline could not be recorded: {found}")
        _remember(store, bed_id, found)
        baseline = found
    output, result = attempt._phase_result(
        "git_clean",
        git_clean_argv(approot, baseline),
        GIT_TIMEOUT,
        stdout_limit=CLEAN_OUTPUT_LIMIT,
    )
    if result.transport_error or result.timed_out:
        # The link failed (or git hung): nothing is known of the repository; still infrastructure.
        why = result.transport_error or f"timed out after {GIT_TIMEOUT:.0f} s"
        return bed_failed(f"the git clean-up did not finish: {why}")
    if output.exit_code != 0 or result.stdout.truncated:
        why = git_clean_failure(result.stdout.text()) or f"exit {output.exit_code}"
        return bed_failed(f"the git repository could not be put back to its baseline: {why}")
    return CONTINUE


def _recorded(store: Store, bed_id: int) -> GitBaseline | None:
    return GitBaseline.from_meta(recorded(store, bed_id, GIT_BASELINE))


def _remember(store: Store, bed_id: int, baseline: GitBaseline) -> None:
    """Keep a baseline first read at a reset (a bed enrolled before git baselines were)."""
    remember(
        store,
        bed_id,
        GIT_BASELINE,
        baseline.as_meta(),
        "git_baseline",
        f"{baseline.label()}: recorded at a reset, not at enrolment (the bed was enrolled before "
        "the farm recorded git baselines); what an earlier agent left in .git before now is "
        "taken for the baseline: escrow the bed again on a trusted tree to record it anew",
    )


__all__ = ["clean_git"]
