"""The headline pass rate: the figure every report, comparison, gate and export leads with.

A re-run is a second chance. When its reason rests on what the agent could write (a start
claim, a provider outage, a timeout, a grade that could not run: second_chance.SECOND_CHANCE_KINDS)
the agent may have bought it, and a model that buys one whenever it is failing turns its failures
into more tries. The **headline** counts such an attempt as not passed, and adds it to the
denominator when its retries ran out (ERROR) or its envelope was refused (INVALID):

    pass_rate = headline_passed / headline_n
    headline_passed = passed - attempts that PASSED after a re-run the agent could have bought
    headline_n = n + attempts that ended ERROR or INVALID after such a re-run

So a model that games the retries reads its first-try rate, and one whose attempts were re-run
for the farm's own reasons (a lost lease, a farm error, a failed link after the run, a claim the
farm reproduced with its own check: second_chance.FARM_KINDS) loses nothing: its headline is its
final rate. `ci_low`/`ci_high` are the headline's Wilson interval. The rate over final outcomes,
re-runs counted as second chances, stays beside it, labelled: `final_rate` ("with re-runs") with
`final_ci_low`/`final_ci_high`; and the lower bound (every re-run after the agent started counted
against the model) with its own interval.

The counts come from the database (second_chance.py's one SQL CASE); this module is only the
arithmetic on them, shared by every report format so no two can disagree.
"""

from __future__ import annotations

from typing import Any

from apg_farm.results.stats import wilson

#: The label the rate over final outcomes carries wherever it is shown.
FINAL_LABEL = "with re-runs"


def rate_figures(passed: int, n: int) -> dict[str, Any]:
    """A pass rate and its Wilson 95 % interval (None without a counted attempt)."""
    low, high = wilson(passed, n)
    return {
        "pass_rate": passed / n if n else None,
        "ci_low": low if n else None,
        "ci_high": high if n else None,
    }


def final_figures(passed: int, n: int) -> dict[str, Any]:
    """The rate over final outcomes (re-runs counted as second chances), labelled `final_`."""
    found = rate_figures(passed, n)
    return {
        "final_rate": found["pass_rate"],
        "final_ci_low": found["ci_low"],
        "final_ci_high": found["ci_high"],
    }


def headline_counts(row: dict[str, Any]) -> tuple[int, int]:
    """(passed, n) of the headline of a cell or model row. A row from a baseline promoted before
    the headline existed has only its final outcomes: those, as the best figure it kept
    (`headline_known` says which)."""
    if headline_known(row):
        return int(row["headline_passed"]), int(row["headline_n"])
    return int(row["passed"]), int(row["n"])


def headline_known(row: dict[str, Any]) -> bool:
    """Whether a row carries the headline counts (a baseline promoted before them does not)."""
    return "headline_passed" in row and "headline_n" in row


def apply_headline(row: dict[str, Any]) -> None:
    """Make a row's `pass_rate`, `ci_low`, `ci_high` the headline, and add its `final_` rate.

    The row must carry `passed`, `n`, `headline_passed` and `headline_n`."""
    row.update(rate_figures(row["headline_passed"], row["headline_n"]))
    row.update(final_figures(row["passed"], row["n"]))
