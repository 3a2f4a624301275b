"""Sealed evidence: a manifest with the sha256 of every stored artifact of a sweep.

Artifacts are the sweep record, each attempt's record, each execution's run record and verbatim
envelope, and each phase's record, stdout and stderr. Their names say where they are, e.g.
`attempt[dv01_view_build|anthropic/claude-sonnet-5-5|3]/execution[1]/envelope`. The manifest's own
sha256 is kept in `sweeps.seal_sha256`; a sealed sweep takes no new executions. What each record
holds is in the `*_FIELDS` tuples; the columns left out, each with why, in `NOT_SEALED`. `verify`
names every artifact missing, changed or added, and refuses a malformed manifest with a problem line.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from apg_farm import __version__
from apg_farm.errors import BadInput, FarmError
from apg_farm.settings import load_settings
from apg_farm.store import (
    Attempt,
    AttemptState,
    Bed,
    EvidenceFile,
    EvidenceMissing,
    EvidenceRow,
    Execution,
    Location,
    Phase,
    Store,
    Sweep,
    evidence_location,
    evidence_transport,
    list_evidence,
    read_kept,
    utcnow,
)
from apg_farm.transports import Transport

FORMAT = "apg-farm-seal/1"
#: The manifest's list of artifacts sealed only since a later version; a manifest without one of
#: them was made before it and is not compared on it (the manifest's own sha256 is in the store).
COVERS = "covers"
#: A re-run's kind (`<execution>/rerun_kind`, only when set): the headline rests on it.
RERUN_KIND = "rerun_kind"

#: Rows read at a time while hashing.
_BATCH = 200


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


#: The columns each record holds, by table: a record is the JSON object of these columns, and the
#: execution's record adds `bed`, the name of the bed it ran on (its `bed_id`). Each row's identity
#: is in its artifact's name: an attempt's task, model and trial; an execution's number; a phase's
#: position in its execution (its order by id) and name. An execution's envelope and a phase's
#: stdout and stderr are artifacts of their own. Changing these tuples changes every manifest's
#: digests: keep them in step with `NOT_SEALED`, `tests/results/test_seal_fields.py` and docs/analysis.md.
SWEEP_FIELDS = ("name", "spec", "spec_sha256", "created_at")
ATTEMPT_FIELDS = ("state", "outcome", "reason", "infra_failures", "finished_at")
EXECUTION_FIELDS = (
    "worker",
    "started_at",
    "finished_at",
    "run_id",
    "result",
    "reason",
    "score",
    "max_score",
    "envelope_sha256",
    "bed_seconds",
)
#: An evidence file's record (one artifact per file kept off the bed, `.../evidence[<path>]`).
EVIDENCE_FIELDS = ("size", "sha256", "truncated")
PHASE_FIELDS = (
    "argv",
    "rc",
    "exit_code",
    "tokens",
    "started_at",
    "finished_at",
    "duration",
    "timed_out",
    "transport_error",
    "stdout_bytes",
    "stdout_truncated",
    "stderr_bytes",
    "stderr_truncated",
)

#: Columns of the sealed tables left out on purpose: no verdict rests on them. Every other column
#: is sealed, and `tests/results/test_seal_fields.py` fails when a column is in neither place.
NOT_SEALED: dict[str, dict[str, str]] = {
    "sweeps": {
        "id": "a surrogate key; the manifest's `sweep.id` names the row verify reads",
        "pool": "derived from the sealed spec's fixture set; which bed ran what is sealed per "
        "execution",
        "state": "whether it takes more work: a finished sweep may still be cancelled, and an "
        "attempt a cancel cut short carries its own sealed CANCELLED outcome",
        "cancelled_at": "as `state`",
        "sealed_at": "written by the seal itself, after hashing",
        "seal_sha256": "written by the seal itself: the manifest's sha256, checked by verify",
        "meta": "written by the seal itself (the manifest's path); free-form notes",
        "budget_usd": "pacing: how far the sweep may spend, not what it evaluated (the sealed "
        "spec keeps the file's value)",
        "max_concurrent": "pacing: how fast the sweep runs a model, as `budget_usd`",
        "spent_usd": "a running total of its executions' costs, kept for the claim",
        "driver": "who claims its attempts (the farm's workers, or the Inspect harness): "
        "each execution's sealed `worker` names it too (`inspect@host:pid`), and its sealed "
        "spec's `agent` is `inspect`",
    },
    "attempts": {
        "id": "a surrogate key; an attempt is named by its task, model and trial",
        "seq": "queue order: scheduling, not evidence",
        "pool": "copied from the sweep at submit: routing",
        "deliveries": "delivery bookkeeping; a poisoned attempt's ERROR outcome and reason are "
        "sealed",
        "excluded_beds": "routing of retries; every bed an attempt ran on is sealed per execution",
        "bed_id": "lease bookkeeping: the bed holding a running attempt (cleared when done)",
        "lease_expires_at": "lease bookkeeping",
        "enqueued_at": "broker bookkeeping (distributed mode)",
        "dispatches": "broker bookkeeping (distributed mode)",
        "created_at": "when it was submitted: scheduling; its executions' times are sealed",
        "provider_failures": "retry bookkeeping: each try the provider failed is an execution, "
        "sealed with its result and reason",
        "not_before": "scheduling: a provider back-off",
    },
    "executions": {
        "id": "a surrogate key; an execution is named by its attempt and number",
        "agent_started": "whether the run phase's command was issued: the sealed phases show "
        "it (a phase named run); reports read it for the second-chance bias, no verdict",
        "evidence_dir": "where the execution's evidence folder is on its host: a folder fetched "
        "or moved is the same evidence; each file's path, size and sha256 are sealed "
        "(`evidence[<path>]`), and verify re-hashes the files where this says they are",
        "evidence_host": "as `evidence_dir`",
        "farm_error": "the traceback of a farm error, for whoever mends the farm; the verdict "
        "it caused (a re-run) and its reason are sealed",
        "evidence_meta": "what the move skipped or cut: sealed as the artifact "
        "`<execution>/evidence_meta`, added only when set, so older manifests keep their digests",
        "provenance": "strings read from the envelope when it was recorded, for reports to "
        "count; the envelope's bytes are sealed as an artifact of their own, and "
        "contract/provenance.py derives the same strings from them again",
        # Not yet sealed (#22, to decide): compare/check read them to refuse pairing across bed
        # baselines; no verdict rests on them.
        "baseline_key": "the bed's baseline (fixture-set key and code versions) when the "
        "execution ran, for compare/check to refuse pairing across baselines; no verdict",
        "escrow_sha256": "a digest of the escrow set the bed was verified against, for "
        "compare/check; the verify phases that used it are sealed",
        **dict.fromkeys(
            (
                "cost_usd",
                "input_tokens",
                "output_tokens",
                "cache_read_tokens",
                "cache_write_tokens",
                "turns",
                "adapter_status",
                "provider_trouble",
            ),
            "what the run cost and how its adapter ended, copied from the adapter's record in "
            "the bed (untrusted figures); no verdict rests on it yet. Sealing it changes every "
            "manifest's digests: it comes with a manifest version (issue #12)",
        ),
    },
    "phases": {
        "id": "a surrogate key; only its order counts, sealed as the phase's position in its name",
    },
}

#: Tables that are not a sweep's evidence. A bed row is the pool's current state, shared by every
#: sweep and changed by enrolment, escrow and quarantine; what an execution ran on is sealed as its
#: bed's name, and what a bed command saw is in its phase's record and output.
NOT_SEALED_TABLES: dict[str, str] = {
    "beds": "the pool's current state, shared by all sweeps; each execution's bed name is sealed",
    "worker_beats": "which worker processes are alive now: operations, not a sweep's evidence",
    "bed_events": "the beds' history, not a sweep's",
    "model_gates": "each model's breaker and concurrency lock now: operations, shared by sweeps",
    "claim_gates": "each model's allowance of quarantines for claims the farm could not check, and its pause: operations, shared by sweeps",
    "budgets": "the farm's spending caps: operations, shared by sweeps",
    "spend": "running spend totals of the whole farm, not a sweep's evidence",
    "bed_baselines": "the baselines beds have held, shared by sweeps; an execution names its own",
    "dataset_pins": (
        "each bed baseline's pinned dataset and task hashes, shared by sweeps; an execution's "
        "envelope (sealed) names the hashes it was graded with, and a verdict against a pin "
        "names both in its reason (sealed)"
    ),
}


def artifacts(store: Store, sweep_id: int) -> dict[str, str]:
    """Every stored artifact of the sweep, by name, with its sha256."""
    with store.read() as session:
        return session_artifacts(session, sweep_id)


def session_artifacts(session: Session, sweep_id: int) -> dict[str, str]:
    """`artifacts`, read in the caller's transaction (the seal holds the sweep row meanwhile)."""
    out: dict[str, str] = {}
    sweep = session.get_one(Sweep, sweep_id)
    out["sweep"] = _record({f: getattr(sweep, f) for f in SWEEP_FIELDS})
    attempts = session.scalars(select(Attempt).where(Attempt.sweep_id == sweep_id)).all()
    names = {}
    for attempt in attempts:
        name = f"attempt[{attempt.task}|{attempt.model}|{attempt.trial}]"
        names[attempt.id] = name
        out[name] = _record({f: getattr(attempt, f) for f in ATTEMPT_FIELDS})
    executions = session.execute(
        select(Execution, Bed.name)
        .join(Attempt, Attempt.id == Execution.attempt_id)
        # Outer: an execution whose bed row went away is sealed with `bed` null, not dropped.
        .outerjoin(Bed, Bed.id == Execution.bed_id)
        .where(Attempt.sweep_id == sweep_id)
        # Streamed: a big sweep holds gigabytes of envelopes and outputs, hashed one at a time.
        .execution_options(yield_per=_BATCH)
    )
    exec_names = {}
    for execution, bed in executions:
        name = f"{names[execution.attempt_id]}/execution[{execution.number}]"
        exec_names[execution.id] = name
        out[name] = _record({"bed": bed, **{f: getattr(execution, f) for f in EXECUTION_FIELDS}})
        if execution.envelope is not None:
            out[f"{name}/envelope"] = _sha(bytes(execution.envelope))
        if execution.evidence_meta:
            out[f"{name}/evidence_meta"] = _record(dict(execution.evidence_meta))
        if execution.rerun_kind is not None:
            out[f"{name}/{RERUN_KIND}"] = _record({RERUN_KIND: execution.rerun_kind})
    kept = session.scalars(
        select(EvidenceRow)
        .join(Execution, Execution.id == EvidenceRow.execution_id)
        .join(Attempt, Attempt.id == Execution.attempt_id)
        .where(Attempt.sweep_id == sweep_id)
        .execution_options(yield_per=_BATCH)
    )
    for row in kept:
        name = f"{exec_names[row.execution_id]}/evidence[{row.path}]"
        out[name] = _record({f: getattr(row, f) for f in EVIDENCE_FIELDS})
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
        out[name] = _record({f: getattr(phase, f) for f in PHASE_FIELDS})
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
            COVERS: [RERUN_KIND],
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
    #: Evidence files on their hosts that are missing, changed or cannot be read, each named.
    files: list[str] = field(default_factory=list)
    checked: int = 0
    #: Evidence files re-hashed on their hosts.
    files_checked: int = 0

    @property
    def ok(self) -> bool:
        return not (self.problems or self.missing or self.changed or self.added or self.files)

    def lines(self) -> list[str]:
        """One line per finding, each naming the artifact."""
        return [
            *self.problems,
            *(f"missing: {name}" for name in self.missing),
            *(f"changed: {name}" for name in self.changed),
            *(f"added: {name}" for name in self.added),
            *self.files,
        ]


#: How many malformed artifact entries a manifest problem lists before it counts the rest.
_SHOWN = 10
_SHA256 = re.compile(r"[0-9a-f]{64}")


class _Duplicate(ValueError):
    """A JSON object gives one name twice: `json` would silently keep the last value."""


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise _Duplicate(f"the name {key!r} is given twice in one object")
        seen[key] = value
    return seen


def _shown(value: object) -> str:
    """A value from a manifest, for a problem line: its repr, cut short."""
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:72]}... ({len(text)} characters)"


def _kind(value: object) -> str:
    """What a JSON value is, in JSON's words, for a problem line."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def check_manifest(doc: object, sweep_id: int) -> tuple[dict[str, str] | None, list[str]]:
    """The artifacts a parsed manifest lists, and what is wrong with it (each a short phrase).

    The artifacts are None when they cannot be compared: the document is not a seal manifest of
    this format, or an entry is not a name with a sha256. A `root_sha256`, `artifact_count` or
    `sweep` that does not match is a problem, and the artifacts are still compared.
    """
    if not isinstance(doc, dict):
        return None, [f"it holds {_kind(doc)}, not a JSON object"]
    if "format" not in doc:
        return None, [f"it has no `format` (expected {FORMAT!r})"]
    if doc["format"] != FORMAT:
        return None, [f"its `format` is {_shown(doc['format'])}, expected {FORMAT!r}"]
    problems: list[str] = []
    if "algorithm" not in doc:
        problems.append("it has no `algorithm` (expected 'sha256')")
    elif doc["algorithm"] != "sha256":
        problems.append(f"its `algorithm` is {_shown(doc['algorithm'])}, expected 'sha256'")
    header = doc.get("sweep")
    if not isinstance(header, dict) or "id" not in header:
        problems.append("it has no `sweep` object with the sweep's `id`")
    elif type(header["id"]) is not int or header["id"] != sweep_id:
        problems.append(
            f"it is the manifest of sweep id {_shown(header['id'])} "
            f"({_shown(header.get('name'))}), not of sweep id {sweep_id}"
        )
    if "artifacts" not in doc:
        return None, [*problems, "it has no `artifacts`"]
    listed = doc["artifacts"]
    if not isinstance(listed, dict):
        return None, [*problems, f"its `artifacts` is {_kind(listed)}, not an object"]
    bad: list[str] = []
    for name, sha in listed.items():
        if not isinstance(name, str) or not name or not name.isprintable():
            bad.append(f"the artifact name {_shown(name)} is not a printable, non-empty string")
        elif not isinstance(sha, str) or not _SHA256.fullmatch(sha):
            bad.append(f"artifact {name} has {_shown(sha)}, not a sha256 (64 lowercase hex digits)")
    if bad:
        more = [f"and {len(bad) - _SHOWN} more malformed artifacts"] if len(bad) > _SHOWN else []
        return None, [*problems, *bad[:_SHOWN], *more]
    count = doc.get("artifact_count")
    if "artifact_count" not in doc:
        problems.append("it has no `artifact_count`")
    elif not isinstance(count, int) or isinstance(count, bool):
        problems.append(f"its `artifact_count` is {_kind(count)}, not a whole number")
    elif count != len(listed):
        problems.append(f"its `artifact_count` is {count} but it lists {len(listed)} artifacts")
    root = doc.get("root_sha256")
    if "root_sha256" not in doc:
        problems.append("it has no `root_sha256`")
    elif not isinstance(root, str):
        problems.append(f"its `root_sha256` is {_kind(root)}, not a string")
    elif root != _root(listed):
        problems.append(
            f"its `root_sha256` {root} does not match the artifacts it lists ({_root(listed)})"
        )
    return dict(listed), problems


def _covers(doc: object) -> list[object]:
    covers = doc.get(COVERS) if isinstance(doc, dict) else None
    return covers if isinstance(covers, list) else []


def verify_seal(
    store: Store, sweep: Sweep, *, manifest: Path | None = None, files: bool = True
) -> Verification:
    """Recompute every artifact's sha256 and compare with the sealed manifest; with `files`,
    re-hash every evidence file where it is kept (its host, over the bed's transport) too.

    Never raises on a bad manifest or a damaged record: each is a `problems` line naming the
    manifest's path, or the sweep, and what is wrong.
    """
    if sweep.sealed_at is None or sweep.seal_sha256 is None:
        raise BadInput(
            f"sweep {sweep.name!r} is not sealed", fix=f"seal it first: apg-farm seal {sweep.name}"
        )
    noted = sweep.meta.get("seal") if isinstance(sweep.meta, dict) else None
    recorded = noted.get("path") if isinstance(noted, dict) else None
    path = manifest or (Path(recorded) if isinstance(recorded, str) and recorded else None)
    result = Verification(path)
    try:
        current = artifacts(store, sweep.id)
    except (ValueError, TypeError) as error:
        # A column rewritten to something its type cannot read (say, text that is not JSON).
        result.problems.append(
            f"sweep {sweep.name!r}: a stored record cannot be read, so it changed since sealing "
            f"or the store is damaged: {error}"
        )
        return result
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
        doc = json.loads(data, object_pairs_hook=_no_duplicates)
    except _Duplicate as error:
        result.problems.append(f"manifest {path} is malformed: {error}")
        return result
    except (ValueError, RecursionError) as error:
        # UnicodeDecodeError and JSONDecodeError are ValueErrors; a deep nest is a RecursionError.
        result.problems.append(f"manifest {path} is malformed: it is not JSON: {error}")
        return result
    sealed, problems = check_manifest(doc, sweep.id)
    result.problems += [f"manifest {path} is malformed: {p}" for p in problems]
    if sealed is None:
        return result
    if RERUN_KIND not in _covers(doc):
        # Sealed before re-run kinds were: the kinds migration 0019 gave its rows are not compared.
        current = {n: sha for n, sha in current.items() if not n.endswith(f"/{RERUN_KIND}")}
    result.missing = sorted(set(sealed) - set(current))
    result.added = sorted(set(current) - set(sealed))
    result.changed = sorted(n for n in set(sealed) & set(current) if sealed[n] != current[n])
    if files:
        check_evidence_files(store, sweep.id, result)
    return result


def check_evidence_files(store: Store, sweep_id: int, result: Verification) -> None:
    """Each stored evidence file read on its evidence host and checked against its sha256: a
    changed, missing or unreachable file is a line naming it."""
    with store.read() as session:
        rows = session.execute(
            select(Execution.id, Attempt.task, Attempt.model, Attempt.trial, Execution.number)
            .join(Attempt, Attempt.id == Execution.attempt_id)
            .where(Attempt.sweep_id == sweep_id, Execution.evidence_dir.is_not(None))
            .order_by(Execution.id)
        ).all()
    for execution_id, task, model, trial, number in rows:
        name = f"attempt[{task}|{model}|{trial}]/execution[{number}]"
        kept = list_evidence(store, execution_id)
        if not kept:
            continue
        try:
            location = evidence_location(store, execution_id)
            if location is None:
                continue
            transport = evidence_transport(location)
        except FarmError as error:
            result.files.append(f"evidence of {name} cannot be checked: {error.message}")
            continue
        try:
            for item in kept:
                result.files_checked += 1
                problem = _file_problem(transport, location, item)
                if problem is not None:
                    result.files.append(f"{problem}: {name}/evidence[{item.path}]")
        finally:
            transport.close()


def _file_problem(transport: Transport, location: Location, item: EvidenceFile) -> str | None:
    try:
        read_kept(transport, location, item)
    except EvidenceMissing:
        return "evidence file missing"
    except FarmError:
        return "evidence file changed"
    return None
