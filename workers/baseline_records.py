"""What a bed's baseline recorded in `beds.meta` (its git repository, the folders reset keeps, its
other files), read and, for a bed enrolled before the farm recorded one, kept at its first reset.

Shared by the steps before each run that put the bed back to its baseline (git_isolation.py,
kept_paths.py, worktree.py): each reads its record under its own key, and a step that cannot put
the bed back fails the attempt as the bed's (`bed_failed`), never the model's.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from apg_farm.contract import Verdict
from apg_farm.store import Bed, BedEvent, Store


def bed_failed(reason: str) -> Verdict:
    """Before the agent: retried on another bed, this bed quarantined with the reason."""
    return Verdict("retry", reason, quarantine=reason)


def recorded(store: Store, bed_id: int, key: str) -> object:
    """`beds.meta[key]` (None when the bed or the key is gone)."""

    def read() -> dict[str, Any]:
        with store.read() as session:
            row = session.get(Bed, bed_id)
            return (row.meta or {}) if row is not None else {}

    # Retried like every engine read: a dropped connection is no reason to fail the attempt.
    return store.retrying(read).get(key)


def remember(store: Store, bed_id: int, key: str, value: object, kind: str, detail: str) -> None:
    """Keep `value` as `beds.meta[key]`, first read at a reset, with a bed event saying so."""

    def write() -> None:
        with store.session() as session:
            row = session.scalar(select(Bed).where(Bed.id == bed_id).with_for_update())
            if row is None:
                return
            row.meta = {**(row.meta or {}), key: value}
            session.add(BedEvent(bed_id=bed_id, kind=kind, detail=detail))

    store.retrying(write)


__all__ = ["bed_failed", "recorded", "remember"]
