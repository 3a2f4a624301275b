"""The bed registry: enrolling, listing, releasing beds."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import select

from apg_farm.beds.fingerprints import record_ddev_config
from apg_farm.contract import bed_environment, check_arg
from apg_farm.defaults import DEFAULT_FIXTURES
from apg_farm.errors import BadInput, NotFound
from apg_farm.specs import NAME, pool_key
from apg_farm.store import Bed, BedEvent, BedState, Store


@dataclass(frozen=True)
class NewBed:
    """A local bed as the user describes it to `bed add`."""

    name: str
    approot: Path
    ddev: str = "ddev"
    fixtures: tuple[str, ...] = DEFAULT_FIXTURES
    escrow_set: Path | None = None
    env: tuple[tuple[str, str], ...] = ()
    #: No escrow set, on purpose: verified by the agent-writable ddev wrapper; reports say so.
    untrusted_verifier: bool = False
    #: No web container: every command runs on the host (simulated beds in their host mode).
    host_only: bool = False


def _resolve_ddev(ddev: str) -> str:
    if "/" in ddev:
        path = Path(ddev).expanduser().resolve()
        if not path.is_file() or not os.access(path, os.X_OK):
            raise BadInput(
                f"{ddev} is not an executable file", field="--ddev", fix="give the path of ddev"
            )
        return str(path)
    found = shutil.which(ddev)
    if found is None:
        raise BadInput(
            f"{ddev!r} is not on PATH",
            field="--ddev",
            fix="install DDEV or give --ddev /path/to/ddev",
        )
    return found


def validate_new_bed(bed: NewBed) -> Bed:
    """Check everything about a bed before it is stored; every error names the flag to change."""
    if not NAME.fullmatch(bed.name):
        raise BadInput(
            f"{bed.name!r} is not a bed name",
            field="NAME",
            fix="use letters, digits, '.', '_', '-'",
        )
    approot = bed.approot.expanduser()
    if not approot.is_dir():
        raise NotFound(
            f"{approot} is not a directory",
            field="--approot",
            fix="give the bed's DDEV project folder",
        )
    approot = approot.resolve()
    check_arg("--approot", str(approot))
    if not bed.fixtures:
        raise BadInput(
            "no fixtures given", field="--fixtures", fix="e.g. --fixtures kb_docs,canvas_home"
        )
    fixtures = [check_arg("--fixtures", f) for f in bed.fixtures]
    check_untrusted(bed.escrow_set is not None, bed.untrusted_verifier)
    escrow = None
    if bed.escrow_set is not None:
        escrow_path = bed.escrow_set.expanduser().resolve()
        if not (escrow_path / "escrow-verify.sh").is_file():
            raise BadInput(
                f"{escrow_path} has no escrow-verify.sh",
                field="--escrow-set",
                fix="give the path `ddev ai-eval-escrow` printed",
            )
        if escrow_path == approot or approot in escrow_path.parents:
            raise BadInput(
                f"{escrow_path} is inside the bed's project, where the agent can rewrite it",
                field="--escrow-set",
                fix="escrow to a folder outside the project (AI_PG_ESCROW_DIR)",
            )
        escrow = check_arg("--escrow-set", str(escrow_path))
    env = dict(bed.env)
    bed_environment(base={}, extra=env)  # refuses credential-shaped or malformed names
    return Bed(
        name=bed.name,
        transport="local",
        approot=str(approot),
        ddev=_resolve_ddev(bed.ddev),
        fixtures=fixtures,
        pool=pool_key(fixtures),
        escrow_set=escrow,
        env=env,
        untrusted_verifier=bed.untrusted_verifier,
        web_container=not bed.host_only,
        state=BedState.ACTIVE,
    )


def check_untrusted(has_escrow: bool, untrusted_verifier: bool) -> None:
    """An escrow set and --untrusted-verifier contradict each other."""
    if has_escrow and untrusted_verifier:
        raise BadInput(
            "--untrusted-verifier with an escrow set",
            field="--untrusted-verifier",
            fix="drop it: a bed with an escrow set is verified by its trusted verifier",
        )


def add_bed(store: Store, bed: NewBed) -> Bed:
    """Enrol a bed; a name already taken is an error, not an update."""
    row = validate_new_bed(bed)
    store_new_bed(store, row, detail=f"{row.approot} pool={row.pool}")
    if row.untrusted_verifier:
        record_ddev_config(store, row)
    return row


def store_new_bed(store: Store, row: Bed, *, detail: str) -> None:
    """Insert a validated bed row with its "added" event; a name already taken is refused."""
    with store.session() as session:
        if session.scalar(select(Bed.id).where(Bed.name == row.name)) is not None:
            raise BadInput(
                f"a bed named {row.name!r} exists", field="NAME", fix="choose another name"
            )
        session.add(row)
        session.flush()
        session.add(BedEvent(bed_id=row.id, kind="added", detail=detail))
        session.expunge(row)


def get_bed(store: Store, name: str) -> Bed:
    with store.session() as session:
        row = session.scalar(select(Bed).where(Bed.name == name))
        if row is None:
            raise NotFound(f"no bed named {name!r}", fix="see `apg-farm bed list`")
        session.expunge(row)
        return row


def list_beds(store: Store) -> list[Bed]:
    with store.session() as session:
        rows = list(session.scalars(select(Bed).order_by(Bed.name)))
        session.expunge_all()
        return rows


def record_event(store: Store, bed_id: int, kind: str, detail: str) -> None:
    with store.session() as session:
        session.add(BedEvent(bed_id=bed_id, kind=kind, detail=detail))
