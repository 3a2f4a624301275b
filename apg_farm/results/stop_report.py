"""A sweep's question (`stop:`) in its reports: whether it stopped, why, after how many pairs, and
the anytime-valid figures (e-value, anytime p, confidence sequence) beside the fixed-n ones.

The figures are the ones the lifecycle recorded in `sweeps.meta["stop"]` when it looked at the
pairs (store/stopping.py): the test's record, not recomputed. When the sweep stopped early, the
fixed-n figures of the compared pair (exact McNemar p, Newcombe, Wilson and task-clustered
intervals) are
marked as not valid under optional stopping: the sweep's size was chosen by its data.
"""

from __future__ import annotations

from html import escape
from typing import Any

from apg_farm.store import STOP, Sweep

#: What a report says of the fixed-n figures of a sweep that stopped early.
NOT_VALID = (
    "fixed-n figures (McNemar p, Newcombe, Wilson and task-clustered intervals) are not valid "
    "under optional stopping: the sweep stopped because of its data; read the anytime-valid "
    "figures"
)

_KINDS = {
    "decided": "decided",
    "futile": "futile (the difference is within the futility margin)",
    "cap": "undecided, cap of pairs reached",
}


def stop_summary(sweep: Sweep) -> dict[str, Any] | None:
    """The sweep's question and its state, JSON-ready; None for a sweep without `stop:`."""
    declared = (sweep.spec or {}).get("stop")
    if not isinstance(declared, dict):
        return None
    state = (sweep.meta or {}).get(STOP) or {}
    decision = state.get("decision")
    stopped = isinstance(decision, dict)
    return {
        **declared,
        "stopped": stopped,
        "decision": decision if stopped else None,
        "latest": state.get("look"),
        "fixed_n_valid": not stopped,
        "note": NOT_VALID if stopped else None,
    }


def add_stop(report: dict[str, Any], sweep: Sweep) -> None:
    """Add `stop` to a report and, on the compared pair's comparison row, its anytime-valid
    figures and whether its fixed-n ones still hold."""
    summary = stop_summary(sweep)
    if summary is None:
        return
    report["stop"] = summary
    first, second = summary["compare"]
    figures = summary["decision"] or summary["latest"] or {}
    for row in report.get("comparisons", []):
        if {row.get("model_a"), row.get("model_b")} != {first, second}:
            continue
        # The test's difference is first - second; a row in the other order reads it negated.
        sign = 1 if row.get("model_a") == first else -1
        low, high = figures.get("cs_low"), figures.get("cs_high")
        row["anytime"] = {
            "e_value": figures.get("e_value"),
            "p_anytime": figures.get("p_anytime"),
            "pairs": figures.get("pairs"),
            "cs_low": None if low is None or high is None else min(sign * low, sign * high),
            "cs_high": None if low is None or high is None else max(sign * low, sign * high),
        }
        row["fixed_n_valid"] = summary["fixed_n_valid"]


def stop_lines(report: dict[str, Any]) -> list[str]:
    """The text report's lines about the sweep's question (none without `stop:`)."""
    summary = report.get("stop")
    if not summary:
        return []
    first, second = summary["compare"]
    head = f"stop: {first} vs {second}, alpha {summary['alpha']:g}"
    decision = summary["decision"]
    if decision:
        lines = [
            f"{head}: STOPPED, {_KINDS.get(decision['kind'], decision['kind'])} after "
            f"{decision['pairs']} pairs; {decision.get('cancelled', 0)} queued attempts cancelled",
            f"  reason: {decision['reason']}",
            f"  anytime-valid: {_figures(decision)}",
            f"  {NOT_VALID}",
        ]
        return lines
    latest = summary["latest"]
    if not latest:
        return [f"{head}: running, no pair complete yet"]
    return [
        f"{head}: not stopped ({latest['pairs']} pairs so far)",
        f"  anytime-valid: {_figures(latest)}",
    ]


def _figures(figures: dict[str, Any]) -> str:
    return (
        f"e-value {figures['e_value']:.3g}, anytime p {figures['p_anytime']:.3g}, "
        f"difference {_pts(figures.get('difference'))} pts, confidence sequence "
        f"{_pts(figures['cs_low'])} to {_pts(figures['cs_high'])} pts "
        f"({figures['a_wins']} / {figures['b_wins']} discordant)"
    )


def _pts(value: float | None) -> str:
    return "—" if value is None else f"{value * 100:+.1f}"


def stop_section(report: dict[str, Any]) -> str:
    """The HTML report's (and the dashboard's) paragraph about the sweep's question."""
    lines = stop_lines(report)
    if not lines:
        return ""
    head, *rest = lines
    stopped = bool(report["stop"]["stopped"])
    items = "".join(f"<li>{escape(line.strip())}</li>" for line in rest)
    css = ' class="warn"' if stopped else ""
    return f'<h2>Stopping rule</h2><p id="stop"{css}>{escape(head)}</p><ul>{items}</ul>'
