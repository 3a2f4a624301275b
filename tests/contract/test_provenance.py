"""Provenance stored when an execution is recorded (executions.provenance, migration 0012).

The report now counts what the farm extracted from each envelope, grouped by the database. Four
checks: it equals the tally reports made by parsing every envelope (the code before issue #21,
kept verbatim below as the oracle), odd envelopes included; migration 0012 backfills a store of
old rows in batches and its downgrade drops the column; the real engine on simulated beds fills
the column at record time; and an envelope built to hurt its reader is recorded, bounded.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command

from apg_farm.contract import (
    MAX_PROVENANCE_VALUE,
    PROVENANCE_FIELDS,
    PROVENANCE_LIBRARY,
    envelope_provenance,
)
from apg_farm.results import analyse, find_sweep, render_html
from apg_farm.scheduler import submit
from apg_farm.store import Attempt, Bed, Execution, Store, normalize_url
from apg_farm.store.db import _alembic_config
from apg_farm.workers import EmbeddedExecutor
from bench.report_bench import build_sweep
from tests.conftest import IN_CI, PG_URL
from tests.support.simbeds import make_beds, spec

GRADED = ("PASSED", "FAILED", "NO_ATTEMPT")
FINGERPRINTS = PROVENANCE_FIELDS[:-1]

# --- the oracle: provenance as reports tallied it before 0012, every envelope parsed ------------


def _old_envelope_details(raw: bytes) -> tuple[dict[str, str], str | None]:
    """analysis._envelope_details before issue #21, verbatim."""
    try:
        doc = json.loads(raw)
    except ValueError:
        return {}, None
    if not isinstance(doc, dict):
        return {}, None
    details: dict[str, str] = {}
    for section in ("source_metadata", "eval_library"):
        part = doc.get(section)
        extra = part.get("additional_details") if isinstance(part, dict) else None
        if isinstance(extra, dict):
            details.update({k: v for k, v in extra.items() if isinstance(v, str)})
    library = doc.get("eval_library")
    name = None
    if isinstance(library, dict):
        name = f"{library.get('name', '?')} {library.get('version', '?')}"
    return details, name


def _old_tally(store: Store, name: str) -> dict[str, Any]:
    """What analyse's _Provenance counted, envelope by envelope, before issue #21."""
    sweep_id = find_sweep(store, name).id
    with store.read() as session:
        rows = session.execute(
            sa.select(Attempt.task, Bed.name, Execution.envelope)
            .join(Attempt, Attempt.id == Execution.attempt_id)
            .join(Bed, Bed.id == Execution.bed_id)
            .where(
                Attempt.sweep_id == sweep_id,
                Execution.result.in_(GRADED),
                Execution.envelope.is_not(None),
            )
        ).all()
    fingerprints: dict[str, Counter[str]] = {}
    task_hashes: dict[str, Counter[str]] = {}
    bed_prints: dict[str, Counter[str]] = {}
    libraries: Counter[str] = Counter()
    for task, bed, raw in rows:
        details, library = _old_envelope_details(bytes(raw))
        if library:
            libraries[library] += 1
        for key in FINGERPRINTS:
            if details.get(key):
                fingerprints.setdefault(key, Counter())[details[key]] += 1
        if details.get("task_sha256"):
            task_hashes.setdefault(task, Counter())[details["task_sha256"]] += 1
        if details.get("grader_tree_sha256"):
            bed_prints.setdefault(bed, Counter())[details["grader_tree_sha256"]] += 1
    warnings = []
    for key in ("grader_tree_sha256", "grader_class_sha256", "dataset_sha256"):
        if len(fingerprints.get(key, {})) > 1:
            warnings.append(
                f"{len(fingerprints[key])} different {key} values across the sweep's envelopes"
            )
    for task, hashes in sorted(task_hashes.items()):
        if len(hashes) > 1:
            warnings.append(f"task {task} was graded against {len(hashes)} different task_sha256")
    return {
        "envelopes": len(rows),
        "eval_libraries": dict(sorted(libraries.items())),
        "fingerprints": {key: dict(sorted(v.items())) for key, v in fingerprints.items()},
        "task_sha256": {t: dict(sorted(v.items())) for t, v in sorted(task_hashes.items())},
        "warnings": warnings,
        "bed_prints": {bed: sorted(v) for bed, v in sorted(bed_prints.items())},
    }


def _new_tally(store: Store, name: str) -> dict[str, Any]:
    """The same figures from `analyse`: what reports show now."""
    report = analyse(store, find_sweep(store, name))
    found = {key: report["provenance"][key] for key in ("envelopes", "eval_libraries")}
    found.update({k: report["provenance"][k] for k in ("fingerprints", "task_sha256", "warnings")})
    found["bed_prints"] = {
        row["bed"]: row["grader_tree_sha256"] for row in report["beds"] if row["grader_tree_sha256"]
    }
    return found


def _doc(source: Any = None, library: Any = None, **top: Any) -> bytes:
    doc: dict[str, Any] = dict(top)
    if source is not None:
        doc["source_metadata"] = source
    if library is not None:
        doc["eval_library"] = library
    return json.dumps(doc).encode()


#: Envelopes a bed could store (the engine keeps any grade stdout that was not truncated).
ODD_ENVELOPES = [
    b"not json",
    b"",
    b"\xff\xfe not utf-8",
    b"null",
    b"[1, 2, 3]",
    b'"just a string"',
    b"{}",
    _doc(source=5, library=[]),
    _doc(source={"additional_details": [1, 2]}, library={"additional_details": "x"}),
    # Non-string values are skipped; an empty one says nothing; the library's details win.
    _doc(
        source={
            "additional_details": {
                "task_sha256": "s" * 64,
                "dataset_sha256": None,
                "grader": ["x"],
                "dataset_path": "kept/from/source.yaml",
                "hash_algorithm": "sha256",
            }
        },
        library={
            "name": 7,
            "version": None,
            "additional_details": {
                "grader_tree_sha256": {"a": 1},
                "task_sha256": "",
                "dataset_path": 3,
                "hash_algorithm": "md5",
                "grader_class_sha256": "9" * 64,
            },
        },
    ),
    _doc(library={"version": "2"}),
    _doc(library={"name": "ai_eval", "version": True}),
    _doc(library={"name": "ai_eval", "additional_details": {"grader_tree_sha256": "e" * 64}}),
    _doc(source={"additional_details": {"task_sha256": "f" * 64, "grader": "other"}}),
    _doc(source={"name": "no details"}, library={"name": "x", "version": "1", "extra": {}}),
]


def _oddify(store: Store, sweep_id: int, *, extract: bool) -> None:
    """Give the first graded executions the odd envelopes; `extract`: with the provenance the
    farm records (lifecycle._fill), else none (rows written around the record path)."""
    with store.session() as session:
        ids = session.scalars(
            sa.select(Execution.id)
            .join(Attempt, Attempt.id == Execution.attempt_id)
            .where(Attempt.sweep_id == sweep_id, Execution.envelope.is_not(None))
            .order_by(Execution.id)
            .limit(len(ODD_ENVELOPES))
        ).all()
        assert len(ids) == len(ODD_ENVELOPES)
        for execution_id, raw in zip(ids, ODD_ENVELOPES, strict=True):
            session.execute(
                sa.update(Execution)
                .where(Execution.id == execution_id)
                .values(envelope=raw, provenance=envelope_provenance(raw) if extract else None)
            )


def test_stored_tally_equals_the_envelope_parsing_one(store: Store) -> None:
    """The report's provenance from the stored column equals, value for value, what parsing
    every envelope gave, odd envelopes included; and again with a third of the rows written
    without it (parsed then, as before)."""
    build_sweep(store, 1200, tasks=4, models=3, envelopes=True, seed=5)
    sweep_id = find_sweep(store, "bench").id
    _oddify(store, sweep_id, extract=True)
    old = _old_tally(store, "bench")
    assert _new_tally(store, "bench") == old
    # The odd envelopes are what the comparison had to get right.
    assert old["eval_libraries"]["7 None"] == 1 and old["eval_libraries"]["? 2"] == 1
    assert old["fingerprints"]["dataset_path"]["kept/from/source.yaml"] == 1
    assert old["fingerprints"]["hash_algorithm"]["md5"] == 1
    assert len(old["warnings"]) >= 2 and old["envelopes"] > 1000

    with store.session() as session:
        session.execute(sa.update(Execution).where(Execution.id % 3 == 0).values(provenance=None))
    _oddify(store, sweep_id, extract=False)
    assert _new_tally(store, "bench") == old


# --- migration 0012 on a store of old rows --------------------------------------------------------


@contextmanager
def _old_store(backend: str, tmp_path: Path) -> Iterator[str]:
    """The URL of an empty store migrated to 0011 only: SQLite, or a PostgreSQL schema."""
    if backend == "sqlite":
        url = f"sqlite:///{tmp_path / 'old.db'}"
        engine = sa.create_engine(url)
        with engine.begin() as conn:
            command.upgrade(_alembic_config(conn), "0011")
        engine.dispose()
        yield url
        return
    if not PG_URL:
        if IN_CI:
            pytest.fail("CI is set but APG_FARM_TEST_DATABASE_URL is not")
        pytest.skip("APG_FARM_TEST_DATABASE_URL not set")
    schema = f"t_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(normalize_url(PG_URL))
    with admin.begin() as conn:
        conn.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
    sep = "&" if "?" in PG_URL else "?"
    url = f"{PG_URL}{sep}options=-csearch_path%3D{schema}"
    engine = sa.create_engine(normalize_url(url))
    try:
        with engine.begin() as conn:
            command.upgrade(_alembic_config(conn), "0011")
        yield url
    finally:
        engine.dispose()
        with admin.begin() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA "{schema}" CASCADE')
        admin.dispose()


def _columns(store: Store) -> set[str]:
    return {c["name"] for c in sa.inspect(store.engine).get_columns("executions")}


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_migration_backfills_old_rows_and_downgrades(backend: str, tmp_path: Path) -> None:
    """A store of executions recorded before 0012 (more than one backfill batch, odd envelopes,
    executions without one): the upgrade gives every envelope its provenance and the report the
    old tally without parsing any; the downgrade drops the column and keeps the rows."""
    with _old_store(backend, tmp_path) as url:
        old = Store(url, upgrade=False)
        built = build_sweep(old, 3000, tasks=3, models=2, envelopes=True, provenance=False)
        assert "provenance" not in _columns(old)
        old.dispose()
        engine = sa.create_engine(normalize_url(url))
        with engine.begin() as conn:
            # The odd envelopes, on the old schema (no provenance column to write).
            ids = conn.execute(
                sa.text(
                    "SELECT id FROM executions WHERE envelope IS NOT NULL ORDER BY id LIMIT :n"
                ),
                {"n": len(ODD_ENVELOPES)},
            ).scalars()
            for execution_id, raw in zip(ids, ODD_ENVELOPES, strict=True):
                conn.execute(
                    sa.text("UPDATE executions SET envelope = :raw WHERE id = :id"),
                    {"raw": raw, "id": execution_id},
                )
        engine.dispose()

        store = Store(url)  # upgrades to the head: 0012 backfills
        with store.read() as session:
            rows = session.execute(
                sa.select(Execution.envelope, Execution.provenance).order_by(Execution.id)
            ).all()
        assert len(rows) == built.executions > 2000  # more than one batch of the backfill
        with_envelope = [(bytes(raw), found) for raw, found in rows if raw is not None]
        assert len(with_envelope) > 2000
        assert all(found == envelope_provenance(raw) for raw, found in with_envelope)
        assert all(found is None for raw, found in rows if raw is None)
        assert _new_tally(store, "bench") == _old_tally(store, "bench")

        store.dispose()
        engine = sa.create_engine(normalize_url(url))
        with engine.begin() as conn:
            command.downgrade(_alembic_config(conn), "0011")
        engine.dispose()
        down = Store(url, upgrade=False)
        assert "provenance" not in _columns(down)
        with down.engine.connect() as conn:
            count = conn.exec_driver_sql("SELECT count(*) FROM executions").scalar()
            enveloped = conn.exec_driver_sql(
                "SELECT count(*) FROM executions WHERE envelope IS NOT NULL"
            ).scalar()
        assert (count, enveloped) == (built.executions, len(with_envelope))
        down.dispose()


# --- the real engine on simulated beds --------------------------------------------------------------


def test_recorded_executions_carry_their_provenance(store: Store, tmp_path: Path) -> None:
    """Each execution the engine records holds its envelope's provenance: the simulated bed's
    grader, dataset and task fingerprints; the report counts them without a fallback parse."""
    make_beds(store, tmp_path / "sim", 2)
    sweep_id = submit(store, spec("rec", tasks=2, models=2, trials=2)).sweep_id
    result = EmbeddedExecutor(store, sweep_id).run()
    assert not result.errors and not result.stranded, result
    with store.read() as session:
        rows = session.execute(
            sa.select(Execution.result, Execution.envelope, Execution.provenance)
        ).all()
    graded = [(bytes(raw), found) for result_, raw, found in rows if result_ in GRADED]
    assert len(graded) >= 6
    for raw, found in graded:
        assert found == envelope_provenance(raw)
        assert set(found) == {*PROVENANCE_FIELDS, PROVENANCE_LIBRARY}, found
    assert all(found is None for _, raw, found in rows if raw is None)
    report = analyse(store, find_sweep(store, "rec"))
    assert report["provenance"]["envelopes"] == len(graded)
    assert _new_tally(store, "rec") == _old_tally(store, "rec")


def test_an_envelope_built_to_hurt_is_recorded_bounded(store: Store, tmp_path: Path) -> None:
    """A bed whose envelopes carry a 1 MiB hash, NUL and a lone surrogate, 2000 extra keys and
    100,000-character strings, and one nested 100,000 arrays deep: every execution is recorded,
    the stored provenance keeps the known fields only, each at most MAX_PROVENANCE_VALUE characters, and the
    reports (JSON, HTML) come out."""
    make_beds(
        store,
        tmp_path / "sim",
        2,
        faults={
            0: {"junk_provenance": {"bytes": 1 << 20, "keys": 2000}},
            1: {"junk_provenance": {"keys": 10, "deep": 100_000}},
        },
    )
    sweep_id = submit(store, spec("junk", tasks=2, models=1, trials=2)).sweep_id
    result = EmbeddedExecutor(store, sweep_id).run()
    assert not result.errors and not result.stranded, result
    with store.read() as session:
        rows = session.execute(
            sa.select(Bed.name, Execution.result, Execution.envelope, Execution.provenance).join(
                Bed, Bed.id == Execution.bed_id
            )
        ).all()
    assert {bed for bed, *_ in rows} == {"bed0", "bed1"}
    for bed, _result, raw, found in rows:
        assert raw is not None and found is not None
        if bed == "bed1":
            assert found == {}, found  # past the parser's stack: nothing read, nothing broken
            continue
        assert len(raw) > 1 << 20
        assert set(found) <= {*PROVENANCE_FIELDS, PROVENANCE_LIBRARY}
        assert all(isinstance(v, str) and len(v) <= MAX_PROVENANCE_VALUE for v in found.values()), (
            found
        )
        assert "(1048576 chars)" in found["grader_class_sha256"]
        assert "\x00" not in found["grader"] and "\ufffd" in found["grader"]
        assert found == envelope_provenance(bytes(raw))
    report = analyse(store, find_sweep(store, "junk"))
    text = json.dumps(report)
    assert len(text) < 100_000
    assert "<script>" not in render_html(report)
