"""Evidence kept off the bed: the files an execution left under runs/, read back and checked.

workers/evidence.py moves a run folder off the bed into `<evidence dir>/<bed>/<sweep>/<attempt>/
<execution number>/` on the evidence host (the worker host for a local bed, the bed's own host
for an SSH bed) and the lifecycle records each file's path, size and sha256 here. Reading a file
back goes to that host (locally, or over the bed's transport), never follows a symlink, and
checks the bytes against the stored sha256: a changed or missing file is an error naming it.
"""

from __future__ import annotations

import hashlib
import socket
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any, NamedTuple

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from apg_farm.errors import FarmError, NotFound
from apg_farm.store.db import Store
from apg_farm.store.models import Bed, EvidenceRow, Execution
from apg_farm.transports import LocalTransport, Transport, transport_for

#: How a local bed's evidence host is named: this prefix and the worker host's name.
LOCAL_HOST = "local:"


@dataclass(frozen=True)
class EvidenceFile:
    """One kept file of an execution's evidence."""

    execution_id: int
    #: POSIX, relative to the execution's evidence folder, e.g. "runs/<run-id>/transcript.jsonl".
    path: str
    #: Bytes kept.
    size: int
    #: sha256 of the bytes kept.
    sha256: str
    #: Only the first `size` bytes of a longer file were kept.
    truncated: bool


class KeptFile(NamedTuple):
    """One file as the move copied it (the engine hands these to the lifecycle)."""

    path: str
    size: int
    sha256: str
    truncated: bool


@dataclass(frozen=True)
class Kept:
    """What one execution's evidence move kept: its folder on its host, the files, and what was
    skipped or cut (workers/evidence.py)."""

    #: None when nothing was copied (then `meta` says why, when something went wrong).
    folder: str | None
    host: str | None
    files: tuple[KeptFile, ...] = ()
    meta: dict[str, Any] = field(default_factory=dict)


def record_kept(session: Session, execution: Execution, kept: Kept) -> None:
    """Write the execution's evidence rows (called by the lifecycle with the verdict); replaces
    any rows of an earlier try of the same write."""
    execution.evidence_dir = kept.folder
    execution.evidence_host = kept.host
    execution.evidence_meta = dict(kept.meta) or None
    session.execute(delete(EvidenceRow).where(EvidenceRow.execution_id == execution.id))
    # One row a path; a path named twice keeps its last copy (the bytes on disk are the last).
    files = {item.path: item for item in kept.files}
    for item in files.values():
        session.add(
            EvidenceRow(
                execution_id=execution.id,
                path=item.path,
                size=item.size,
                sha256=item.sha256,
                truncated=item.truncated,
            )
        )


class EvidenceMissing(FarmError):
    """An evidence file the store lists is not on its evidence host (or is not a regular file)."""


class EvidenceChanged(FarmError):
    """An evidence file's bytes no longer match the sha256 recorded when it was moved off the bed."""


class EvidenceElsewhere(FarmError):
    """The evidence lives on another host than this process can read (another worker host)."""


def local_host_label() -> str:
    """The evidence host name of a local bed run on this machine."""
    return LOCAL_HOST + socket.gethostname()


def list_evidence(store: Store, execution_id: int) -> list[EvidenceFile]:
    """The execution's kept files, by path; empty when it kept none."""
    with store.read() as session:
        rows = session.scalars(
            select(EvidenceRow)
            .where(EvidenceRow.execution_id == execution_id)
            .order_by(EvidenceRow.path)
        ).all()
        return [
            EvidenceFile(r.execution_id, r.path, r.size, r.sha256, bool(r.truncated)) for r in rows
        ]


@dataclass(frozen=True)
class Location:
    """Where one execution's evidence folder is, and how to reach it."""

    execution_id: int
    folder: str
    host: str
    bed: Bed
    meta: dict[str, Any]

    @property
    def local(self) -> bool:
        return self.host.startswith(LOCAL_HOST)


def evidence_location(store: Store, execution_id: int) -> Location | None:
    """The execution's evidence folder and host; None when it kept nothing off the bed."""
    with store.read() as session:
        execution = session.get(Execution, execution_id)
        if execution is None:
            raise NotFound(f"no execution with id {execution_id}", field="execution")
        if not execution.evidence_dir or not execution.evidence_host:
            return None
        bed = session.get_one(Bed, execution.bed_id)
        session.expunge(bed)
        return Location(
            execution_id,
            execution.evidence_dir,
            execution.evidence_host,
            bed,
            dict(execution.evidence_meta or {}),
        )


def evidence_transport(location: Location) -> Transport:
    """A transport that reaches the evidence host; the caller closes it."""
    if location.local:
        if location.host != local_host_label():
            raise EvidenceElsewhere(
                f"execution {location.execution_id}'s evidence is on {location.host[len(LOCAL_HOST) :]}, "
                f"not on this host ({socket.gethostname()})",
                field="execution",
                fix="run the command on that host, or copy its folder here with `--fetch DIR` there",
            )
        return LocalTransport()
    transport = transport_for(location.bed)
    label = getattr(getattr(transport, "target", None), "label", None)
    if label is not None and label != location.host:
        transport.close()
        raise EvidenceElsewhere(
            f"execution {location.execution_id}'s evidence is on {location.host}; bed "
            f"{location.bed.name} is now reached at {label}",
            field="execution",
            fix="read it on that host, or enrol the bed there again",
        )
    return transport


def check_bytes(item: EvidenceFile, data: bytes | None, where: str) -> bytes:
    """The kept bytes when they match the record; else the typed error naming the file."""
    if data is None:
        raise EvidenceMissing(
            f"evidence file {item.path} of execution {item.execution_id} is missing from {where}",
            field="evidence",
            fix="the evidence folder was removed or changed on its host; the store keeps its sha256",
        )
    digest = hashlib.sha256(data).hexdigest()
    if len(data) != item.size or digest != item.sha256:
        raise EvidenceChanged(
            f"evidence file {item.path} of execution {item.execution_id} changed: {len(data)} "
            f"bytes, sha256 {digest[:16]}…; recorded {item.size} bytes, sha256 {item.sha256[:16]}…",
            field="evidence",
            fix="someone changed the evidence folder on its host; the store's sha256 is the record",
        )
    return data


def read_kept(transport: Transport, location: Location, item: EvidenceFile) -> bytes:
    """One kept file read on the evidence host (no symlink followed) and checked."""
    path = str(PurePosixPath(location.folder) / item.path)
    # One byte more than kept: a file grown since is changed, not cut back to match.
    data = transport.read_file(path, limit=item.size + 1)
    return check_bytes(item, data, f"{location.host}:{location.folder}")


def read_evidence(store: Store, execution_id: int, path: str, *, limit: int) -> bytes:
    """The kept bytes of one evidence file (at most `limit` of them returned), read on the
    evidence host (local, or over the bed's transport) and checked against the stored sha256;
    raises a FarmError subclass when the file is unknown, missing or changed."""
    wanted = next((f for f in list_evidence(store, execution_id) if f.path == path), None)
    if wanted is None:
        raise NotFound(
            f"execution {execution_id} kept no evidence file {path!r}",
            field="path",
            fix="see `apg-farm evidence ATTEMPT` for the files kept",
        )
    location = evidence_location(store, execution_id)
    if location is None:
        raise EvidenceMissing(f"execution {execution_id} records no evidence folder")
    transport = evidence_transport(location)
    try:
        return read_kept(transport, location, wanted)[: max(limit, 0)]
    finally:
        transport.close()
