"""Beds behind a real sshd: a sweep equal to the local one, the escrow check, environment hygiene."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from apg_farm.beds import get_bed
from apg_farm.contract import Outcome
from apg_farm.fixtures import simbed
from apg_farm.scheduler import submit
from apg_farm.store import Attempt, AttemptState, Bed, BedState, Execution, Phase, Store
from apg_farm.workers import AttemptEngine, EmbeddedExecutor
from tests.support.remotebeds import outcome_counts, remote_beds, remote_config
from tests.support.simbeds import make_beds, spec
from tests.support.sshd import SshHost, start_sshd

SECRET = "hunter2-farm-secret"


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[Store]:
    """SQLite only, for tests whose subject is the bed, not the store."""
    store = Store(f"sqlite:///{tmp_path / 'farm.db'}")
    yield store
    store.dispose()


@pytest.fixture
def ssh_host(tmp_path: Path) -> Iterator[SshHost]:
    """A real sshd on a loopback port whose host key the farm has pinned."""
    host = start_sshd(tmp_path / "sshd", extra_config=remote_config(tmp_path / "remote-home"))
    host.pin()
    try:
        yield host
    finally:
        host.stop()


def _phases(store: Store, sweep_id: int) -> list[tuple[str, str, list[str]]]:
    with store.session() as session:
        rows = session.execute(
            select(Bed.name, Phase.name, Phase.argv)
            .join(Execution, Execution.id == Phase.execution_id)
            .join(Attempt, Attempt.id == Execution.attempt_id)
            .join(Bed, Bed.id == Execution.bed_id)
            .where(Attempt.sweep_id == sweep_id)
        ).all()
    return [(bed, name, argv) for bed, name, argv in rows]


def test_sweep_over_ssh_equals_the_same_sweep_run_locally(
    store: Store, tmp_path: Path, ssh_host: SshHost
) -> None:
    """Two simulated beds behind a real sshd give the same outcomes per (task, model) as local beds."""
    # Given two beds enrolled over SSH (provisioned and escrowed on their host)
    beds = remote_beds(store, tmp_path / "remote", ssh_host, ["r0", "r1"])
    assert all(b.transport == "ssh" and b.escrow_files for b in beds)
    sweep = spec("same", tasks=3, models=1, trials=2)
    # When the sweep runs through them, and the same sweep runs on two local beds
    sweep_id = submit(store, sweep).sweep_id
    result = EmbeddedExecutor(store, sweep_id).run()
    local = Store(f"sqlite:///{tmp_path / 'local.db'}")
    make_beds(local, tmp_path / "local", 2)
    local_id = submit(local, sweep).sweep_id
    assert EmbeddedExecutor(local, local_id).run().errors == []
    # Then the results are the same, and every attempt ran on the remote beds' host
    assert result.errors == [] and result.stranded == 0
    remote_counts = outcome_counts(store, sweep_id)
    assert remote_counts == outcome_counts(local, local_id)
    assert sum(remote_counts.values()) == 6
    assert {o for _, _, o in remote_counts} <= {"PASSED", "FAILED", "SKIPPED"}
    phases = _phases(store, sweep_id)
    assert {bed for bed, _, _ in phases} == {"r0", "r1"}
    per_name = Counter(name for _, name, _ in phases)
    assert per_name["escrow_check"] == per_name["reset"] == 6
    verifies = [argv for _, name, argv in phases if name.startswith("verify")]
    assert all(
        argv[0] == "/usr/bin/bash" and argv[1].endswith("/escrow-verify.sh") for argv in verifies
    )
    local.dispose()


def test_a_changed_escrow_set_quarantines_the_bed_naming_the_file(
    sqlite_store: Store, tmp_path: Path, ssh_host: SshHost
) -> None:
    """An escrow set edited after enrolment: the bed is quarantined before its verifier runs."""
    store = sqlite_store
    r0, _ = remote_beds(store, tmp_path / "remote", ssh_host, ["r0", "r1"])
    assert r0.escrow_set is not None
    # Enrolment, provision and escrow closed the connections they opened.
    deadline = time.monotonic() + 5
    while ssh_host.session_pids() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ssh_host.session_pids() == []
    with open(Path(r0.escrow_set) / "escrow-verify.sh", "a") as verifier:
        verifier.write("exit 0  # everything verifies now\n")
    sweep_id = submit(store, spec("after-edit", tasks=1, models=1, trials=2)).sweep_id
    EmbeddedExecutor(store, sweep_id).run()
    bed = get_bed(store, "r0")
    assert bed.state == BedState.QUARANTINED
    assert bed.state_reason == "escrow set changed since it was recorded: escrow-verify.sh changed"
    with store.session() as session:
        attempts = list(session.scalars(select(Attempt).where(Attempt.sweep_id == sweep_id)))
    r0_phases = [name for bed, name, _ in _phases(store, sweep_id) if bed == "r0"]
    assert all(a.state == AttemptState.DONE and a.outcome != Outcome.ERROR for a in attempts)
    # The tampered verifier never ran: the check came first.
    assert r0_phases == ["escrow_check"]


def test_no_farm_setting_reaches_any_bed_command(
    sqlite_store: Store, tmp_path: Path, ssh_host: SshHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Database and broker URLs, the SSH key path and passwords reach no bed command, local or remote."""
    store = sqlite_store
    # Given a worker whose environment holds every kind of farm secret
    identity = str(ssh_host.identity)
    secrets = {
        "APG_FARM_DATABASE_URL": f"postgresql://farm:{SECRET}@db/farm",
        "APG_FARM_BROKER_URL": f"redis://:{SECRET}@broker:6379/0",
        "APG_FARM_SSH_IDENTITY": identity,
        "SSH_AUTH_SOCK": str(tmp_path / "agent.sock"),
        "PGPASSWORD": SECRET,
        "AWS_SECRET_ACCESS_KEY": SECRET,
    }
    for name, value in secrets.items():
        monkeypatch.setenv(name, value)
    # And a probe in front of ddev and of each escrow verifier that dumps its whole environment
    probes = tmp_path / "probes"
    probes.mkdir()
    ddev = _probe_ddev(tmp_path / "bin", probes)
    [remote] = remote_beds(store, tmp_path / "remote", ssh_host, ["remote0"], ddev=ddev)
    [local] = make_beds(store, tmp_path / "local", 1, prefix="local")
    for bed in (remote, local):
        _probe_verifier(store, bed, probes)
    # When each bed runs an attempt
    sweep_id = submit(store, spec("hygiene", tasks=1, models=1, trials=2)).sweep_id
    for bed in (remote, local):
        report = AttemptEngine(store, bed.name, worker="w").run_next(sweep_id=sweep_id)
        assert report is not None and report.outcome in (Outcome.PASSED, Outcome.FAILED)
    # Then no command saw a farm setting, by name or by value
    dumps = sorted(probes.iterdir())
    kinds = Counter(".".join(p.name.split(".")[:2]) for p in dumps)
    # provision, escrow, reset, the baseline diff, the pinning grade, run, diff, grade on the
    # remote bed; both verifies on each bed
    assert kinds["ddev.remote0"] == 8, kinds
    assert kinds["verify.remote0"] == kinds["verify.local0"] == 2, kinds
    for dump in dumps:
        env = dict(line.split("=", 1) for line in dump.read_text().splitlines() if "=" in line)
        leaked = sorted(set(env) & set(secrets)) + [
            k for k, v in env.items() if SECRET in v or identity in v
        ]
        assert leaked == [], (dump.name, leaked)
        assert env.get("NO_COLOR") == "1" and env.get("AI_PG_NO_IMPORT") == "1"
    # The simulated bed's own log agrees for every command on both beds
    for bed in (remote, local):
        for line in simbed.read_log(Path(bed.approot)):
            assert not set(line["env"]) & set(secrets), (bed.name, line["command"])
    # Over SSH the bed saw its host's HOME, not the farm's
    remote_homes = {
        dict(x.split("=", 1) for x in p.read_text().splitlines() if "=" in x).get("HOME")
        for p in dumps
        if p.name.startswith("ddev.remote0")
    }
    assert remote_homes == {str(tmp_path / "remote-home")}


def _probe_ddev(bin_dir: Path, probes: Path) -> Path:
    """A ddev that writes its environment to probes/ddev.<bed>.<pid>, then runs the simulated one."""
    real = simbed.install_ddev(bin_dir / "real")
    probe = bin_dir / "ddev"
    probe.write_text(
        f'#!/bin/sh\nenv > "{probes}/ddev.$(basename "$PWD").$$"\nexec "{real}" "$@"\n'
    )
    probe.chmod(0o755)
    return probe


def _probe_verifier(store: Store, bed: Bed, probes: Path) -> None:
    """Put an environment-dumping wrapper in front of the bed's escrow verifier and re-record the set."""
    from apg_farm.beds.escrow import record_escrow_set

    assert bed.escrow_set is not None
    escrow = Path(bed.escrow_set)
    (escrow / "escrow-verify.sh").rename(escrow / "escrow-verify.real.sh")
    (escrow / "escrow-verify.sh").write_text(
        f'env > "{probes}/verify.{bed.name}.$$"\n'
        'exec /usr/bin/bash "$(dirname "$0")/escrow-verify.real.sh" "$@"\n'
    )
    record_escrow_set(store, get_bed(store, bed.name), bed.escrow_set)


def test_an_escrow_set_inside_the_project_is_refused(sqlite_store: Store, tmp_path: Path) -> None:
    """The agent can rewrite anything in the project: an escrow set there is never recorded."""
    import shutil

    from apg_farm.beds.escrow import record_escrow_set
    from apg_farm.errors import ContractViolation

    [bed] = make_beds(sqlite_store, tmp_path, 1)
    assert bed.escrow_set is not None
    inside = Path(bed.approot) / "private" / "escrow"
    shutil.copytree(bed.escrow_set, inside)
    with pytest.raises(ContractViolation, match="inside the project"):
        record_escrow_set(sqlite_store, bed, str(inside))
    assert get_bed(sqlite_store, bed.name).escrow_set == bed.escrow_set
