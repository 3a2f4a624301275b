"""Which attempts the headline counts against their model, as SQL: one home for every reader.

A re-run after the agent started (an execution whose run phase's command was issued and whose
result is RETRY or LOST) of a kind the agent could have bought (rerun_kinds.SECOND_CHANCE_KINDS)
is a second chance. The headline (results/headline.py) counts an attempt with one as not passed,
and as counted even when it ended ERROR or INVALID. The reports, the in-sweep comparison, the
stopping rule, the live view and the sweeps list all read these expressions, so no two of them
can disagree on what a model earned.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import ColumnElement, and_, case, exists, func, literal, or_, select

from apg_farm.contract import (
    COUNTED,
    KINDS,
    LOST_ON_HOST,
    SECOND_CHANCE_KINDS,
    TEXT_RULES,
    Outcome,
)
from apg_farm.store.db import Store
from apg_farm.store.models import Attempt, Execution

#: Execution results that gave the attempt no outcome: it was run again.
RERUN_RESULTS = ("RETRY", "LOST")

#: Outcomes outside the pass rate that an attempt with a second chance still adds to the
#: headline's denominator: an agent may have bought retries until they ran out (ERROR) or broken
#: its envelope (INVALID). SKIPPED comes from the escrowed grader, CANCELLED from the operator.
ADDED_TO_DENOMINATOR = (Outcome.ERROR.value, Outcome.INVALID.value)


def rerun_sql() -> ColumnElement[bool]:
    """An execution that is a re-run after the agent started."""
    return and_(Execution.agent_started.is_(True), Execution.result.in_(RERUN_RESULTS))


def rerun_kind_sql() -> ColumnElement[str]:
    """An execution's re-run kind (rerun_kinds.stored_kind), as a SQL CASE: LOST is a lost lease,
    else the kind stored when it ended; a row without one, the agent's kind its reason names."""
    text = func.lower(func.coalesce(Execution.reason, ""))
    whens: list[tuple[ColumnElement[bool], Any]] = [
        (and_(Execution.result == "LOST", Execution.rerun_kind == LOST_ON_HOST), LOST_ON_HOST),
        (Execution.result == "LOST", "lease_lost"),
        (Execution.rerun_kind.in_(KINDS), Execution.rerun_kind),
    ]
    for kind, needles in TEXT_RULES:
        for needle in needles:
            whens.append((text.contains(needle, autoescape=True), kind))
    whens.append((Execution.provider_trouble.is_not(None), "provider_trouble"))
    return case(*whens, else_=literal("other"))


def second_chance_sql() -> ColumnElement[bool]:
    """An execution that is a re-run after the agent started of a kind the agent could have
    bought (SECOND_CHANCE_KINDS): what the headline counts against its attempt."""
    return and_(rerun_sql(), rerun_kind_sql().in_(SECOND_CHANCE_KINDS))


def bought_sql() -> ColumnElement[bool]:
    """The attempt (`Attempt` in the enclosing query) had a second chance the agent could have
    bought. Looked up only for the outcomes it changes (one index probe per such attempt)."""
    had = exists(
        select(Execution.id).where(Execution.attempt_id == Attempt.id, second_chance_sql())
    )
    return and_(Attempt.outcome.in_([Outcome.PASSED.value, *ADDED_TO_DENOMINATOR]), had)


def headline_passed_sql(bought: ColumnElement[bool] | None = None) -> ColumnElement[bool]:
    """The attempt passes in the headline: PASSED, without a second chance."""
    return and_(
        Attempt.outcome == Outcome.PASSED, ~(bought if bought is not None else bought_sql())
    )


def headline_counted_sql(bought: ColumnElement[bool] | None = None) -> ColumnElement[bool]:
    """The attempt counts in the headline's denominator: a counted outcome, or ERROR or INVALID
    after a second chance."""
    return or_(
        Attempt.outcome.in_(sorted(COUNTED)),
        and_(
            Attempt.outcome.in_(ADDED_TO_DENOMINATOR),
            bought if bought is not None else bought_sql(),
        ),
    )


def had_second_chance(store: Store, attempt_id: int) -> bool:
    """The attempt had a re-run after its agent started of a kind the agent could have bought:
    what one attempt's headline outcome rests on (contract.headline_outcome)."""
    with store.read() as session:
        query = select(Execution.id).where(Execution.attempt_id == attempt_id, second_chance_sql())
        return session.scalar(select(exists(query))) is True
