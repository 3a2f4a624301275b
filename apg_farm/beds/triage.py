"""Which beds need a person first, the order `apg-farm bed list` and the dashboard's beds page
share: quarantined, stuck (it holds a running attempt whose lease ran out: its worker died or
hangs), failing (failures in a row, or a canary that was not healthy), out of the pool for a
while (draining, upgrading), then busy, idle and, last, removed beds."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select

from apg_farm.store import HEALTHY, Attempt, AttemptState, Bed, BedState, Store, utcnow

#: A bed's rank by what it needs (lower: sooner), and the word shown for a problem.
QUARANTINED, STUCK, FAILING, OUT, BUSY, IDLE, GONE = range(7)
PROBLEMS = {QUARANTINED: "quarantined", STUCK: "stuck", FAILING: "failing"}
#: What `--sort` accepts besides the default (problems first).
SORT_KEYS = ("problem", "name", "state", "host", "pool", "failures")


def triage_rank(
    state: str,
    *,
    stuck: bool,
    failures: int,
    canary_result: str | None,
    running: bool,
) -> int:
    """The bed's rank: QUARANTINED first, GONE (removed) last."""
    if state == BedState.QUARANTINED:
        return QUARANTINED
    if state == BedState.REMOVED:
        return GONE
    if stuck:
        return STUCK
    if failures > 0 or (canary_result is not None and canary_result != HEALTHY):
        return FAILING
    if state != BedState.ACTIVE:
        return OUT
    return BUSY if running else IDLE


def problem_of(rank: int) -> str | None:
    """ "quarantined", "stuck" or "failing"; None for a bed that needs nobody."""
    return PROBLEMS.get(rank)


def stuck_beds(store: Store, *, now: datetime | None = None) -> dict[str, float]:
    """Beds holding a running attempt whose lease expired, with the seconds since it did."""
    now = now or utcnow()
    with store.read() as session:
        rows = session.execute(
            select(Bed.name, Attempt.lease_expires_at)
            .join(Bed, Bed.id == Attempt.bed_id)
            .where(
                Attempt.state == AttemptState.RUNNING,
                Attempt.lease_expires_at.is_not(None),
                Attempt.lease_expires_at < now,
            )
        ).all()
    found: dict[str, float] = {}
    for name, expired in rows:
        if expired is None:  # excluded by the query; kept for the type
            continue
        found[name] = max(found.get(name, 0.0), (now - expired).total_seconds())
    return found
