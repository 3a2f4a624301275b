"""Bare store rows for tests of the claim and its caps: no bed behind them, nothing run."""

from __future__ import annotations

from sqlalchemy.orm import Session

from apg_farm.store import Bed, Store

POOL = "canvas_home,kb_docs"


def bed_row(session: Session, name: str, pool: str = POOL) -> int:
    """An enrolled bed's row, escrowed and fingerprinted as enrolment leaves one (the claim
    refuses any other), added in `session`; its id."""
    bed = Bed(
        name=name,
        approot="/tmp/x",
        ddev="ddev",
        fixtures=pool.split(","),
        pool=pool,
        env={},
        escrow_set="/srv/escrow/x",
        escrow_files={"escrow-verify.sh": "0" * 64},
        ddev_files={},
    )
    session.add(bed)
    session.flush()
    return bed.id


def add_bed(store: Store, name: str, pool: str = POOL) -> int:
    with store.session() as session:
        return bed_row(session, name, pool)
