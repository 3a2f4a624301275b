"""How far a sweep has got, for the progress bars of both modes, and what its beds run now."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console, RenderableType
    from rich.progress import Progress

    from apg_farm.store import Store


def done_count(store: Store, sweep_id: int) -> tuple[int, int]:
    """(attempts with an outcome, all attempts) of the sweep."""
    from sqlalchemy import func, select

    from apg_farm.store import Attempt, AttemptState

    with store.read() as session:
        total = session.scalar(
            select(func.count()).select_from(Attempt).where(Attempt.sweep_id == sweep_id)
        )
        done = session.scalar(
            select(func.count())
            .select_from(Attempt)
            .where(Attempt.sweep_id == sweep_id, Attempt.state == AttemptState.DONE)
        )
    return done or 0, total or 0


class RunningBeds:
    """What each bed of a run is doing now, for under `run`'s bar, as `sweep status --watch`
    shows it: re-read from the store at most every `every` seconds (the bar redraws ten times a
    second), nothing once the run is over (a last frame must not show attempts long done)."""

    def __init__(self, store: Store, sweep_id: int, every: float = 2.0) -> None:
        self.store, self.sweep_id, self.every = store, sweep_id, every
        self.rows: list[dict[str, Any]] = []
        self.read_at = -every
        self.over = False

    def table(self) -> RenderableType | None:
        from sqlalchemy.exc import SQLAlchemyError

        from apg_farm.results import running_table, watch_snapshot

        if self.over:
            return None
        if time.monotonic() - self.read_at >= self.every:
            self.read_at = time.monotonic()
            # The store not answering this time: the last rows stay, the run goes on.
            with contextlib.suppress(SQLAlchemyError):
                self.rows = watch_snapshot(self.store, self.sweep_id)["running"]
        return running_table(self.rows) if self.rows else None


def run_progress(beds: RunningBeds, *columns: Any, console: Console) -> Progress:
    """A Rich progress bar with the running attempts per bed under it."""
    from rich.progress import Progress

    class _WithBeds(Progress):
        def get_renderables(self) -> Iterable[RenderableType]:
            yield self.make_tasks_table(self.tasks)
            table = beds.table()
            if table is not None:
                yield table

    return _WithBeds(*columns, console=console, transient=False)
