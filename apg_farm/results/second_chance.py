"""The second-chance bias of a sweep: re-runs after the agent started, and what they may hide.

A **re-run after the agent started** is an execution whose run phase's command was issued
(`executions.agent_started`) and whose result is RETRY or LOST: it did not give its attempt an
outcome, another execution did. The agent may have bought that second chance (an outage written
into the adapter's record, a run that looks as if the adapter never started), so the reported pass
rate may be inflated. Every report states, per (task, model), per model and for the sweep:

- `rerun_attempts`: attempts with at least one such re-run, and `reruns` (with `reruns_by_kind`,
  the reason classified by `rerun_kind`): how many such executions;
- `started_attempts`: attempts with at least one execution whose agent started;
- the **lower-bound pass rate** `lower_bound_rate` (with its Wilson interval): every attempt with
  such a re-run counted as a failure, and counted in the denominator even when it ended ERROR or
  INVALID (outside the pass rate): passes without a re-run ÷ (n + re-run attempts that ended ERROR
  or INVALID);
- `rerun_share` = `rerun_attempts` ÷ `started_attempts`.

Everything is aggregated by the database (rows per task, model, outcome and kind), and the
classification is one SQL CASE built from the same rules as the Python function.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from sqlalchemy import ColumnElement, case, func, literal, select
from sqlalchemy.orm import Session

from apg_farm.contract import Outcome
from apg_farm.results import queries
from apg_farm.results.stats import wilson
from apg_farm.store import Attempt, Execution

#: Execution results that gave the attempt no outcome: it was run again.
RERUN_RESULTS = ("RETRY", "LOST")

#: Outcomes outside the pass rate that a re-run attempt still adds to the lower bound's
#: denominator: an agent may have bought retries until they ran out (ERROR) or broken its
#: envelope (INVALID). SKIPPED comes from the escrowed grader, CANCELLED from the operator.
ADDED_TO_DENOMINATOR = (Outcome.ERROR.value, Outcome.INVALID.value)

#: The kinds of re-run, in report order; "other" takes whatever no rule names.
KINDS = (
    "provider_trouble",
    "adapter_not_started",
    "timeout_or_transport",
    "grade_failed",
    "lease_lost",
    "farm_error",
    "other",
)

#: (kind, lower-case texts any of which in the lower-cased reason names it), first match wins.
#: The reasons are the engine's and the outcome policy's (contract/outcomes.py, workers/engine.py).
REASON_RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("provider_trouble", ("provider trouble",)),
    ("lease_lost", ("lease expired",)),
    ("farm_error", ("farm error",)),
    (
        "adapter_not_started",
        (
            "adapter could not start",
            "adapter never started",
            "before the adapter started",
            "run: apg_",
        ),
    ),
    (
        "timeout_or_transport",
        (
            "transport failed",
            "no result before the sweep's",
            "ddev could not start the project",
            "ddev does not know the command",
        ),
    ),
    ("grade_failed", ("grade could not run",)),
)

#: Keys every cell and model row gets.
CELL_KEYS = (
    "started_attempts",
    "rerun_attempts",
    "reruns",
    "reruns_by_kind",
    "rerun_share",
    "lower_bound_n",
    "lower_bound_passed",
    "lower_bound_rate",
    "lower_bound_ci_low",
    "lower_bound_ci_high",
)


def rerun_kind(result: str | None, provider_trouble: str | None, reason: str | None) -> str:
    """The kind of one re-run from its result, provider trouble and reason (see REASON_RULES).

    A LOST execution is a lost lease whatever its reason says (its worker or bed stopped
    answering, or the reconciler took it back); provider trouble is named by the reason the
    engine gave the RETRY, with the kind kept in `provider_trouble` as a fallback."""
    if result == "LOST":
        return "lease_lost"
    text = (reason or "").lower()
    for kind, needles in REASON_RULES:
        if any(needle in text for needle in needles):
            return kind
    if provider_trouble:
        return "provider_trouble"
    return "other"


def rerun_kind_sql() -> ColumnElement[str]:
    """`rerun_kind` of an execution row, as a SQL CASE (the same rules, in the same order)."""
    text = func.lower(func.coalesce(Execution.reason, ""))
    whens: list[tuple[ColumnElement[bool], Any]] = [(Execution.result == "LOST", "lease_lost")]
    for kind, needles in REASON_RULES:
        for needle in needles:
            whens.append((text.contains(needle, autoescape=True), kind))
    whens.append((Execution.provider_trouble.is_not(None), "provider_trouble"))
    return case(*whens, else_=literal("other"))


def _rerun() -> ColumnElement[bool]:
    return Execution.agent_started.is_(True) & Execution.result.in_(RERUN_RESULTS)


def _count(condition: ColumnElement[bool]) -> ColumnElement[int]:
    return func.sum(case((condition, 1), else_=0))


def _zero() -> dict[str, Any]:
    return {"started": 0, "rerun": 0, "rerun_passed": 0, "rerun_added": 0, "kinds": Counter()}


def _tallies(session: Session, sweep_id: int) -> dict[tuple[str, str], dict[str, Any]]:
    """Per (task, model): attempts started, with a re-run (passed, added), re-runs by kind."""
    per_attempt = (
        queries.sweep_executions(
            sweep_id,
            Execution.attempt_id.label("attempt_id"),
            _count(_rerun()).label("reruns"),
            _count(Execution.agent_started.is_(True)).label("started"),
        )
        .group_by(Execution.attempt_id)
        .subquery()
    )
    had_rerun = per_attempt.c.reruns > 0
    stmt = (
        select(Attempt.task, Attempt.model, Attempt.outcome, func.count(), _count(had_rerun))
        .join(per_attempt, per_attempt.c.attempt_id == Attempt.id)
        .where(per_attempt.c.started > 0)
        .group_by(Attempt.task, Attempt.model, Attempt.outcome)
    )
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for task, model, outcome, started, rerun in session.execute(stmt):
        found = out.setdefault((task, model), _zero())
        found["started"] += int(started)
        found["rerun"] += int(rerun or 0)
        if outcome == Outcome.PASSED:
            found["rerun_passed"] += int(rerun or 0)
        elif outcome in ADDED_TO_DENOMINATOR:
            found["rerun_added"] += int(rerun or 0)
    kind = rerun_kind_sql().label("kind")
    by_kind = (
        queries.sweep_executions(sweep_id, Attempt.task, Attempt.model, kind, func.count())
        .where(_rerun())
        .group_by(Attempt.task, Attempt.model, kind)
    )
    for task, model, name, count in session.execute(by_kind):
        out.setdefault((task, model), _zero())["kinds"][str(name)] += int(count)
    return out


def _figures(found: dict[str, Any], n: int, passed: int) -> dict[str, Any]:
    """The CELL_KEYS of one row from its tally and its counted attempts and passes."""
    kinds: Counter[str] = found["kinds"]
    lb_n = n + found["rerun_added"]
    lb_passed = passed - found["rerun_passed"]
    low, high = wilson(lb_passed, lb_n)
    return {
        "started_attempts": found["started"],
        "rerun_attempts": found["rerun"],
        "reruns": sum(kinds.values()),
        "reruns_by_kind": {k: kinds[k] for k in KINDS if kinds[k]},
        "rerun_share": found["rerun"] / found["started"] if found["started"] else None,
        "lower_bound_n": lb_n,
        "lower_bound_passed": lb_passed,
        "lower_bound_rate": lb_passed / lb_n if lb_n else None,
        "lower_bound_ci_low": low if lb_n else None,
        "lower_bound_ci_high": high if lb_n else None,
    }


def _add(into: dict[str, Any], found: dict[str, Any]) -> None:
    for key in ("started", "rerun", "rerun_passed", "rerun_added"):
        into[key] += found[key]
    into["kinds"].update(found["kinds"])


def add_second_chance(session: Session, sweep_id: int, report: dict[str, Any]) -> None:
    """Add the second-chance figures to the report's cells and model rows, and the sweep's
    totals under `second_chance`."""
    tallies = _tallies(session, sweep_id)
    by_model: dict[str, dict[str, Any]] = {}
    sweep = _zero()
    for cell in report["cells"]:
        found = tallies.get((cell["task"], cell["model"]), _zero())
        cell.update(_figures(found, cell["n"], cell["passed"]))
        _add(by_model.setdefault(cell["model"], _zero()), found)
        _add(sweep, found)
    for row in report.get("models", []):
        row.update(_figures(by_model.get(row["model"], _zero()), row["n"], row["passed"]))
    n = sum(cell["n"] for cell in report["cells"])
    passed = sum(cell["passed"] for cell in report["cells"])
    totals = _figures(sweep, n, passed)
    report["second_chance"] = {
        "definition": "a re-run after the agent started is an execution whose run phase's "
        "command was issued and whose result is RETRY or LOST; the lower bound counts every "
        "attempt with one as a failure (ERROR and INVALID ones added to the denominator); "
        "rerun_share = rerun_attempts / started_attempts",
        "pass_rate": passed / n if n else None,
        **totals,
    }


def rerun_share(summary: dict[str, Any]) -> float | None:
    """The sweep's rerun_share from a report or a baseline (None when it was not recorded)."""
    value = (summary.get("second_chance") or {}).get("rerun_share")
    return None if value is None else float(value)
