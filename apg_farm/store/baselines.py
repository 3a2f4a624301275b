"""The baseline a bed resets to, named on each execution it claims.

The bed row carries its identity in `meta["baseline"]` (written with its escrow record,
beds/identity.py); a claim copies the key and the escrow digest onto the new execution and keeps
one `bed_baselines` row per key, so a report names a baseline whatever became of the bed since.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from apg_farm.store.models import Bed, BedBaseline

#: The bed meta key holding the identity recorded with the escrow set.
BASELINE = "baseline"


def bed_baseline(bed: Bed) -> dict[str, Any] | None:
    """The identity the bed's escrow record holds, or None (enrolled before it was recorded)."""
    found = (bed.meta or {}).get(BASELINE)
    return found if isinstance(found, dict) and isinstance(found.get("key"), str) else None


def note_baseline(session: Session, bed: Bed) -> tuple[str | None, str | None]:
    """(baseline key, escrow sha256) for an execution on `bed`, its `bed_baselines` row kept."""
    identity = bed_baseline(bed)
    if identity is None:
        return None, None
    key = str(identity["key"])[:16]
    if session.get(BedBaseline, key) is None:
        try:
            # Two claimers may meet a new key at once: one adds it, the other finds it.
            with session.begin_nested():
                session.add(
                    BedBaseline(
                        key=key,
                        set_key=str(identity.get("set_key") or "")[:64],
                        versions=identity.get("versions"),
                    )
                )
        except IntegrityError:
            pass
    escrow = identity.get("escrow_sha256")
    return key, str(escrow)[:64] if escrow else None
