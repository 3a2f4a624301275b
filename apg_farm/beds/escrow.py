"""The escrow set on the bed's host: made once, its files' sha256 recorded, checked before each attempt.

The trusted verifier is only as trustworthy as the folder it lives in. The farm records the sha256
of every file of the set when it enrols it; before each attempt one command on the bed's host
hashes the set again, and a bed whose set changed is quarantined before anything else runs there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import PurePosixPath

from sqlalchemy import select

from apg_farm import contract
from apg_farm.beds.fingerprints import grader_hash, hash_ddev_config
from apg_farm.beds.git_baseline import GIT_BASELINE, GitBaseline, read_git_baseline
from apg_farm.beds.hashes import NOT_A_FILE, hash_now
from apg_farm.beds.identity import BaselineIdentity, read_identity
from apg_farm.beds.kept_paths import KEPT_PATHS, KeptListing, read_kept_listing
from apg_farm.beds.maintenance import run_escrow
from apg_farm.beds.web_environment import install as install_web_environment
from apg_farm.beds.worktree import WORKTREE, Worktree, read_worktree
from apg_farm.contract import ESCROW_SET_MISSING
from apg_farm.errors import ContractViolation, NotFound
from apg_farm.store import BASELINE, Bed, BedEvent, Store, utcnow
from apg_farm.transports import Transport, transport_in_use

#: The verifier's file name inside an escrow set (APG README, "Unattended runs").
VERIFIER = "escrow-verify.sh"
#: Exit code of the hash command when the escrow set's folder is gone.
SET_MISSING = ESCROW_SET_MISSING
#: Seconds the hash command may take at enrolment (a set holds a database dump).
HASH_TIMEOUT = 300.0

# POSIX sh + find + sha256sum: everything in the set, one line per entry, files hashed.
HASH_SCRIPT = (
    'cd -- "$1" 2>/dev/null || { echo "escrow set $1 is missing" >&2; exit 3; }\n'
    "find . ! -type d ! -type f -exec printf 'not-a-file  %s\\n' {} + "
    "&& find . -type f -exec sha256sum -- {} +\n"
)


def escrow_hash_argv(escrow_set: str) -> tuple[str, ...]:
    """The one command that hashes every file of the set on the bed's host."""
    return ("/bin/sh", "-c", HASH_SCRIPT, "apg-farm-escrow-hash", escrow_set)


@dataclass(frozen=True)
class EscrowRecord:
    """An escrow set as the farm recorded it, with the bed's other judging code."""

    path: str
    files: dict[str, str]
    #: The DDEV configuration's files and their sha256 (see fingerprints.py).
    ddev_files: dict[str, str] = field(default_factory=dict)
    #: The grader tree sha256 the set holds, when it holds exactly one.
    grader_tree_sha256: str | None = None
    #: The baseline the set holds: its set key and code versions (identity.py).
    identity: BaselineIdentity | None = None
    #: The bed's git repository at this baseline: refs, HEAD, .git's files (git_baseline.py).
    git: GitBaseline | None = None
    #: The folders reset keeps (private files, css/ js/ php/ styles/) at this baseline.
    kept: KeptListing | None = None
    #: The project's other files that git sees differing or untracked at this baseline.
    worktree: Worktree | None = None


def hash_escrow_set(bed: Bed, escrow_set: str, *, transport: Transport) -> dict[str, str]:
    """Hash the set on the bed's host now; raises FarmError when that fails."""
    files = hash_now(
        bed,
        escrow_hash_argv(escrow_set),
        transport=transport,
        timeout=HASH_TIMEOUT,
        what=f"escrow set {escrow_set}",
    )
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
    record = fingerprint_escrow_set(bed, escrow_set, transport=transport)
    with store.session() as session:
        row = session.scalar(select(Bed).where(Bed.id == bed.id).with_for_update())
        if row is None:
            raise NotFound(f"no bed named {bed.name!r}", fix="see `apg-farm bed list`")
        apply_escrow_record(row, record)
        detail = f"{record.path} ({len(record.files)} files, {len(record.ddev_files)} DDEV files)"
        if record.identity is not None:
            detail += f"; escrow sha256 {record.identity.escrow_sha256}"
        if record.git is not None:
            detail += f"; {record.git.label()}"
        session.add(BedEvent(bed_id=row.id, kind="escrow", detail=detail))
        if record.identity is not None:
            session.add(BedEvent(bed_id=row.id, kind="baseline", detail=record.identity.label()))
    return record


def fingerprint_escrow_set(
    bed: Bed, escrow_set: str, *, transport: Transport | None = None
) -> EscrowRecord:
    """Hash the escrow set, read its grader hash and fingerprint the DDEV configuration, now."""
    path = _outside_project(bed, escrow_set)
    with transport_in_use(bed, transport) as used:
        if bed.web_container:
            # Before the DDEV configuration is fingerprinted: the farm's own file is part of it.
            install_web_environment(bed, transport=used)
        files = hash_escrow_set(bed, path, transport=used)
        return EscrowRecord(
            path,
            files,
            ddev_files=hash_ddev_config(bed, transport=used),
            grader_tree_sha256=grader_hash(path, files, transport=used),
            identity=read_identity(path, files, transport=used),
            git=read_git_baseline(bed, transport=used),
            kept=read_kept_listing(bed, transport=used),
            worktree=read_worktree(bed, transport=used),
        )


def apply_escrow_record(row: Bed, record: EscrowRecord) -> None:
    """What the farm checks before each attempt, written onto the bed row."""
    row.escrow_set = record.path
    row.escrow_files = record.files
    row.ddev_files = record.ddev_files
    row.grader_tree_sha256 = record.grader_tree_sha256
    row.escrow_recorded_at = utcnow()
    # Each execution on the bed records this (claims.py): the baseline its attempt reset to.
    meta = {
        k: v
        for k, v in (row.meta or {}).items()
        if k not in (BASELINE, GIT_BASELINE, KEPT_PATHS, WORKTREE)
    }
    if record.identity is not None:
        meta[BASELINE] = record.identity.as_meta()
    if record.git is not None:
        # What the git clean-up before each run puts back (workers/git_isolation.py).
        meta[GIT_BASELINE] = record.git.as_meta()
    if record.kept is not None:
        # What the kept-folder check before each run compares with (workers/kept_paths.py).
        meta[KEPT_PATHS] = record.kept.as_meta()
    if record.worktree is not None:
        # What the check of the project's other files before each run compares with (worktree.py).
        meta[WORKTREE] = record.worktree.as_meta()
    row.meta = meta or None


def enrol_escrow(
    store: Store, bed: Bed, *, force: bool = False, transport: Transport | None = None
) -> EscrowRecord:
    """Run `ddev ai-eval-escrow` on the bed's host, then record the set it printed."""
    with transport_in_use(bed, transport) as used:
        path = run_escrow(bed, force=force, transport=used)
        return record_escrow_set(store, bed, path, transport=used)
