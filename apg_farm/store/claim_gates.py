"""What a claim the farm could not check may cost: one bed per model an hour, then the model.

A bed-configuration claim (a token saying the bed is misconfigured) that no check of the farm's
could reproduce nor refute is believed by the old rule (an unchanged site, a run within the start
window), and asks for its bed's quarantine. An agent can print such a token on every run, so the
store grants it at most one bed per model in CLAIM_QUARANTINE_SECONDS; the next such claim of
that model pauses the model (no attempt of it is claimed) until a person releases it with
`apg-farm model release MODEL`. A claim the farm reproduced is the bed's own and quarantines as
any bed fault does; this is only for the ones it could not check.

Lock order: called in record_verdict's transaction after the bed and attempt rows, like the
model gates of pacing.py; it locks the one claim_gates row of the model.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import ColumnElement, select
from sqlalchemy.orm import Session

from apg_farm.store.db import Store
from apg_farm.store.models import Attempt, AttemptState, Bed, BedEvent, ClaimGate
from apg_farm.store.pacing import db_time
from apg_farm.store.rules import quarantine

#: A model's unchecked claims quarantine at most one bed in this many seconds.
CLAIM_QUARANTINE_SECONDS = 3600.0
#: How a person lets a paused model run again.
RELEASE_COMMAND = "apg-farm model release {model}"


def unpaused() -> ColumnElement[bool]:
    """A condition on Attempt rows: its model is not paused for its claims (the claim's filter)."""
    paused = select(ClaimGate.model).where(ClaimGate.paused_reason.is_not(None))
    return Attempt.model.not_in(paused)


def _gate(store: Store, session: Session, model: str) -> ClaimGate:
    session.execute(
        store.upsert(ClaimGate).values(model=model).on_conflict_do_nothing(index_elements=["model"])
    )
    query = select(ClaimGate).where(ClaimGate.model == model)
    return session.scalars(query if store.is_sqlite else query.with_for_update()).one()


def quarantine_for_claim(
    store: Store, session: Session, bed: Bed, *, model: str, reason: str
) -> str:
    """Quarantine `bed` for an unchecked claim of `model` when the model's allowance holds one;
    else pause the model. Returns what was done, for the attempt's reason."""
    gate = _gate(store, session, model)
    now = db_time(store, session)
    if gate.paused_reason is not None:
        return f"model {model} already paused for its claims: bed {bed.name} kept in service"
    window = timedelta(seconds=CLAIM_QUARANTINE_SECONDS)
    if gate.quarantined_at is None or now - gate.quarantined_at >= window:
        gate.quarantined_at, gate.quarantined_bed_id = now, bed.id
        quarantine(session, bed, [f"{reason} (a claim of {model} the farm could not check)"])
        return (
            f"bed {bed.name} quarantined (the one an unchecked claim of {model} may take an hour)"
        )
    gate.paused_reason = (
        f"{reason}: a second claim the farm could not check within "
        f"{CLAIM_QUARANTINE_SECONDS / 3600:g} h (bed {bed.name}); beds stay in service"
    )[:2000]
    gate.paused_at = now
    session.add(
        BedEvent(
            bed_id=bed.id,
            kind="claim_paused_model",
            detail=f"model {model} paused instead of this bed: {gate.paused_reason}",
        )
    )
    return f"model {model} paused for its claims; bed {bed.name} kept in service"


def paused_for_claims(store: Store, models: list[str] | None = None) -> list[dict[str, Any]]:
    """Models paused for their claims (those among `models` when given), with why and how to
    release each: what `sweep status` shows beside the provider breaker."""
    with store.read() as session:
        query = select(ClaimGate).where(ClaimGate.paused_reason.is_not(None))
        if models is not None:
            query = query.where(ClaimGate.model.in_(models))
        return [
            {
                "model": gate.model,
                "reason": gate.paused_reason,
                "since": gate.paused_at.isoformat(timespec="seconds") if gate.paused_at else None,
                "release": RELEASE_COMMAND.format(model=gate.model),
            }
            for gate in session.scalars(query.order_by(ClaimGate.model))
        ]


def release_model(store: Store, model: str) -> bool:
    """Let a model paused for its claims run again; its hourly allowance starts anew, paused or
    not. False when it was not paused."""
    with store.session() as session:
        gate = session.get(ClaimGate, model)
        if gate is None:
            return False
        paused = gate.paused_reason is not None
        gate.paused_reason, gate.paused_at, gate.quarantined_at = None, None, None
        return paused


def stopped_by_claims(store: Store, sweep_id: int) -> list[str]:
    """Why a sweep cannot go on by itself: nothing of it runs, and every queued attempt's model
    is paused for its claims (a person must release it). Empty while it may still move."""
    with store.read() as session:
        rows = session.execute(
            select(Attempt.state, Attempt.model)
            .where(
                Attempt.sweep_id == sweep_id,
                Attempt.state.in_([AttemptState.QUEUED, AttemptState.RUNNING]),
            )
            .distinct()
        ).all()
        if not rows or any(state == AttemptState.RUNNING for state, _ in rows):
            return []
        models = sorted({model for _, model in rows})
        paused = {
            gate.model: gate.paused_reason
            for gate in session.scalars(
                select(ClaimGate).where(
                    ClaimGate.model.in_(models), ClaimGate.paused_reason.is_not(None)
                )
            )
        }
    if set(models) - set(paused):
        return []
    return [
        f"model {m} paused for its claims: {paused[m]}; release it with "
        f"`{RELEASE_COMMAND.format(model=m)}`"
        for m in models
    ]
