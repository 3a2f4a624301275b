"""What the dispatcher and the workers must agree on: queue and task names, time limits, expiries,
and how often a worker says it is alive."""

from __future__ import annotations

import hashlib
import re

from apg_farm.specs import SweepSpec

#: Task names, so the dispatcher can send without importing the worker code.
RUN_ATTEMPT = "apg_farm.run_attempt"
BED_MAINTENANCE = "apg_farm.bed_maintenance"

#: Seconds the hard limit leaves above the sum of phase timeouts (claims, writes, a verify retry).
HARD_LIMIT_MARGIN = 120.0
#: Seconds between the soft limit (the task is told to stop) and the hard one (it is killed).
SOFT_LIMIT_GRACE = 60.0

#: Seconds a maintenance message may wait for its worker. The operator who sent it stops waiting
#: then; a message older than this (a dead worker back days later) is dropped, never run.
MAINTENANCE_EXPIRY = 600.0
#: Hard limit of one maintenance task: its slowest bed command at the 1 h maintenance timeout
#: (apg_farm.beds.maintenance) plus the escrow hash (5 min), plus the margin.
MAINTENANCE_HARD_LIMIT = 3600.0 + 300.0 + HARD_LIMIT_MARGIN

#: Seconds between two heartbeats of a worker process (workers/heartbeat.py).
HEARTBEAT_SECONDS = 5.0
#: A worker whose last beat is older than this (three missed beats) is taken for dead.
LIVE_WITHIN = 3 * HEARTBEAT_SECONDS


def _safe(text: str) -> str:
    # Queue names end up as Redis keys and in log lines: keep them to a tame alphabet.
    # No commas: celery -Q takes a comma-separated list, and pool keys are comma-joined fixtures.
    tame = re.sub(r"[^A-Za-z0-9._@:+-]", "_", text.replace(",", "+"))
    if tame.replace("+", ",") == text:
        return tame
    # Characters were replaced: two different names could now read the same, so name the original.
    return f"{tame}~{hashlib.sha256(text.encode()).hexdigest()[:8]}"


def pool_queue(pool: str) -> str:
    """Attempts of a pool go to one queue, so an idle bed of the pool pulls the next one."""
    return f"pool.{_safe(pool)}"


def bed_queue(bed: str) -> str:
    """Maintenance of one bed (doctor, escrow, provision) goes to that bed's own worker."""
    return f"bed.{_safe(bed)}"


def attempt_time_limits(spec: SweepSpec) -> tuple[float, float]:
    """(soft, hard) seconds for one attempt: every phase at its limit, plus a margin."""
    t = spec.timeouts
    # Under the verify limit: the escrow and DDEV checks (three), strays, verify before and
    # after, the web environment, the process listings and kills around the reset and the run
    # (about eight), the verify at baseline. Under the reset limit: the reset, a restart, the
    # reset at baseline. Under the grade limit: the diffs (three), two grades, the grade at
    # baseline. Generous: a soft limit that fires mid-attempt costs a retry.
    phases = 16 * t.verify + 3 * t.reset + t.run + 6 * t.grade
    hard = phases + HARD_LIMIT_MARGIN
    return hard - SOFT_LIMIT_GRACE, hard


def maintenance_time_limits() -> tuple[float, float]:
    """(soft, hard) seconds for one maintenance task (doctor, provision, escrow)."""
    return MAINTENANCE_HARD_LIMIT - SOFT_LIMIT_GRACE, MAINTENANCE_HARD_LIMIT


def task_id(attempt_id: int, dispatch: int) -> str:
    """A message id that names its attempt, so the reconciler can see which attempts have a message."""
    return f"attempt-{attempt_id}-{dispatch}"


def attempt_of(message_id: str) -> int | None:
    """The attempt a message id names, or None for other messages."""
    match = re.fullmatch(r"attempt-(\d+)-\d+", message_id)
    return int(match.group(1)) if match else None
