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
- `rerun_share` = `rerun_attempts` ÷ `started_attempts`;
- `second_chance_attempts`, and the **headline** counts `headline_passed` ÷ `headline_n`
  (results/headline.py makes them the pass rate every report leads with): the lower bound's
  arithmetic over the re-runs an agent could have bought only, those of a `SECOND_CHANCE_KINDS`
  kind. A re-run the farm caused or observed (`FARM_KINDS`: a lost lease, a farm error, a failed
  link after the run, a claim the farm reproduced with its own check) costs the model nothing.

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
from apg_farm.results.headline import final_figures, rate_figures
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
    "link_failed",
    "farm_reproduced",
    "other",
)

#: Re-runs the farm caused or observed itself: the agent cannot have bought them, so the
#: headline does not count them against the model.
FARM_KINDS = ("lease_lost", "farm_error", "link_failed", "farm_reproduced")

#: Re-runs that rest on what the agent could write (its record, its output, its run's timing):
#: the headline counts an attempt with one as not passed ("other" included: unknown is not the
#: farm's word).
SECOND_CHANCE_KINDS = tuple(kind for kind in KINDS if kind not in FARM_KINDS)

#: Checks after the run whose failed link ends an execution as a retry (engine: "only a failed
#: link gets here"): the farm's own transport failing, never a claim the run made.
_AFTER_RUN_CHECKS = (
    "ddev_check_after",
    "ddev_check_stopped",
    "processes_after",
    "stop_agent",
    "host_files",
    "verify_after",
)

#: (kind, lower-case texts any of which in the lower-cased reason names it), first match wins.
#: The reasons are the engine's and the outcome policy's (contract/outcomes.py, workers/engine.py).
#: A claim the farm reproduced comes first: its reason keeps the claim's own words (a start
#: token, "provider trouble") that later rules would name.
REASON_RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("farm_reproduced", ("reproduced by the farm's check",)),
    ("provider_trouble", ("provider trouble",)),
    ("lease_lost", ("lease expired",)),
    ("farm_error", ("farm error",)),
    ("link_failed", tuple(f"{check}: transport failed" for check in _AFTER_RUN_CHECKS)),
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
    "second_chance_attempts",
    "headline_n",
    "headline_passed",
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


def second_chance_sql() -> ColumnElement[bool]:
    """An execution that is a re-run after the agent started of a kind the agent could have
    bought (SECOND_CHANCE_KINDS): what the headline counts against its attempt."""
    return _rerun() & rerun_kind_sql().in_(SECOND_CHANCE_KINDS)


def _count(condition: ColumnElement[bool]) -> ColumnElement[int]:
    return func.sum(case((condition, 1), else_=0))


#: Per-attempt tallies a row adds up: attempts started, with a re-run (and of those, PASSED and
#: ERROR/INVALID ones), with a re-run the agent could have bought (the same split).
_TALLIES = (
    "started",
    "rerun",
    "rerun_passed",
    "rerun_added",
    "bought",
    "bought_passed",
    "bought_added",
)


def _zero() -> dict[str, Any]:
    return {**dict.fromkeys(_TALLIES, 0), "kinds": Counter()}


def _tallies(session: Session, sweep_id: int) -> dict[tuple[str, str], dict[str, Any]]:
    """Per (task, model): attempts started, with a re-run (passed, added), with a re-run the
    agent could have bought (passed, added), re-runs by kind."""
    per_attempt = (
        queries.sweep_executions(
            sweep_id,
            Execution.attempt_id.label("attempt_id"),
            _count(_rerun()).label("reruns"),
            _count(second_chance_sql()).label("bought"),
            _count(Execution.agent_started.is_(True)).label("started"),
        )
        .group_by(Execution.attempt_id)
        .subquery()
    )
    stmt = (
        select(
            Attempt.task,
            Attempt.model,
            Attempt.outcome,
            func.count(),
            _count(per_attempt.c.reruns > 0),
            _count(per_attempt.c.bought > 0),
        )
        .join(per_attempt, per_attempt.c.attempt_id == Attempt.id)
        .where(per_attempt.c.started > 0)
        .group_by(Attempt.task, Attempt.model, Attempt.outcome)
    )
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for task, model, outcome, started, rerun, bought in session.execute(stmt):
        found = out.setdefault((task, model), _zero())
        found["started"] += int(started)
        for name, count in (("rerun", int(rerun or 0)), ("bought", int(bought or 0))):
            found[name] += count
            if outcome == Outcome.PASSED:
                found[f"{name}_passed"] += count
            elif outcome in ADDED_TO_DENOMINATOR:
                found[f"{name}_added"] += count
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
        "second_chance_attempts": found["bought"],
        "headline_n": n + found["bought_added"],
        "headline_passed": passed - found["bought_passed"],
        "lower_bound_n": lb_n,
        "lower_bound_passed": lb_passed,
        "lower_bound_rate": lb_passed / lb_n if lb_n else None,
        "lower_bound_ci_low": low if lb_n else None,
        "lower_bound_ci_high": high if lb_n else None,
    }


def _add(into: dict[str, Any], found: dict[str, Any]) -> None:
    for key in _TALLIES:
        into[key] += found[key]
    into["kinds"].update(found["kinds"])


#: Per (task, model): what `tallies` found for it.
Tallies = dict[tuple[str, str], dict[str, Any]]


def tallies(session: Session, sweep_id: int) -> Tallies:
    """The sweep's per-(task, model) tallies, one grouped query: what `add_to_cells` and
    `add_to_models` spread over a report."""
    return _tallies(session, sweep_id)


def add_to_cells(report: dict[str, Any], found: Tallies) -> None:
    """Add the second-chance figures (the headline counts among them) to the report's cells, and
    the sweep's totals under `second_chance`."""
    sweep = _zero()
    for cell in report["cells"]:
        mine = found.get((cell["task"], cell["model"]), _zero())
        cell.update(_figures(mine, cell["n"], cell["passed"]))
        _add(sweep, mine)
    n = sum(cell["n"] for cell in report["cells"])
    passed = sum(cell["passed"] for cell in report["cells"])
    totals = _figures(sweep, n, passed)
    report["second_chance"] = {
        "definition": "a re-run after the agent started is an execution whose run phase's "
        "command was issued and whose result is RETRY or LOST; the lower bound counts every "
        "attempt with one as a failure (ERROR and INVALID ones added to the denominator), the "
        "headline (pass_rate) only those with a re-run the agent could have bought "
        f"({', '.join(SECOND_CHANCE_KINDS)}); final_rate counts final outcomes, re-runs "
        "included; rerun_share = rerun_attempts / started_attempts",
        **rate_figures(totals["headline_passed"], totals["headline_n"]),
        **final_figures(passed, n),
        **totals,
    }


def add_to_models(report: dict[str, Any], found: Tallies) -> None:
    """Add the second-chance figures to the report's model rows, pooled over their cells."""
    by_model: dict[str, dict[str, Any]] = {}
    for cell in report["cells"]:
        _add(
            by_model.setdefault(cell["model"], _zero()),
            found.get((cell["task"], cell["model"]), _zero()),
        )
    for row in report.get("models", []):
        row.update(_figures(by_model.get(row["model"], _zero()), row["n"], row["passed"]))


def add_second_chance(session: Session, sweep_id: int, report: dict[str, Any]) -> None:
    """Add the second-chance figures to the report's cells and model rows, and the sweep's
    totals under `second_chance`."""
    found = _tallies(session, sweep_id)
    add_to_cells(report, found)
    add_to_models(report, found)


def rerun_share(summary: dict[str, Any]) -> float | None:
    """The sweep's rerun_share from a report or a baseline (None when it was not recorded)."""
    value = (summary.get("second_chance") or {}).get("rerun_share")
    return None if value is None else float(value)
