"""Sealed evidence on SQLite and PostgreSQL: the manifest, verify naming what changed, and a
sealed sweep refusing new executions."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from sqlalchemy import select, update

from apg_farm.errors import BadInput
from apg_farm.results import SealedSweep, artifacts, seal, verify_seal
from apg_farm.scheduler import submit
from apg_farm.store import Attempt, AttemptState, Execution, Phase, Store, Sweep, claim_next
from apg_farm.workers import EmbeddedExecutor
from tests.support.simbeds import make_beds, spec


def _sweep(store: Store, name: str) -> Sweep:
    with store.session() as session:
        row = session.scalar(select(Sweep).where(Sweep.name == name))
        assert row is not None
        session.expunge(row)
        return row


@pytest.fixture
def finished(store: Store, tmp_path: Path) -> Sweep:
    """A finished sweep of two attempts on one simulated bed."""
    make_beds(store, tmp_path, 1)
    submission = submit(store, spec("sealme", tasks=1, models=2, trials=1, diff=False))
    result = EmbeddedExecutor(store, submission.sweep_id).run()
    assert not result.errors and not result.stranded
    return _sweep(store, "sealme")


def test_seal_then_verify_seal(store: Store, finished: Sweep, tmp_path: Path) -> None:
    """The manifest lists every artifact with its sha256; the store keeps the manifest's sha256."""
    sealed = seal(store, finished.id, directory=tmp_path / "seals")
    data = sealed.path.read_bytes()
    manifest = json.loads(data)
    names = manifest["artifacts"]
    assert sealed.sha256 == hashlib.sha256(data).hexdigest() == _sweep(store, "sealme").seal_sha256
    assert manifest["artifact_count"] == sealed.artifacts == len(names)
    assert "sweep" in names
    envelopes = [n for n in names if n.endswith("/envelope")]
    assert len(envelopes) == 2
    assert any(n.endswith(":grade]/stdout") for n in names)
    assert any(n.endswith(":reset]/stderr") for n in names)
    assert names == artifacts(store, finished.id)
    result = verify_seal(store, _sweep(store, "sealme"))
    assert result.ok and result.checked == len(names)


def test_altered_envelope_is_named(store: Store, finished: Sweep, tmp_path: Path) -> None:
    """One envelope's bytes changed after sealing: verify fails and names that envelope."""
    seal(store, finished.id, directory=tmp_path)
    with store.session() as session:
        execution = session.scalars(
            select(Execution)
            .join(Attempt, Attempt.id == Execution.attempt_id)
            .where(Attempt.sweep_id == finished.id, Execution.envelope.is_not(None))
            .order_by(Execution.id)
        ).first()
        assert execution is not None and execution.envelope is not None
        attempt = session.get_one(Attempt, execution.attempt_id)
        # One byte more: the kind of edit nobody would see by reading the JSON.
        execution.envelope = execution.envelope + b"\n"
        expected = f"attempt[{attempt.task}|{attempt.model}|{attempt.trial}]/execution[1]/envelope"
    result = verify_seal(store, _sweep(store, "sealme"))
    assert not result.ok
    assert result.changed == [expected]
    assert result.lines() == [f"changed: {expected}"]


def test_missing_added_and_manifest_changes(store: Store, finished: Sweep, tmp_path: Path) -> None:
    """A deleted phase is missing, an edited or lost manifest is reported.

    Every sealed field, added rows and malformed manifests: `test_seal_fields.py`.
    """
    sealed = seal(store, finished.id, directory=tmp_path)
    with store.session() as session:
        phase = session.scalars(
            select(Phase)
            .join(Execution, Execution.id == Phase.execution_id)
            .join(Attempt, Attempt.id == Execution.attempt_id)
            .where(Attempt.sweep_id == finished.id, Phase.name == "grade")
            .order_by(Phase.id)
        ).first()
        assert phase is not None
        session.delete(phase)
    result = verify_seal(store, _sweep(store, "sealme"))
    # The grade, and the phase after it (the evidence move), whose position in its name moved up.
    assert any(":grade]" in n for n in result.missing)
    assert all(":grade]" in n or ":evidence]" in n for n in result.missing)
    sealed.path.write_bytes(sealed.path.read_bytes().replace(b'"algorithm"', b'"algorithm" '))
    result = verify_seal(store, _sweep(store, "sealme"))
    assert any("manifest" in p and "changed" in p for p in result.problems)
    sealed.path.unlink()
    assert "cannot be read" in verify_seal(store, _sweep(store, "sealme")).problems[0]


def test_sealed_sweep_takes_no_new_executions(
    store: Store, finished: Sweep, tmp_path: Path
) -> None:
    """Claims skip a sealed sweep even if an attempt is put back in the queue; submit refuses."""
    seal(store, finished.id, directory=tmp_path)
    with store.session() as session:
        session.execute(
            update(Attempt)
            .where(Attempt.sweep_id == finished.id)
            .values(state=AttemptState.QUEUED, outcome=None)
        )
        bed_id = session.scalars(select(Execution.bed_id)).first()
    assert bed_id is not None
    assert claim_next(store, bed_id, lease_seconds=60, worker="t", sweep_id=finished.id) is None
    with pytest.raises(SealedSweep, match="sealed"):
        submit(store, spec("sealme", tasks=1, models=2, trials=2, diff=False))
    # Submitting what is already there adds nothing, so it is not refused.
    assert submit(store, spec("sealme", tasks=1, models=2, trials=1, diff=False)).created == 0


def test_seal_refuses_unfinished_and_resealing(
    store: Store, finished: Sweep, tmp_path: Path
) -> None:
    """Only finished evidence is sealed; a second seal needs --replace; verify needs a seal."""
    with pytest.raises(BadInput, match="is not sealed"):
        verify_seal(store, finished)
    submit(store, spec("sealme", tasks=1, models=2, trials=2, diff=False))
    with pytest.raises(BadInput, match="not finished"):
        seal(store, finished.id, directory=tmp_path)
    EmbeddedExecutor(store, finished.id).run()
    seal(store, finished.id, directory=tmp_path)
    with pytest.raises(BadInput, match="--replace"):
        seal(store, finished.id, directory=tmp_path)
    again = seal(store, finished.id, directory=tmp_path, replace=True)
    assert again.artifacts > 0 and verify_seal(store, _sweep(store, "sealme")).ok


def test_a_cancelled_sealed_sweep_is_still_sealed(
    store: Store, finished: Sweep, tmp_path: Path
) -> None:
    """Sealed is sealed whatever the sweep's state: after a cancel, retry (the command's and the
    dashboard's) and the check itself refuse it as sealed, not merely as cancelled."""
    from apg_farm.dashboard.actions import retry
    from apg_farm.results import refuse_if_sealed
    from apg_farm.store import cancel_sweep

    cancel_sweep(store, finished.id)
    seal(store, finished.id, directory=tmp_path)
    with pytest.raises(SealedSweep, match="sealed"):
        cancel_sweep(store, finished.id)  # its record is closed: not even a second cancel
    sealed = _sweep(store, "sealme")
    assert sealed.state == "cancelled" and sealed.sealed_at is not None
    with pytest.raises(SealedSweep, match="sealed"):
        refuse_if_sealed(sealed)
    with pytest.raises(SealedSweep, match="sealed"):
        retry(store, finished.id, ["error", "invalid"])
