"""What a sweep cost: per (task, model) and per model, from the executions' adapter records.

Every execution's cost counts, retries and errors included: the provider was paid for them.
**Cost per pass** is the total cost over the headline's passes (headline.py); its interval divides
the same total by the pass count at the Wilson bounds of the headline (n × ci_high, n × ci_low), so it is as wide as the
pass rate is uncertain, and open-ended (None) while the lower bound is 0. The figures come from a
file the bed wrote (`claude.json`): reports say what is known, never a verdict.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import func
from sqlalchemy.orm import Session

from apg_farm.results import queries
from apg_farm.results.headline import headline_counts
from apg_farm.store import Attempt, Execution

#: The token counts kept per execution, as report keys.
TOKENS = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")
#: The keys add_costs gives every cell and model row.
COST_KEYS = (
    "cost_usd",
    "costed_executions",
    "median_cost_usd",
    "cost_per_pass",
    "cost_per_pass_low",
    "cost_per_pass_high",
    "tokens",
)
#: Separates task and model in one grouping key (neither can contain it: sweep-file names).
_SEP = "\t"


def add_costs(session: Session, sweep_id: int, report: dict[str, Any]) -> None:
    """Add cost figures to the report's cells and model rows (None where no cost is known)."""
    totals = _totals(session, sweep_id)
    cell_key = (Attempt.task + _SEP + Attempt.model).label("key")
    medians = {
        tuple(str(key).split(_SEP, 1)): found[0]
        for key, found in queries.group_quantiles(
            session, _costs(sweep_id, cell_key), [0.5]
        ).items()
    }
    model_medians = {
        key: found[0]
        for key, found in queries.group_quantiles(
            session, _costs(sweep_id, Attempt.model.label("key")), [0.5]
        ).items()
    }
    by_model: dict[str, dict[str, Any]] = {}
    for cell in report["cells"]:
        found = totals.get((cell["task"], cell["model"]))
        cell.update(_figures(found, medians.get((cell["task"], cell["model"])), cell))
        if found:
            pooled = by_model.setdefault(
                cell["model"], {"cost": 0.0, "known": 0, **dict.fromkeys(TOKENS, 0)}
            )
            for key, value in found.items():
                pooled[key] += value
    for row in report.get("models", []):
        found = by_model.get(row["model"])
        row.update(_figures(found, model_medians.get(row["model"]), row))


def _totals(session: Session, sweep_id: int) -> dict[tuple[str, str], dict[str, Any]]:
    columns = [func.sum(getattr(Execution, name)) for name in TOKENS]
    stmt = (
        queries.sweep_executions(
            sweep_id,
            Attempt.task,
            Attempt.model,
            func.sum(Execution.cost_usd),
            func.count(Execution.cost_usd),
            *columns,
        )
        .where(Execution.cost_usd.is_not(None))
        .group_by(Attempt.task, Attempt.model)
    )
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for task, model, cost, known, *tokens in session.execute(stmt):
        out[(task, model)] = {
            "cost": float(cost or 0.0),
            "known": int(known),
            **{name: int(value or 0) for name, value in zip(TOKENS, tokens, strict=True)},
        }
    return out


def _costs(sweep_id: int, key: Any) -> Any:
    return queries.sweep_executions(sweep_id, key, Execution.cost_usd.label("value")).where(
        Execution.cost_usd.is_not(None)
    )


def _figures(
    found: dict[str, Any] | None, median: float | None, rates: dict[str, Any]
) -> dict[str, Any]:
    """cost_usd, median_cost_usd, cost_per_pass (with its interval) and tokens of one row."""
    if not found or not found["known"]:
        return {
            "cost_usd": None,
            "costed_executions": 0,
            "median_cost_usd": None,
            "cost_per_pass": None,
            "cost_per_pass_low": None,
            "cost_per_pass_high": None,
            "tokens": None,
        }
    # The headline's passes and interval (headline.py): a pass the agent bought a re-run for
    # is no pass here either.
    total = found["cost"]
    passed, n = headline_counts(rates) if "n" in rates else (0, 0)
    low, high = rates.get("ci_low"), rates.get("ci_high")
    return {
        "cost_usd": round(total, 6),
        "costed_executions": found["known"],
        "median_cost_usd": round(median, 6) if median is not None else None,
        "cost_per_pass": round(total / passed, 6) if passed else None,
        # More passes (the upper bound of the rate) make each pass cheaper: the low end.
        "cost_per_pass_low": round(total / (n * high), 6) if n and high else None,
        "cost_per_pass_high": round(total / (n * low), 6) if n and low else None,
        "tokens": {name: found[name] for name in TOKENS},
    }
