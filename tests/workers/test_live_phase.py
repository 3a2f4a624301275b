"""The live phase: what `sweep status`, its `--watch` and the dashboard say a bed is running is what
the bed ran at that moment, by the simulated bed's own log of its commands (`.apg-sim/calls.jsonl`,
each `ddev` call from its process's start to its exit), on host-only beds and on container beds.

The views are sampled while a real sweep runs; each sample's phase is checked against the log at
the sample's time: a phase that runs a `ddev` command must have that command running then (and
have started when its command started), and a phase that runs none (the trusted verifier, the
hash checks), or no phase at all, must not be shown while a command surely runs.
"""

from __future__ import annotations

import io
import json
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from sqlalchemy import select

from apg_farm.contract import read_output
from apg_farm.dashboard import beds_overview
from apg_farm.fixtures import simbed
from apg_farm.results import render_watch, watch_snapshot
from apg_farm.scheduler import submit
from apg_farm.specs import Timeouts
from apg_farm.store import (
    Bed,
    Store,
    Sweep,
    claim_next,
    record_phase,
    requeue_expired,
    start_phase,
    utcnow,
)
from apg_farm.transports import Captured, CommandResult, LocalTransport
from apg_farm.workers import AttemptEngine, EmbeddedExecutor, run_canary
from tests.support.cli_runner import run_process, store_env
from tests.support.simbeds import bed_image, make_beds, spec

#: Slow enough that an agent's run takes seconds (120-900 simulated s / 100), a reset 0.36 s.
TIME_SCALE = 100
#: The `ddev` call each phase makes, in the simulated bed's log; a phase not here makes none
#: command (escrow_check, ddev_check*, stop_strays, the trusted verify_*).
LOGGED = {
    "reset": "ai-eval-reset",
    "reset_baseline": "ai-eval-reset",
    "run": "ai-eval-run",
    "grade": "ai-eval-grade",
    "grade_baseline": "ai-eval-grade",
    "grade_pin": "ai-eval-grade",
    "diff": "ai-eval-diff",
    "baseline_diff": "ai-eval-diff",
    "baseline_diff_again": "ai-eval-diff",
    "web_environment": "exec",
    "processes_reset": "exec",
    "processes_restart": "exec",
    "processes_before": "exec",
    "processes_after": "exec",
    "stop_reset": "exec",
    "stop_agent": "exec",
    "restart": "restart",
    "restart_reset": "restart",
    "restart_clean": "restart",
}
#: Seconds a call's start in the log may come after its phase's start on the bed's row (a commit,
#: a process and its interpreter started, on a machine under a load of 25), and its record after
#: its exit: well under an agent's run (1.2-9 s here), which a wrong phase would be shown through.
START_LAG = 3.0
END_LAG = 2.0


@dataclass(frozen=True)
class Sample:
    """What one view said a bed ran, read between t0 and t1 (epoch seconds)."""

    view: str
    t0: float
    t1: float
    bed: str
    phase: str | None
    #: When the view says the phase started (epoch seconds), None with no phase; at most
    #: `width` seconds later when the view gave it as an age read at an unknown moment.
    since: float | None
    width: float = 0.0


def _entries(approot: Path) -> list[dict[str, Any]]:
    """The bed's `ddev` calls as it logged them, each from its process's start to its exit."""
    return simbed.read_calls(approot)


def _problem(sample: Sample, log: list[dict[str, Any]]) -> str | None:
    """Why the sample does not match the bed's log, or None when it does."""
    command = LOGGED.get(sample.phase or "")
    if command is None:
        # No command of the bed's own (or none at all): the bed's commands run one at a time,
        # each inside its phase's start and record, so none can have run through the sample.
        surely = [e for e in log if e["start"] < sample.t0 and e["end"] > sample.t1]
        if surely:
            running = surely[0]["command"]
            return f"{sample} while the bed ran {running} ({surely[0]['start']:.3f}-{surely[0]['end']:.3f})"
        return None
    assert sample.since is not None
    mine = [
        e
        for e in log
        if e["command"] == command
        and e["start"] <= sample.t1 + START_LAG
        and e["end"] >= sample.t0 - END_LAG
        and sample.since - 0.05 <= e["start"] <= sample.since + sample.width + START_LAG
    ]
    if not mine:
        near = [
            (e["command"], round(e["start"], 3), round(e["end"], 3))
            for e in log
            if e["start"] <= sample.t1 + 5 and e["end"] >= sample.t0 - 5
        ]
        return f"{sample}: no {command} started then and ran at that time; the log near: {near}"
    return None


def _watch_samples(store: Store, sweep_id: int) -> tuple[list[Sample], str]:
    """One read of watch_snapshot (what `sweep status`, --watch and the sweep page show), and
    the bed lines render_watch draws from it."""
    t0 = time.time()
    now = utcnow()
    snap = watch_snapshot(store, sweep_id, now=now)
    t1 = time.time()
    samples = []
    for row in snap["running"]:
        since = None
        if row["phase"] is not None:
            since = (now - timedelta(seconds=row["phase_elapsed"])).timestamp()
        else:
            assert row["phase_elapsed"] is None and row["phase_started_at"] is None
        samples.append(Sample("watch", t0, t1, row["bed"], row["phase"], since))
    console = Console(file=io.StringIO(), width=220, record=True, color_system=None)
    console.print(render_watch(snap))
    return samples, console.export_text()


def _dashboard_samples(store: Store) -> list[Sample]:
    """One read of the dashboard's beds data: each busy bed's running attempt and phase."""
    t0 = time.time()
    overview = beds_overview(store)
    t1 = time.time()
    samples = []
    for host in overview["hosts"]:
        for bed in host["beds"]:
            running = bed["running"]
            if running is None:
                continue
            # The dashboard's clock: phase_elapsed was taken at a moment inside [t0, t1].
            since = None if running["phase"] is None else t0 - running["phase_elapsed"]
            samples.append(
                Sample("dashboard", t0, t1, bed["name"], running["phase"], since, t1 - t0)
            )
    return samples


def _cli_samples(store: Store, home: Path, sweep: str) -> list[Sample]:
    """`apg-farm sweep status NAME --json` as a process: its live view's running phases."""
    t0 = time.time()
    done = run_process(store_env(home, store.url), "sweep", "status", sweep, "--json")
    t1 = time.time()
    live = json.loads(done.stdout)["live"]
    return [
        Sample(
            "cli",
            t0,
            t1,
            row["bed"],
            row["phase"],
            None
            if row["phase_started_at"] is None
            else datetime.fromisoformat(row["phase_started_at"]).timestamp(),
            0.001,
        )
        for row in live["running"]
    ]


def _sample_sweep(
    store: Store, sweep_id: int, home: Path, *, cli_after: int = 20
) -> tuple[list[Sample], list[str]]:
    """Run the sweep on every bed of its pool and read the views until it ends: watch and
    dashboard in turn, and once (after `cli_after` reads) the command as a process."""
    result: list[Any] = []
    executor = EmbeddedExecutor(store, sweep_id, start_window=0.5)
    worker = threading.Thread(target=lambda: result.append(executor.run()), daemon=True)
    worker.start()
    samples: list[Sample] = []
    rendered: list[str] = []
    with store.read() as session:
        name = session.scalars(select(Sweep.name).where(Sweep.id == sweep_id)).one()
    reads = 0
    while worker.is_alive():
        reads += 1
        if reads == cli_after:
            samples.extend(_cli_samples(store, home, name))
        elif reads % 2:
            found, text = _watch_samples(store, sweep_id)
            samples.extend(found)
            rendered.extend(line for line in text.splitlines() if any(s.bed in line for s in found))
        else:
            samples.extend(_dashboard_samples(store))
        time.sleep(0.02)
    worker.join()
    [ran] = result
    assert ran.errors == [] and ran.stranded == 0
    return samples, rendered


def _check_samples(store: Store, samples: list[Sample]) -> None:
    with store.read() as session:
        roots = {b.name: Path(b.approot) for b in session.scalars(select(Bed))}
    logs = {name: _entries(root) for name, root in roots.items()}
    problems = [p for s in samples if (p := _problem(s, logs[s.bed])) is not None]
    assert problems == [], "\n".join(problems[:10])
    seen = {(s.view, s.phase) for s in samples}
    # The run is most of an attempt: every view saw it, and the cli's process read the view once.
    assert {("watch", "run"), ("dashboard", "run")} <= seen, seen
    assert any(s.view == "cli" for s in samples) or not samples


@pytest.fixture
def beds_made(tmp_path: Path) -> Iterator[list[Path]]:
    """Approots whose containers are removed at the end, whatever the test did."""
    made: list[Path] = []
    yield made
    for approot in made:
        simbed.stop_container(approot)


@pytest.mark.slow
def test_a_live_sweep_on_host_only_beds_shows_what_runs(store: Store, tmp_path: Path) -> None:
    """Sampled while the sweep runs, each view shows the command the bed ran then, since when it
    ran; never `web_environment` (a container bed's phase) through a host-only bed's run."""
    # Given two host-only beds whose agents run for seconds
    make_beds(store, tmp_path, 2, config={"time_scale": TIME_SCALE})
    sweep_id = submit(store, spec("live", tasks=2, models=1, trials=2)).sweep_id

    # When the views are read again and again while the sweep runs
    samples, rendered = _sample_sweep(store, sweep_id, tmp_path / "home")

    # Then every phase shown was running at that moment, by the beds' own logs
    _check_samples(store, samples)
    assert not any(s.phase == "web_environment" for s in samples)
    assert any(" run " in line for line in rendered), rendered[:5]


@pytest.mark.slow
def test_a_live_sweep_on_container_beds_shows_what_runs(
    tmp_path: Path, beds_made: list[Path]
) -> None:
    """The same on beds whose web commands run in a real web container: the container's own
    phases (web_environment, the process listings, the restart after a reset) are shown when,
    and only when, they run."""
    image = bed_image()
    store = Store(f"sqlite:///{tmp_path / 'farm.db'}")
    try:
        # Given two container beds
        beds = make_beds(
            store,
            tmp_path,
            2,
            image=image,
            prefix=f"c{tmp_path.name[-6:].replace('-', '')}p",
            config={"time_scale": TIME_SCALE},
        )
        beds_made.extend(Path(b.approot) for b in beds)
        sweep_id = submit(store, spec("live", tasks=1, models=1, trials=2)).sweep_id

        # When the views are read while the sweep runs
        samples, _ = _sample_sweep(store, sweep_id, tmp_path / "home", cli_after=30)

        # Then every phase shown was running then, the container's own included
        _check_samples(store, samples)
    finally:
        store.dispose()


def _result(argv: tuple[str, ...], seconds: float = 0.5) -> CommandResult:
    empty = Captured(data=b"", total=0, truncated=False)
    return CommandResult(argv=argv, rc=0, stdout=empty, stderr=empty, duration=seconds)


def _bed_phase(store: Store, bed_id: int) -> tuple[str | None, Any]:
    with store.read() as session:
        bed = session.get_one(Bed, bed_id)
        return bed.phase, bed.phase_started_at


def test_a_phase_is_shown_from_its_start_to_its_record(store: Store, tmp_path: Path) -> None:
    """start_phase puts the phase on the bed's row and in the view, since its start; its record
    takes it off (and only its own: a later start stays); the view then shows no phase."""
    # Given an attempt claimed on bed0
    [bed] = make_beds(store, tmp_path, 1)
    sweep_id = submit(store, spec("one", tasks=1, models=1, trials=1)).sweep_id
    claim = claim_next(store, bed.id, lease_seconds=600, worker="w", sweep_id=sweep_id)
    assert claim is not None

    # Then, before any phase starts, the view shows the attempt running and no phase
    [row] = watch_snapshot(store, sweep_id)["running"]
    assert (row["phase"], row["phase_elapsed"], row["phase_started_at"]) == (None, None, None)

    # When its reset starts 8 s ago
    now = utcnow()
    started = now - timedelta(seconds=8)
    start_phase(store, bed.id, "reset", started)

    # Then the view says reset, for 8 s
    [row] = watch_snapshot(store, sweep_id, now=now)["running"]
    assert row["phase"] == "reset" and row["phase_elapsed"] == pytest.approx(8, abs=0.01)
    console = Console(file=io.StringIO(), width=200, record=True, color_system=None)
    console.print(render_watch(watch_snapshot(store, sweep_id, now=now)))
    line = next(t for t in console.export_text().splitlines() if "bed0" in t)
    assert "reset" in line and "0m08s" in line

    # When another phase's record comes (a retry of an earlier one): the reset stays
    result = _result(("ddev", "x"))
    record_phase(
        store, claim.execution_id, "verify_before", result, read_output(result),
        started - timedelta(seconds=1), sweep_id=sweep_id, bed_id=bed.id,
    )  # fmt: skip
    assert _bed_phase(store, bed.id)[0] == "reset"

    # When the reset's own record comes
    record_phase(
        store, claim.execution_id, "reset", result, read_output(result), started,
        sweep_id=sweep_id, bed_id=bed.id,
    )  # fmt: skip

    # Then the bed runs nothing, and the view says so
    assert _bed_phase(store, bed.id) == (None, None)
    [row] = watch_snapshot(store, sweep_id)["running"]
    assert row["phase"] is None and row["phase_elapsed"] is None
    console = Console(file=io.StringIO(), width=200, record=True, color_system=None)
    console.print(render_watch(watch_snapshot(store, sweep_id)))
    line = next(t for t in console.export_text().splitlines() if "bed0" in t)
    assert "reset" not in line and "—" in line


def test_a_phase_a_dead_worker_left_is_not_shown(store: Store, tmp_path: Path) -> None:
    """A worker that died mid-phase leaves it on the bed's row: the lost try's requeue clears
    it, and so does the bed's next claim, so no later attempt is shown in a dead one's phase."""
    # Given an attempt whose worker died in its run, its lease run out
    [bed] = make_beds(store, tmp_path, 1)
    sweep_id = submit(
        store, spec("dead", tasks=1, models=1, trials=2, timeouts=Timeouts(run=60))
    ).sweep_id
    first = claim_next(store, bed.id, lease_seconds=0.1, worker="w", sweep_id=sweep_id)
    assert first is not None
    start_phase(store, bed.id, "run", utcnow())
    assert _bed_phase(store, bed.id)[0] == "run"
    time.sleep(0.3)

    # When the reconciler takes it back
    assert requeue_expired(store) == 1

    # Then the bed runs nothing
    assert _bed_phase(store, bed.id) == (None, None)

    # And a phase left behind is cleared by the next claim too
    start_phase(store, bed.id, "run", utcnow())
    second = claim_next(store, bed.id, lease_seconds=600, worker="w2", sweep_id=sweep_id)
    assert second is not None
    assert _bed_phase(store, bed.id) == (None, None)
    [row] = watch_snapshot(store, sweep_id)["running"]
    assert row["phase"] is None


def test_a_verdict_clears_a_phase_whose_command_raised(store: Store, tmp_path: Path) -> None:
    """A phase whose command never came back to be recorded (the transport raised) is not
    shown after its attempt ends: the verdict clears it."""

    class Broken(LocalTransport):
        """A transport whose reset raises, as a link torn down mid-command does."""

        def run(self, argv: Sequence[str], **kwargs: Any) -> CommandResult:
            if "ai-eval-reset" in argv:
                raise OSError("the link went down")
            return super().run(argv, **kwargs)

    [bed] = make_beds(store, tmp_path, 1)
    sweep_id = submit(store, spec("broken", tasks=1, models=1, trials=1, retries=0)).sweep_id
    engine = AttemptEngine(store, bed.name, worker="w", transport=Broken())
    report = engine.run_next(sweep_id=sweep_id)
    assert report is not None and "the link went down" in report.verdict.reason
    assert _bed_phase(store, bed.id) == (None, None)


def test_a_canary_shows_each_command_on_its_bed_while_it_runs(store: Store, tmp_path: Path) -> None:
    """A canary's commands (no attempt, no execution) are on the bed's row while each runs, for
    the beds' views; the row is clear once the canary is recorded."""
    [enrolled] = make_beds(store, tmp_path, 1)
    seen: list[str | None] = []

    class Looking(LocalTransport):
        """The real local transport, reading the bed's row as each command starts."""

        def run(self, argv: Sequence[str], **kwargs: Any) -> CommandResult:
            seen.append(_bed_phase(store, enrolled.id)[0])
            return super().run(argv, **kwargs)

    with store.read() as session:
        bed = session.get_one(Bed, enrolled.id)
        session.expunge(bed)
    result = run_canary(
        store, bed, worker="w", trigger="test", transport=Looking(), task=simbed.DEFAULT_TASKS[0]
    )
    assert result.healthy, result.line()
    assert seen == ["verify_before", "reset", "grade"]
    assert _bed_phase(store, enrolled.id) == (None, None)
