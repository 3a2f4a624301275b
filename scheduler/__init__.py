"""The scheduler: making work and sending it.

`plan` expands a sweep into attempt keys and `submit` stores them; `queues` names the broker's
queues and tasks and `publish` sends attempts to them; `reconciler` (with `broker_view`) makes the
broker match the store again; `control` cancels, retries and reports status. Imports results,
store and contract; never workers.
"""

from __future__ import annotations

from scheduler.control import cancel_sweep, parse_retry_outcomes, retry_attempts, sweep_status
from scheduler.plan import expand
from scheduler.publish import Sender, publish_attempts
from scheduler.queues import (
    BED_MAINTENANCE,
    RUN_ATTEMPT,
    attempt_of,
    attempt_time_limits,
    bed_queue,
    pool_queue,
    task_id,
)
from scheduler.reconciler import Reconciliation, reconcile
from scheduler.submission import Submission, submit

__all__ = [
    "BED_MAINTENANCE",
    "RUN_ATTEMPT",
    "Reconciliation",
    "Sender",
    "Submission",
    "attempt_of",
    "attempt_time_limits",
    "bed_queue",
    "cancel_sweep",
    "expand",
    "parse_retry_outcomes",
    "pool_queue",
    "publish_attempts",
    "reconcile",
    "retry_attempts",
    "submit",
    "sweep_status",
    "task_id",
]
