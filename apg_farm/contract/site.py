"""The diff as evidence: whether a verified bed's site is at baseline, read only in full.

`ai-eval-diff` on a bed the trusted verifier just passed is evidence the agent cannot write: the
farm ran it, on judging code the verifier checked. It shows a site unchanged only when it was
read whole: a report cut at the farm's limit, one that is not a JSON object, a `changed` that is
not `false`, or a partial report (`APG_DIFF_ERROR`: Drupal did not boot; `APG_DIFF_UNRECORDED`:
no record to compare modules, themes and config with) is a site that changed, never "unknown".
An agent that floods the site until the report no longer fits has changed it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from apg_farm.errors import FarmError

if TYPE_CHECKING:
    from apg_farm.contract.output import PhaseOutput

#: Tokens that make a diff report partial: what it does not cover may have changed.
PARTIAL = ("APG_DIFF_ERROR", "APG_DIFF_UNRECORDED")
#: Change lists named in the evidence, at most this many entries each.
_SHOWN = 5


@dataclass(frozen=True)
class SiteState:
    """What the diff on a verified bed shows."""

    #: True only when the report was read in full and says nothing changed.
    unchanged: bool
    #: Why, in words, for reasons and quarantines.
    evidence: str


def site_state(output: PhaseOutput, stdout: bytes, *, truncated: bool) -> SiteState:
    """Read the diff phase's result by the rule above."""
    from apg_farm.contract.reports import parse_json_report

    if output.exit_code != 0:
        return SiteState(False, f"the diff did not run (exit {output.exit_code})")
    if truncated:
        return SiteState(False, "the diff report is larger than the farm reads: the site changed")
    partial = [name for name in PARTIAL if output.has(name)]
    if partial:
        return SiteState(False, f"the diff report is partial ({', '.join(partial)})")
    try:
        report = parse_json_report(stdout, what="diff")
    except (FarmError, RecursionError):
        return SiteState(False, "the diff printed no JSON report")
    changed = report.get("changed")
    if changed is False:
        return SiteState(True, "the diff, read in full, reports no change")
    if changed is not True:
        return SiteState(False, f"the diff report's `changed` is {changed!r}, not a boolean")
    return SiteState(False, f"the site changed: {_summary(report)}")


def _summary(report: dict[str, object]) -> str:
    """The first few changes the report lists, as `section: item, item`."""
    parts: list[str] = []
    for section, value in report.items():
        items = list(_items(value))
        if section == "changed" or not items:
            continue
        shown = ", ".join(items[:_SHOWN]) + (
            f" (+{len(items) - _SHOWN})" if len(items) > _SHOWN else ""
        )
        parts.append(f"{section}: {shown}")
        if len(parts) == 3:
            break
    return "; ".join(parts) or "changed: true"


def _items(value: object) -> list[str]:
    if isinstance(value, dict):
        return [f"{key} {item}" for key, inner in value.items() for item in _items(inner)] or []
    if isinstance(value, list):
        return [str(item)[:120] for item in value]
    return []
