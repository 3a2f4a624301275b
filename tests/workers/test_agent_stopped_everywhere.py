"""No agent process lives during a verify, a grade or the next attempt, wherever it came from:

- code the agent planted that the next reset itself runs (a drush commandfile: APG's reset ends
  with `drush cr`, which loads `<approot>/drush/`), starting a process in the web container
  after the "before the run" listing could have told it apart (fault `drush_plant`);
- a chain of daemons on the host, each in a session of its own and the parent of the next
  (fault `linger` with `chain`).

Container beds need the engine and the image of fixtures/container (APG_FARM_TEST_BED_IMAGE).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from apg_farm.beds.fingerprints import hash_ddev_config
from apg_farm.contract import Outcome
from apg_farm.fixtures import simbed
from apg_farm.fixtures.simbed import ddev as simddev
from apg_farm.scheduler import submit
from apg_farm.store import STOP_LISTING, Bed, Store
from apg_farm.transports import CommandResult, LocalTransport
from apg_farm.workers import AttemptEngine
from tests.e2e.test_container_beds import ASSIGNMENTS, _container_ps, _phases
from tests.support.simbeds import TEST_TIME_SCALE, bed_image, make_beds, spec

#: Every model fails every task on its own: a pass can only be a leftover process's doing.
NO_SKILL = {"skill": {m: {t: 0.0 for t in simbed.DEFAULT_TASKS} for m in simbed.DEFAULT_MODELS}}


@pytest.fixture
def made(tmp_path: Path) -> Iterator[list[Path]]:
    approots: list[Path] = []
    yield approots
    for approot in approots:
        simbed.stop_container(approot)
        _kill_host_lingers(approot)


def _image(mode: str) -> str | None:
    if mode == "host-only":
        return None
    return bed_image()


def _bed(
    store: Store,
    root: Path,
    made: list[Path],
    mode: str,
    faults: dict[str, Any] | None = None,
    *,
    time_scale: int = TEST_TIME_SCALE,
) -> Bed:
    """One simulated bed: `web`/`host` (container bed, run and grade web or host commands) or
    `host-only`."""
    image = _image(mode)
    assignment = "web" if mode == "host-only" else mode
    [bed] = make_beds(
        store,
        root,
        1,
        image=image,
        prefix=f"p{root.name[-6:].replace('-', '')}{mode[:2].replace('-', '')}x",
        config={"web_commands": ASSIGNMENTS[assignment], **NO_SKILL, "time_scale": time_scale},
        faults={0: faults} if faults else None,
    )
    made.append(Path(bed.approot))
    return bed


def _host_lingers(approot: Path) -> list[int]:
    """apg-sim-linger processes of this bed on the host (outside any container)."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                cmdline = Path(f"/proc/{name}/cmdline").read_bytes()
            except OSError:
                continue
            if b"apg-sim-linger" in cmdline and str(approot).encode() in cmdline:
                found.append(int(name))
    return found


def _kill_host_lingers(approot: Path) -> None:
    for pid in _host_lingers(approot):
        with contextlib.suppress(OSError):
            os.kill(pid, 9)


def _container_lingers(approot: Path) -> list[str]:
    ps = subprocess.run(
        ["docker", "exec", simbed.container_name(approot), "ps", "-e", "-o", "args="],
        capture_output=True,
        text=True,
    )
    assert ps.returncode == 0, ps.stderr
    return [line for line in ps.stdout.splitlines() if "apg-sim-linger" in line]


class Watcher(LocalTransport):
    """The real local transport that, as each verify after a run and each grade starts, notes
    which of the bed's lingers run on the host: none may."""

    def __init__(self, approot: Path) -> None:
        super().__init__()
        self.approot = approot
        self.seen: list[tuple[str, list[int]]] = []

    def run(
        self,
        argv: Sequence[str],
        *,
        cwd: str,
        env: Mapping[str, str],
        timeout: float,
        stdout_limit: int,
        stderr_limit: int,
    ) -> CommandResult:
        joined = " ".join(argv)
        if "escrow-verify.sh" in joined and "--restore" not in argv:
            self.seen.append(("verify_after", _host_lingers(self.approot)))
        elif "ai-eval-grade" in argv:
            self.seen.append(("grade", _host_lingers(self.approot)))
        return super().run(
            argv,
            cwd=cwd,
            env=env,
            timeout=timeout,
            stdout_limit=stdout_limit,
            stderr_limit=stderr_limit,
        )


def _no_linger_during_verify_or_grade(approot: Path, watcher: Watcher, mode: str) -> None:
    assert watcher.seen, "neither a verify after the run nor a grade ran"
    for phase, pids in watcher.seen:
        assert not pids, f"lingers {pids} on the host during {phase}"
    if mode != "host-only":
        for seen in _container_ps(approot, "ai-eval-grade"):
            assert not any("apg-sim-linger" in " ".join(map(str, p)) for p in seen), seen
        verify_log = (approot / ".apg-sim" / "verify-ps.log").read_text().splitlines()
        assert verify_log and all("linger=0" in line for line in verify_log), verify_log


# --- A: what the next reset runs -------------------------------------------------------------


@pytest.mark.parametrize("mode", ["web", "host", "host-only"])
def test_a_drush_plant_is_tampered_and_the_bed_quarantined(
    mode: str, store: Store, tmp_path: Path, made: list[Path]
) -> None:
    """The agent plants a drush commandfile the next reset would run: the fingerprint taken
    right after the run sees it, the attempt is TAMPERED, the bed quarantined, and no later
    attempt runs (or is graded) on it."""
    bed = _bed(store, tmp_path, made, mode, faults={"drush_plant": {"delay": 0}})
    approot = Path(bed.approot)
    sweep_id = submit(store, spec(tasks=1, models=1, trials=2, retries=0)).sweep_id
    engine = AttemptEngine(store, bed.name, worker="w", transport=Watcher(approot))
    report = engine.run_next(sweep_id=sweep_id)
    assert report is not None and report.outcome == Outcome.TAMPERED, report
    assert "drush/Commands/" in report.verdict.reason, report.verdict.reason
    assert (approot / simddev.DRUSH_COMMANDS_REL / simddev.DRUSH_PLANT_NAME).is_file()
    names = [p.name for p in _phases(store, report.claim.execution_id)]
    assert "grade" not in names, names
    with store.session() as session:
        row = session.get_one(Bed, bed.id)
        assert row.state == "quarantined", row.state
    assert engine.run_next(sweep_id=sweep_id) is None  # no later attempt on this bed
    # No grade after the run (the one before it, `grade_pin`, pins the task's dataset hashes).
    log = simbed.read_log(approot)
    ran = min(line["start"] for line in log if line.get("command") == "ai-eval-run")
    assert not [
        line for line in log if line.get("command") == "ai-eval-grade" and line["start"] > ran
    ]
    assert not _host_lingers(approot)
    if mode != "host-only":
        assert not _container_lingers(approot)


def _plant_outside_the_fingerprint(store: Store, bed: Bed, delay_s: float) -> None:
    """The commandfile planted where the fingerprint does not look: here, recorded into it (as
    an operator who re-escrowed a planted bed would), so only the process defence stands."""
    approot = Path(bed.approot)
    simddev.plant_drush_commandfile(
        simddev.Bed(approot), {"delay": delay_s * TEST_TIME_SCALE, "chain": 0}
    )
    with store.session() as session:
        row = session.get_one(Bed, bed.id)
        row.ddev_files = hash_ddev_config(row, transport=LocalTransport())


@pytest.mark.parametrize("mode", ["web", "host", "host-only"])
def test_what_the_reset_starts_is_killed_before_the_run(
    mode: str, store: Store, tmp_path: Path, made: list[Path]
) -> None:
    """A planted commandfile the fingerprint misses: each reset starts a daemon that would mark
    the site passing shortly after. It is killed before the "before the run" listing (restart
    with no trusted listing, then kill against the listing recorded at the last confirmed stop):
    nothing of it runs during the verify or the grade, and every attempt is graded on the
    agent's own (failing) work."""
    bed = _bed(store, tmp_path, made, mode)
    approot = Path(bed.approot)
    _plant_outside_the_fingerprint(store, bed, delay_s=0.2)
    sweep_id = submit(store, spec(tasks=1, models=1, trials=3, retries=0)).sweep_id
    watcher = Watcher(approot)
    engine = AttemptEngine(store, bed.name, worker="w", transport=watcher)
    for trial in range(3):
        report = engine.run_next(sweep_id=sweep_id)
        assert report is not None, trial
        assert report.outcome == Outcome.FAILED, (trial, report.verdict)
        names = [p.name for p in _phases(store, report.claim.execution_id)]
        if mode != "host-only":
            # The first attempt finds no record of the container's files: it is restarted
            # before the verify (restart_clean), which records the trusted listing; every
            # attempt then kills what the reset started against that listing.
            if trial == 0:
                assert names.index("restart_clean") < names.index("verify_before"), names
            cleared = "stop_reset"
            assert cleared in names, (trial, names)
            assert names.index(cleared) < names.index("processes_before"), names
            with store.session() as session:
                meta = session.get_one(Bed, bed.id).meta or {}
            assert meta.get(STOP_LISTING), meta
    # Every reset did run it.
    loaded = (approot / ".apg-sim" / "drush-plant.log").read_text().splitlines()
    assert len(loaded) == 3, loaded
    _no_linger_during_verify_or_grade(approot, watcher, mode)
    time.sleep(0.4)  # past the daemon's delay: had one survived, the site would pass now
    site = simbed.read_site(approot)
    assert all(e.get("result") != "pass" for e in site.get("built", {}).values()), site
    assert not _host_lingers(approot)
    if mode != "host-only":
        assert not _container_lingers(approot)


# --- B: a chain of daemons -------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["host-only", "host"])
def test_a_chain_of_daemons_is_stopped_before_the_verify(
    mode: str, store: Store, tmp_path: Path, made: list[Path]
) -> None:
    """The agent leaves a chain of seven daemons on the host, each in a session of its own and
    the parent of the next: every one is dead before the verify, and stays dead through the
    grade; the attempt is graded on the agent's own work."""
    # A slower bed (a run of 1.2 to 9 s): the whole chain is up before the run ends. The chain
    # marks the site passing only 12 s after it started, after any run: before the fix, a
    # survivor is seen by the watcher and later grades pass.
    scale = 100
    bed = _bed(
        store,
        tmp_path,
        made,
        mode,
        faults={"linger": {"delay": 12 * scale, "pass_built": True, "chain": 6}},
        time_scale=scale,
    )
    approot = Path(bed.approot)
    sweep_id = submit(store, spec(tasks=1, models=1, trials=2, retries=0)).sweep_id
    watcher = Watcher(approot)
    engine = AttemptEngine(store, bed.name, worker="w", transport=watcher)
    for trial in range(2):
        report = engine.run_next(sweep_id=sweep_id)
        assert report is not None and report.outcome == Outcome.FAILED, (trial, report)
    beats = (approot / ".apg-sim" / "linger.log").read_text().splitlines()
    pids = {line.split()[2] for line in beats}
    assert len(pids) >= 7, pids  # the chain did start, as deep as it goes
    _no_linger_during_verify_or_grade(approot, watcher, mode)
    assert not _host_lingers(approot)


def test_after_an_unconfirmed_stop_the_restart_listing_is_the_trusted_one(
    store: Store, tmp_path: Path, made: list[Path]
) -> None:
    """The worker died after the run (no stop confirmed): the next attempt restarts the web
    container first and lists it then; what the reset starts afterwards is killed against that
    listing, with no second restart."""
    from tests.workers.test_quarantine import Operator

    bed = _bed(store, tmp_path, made, "web")
    approot = Path(bed.approot)
    _plant_outside_the_fingerprint(store, bed, delay_s=0.2)
    sweep_id = submit(store, spec(tasks=1, models=1, trials=2)).sweep_id

    def die() -> None:
        raise RuntimeError("worker gone")

    first = AttemptEngine(store, bed.name, worker="dead", transport=Operator("ai-eval-run", die))
    report = first.run_next(sweep_id=sweep_id)
    assert report is not None and report.verdict.action == "retry"
    watcher = Watcher(approot)
    second = AttemptEngine(store, bed.name, worker="next", transport=watcher)
    report = second.run_next(sweep_id=sweep_id)
    assert report is not None and report.outcome == Outcome.FAILED, report
    names = [p.name for p in _phases(store, report.claim.execution_id)]
    assert names[:5] == [
        "escrow_check",
        "ddev_check",
        "stop_strays",
        "restart",
        "processes_restart",
    ]
    assert "stop_reset" in names and "restart_reset" not in names, names
    _no_linger_during_verify_or_grade(approot, watcher, "web")
    assert not _container_lingers(approot)
