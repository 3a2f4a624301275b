"""The farm on container beds: web commands in a real web container on the real Docker engine,
under both assignments of run and grade (web or host), and an agent that leaves processes behind.

Needs the engine and the image of fixtures/container (`APG_FARM_TEST_BED_IMAGE`, exported by
.ci/run): skipped without them locally, a failure under CI.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from apg_farm.contract import Outcome
from apg_farm.fixtures import simbed
from apg_farm.scheduler import submit
from apg_farm.store import Attempt, Bed, Execution, Phase, Store, requeue_expired
from apg_farm.workers import AttemptEngine, EmbeddedExecutor
from tests.support.backends import SQLITE_ONLY
from tests.support.services import live_processes
from tests.support.simbeds import bed_image, make_beds, spec
from tests.workers.test_embedded import faults_are_contained
from tests.workers.test_quarantine import Operator

#: run and grade as host commands; the default assignment has them as web commands.
HOST_RUN_GRADE = [
    c for c in simbed.DEFAULT_WEB_COMMANDS if c not in ("ai-eval-run", "ai-eval-grade")
]
ASSIGNMENTS = {"web": list(simbed.DEFAULT_WEB_COMMANDS), "host": HOST_RUN_GRADE}
#: Bed commands of an attempt (after enrolment installed the settings the container needs).
ATTEMPT_COMMANDS = ("ai-eval-reset", "ai-eval-run", "ai-eval-grade")


@pytest.fixture(scope="module")
def image() -> str:
    return bed_image()


@pytest.fixture
def beds_made(tmp_path: Path) -> Iterator[list[Path]]:
    """Approots whose containers are removed at the end, whatever the test did."""
    made: list[Path] = []
    yield made
    for approot in made:
        simbed.stop_container(approot)


def _container_beds(
    store: Store,
    root: Path,
    made: list[Path],
    image: str,
    count: int = 1,
    *,
    assignment: str = "web",
    faults: dict[str, Any] | None = None,
    config: dict[str, Any] | None = None,
) -> list[Bed]:
    beds = make_beds(
        store,
        root,
        count,
        image=image,
        prefix=f"c{root.name[-6:].replace('-', '')}x",
        config={"web_commands": ASSIGNMENTS[assignment], **(config or {})},
        faults={i: faults for i in range(count)} if faults else None,
    )
    made.extend(Path(b.approot) for b in beds)
    return beds


def _phases(store: Store, execution_id: int) -> list[Phase]:
    with store.session() as session:
        rows = list(
            session.scalars(
                select(Phase).where(Phase.execution_id == execution_id).order_by(Phase.id)
            )
        )
        session.expunge_all()
        return rows


def _container_ps(approot: Path, command: str) -> list[list[Any]]:
    """What the simulated bed saw running in its container during each `command`."""
    return [
        line.get("container_ps", [])
        for line in simbed.read_log(approot)
        if line.get("command") == command and "hook" not in line
    ]


@SQLITE_ONLY  # a minute a test; its store paths run on both backends elsewhere
@pytest.mark.parametrize("assignment", ["web", "host"])
def test_a_sweep_on_container_beds(
    assignment: str,
    store: Store,
    tmp_path: Path,
    beds_made: list[Path],
    image: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every attempt ends graded; the settings web commands need reached the container and none
    of the farm's did, and the farm listed the container's processes around each run."""
    farm_secrets = {"APG_FARM_DATABASE_URL", "APG_FARM_BROKER_URL", "AWS_SECRET_ACCESS_KEY"}
    for name in farm_secrets:
        # A broker URL the settings accept (a Redis URL), carrying the same secret.
        value = "redis://:hunter2@127.0.0.1:9/0" if name == "APG_FARM_BROKER_URL" else "hunter2"
        monkeypatch.setenv(name, value)
    beds = _container_beds(store, tmp_path, beds_made, image, 2, assignment=assignment)
    sweep_id = submit(store, spec(tasks=2, models=1, trials=2)).sweep_id
    result = EmbeddedExecutor(store, sweep_id).run()
    assert result.errors == [] and result.stranded == 0
    with store.session() as session:
        outcomes = [a.outcome for a in session.scalars(select(Attempt))]
        executions = list(session.scalars(select(Execution)))
    assert set(outcomes) <= {Outcome.FAILED, Outcome.PASSED} and len(outcomes) == 4
    for execution in executions:
        names = [p.name for p in _phases(store, execution.id)]
        assert names.index("web_environment") < names.index("processes_before")
        assert names.index("processes_before") < names.index("run")
        assert names.index("run") < names.index("processes_after") < names.index("verify_after")
        grade = next(p for p in _phases(store, execution.id) if p.name == "grade")
        # AI_PG_NO_IMPORT reached the grade wherever it ran: nothing was stored in Drupal.
        assert "APG_GRADE_NOT_STORED" not in grade.stderr
    in_container = 0
    for bed in beds:
        config = (Path(bed.approot) / ".ddev" / "config.apg-farm.yaml").read_text()
        assert "AI_PG_NO_IMPORT=1" in config
        for line in simbed.read_log(Path(bed.approot)):
            names = set(line.get("env", []))
            assert not names & farm_secrets, line
            # Commands of the attempts (after enrolment installed the settings) in the container.
            if line.get("container") and line.get("command") in ATTEMPT_COMMANDS:
                in_container += 1
                assert "AI_PG_NO_IMPORT" in names, line
    assert in_container > 0


@SQLITE_ONLY
@pytest.mark.parametrize("assignment", ["web", "host"])
def test_an_agent_left_running_is_stopped_before_verification(
    assignment: str, store: Store, tmp_path: Path, beds_made: list[Path], image: str
) -> None:
    """The agent leaves a process that would rewrite the grader later: it is killed before the
    verify, nothing of it runs during verify and grade, and the verdict is the agent's own."""
    # A 60 s real delay (the bed divides it by its time scale): only a process left alone that
    # long could tamper, and the farm must not leave it alone.
    [bed] = _container_beds(
        store,
        tmp_path,
        beds_made,
        image,
        assignment=assignment,
        faults={"linger": {"delay": 60 * 2000, "tamper": True}},
    )
    sweep_id = submit(store, spec(tasks=1, models=1, trials=1)).sweep_id
    report = AttemptEngine(store, bed.name, worker="w").run_next(sweep_id=sweep_id)
    assert report is not None and report.outcome in (Outcome.PASSED, Outcome.FAILED)
    approot = Path(bed.approot)
    names = [p.name for p in _phases(store, report.claim.execution_id)]
    if assignment == "web":
        # In the container, where the killed `ddev` cannot reach it: the farm stopped it.
        assert "stop_agent" in names, names
    else:
        # On the host, in a session of its own: it came back to the farm when the run ended.
        assert not _host_lingers(approot)
    for seen in _container_ps(approot, "ai-eval-grade"):
        assert not any("apg-sim-linger" in " ".join(map(str, p)) for p in seen), seen
    verify_log = (approot / ".apg-sim" / "verify-ps.log").read_text()
    assert "linger=0" in verify_log.splitlines()[-1]
    name = simbed.container_name(approot)
    ps = subprocess.run(
        ["docker", "exec", name, "ps", "-e", "-o", "args="], capture_output=True, text=True
    )
    assert ps.returncode == 0 and "apg-sim-linger" not in ps.stdout


def _host_lingers(approot: Path) -> bool:
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                cmdline = Path(f"/proc/{name}/cmdline").read_bytes()
            except OSError:
                continue
            if b"apg-sim-linger" in cmdline and str(approot).encode() in cmdline:
                return True
    return False


@SQLITE_ONLY
@pytest.mark.parametrize("assignment", ["web", "host"])
def test_a_run_timeout_leaves_nothing_running(
    assignment: str, store: Store, tmp_path: Path, beds_made: list[Path], image: str
) -> None:
    """The farm kills the host-side `ddev` at the run timeout; the run itself goes on in the
    container until the farm stops it, before the verify. The agent could hang its run on
    purpose, so the run is graded as its failure (NO_ATTEMPT), never retried."""
    [bed] = _container_beds(
        store,
        tmp_path,
        beds_made,
        image,
        assignment=assignment,
        faults={"agent_timeout": True},
        config={"agent_timeout_s": 2000 * 120},
    )
    sweep_id = submit(
        store, spec(tasks=1, models=1, trials=1, retries=0, timeouts=_short_run())
    ).sweep_id
    report = AttemptEngine(store, bed.name, worker="w").run_next(sweep_id=sweep_id)
    assert report is not None and report.outcome == Outcome.NO_ATTEMPT, report
    phases = _phases(store, report.claim.execution_id)
    run = next(p for p in phases if p.name == "run")
    assert run.timed_out
    names = [p.name for p in phases]
    assert "verify_after" in names and "grade" in names, names
    if assignment == "web":
        # The run goes on in the container after its `ddev` was killed: the farm stopped it.
        assert "stop_agent" in names, names
    assert not _host_lingers_run(Path(bed.approot))
    ps = subprocess.run(
        ["docker", "exec", simbed.container_name(Path(bed.approot)), "ps", "-e", "-o", "args="],
        capture_output=True,
        text=True,
    )
    assert "ai-eval-run" not in ps.stdout


def _host_lingers_run(approot: Path) -> bool:
    """An `ai-eval-run` of this bed still running on the host."""
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                cmdline = Path(f"/proc/{name}/cmdline").read_bytes()
                cwd = os.readlink(f"/proc/{name}/cwd")
            except OSError:
                continue
            if b"ai-eval-run" in cmdline and cwd == str(approot):
                return True
    return False


def _short_run() -> Any:
    from apg_farm.specs import Timeouts

    return Timeouts(verify=30, reset=30, run=2, grade=30)


@SQLITE_ONLY
def test_a_bed_whose_agent_was_not_confirmed_stopped_is_restarted_first(
    store: Store, tmp_path: Path, beds_made: list[Path], image: str
) -> None:
    """The farm died between the run and the stop (as a killed worker does): the bed's next
    attempt restarts the web container before anything else, and nothing of the agent survives."""
    [bed] = _container_beds(
        store, tmp_path, beds_made, image, faults={"linger": {"delay": 60 * 2000}}
    )
    sweep_id = submit(store, spec(tasks=1, models=1, trials=2)).sweep_id

    def die() -> None:
        raise RuntimeError("worker gone")

    first = AttemptEngine(store, bed.name, worker="dead", transport=Operator("ai-eval-run", die))
    report = first.run_next(sweep_id=sweep_id)
    assert report is not None and report.verdict.action == "retry"
    approot = Path(bed.approot)
    simbed.write_faults(approot, {})  # the next agent is well behaved
    second = AttemptEngine(store, bed.name, worker="next").run_next(sweep_id=sweep_id)
    assert second is not None
    names = [p.name for p in _phases(store, second.claim.execution_id)]
    assert names[:4] == ["escrow_check", "ddev_check", "stop_strays", "restart"], names
    for seen in _container_ps(approot, "ai-eval-reset")[-1:]:
        assert not any("apg-sim-linger" in " ".join(map(str, p)) for p in seen), seen


@SQLITE_ONLY
@pytest.mark.slow
@pytest.mark.parametrize("assignment", ["web", "host"])
def test_faults_are_contained_on_container_beds(
    assignment: str, store: Store, tmp_path: Path, beds_made: list[Path], image: str
) -> None:
    """The faults test of tests/workers/test_embedded.py (reset failure, tampering agent, adapter failure,
    a skipped task, on a 5-bed pool) on container beds."""
    try:
        faults_are_contained(
            store, tmp_path, image=image, config={"web_commands": ASSIGNMENTS[assignment]}
        )
    finally:
        beds_made.extend(p for p in (tmp_path / "beds").iterdir() if p.is_dir())


@pytest.mark.parametrize("assignment", ["web", "host"])
def test_a_sigkilled_worker_leaves_nothing_running(
    assignment: str, tmp_path: Path, beds_made: list[Path], image: str
) -> None:
    """A worker process SIGKILLed mid-run takes its host-side `ddev` with it, not what the agent
    started: a daemon in the web container (ai-eval-run a web command) or a `setsid` daemon on
    the host (ai-eval-run a host command; the worker, its reaper, died). The bed's next attempt
    kills the host's strays and restarts the web container first: the agent's last heartbeat is
    older than the next verification, and nothing of it runs afterwards."""
    url = f"sqlite:///{tmp_path / 'farm.db'}"
    store = Store(url)
    [bed] = _container_beds(
        store,
        tmp_path,
        beds_made,
        image,
        assignment=assignment,
        faults={"linger": {"delay": 60 * 2000}, "agent_timeout": True},
        config={"agent_timeout_s": 2000 * 300},
    )
    sweep_id = submit(store, spec(tasks=1, models=1, trials=1)).sweep_id
    worker = (
        "import sys\n"
        "from apg_farm.store import Store\n"
        "from workers import AttemptEngine\n"
        "engine = AttemptEngine(Store(sys.argv[1]), sys.argv[2], worker='victim', lease_seconds=2)\n"
        "engine.run_next(sweep_id=int(sys.argv[3]))\n"
    )
    victim = subprocess.Popen(
        [sys.executable, "-c", worker, url, bed.name, str(sweep_id)], start_new_session=True
    )
    approot = Path(bed.approot)
    beats = approot / simbed.SIM_DIR / "linger.log"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not beats.exists():
            time.sleep(0.1)
        assert beats.exists(), "the victim's agent never started its daemon"
    finally:
        os.killpg(victim.pid, signal.SIGKILL)
        victim.wait()
    size = beats.stat().st_size
    time.sleep(0.5)
    assert beats.stat().st_size > size, "the agent's daemon should outlive its killed worker"
    time.sleep(2.0)
    assert requeue_expired(store) == 1
    simbed.write_faults(approot, {})
    report = AttemptEngine(store, bed.name, worker="next").run_next(sweep_id=sweep_id)
    assert report is not None and report.outcome in (Outcome.PASSED, Outcome.FAILED)
    phases = _phases(store, report.claim.execution_id)
    names = [p.name for p in phases]
    assert names[:4] == ["escrow_check", "ddev_check", "stop_strays", "restart"], names
    verify = next(p for p in phases if p.name == "verify_before")
    last_beat = float(beats.read_text().splitlines()[-1].split()[0])
    assert last_beat < verify.started_at.timestamp(), "the agent still ran during verification"
    size = beats.stat().st_size
    time.sleep(0.3)
    assert beats.stat().st_size == size
    assert not live_processes("apg-sim-linger", str(approot))
    inside = subprocess.run(
        ["docker", "exec", simbed.container_name(approot), "ps", "-e", "-o", "args="],
        capture_output=True,
        text=True,
    ).stdout
    assert "apg-sim-linger" not in inside and "ai-eval-run" not in inside
    store.dispose()


def _ran(store: Store) -> bool:
    with store.session() as session:
        return session.scalar(select(Phase.id).where(Phase.name == "processes_before")) is not None
