"""The live sweep view, read from a real store mid-sweep and rendered to text (no terminal)."""

from __future__ import annotations

import io
from datetime import timedelta
from pathlib import Path

import pytest
from rich.console import Console
from sqlalchemy import update

from apg_farm.results import render_watch, watch_snapshot
from apg_farm.scheduler import submit
from apg_farm.store import Bed, BedState, Execution, Store, claim_next, start_phase, utcnow
from apg_farm.workers import AttemptEngine
from tests.support.simbeds import make_beds, spec


def test_snapshot_and_render_mid_sweep(store: Store, tmp_path: Path) -> None:
    """One attempt done, one running in its reset on bed1, two queued, bed2 quarantined."""
    # Given a sweep of 4 attempts with one finished on bed0
    beds = make_beds(store, tmp_path, 3)
    sweep_id = submit(store, spec("live", tasks=1, models=2, trials=2, diff=False)).sweep_id
    report = AttemptEngine(store, "bed0", worker="w0").run_next(sweep_id=sweep_id)
    assert report is not None and report.outcome is not None
    # and one claimed by bed1, 30 s into the execution, whose reset started 8 s ago
    claim = claim_next(store, beds[1].id, lease_seconds=600, worker="w1", sweep_id=sweep_id)
    assert claim is not None
    now = utcnow()
    with store.session() as session:
        session.execute(
            update(Execution)
            .where(Execution.id == claim.execution_id)
            .values(started_at=now - timedelta(seconds=30))
        )
        session.execute(
            update(Bed)
            .where(Bed.id == beds[2].id)
            .values(state=BedState.QUARANTINED, state_reason="reset failed: APG_RESET_GRADER_DRIFT")
        )

    start_phase(store, beds[1].id, "reset", now - timedelta(seconds=8))

    # When the view is read
    snap = watch_snapshot(store, sweep_id, now=now)

    # Then progress, the running attempt's phase and times, the quarantine and the ETA are right
    assert (snap["total"], snap["done"], snap["queued"]) == (4, 1, 2)
    assert sum(m["done"] for m in snap["models"]) == 1
    assert sum(m["running"] for m in snap["models"]) == 1
    [running] = snap["running"]
    assert running["bed"] == "bed1" and running["task"] == claim.task
    assert running["phase"] == "reset"
    assert running["elapsed"] == pytest.approx(30, abs=0.01)
    assert running["phase_elapsed"] == pytest.approx(8, abs=0.01)
    assert snap["quarantined"] == [
        {"bed": "bed2", "reason": "reset failed: APG_RESET_GRADER_DRIFT"}
    ]
    typical = snap["median_execution_seconds"]
    assert typical is not None and typical > 0
    assert snap["active_beds"] == 2
    assert snap["eta_seconds"] == pytest.approx((2 * typical + max(0.0, typical - 30)) / 2)

    console = Console(file=io.StringIO(), width=200, record=True, color_system=None)
    console.print(render_watch(snap))
    text = console.export_text()
    assert "sweep live" in text and "1/4 done, 1 running, 2 queued on 2 active beds" in text
    assert "ETA " in text and "progress per model" in text
    line = next(line for line in text.splitlines() if "bed1" in line)
    assert claim.task in line and "reset" in line and "0m08s" in line and "0m30s" in line
    assert "quarantined beds" in text and "APG_RESET_GRADER_DRIFT" in text


def test_finished_sweep_says_so(store: Store, tmp_path: Path) -> None:
    """With nothing queued or running the view says finished instead of an ETA."""
    make_beds(store, tmp_path, 1)
    sweep_id = submit(store, spec("done", tasks=1, models=1, trials=1, diff=False)).sweep_id
    assert AttemptEngine(store, "bed0", worker="w").run_next(sweep_id=sweep_id) is not None
    snap = watch_snapshot(store, sweep_id)
    assert snap["eta_seconds"] == 0.0 and snap["running"] == []
    console = Console(file=io.StringIO(), width=160, record=True, color_system=None)
    console.print(render_watch(snap))
    text = console.export_text()
    assert "finished" in text and "ETA" not in text and "no attempt running" in text


def test_runs_bar_shows_each_beds_attempt_until_the_run_is_over(
    sqlite_only_store: Store, tmp_path: Path
) -> None:
    """`run`'s bar, as a terminal draws it: the running attempts per bed under it (what
    `--watch` shows), re-read at most every `every` seconds; none in the frame after the run."""
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn

    from apg_farm.cli.progress import RunningBeds, run_progress

    store = sqlite_only_store
    beds = make_beds(store, tmp_path, 2)
    sweep_id = submit(store, spec("bar", tasks=1, models=1, trials=2, diff=False)).sweep_id
    claim = claim_next(store, beds[1].id, lease_seconds=600, worker="w1", sweep_id=sweep_id)
    assert claim is not None
    start_phase(store, beds[1].id, "run", utcnow() - timedelta(seconds=5))
    running = RunningBeds(store, sweep_id, every=3600)

    def frame() -> str:
        console = Console(
            file=io.StringIO(), width=160, record=True, color_system=None, force_terminal=True
        )
        progress = run_progress(
            running, TextColumn("attempts"), BarColumn(), MofNCompleteColumn(), console=console
        )
        progress.add_task("attempts", total=2, completed=0)
        console.print(progress.get_renderable())
        return console.export_text()

    shown = frame()
    assert "0/2" in shown and "running attempts per bed" in shown
    line = next(line for line in shown.splitlines() if "bed1" in line)
    assert claim.task in line and "run" in line
    # Not re-read within `every`: the attempt ending now is still shown, from the last read.
    claimed_bed = beds[1].id
    with store.session() as session:
        session.execute(update(Bed).where(Bed.id == claimed_bed).values(phase=None))
    assert "bed1" in frame()
    running.over = True
    assert "running attempts per bed" not in frame()
