"""What the dashboard can change: cancel a sweep, retry its ERROR/INVALID attempts, release a
quarantined bed. Each is the lifecycle's own function (apg_farm.store), which checks its own
preconditions; the routes call these only after the session and the CSRF token were checked."""

from __future__ import annotations

from apg_farm.beds import get_bed
from apg_farm.errors import BadInput
from apg_farm.results import find_sweep
from apg_farm.scheduler import parse_retry_outcomes, pool_queue
from apg_farm.store import BedState, Store, SweepState, cancel_sweep, release_bed, retry_attempts


def cancel(store: Store, sweep_id: int) -> int:
    """`apg-farm sweep cancel`: queued attempts now (their count), running ones at their next phase."""
    sweep = find_sweep(store, str(sweep_id))
    if sweep.state == SweepState.CANCELLED:
        raise BadInput(f"sweep {sweep.name} is already cancelled")
    return cancel_sweep(store, sweep.id)


def retry(store: Store, sweep_id: int, outcomes: list[str]) -> int:
    """`apg-farm sweep retry --only …`: the chosen farm failures queued again (their count),
    history kept. The dashboard sends nothing to a broker: with workers, the reconciler (`apg-farm
    scheduler`) sends a message for every queued attempt without one; embedded, a person runs
    `apg-farm sweep resume` (the page says which)."""
    chosen = parse_retry_outcomes(",".join(outcomes))
    return retry_attempts(store, find_sweep(store, str(sweep_id)).id, chosen)


def release(store: Store, name: str) -> None:
    """`apg-farm bed release` for a quarantined bed (only those: draining or removed beds stay)."""
    bed = get_bed(store, name)
    if bed.state != BedState.QUARANTINED:
        raise BadInput(f"bed {bed.name} is {bed.state}, not quarantined", fix="nothing to release")
    row = release_bed(store, name, note="released from the dashboard")
    # Celery is imported only here.
    from apg_farm.workers import resume_consumer

    resume_consumer(pool_queue(row.pool), (row.meta or {}).get("worker"))
