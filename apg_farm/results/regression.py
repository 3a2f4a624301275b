"""The regression gate behind `apg-farm check`: a baseline, a candidate, a policy, a verdict.

The candidate fails when its evidence does not verify, when it is unfinished, when it has more
INVALID or ERROR attempts than allowed, when a (task, model) of the baseline was not evaluated,
when a model's pass rate (the headline, headline.py, pooled over the tasks both ran) or one
(task, model)'s drops by more than the tolerance and the gate's family of one-sided tests rejects
"no drop" for it (gate_family.py: Holm over the models and over the cells, so an unchanged
candidate fails at most 2.5 % of the time however many there are), or when an indispensable task
newly fails; with a cost tolerance, also when a model's cost per execution rises by more than
it (`cost_findings`, shared with `compare`); with a re-run tolerance, when the share of its
attempts run again after their agent started exceeds it. Changed fingerprints and unknown costs
are warnings: comparing across revisions is often the point.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from apg_farm.errors import BadInput
from apg_farm.results.baseline import is_sealed, unsealed_warning
from apg_farm.results.comparison import Side, compare
from apg_farm.results.cost_plot import usd
from apg_farm.results.gate_family import ALPHA, Family, gate_family
from apg_farm.results.headline import FINAL_LABEL, headline_counts

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
    #: Count every model-level drop beyond the tolerance, whatever its test (the gate before
    #: task-clustered intervals; `--plain-tolerance`). Cells are always tested in the family.
    plain_tolerance: bool = False
    #: Largest allowed rise of a model's cost per execution, as a fraction (0.2 = 20 %); None:
    #: cost is not checked.
    max_cost_increase: float | None = None
    #: Largest allowed share of the candidate's attempts that reached the run phase and were run
    #: again after it (the second-chance bias); None: not checked.
    max_rerun_share: float | None = None


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


def parse_cost_increase(value: str | None) -> float | None:
    """`--max-cost-increase`: a finite fraction >= 0 (0.2 = 20 %), or None when not given.

    Taken as text so a bad value is our BadInput naming the flag, not a parser's usage error."""
    if value is None:
        return None
    try:
        fraction = float(value)
    except ValueError:
        fraction = math.nan
    if not math.isfinite(fraction) or fraction < 0:
        raise BadInput(
            f"{value!r} is not a fraction of at least 0",
            field="--max-cost-increase",
            fix="give the allowed rise of the cost per execution as a fraction: 0.2 = 20 %",
        )
    return fraction


def parse_rerun_share(value: str | None) -> float | None:
    """`--max-rerun-share`: a fraction in [0, 1], or None when not given (BadInput naming the
    flag otherwise)."""
    if value is None:
        return None
    try:
        fraction = float(value)
    except ValueError:
        fraction = math.nan
    if not 0.0 <= fraction <= 1.0:
        raise BadInput(
            f"{value!r} is not a fraction between 0 and 1",
            field="--max-rerun-share",
            fix="give the largest allowed share of attempts re-run after their agent started: "
            "0.05 = 5 %",
        )
    return fraction


def rerun_share_findings(summary: dict[str, Any], allowed: float) -> tuple[list[str], list[str]]:
    """(failures, warnings) of the second-chance gate on one side's summary."""
    totals = summary.get("second_chance")
    if totals is None:
        return [], ["rerun_share unknown in the candidate (not recorded); not checked"]
    share = totals.get("rerun_share")
    if share is None or share <= allowed + _EPS:
        return [], []
    return [
        f"rerun_share {share:.1%} ({totals['rerun_attempts']} of {totals['started_attempts']} "
        "attempts that reached the run phase were run again after their agent started) exceeds "
        f"--max-rerun-share {allowed:g}"
    ], []


@dataclass
class CostFindings:
    """The cost gate's lines, one per model compared."""

    failures: list[str] = field(default_factory=list)
    #: Models whose cost is unknown on a side: said, never failed.
    unknown: list[str] = field(default_factory=list)
    within: list[str] = field(default_factory=list)


def cost_findings(
    comparison: dict[str, Any], max_increase: float, names: tuple[str, str] = ("A", "B")
) -> CostFindings:
    """The cost gate over `compare` output, per model.

    The figure is the cost per execution (total cost ÷ priced executions, retries and errors
    included) pooled over the tasks both sides ran and priced. A model fails when the second
    side's figure exceeds the first's × (1 + max_increase)."""
    found = CostFindings()
    for row in comparison["models"]:
        a, b = row["a"], row["b"]
        before, after = a.get("cost_per_execution"), b.get("cost_per_execution")
        if before is None or after is None:
            lacking = [n for n, s in zip(names, (a, b), strict=True) if not s.get("cost_known")]
            where = (
                f"unknown in {' and '.join(lacking)}"
                if lacking
                else "not known on both sides for any one task"
            )
            found.unknown.append(f"model {row['model']}: cost {where}; cost not checked")
            continue
        rise = (
            f"{(after - before) / before:+.1%}"
            if before > 0
            else ("up from zero" if after > 0 else "+0.0%")
        )
        text = (
            f"model {row['model']}: cost per execution {usd(before)} ({names[0]}, "
            f"{a['costed_executions']} priced) -> {usd(after)} ({names[1]}, "
            f"{b['costed_executions']} priced), {rise} over {len(row['cost_tasks'])} task(s), "
            f"allowed +{max_increase:.1%}"
        )
        # Relative slack so that exactly the allowed rise passes despite float rounding.
        if after > before * (1 + max_increase) * (1 + _EPS):
            found.failures.append(text)
        else:
            found.within.append(text)
    return found


def _with_reruns(row: dict[str, Any]) -> str:
    """The final-outcome rates beside the headline, labelled: shown, never gated on."""
    a, b = row["a"].get("final_rate"), row["b"].get("final_rate")
    return f"; {FINAL_LABEL} {_pct(a)} -> {_pct(b)}"


def _family_note(family: Family, key: tuple[str, ...]) -> str:
    kind = key[0]
    return (
        f"Holm-adjusted one-sided p {family.adjusted.get(key, 1.0):.3g} over "
        f"{family.size(kind)} {kind} tests, alpha {family.alpha(kind):g} "
        f"(the gate's {ALPHA:g} in all)"
    )


def _model_drop(row: dict[str, Any], policy: CheckPolicy, family: Family) -> tuple[bool, str]:
    """Whether a model's drop beyond the tolerance fails the check, and its line.

    By default the drop counts when the gate's family rejects "no drop" for the model (its
    task-clustered test, or under 5 tasks Fisher's on its pooled counts, Holm-adjusted): a drop
    within the noise is a warning. `--plain-tolerance` counts every drop beyond the tolerance."""
    clustered = row.get("clustered") or {}
    text = (
        f"model {row['model']}: headline pass rate {_pct(row['a']['rate'])} "
        f"(n={row['a']['n']}) -> {_pct(row['b']['rate'])} (n={row['b']['n']}), {_pts(row['diff'])} "
        f"(95% CI {_pts(row['diff_low'])} to {_pts(row['diff_high'])}"
    )
    if "high" in clustered:
        text += (
            f"; task-clustered over {clustered['tasks']} tasks {_pts(clustered['low'])} to "
            f"{_pts(clustered['high'])}"
        )
    text += f"){_with_reruns(row)}, tolerance {policy.max_rate_drop * 100:.1f} pts"
    if policy.plain_tolerance:
        return True, text
    key = ("model", row["model"])
    how = family.how.get(row["model"], "")
    if "unavailable" in clustered:
        how += f" ({clustered['unavailable']})"
    text += f"; {how} test, {_family_note(family, key)}"
    if family.rejects(key):
        return True, text
    return False, text + "; within the noise, not counted (--plain-tolerance counts it)"


def _gate_holds(cell: dict[str, Any] | None, floor: float) -> bool:
    if not cell:
        return False
    passed, n = headline_counts(cell)
    return bool(n and passed / n >= floor - _EPS)


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
        if side.kind == "baseline" and not is_sealed(side.summary):
            warn(unsealed_warning(side.label))
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
    family = gate_family(result)
    for row in result["models"]:
        drop = row["diff"]
        if drop is None or -drop <= tolerance + _EPS:
            continue
        failed, text = _model_drop(row, policy, family)
        (fail if failed else warn)(text)
    for row in result["cells"]:
        drop = row["diff"]
        if drop is None or -drop <= tolerance + _EPS:
            continue
        text = (
            f"{row['task']} {row['model']}: headline pass rate {_pct(row['a']['rate'])} "
            f"(n={row['a']['n']}) -> {_pct(row['b']['rate'])} (n={row['b']['n']}), "
            f"{_pts(drop)} (95% CI {_pts(row['diff_low'])} to {_pts(row['diff_high'])})"
            f"{_with_reruns(row)}"
        )
        key = ("cell", row["task"], row["model"])
        text += f"; Fisher exact, {_family_note(family, key)}"
        if family.rejects(key):
            fail(text)
        else:
            warn(text + "; within the noise of this many tests")

    gates = {**b.get("indispensable", {}), **(indispensable or {})}
    base_cells = {(x["task"], x["model"]): x for x in b["cells"]}
    models = list(dict.fromkeys(x["model"] for x in b["cells"]))
    for task, floor in sorted(gates.items()):
        for model in models:
            held_before = _gate_holds(base_cells.get((task, model)), floor)
            now = cand_cells.get((task, model))
            if _gate_holds(now, floor):
                continue
            counts = headline_counts(now) if now else (0, 0)
            rate = f"{_pct(counts[0] / counts[1])} of {counts[1]}" if counts[1] else "none"
            if held_before:
                fail(
                    f"indispensable task {task} newly fails for {model}: headline pass rate "
                    f"{rate}, "
                    f"needs {_pct(floor)}"
                )
            else:
                warn(f"indispensable task {task} already failed for {model} in the baseline")

    if policy.max_cost_increase is not None:
        cost = cost_findings(result, policy.max_cost_increase, ("the baseline", "the candidate"))
        verdict.failures += cost.failures
        # A model within the tolerance is not worth a line; an unknown cost is.
        verdict.warnings += cost.unknown

    if policy.max_rerun_share is not None:
        failures, warnings = rerun_share_findings(c, policy.max_rerun_share)
        verdict.failures += failures
        verdict.warnings += warnings

    for side in result["headline_unknown"]:
        who = (base, candidate)[side == "b"]
        warn(
            f"{who.label} predates the headline pass rate: its rate is over final outcomes "
            "(re-runs counted as second chances); promote the baseline again to compare headlines"
        )
    for change in result["provenance_changes"]:
        warn(f"provenance changed: {change}")
    for key in result["only_in_b"]:
        warn(f"{key}: new in the candidate, no baseline to compare with")
    return verdict
