"""Capacity warnings (#31, part 5): `demo --faults` ran on 1 of 4 beds, 3 quarantined, without a
word. The pool's beds by state, and the line every place that runs or prices a sweep prints:
`sweep resume` (the embedded run of `run`, `demo`), `sweep status` (and --watch, the dashboard's
live view: the same snapshot) and the dry run."""

from __future__ import annotations

from pathlib import Path

import pytest

from apg_farm.results import render_watch, watch_snapshot
from apg_farm.scheduler import estimate_sweep, submit
from apg_farm.store import Store, pool_capacity, quarantine_bed
from apg_farm.store.lifecycle import remove_bed
from apg_farm.store.models import Bed
from tests.support.cli_runner import run_main
from tests.support.simbeds import make_beds, spec


def test_the_pool_says_how_many_of_its_beds_run(
    sqlite_only_store: Store,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    store = sqlite_only_store
    beds = make_beds(store, tmp_path / "beds", 4)
    pool = beds[0].pool
    with store.read() as session:
        assert pool_capacity(session, pool).warning() is None
    for bed in beds[1:3]:
        quarantine_bed(store, bed.name, "reset failed")
    with store.session() as session:
        # A removed bed is gone from the pool, not out of it.
        remove_bed(session, session.get_one(Bed, beds[3].id), "retired")
    expected = f"running on 1 of 3 beds of pool {pool}: 2 quarantined"
    with store.read() as session:
        assert pool_capacity(session, pool).warning() == expected

    sweep = spec("cap", tasks=1, models=1, trials=1)
    assert f"capacity: {expected}" in estimate_sweep(store, sweep).describe()
    assert estimate_sweep(store, sweep).as_dict()["capacity_warning"] == expected
    sweep_id = submit(store, sweep).sweep_id
    snap = watch_snapshot(store, sweep_id)
    assert snap["capacity"] == expected
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(render_watch(snap))
    assert expected in console.export_text()

    monkeypatch.setenv("APG_FARM_DATABASE_URL", store.url)
    monkeypatch.setenv("COLUMNS", "200")
    _, err = run_main(monkeypatch, capsys, "sweep", "resume", "cap")
    assert f"capacity: {expected}" in " ".join(err.split())
    # The bar shows what --watch shows: time left and the pass rate so far.
    assert "ETA" in err and "this run" in err
