"""Before each run: the project's other files hold only their baseline (issue #28).

After the reset and the git clean-up (which rebuilt the index from the baseline's HEAD), the
engine calls `clean_worktree`: one command on the bed's host lists, with `git status`, the
project's files outside what reset and the farm's other steps look after (apg_farm/beds/worktree.py)
that differ from the index or that git does not track and does not ignore, and compares the
listing with the one recorded with the bed's baseline.

- The same listing: nothing of an earlier attempt is there; the attempt goes on.
- A baseline that listed nothing (a clean tree) and a listing now: an earlier agent's files (an
  answer at the project root, a tracked file edited outside the scope, a CLAUDE.md). They are put
  back (`git checkout`, `git clean`) and the listing taken again, which must be empty; their names
  go into a `leftover` bed event. Never a retry nor a quarantine: the bed is its baseline again.
- A baseline that listed files, and another listing now: the farm keeps no copy to restore them,
  so the attempt is retried on another bed and this bed quarantined (escrow it on a clean tree).

A listing that cannot be taken (a link that failed, git failing) is the bed's failure, as for the
git clean-up. A bed enrolled before the farm recorded this listing has it taken at its first reset
and kept, with a bed event stating the doubt.
"""

from __future__ import annotations

from typing import Protocol

from apg_farm.beds import (
    WORKTREE,
    WORKTREE_STDOUT_LIMIT,
    WORKTREE_TIMEOUT,
    Worktree,
    parse_worktree,
    record_event,
    worktree_argv,
)
from apg_farm.contract import CONTINUE, PhaseOutput, Verdict
from apg_farm.store import Store
from apg_farm.transports import CommandResult
from apg_farm.workers.baseline_records import bed_failed, recorded, remember


class Phases(Protocol):
    """The engine's attempt, as far as this step needs it: a recorded phase on the bed's host."""

    def _phase_result(
        self, name: str, argv: tuple[str, ...], timeout: float, *, stdout_limit: int = ...
    ) -> tuple[PhaseOutput, CommandResult]: ...


def clean_worktree(attempt: Phases, store: Store, bed_id: int, approot: str, label: str) -> Verdict:
    """Put the project's other files back to the baseline's; CONTINUE when the next agent finds
    only the baseline there, else a retry with the bed quarantined. `label` names the attempt
    in the bed event."""
    now = _list(attempt, approot, "worktree_check", "list")
    if isinstance(now, str):
        return bed_failed(f"the project's files could not be listed: {now}")
    baseline = Worktree.from_meta(recorded(store, bed_id, WORKTREE))
    if baseline is None:
        remember(
            store,
            bed_id,
            WORKTREE,
            now.as_meta(),
            "worktree_baseline",
            f"{now.label()}: recorded at a reset, not at enrolment (the bed was enrolled before "
            "the farm listed the project's other files); what an earlier agent left there "
            "before now is taken for the baseline: escrow the bed again on a clean tree",
        )
        return CONTINUE
    if now == baseline:
        return CONTINUE
    if baseline.entries or baseline.cut or not baseline.repository:
        return bed_failed(
            f"the project's files differ from its baseline ({now.label()}; the baseline: "
            f"{baseline.label()}), and the farm keeps no copy to put them back: escrow the bed "
            "again on a clean tree"
        )
    after = _list(attempt, approot, "worktree_clean", "clean")
    detail = f"{now.label()} after the reset before {label}: put back (git checkout, git clean)"
    store.retrying(lambda: record_event(store, bed_id, "leftover", detail))
    if isinstance(after, str):
        return bed_failed(f"the project's files could not be put back: {after}")
    if after.entries or after.cut:
        return bed_failed(f"the project's files could not be put back: {after.label()}")
    return CONTINUE


def _list(attempt: Phases, approot: str, phase: str, mode: str) -> Worktree | str:
    _, result = attempt._phase_result(
        phase,
        worktree_argv(approot, mode),
        WORKTREE_TIMEOUT,
        stdout_limit=WORKTREE_STDOUT_LIMIT,
    )
    return parse_worktree(result)


__all__ = ["clean_worktree"]
