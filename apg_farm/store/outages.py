"""Provider outages: a claim is believed only where the provider's own record allows it.

An outage claim is an error record the adapter wrote in the bed (claude.json), where the agent
can write too. The farm cannot ask the provider about the past, but it saw what the provider did
for the other runs of that provider: a run that was being answered while the claimed refusal came
says the provider was up. So a claim that already passed the engine's checks (the start window,
an unchanged site; outcomes.md, "Provider trouble") is judged here, in this order:

1. **Contradicted**: a judged run of the same provider (another of its models, or the same model
   on another bed) whose run phase spans the claimed run's start and that the provider answered
   (`answered_filter`) refutes it: not believed.
2. **The model's own outage rule** (pacing.believe_outage): believed while its outage goes on; a
   new outage once in `quiet` seconds.
3. **Corroborated**: a claim refused only by the quiet period is believed when another model of
   the provider had a claim believed within `window` seconds of this one. The same model on other
   beds never corroborates: a faking agent fakes on every bed alike, it cannot write another
   model's record.

A run of the provider that started after a model's outage began and ended answered ends that
outage (`provider_answered`): a provider that answers one model is not down for its others.

The provider of a model is its id's prefix before the first '/' (`anthropic/claude-…` →
`anthropic`); an id without '/' is its own provider.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import ColumnElement, and_, or_, select
from sqlalchemy.orm import InstrumentedAttribute, Session

from apg_farm.contract import COUNTED, Outcome
from apg_farm.store.db import Store
from apg_farm.store.models import Attempt, Execution, ModelGate, Phase
from apg_farm.store.pacing import believe_outage, outage_clean

#: The phase in which the agent runs: APG's adapter (`run`) or an outside harness (`agent`).
RUN_PHASES = ("run", "agent")
HARNESS_PHASE = "agent"


def provider_of(model: str) -> str:
    """The provider of a model id: its prefix before the first '/', the whole id without one."""
    return model.split("/", 1)[0]


def of_provider(column: InstrumentedAttribute[str], provider: str) -> ColumnElement[bool]:
    """Rows whose model (in `column`) is of `provider`: the id itself or `provider/…`."""
    escaped = provider.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return or_(column == provider, column.like(f"{escaped}/%", escape="\\"))


def answered_filter() -> ColumnElement[bool]:
    """An execution (joined to its run phase) the provider answered: judged by its own work
    (a counted outcome, the agent started) and either passed (the agent did the work, so its calls
    were answered) or its record names no provider failure. An outside harness meters the calls
    itself (the agent cannot write that): its run counts only when the metering shows output."""
    return and_(
        Execution.agent_started.is_(True),
        Execution.result.in_([str(o) for o in COUNTED]),
        or_(
            Execution.result == str(Outcome.PASSED),
            and_(
                Execution.provider_trouble.is_(None),
                or_(Phase.name != HARNESS_PHASE, Execution.output_tokens > 0),
            ),
        ),
    )


def judge_provider_claim(
    store: Store, execution_id: int, model: str, *, quiet: float, window: float
) -> str | None:
    """Whether the provider claim of execution `execution_id` (of `model`) is believed: None when
    it is, else why not. One transaction; locks the model's gate row (pacing.believe_outage)."""
    with store.session() as session:
        run = _run_phase(session, execution_id)
        claimed_at = run[0] if run is not None else None
        if claimed_at is not None:
            refuted = contradicted(session, execution_id, model, claimed_at)
            if refuted is not None:
                return refuted
        doubt = believe_outage(store, session, model, quiet=quiet)
        if claimed_at is None:
            return doubt
        gate = session.get_one(ModelGate, model)
        if doubt is None:
            # The outage began with the refused call, not when the farm judged it: a run the
            # provider answered since then refutes it (provider_answered).
            since, ended = gate.outage_since, gate.outage_ended_at
            if since is not None and claimed_at < since and (ended is None or ended < claimed_at):
                gate.outage_since = claimed_at
            return None
        other = corroborated(session, execution_id, model, claimed_at, window)
        if other is None:
            return doubt
        # Believed on another model's word: the model's outage goes on from this claim.
        gate.outage_since, gate.outage_ended_at = claimed_at, None
        return None


def contradicted(
    session: Session, execution_id: int, model: str, claimed_at: datetime
) -> str | None:
    """Why the claim is refuted: a judged run of the provider, answered, whose run phase spans
    `claimed_at` (the claimed run's start); None when there is none."""
    provider = provider_of(model)
    rows = session.execute(
        select(Attempt.model, Execution.bed_id, Phase.started_at, Phase.finished_at)
        .join(Attempt, Attempt.id == Execution.attempt_id)
        .join(Phase, Phase.execution_id == Execution.id)
        .where(
            Execution.id != execution_id,
            # Bounds the scan to executions that ended since the claimed run began.
            Execution.finished_at >= claimed_at,
            Phase.name.in_(RUN_PHASES),
            Phase.started_at <= claimed_at,
            Phase.finished_at >= claimed_at,
            of_provider(Attempt.model, provider),
            answered_filter(),
        )
        .order_by(Phase.finished_at)
    ).all()
    for other, bed_id, started, finished in rows:
        if provider_of(other) != provider:
            continue
        who = f"{other} on bed {bed_id}" if other != model else f"{model} on bed {bed_id}"
        return (
            f"the provider {provider} answered {who} while this run began (a run from "
            f"{_clock(started)} to {_clock(finished)}, judged by its own work)"
        )
    return None


def corroborated(
    session: Session, execution_id: int, model: str, claimed_at: datetime, window: float
) -> str | None:
    """Another model of the provider whose claim was believed (its execution re-run for provider
    trouble) with its run begun within `window` seconds of `claimed_at`; None when none."""
    provider = provider_of(model)
    span = timedelta(seconds=window)
    rows = session.execute(
        select(Attempt.model)
        .join(Execution, Execution.attempt_id == Attempt.id)
        .join(Phase, Phase.execution_id == Execution.id)
        .where(
            Execution.id != execution_id,
            Execution.finished_at >= claimed_at - span,
            Execution.result == "RETRY",
            Execution.provider_trouble.is_not(None),
            Phase.name.in_(RUN_PHASES),
            Phase.started_at >= claimed_at - span,
            Phase.started_at <= claimed_at + span,
            Attempt.model != model,
            of_provider(Attempt.model, provider),
        )
        .limit(20)
    ).all()
    return next((m for (m,) in rows if provider_of(m) == provider), None)


def provider_answered(
    store: Store, session: Session, model: str, execution: Execution, *, answered: bool
) -> None:
    """`execution`, of `model`, ended judged without believed provider trouble. Without an
    answer from the provider (an error record on a run graded anyway) it ends only its own
    model's outage that began before it started (pacing.outage_clean). One the provider answered
    (no error record, or passed) answered calls all through its run phase: every outage of the
    provider's models that began before that phase ended is over, from the phase's start (or
    refuted from its beginning, when the phase was going on as it began).

    Locks, in model order, the provider's gate rows, only when one of them has such an outage
    (the caller may lock its own model's row after: it is in the set, so the order holds)."""
    run = _run_phase(session, execution.id) if answered else None
    if run is None:
        outage_clean(session, model, execution.started_at)
        return
    run_started, run_ended = run
    provider = provider_of(model)
    open_outage = and_(
        ModelGate.outage_since.is_not(None),
        ModelGate.outage_since <= run_ended,
        or_(
            ModelGate.outage_ended_at.is_(None),
            ModelGate.outage_ended_at < ModelGate.outage_since,
        ),
    )
    troubled = [
        m
        for m in session.scalars(
            select(ModelGate.model).where(of_provider(ModelGate.model, provider), open_outage)
        )
        if provider_of(m) == provider
    ]
    if not troubled:
        return
    query = (
        select(ModelGate)
        .where(ModelGate.model.in_(sorted({*troubled, model})))
        .order_by(ModelGate.model)
    )
    for gate in session.scalars(query if store.is_sqlite else query.with_for_update()):
        since, ended = gate.outage_since, gate.outage_ended_at
        if since is None or since > run_ended or (ended is not None and ended >= since):
            continue  # not of this provider's open outages, or closed meanwhile
        gate.outage_ended_at = max(since, run_started)


def _run_phase(session: Session, execution_id: int) -> tuple[datetime, datetime] | None:
    """When the execution's agent ran: its run phase's start and end (the last, if several)."""
    row = session.execute(
        select(Phase.started_at, Phase.finished_at)
        .where(Phase.execution_id == execution_id, Phase.name.in_(RUN_PHASES))
        .order_by(Phase.id.desc())
        .limit(1)
    ).first()
    return (row[0], row[1]) if row is not None else None


def _clock(at: datetime) -> str:
    return at.isoformat(timespec="milliseconds")
