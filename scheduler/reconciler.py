"""The reconciler: makes the broker match the store (the truth) again.

It returns attempts whose lease expired to the queue, then tops each pool's queue up to its
window (window.py): a message for the next queued attempts in claim order that have none (never
sent, lost with a restarted or emptied Redis, or dropped by a worker that died). Extra messages
are harmless: a claim that matches nothing is a no-op.

A pass costs what is in flight, not the history: expired leases are found through the index on
(state, seq, id), each pool's window reads at most its window of queued attempts through the claim
index (pool, state, seq), and the broker is read only for a pool that has something to send.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from apg_farm.scheduler.publish import Sender
from apg_farm.scheduler.window import WINDOW_PER_BED, Window, top_up
from apg_farm.settings import load_settings
from apg_farm.store import Store, requeue_expired


@dataclass(frozen=True)
class Reconciliation:
    """What one pass did."""

    expired: int
    resent: int
    #: The pools whose queue was looked at (those with something to send), after the pass.
    windows: tuple[Window, ...] = field(default=())

    def describe(self) -> str:
        return f"{self.expired} expired leases returned, {self.resent} messages sent"

    def pass_line(self) -> str:
        """What the pass did, pool by pool: the scheduler logs one such line per pass."""
        pools = "; ".join(
            f"pool {w.pool}: {w.sent} sent, {w.waiting} waiting of a window of {w.size}"
            for w in self.windows
        )
        return f"{self.describe()}; " + (pools or "no pool had anything to send")


def reconcile(
    store: Store,
    app: Sender,
    broker_url: str,
    *,
    unacked_grace: float = 60.0,
    per_bed: int | None = None,
) -> Reconciliation:
    """One pass: expired leases back to the queue, then every open pool's window topped up.

    `per_bed` is the window per active bed (APG_FARM_WINDOW_PER_BED when not given)."""
    expired = store.retrying(lambda: requeue_expired(store))
    if per_bed is None:
        per_bed = _per_bed()
    windows = top_up(store, app, broker_url, per_bed=per_bed, unacked_grace=unacked_grace)
    return Reconciliation(expired, sum(w.sent for w in windows), tuple(windows))


def _per_bed() -> int:
    try:
        return load_settings().window_per_bed
    except Exception:
        # A reconciler must not stop for a setting it can do without: the default window.
        return WINDOW_PER_BED
