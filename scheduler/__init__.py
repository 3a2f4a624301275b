"""The scheduler: making work and sending it.

`plan` expands a sweep into attempt keys and `submit` stores them (`estimate` says beforehand
what they would cost and take, from earlier executions); `queues` names the broker's
queues and tasks and `publish` sends attempts to them; `shares` reads how a pool's sweeps divide its claims by weight; `window` keeps each pool's queue to a
few messages, topped up in claim order; `reconciler` (with `broker_view`) makes the broker match
the store again; `control` reports status and which workers are alive (their heartbeats). Imports results, store and contract; never workers.
"""

from __future__ import annotations

from apg_farm.scheduler.control import (
    WorkerSeen,
    live_workers,
    parse_retry_outcomes,
    store_now,
    sweep_status,
    worker_beats,
)
from apg_farm.scheduler.estimate import PairEstimate, Spread, SweepEstimate, Total, estimate_sweep
from apg_farm.scheduler.plan import expand
from apg_farm.scheduler.power_plan import PowerPlan, check_flags, plan_power
from apg_farm.scheduler.publish import Sender, publish_attempts
from apg_farm.scheduler.queues import (
    BED_MAINTENANCE,
    HEARTBEAT_SECONDS,
    LIVE_WITHIN,
    MAINTENANCE_EXPIRY,
    RUN_ATTEMPT,
    attempt_of,
    attempt_time_limits,
    bed_queue,
    maintenance_time_limits,
    pool_queue,
    task_id,
)
from apg_farm.scheduler.reconciler import Reconciliation, reconcile
from apg_farm.scheduler.shares import SHARE_WINDOW, describe_share, pool_shares
from apg_farm.scheduler.submission import Submission, submit
from apg_farm.scheduler.window import WINDOW_PER_BED, Window, top_up, window_size

__all__ = [
    "BED_MAINTENANCE",
    "HEARTBEAT_SECONDS",
    "LIVE_WITHIN",
    "MAINTENANCE_EXPIRY",
    "RUN_ATTEMPT",
    "SHARE_WINDOW",
    "WINDOW_PER_BED",
    "PairEstimate",
    "PowerPlan",
    "Reconciliation",
    "Sender",
    "Spread",
    "Submission",
    "SweepEstimate",
    "Total",
    "Window",
    "WorkerSeen",
    "attempt_of",
    "attempt_time_limits",
    "bed_queue",
    "check_flags",
    "describe_share",
    "estimate_sweep",
    "expand",
    "live_workers",
    "maintenance_time_limits",
    "parse_retry_outcomes",
    "plan_power",
    "pool_queue",
    "pool_shares",
    "publish_attempts",
    "reconcile",
    "store_now",
    "submit",
    "sweep_status",
    "task_id",
    "top_up",
    "window_size",
    "worker_beats",
]
