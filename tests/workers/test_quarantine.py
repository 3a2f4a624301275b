"""Quarantines are never dropped, and no unattended attempt runs on a bed whose verifier the agent
could rewrite: real engine, simulated beds, an operator's action at an exact moment."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, update

from apg_farm.beds import NewBed, add_bed, get_bed, run_escrow, run_provision
from apg_farm.contract import UNESCROWED, Outcome
from apg_farm.fixtures import simbed
from apg_farm.results import find_sweep, sweep_report
from apg_farm.scheduler import submit
from apg_farm.store import Attempt, Bed, BedState, Execution, Phase, Store, Sweep, SweepState
from apg_farm.transports import CommandResult, LocalTransport
from apg_farm.workers import AttemptEngine, AttemptReport, EmbeddedExecutor
from tests.cli.test_cli import farm
from tests.support.simbeds import TEST_TIME_SCALE, make_beds, spec


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[Store]:
    s = Store(f"sqlite:///{tmp_path / 'farm.db'}")
    yield s
    s.dispose()


class Operator(LocalTransport):
    """The real local transport; after the bed command named `after` returns, `act()` runs, as
    an operator's action (a cancel, a drain) that lands at exactly that moment."""

    def __init__(self, after: str, act: Callable[[], None]) -> None:
        super().__init__()
        self.after, self.act = after, act

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
        result = super().run(
            argv,
            cwd=cwd,
            env=env,
            timeout=timeout,
            stdout_limit=stdout_limit,
            stderr_limit=stderr_limit,
        )
        if self.after in argv:
            self.act()
        return result


def _mid_run(
    store: Store, tmp_path: Path, fault: str, act: Callable[[], None], *, lease: float = 60.0
) -> tuple[AttemptReport | None, Bed]:
    """One attempt on a bed with `fault`, `act` landing right after its run: (report, bed)."""
    [bed] = make_beds(store, tmp_path, 1, faults={0: {fault: True}})
    sweep_id = submit(store, spec(tasks=1, models=1, trials=1)).sweep_id
    engine = AttemptEngine(
        store, bed.name, worker="w", lease_seconds=lease, transport=Operator("ai-eval-run", act)
    )
    report = engine.run_next(sweep_id=sweep_id)
    return report, get_bed(store, bed.name)


def _set(store: Store, table: type[Any], **values: object) -> Callable[[], None]:
    def act() -> None:
        with store.session() as session:
            session.execute(update(table).values(**values))

    return act


def test_a_quarantine_survives_a_cancel(sqlite_store: Store, tmp_path: Path) -> None:
    """The agent leaked its token (the run says so; since #29 a bed-configuration token is a
    claim, quarantining only once the farm reproduces it); the sweep is cancelled right then:
    the attempt is CANCELLED and the bed is still quarantined."""
    cancel = _set(sqlite_store, Sweep, state=SweepState.CANCELLED)
    report, bed = _mid_run(sqlite_store, tmp_path, "leak_flood", cancel)
    assert report is not None and report.outcome == Outcome.CANCELLED
    assert bed.state == BedState.QUARANTINED and "revoke the token" in (bed.state_reason or "")


def test_a_quarantine_survives_a_lost_lease(sqlite_store: Store, tmp_path: Path) -> None:
    """The lease is lost while the bed refuses its run: the try is LOST history, the bed quarantined."""
    give_back = _set(sqlite_store, Attempt, bed_id=None, state="queued")

    def lose() -> None:
        # The reconciler gave the attempt back; the lease thread notices at its next renewal
        # (every 0.2 s), and the engine at its next phase boundary.
        give_back()
        time.sleep(0.5)

    report, bed = _mid_run(sqlite_store, tmp_path, "leak_flood", lose, lease=0.6)
    assert report is not None and report.lost
    assert bed.state == BedState.QUARANTINED and "revoke the token" in (bed.state_reason or "")


def test_a_draining_bed_is_quarantined_not_removed(sqlite_store: Store, tmp_path: Path) -> None:
    """A bed put to drain mid-attempt that is then tampered with is QUARANTINED, not REMOVED: a
    human must look before it leaves the inventory."""
    drain = _set(sqlite_store, Bed, state=BedState.DRAINING)
    report, bed = _mid_run(sqlite_store, tmp_path, "tamper", drain)
    assert report is not None and report.outcome == Outcome.TAMPERED
    assert bed.state == BedState.QUARANTINED and "judging code changed" in (bed.state_reason or "")


def test_several_reasons_are_all_kept(sqlite_store: Store, tmp_path: Path) -> None:
    """A bed already quarantined by another farm process gains the new reason beside the old."""
    elsewhere = _set(
        sqlite_store, Bed, state=BedState.QUARANTINED, state_reason="operator: disk full"
    )
    _, bed = _mid_run(sqlite_store, tmp_path, "tamper", elsewhere)
    reason = bed.state_reason or ""
    assert "operator: disk full" in reason and "judging code changed" in reason


def _unescrowed_bed(store: Store, tmp_path: Path, name: str, *, untrusted: bool) -> Bed:
    approot = tmp_path / "beds" / name
    simbed.create_bed(approot, project=name, config={"time_scale": TEST_TIME_SCALE, "seed": 11})
    ddev = simbed.install_ddev(tmp_path / "bin")
    env = (("AI_PG_ESCROW_DIR", str(tmp_path / "escrow")),)
    row = add_bed(
        store,
        NewBed(
            name=name,
            approot=approot,
            ddev=str(ddev),
            env=env,
            untrusted_verifier=untrusted,
            host_only=True,
        ),
    )
    run_provision(row)
    if untrusted:
        # `ddev ai-eval-verify` checks against an escrow set; the farm just does not run its
        # verifier directly, nor record and check the set.
        run_escrow(row)
    return row


def test_no_unattended_attempt_on_a_bed_without_escrow(sqlite_store: Store, tmp_path: Path) -> None:
    """A bed enrolled without an escrow set takes no attempt: it is quarantined with the fix."""
    store = sqlite_store
    _unescrowed_bed(store, tmp_path, "plain", untrusted=False)
    sweep_id = submit(store, spec(tasks=1, models=1, trials=1)).sweep_id
    result = EmbeddedExecutor(store, sweep_id).run()
    bed = get_bed(store, "plain")
    assert bed.state == BedState.QUARANTINED and bed.state_reason == UNESCROWED
    with store.session() as session:
        attempt = session.scalars(select(Attempt)).one()
        tries = session.scalars(select(Execution)).all()
    # Refused at the claim: nothing ran there, and the attempt did not spend a try.
    assert attempt.state == "queued" and attempt.infra_failures == 0 and tries == []
    assert result.stranded == 1


def test_the_engine_refuses_a_bed_that_lost_its_escrow_mid_claim(
    sqlite_store: Store, tmp_path: Path
) -> None:
    """A bed whose escrow set was dropped between the claim and the attempt (another farm process
    re-enrolled it): the engine runs nothing on it and quarantines it."""
    store = sqlite_store
    [bed] = make_beds(store, tmp_path, 1)
    sweep_id = submit(store, spec(tasks=1, models=1, trials=1)).sweep_id
    engine = AttemptEngine(store, bed.name, worker="w")
    original = engine._run

    def drop_escrow_then_run(claim: Any, harness: Any = None) -> AttemptReport:
        _set(store, Bed, escrow_set=None)()
        return original(claim, harness)

    engine._run = drop_escrow_then_run  # type: ignore[method-assign]
    report = engine.run_next(sweep_id=sweep_id)
    assert report is not None and report.verdict.action == "retry"
    with store.session() as session:
        phases = session.scalars(select(Phase)).all()
    assert phases == []
    bed = get_bed(store, bed.name)
    assert bed.state == BedState.QUARANTINED and bed.state_reason == UNESCROWED


def test_an_untrusted_verifier_runs_and_the_report_says_so(
    sqlite_store: Store, tmp_path: Path
) -> None:
    """Enrolled with --untrusted-verifier, the bed runs attempts, and the report names it."""
    store = sqlite_store
    _unescrowed_bed(store, tmp_path, "loose", untrusted=True)
    sweep_id = submit(store, spec(tasks=1, models=1, trials=2)).sweep_id
    EmbeddedExecutor(store, sweep_id).run()
    report = sweep_report(store, find_sweep(store, str(sweep_id)))
    assert sum(report["outcomes"].values()) == 2 and "QUEUED" not in report["outcomes"]
    assert report["untrusted_verifier"] == ["loose"]


def test_untrusted_verifier_and_an_escrow_set_contradict(tmp_path: Path) -> None:
    """`bed add --untrusted-verifier --escrow-set X` is refused naming the flag (exit 2)."""
    approot = tmp_path / "b"
    simbed.create_bed(approot, project="b", config={})
    ddev = simbed.install_ddev(tmp_path / "bin")
    escrow = tmp_path / "escrow"
    escrow.mkdir()
    (escrow / "escrow-verify.sh").write_text("")
    done = farm(
        tmp_path / "home",
        "bed",
        "add",
        "b",
        "--approot",
        str(approot),
        "--ddev",
        str(ddev),
        "--escrow-set",
        str(escrow),
        "--untrusted-verifier",
        check=2,
    )
    assert "--untrusted-verifier" in done.stderr
