"""Every field a verdict rests on is sealed, and `verify` names each change, on SQLite and PostgreSQL.

One sealed sweep per backend serves the whole module: each test changes the store (an SQL UPDATE,
INSERT or DELETE through the store's session), checks what `verify_seal` names, puts the store back
and checks that it verifies again, so the tests stay independent.

`ROWS` changes one sealed column at a time, NULL included; `MOVES` changes a column that is part of
an artifact's name. `test_every_column_is_sealed_or_left_out_on_purpose` fails when a column of the
sealed tables has neither a row here nor an entry, with its reason, in `sealing.NOT_SEALED`: the
next column added to the models cannot escape the seal unnoticed.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import delete, func, insert, select, text, update

from apg_farm.fixtures import simbed
from apg_farm.results import seal, verify_seal
from apg_farm.results.sealing import (
    FORMAT,
    NOT_SEALED,
    NOT_SEALED_TABLES,
    Verification,
    check_manifest,
)
from apg_farm.scheduler import submit
from apg_farm.store import Attempt, Base, EvidenceRow, Execution, Phase, Store, Sweep, utcnow
from apg_farm.workers import EmbeddedExecutor
from tests.conftest import _postgres_store
from tests.support.simbeds import make_beds, spec

SHA_ZERO = "0" * 64


@dataclass
class World:
    """A sealed sweep and the ids and artifact names the tests change and expect."""

    store: Store
    root: Path
    sweep_id: int
    manifest: Path
    sealed: dict[str, str]
    #: Row ids the rows change: the sweep, one attempt, its execution[1], that execution's reset.
    ids: dict[type[Base], int]
    #: Artifact names, worked out here from the rows (not by the code under test).
    names: dict[str, str]
    other_bed_id: int
    other_sweep_id: int
    other_attempt_id: int
    execution_names: dict[int, str] = field(default_factory=dict)
    phase_names: dict[int, str] = field(default_factory=dict)

    def sweep(self) -> Sweep:
        with self.store.session() as session:
            row = session.get_one(Sweep, self.sweep_id)
            session.expunge(row)
            return row

    def verify(self, **kwargs: Any) -> Verification:
        return verify_seal(self.store, self.sweep(), **kwargs)

    def subtree(self, name: str) -> list[str]:
        """The sealed artifact `name` and every artifact under it."""
        return sorted(n for n in self.sealed if n == name or n.startswith(name + "/"))


def _build(store: Store, root: Path) -> World:
    beds = make_beds(store, root, 2)
    submission = submit(store, spec("sealme", tasks=1, models=2, trials=1, diff=False))
    result = EmbeddedExecutor(store, submission.sweep_id).run()
    assert not result.errors and not result.stranded
    # Another sweep, never run: somewhere to move an attempt or an execution out of the sealed one.
    other = submit(store, spec("other", task_ids=[simbed.DEFAULT_TASKS[1]], models=1, trials=1))
    sealed = seal(store, submission.sweep_id, directory=root / "seals")
    with store.session() as session:
        attempts = session.scalars(
            select(Attempt).where(Attempt.sweep_id == submission.sweep_id).order_by(Attempt.model)
        ).all()
        attempt_names = {a.id: f"attempt[{a.task}|{a.model}|{a.trial}]" for a in attempts}
        executions = session.scalars(
            select(Execution).where(Execution.attempt_id.in_(attempt_names))
        ).all()
        execution_names = {
            e.id: f"{attempt_names[e.attempt_id]}/execution[{e.number}]" for e in executions
        }
        phase_names = {}
        for execution in executions:
            phases = session.scalars(
                select(Phase).where(Phase.execution_id == execution.id).order_by(Phase.id)
            ).all()
            for position, phase in enumerate(phases, 1):
                phase_names[phase.id] = (
                    f"{execution_names[execution.id]}/phase[{position}:{phase.name}]"
                )
        attempt = attempts[0]
        execution = next(e for e in executions if e.attempt_id == attempt.id and e.number == 1)
        assert execution.envelope is not None and execution.score is not None
        reset = session.scalars(
            select(Phase).where(Phase.execution_id == execution.id, Phase.name == "reset")
        ).one()
        other_attempt = session.scalars(
            select(Attempt.id).where(Attempt.sweep_id == other.sweep_id)
        ).one()
        other_bed = next(b.id for b in beds if b.id != execution.bed_id)
        kept = session.execute(
            select(EvidenceRow.execution_id, EvidenceRow.path).where(
                EvidenceRow.execution_id.in_(execution_names)
            )
        ).all()
        evidence_names = {f"{execution_names[e]}/evidence[{path}]" for e, path in kept}
        # Every execution kept its run folder off the bed (workers/evidence.py), transcript too.
        assert all(
            any(
                n.endswith("/transcript.jsonl]") for n in evidence_names if n.startswith(f"{name}/")
            )
            for name in execution_names.values()
        ), evidence_names
    names = {
        "sweep": "sweep",
        "attempt": attempt_names[attempt.id],
        "execution": execution_names[execution.id],
        "envelope": f"{execution_names[execution.id]}/envelope",
        "rerun_kind": f"{execution_names[execution.id]}/rerun_kind",
        "phase": phase_names[reset.id],
        "stdout": f"{phase_names[reset.id]}/stdout",
        "stderr": f"{phase_names[reset.id]}/stderr",
    }
    world = World(
        store=store,
        root=root,
        sweep_id=submission.sweep_id,
        manifest=sealed.path,
        sealed=json.loads(sealed.path.read_bytes())["artifacts"],
        ids={
            Sweep: submission.sweep_id,
            Attempt: attempt.id,
            Execution: execution.id,
            Phase: reset.id,
        },
        names=names,
        other_bed_id=other_bed,
        other_sweep_id=other.sweep_id,
        other_attempt_id=other_attempt,
        execution_names=execution_names,
        phase_names=phase_names,
    )
    # What the tests expect rests on names worked out here; the manifest must hold exactly them.
    assert set(world.sealed) == {
        "sweep",
        *attempt_names.values(),
        *execution_names.values(),
        *(f"{name}/envelope" for name in execution_names.values()),
        *phase_names.values(),
        *(f"{name}/{stream}" for name in phase_names.values() for stream in ("stdout", "stderr")),
        *evidence_names,
    }
    assert world.verify().ok
    return world


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def world(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[World]:
    """One sealed sweep of two attempts on two simulated beds, for the whole module."""
    root = tmp_path_factory.mktemp(f"seal-{request.param}")
    if request.param == "sqlite":
        store = Store(f"sqlite:///{root / 'farm.db'}")
        try:
            yield _build(store, root)
        finally:
            store.dispose()
        return
    with _postgres_store() as store:
        yield _build(store, root)


@contextmanager
def changed(
    world: World, model: type[Base], column: str, value: Any, row_id: int | None = None
) -> Iterator[Any]:
    """Set one column of one row, yield its old value, then put it back and check the seal holds."""
    row_id = world.ids[model] if row_id is None else row_id
    table = model.__table__
    with world.store.session() as session:
        old = session.scalar(select(table.c[column]).where(table.c.id == row_id))
    new = value(old, world) if callable(value) else value
    assert new != old or (new is None) != (old is None), f"{column}: the row changes nothing"
    with world.store.session() as session:
        session.execute(update(table).where(table.c.id == row_id).values({column: new}))
    try:
        yield old
    finally:
        with world.store.session() as session:
            session.execute(update(table).where(table.c.id == row_id).values({column: old}))
        assert world.verify().ok, f"{model.__name__}.{column} was not put back"


def _later(old: Any, _world: World) -> Any:
    return old + timedelta(seconds=1)


def _plus(step: float) -> Callable[[Any, World], Any]:
    return lambda old, _world: old + step


def _flip(old: Any, _world: World) -> Any:
    return not old


def _other_outcome(old: Any, _world: World) -> Any:
    return "FAILED" if old != "FAILED" else "PASSED"


def _edited(old: Any, _world: World) -> Any:
    return f"{old}, edited" if old is not None else "edited"


@dataclass(frozen=True)
class Row:
    """One sealed column of one table: a new value (or a function of the old one and the world),
    and what verify must say: ("changed" | "missing", the artifact's key in `World.names`)."""

    model: type[Base]
    column: str
    value: Any
    expect: tuple[str, str]

    @property
    def id(self) -> str:
        shown = "NULL" if self.value is None else "edit"
        return f"{self.model.__tablename__}.{self.column}={shown}"


def _rows(
    model: type[Base], artifact: str, columns: dict[str, Any], nulls: tuple[str, ...] = ()
) -> list[Row]:
    return [
        *(Row(model, column, value, ("changed", artifact)) for column, value in columns.items()),
        *(Row(model, column, None, ("changed", artifact)) for column in nulls),
    ]


ROWS: list[Row] = [
    *_rows(
        Sweep,
        "sweep",
        {
            "name": "sealme-renamed",
            "spec": lambda old, _w: {**old, "trials": old["trials"] + 1},
            "spec_sha256": SHA_ZERO,
            "created_at": _later,
        },
    ),
    *_rows(
        Attempt,
        "attempt",
        {
            "state": "queued",
            "outcome": _other_outcome,
            "reason": _edited,
            "infra_failures": _plus(1),
            "finished_at": _later,
        },
        # Removing the outcome is the change the seal exists for.
        nulls=("outcome", "reason", "finished_at"),
    ),
    *_rows(
        Execution,
        "execution",
        {
            "bed_id": lambda _old, world: world.other_bed_id,
            "worker": _edited,
            "started_at": _later,
            "finished_at": _later,
            "run_id": _edited,
            "result": _other_outcome,
            "reason": _edited,
            "score": _plus(-1),
            "max_score": _plus(1),
            "envelope_sha256": SHA_ZERO,
            "bed_seconds": _plus(0.5),
        },
        nulls=(
            "worker",
            "finished_at",
            "run_id",
            "result",
            "reason",
            "score",
            "max_score",
            "envelope_sha256",
            "bed_seconds",
        ),
    ),
    # A re-run's kind is its own artifact, only when set: the headline reads it (second_chances.py).
    Row(Execution, "rerun_kind", "farm_error", ("added", "rerun_kind")),
    Row(Execution, "envelope", lambda old, _w: old + b"\n", ("changed", "envelope")),
    Row(Execution, "envelope", lambda old, _w: old.replace(b"5", b"4", 1), ("changed", "envelope")),
    Row(Execution, "envelope", b"", ("changed", "envelope")),
    Row(Execution, "envelope", None, ("missing", "envelope")),
    *_rows(
        Phase,
        "phase",
        {
            "argv": lambda old, _w: [*old, "--edited"],
            "rc": _plus(1),
            "exit_code": _plus(1),
            "tokens": [["APG_EDITED", "1"]],
            "started_at": _later,
            "finished_at": _later,
            "duration": _plus(0.5),
            "timed_out": _flip,
            "transport_error": _edited,
            "stdout_bytes": _plus(1),
            "stdout_truncated": _flip,
            "stderr_bytes": _plus(1),
            "stderr_truncated": _flip,
        },
        nulls=("rc", "exit_code"),
    ),
    Row(Phase, "stdout", lambda old, _w: old + "x", ("changed", "stdout")),
    Row(Phase, "stdout", "", ("changed", "stdout")),
    Row(Phase, "stderr", lambda old, _w: old + "x", ("changed", "stderr")),
]


@pytest.mark.parametrize("row", ROWS, ids=[row.id for row in ROWS])
def test_each_sealed_field_changed_is_named(world: World, row: Row) -> None:
    """Changing one sealed column of one row (NULL too) is named, and nothing else is."""
    kind, artifact = row.expect
    with changed(world, row.model, row.column, row.value):
        result = world.verify()
        assert not result.ok
        assert result.problems == []
        expected = {"changed": [], "missing": [], "added": []}
        expected[kind] = [world.names[artifact]]
        assert {
            "changed": result.changed,
            "missing": result.missing,
            "added": result.added,
        } == expected
        assert result.lines() == [f"{kind}: {world.names[artifact]}"]


@dataclass(frozen=True)
class Move:
    """A column that is part of an artifact's name: its artifacts go missing, others are added."""

    model: type[Base]
    column: str
    value: Any
    #: (the old artifact prefix, the new one or None when the row leaves the sweep), given the world.
    names: Callable[[World], tuple[str, str | None]]
    #: The row to change, when not the world's one of that table.
    row: Callable[[World], int] | None = None


def _last_phase(world: World) -> int:
    """The sweep's phase with the highest id: the last of its execution."""
    return max(world.phase_names)


def _into_other_execution(world: World) -> tuple[int, int]:
    """The last phase's execution's other one, and how many phases it has."""
    with world.store.session() as session:
        phase = session.get_one(Phase, _last_phase(world))
        target = next(e for e in world.execution_names if e != phase.execution_id)
        count = session.scalar(
            select(func.count()).select_from(Phase).where(Phase.execution_id == target)
        )
    return target, int(count or 0)


def _moved_phase_names(world: World) -> tuple[str, str | None]:
    target, count = _into_other_execution(world)
    old = world.phase_names[_last_phase(world)]
    name = old.rsplit(":", 1)[1].removesuffix("]")
    return old, f"{world.execution_names[target]}/phase[{count + 1}:{name}]"


def _renamed_attempt(part: int, value: str) -> Callable[[World], tuple[str, str | None]]:
    def names(world: World) -> tuple[str, str | None]:
        old = world.names["attempt"]
        key = old.removeprefix("attempt[").removesuffix("]").split("|")
        key[part] = value
        return old, f"attempt[{'|'.join(key)}]"

    return names


MOVES: list[Move] = [
    Move(Attempt, "task", "renamed_task", _renamed_attempt(0, "renamed_task")),
    Move(Attempt, "model", "vendor/renamed-model", _renamed_attempt(1, "vendor/renamed-model")),
    Move(Attempt, "trial", 7, _renamed_attempt(2, "7")),
    Move(Attempt, "sweep_id", lambda _o, w: w.other_sweep_id, lambda w: (w.names["attempt"], None)),
    Move(
        Execution,
        "number",
        2,
        lambda w: (w.names["execution"], w.names["execution"].removesuffix("[1]") + "[2]"),
    ),
    Move(
        Execution,
        "attempt_id",
        lambda _o, w: w.other_attempt_id,
        lambda w: (w.names["execution"], None),
    ),
    Move(
        Phase,
        "name",
        "reset_renamed",
        lambda w: (w.names["phase"], w.names["phase"].replace(":reset]", ":reset_renamed]")),
    ),
    Move(
        Phase,
        "execution_id",
        lambda _o, w: _into_other_execution(w)[0],
        _moved_phase_names,
        row=_last_phase,
    ),
]


@pytest.mark.parametrize("move", MOVES, ids=[f"{m.model.__tablename__}.{m.column}" for m in MOVES])
def test_each_identity_changed_is_missing_and_added(world: World, move: Move) -> None:
    """A column in an artifact's name changed: its artifacts are missing, the new names added."""
    old, new = move.names(world)
    row_id = move.row(world) if move.row else None
    with changed(world, move.model, move.column, move.value, row_id):
        result = world.verify()
        assert not result.ok and result.problems == [] and result.changed == []
        assert result.missing == world.subtree(old)
        expected = [] if new is None else sorted(new + n[len(old) :] for n in world.subtree(old))
        assert result.added == expected


def test_deleted_rows_are_missing(world: World) -> None:
    """Deleting a phase names it and its outputs missing; deleting an execution, all of it."""
    phase_id = _last_phase(world)
    phase_name = world.phase_names[phase_id]
    table = Phase.__table__
    with world.store.session() as session:
        kept = dict(session.execute(select(table).where(table.c.id == phase_id)).mappings().one())
        session.execute(delete(table).where(table.c.id == phase_id))
    try:
        result = world.verify()
        assert not result.ok and result.problems == []
        assert (result.changed, result.added) == ([], [])
        assert result.missing == [phase_name, f"{phase_name}/stderr", f"{phase_name}/stdout"]
    finally:
        with world.store.session() as session:
            session.execute(insert(table).values(**kept))
    assert world.verify().ok

    execution_id = world.ids[Execution]
    with world.store.session() as session:
        phases = [
            dict(p)
            for p in session.execute(select(table).where(table.c.execution_id == execution_id))
            .mappings()
            .all()
        ]
        execution = dict(
            session.execute(
                select(Execution.__table__).where(Execution.__table__.c.id == execution_id)
            )
            .mappings()
            .one()
        )
        files = EvidenceRow.__table__
        kept_files = [
            dict(f)
            for f in session.execute(select(files).where(files.c.execution_id == execution_id))
            .mappings()
            .all()
        ]
        session.execute(delete(table).where(table.c.execution_id == execution_id))
        session.execute(delete(files).where(files.c.execution_id == execution_id))
        session.execute(delete(Execution.__table__).where(Execution.__table__.c.id == execution_id))
    try:
        result = world.verify()
        assert not result.ok and (result.problems, result.changed, result.added) == ([], [], [])
        assert result.missing == world.subtree(world.names["execution"])
    finally:
        with world.store.session() as session:
            session.execute(insert(Execution.__table__).values(**execution))
            session.execute(insert(table), phases)
            session.execute(insert(files), kept_files)
    assert world.verify().ok


def test_inserted_rows_are_added(world: World) -> None:
    """A new execution (with an envelope), a new phase and a new attempt are each named added."""
    attempt_id, execution_id = world.ids[Attempt], world.ids[Execution]
    now = utcnow()
    with world.store.session() as session:
        bed_id = session.get_one(Execution, execution_id).bed_id
        count = len(
            [p for p in world.phase_names.values() if p.startswith(world.names["execution"] + "/")]
        )
        new_execution = session.execute(
            insert(Execution)
            .values(
                attempt_id=attempt_id,
                bed_id=bed_id,
                number=2,
                started_at=now,
                result="PASSED",
                score=5.0,
                envelope=b"{}",
            )
            .returning(Execution.id)
        ).scalar_one()
        new_phase = session.execute(
            insert(Phase)
            .values(
                execution_id=execution_id,
                name="extra",
                argv=["ddev", "extra"],
                started_at=now,
                finished_at=now,
                duration=0.0,
            )
            .returning(Phase.id)
        ).scalar_one()
        new_attempt = session.execute(
            insert(Attempt)
            .values(
                sweep_id=world.sweep_id,
                task="extra_task",
                model="vendor/extra",
                trial=1,
                seq=99,
                pool="p",
                state="done",
                outcome="PASSED",
            )
            .returning(Attempt.id)
        ).scalar_one()
    try:
        result = world.verify()
        assert not result.ok and (result.problems, result.changed, result.missing) == ([], [], [])
        attempt, execution = world.names["attempt"], world.names["execution"]
        phase = f"{execution}/phase[{count + 1}:extra]"
        assert result.added == sorted(
            [
                f"{attempt}/execution[2]",
                f"{attempt}/execution[2]/envelope",
                phase,
                f"{phase}/stdout",
                f"{phase}/stderr",
                "attempt[extra_task|vendor/extra|1]",
            ]
        )
    finally:
        with world.store.session() as session:
            session.execute(delete(Phase).where(Phase.id == new_phase))
            session.execute(delete(Execution).where(Execution.id == new_execution))
            session.execute(delete(Attempt).where(Attempt.id == new_attempt))
    assert world.verify().ok


def test_a_record_that_cannot_be_read_is_a_problem(world: World) -> None:
    """A JSON column rewritten to text that is not JSON: a problem line, not a traceback."""
    phase_id = world.ids[Phase]
    with world.store.session() as session:
        old = session.execute(
            text("SELECT argv FROM phases WHERE id = :id"), {"id": phase_id}
        ).scalar_one()
        session.execute(
            text("UPDATE phases SET argv = 'not json' WHERE id = :id"), {"id": phase_id}
        )
    try:
        result = world.verify()
        assert not result.ok
        assert len(result.problems) == 1
        assert result.problems[0].startswith("sweep 'sealme': a stored record cannot be read")
    finally:
        with world.store.session() as session:
            session.execute(
                text("UPDATE phases SET argv = :old WHERE id = :id"), {"old": old, "id": phase_id}
            )
    assert world.verify().ok


#: Columns proven sealed by a test here: a row of `ROWS` or `MOVES` changes each.
PROVEN = {
    model.__tablename__: {r.column for r in [*ROWS, *MOVES] if r.model is model}
    for model in (Sweep, Attempt, Execution, Phase)
}


def test_every_column_is_sealed_or_left_out_on_purpose() -> None:
    """Each column of the sealed tables is proven sealed here or left out with a reason."""
    for model in (Sweep, Attempt, Execution, Phase):
        table = model.__tablename__
        columns = {column.name for column in model.__table__.columns}
        left_out = set(NOT_SEALED[table])
        assert PROVEN[table] & left_out == set(), f"{table}: both sealed and left out"
        assert all(NOT_SEALED[table].values()), f"{table}: a column left out without a reason"
        unaccounted = columns - PROVEN[table] - left_out
        assert unaccounted == set(), (
            f"{table}: {sorted(unaccounted)} neither sealed (seal them in sealing.py and add a row "
            "to ROWS here) nor left out on purpose (sealing.NOT_SEALED, with why)"
        )
        assert (PROVEN[table] | left_out) - columns == set(), f"{table}: no such columns"
    sealed_tables = {"sweeps", "attempts", "executions", "phases", "evidence_files"}
    assert set(Base.metadata.tables) == sealed_tables | set(NOT_SEALED_TABLES), (
        "a new table: seal what a verdict rests on, or say why not in sealing.NOT_SEALED_TABLES"
    )


def test_sealing_twice_gives_the_same_artifacts(world: World) -> None:
    """Resealing an unchanged sweep lists the same artifacts with the same root digest."""
    first = json.loads(world.manifest.read_bytes())
    again = seal(world.store, world.sweep_id, directory=world.root / "seals", replace=True)
    second = json.loads(again.path.read_bytes())
    assert again.path == world.manifest
    assert second["artifacts"] == first["artifacts"] == world.sealed
    assert second["root_sha256"] == first["root_sha256"]
    assert world.verify().ok


# ---- Malformed manifests: a problem line naming the manifest and what is wrong, never a raise.


def _manifest(world: World) -> dict[str, Any]:
    return dict(json.loads(world.manifest.read_bytes()))


def _verify_file(world: World, data: bytes, tmp_path: Path) -> tuple[Path, Verification]:
    """Verify against `data` as the manifest, its sha256 recorded, so only its content is judged."""
    path = tmp_path / "manifest.seal.json"
    path.write_bytes(data)
    sweep = world.sweep()
    sweep.seal_sha256 = hashlib.sha256(data).hexdigest()
    return path, verify_seal(world.store, sweep, manifest=path)


def _edit(change: Callable[[dict[str, Any]], None]) -> Callable[[World], bytes]:
    """The sealed manifest with `change` made to it."""

    def data(world: World) -> bytes:
        doc = _manifest(world)
        change(doc)
        return json.dumps(doc).encode()

    return data


def _without(key: str) -> Callable[[dict[str, Any]], None]:
    def change(doc: dict[str, Any]) -> None:
        del doc[key]

    return change


def _first(doc: dict[str, Any]) -> str:
    return sorted(doc["artifacts"])[0]


def _set_first(value: object) -> Callable[[dict[str, Any]], None]:
    def change(doc: dict[str, Any]) -> None:
        doc["artifacts"][_first(doc)] = value

    return change


def _rename_first(name: str) -> Callable[[dict[str, Any]], None]:
    def change(doc: dict[str, Any]) -> None:
        doc["artifacts"][name] = doc["artifacts"].pop(_first(doc))

    return change


def _drop_listed(doc: dict[str, Any]) -> None:
    """One artifact left out of the listing, the count fixed: only the root can tell."""
    del doc["artifacts"]["sweep"]
    doc["artifact_count"] -= 1


def _duplicated(world: World) -> bytes:
    doc = _manifest(world)
    listed = json.dumps(doc.pop("artifacts"))
    return (
        json.dumps(doc)[:-1] + f', "artifacts": {{"sweep": "{SHA_ZERO}", ' + listed[1:] + "}"
    ).encode()


#: (case, the manifest's bytes given the world, the problem after "manifest PATH is malformed: ").
#: A problem ending in "…" is matched by its start.
MALFORMED: list[tuple[str, Callable[[World], bytes], str]] = [
    ("not-json", lambda _w: b"{not json", "it is not JSON: …"),
    ("empty", lambda _w: b"", "it is not JSON: …"),
    ("not-utf8", lambda _w: b"\xff\xfe{}", "it is not JSON: …"),
    ("too-deep", lambda _w: b"[" * 200_000, "it is not JSON: …"),
    ("array", lambda _w: b"[]", "it holds an array, not a JSON object"),
    ("null", lambda _w: b"null", "it holds null, not a JSON object"),
    ("string", lambda _w: b'"apg-farm-seal/1"', "it holds a string, not a JSON object"),
    (
        "no-format",
        _edit(_without("format")),
        f"it has no `format` (expected {FORMAT!r})",
    ),
    (
        "wrong-format",
        _edit(lambda d: d.update(format="apg-farm-seal/0")),
        f"its `format` is 'apg-farm-seal/0', expected {FORMAT!r}",
    ),
    ("no-artifacts", _edit(_without("artifacts")), "it has no `artifacts`"),
    (
        "artifacts-array",
        _edit(lambda d: d.update(artifacts=[])),
        "its `artifacts` is an array, not an object",
    ),
    (
        "artifacts-null",
        _edit(lambda d: d.update(artifacts=None)),
        "its `artifacts` is null, not an object",
    ),
    (
        "sha-not-hex",
        _edit(_set_first("z" * 64)),
        "artifact {first} has '" + "z" * 64 + "', not a sha256 (64 lowercase hex digits)",
    ),
    (
        "sha-short",
        _edit(_set_first("a" * 63)),
        "artifact {first} has '" + "a" * 63 + "', not a sha256 (64 lowercase hex digits)",
    ),
    (
        "sha-upper",
        _edit(_set_first("A" * 64)),
        "artifact {first} has '" + "A" * 64 + "', not a sha256 (64 lowercase hex digits)",
    ),
    (
        "sha-number",
        _edit(_set_first(12)),
        "artifact {first} has 12, not a sha256 (64 lowercase hex digits)",
    ),
    (
        "sha-null",
        _edit(_set_first(None)),
        "artifact {first} has None, not a sha256 (64 lowercase hex digits)",
    ),
    (
        "name-empty",
        _edit(_rename_first("")),
        "the artifact name '' is not a printable, non-empty string",
    ),
    (
        "name-tab",
        _edit(_rename_first("sweep\tx")),
        "the artifact name 'sweep\\tx' is not a printable, non-empty string",
    ),
    ("name-twice", _duplicated, "the name 'sweep' is given twice in one object"),
    ("no-root", _edit(_without("root_sha256")), "it has no `root_sha256`"),
    (
        "root-number",
        _edit(lambda d: d.update(root_sha256=1)),
        "its `root_sha256` is a number, not a string",
    ),
    (
        "root-wrong",
        _edit(lambda d: d.update(root_sha256=SHA_ZERO)),
        f"its `root_sha256` {SHA_ZERO} does not match the artifacts it lists (…",
    ),
    ("no-count", _edit(_without("artifact_count")), "it has no `artifact_count`"),
    (
        "count-wrong",
        _edit(lambda d: d.update(artifact_count=d["artifact_count"] + 1)),
        "its `artifact_count` is {count_plus_one} but it lists {count} artifacts",
    ),
    (
        "count-string",
        _edit(lambda d: d.update(artifact_count="3")),
        "its `artifact_count` is a string, not a whole number",
    ),
    (
        "count-boolean",
        _edit(lambda d: d.update(artifact_count=True)),
        "its `artifact_count` is a boolean, not a whole number",
    ),
    (
        "no-algorithm",
        _edit(_without("algorithm")),
        "it has no `algorithm` (expected 'sha256')",
    ),
    (
        "wrong-algorithm",
        _edit(lambda d: d.update(algorithm="md5")),
        "its `algorithm` is 'md5', expected 'sha256'",
    ),
    (
        "no-sweep",
        _edit(_without("sweep")),
        "it has no `sweep` object with the sweep's `id`",
    ),
    (
        "other-sweep",
        _edit(lambda d: d["sweep"].update(id=d["sweep"]["id"] + 100, name="x")),
        "it is the manifest of sweep id {other_id} ('x'), not of sweep id {sweep_id}",
    ),
]


@pytest.mark.parametrize(("case", "data", "problem"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_a_malformed_manifest_is_refused_clearly(
    world: World, tmp_path: Path, case: str, data: Callable[[World], bytes], problem: str
) -> None:
    """Each malformed manifest gets one problem line naming its path and what is wrong."""
    doc = _manifest(world)
    problem = problem.format(
        first=_first(doc),
        count=doc["artifact_count"],
        count_plus_one=doc["artifact_count"] + 1,
        other_id=world.sweep_id + 100,
        sweep_id=world.sweep_id,
    )
    path, result = _verify_file(world, data(world), tmp_path)
    assert not result.ok
    assert len(result.problems) == 1, result.problems
    expected = f"manifest {path} is malformed: {problem}"
    if expected.endswith("…"):
        assert result.problems[0].startswith(expected[:-1])
    else:
        assert result.problems[0] == expected
    assert "\n" not in result.problems[0]
    # A listing that cannot be read is not compared; a readable one is, and matches the store.
    assert (result.missing, result.changed, result.added) == ([], [], [])


def test_a_manifest_sealed_before_rerun_kinds_is_not_compared_on_them(
    world: World, tmp_path: Path
) -> None:
    """A seal made before re-run kinds were sealed (no `covers`) still verifies once migration 0019
    has given its re-runs a kind; a manifest that covers them names the kind set since."""
    doc = _manifest(world)
    assert doc["covers"] == ["rerun_kind"]
    del doc["covers"]
    with changed(world, Execution, "rerun_kind", "farm_error"):
        _, old = _verify_file(world, json.dumps(doc).encode(), tmp_path)
        assert old.ok, old.lines()
        _, covering = _verify_file(world, world.manifest.read_bytes(), tmp_path)
        assert covering.lines() == [f"added: {world.names['rerun_kind']}"]


def test_a_listing_that_lost_an_entry_is_named_twice(world: World, tmp_path: Path) -> None:
    """An entry dropped from the listing (count fixed): the root says so, and so does `added`."""
    path, result = _verify_file(world, _edit(_drop_listed)(world), tmp_path)
    listed = {n: sha for n, sha in world.sealed.items() if n != "sweep"}
    # The root, worked out here: sha256 over "name<TAB>sha256<LF>" lines in name order.
    root = hashlib.sha256(
        "".join(f"{n}\t{listed[n]}\n" for n in sorted(listed)).encode()
    ).hexdigest()
    assert result.problems == [
        f"manifest {path} is malformed: its `root_sha256` {_manifest(world)['root_sha256']} does "
        f"not match the artifacts it lists ({root})"
    ]
    assert result.added == ["sweep"] and result.missing == result.changed == []


def test_a_name_that_is_not_a_string_is_refused() -> None:
    """JSON keys are strings; a manifest parsed by other means may still hold another name."""
    sealed, problems = check_manifest(
        {
            "format": FORMAT,
            "algorithm": "sha256",
            "sweep": {"id": 1},
            "artifacts": {1: SHA_ZERO},
            "artifact_count": 1,
            "root_sha256": SHA_ZERO,
        },
        1,
    )
    assert sealed is None
    assert problems == ["the artifact name 1 is not a printable, non-empty string"]


def test_a_manifest_that_cannot_be_read_or_found_is_a_problem(world: World, tmp_path: Path) -> None:
    """A folder in the manifest's place, and a store that does not say where the manifest is."""
    result = verify_seal(world.store, world.sweep(), manifest=tmp_path)
    assert result.problems == [f"manifest {tmp_path} cannot be read: Is a directory"]
    sweep = world.sweep()
    sweep.meta = {"seal": "not an object"}
    result = verify_seal(world.store, sweep)
    assert result.problems == ["the store does not say where the manifest is; pass --manifest"]
