"""Sending attempts to the broker. The store records each send, so lost messages can be found."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, nullcontext
from functools import partial
from itertools import islice
from typing import Any, Protocol

from sqlalchemy import select

from apg_farm.scheduler.queues import RUN_ATTEMPT, attempt_time_limits, pool_queue, task_id
from apg_farm.specs import SweepSpec
from apg_farm.store import Store, Sweep, count_dispatches

#: Attempt ids per statement: far below PostgreSQL's 65,535 bind parameters and SQLite's 32,766,
#: and a bounded batch in memory however many attempts are dispatched.
CHUNK = 5000


class Sender(Protocol):
    """The part of a Celery app that sends a task by name."""

    def send_task(self, name: str, *args: Any, **kwargs: Any) -> Any: ...


def chunks(ids: Iterable[int], size: int = CHUNK) -> Iterator[list[int]]:
    """`ids` in lists of at most `size`, read lazily (a generator is never held whole)."""
    it = iter(ids)
    while batch := list(islice(it, size)):
        yield batch


def publish_attempts(store: Store, app: Sender, attempt_ids: Iterable[int]) -> int:
    """One message per still-queued attempt of an open sweep, to its pool's queue; returns how many.

    Chunk by chunk: one UPDATE counts the dispatch in SQL (dispatches + 1, so concurrent
    dispatchers never lose a count) and returns the new count, which names the message; the
    chunk commits, then its messages go out in queue order. A send that fails after the commit
    leaves attempts stamped as enqueued without a message: the reconciler finds and resends them.
    """
    sent = 0
    specs: dict[int, SweepSpec] = {}
    for batch in chunks(attempt_ids):
        rows = store.retrying(partial(_count_dispatch, store, batch))
        if not rows:
            continue
        _load_specs(store, specs, {row.sweep_id for row in rows})
        with _producer(app) as producer:
            extra = {} if producer is None else {"producer": producer}
            for row in sorted(rows, key=lambda r: (r.seq, r.id)):
                soft, hard = attempt_time_limits(specs[row.sweep_id])
                app.send_task(
                    RUN_ATTEMPT,
                    args=(row.id,),
                    queue=pool_queue(row.pool),
                    task_id=task_id(row.id, row.dispatches),
                    soft_time_limit=soft,
                    time_limit=hard,
                    **extra,
                )
                sent += 1
    return sent


def _count_dispatch(store: Store, ids: list[int]) -> list[Any]:
    """Count one more dispatch of each still-queued attempt in `ids`; their rows, committed."""
    with store.session() as session:
        return count_dispatches(store, session, ids)


def _load_specs(store: Store, specs: dict[int, SweepSpec], sweep_ids: set[int]) -> None:
    missing = sweep_ids - specs.keys()
    if not missing:
        return
    with store.read() as session:
        for sweep_id, spec in session.execute(
            select(Sweep.id, Sweep.spec).where(Sweep.id.in_(missing))
        ):
            specs[sweep_id] = SweepSpec.model_validate(spec)


def _producer(app: Sender) -> AbstractContextManager[Any]:
    # A Celery app lends one producer (one broker connection) for a whole chunk: without it each
    # send acquires and releases its own.
    acquire = getattr(app, "producer_or_acquire", None)
    return acquire() if callable(acquire) else nullcontext(None)
