"""The store, the farm's truth: tables, migrations, sessions, and the claims and leases on them.

`models` are the tables, `db` opens a store (SQLite in WAL mode or PostgreSQL) and migrates it
(`migrations/`), `claims` is how a bed takes an attempt and keeps it. Imports contract.
"""

from __future__ import annotations

from apg_farm.store.claims import (
    HAND_BACK_LIMIT,
    Claim,
    claim_next,
    renew_lease,
    requeue_expired,
)
from apg_farm.store.db import Store, normalize_url, rowcount
from apg_farm.store.models import (
    Attempt,
    AttemptState,
    Base,
    Bed,
    BedEvent,
    BedState,
    Execution,
    Phase,
    Sweep,
    SweepState,
    UTCDateTime,
    WorkerBeat,
    utcnow,
)

__all__ = [
    "HAND_BACK_LIMIT",
    "Attempt",
    "AttemptState",
    "Base",
    "Bed",
    "BedEvent",
    "BedState",
    "Claim",
    "Execution",
    "Phase",
    "Store",
    "Sweep",
    "SweepState",
    "UTCDateTime",
    "WorkerBeat",
    "claim_next",
    "normalize_url",
    "renew_lease",
    "requeue_expired",
    "rowcount",
    "utcnow",
]
