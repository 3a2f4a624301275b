"""The store: SQLAlchemy models, migrations and the session factory."""

from __future__ import annotations

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
    utcnow,
)

__all__ = [
    "Attempt",
    "AttemptState",
    "Base",
    "Bed",
    "BedEvent",
    "BedState",
    "Execution",
    "Phase",
    "Store",
    "Sweep",
    "SweepState",
    "normalize_url",
    "rowcount",
    "utcnow",
]
