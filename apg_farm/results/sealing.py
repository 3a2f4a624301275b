"""Sealed evidence: a manifest with the sha256 of every stored artifact of a sweep.

Artifacts are the sweep record, each attempt's record, each execution's run record and verbatim
envelope, and each phase's record, stdout and stderr. Their names say where they are, e.g.
`attempt[dv01_view_build|anthropic/claude-sonnet-5-5|3]/execution[1]/envelope`. The manifest's own
sha256 is kept in `sweeps.seal_sha256`; a sealed sweep takes no new executions.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from apg_farm import __version__
from apg_farm.errors import BadInput
from apg_farm.settings import load_settings
from apg_farm.store import Attempt, AttemptState, Bed, Execution, Phase, Store, Sweep, utcnow

FORMAT = "apg-farm-seal/1"

#: Rows read at a time while hashing.
_BATCH = 200


class SealedSweep(BadInput):
    """The sweep is sealed: its evidence is closed and it takes no new executions."""


def refuse_if_sealed(sweep: Sweep) -> None:
    """Raise SealedSweep when `sweep` is sealed; submit and retry call it before adding work."""
    if sweep.sealed_at is not None:
        raise SealedSweep(
            f"sweep {sweep.name!r} is sealed "
            f"({sweep.sealed_at.isoformat(timespec='seconds')}): it takes no new executions",
            fix="submit the file under a new sweep name; a seal keeps its evidence closed",
        )


def seal_directory() -> Path:
    """Where manifests go unless the user chooses: `$APG_FARM_HOME/seals`."""
    return load_settings().home / "seals"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _record(value: dict[str, Any]) -> str:
    """sha256 of a record's canonical JSON (sorted keys, datetimes as ISO 8601 UTC)."""

    def default(obj: object) -> str:
        if isinstance(obj, datetime):
            return obj.isoformat()
        raise TypeError(f"cannot seal a {type(obj).__name__}")

    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=default)
    return _sha(text.encode("utf-8"))


def artifacts(store: Store, sweep_id: int) -> dict[str, str]:
    """Every stored artifact of the sweep, by name, with its sha256."""
    with store.session() as session:
        return session_artifacts(session, sweep_id)


def session_artifacts(session: Session, sweep_id: int) -> dict[str, str]:
    """`artifacts`, read in the caller's transaction (the seal holds the sweep row meanwhile)."""
    out: dict[str, str] = {}
    sweep = session.get_one(Sweep, sweep_id)
    out["sweep"] = _record(
        {
            "name": sweep.name,
            "spec": sweep.spec,
            "spec_sha256": sweep.spec_sha256,
            "created_at": sweep.created_at,
        }
    )
    attempts = {
        a.id: a for a in session.scalars(select(Attempt).where(Attempt.sweep_id == sweep_id)).all()
    }
    names = {}
    for attempt in attempts.values():
        name = f"attempt[{attempt.task}|{attempt.model}|{attempt.trial}]"
        names[attempt.id] = name
        out[name] = _record(
            {
                "state": attempt.state,
                "outcome": attempt.outcome,
                "reason": attempt.reason,
                "infra_failures": attempt.infra_failures,
                "finished_at": attempt.finished_at,
            }
        )
    executions = session.execute(
        select(Execution, Bed.name)
        .join(Attempt, Attempt.id == Execution.attempt_id)
        .join(Bed, Bed.id == Execution.bed_id)
        .where(Attempt.sweep_id == sweep_id)
        # Streamed: a big sweep holds gigabytes of envelopes and outputs, hashed one at a time.
        .execution_options(yield_per=_BATCH)
    )
    exec_names = {}
    for execution, bed in executions:
        name = f"{names[execution.attempt_id]}/execution[{execution.number}]"
        exec_names[execution.id] = name
        out[name] = _record(
            {
                "bed": bed,
                "worker": execution.worker,
                "started_at": execution.started_at,
                "finished_at": execution.finished_at,
                "run_id": execution.run_id,
                "result": execution.result,
                "reason": execution.reason,
                "score": execution.score,
                "max_score": execution.max_score,
                "envelope_sha256": execution.envelope_sha256,
                "bed_seconds": execution.bed_seconds,
            }
        )
        if execution.envelope is not None:
            out[f"{name}/envelope"] = _sha(bytes(execution.envelope))
    phases = session.scalars(
        select(Phase)
        .join(Execution, Execution.id == Phase.execution_id)
        .join(Attempt, Attempt.id == Execution.attempt_id)
        .where(Attempt.sweep_id == sweep_id)
        .order_by(Phase.execution_id, Phase.id)
        .execution_options(yield_per=_BATCH)
    )
    position: dict[int, int] = {}
    for phase in phases:
        position[phase.execution_id] = position.get(phase.execution_id, 0) + 1
        name = (
            f"{exec_names[phase.execution_id]}/phase[{position[phase.execution_id]}:{phase.name}]"
        )
        out[name] = _record(
            {
                "argv": phase.argv,
                "rc": phase.rc,
                "exit_code": phase.exit_code,
                "tokens": phase.tokens,
                "started_at": phase.started_at,
                "finished_at": phase.finished_at,
                "duration": phase.duration,
                "timed_out": phase.timed_out,
                "transport_error": phase.transport_error,
                "stdout_bytes": phase.stdout_bytes,
                "stdout_truncated": phase.stdout_truncated,
                "stderr_bytes": phase.stderr_bytes,
                "stderr_truncated": phase.stderr_truncated,
            }
        )
        out[f"{name}/stdout"] = _sha(phase.stdout.encode("utf-8"))
        out[f"{name}/stderr"] = _sha(phase.stderr.encode("utf-8"))
    return dict(sorted(out.items()))


def _root(entries: dict[str, str]) -> str:
    """One digest over every (name, sha256): what the manifest vouches for, in a line."""
    return _sha("".join(f"{name}\t{sha}\n" for name, sha in sorted(entries.items())).encode())


@dataclass(frozen=True)
class Sealed:
    """A sweep just sealed."""

    path: Path
    sha256: str
    artifacts: int


def seal(
    store: Store, sweep_id: int, *, directory: Path | None = None, replace: bool = False
) -> Sealed:
    """Write the manifest and record its sha256; refuse while attempts are unfinished."""
    directory = directory or seal_directory()
    with store.session() as session:
        sweep = session.scalar(select(Sweep).where(Sweep.id == sweep_id).with_for_update())
        assert sweep is not None
        if sweep.sealed_at is not None and not replace:
            raise BadInput(
                f"sweep {sweep.name!r} was sealed at {sweep.sealed_at.isoformat(timespec='seconds')}",
                fix="`apg-farm verify` checks it; `apg-farm seal --replace` reseals it deliberately",
            )
        unfinished = session.scalar(
            select(func.count())
            .select_from(Attempt)
            .where(Attempt.sweep_id == sweep_id, Attempt.state != AttemptState.DONE)
        )
        if unfinished:
            raise BadInput(
                f"sweep {sweep.name!r} has {unfinished} attempts not finished; a seal covers "
                "finished evidence only",
                fix="wait for the sweep to finish, or `apg-farm sweep cancel` it, then seal",
            )
        # Holding the sweep row: a submit or claim waits until the seal is recorded.
        entries = session_artifacts(session, sweep_id)
        now = utcnow()
        manifest = {
            "format": FORMAT,
            "algorithm": "sha256",
            "farm_version": __version__,
            "sealed_at": now.isoformat(),
            "sweep": {"id": sweep.id, "name": sweep.name, "spec_sha256": sweep.spec_sha256},
            "artifact_count": len(entries),
            "root_sha256": _root(entries),
            "artifacts": entries,
        }
        data = (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode("utf-8")
        directory.mkdir(parents=True, exist_ok=True)
        path = (directory / f"{sweep.name}.{sweep.id}.seal.json").resolve()
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(data)
        tmp.replace(path)
        digest = _sha(data)
        sweep.sealed_at = now
        sweep.seal_sha256 = digest
        sweep.meta = {
            **(sweep.meta or {}),
            "seal": {"path": str(path), "artifacts": len(entries), "root_sha256": _root(entries)},
        }
    return Sealed(path, digest, len(entries))


@dataclass
class Verification:
    """What `verify` found; `ok` when nothing is missing, changed or added."""

    manifest: Path | None
    problems: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    added: list[str] = field(default_factory=list)
    checked: int = 0

    @property
    def ok(self) -> bool:
        return not (self.problems or self.missing or self.changed or self.added)

    def lines(self) -> list[str]:
        """One line per finding, each naming the artifact."""
        return [
            *self.problems,
            *(f"missing: {name}" for name in self.missing),
            *(f"changed: {name}" for name in self.changed),
            *(f"added: {name}" for name in self.added),
        ]


def verify_seal(store: Store, sweep: Sweep, *, manifest: Path | None = None) -> Verification:
    """Recompute every artifact's sha256 and compare with the sealed manifest."""
    if sweep.sealed_at is None or sweep.seal_sha256 is None:
        raise BadInput(
            f"sweep {sweep.name!r} is not sealed", fix=f"seal it first: apg-farm seal {sweep.name}"
        )
    recorded = (sweep.meta or {}).get("seal", {}).get("path")
    path = manifest or (Path(recorded) if recorded else None)
    result = Verification(path)
    current = artifacts(store, sweep.id)
    result.checked = len(current)
    if path is None:
        result.problems.append("the store does not say where the manifest is; pass --manifest")
        return result
    try:
        data = path.read_bytes()
    except OSError as error:
        result.problems.append(f"manifest {path} cannot be read: {error.strerror or error}")
        return result
    if _sha(data) != sweep.seal_sha256:
        result.problems.append(
            f"manifest {path} changed: its sha256 is {_sha(data)}, the store recorded "
            f"{sweep.seal_sha256}"
        )
    try:
        sealed = json.loads(data)["artifacts"]
        if not isinstance(sealed, dict):
            raise TypeError("artifacts is not an object")
    except (ValueError, KeyError, TypeError) as error:
        result.problems.append(f"manifest {path} is not a seal manifest: {error}")
        return result
    result.missing = sorted(set(sealed) - set(current))
    result.added = sorted(set(current) - set(sealed))
    result.changed = sorted(n for n in set(sealed) & set(current) if sealed[n] != current[n])
    return result
