"""The escrow set on the bed's host: made once, its files' sha256 recorded, checked before each attempt.

The trusted verifier is only as trustworthy as the folder it lives in. The farm records the sha256
of every file of the set when it enrols it; before each attempt one command on the bed's host
hashes the set again, and a bed whose set changed is quarantined before anything else runs there.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath

from sqlalchemy import select

from apg_farm import contract
from apg_farm.beds.maintenance import run_escrow
from apg_farm.contract import ESCROW_SET_MISSING, bed_environment
from apg_farm.errors import ContractViolation, FarmError, NotFound
from apg_farm.store import Bed, BedEvent, Store, utcnow
from apg_farm.transports import CommandResult, Transport, host_environment, transport_in_use

#: The verifier's file name inside an escrow set (APG README, "Unattended runs").
VERIFIER = "escrow-verify.sh"
#: Exit code of the hash command when the escrow set's folder is gone.
SET_MISSING = ESCROW_SET_MISSING
#: Hash value recorded for something in the set that is not a regular file (a symlink, a FIFO).
NOT_A_FILE = "not-a-file"
#: Seconds the hash command may take at enrolment (a set holds a database dump).
HASH_TIMEOUT = 300.0

# POSIX sh + find + sha256sum: everything in the set, one line per entry, files hashed.
HASH_SCRIPT = (
    'cd -- "$1" 2>/dev/null || { echo "escrow set $1 is missing" >&2; exit 3; }\n'
    "find . ! -type d ! -type f -exec printf 'not-a-file  %s\\n' {} + "
    "&& find . -type f -exec sha256sum -- {} +\n"
)

_HASH_LINE = re.compile(r"\\?([0-9a-f]{64}|not-a-file)  (.+)")


def escrow_hash_argv(escrow_set: str) -> tuple[str, ...]:
    """The one command that hashes every file of the set on the bed's host."""
    return ("/bin/sh", "-c", HASH_SCRIPT, "apg-farm-escrow-hash", escrow_set)


def read_hashes(result: CommandResult) -> dict[str, str] | None:
    """Relative path -> sha256 (or "not-a-file") from the hash command; None when it failed."""
    if result.rc != 0 or result.transport_error or result.stdout.truncated:
        return None
    found: dict[str, str] = {}
    for line in result.stdout.text().splitlines():
        match = _HASH_LINE.fullmatch(line)
        if match is None:
            return None
        name = match.group(2)
        found[name[2:] if name.startswith("./") else name] = match.group(1)
    return found


def changes(recorded: Mapping[str, str], current: Mapping[str, str]) -> list[str]:
    """What differs, one phrase per file: `escrow-verify.sh changed`, `x added`, `y removed`."""
    found = []
    for name in sorted(set(recorded) | set(current)):
        if name not in current:
            found.append(f"{name} removed")
        elif name not in recorded:
            found.append(f"{name} added")
        elif recorded[name] != current[name]:
            found.append(f"{name} changed")
    return found


def escrow_changes_in(recorded: Mapping[str, str], result: CommandResult) -> list[str] | None:
    """The changes the hash command shows against the recorded hashes; None when it failed."""
    current = read_hashes(result)
    return None if current is None else changes(recorded, current)


@dataclass(frozen=True)
class EscrowRecord:
    """An escrow set as the farm recorded it."""

    path: str
    files: dict[str, str]


def hash_escrow_set(bed: Bed, escrow_set: str, *, transport: Transport) -> dict[str, str]:
    """Hash the set on the bed's host now; raises FarmError when that fails."""
    result = transport.run(
        escrow_hash_argv(escrow_set),
        cwd="/",
        env=bed_environment(base=host_environment(transport), extra=dict(bed.env)),
        timeout=HASH_TIMEOUT,
        stdout_limit=4 << 20,
        stderr_limit=1 << 16,
    )
    files = read_hashes(result)
    if files is None:
        why = result.transport_error or (
            "timed out" if result.timed_out else result.stderr.text().strip()[:300]
        )
        raise FarmError(f"cannot hash escrow set {escrow_set} on bed {bed.name}: {why}")
    if files.get(VERIFIER, NOT_A_FILE) == NOT_A_FILE:
        raise ContractViolation(
            f"escrow set {escrow_set} of bed {bed.name} has no regular {VERIFIER}",
            fix="give the path `ddev ai-eval-escrow` printed",
        )
    return files


def _outside_project(bed: Bed, escrow_set: str) -> str:
    path = contract.check_arg("escrow set", escrow_set)
    root = PurePosixPath(bed.approot)
    if (
        not path.startswith("/")
        or PurePosixPath(path) == root
        or root in PurePosixPath(path).parents
    ):
        raise ContractViolation(
            f"bed {bed.name}: escrow set {path} is inside the project (or not absolute), where the "
            "agent can rewrite it",
            fix="set AI_PG_ESCROW_DIR to a folder outside the project and escrow again",
        )
    return path.rstrip("/")


def record_escrow_set(
    store: Store, bed: Bed, escrow_set: str, *, transport: Transport | None = None
) -> EscrowRecord:
    """Record an existing escrow set: its absolute path and the sha256 of every file in it."""
    path = _outside_project(bed, escrow_set)
    with transport_in_use(bed, transport) as used:
        files = hash_escrow_set(bed, path, transport=used)
    with store.session() as session:
        row = session.scalar(select(Bed).where(Bed.id == bed.id).with_for_update())
        if row is None:
            raise NotFound(f"no bed named {bed.name!r}", fix="see `apg-farm bed list`")
        row.escrow_set = path
        row.escrow_files = files
        row.escrow_recorded_at = utcnow()
        session.add(BedEvent(bed_id=row.id, kind="escrow", detail=f"{path} ({len(files)} files)"))
    return EscrowRecord(path, files)


def enrol_escrow(
    store: Store, bed: Bed, *, force: bool = False, transport: Transport | None = None
) -> EscrowRecord:
    """Run `ddev ai-eval-escrow` on the bed's host, then record the set it printed."""
    with transport_in_use(bed, transport) as used:
        path = run_escrow(bed, force=force, transport=used)
        return record_escrow_set(store, bed, path, transport=used)
