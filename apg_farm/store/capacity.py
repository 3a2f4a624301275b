"""How much of a pool can run: its beds by state, and the warning a person must see (#31, part 5).

`demo --faults` ran on 1 of 4 beds, 3 quarantined, without a word. Every place that runs or
prices a sweep (`run`, `demo`, `sweep resume`, `sweep status --watch`, the dry run, the
dashboard) says so when some of the pool's beds are out: "running on 1 of 4 beds of pool demo:
3 quarantined". Removed beds are gone from the pool, not out of it: they are not counted.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from apg_farm.store.models import Bed, BedState


@dataclass(frozen=True)
class Capacity:
    """A pool's beds by state (removed ones left out)."""

    pool: str
    states: dict[str, int]

    @property
    def active(self) -> int:
        return self.states.get(BedState.ACTIVE, 0)

    @property
    def total(self) -> int:
        return sum(self.states.values())

    def warning(self) -> str | None:
        """'running on 1 of 4 beds of pool p: 3 quarantined', or None when every bed is in."""
        out = {state: count for state, count in self.states.items() if state != BedState.ACTIVE}
        if not out:
            return None
        why = ", ".join(f"{count} {state}" for state, count in sorted(out.items()))
        return f"running on {self.active} of {self.total} beds of pool {self.pool}: {why}"


def from_states(pool: str, states: Iterable[str]) -> Capacity:
    """A Capacity from the states of a pool's beds (removed ones dropped)."""
    counts = Counter(str(s) for s in states if s != BedState.REMOVED)
    return Capacity(pool, dict(counts))


def pool_capacity(session: Session, pool: str) -> Capacity:
    """The pool's beds by state, one grouped query."""
    rows = session.execute(
        select(Bed.state, func.count())
        .where(Bed.pool == pool, Bed.state != BedState.REMOVED)
        .group_by(Bed.state)
    )
    return Capacity(pool, {str(state): int(count) for state, count in rows})
