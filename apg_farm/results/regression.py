"""The regression gate behind `apg-farm check`: a baseline, a candidate, a policy, a verdict.

The candidate fails when its evidence does not verify, when it is unfinished, when it has more
INVALID or ERROR attempts than allowed, when a (task, model) of the baseline was not evaluated,
when a model's pass rate (pooled over the tasks both ran) drops by more than the tolerance, when
one (task, model) drops by more than the tolerance with a 95 % interval that excludes no change,
or when an indispensable task newly fails. Changed fingerprints are warnings: comparing across
revisions is often the point.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from apg_farm.results.comparison import Side, compare

#: Rates are compared with this slack so 0.05 means 5 points, not 5 points plus float noise.
_EPS = 1e-9


@dataclass(frozen=True)
class CheckPolicy:
    """What the candidate is allowed."""

    #: Largest allowed drop of a pass rate, as a proportion (0.05 = 5 percentage points).
    max_rate_drop: float = 0.05
    #: Most INVALID attempts the candidate may have.
    max_invalid: int = 0
    #: Most ERROR attempts the candidate may have.
    max_error: int = 0
    #: Count a model-level drop only when its 95 % interval excludes zero.
    significant_only: bool = False


@dataclass
class CheckVerdict:
    """The check's findings; it passes when there is no failure."""

    failures: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    comparison: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.failures


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value:.0%}"


def _pts(value: float) -> str:
    return f"{value * 100:+.1f} pts"


def _gate_holds(cell: dict[str, Any] | None, floor: float) -> bool:
    return bool(cell and cell["n"] and cell["passed"] / cell["n"] >= floor - _EPS)


def check_regression(
    base: Side,
    candidate: Side,
    policy: CheckPolicy,
    *,
    indispensable: dict[str, float] | None = None,
) -> CheckVerdict:
    """Apply the policy; every finding names the model, task or artifact concerned."""
    verdict = CheckVerdict()
    fail, warn = verdict.failures.append, verdict.warnings.append
    for side in (base, candidate):
        for problem in side.problems:
            fail(f"evidence does not verify: {problem}")
    b, c = base.summary, candidate.summary
    result = compare(b, c)
    verdict.comparison = result

    cand_cells = {(x["task"], x["model"]): x for x in c["cells"]}
    pending = sum(x.get("pending", 0) for x in c["cells"])
    if pending:
        fail(f"candidate is unfinished: {pending} attempts queued or running")
    for kind, allowed in (("invalid", policy.max_invalid), ("error", policy.max_error)):
        total = sum(x.get(kind, 0) for x in c["cells"])
        if total > allowed:
            where = ", ".join(
                f"{x['task']} {x['model']}: {x[kind]}" for x in c["cells"] if x.get(kind)
            )
            fail(f"candidate has {total} {kind.upper()} attempts (allowed {allowed}): {where}")
    cancelled = sum(x.get("cancelled", 0) for x in c["cells"])
    if cancelled:
        warn(f"candidate has {cancelled} CANCELLED attempts")

    for cell in b["cells"]:
        if not cell["n"]:
            continue
        other = cand_cells.get((cell["task"], cell["model"]))
        if other is None:
            fail(f"{cell['task']} {cell['model']}: in the baseline, not in the candidate")
        elif not other["n"]:
            fail(
                f"{cell['task']} {cell['model']}: no counted attempt in the candidate "
                f"(invalid {other['invalid']}, error {other['error']}, skipped {other['skipped']})"
            )

    tolerance = policy.max_rate_drop
    for row in result["models"]:
        drop = row["diff"]
        if drop is None or -drop <= tolerance + _EPS:
            continue
        text = (
            f"model {row['model']}: pass rate {_pct(row['a']['rate'])} (n={row['a']['n']}) -> "
            f"{_pct(row['b']['rate'])} (n={row['b']['n']}), {_pts(drop)} "
            f"(95% CI {_pts(row['diff_low'])} to {_pts(row['diff_high'])}), "
            f"tolerance {tolerance * 100:.1f} pts"
        )
        if policy.significant_only and row["diff_high"] >= 0:
            warn(text + "; not significant, not counted (--significant-only)")
        else:
            fail(text)
    for row in result["cells"]:
        drop = row["diff"]
        if drop is None or -drop <= tolerance + _EPS:
            continue
        text = (
            f"{row['task']} {row['model']}: pass rate {_pct(row['a']['rate'])} "
            f"(n={row['a']['n']}) -> {_pct(row['b']['rate'])} (n={row['b']['n']}), "
            f"{_pts(drop)} (95% CI {_pts(row['diff_low'])} to {_pts(row['diff_high'])})"
        )
        if row["diff_high"] < 0:
            fail(text)
        else:
            warn(text + "; within noise at this sample size")

    gates = {**b.get("indispensable", {}), **(indispensable or {})}
    base_cells = {(x["task"], x["model"]): x for x in b["cells"]}
    models = list(dict.fromkeys(x["model"] for x in b["cells"]))
    for task, floor in sorted(gates.items()):
        for model in models:
            held_before = _gate_holds(base_cells.get((task, model)), floor)
            now = cand_cells.get((task, model))
            if _gate_holds(now, floor):
                continue
            rate = f"{_pct(now['passed'] / now['n'])} of {now['n']}" if now and now["n"] else "none"
            if held_before:
                fail(
                    f"indispensable task {task} newly fails for {model}: pass rate {rate}, "
                    f"needs {_pct(floor)}"
                )
            else:
                warn(f"indispensable task {task} already failed for {model} in the baseline")

    for change in result["provenance_changes"]:
        warn(f"provenance changed: {change}")
    for key in result["only_in_b"]:
        warn(f"{key}: new in the candidate, no baseline to compare with")
    return verdict
