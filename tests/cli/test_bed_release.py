"""`bed release` runs the bed's doctor first (#31, part 5): a bed its doctor calls NOT healthy
used to be released silently and was quarantined again a second later. It now stays out (exit 1)
with the doctor's findings; `--force` releases it anyway; a healthy bed is released."""

from __future__ import annotations

from pathlib import Path

import pytest

from apg_farm.store import Bed, BedState, Store, quarantine_bed
from tests.support.cli_runner import run_main
from tests.support.simbeds import make_beds


def _state(store: Store, name: str) -> str:
    with store.read() as session:
        return str(session.query(Bed).filter_by(name=name).one().state)


def test_release_runs_the_doctor_first(
    sqlite_only_store: Store,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    store = sqlite_only_store
    (bed,) = make_beds(store, tmp_path / "beds", 1)
    monkeypatch.setenv("APG_FARM_DATABASE_URL", store.url)
    monkeypatch.setenv("COLUMNS", "200")
    baselines = sorted((Path(bed.approot) / ".ai-proving-ground").glob("baseline.*.json"))
    assert baselines, "the simulated bed records its baseline there"
    kept = {path: path.read_bytes() for path in baselines}

    # Its baseline gone: the doctor fails, the bed stays quarantined.
    quarantine_bed(store, bed.name, "reset failed")
    for path in baselines:
        path.unlink()
    _, err = run_main(monkeypatch, capsys, "bed", "release", bed.name, code=1)
    assert "NOT healthy" in err and "FAIL baseline" in err and "--force" in err
    assert _state(store, bed.name) == BedState.QUARANTINED

    out, _ = run_main(monkeypatch, capsys, "bed", "release", bed.name, "--force")
    assert "is active again" in out and _state(store, bed.name) == BedState.ACTIVE

    # Mended, then quarantined again: the doctor passes and the release goes through.
    for path, data in kept.items():
        path.write_bytes(data)
    quarantine_bed(store, bed.name, "reset failed")
    out, _ = run_main(monkeypatch, capsys, "bed", "release", bed.name)
    assert "is active again" in out and _state(store, bed.name) == BedState.ACTIVE
