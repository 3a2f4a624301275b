"""The exclusion bound (#30, part 5): what the rates would be if every excluded attempt had failed.

INVALID, ERROR and SKIPPED attempts are outside every pass rate (docs/analysis.md, "What
counts"): an infrastructure failure or a broken envelope is not evidence about the model. But once
the agent started, what ended the attempt may have been its doing (a site it broke so the grade
could not run, an envelope it spoiled), and if one model's attempts are excluded more often than
another's, dropping them biases the comparison in that model's favour. So beside the headline and
the second-chance lower bound every row carries the **exclusion bound**: the headline with every
attempt that ended INVALID, ERROR or SKIPPED after its agent started counted as a failure,

    exclusion_bound_passed = headline_passed
    exclusion_bound_n = n + excluded_after_start

(`n` the counted attempts; the headline already adds the ERROR and INVALID ones after a re-run the
agent could have bought, and those are among `excluded_after_start`, so none is added twice).
An attempt excluded before its agent started (a bed that failed its verify, a reset that did not
take) is the farm's alone and stays out.

A pair of models (a sweep's comparisons) or of sides (`compare`, `check`) gets each side's bound
over the pair's one task set, the difference of the bounds, and a **warning** when the share of
excluded attempts differs between the sides beyond chance: two-sided Fisher exact p below
WARN_P (the doubled one-sided p), the counts named. The warning changes no exit code: a gate on
exclusions already exists (`check`'s ERROR/INVALID rules).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from apg_farm.contract import Outcome
from apg_farm.results.gate_family import fisher_drop_p
from apg_farm.results.headline import rate_figures

#: The outcomes no pass rate counts.
EXCLUDED = (Outcome.INVALID.value, Outcome.ERROR.value, Outcome.SKIPPED.value)

#: A pair's sides differ in their exclusions when the two-sided Fisher p is below this.
WARN_P = 0.05

#: Keys every cell and model row gets (second_chance.CELL_KEYS lists them too).
KEYS = (
    "excluded_after_start",
    "exclusion_bound_n",
    "exclusion_bound_passed",
    "exclusion_bound_rate",
    "exclusion_bound_ci_low",
    "exclusion_bound_ci_high",
)


def bound_figures(headline_passed: int, n: int, excluded: int) -> dict[str, Any]:
    """The exclusion bound of a row: its headline passes over its counted attempts (`n`) plus
    those excluded after their agent started, with the Wilson interval."""
    bound_n = n + excluded
    # The same rate and Wilson interval every headline figure has (headline.rate_figures).
    rate = rate_figures(headline_passed, bound_n)
    return {
        "excluded_after_start": excluded,
        "exclusion_bound_n": bound_n,
        "exclusion_bound_passed": headline_passed,
        "exclusion_bound_rate": rate["pass_rate"],
        "exclusion_bound_ci_low": rate["ci_low"],
        "exclusion_bound_ci_high": rate["ci_high"],
    }


def pooled(rows: Iterable[Mapping[str, Any]]) -> dict[str, Any] | None:
    """One side's exclusion bound pooled over its cells; None when a cell does not carry it (a
    baseline promoted before #30)."""
    rows = list(rows)
    if any("exclusion_bound_n" not in row for row in rows):
        return None
    excluded = sum(int(row["excluded_after_start"]) for row in rows)
    bound_n = sum(int(row["exclusion_bound_n"]) for row in rows)
    passed = sum(int(row["exclusion_bound_passed"]) for row in rows)
    return bound_figures(passed, bound_n - excluded, excluded)


def differ_p(a: Mapping[str, Any], b: Mapping[str, Any]) -> float:
    """Two-sided Fisher exact p of "both sides exclude the same share": twice the smaller
    one-sided p, capped at 1."""
    counts = []
    for side in (a, b):
        excluded, total = int(side["excluded_after_start"]), int(side["exclusion_bound_n"])
        # fisher_drop_p asks of "passed" counts: here, attempts kept.
        counts.append((total - excluded, total))
    (kept_a, n_a), (kept_b, n_b) = counts
    lower = fisher_drop_p(kept_a, n_a, kept_b, n_b)
    upper = fisher_drop_p(kept_b, n_b, kept_a, n_a)
    return min(1.0, 2 * min(lower, upper))


def pair(
    a: Mapping[str, Any] | None,
    b: Mapping[str, Any] | None,
    labels: tuple[str, str],
    *,
    sign: int,
) -> dict[str, Any] | None:
    """A pair's exclusion figures from each side's pooled bound: both bounds, Fisher's p (None
    when neither side excluded anything) and the warning (None when the shares do not differ
    beyond chance), `labels` naming the sides in it, and `bound_diff`, B − A times `sign` (a
    report's pairs are A − B: -1; `compare`'s B − A: 1). None when a side does not carry it."""
    if a is None or b is None:
        return None
    rate_a, rate_b = a["exclusion_bound_rate"], b["exclusion_bound_rate"]
    found: dict[str, Any] = {
        "a": dict(a),
        "b": dict(b),
        "bound_diff": None if rate_a is None or rate_b is None else sign * (rate_b - rate_a),
        "p_value": None,
        "warning": None,
    }
    if not a["excluded_after_start"] and not b["excluded_after_start"]:
        return found
    p = differ_p(a, b)
    found["p_value"] = p
    if p < WARN_P:
        found["warning"] = (
            f"exclusions differ: {labels[0]} {_share(a)}, {labels[1]} {_share(b)} of attempts "
            f"ended INVALID, ERROR or SKIPPED after the agent started (Fisher p {p:.2g}); with "
            f"them as failures {labels[0]} {_pct(rate_a)}, {labels[1]} {_pct(rate_b)}"
        )
    return found


def _share(side: Mapping[str, Any]) -> str:
    return f"{side['excluded_after_start']} of {side['exclusion_bound_n']}"


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value:.1%}"


def report_lines(report: Mapping[str, Any]) -> list[str]:
    """What a text report prints of the exclusions: a line per model that excluded attempts after
    their agent started, with its bound beside its headline (nothing when none did)."""
    lines = []
    for row in report.get("models", []):
        if row.get("excluded_after_start"):
            lines.append(
                f"{row['model']}: {_share(row)} attempts ended INVALID, ERROR or SKIPPED after "
                f"the agent started; counted as failures the headline {_pct(row.get('pass_rate'))}"
                f" would be {_pct(row['exclusion_bound_rate'])} "
                f"[{_pct(row['exclusion_bound_ci_low'])}–{_pct(row['exclusion_bound_ci_high'])}]"
            )
    return lines


def warnings(pairs: Iterable[Mapping[str, Any]]) -> list[str]:
    """The warnings of a report's pairs (their `exclusions`), in the pairs' order."""
    return [
        row["exclusions"]["warning"]
        for row in pairs
        if row.get("exclusions") and row["exclusions"].get("warning")
    ]
