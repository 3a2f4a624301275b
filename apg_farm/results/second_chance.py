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

Everything is aggregated by the database (rows per task, model, outcome and kind). A re-run's
kind is the one stored when it ended (`executions.rerun_kind`, contract/rerun_kinds.py: the
farm's kinds come from the verdict's fields, never from text); one SQL CASE reads it, the same
as the Python function.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from sqlalchemy import ColumnElement, case, func, select
from sqlalchemy.orm import Session

# The kinds of re-run, the farm's (FARM_KINDS: the headline does not count them against the
# model) and the agent's (SECOND_CHANCE_KINDS), decided when a re-run ends (rerun_kinds.py).
from apg_farm.contract import FARM_KINDS as FARM_KINDS
from apg_farm.contract import KINDS, SECOND_CHANCE_KINDS, Outcome, stored_kind
from apg_farm.results import queries
from apg_farm.results.exclusions import EXCLUDED, bound_figures
from apg_farm.results.exclusions import KEYS as EXCLUSION_KEYS
from apg_farm.results.headline import final_figures, rate_figures
from apg_farm.results.stats import wilson
from apg_farm.store import (
    ADDED_TO_DENOMINATOR,
    Attempt,
    Execution,
    rerun_kind_sql,
    second_chance_sql,
)
from apg_farm.store import rerun_sql as _rerun

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
    # The exclusion bound (exclusions.py): INVALID, ERROR, SKIPPED after the start as failures.
    *EXCLUSION_KEYS,
)


def rerun_kind(
    result: str | None,
    provider_trouble: str | None,
    reason: str | None,
    recorded: str | None = None,
) -> str:
    """The kind of one stored re-run (rerun_kinds.stored_kind): LOST is a lost lease, else the
    kind recorded when it ended; a row without one, what its reason names among the agent's
    kinds (never a farm kind: text can carry what the agent wrote)."""
    return stored_kind(result, recorded, reason, provider_trouble)


def _count(condition: ColumnElement[bool]) -> ColumnElement[int]:
    return func.sum(case((condition, 1), else_=0))


#: Per-attempt tallies a row adds up: attempts started, with a re-run (and of those, PASSED and
#: ERROR/INVALID ones), with a re-run the agent could have bought (the same split), and started
#: ones that ended outside every rate (INVALID, ERROR, SKIPPED: the exclusion bound's).
_TALLIES = (
    "started",
    "excluded",
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
        if outcome in EXCLUDED:
            found["excluded"] += int(started)
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
    headline_passed = passed - found["bought_passed"]
    return {
        "started_attempts": found["started"],
        "rerun_attempts": found["rerun"],
        "reruns": sum(kinds.values()),
        "reruns_by_kind": {k: kinds[k] for k in KINDS if kinds[k]},
        "rerun_share": found["rerun"] / found["started"] if found["started"] else None,
        "second_chance_attempts": found["bought"],
        "headline_n": n + found["bought_added"],
        "headline_passed": headline_passed,
        "lower_bound_n": lb_n,
        "lower_bound_passed": lb_passed,
        "lower_bound_rate": lb_passed / lb_n if lb_n else None,
        "lower_bound_ci_low": low if lb_n else None,
        "lower_bound_ci_high": high if lb_n else None,
        **bound_figures(headline_passed, n, found["excluded"]),
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
