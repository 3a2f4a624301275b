"""Shares: how the sweeps of one pool divide its claims, by weight (`priority`), and what they
actually got over the pool's most recent claims.

The weights act through the claim order (lifecycle.place_queued); this module only reads: each
open sweep's weight, the share its weight asks for among the sweeps that have something queued,
and its share of the pool's last SHARE_WINDOW claims (one execution per claim).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import exists, func, select

from apg_farm.specs import SweepSpec
from apg_farm.store import Attempt, AttemptState, Execution, Store, Sweep, SweepState

#: The pool's most recent claims a share is measured over.
SHARE_WINDOW = 200


def pool_shares(store: Store, pool: str, *, window: int = SHARE_WINDOW) -> list[dict[str, Any]]:
    """Each open sweep of the pool (the farm's own, oldest first): its weight, the share of
    claims its weight asks for (None when it has nothing queued), and the claims it got among
    the pool's last `window` claims. Reads a few rows per sweep and `window` executions."""
    with store.read() as session:
        sweeps = session.execute(
            select(Sweep.id, Sweep.name, Sweep.spec)
            .where(Sweep.pool == pool, Sweep.state == SweepState.OPEN, Sweep.driver.is_(None))
            .order_by(Sweep.id)
        ).all()
        if not sweeps:
            return []
        # One statement each, bounded: an EXISTS per sweep, and the last `window` claims
        # counted by sweep in the database (never the pool's history read as rows).
        waiting = set(
            session.scalars(
                select(Sweep.id).where(
                    Sweep.id.in_([sweep_id for sweep_id, _, _ in sweeps]),
                    exists().where(
                        Attempt.sweep_id == Sweep.id, Attempt.state == AttemptState.QUEUED
                    ),
                )
            )
        )
        last = (
            select(Attempt.sweep_id)
            .join(Execution, Execution.attempt_id == Attempt.id)
            .where(Attempt.pool == pool)
            .order_by(Execution.id.desc())
            .limit(window)
            .subquery()
        )
        recent: dict[int, int] = {
            sweep_id: count
            for sweep_id, count in session.execute(
                select(last.c.sweep_id, func.count()).group_by(last.c.sweep_id)
            )
        }
    weights = {sweep_id: SweepSpec.model_validate(spec).priority for sweep_id, _, spec in sweeps}
    asked = sum(weights[s] for s in waiting)
    claims = sum(recent.values())
    return [
        {
            "id": sweep_id,
            "sweep": name,
            "priority": weights[sweep_id],
            "expected_share": round(weights[sweep_id] / asked, 4) if sweep_id in waiting else None,
            "claims": recent.get(sweep_id, 0),
            "of_claims": claims,
            "claimed_share": round(recent.get(sweep_id, 0) / claims, 4) if claims else None,
        }
        for sweep_id, name, _ in sweeps
    ]


def describe_share(share: dict[str, Any]) -> str:
    """One line for `sweep status`: the weight, the share it asks for, the share it got."""
    asked = (
        f"asks {share['expected_share']:.0%} of the pool's claims"
        if share["expected_share"] is not None
        else "nothing queued"
    )
    got = (
        f"got {share['claims']} of its last {share['of_claims']} ({share['claimed_share']:.0%})"
        if share["of_claims"]
        else "no claims yet"
    )
    return f"priority {share['priority']}: {asked}; {got}"
